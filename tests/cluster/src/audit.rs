//! The API server's audit log, for tests that count requests: who (user and User-Agent) changed
//! what, when, and with which answer. Only writes, and reads of the custom resources and of
//! Deployments and StatefulSets, are logged (at
//! the Metadata level, once per request when its response is complete), so the log stays
//! small.

use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::{Error, io_error};

/// The audit policy: every mutating request and every read of a custom resource, a
/// Deployment, a StatefulSet or a ConfigMap, without bodies; nothing else.
pub(crate) const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
  - level: Metadata
    verbs: [get, list]
    resources:
      - {group: backlog.dev}
      - {group: apps, resources: [deployments, statefulsets, deployments/scale, statefulsets/scale]}
      - {group: "", resources: [configmaps]}
  - level: None
"#;

pub(crate) const POLICY_FILE: &str = "audit-policy.yaml";
pub(crate) const LOG_FILE: &str = "audit.log";

/// The kube-apiserver flags that write the log to `state_dir`.
pub(crate) fn flags(state_dir: &Path) -> Vec<String> {
    vec![
        format!(
            "--audit-policy-file={}",
            state_dir.join(POLICY_FILE).display()
        ),
        format!("--audit-log-path={}", state_dir.join(LOG_FILE).display()),
        "--audit-log-format=json".to_string(),
        // Written before the response is sent: a test that got its answer finds the entry.
        "--audit-log-mode=blocking".to_string(),
    ]
}

pub(crate) fn write_policy(state_dir: &Path) -> Result<PathBuf, Error> {
    let path = state_dir.join(POLICY_FILE);
    fs::write(&path, POLICY).map_err(|e| io_error(format!("writing {}", path.display()), e))?;
    Ok(path)
}

/// One request, as the audit log records it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    pub verb: String,
    pub user: AuditUser,
    #[serde(default)]
    pub user_agent: String,
    #[serde(default)]
    pub object_ref: Option<ObjectRef>,
    #[serde(default)]
    pub response_status: Option<ResponseStatus>,
    /// RFC 3339 with microseconds, as the API server's clock saw the request arrive.
    pub request_received_timestamp: String,
    pub stage_timestamp: String,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct AuditUser {
    pub username: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub subresource: Option<String>,
    #[serde(default)]
    pub api_group: Option<String>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct ResponseStatus {
    #[serde(default)]
    pub code: Option<u16>,
}

impl AuditEvent {
    /// The HTTP status the API server answered with.
    pub fn code(&self) -> Option<u16> {
        self.response_status.as_ref().and_then(|s| s.code)
    }

    /// Whether the write was applied (a 2xx answer).
    pub fn succeeded(&self) -> bool {
        self.code().is_some_and(|c| (200..300).contains(&c))
    }

    pub fn namespace(&self) -> Option<&str> {
        self.object_ref.as_ref()?.namespace.as_deref()
    }

    pub fn resource(&self) -> &str {
        self.object_ref.as_ref().map_or("", |o| o.resource.as_str())
    }
}

/// Every complete entry of the log at `path`, oldest first. A line still being written (the
/// last one, without its newline) is skipped.
pub fn read(path: &Path) -> Result<Vec<AuditEvent>, Error> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error(format!("reading {}", path.display()), e)),
    };
    let complete = match text.rfind('\n') {
        Some(end) => &text[..end],
        None => "",
    };
    complete
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str::<AuditEvent>(line).map_err(|e| {
                Error::InvalidArgument(format!("audit log {}: {e}: {line}", path.display()))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_read_and_a_partial_line_is_left_for_later() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(LOG_FILE);
        assert_eq!(read(&path).expect("missing is empty"), Vec::new());
        let entry = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a","stage":"ResponseComplete","requestURI":"/apis/apps/v1/namespaces/n/deployments/d/scale","verb":"patch","user":{"username":"admin","groups":["system:masters"]},"userAgent":"backlog-operator/0.1.0 (op-a)","objectRef":{"resource":"deployments","namespace":"n","name":"d","apiGroup":"apps","apiVersion":"v1","subresource":"scale"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-01-01T00:00:00.000001Z","stageTimestamp":"2026-01-01T00:00:00.000200Z"}"#;
        fs::write(&path, format!("{entry}\n{{\"kind\":\"Ev")).expect("write");
        let events = read(&path).expect("read");
        assert_eq!(events.len(), 1);
        let event = &events[0];
        assert_eq!(event.verb, "patch");
        assert_eq!(event.user.username, "admin");
        assert!(event.user_agent.contains("op-a"));
        assert_eq!(event.namespace(), Some("n"));
        assert_eq!(event.resource(), "deployments");
        assert!(event.succeeded());
    }
}
