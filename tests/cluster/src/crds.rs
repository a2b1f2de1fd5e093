//! Installs the repository's CustomResourceDefinitions (`crds/*.yaml`) with
//! server-side apply and waits until the API server serves them.

use std::fs;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;

use crate::Error;
use crate::http::Http;

const CRD_PATH: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
const FIELD_MANAGER: &str = "local-cluster";

/// One CRD document and the file it came from.
pub(crate) struct Crd {
    pub file: PathBuf,
    pub name: String,
    pub body: Value,
}

fn crd_error(file: &Path, message: impl Into<String>) -> Error {
    Error::Crd {
        file: file.to_path_buf(),
        message: message.into(),
    }
}

/// Reads every `*.yaml`/`*.yml` file of `dir` in name order; each may hold
/// several documents. A missing or empty directory yields nothing.
pub(crate) fn load(dir: &Path) -> Result<Vec<Crd>, Error> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(crd_error(dir, e.to_string())),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.is_file()
                && matches!(
                    path.extension().and_then(|e| e.to_str()),
                    Some("yaml" | "yml")
                )
        })
        .collect();
    files.sort();

    let mut crds = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).map_err(|e| crd_error(&file, e.to_string()))?;
        for document in serde_yaml::Deserializer::from_str(&text) {
            let body = Value::deserialize(document).map_err(|e| crd_error(&file, e.to_string()))?;
            if body.is_null() {
                continue; // an empty document, e.g. after a trailing `---`
            }
            let kind = body.get("kind").and_then(Value::as_str).unwrap_or_default();
            if kind != "CustomResourceDefinition" {
                return Err(crd_error(
                    &file,
                    format!("expected only CustomResourceDefinitions, found kind {kind:?}"),
                ));
            }
            let name = body
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    crd_error(&file, "a CustomResourceDefinition without metadata.name")
                })?
                .to_string();
            crds.push(Crd {
                file: file.clone(),
                name,
                body,
            });
        }
    }
    Ok(crds)
}

/// Applies each CRD as `admin_token`'s user, then waits (up to `timeout` in
/// all) until every one is `Established`.
pub(crate) fn install(
    http: &Http,
    server: &str,
    admin_token: &str,
    crds: &[Crd],
    timeout: Duration,
) -> Result<(), Error> {
    for crd in crds {
        let url = format!(
            "{server}{CRD_PATH}/{}?fieldManager={FIELD_MANAGER}&force=true",
            crd.name
        );
        let body =
            serde_json::to_vec(&crd.body).map_err(|e| crd_error(&crd.file, e.to_string()))?;
        // JSON is YAML, which is what an apply patch carries.
        let answer = http
            .patch(&url, admin_token, "application/apply-patch+yaml", &body)
            .map_err(|e| crd_error(&crd.file, format!("applying {}: {e}", crd.name)))?;
        if !answer.is_success() {
            return Err(crd_error(
                &crd.file,
                format!(
                    "applying {}: HTTP {}: {}",
                    crd.name, answer.status, answer.body
                ),
            ));
        }
    }

    let deadline = Instant::now() + timeout;
    for crd in crds {
        let url = format!("{server}{CRD_PATH}/{}", crd.name);
        loop {
            let last = match http.get(&url, Some(admin_token)) {
                Ok(answer) if answer.is_success() => {
                    if established(&answer.body) {
                        break;
                    }
                    "not Established yet".to_string()
                }
                Ok(answer) => format!("HTTP {}: {}", answer.status, answer.body),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(crd_error(
                    &crd.file,
                    format!("{} not Established within {timeout:?}: {last}", crd.name),
                ));
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

fn established(body: &str) -> bool {
    let Ok(crd) = serde_json::from_str::<Value>(body) else {
        return false;
    };
    crd.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Established")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CRD_A: &str = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: as.example.dev\n";
    const CRD_B: &str = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: bs.example.dev\n";

    #[test]
    fn a_missing_or_empty_directory_has_no_crds() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert!(load(&dir.path().join("crds")).expect("missing").is_empty());
        assert!(load(dir.path()).expect("empty").is_empty());
    }

    #[test]
    fn files_may_hold_several_documents() {
        let dir = tempfile::tempdir().expect("temp dir");
        fs::write(
            dir.path().join("b.yaml"),
            format!("---\n{CRD_A}---\n{CRD_B}---\n"),
        )
        .expect("write");
        fs::write(dir.path().join("a.yml"), CRD_B).expect("write");
        fs::write(dir.path().join("notes.txt"), "not yaml: [").expect("write");
        let names: Vec<_> = load(dir.path())
            .expect("load")
            .into_iter()
            .map(|crd| crd.name)
            .collect();
        assert_eq!(
            names,
            ["bs.example.dev", "as.example.dev", "bs.example.dev"]
        );
    }

    #[test]
    fn other_kinds_are_rejected() {
        let dir = tempfile::tempdir().expect("temp dir");
        fs::write(
            dir.path().join("x.yaml"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
        )
        .expect("write");
        assert!(matches!(load(dir.path()), Err(Error::Crd { .. })));
    }

    #[test]
    fn established_reads_the_condition() {
        let yes = r#"{"status":{"conditions":[{"type":"NamesAccepted","status":"True"},{"type":"Established","status":"True"}]}}"#;
        let no = r#"{"status":{"conditions":[{"type":"Established","status":"False"}]}}"#;
        assert!(established(yes));
        assert!(!established(no));
        assert!(!established("{}"));
    }
}
