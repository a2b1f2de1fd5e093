//! One consumer's loop around the control document: which events to process, and what to do
//! after each failure.
//!
//! ```text
//! cargo run -p backlog-consumer --example consumer_loop                 # a built-in document
//! cargo run -p backlog-consumer --example consumer_loop -- control.json # a mounted one
//! ```

use std::time::Duration;

use backlog_consumer::{ControlDocument, RetryBudgetTracker, RetryDecision};
use rand::SeedableRng;
use rand::rngs::StdRng;

/// A document as the operator publishes it in the budget's ConfigMap.
const SAMPLE: &str = r#"{
  "apiVersion": "backlog.dev/control/v1",
  "budget": {"namespace": "shop", "name": "orders"},
  "revision": 7,
  "generatedAt": "2026-03-01T12:00:00Z",
  "retryPolicy": {
    "name": "standard",
    "policyHash": "sha256:a354a4828b496272",
    "maxAttempts": 5,
    "backoff": {"base": "100ms", "cap": "10s", "jitter": "Full"},
    "classification": [{"errorCodes": ["HTTP_503"], "class": "Transient"}],
    "defaultClass": "Unknown",
    "retryBudget": {"maxRetryRatio": 0.1}
  },
  "eventClasses": [{"name": "refund", "state": "Probing", "probeRatio": 0.5, "since": "2026-03-01T11:55:00Z"}]
}"#;

/// Events as a queue would deliver them: id, class, and the error code of their first attempt.
const EVENTS: [(&str, &str, Option<&str>); 6] = [
    ("evt-1", "order", None),
    ("evt-2", "order", Some("HTTP_503")),
    ("evt-3", "refund", None),
    ("evt-4", "refund", Some("HTTP_503")),
    ("evt-5", "order", Some("TIMEOUT")),
    ("evt-6", "order", Some("HTTP_503")),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let text = match std::env::args().nth(1) {
        Some(path) => std::fs::read_to_string(path)?,
        None => SAMPLE.to_owned(),
    };
    let document = ControlDocument::parse_and_validate(&text)?;
    println!(
        "control document revision {} for {}/{}",
        document.revision, document.budget.namespace, document.budget.name
    );
    let Some(policy) = document.effective_retry_policy()? else {
        println!("no retry policy published: keeping the consumer's own defaults");
        return Ok(());
    };
    println!(
        "retry policy {}\n{}",
        policy.policy_hash(),
        policy.schedule()
    );

    let planner = policy.planner();
    let mut budget = RetryBudgetTracker::for_policy(&policy);
    // Seeded so the output is stable; a consumer uses any `rand::Rng`.
    let mut rng = StdRng::seed_from_u64(7);
    // Time since the consumer started, from its own clock.
    let now = Duration::from_secs(60);
    // The budget allows retries as a share of first executions: say 40 completed just now.
    for _ in 0..40 {
        budget.record_primary(now);
    }
    for (event_id, class, error_code) in EVENTS {
        if !document.should_process(class, event_id) {
            println!("{event_id} ({class}): held back, left in the queue");
            continue;
        }
        budget.record_primary(now);
        let Some(code) = error_code else {
            println!("{event_id} ({class}): completed");
            continue;
        };
        let failure = policy.classify(code);
        let decision = match planner.decide(failure, 1, &mut budget, now, &mut rng) {
            RetryDecision::Retry { attempt, delay } => {
                format!("retry as attempt {attempt} in {delay:?}")
            }
            RetryDecision::Quarantine { reason } => format!("quarantine ({reason:?})"),
            RetryDecision::Reject => "reject: a business failure is final".to_owned(),
            RetryDecision::Reconcile => "reconcile by event id before any re-execution".to_owned(),
        };
        println!(
            "{event_id} ({class}): failed with {code}, class {}: {decision}",
            failure.as_str()
        );
    }
    Ok(())
}
