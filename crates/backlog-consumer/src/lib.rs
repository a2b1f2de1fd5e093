//! The consumer library: the exact failure, retry and probing semantics backlog-operator
//! publishes, for consumers written in Rust.
//!
//! Consumers in other languages implement the same contract from the control document's JSON
//! Schema (`src/control-document.schema.json` in this crate) and the algorithms documented
//! here; this crate is the reference. It depends on no Kubernetes client and no async runtime.
//!
//! Everything here is pure: no I/O, no clock reads and no global random source. The current
//! time is an argument, randomness comes from the caller's `&mut impl rand::Rng`, so consumers
//! and tests can seed it, and the same inputs always give the same answers.
//!
//! | concern | where |
//! |---|---|
//! | reading the control document, pausing and probing classes | [`ControlDocument`] |
//! | validating and normalizing a policy, its hash | [`EffectivePolicy`] |
//! | error code → failure class | [`classify`] |
//! | after a failure: retry, quarantine, reject or reconcile | [`RetryPlanner`] |
//! | retries as a share of primary executions | [`RetryBudgetTracker`] |
//! | which events of a Probing class to process | [`is_probe`] |
//! | worst-case delay and amplification | [`RetrySchedule`] |
//! | Go duration strings | [`parse_go_duration`], [`format_go_duration`] |
//!
//! # Example: one consumer's loop
//!
//! ```
//! use std::time::Duration;
//! use backlog_consumer::{ControlDocument, FailureClass, RetryBudgetTracker, RetryDecision};
//! use rand::{SeedableRng, rngs::StdRng};
//!
//! // The document as mounted from the budget's ConfigMap.
//! let document = ControlDocument::parse_and_validate(r#"{
//!   "apiVersion": "backlog.dev/control/v1",
//!   "budget": {"namespace": "shop", "name": "orders"},
//!   "revision": 7,
//!   "generatedAt": "2026-03-01T12:00:00Z",
//!   "retryPolicy": {
//!     "name": "standard",
//!     "policyHash": "sha256:a354a4828b496272",
//!     "maxAttempts": 5,
//!     "backoff": {"base": "100ms", "cap": "10s", "jitter": "Full"},
//!     "classification": [{"errorCodes": ["HTTP_503"], "class": "Transient"}],
//!     "defaultClass": "Unknown",
//!     "retryBudget": {"maxRetryRatio": 0.1}
//!   },
//!   "eventClasses": [{"name": "refund", "state": "Paused", "since": "2026-03-01T11:55:00Z"}]
//! }"#)?;
//!
//! // A paused class stays in the queue, untouched; other classes are processed.
//! assert!(!document.should_process("refund", "evt-1"));
//! assert!(document.should_process("order", "evt-1"));
//!
//! let Some(policy) = document.effective_retry_policy()? else {
//!     return Ok(()); // no policy published: keep the consumer's own defaults
//! };
//! assert_eq!(policy.policy_hash(), "sha256:a354a4828b496272"); // reproducible from the content
//! let planner = policy.planner();
//! let mut budget = RetryBudgetTracker::for_policy(&policy);
//! let mut rng = StdRng::seed_from_u64(7); // any `rand::Rng`; seeded here for a stable example
//! let now = Duration::from_secs(60); // time since the consumer started, from its own clock
//!
//! for _ in 0..20 {
//!     budget.record_primary(now); // every first execution (attempt 1) counts
//! }
//!
//! // Attempt 1 of event evt-1 failed with HTTP_503, a Transient failure.
//! match planner.decide(policy.classify("HTTP_503"), 1, &mut budget, now, &mut rng) {
//!     RetryDecision::Retry { attempt, delay } => {
//!         assert_eq!(attempt, 2);
//!         assert!(delay <= Duration::from_millis(100)); // full jitter in [0, 100ms]
//!     }
//!     other => panic!("expected a retry, got {other:?}"),
//! }
//!
//! // A timeout whose outcome is unknown is reconciled by event id, never re-executed blind.
//! assert_eq!(
//!     planner.decide(policy.classify("TIMEOUT"), 1, &mut budget, now, &mut rng),
//!     RetryDecision::Reconcile,
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod control_document;
pub mod policy;
pub mod probe;

pub use backlog_core::{
    backoff, classification, go_duration, retry_budget, retry_planner, schedule,
};

pub use backoff::{BackoffError, BackoffSchedule};
pub use classification::classify;
pub use control_document::{
    BudgetReference, CONTROL_API_VERSION, CONTROL_DOCUMENT_CONFIGMAP_KEY, ControlDocument,
    DocumentError, EventClassControl, PublishedRetryPolicy, control_document_schema,
};
pub use go_duration::{GoDurationError, MAX_GO_DURATION, format_go_duration, parse_go_duration};
pub use policy::{
    CanonicalBackoff, CanonicalPolicy, CanonicalRetryBudget, EffectivePolicy, PolicyError,
};
pub use probe::{is_probe, probe_hash, probe_position};
pub use retry_budget::{
    DEFAULT_WINDOW, RetryBudgetError, RetryBudgetTracker, WINDOW_SLOTS, WindowCounts,
};
pub use retry_planner::{QuarantineReason, RetryDecision, RetryPlanner};
pub use schedule::{RetrySchedule, ScheduledRetry};

// The policy's plain types, so that a consumer needs one import path.
pub use backlog_core::event_class::ClassState;
pub use backlog_core::retry_policy::{
    BackoffDefinition, ClassificationRule, FailureClass, Jitter, MAX_ATTEMPTS_LIMIT,
    RetryBudgetDefinition, RetryPolicyDefinition, ValidatedRetryPolicy,
};
