//! The helm CLI (built from its Go module by `tests/cluster/build-helm.sh`), run with config,
//! cache and data directories of its own, so nothing of the user's is read or written.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::TestEnv;

pub struct Helm {
    binary: PathBuf,
    home: PathBuf,
    kubeconfig: PathBuf,
}

impl Helm {
    /// Helm against `kubeconfig`, keeping its state under `home`.
    pub fn new(env: &TestEnv, home: PathBuf, kubeconfig: &Path) -> Helm {
        Helm {
            binary: env.helm_path(),
            home,
            kubeconfig: kubeconfig.to_path_buf(),
        }
    }

    pub fn run(&self, args: &[&str]) -> Result<String, String> {
        let home = &self.home;
        let output = Command::new(&self.binary)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_DATA_HOME", home.join("data"))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running helm: {e}"))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(format!(
                "helm {args:?} failed ({}):\n{}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }

    pub fn ok(&self, args: &[&str]) -> String {
        self.run(args).unwrap_or_else(|e| panic!("{e}"))
    }
}
