//! `RetryPolicy` (`rp`): how consumers retry, shared by any number of consumers.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::validation::{
    duration_at_least, duration_at_most, duration_not_below, is_trimmed, positive_duration,
};

pub use crate::core::retry_policy::{FailureClass, Jitter, MAX_ATTEMPTS_LIMIT};

/// How a consumer retries failed events: a finite, classified, jittered and budgeted schedule.
// kube-derive repeats `printcolumn(type_ = ...)` attributes by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "backlog.dev",
    version = "v1alpha1",
    kind = "RetryPolicy",
    namespaced,
    status = "RetryPolicyStatus",
    shortname = "rp",
    category = "backlog",
    derive = "PartialEq",
    doc = "How consumers retry failed events: finite attempts, classified failures, capped jittered backoff and a retry budget.",
    printcolumn(name = "Attempts", type_ = "integer", json_path = ".spec.maxAttempts"),
    printcolumn(
        name = "Worst Case",
        type_ = "string",
        json_path = ".status.worstCaseRetryDelay",
        description = "Sum of the upper bounds of every retry delay"
    ),
    printcolumn(
        name = "Amplification",
        type_ = "number",
        json_path = ".status.amplification",
        description = "Executions per event in the worst case"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Deadline Conflict",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"DeadlineConflict\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RetryPolicySpec {
    /// Executions allowed per event, the first one included: attempt 1 is the first real
    /// execution, and after failed attempt n a retry is scheduled only if n < maxAttempts.
    #[schemars(range(min = 1, max = 20))]
    pub max_attempts: i32,

    /// Delay between attempts.
    pub backoff: Backoff,

    /// Ordered rules mapping error codes to failure classes; the first match wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub classification: Vec<ClassificationRule>,

    /// Class of error codes no rule names. Unknown is never retried blind: the consumer first
    /// reconciles by the stable event id.
    #[serde(default)]
    pub default_class: FailureClass,

    /// Fleet-wide cap on retries, so a persistent fault cannot turn into a retry storm.
    #[serde(default)]
    pub retry_budget: RetryBudget,
}

/// Capped exponential backoff: upper(n) = min(cap, base * 2^(n-1)).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = duration_at_least("cap", "base", "backoff.cap must be at least backoff.base; raise cap or lower base"))]
pub struct Backoff {
    /// Upper bound of the first retry's delay, e.g. 100ms.
    #[schemars(length(max = 32))]
    #[x_kube(validation = positive_duration("backoff.base"))]
    #[x_kube(validation = duration_not_below("backoff.base", "1ms", "shorter delays retry at once, a retry storm on a failing dependency"))]
    pub base: String,

    /// Largest delay any retry may wait, e.g. 10s.
    #[schemars(length(max = 32))]
    #[x_kube(validation = positive_duration("backoff.cap"))]
    #[x_kube(validation = duration_at_most("backoff.cap", "24h", "an event waiting longer for its retry than a day belongs in the dead-letter queue, and the worst-case delay must stay a duration consumers can parse"))]
    pub cap: String,

    /// How the delay is drawn below the upper bound.
    #[serde(default)]
    pub jitter: Jitter,
}

/// One classification rule.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClassificationRule {
    /// Error codes this rule matches, exactly as the consumer reports them (e.g. "HTTP_503").
    #[schemars(length(min = 1, max = 256), inner(length(min = 1, max = 128)))]
    #[x_kube(merge_strategy = kube::core::ListMerge::Set)]
    #[x_kube(validation = Rule::new(format!("self.all(c, {})", is_trimmed("c"))).message("classification[].errorCodes must not be blank or begin or end with a space: a code matches exactly as the consumer reports it, such as HTTP_503"))]
    pub error_codes: Vec<String>,
    /// Class assigned to those codes.
    pub class: FailureClass,
}

/// Retries may be at most this share of primary executions.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RetryBudget {
    /// Retries per primary execution, in [0, 1]; default 0.1.
    #[serde(default = "default_max_retry_ratio")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub max_retry_ratio: f64,
}

fn default_max_retry_ratio() -> f64 {
    0.1
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self {
            max_retry_ratio: default_max_retry_ratio(),
        }
    }
}

/// What the operator observed and derived from the policy.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RetryPolicyStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Stable hash of the normalized policy: the policy's version as consumers see it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_hash: Option<String>,

    /// Sum of the upper bounds of every retry delay (the longest an event can spend waiting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst_case_retry_delay: Option<String>,

    /// Executions per event in the worst case (= maxAttempts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amplification: Option<i32>,

    /// Executions per primary execution the retry budget allows fleet-wide (1 + maxRetryRatio).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budgeted_amplification: Option<f64>,

    /// BacklogBudgets in this namespace that reference this policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub used_by: Vec<String>,

    /// `Ready`, `DeadlineConflict`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}
