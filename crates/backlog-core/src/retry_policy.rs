//! A retry policy as written, before validation: the shape of a RetryPolicy's spec without
//! the API server's schema rules, so that the consumer library, the simulator and the API
//! types share one definition of what a policy says.

use serde::{Deserialize, Serialize};

use super::backoff::BackoffSchedule;

/// Upper bound on `maxAttempts`: beyond this a "retry" is an outage amplifier, not a policy.
pub const MAX_ATTEMPTS_LIMIT: i32 = 20;

/// A retry policy that passed validation: attempts in `1..=20`, a backoff with
/// `0 < base <= cap`, a retry ratio in `[0, 1]`. The retry budget and the worst-case schedule
/// are computed from it; the consumer library's `EffectivePolicy` is the implementation.
pub trait ValidatedRetryPolicy {
    /// Executions allowed per event, attempt 1 included.
    fn max_attempts(&self) -> u32;
    /// The backoff between attempts.
    fn backoff(&self) -> &BackoffSchedule;
    /// Retries may be at most this share of primary executions.
    fn max_retry_ratio(&self) -> f64;
}

/// Jitter strategy.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Jitter {
    /// Uniform in [0, upper(n)]: spreads retries best and is the default.
    #[default]
    Full,
    /// Uniform in [upper(n)/2, upper(n)].
    Equal,
    /// Exactly upper(n); only for tests and single consumers.
    None,
}

/// Failure classes, with the seed semantics the consumer library implements.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
pub enum FailureClass {
    /// Retried within maxAttempts and the retry budget.
    Transient,
    /// Will not heal by retrying: quarantined and alerted.
    Persistent,
    /// A legitimate business rejection: terminal, never retried.
    Business,
    /// Outcome unknown (e.g. a timeout after the side effect may have happened): reconciled by
    /// event id before any re-execution.
    #[default]
    Unknown,
}

impl FailureClass {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::Transient => "Transient",
            FailureClass::Persistent => "Persistent",
            FailureClass::Business => "Business",
            FailureClass::Unknown => "Unknown",
        }
    }
}

/// One classification rule.
// The schema attributes describe the rule as the control document publishes it.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schemars", schemars(inline))]
pub struct ClassificationRule {
    /// Error codes this rule matches, exactly as the consumer reports them (e.g. "HTTP_503").
    #[cfg_attr(
        feature = "schemars",
        schemars(
            length(min = 1, max = 256),
            inner(length(min = 1, max = 128)),
            extend("x-kubernetes-list-type" = "set")
        )
    )]
    pub error_codes: Vec<String>,
    /// Class assigned to those codes.
    pub class: FailureClass,
}

/// A retry policy as a RetryPolicy's spec writes it, with the same JSON shape and defaults.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RetryPolicyDefinition {
    /// Executions allowed per event, the first one included.
    pub max_attempts: i32,
    /// Delay between attempts.
    pub backoff: BackoffDefinition,
    /// Ordered rules mapping error codes to failure classes; the first match wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classification: Vec<ClassificationRule>,
    /// Class of error codes no rule names.
    #[serde(default)]
    pub default_class: FailureClass,
    /// Fleet-wide cap on retries.
    #[serde(default)]
    pub retry_budget: RetryBudgetDefinition,
}

/// Capped exponential backoff: upper(n) = min(cap, base * 2^(n-1)), durations in Go syntax.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackoffDefinition {
    /// Upper bound of the first retry's delay, e.g. 100ms.
    pub base: String,
    /// Largest delay any retry may wait, e.g. 10s.
    pub cap: String,
    /// How the delay is drawn below the upper bound.
    #[serde(default)]
    pub jitter: Jitter,
}

/// Retries may be at most this share of primary executions.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RetryBudgetDefinition {
    /// Retries per primary execution, in [0, 1]; default 0.1.
    #[serde(default = "default_max_retry_ratio")]
    pub max_retry_ratio: f64,
}

/// The default `retryBudget.maxRetryRatio`.
pub fn default_max_retry_ratio() -> f64 {
    0.1
}

impl Default for RetryBudgetDefinition {
    fn default() -> Self {
        Self {
            max_retry_ratio: default_max_retry_ratio(),
        }
    }
}
