//! `backlog-operator explain FILE`: the retry schedule a RetryPolicy commits its consumers to —
//! per attempt the longest wait and the worst case so far, the executions per event in the
//! worst case, the retry budget, and whether the worst case fits a completion deadline.
//!
//! Everything here is computed by the consumer library ([`EffectivePolicy`],
//! [`RetrySchedule`]), the same code the RetryPolicy controller publishes in status, so what
//! `explain` prints before `kubectl apply` is what the cluster reports after.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::api::retry_policy::{Jitter, RetryPolicySpec};
use crate::consumer::{
    EffectivePolicy, PolicyError, RetrySchedule, format_go_duration, parse_go_duration,
};

/// How `explain` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table for people.
    Table,
    /// JSON for machines.
    Json,
}

/// Why a file cannot be explained. Messages say what to fix.
#[derive(Debug, Error)]
pub enum ExplainError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not YAML: {source}")]
    NotYaml {
        path: String,
        #[source]
        source: serde_yaml::Error,
    },
    #[error(
        "{path} holds no RetryPolicy: give a file with `kind: RetryPolicy` (or just the policy's spec)"
    )]
    NoPolicy { path: String },
    #[error("{path} holds {count} RetryPolicies ({names}); give a file with one of them")]
    SeveralPolicies {
        path: String,
        count: usize,
        names: String,
    },
    #[error("{path}: the RetryPolicy's spec does not match the API: {source}")]
    BadSpec {
        path: String,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("{path}: {source}")]
    Invalid {
        path: String,
        #[source]
        source: PolicyError,
    },
    #[error(
        "--deadline {value:?} is not a positive duration: use Go syntax such as 500ms, 30s or 10m"
    )]
    Deadline { value: String },
    #[error("cannot encode the explanation as JSON: {0}")]
    Json(#[source] serde_json::Error),
}

/// How the worst case compares with a completion deadline.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadlineFit {
    pub deadline: String,
    pub deadline_seconds: f64,
    /// Whether the worst-case retry delay is at most the deadline.
    pub fits: bool,
    /// Deadline minus worst case, when it fits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spare: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spare_seconds: Option<f64>,
    /// Worst case minus deadline, when it does not fit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub short_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub short_by_seconds: Option<f64>,
}

/// One execution of an event in the worst case.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptRow {
    /// 1 is the first execution; 2 and later are retries.
    pub attempt: u32,
    /// The longest wait before this attempt (0 for attempt 1).
    pub upper_bound: String,
    pub upper_bound_seconds: f64,
    /// The sum of the longest waits up to this attempt.
    pub cumulative_worst_case: String,
    pub cumulative_worst_case_seconds: f64,
}

/// The retry budget.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetSummary {
    /// Retries may be at most this share of primary executions.
    pub max_retry_ratio: f64,
    /// Executions per primary execution the budget allows across the fleet.
    pub budgeted_amplification: f64,
}

/// The backoff as written in canonical form.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackoffSummary {
    pub base: String,
    pub cap: String,
    pub jitter: Jitter,
}

/// Everything `explain` prints.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub policy_hash: String,
    pub max_attempts: u32,
    pub backoff: BackoffSummary,
    pub attempts: Vec<AttemptRow>,
    pub worst_case_retry_delay: String,
    pub worst_case_retry_delay_seconds: f64,
    /// Executions per event in the worst case (= maxAttempts).
    pub worst_case_amplification: u32,
    pub retry_budget: BudgetSummary,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DeadlineFit>,
    #[serde(skip)]
    schedule: RetrySchedule,
}

impl Explanation {
    /// Whether the worst case fits the deadline (true when no deadline was given).
    pub fn fits(&self) -> bool {
        self.deadline.as_ref().is_none_or(|fit| fit.fits)
    }
}

/// Explains the RetryPolicy in the YAML file at `path`.
pub fn explain_file(path: &Path, deadline: Option<&str>) -> Result<Explanation, ExplainError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ExplainError::Read {
        path: shown.clone(),
        source,
    })?;
    explain_text(&shown, &text, deadline)
}

/// Explains the RetryPolicy in `text`; `path` only names the source in errors.
pub fn explain_text(
    path: &str,
    text: &str,
    deadline: Option<&str>,
) -> Result<Explanation, ExplainError> {
    let deadline = deadline
        .map(|value| match parse_go_duration(value) {
            Ok(duration) if !duration.is_zero() => Ok(duration),
            _ => Err(ExplainError::Deadline {
                value: value.to_owned(),
            }),
        })
        .transpose()?;
    let (name, spec) = find_policy(path, text)?;
    let policy =
        EffectivePolicy::from_spec(&(&spec).into()).map_err(|source| ExplainError::Invalid {
            path: path.to_owned(),
            source,
        })?;
    Ok(explain(name, &policy, deadline))
}

/// The explanation of a validated policy.
pub fn explain(
    name: Option<String>,
    policy: &EffectivePolicy,
    deadline: Option<Duration>,
) -> Explanation {
    let schedule = policy.schedule();
    let mut attempts = vec![AttemptRow {
        attempt: 1,
        upper_bound: "0s".to_owned(),
        upper_bound_seconds: 0.0,
        cumulative_worst_case: "0s".to_owned(),
        cumulative_worst_case_seconds: 0.0,
    }];
    attempts.extend(schedule.retries.iter().map(|retry| AttemptRow {
        attempt: retry.attempt,
        upper_bound: format_go_duration(retry.upper_bound),
        upper_bound_seconds: retry.upper_bound.as_secs_f64(),
        cumulative_worst_case: format_go_duration(retry.cumulative_worst_case),
        cumulative_worst_case_seconds: retry.cumulative_worst_case.as_secs_f64(),
    }));
    let worst = schedule.worst_case_retry_delay;
    let canonical = policy.to_canonical();
    Explanation {
        name,
        policy_hash: policy.policy_hash().to_owned(),
        max_attempts: policy.max_attempts(),
        backoff: BackoffSummary {
            base: canonical.backoff.base,
            cap: canonical.backoff.cap,
            jitter: canonical.backoff.jitter,
        },
        attempts,
        worst_case_retry_delay: format_go_duration(worst),
        worst_case_retry_delay_seconds: worst.as_secs_f64(),
        worst_case_amplification: schedule.worst_case_amplification,
        retry_budget: BudgetSummary {
            max_retry_ratio: policy.max_retry_ratio(),
            budgeted_amplification: schedule.budgeted_amplification,
        },
        deadline: deadline.map(|deadline| deadline_fit(worst, deadline)),
        schedule,
    }
}

fn deadline_fit(worst: Duration, deadline: Duration) -> DeadlineFit {
    let fits = worst <= deadline;
    let (spare, short_by) = if fits {
        (Some(deadline.saturating_sub(worst)), None)
    } else {
        (None, Some(worst.saturating_sub(deadline)))
    };
    DeadlineFit {
        deadline: format_go_duration(deadline),
        deadline_seconds: deadline.as_secs_f64(),
        fits,
        spare: spare.map(format_go_duration),
        spare_seconds: spare.map(|d| d.as_secs_f64()),
        short_by: short_by.map(format_go_duration),
        short_by_seconds: short_by.map(|d| d.as_secs_f64()),
    }
}

/// The explanation as a table for people.
pub fn table(explanation: &Explanation) -> String {
    let mut out = String::new();
    let title = explanation
        .name
        .as_deref()
        .map_or_else(|| "RetryPolicy".to_owned(), |n| format!("RetryPolicy {n}"));
    out.push_str(&format!(
        "{title} (policyHash {})\n",
        explanation.policy_hash
    ));
    let backoff = &explanation.backoff;
    let draw = match backoff.jitter {
        Jitter::Full => "a random delay in [0, upper bound]",
        Jitter::Equal => "a random delay in [upper bound / 2, upper bound]",
        Jitter::None => "exactly the upper bound",
    };
    out.push_str(&format!(
        "maxAttempts {}: attempt 1 is the first execution; a retry waits {draw}\n",
        explanation.max_attempts
    ));
    out.push_str(&format!(
        "backoff: upper(n) = min(cap {}, base {} × 2^(n-1)) after failed attempt n, {:?} jitter\n\
         (worst cases count the waits between attempts; the executions' own time comes on top)\n\n",
        backoff.cap, backoff.base, backoff.jitter
    ));
    out.push_str(&explanation.schedule.to_string());
    out.push_str(&format!(
        "retry budget:              retries at most {}% of primary executions (maxRetryRatio {})\n",
        (explanation.retry_budget.max_retry_ratio * 100_000.0).round() / 1000.0,
        explanation.retry_budget.max_retry_ratio
    ));
    if let Some(fit) = &explanation.deadline {
        let verdict = match (&fit.spare, &fit.short_by) {
            (Some(spare), _) => format!("fits, {spare} to spare"),
            (None, Some(short)) => format!(
                "does NOT fit: the worst case is {short} longer; lower maxAttempts or backoff.cap, or raise the deadline"
            ),
            (None, None) => "fits".to_owned(),
        };
        out.push_str(&format!(
            "deadline {}:{}{verdict}\n",
            fit.deadline,
            " ".repeat(17usize.saturating_sub(fit.deadline.len()))
        ));
    }
    out
}

/// The explanation as pretty JSON for machines.
pub fn json(explanation: &Explanation) -> Result<String, ExplainError> {
    let mut text = serde_json::to_string_pretty(explanation).map_err(ExplainError::Json)?;
    text.push('\n');
    Ok(text)
}

#[derive(Deserialize)]
struct Document {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: Option<Metadata>,
    #[serde(default)]
    spec: Option<serde_yaml::Value>,
}

#[derive(Deserialize)]
struct Metadata {
    #[serde(default)]
    name: Option<String>,
}

/// The one RetryPolicy of a (possibly multi-document) YAML file, or a bare spec.
fn find_policy(path: &str, text: &str) -> Result<(Option<String>, RetryPolicySpec), ExplainError> {
    let not_yaml = |source| ExplainError::NotYaml {
        path: path.to_owned(),
        source,
    };
    let mut documents = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value = serde_yaml::Value::deserialize(document).map_err(not_yaml)?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    let mut policies = Vec::new();
    for value in &documents {
        let document: Document =
            serde_yaml::from_value(value.clone()).map_err(|source| ExplainError::BadSpec {
                path: path.to_owned(),
                source,
            })?;
        if document.kind.as_deref() == Some("RetryPolicy") {
            policies.push((
                document.metadata.and_then(|m| m.name),
                document.spec.unwrap_or(serde_yaml::Value::Null),
            ));
        }
    }
    let bad_spec = |source| ExplainError::BadSpec {
        path: path.to_owned(),
        source,
    };
    match policies.len() {
        1 => {
            let (name, spec) = policies.remove(0);
            Ok((name, serde_yaml::from_value(spec).map_err(bad_spec)?))
        }
        0 => match documents.as_slice() {
            // A bare spec: a single document that is not a Kubernetes object.
            [only] if only.get("kind").is_none() && only.get("maxAttempts").is_some() => Ok((
                None,
                serde_yaml::from_value(only.clone()).map_err(bad_spec)?,
            )),
            _ => Err(ExplainError::NoPolicy {
                path: path.to_owned(),
            }),
        },
        count => Err(ExplainError::SeveralPolicies {
            path: path.to_owned(),
            count,
            names: policies
                .iter()
                .map(|(name, _)| name.as_deref().unwrap_or("unnamed"))
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: &str = "\
apiVersion: backlog.dev/v1alpha1
kind: RetryPolicy
metadata:
  name: standard
spec:
  maxAttempts: 5
  backoff: {base: 100ms, cap: 10s}
";

    #[test]
    fn the_known_policy() {
        let explanation = explain_text("known.yaml", KNOWN, Some("1s")).unwrap();
        let bounds: Vec<&str> = explanation.attempts[1..]
            .iter()
            .map(|a| a.upper_bound.as_str())
            .collect();
        assert_eq!(bounds, ["100ms", "200ms", "400ms", "800ms"]);
        assert_eq!(explanation.worst_case_retry_delay, "1.5s");
        assert_eq!(explanation.worst_case_amplification, 5);
        let fit = explanation.deadline.clone().unwrap();
        assert!(!fit.fits);
        assert_eq!(fit.short_by.as_deref(), Some("500ms"));
        let text = table(&explanation);
        assert!(
            text.starts_with("RetryPolicy standard (policyHash sha256:"),
            "{text}"
        );
        assert!(text.contains("worst-case retry delay:    1.5s\n"), "{text}");
        assert!(text.contains("deadline 1s:"), "{text}");
        assert!(
            text.contains("does NOT fit: the worst case is 500ms longer"),
            "{text}"
        );
    }

    #[test]
    fn a_fitting_deadline_says_how_much_is_spare() {
        let explanation = explain_text("known.yaml", KNOWN, Some("10s")).unwrap();
        assert!(explanation.fits());
        let text = table(&explanation);
        assert!(text.contains("fits, 8.5s to spare"), "{text}");
        let json: serde_json::Value = serde_json::from_str(&json(&explanation).unwrap()).unwrap();
        assert_eq!(json["deadline"]["spareSeconds"], 8.5);
        assert_eq!(json["attempts"][4]["cumulativeWorstCase"], "1.5s");
    }

    #[test]
    fn a_bare_spec_and_multi_document_files() {
        let bare = "maxAttempts: 2\nbackoff: {base: 1s, cap: 1s}\n";
        let explanation = explain_text("bare.yaml", bare, None).unwrap();
        assert_eq!(explanation.name, None);
        assert_eq!(explanation.worst_case_retry_delay, "1s");
        let with_other =
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: x}}\n---\n{KNOWN}");
        assert!(explain_text("two.yaml", &with_other, None).is_ok());
        let twice = format!("{KNOWN}---\n{KNOWN}");
        let error = explain_text("twice.yaml", &twice, None)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("holds 2 RetryPolicies (standard, standard)"),
            "{error}"
        );
    }

    #[test]
    fn errors_name_the_problem() {
        let bad = KNOWN.replace("cap: 10s", "cap: 10ms");
        let error = explain_text("bad.yaml", &bad, None)
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "bad.yaml: spec.backoff.cap \"10ms\" is shorter than spec.backoff.base \"100ms\": raise cap or lower base"
        );
        let error = explain_text("known.yaml", KNOWN, Some("soon"))
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("--deadline \"soon\" is not a positive duration"),
            "{error}"
        );
        let error = explain_text("cm.yaml", "kind: ConfigMap\n", None)
            .unwrap_err()
            .to_string();
        assert!(error.contains("holds no RetryPolicy"), "{error}");
    }
}
