//! The demo's consumer pod. It consumes nothing (the demo's workload is simulated); it shows
//! what a real consumer does with its BacklogBudget's control document: it mounts the
//! ConfigMap `<budget>-control` (the kubelet refreshes the file, no restart), re-reads it every
//! few seconds, accepts a document only if it validates and its revision is newer than the one
//! it acts on, and logs what it would now do. It stops at once on SIGTERM, so scaling down is
//! quick.
//!
//! Environment: `CONTROL_DOCUMENT` (default `/etc/backlog/control.json`), `POD_NAME`.

use std::path::PathBuf;
use std::time::Duration;

use backlog_operator::consumer::ControlDocument;
use tokio::signal::unix::{SignalKind, signal};

const DEFAULT_PATH: &str = "/etc/backlog/control.json";
const REREAD: Duration = Duration::from_secs(3);

/// What the consumer acts on, and what a newly read text makes of it.
#[derive(Debug, Default)]
struct Consumer {
    accepted: Option<ControlDocument>,
    last_problem: Option<String>,
}

impl Consumer {
    /// Takes `text` if it is a valid, newer document; returns a line to log when something
    /// changed.
    fn offer(&mut self, text: Option<&str>) -> Option<String> {
        let problem = match text.map(ControlDocument::parse_and_validate) {
            None => Some("no control document mounted yet; processing every class".to_owned()),
            Some(Err(e)) => Some(format!("ignoring an invalid control document: {e}")),
            Some(Ok(document)) => {
                let newer = self
                    .accepted
                    .as_ref()
                    .is_none_or(|current| document.revision > current.revision);
                if newer {
                    let line = describe(&document);
                    self.accepted = Some(document);
                    self.last_problem = None;
                    return Some(line);
                }
                None
            }
        };
        if problem.is_some() && problem != self.last_problem {
            self.last_problem.clone_from(&problem);
            return problem;
        }
        None
    }
}

fn describe(document: &ControlDocument) -> String {
    let policy = document.retry_policy.as_ref().map_or_else(
        || "no retry policy".to_owned(),
        |p| format!("retry policy {} {}", p.name, p.policy_hash),
    );
    let classes: Vec<String> = document
        .event_classes
        .iter()
        .map(|c| match c.probe_ratio {
            Some(ratio) => format!("{}={:?}({ratio})", c.name, c.state),
            None => format!("{}={:?}", c.name, c.state),
        })
        .collect();
    format!(
        "acting on control document revision {} of {}/{}: {policy}; classes: {}",
        document.revision,
        document.budget.namespace,
        document.budget.name,
        if classes.is_empty() {
            "all Active".to_owned()
        } else {
            classes.join(", ")
        }
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let path =
        PathBuf::from(std::env::var("CONTROL_DOCUMENT").unwrap_or_else(|_| DEFAULT_PATH.into()));
    let pod = std::env::var("POD_NAME").unwrap_or_else(|_| "demo-consumer".into());
    let mut terminate = signal(SignalKind::terminate())?;
    let mut consumer = Consumer::default();
    println!("{pod}: started, reading {}", path.display());
    loop {
        // A small file on a local mount: a blocking read is fine.
        let text = std::fs::read_to_string(&path).ok();
        if let Some(line) = consumer.offer(text.as_deref()) {
            println!("{pod}: {line}");
        }
        tokio::select! {
            _ = terminate.recv() => {
                println!("{pod}: SIGTERM, stopping");
                return Ok(());
            }
            () = tokio::time::sleep(REREAD) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn document(revision: u64) -> String {
        format!(
            r#"{{"apiVersion":"backlog.dev/control/v1","budget":{{"namespace":"demo","name":"orders"}},
               "revision":{revision},"generatedAt":"2026-03-01T12:00:00Z",
               "eventClasses":[{{"name":"refund","state":"Paused","since":"2026-03-01T12:00:00Z"}}]}}"#
        )
    }

    #[test]
    fn only_newer_valid_documents_are_taken() {
        let mut consumer = Consumer::default();
        assert!(
            consumer
                .offer(None)
                .expect("says so")
                .contains("no control document")
        );
        assert_eq!(consumer.offer(None), None, "said once");
        let line = consumer.offer(Some(&document(2))).expect("accepted");
        assert!(
            line.contains("revision 2") && line.contains("refund=Paused"),
            "{line}"
        );
        assert_eq!(consumer.offer(Some(&document(2))), None, "same revision");
        assert_eq!(consumer.offer(Some(&document(1))), None, "older revision");
        assert!(
            consumer
                .offer(Some("{\"apiVersion\": 3}"))
                .expect("reported")
                .contains("invalid")
        );
        assert_eq!(consumer.accepted.as_ref().map(|d| d.revision), Some(2));
        assert!(consumer.offer(Some(&document(3))).is_some());
    }
}
