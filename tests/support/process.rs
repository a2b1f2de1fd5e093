//! The operator binary run as a process of its own (the debug build of this commit), for faults
//! that need one: freezing it (SIGSTOP), killing it (SIGKILL), cutting its connection. Its log is
//! a file in the cluster's state directory; it is killed when the handle is dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::TestEnv;

/// Leader election settings for a short test: lease 4 s, renew deadline 2.5 s, retry 0.5 s.
#[derive(Clone, Debug)]
pub struct Election {
    pub lease_namespace: String,
    pub lease_name: String,
}

impl Election {
    pub const LEASE: Duration = Duration::from_secs(4);
    pub const RENEW_DEADLINE: Duration = Duration::from_millis(2500);
    pub const RETRY_PERIOD: Duration = Duration::from_millis(500);
}

/// How to run one operator process.
#[derive(Clone, Debug)]
pub struct Launch {
    pub identity: String,
    /// The namespace it watches.
    pub namespace: String,
    pub prometheus: Option<String>,
    pub election: Option<Election>,
    /// The kubeconfig to use (default: the cluster's, as admin).
    pub kubeconfig: Option<PathBuf>,
    /// Further arguments of `backlog-operator run`.
    pub args: Vec<String>,
}

pub struct OperatorProcess {
    child: Option<Child>,
    pub identity: String,
    pub metrics_port: u16,
    pub log: PathBuf,
    launch: Launch,
    state_dir: PathBuf,
    default_kubeconfig: PathBuf,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn signal(pid: u32, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).expect("pid");
    // SAFETY: kill(2) on a child this handle started; no memory is involved.
    unsafe {
        libc::kill(pid, signal);
    }
}

impl OperatorProcess {
    pub fn start(env: &TestEnv, launch: Launch) -> OperatorProcess {
        let mut process = OperatorProcess {
            child: None,
            identity: launch.identity.clone(),
            metrics_port: 0,
            // In the cluster's state directory, or in $BACKLOG_TEST_LOG_DIR to keep it.
            log: std::env::var_os("BACKLOG_TEST_LOG_DIR")
                .map_or_else(|| env.cluster().state_dir().to_path_buf(), PathBuf::from)
                .join(format!("operator-{}.log", launch.identity)),
            launch,
            state_dir: env.cluster().state_dir().to_path_buf(),
            default_kubeconfig: env.kubeconfig_path().to_path_buf(),
        };
        process.spawn();
        process
    }

    fn spawn(&mut self) {
        self.metrics_port = free_port();
        let launch = &self.launch;
        let mut args = vec![
            "run".to_owned(),
            format!("--listen=127.0.0.1:{}", self.metrics_port),
            format!("--namespace={}", launch.namespace),
            format!("--identity={}", launch.identity),
            "--query-timeout=1s".to_owned(),
            "--api-timeout=2s".to_owned(),
            "--api-connect-timeout=1s".to_owned(),
        ];
        if let Some(url) = &launch.prometheus {
            args.push(format!("--prometheus-url={url}"));
        }
        args.extend(launch.args.iter().cloned());
        if let Some(election) = &launch.election {
            args.extend([
                "--leader-elect".to_owned(),
                format!("--lease-namespace={}", election.lease_namespace),
                format!("--lease-name={}", election.lease_name),
                format!("--lease-duration={}s", Election::LEASE.as_secs()),
                format!(
                    "--lease-renew-deadline={}ms",
                    Election::RENEW_DEADLINE.as_millis()
                ),
                format!(
                    "--lease-retry-period={}ms",
                    Election::RETRY_PERIOD.as_millis()
                ),
            ]);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("the operator's log file");
        let kubeconfig = launch
            .kubeconfig
            .clone()
            .unwrap_or_else(|| self.default_kubeconfig.clone());
        let child = Command::new(env!("CARGO_BIN_EXE_backlog-operator"))
            .args(&args)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,kube=warn")
            .env_remove("POD_NAME")
            .env_remove("PROMETHEUS_URL")
            .env_remove("WATCH_NAMESPACE")
            .env_remove("LEADER_ELECT")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("start backlog-operator");
        self.child = Some(child);
    }

    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .map(Child::id)
            .expect("the operator runs")
    }

    /// Freezes the process (SIGSTOP).
    pub fn freeze(&self) {
        signal(self.pid(), libc::SIGSTOP);
    }

    /// Lets a frozen process go on (SIGCONT).
    pub fn thaw(&self) {
        signal(self.pid(), libc::SIGCONT);
    }

    /// Kills the process at once (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the same command again (a new process, the same identity) after a kill.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Whether the process still runs (it did not exit by itself).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Asks it to stop (SIGTERM) and waits up to `timeout`; true if it exited by itself.
    pub fn terminate(&mut self, timeout: Duration) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        signal(child.id(), libc::SIGTERM);
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    /// The text of its /metrics, if it answers.
    pub async fn metrics(&self) -> Option<String> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()
            .ok()?;
        let response = client
            .get(format!("http://127.0.0.1:{}/metrics", self.metrics_port))
            .send()
            .await
            .ok()?;
        response.text().await.ok()
    }

    /// A sample of its /metrics without labels (`backlog_operator_leading`, ...).
    pub async fn metric(&self, name: &str) -> Option<f64> {
        let text = self.metrics().await?;
        text.lines()
            .filter_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .find_map(|value| value.trim().parse().ok())
    }

    /// Whether it says it leads.
    pub async fn leading(&self) -> Option<bool> {
        self.metric("backlog_operator_leading")
            .await
            .map(|v| v == 1.0)
    }

    /// The last lines of its log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The time stamp of the first log line of this run that contains `text`.
    pub fn logged_at(&self, text: &str) -> Option<k8s_openapi::jiff::Timestamp> {
        let log = std::fs::read_to_string(&self.log).ok()?;
        log.lines()
            .filter(|line| line.contains(text))
            .find_map(|line| strip_colours(line).split_whitespace().next()?.parse().ok())
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        // SIGKILL ends a frozen process too.
        self.kill();
    }
}

/// `line` without its ANSI colour sequences (`ESC [ ... m`).
fn strip_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A copy of the cluster's kubeconfig whose users authenticate with `token` only (e.g. a
/// ServiceAccount's, so the process acts as that account).
pub fn kubeconfig_with_token(env: &TestEnv, token: &str, name: &str) -> PathBuf {
    let text = std::fs::read_to_string(env.kubeconfig_path()).expect("the kubeconfig");
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text).expect("kubeconfig YAML");
    for user in config["users"].as_sequence_mut().expect("users").iter_mut() {
        let mut auth = serde_yaml::Mapping::new();
        auth.insert("token".into(), token.into());
        user["user"] = serde_yaml::Value::Mapping(auth);
    }
    let path = env.cluster().state_dir().join(format!("kubeconfig-{name}"));
    std::fs::write(&path, serde_yaml::to_string(&config).expect("YAML")).expect("write");
    path
}

/// A copy of the cluster's kubeconfig that reaches the API server at `address` (a proxy).
pub fn kubeconfig_through(env: &TestEnv, address: std::net::SocketAddr, name: &str) -> PathBuf {
    let text = std::fs::read_to_string(env.kubeconfig_path()).expect("the kubeconfig");
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text).expect("kubeconfig YAML");
    for cluster in config["clusters"]
        .as_sequence_mut()
        .expect("clusters")
        .iter_mut()
    {
        cluster["cluster"]["server"] = serde_yaml::Value::from(format!("https://{address}"));
    }
    let path = env.cluster().state_dir().join(format!("kubeconfig-{name}"));
    std::fs::write(&path, serde_yaml::to_string(&config).expect("YAML")).expect("write");
    path
}
