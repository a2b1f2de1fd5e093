//! Prometheus configuration and runtime scrape targets.
//!
//! Prometheus watches `<state>/prometheus-targets/*.json` (file-based service
//! discovery), so targets come and go without a restart: one file per job.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::{Error, io_error};

pub(crate) const TARGETS_DIR: &str = "prometheus-targets";

/// The configuration file: a 1 s scrape and evaluation interval so tests
/// observe metrics quickly, and one file-discovered job whose targets set
/// their own `job` label.
pub(crate) fn config(state_dir: &Path) -> String {
    let pattern = state_dir.join(TARGETS_DIR).join("*.json");
    // JSON is valid YAML, and serde_json quotes the path correctly.
    let config = json!({
        "global": {
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "evaluation_interval": "1s",
        },
        "scrape_configs": [{
            "job_name": "local-cluster",
            "file_sd_configs": [{
                "files": [pattern.to_string_lossy()],
                "refresh_interval": "1s",
            }],
        }],
    });
    format!("{config:#}\n")
}

fn check_job_name(job_name: &str) -> Result<(), Error> {
    let ok = !job_name.is_empty()
        && !job_name.starts_with('.')
        && job_name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "job name {job_name:?}: use letters, digits, '-', '_' and '.' (it names a file)"
        )))
    }
}

fn target_file(state_dir: &Path, job_name: &str) -> PathBuf {
    state_dir.join(TARGETS_DIR).join(format!("{job_name}.json"))
}

pub(crate) fn add_target(
    state_dir: &Path,
    job_name: &str,
    target: &str,
    labels: &[(&str, &str)],
) -> Result<(), Error> {
    check_job_name(job_name)?;
    let mut all_labels = serde_json::Map::new();
    for (name, value) in labels {
        all_labels.insert((*name).to_string(), json!(value));
    }
    // Target labels win over the scrape config's, so this names the job.
    all_labels.insert("job".into(), json!(job_name));
    let content = json!([{ "targets": [target], "labels": all_labels }]);

    let path = target_file(state_dir, job_name);
    // Write then rename, so Prometheus never reads a half-written file (and
    // the temporary name does not match the *.json pattern).
    let tmp = path.with_file_name(format!(".{job_name}.json.tmp"));
    fs::write(&tmp, format!("{content:#}\n"))
        .map_err(|e| io_error(format!("writing {}", tmp.display()), e))?;
    fs::rename(&tmp, &path).map_err(|e| io_error(format!("renaming to {}", path.display()), e))
}

pub(crate) fn remove_target(state_dir: &Path, job_name: &str) -> Result<(), Error> {
    check_job_name(job_name)?;
    let path = target_file(state_dir, job_name);
    match fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(io_error(format!("removing {}", path.display()), e))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_written_whole_and_removed() {
        let dir = tempfile::tempdir().expect("temp dir");
        fs::create_dir(dir.path().join(TARGETS_DIR)).expect("mkdir");
        add_target(dir.path(), "my-job", "127.0.0.1:9100", &[("team", "a")]).expect("add");
        let path = dir.path().join(TARGETS_DIR).join("my-job.json");
        let written: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&path).expect("read")).expect("json");
        assert_eq!(
            written,
            json!([{ "targets": ["127.0.0.1:9100"], "labels": { "job": "my-job", "team": "a" } }])
        );
        // Only the target file is left: no temporary file.
        assert_eq!(
            fs::read_dir(dir.path().join(TARGETS_DIR))
                .expect("ls")
                .count(),
            1
        );
        remove_target(dir.path(), "my-job").expect("remove");
        assert!(!path.exists());
        remove_target(dir.path(), "my-job").expect("removing twice is fine");
    }

    #[test]
    fn job_names_must_be_file_names() {
        let dir = tempfile::tempdir().expect("temp dir");
        for bad in ["", "../x", "a/b", ".hidden", "a b"] {
            assert!(
                add_target(dir.path(), bad, "127.0.0.1:1", &[]).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn config_scrapes_every_second_from_the_targets_dir() {
        let config: serde_json::Value =
            serde_json::from_str(&config(Path::new("/state"))).expect("JSON is YAML");
        assert_eq!(config["global"]["scrape_interval"], "1s");
        assert_eq!(config["global"]["evaluation_interval"], "1s");
        assert_eq!(
            config["scrape_configs"][0]["file_sd_configs"][0]["files"][0],
            "/state/prometheus-targets/*.json"
        );
    }
}
