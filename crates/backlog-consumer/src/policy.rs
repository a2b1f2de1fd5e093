//! A RetryPolicy, validated and normalized: what consumers actually run.
//!
//! The API server already refuses most bad specs (CEL rules in the CRD), but the operator and
//! consumers must not trust that: a spec can predate a rule, or come from a control document.
//! [`EffectivePolicy::from_spec`] checks everything again and normalizes the policy so that
//! two specs with the same meaning have the same [`policy_hash`](EffectivePolicy::policy_hash):
//!
//! - durations in canonical Go form (`1000ms` and `1s` are both `1s`);
//! - error codes trimmed; a code listed more than once keeps the class of its first listing
//!   (first match wins, so later listings never take effect);
//! - codes whose class is `defaultClass` dropped (they classify the same without a rule);
//! - the remaining codes grouped into one rule per class, classes in the order Transient,
//!   Persistent, Business, Unknown, codes sorted bytewise. Every code is in exactly one rule,
//!   so the order of rules no longer matters and the grouping keeps every code's class.

use std::collections::BTreeMap;
use std::time::Duration;

use backlog_core::digest::sha256_hex;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::backoff::{BackoffError, BackoffSchedule};
use super::classification::classify;
use super::go_duration::{GoDurationError, format_go_duration, parse_go_duration};
use super::retry_planner::RetryPlanner;
use super::schedule::RetrySchedule;
use backlog_core::retry_policy::{
    ClassificationRule, FailureClass, Jitter, MAX_ATTEMPTS_LIMIT, RetryPolicyDefinition,
    ValidatedRetryPolicy,
};

/// A spec that cannot become an effective policy. Each message names the field and the fix.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum PolicyError {
    /// `maxAttempts` outside `1..=20`.
    #[error(
        "{field} {value} is out of range: use 1 to 20 (attempt 1 is the first execution, so 1 means no retries)"
    )]
    MaxAttemptsOutOfRange {
        /// Path of the field, e.g. `spec.maxAttempts`.
        field: String,
        /// The value found.
        value: i64,
    },
    /// A duration string that does not parse.
    #[error("{field} {value:?} is not a duration: use Go syntax such as 250ms, 30s or 5m")]
    NotADuration {
        /// Path of the field, e.g. `spec.backoff.cap`.
        field: String,
        /// The string found.
        value: String,
    },
    /// A zero or negative duration.
    #[error("{field} {value:?} must be positive: use a duration such as 100ms")]
    NotPositive {
        /// Path of the field.
        field: String,
        /// The string found.
        value: String,
    },
    /// A duration beyond what Go (and so a Go consumer) can represent.
    #[error(
        "{field} {value:?} is longer than the largest Go duration (2562047h47m16.854775807s): use a shorter duration"
    )]
    DurationTooLong {
        /// Path of the field.
        field: String,
        /// The string found.
        value: String,
    },
    /// `backoff.cap` below `backoff.base`.
    #[error("{cap_field} {cap:?} is shorter than {base_field} {base:?}: raise cap or lower base")]
    CapBelowBase {
        /// Path of the cap field.
        cap_field: String,
        /// The cap found.
        cap: String,
        /// Path of the base field.
        base_field: String,
        /// The base found.
        base: String,
    },
    /// `retryBudget.maxRetryRatio` outside `[0, 1]` (or not a number).
    #[error("{field} {value} is out of range: use a share between 0 and 1, such as 0.1")]
    RetryRatioOutOfRange {
        /// Path of the field.
        field: String,
        /// The value found.
        value: f64,
    },
    /// An error code that is empty after trimming.
    #[error("{field} is blank: remove it or name the error code exactly as consumers report it")]
    BlankErrorCode {
        /// Path of the code, e.g. `spec.classification[2].errorCodes[0]`.
        field: String,
    },
    /// The normalized policy could not be serialized for hashing. Not expected: every field
    /// is a string, an integer, a finite number or a list of strings.
    #[error("the normalized policy could not be serialized for hashing: {0}")]
    NotSerializable(String),
}

/// A validated, normalized retry policy.
///
/// ```
/// use backlog_consumer::RetryPolicyDefinition;
/// use backlog_consumer::EffectivePolicy;
///
/// let spec: RetryPolicyDefinition = serde_json::from_str(r#"{
///     "maxAttempts": 5,
///     "backoff": {"base": "100ms", "cap": "10s"},
///     "classification": [{"errorCodes": ["HTTP_503", " HTTP_429 "], "class": "Transient"}]
/// }"#)?;
/// let policy = EffectivePolicy::from_spec(&spec)?;
/// assert_eq!(policy.classify("HTTP_429").as_str(), "Transient");
/// assert_eq!(policy.classify("HTTP_500").as_str(), "Unknown");
/// assert!(policy.policy_hash().starts_with("sha256:"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct EffectivePolicy {
    max_attempts: u32,
    backoff: BackoffSchedule,
    classification: Vec<ClassificationRule>,
    default_class: FailureClass,
    max_retry_ratio: f64,
    policy_hash: String,
}

/// The normalized policy as JSON: what `policyHash` hashes and what the control document
/// publishes. Field order is fixed, so its serialization is canonical.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CanonicalPolicy {
    /// Executions allowed per event, attempt 1 (the first execution) included.
    #[schemars(range(min = 1, max = 20))]
    pub max_attempts: u32,
    /// Delay between attempts.
    pub backoff: CanonicalBackoff,
    /// One rule per class that some code maps to, other than `defaultClass`; every code
    /// appears once.
    pub classification: Vec<ClassificationRule>,
    /// Class of every code no rule names.
    pub default_class: FailureClass,
    /// Fleet-wide cap on retries.
    pub retry_budget: CanonicalRetryBudget,
}

/// Backoff with durations in canonical Go form.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CanonicalBackoff {
    /// Upper bound of the first retry's delay, e.g. `100ms`.
    #[schemars(regex(pattern = GO_DURATION_PATTERN))]
    pub base: String,
    /// Largest delay any retry waits, e.g. `10s`.
    #[schemars(regex(pattern = GO_DURATION_PATTERN))]
    pub cap: String,
    /// How the delay is drawn below the upper bound.
    pub jitter: Jitter,
}

/// The retry budget.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CanonicalRetryBudget {
    /// Retries may be at most this share of primary executions.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub max_retry_ratio: f64,
}

/// Go duration syntax as the canonical form writes it (ASCII units only).
const GO_DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$";

/// The fields of a policy before validation, wherever they come from.
struct UncheckedPolicy<'a> {
    /// Path prefix for error messages: `spec` or `retryPolicy`.
    field_prefix: &'static str,
    max_attempts: i64,
    base: &'a str,
    cap: &'a str,
    jitter: Jitter,
    rules: &'a [ClassificationRule],
    default_class: FailureClass,
    max_retry_ratio: f64,
}

impl EffectivePolicy {
    /// Validates and normalizes a RetryPolicy spec. Errors name the field as `spec.…`.
    pub fn from_spec(spec: &RetryPolicyDefinition) -> Result<Self, PolicyError> {
        Self::build(UncheckedPolicy {
            field_prefix: "spec",
            max_attempts: i64::from(spec.max_attempts),
            base: &spec.backoff.base,
            cap: &spec.backoff.cap,
            jitter: spec.backoff.jitter,
            rules: &spec.classification,
            default_class: spec.default_class,
            max_retry_ratio: spec.retry_budget.max_retry_ratio,
        })
    }

    /// Validates a policy read from a control document. Errors name the field as
    /// `retryPolicy.…`. `from_canonical(&p.to_canonical())` gives back `p`.
    pub fn from_canonical(policy: &CanonicalPolicy) -> Result<Self, PolicyError> {
        Self::build(UncheckedPolicy {
            field_prefix: "retryPolicy",
            max_attempts: i64::from(policy.max_attempts),
            base: &policy.backoff.base,
            cap: &policy.backoff.cap,
            jitter: policy.backoff.jitter,
            rules: &policy.classification,
            default_class: policy.default_class,
            max_retry_ratio: policy.retry_budget.max_retry_ratio,
        })
    }

    fn build(unchecked: UncheckedPolicy<'_>) -> Result<Self, PolicyError> {
        let prefix = unchecked.field_prefix;
        let max_attempts = Some(unchecked.max_attempts)
            .filter(|attempts| (1..=i64::from(MAX_ATTEMPTS_LIMIT)).contains(attempts))
            .and_then(|attempts| u32::try_from(attempts).ok())
            .ok_or_else(|| PolicyError::MaxAttemptsOutOfRange {
                field: format!("{prefix}.maxAttempts"),
                value: unchecked.max_attempts,
            })?;
        let base_field = format!("{prefix}.backoff.base");
        let cap_field = format!("{prefix}.backoff.cap");
        let base = positive_duration(&base_field, unchecked.base)?;
        let cap = positive_duration(&cap_field, unchecked.cap)?;
        // Both durations were checked positive and within Go's range above, so in practice only
        // cap < base reaches this mapping; the others are mapped for completeness.
        let backoff =
            BackoffSchedule::new(base, cap, unchecked.jitter).map_err(|error| match error {
                BackoffError::ZeroBase => PolicyError::NotPositive {
                    field: base_field.clone(),
                    value: unchecked.base.to_owned(),
                },
                BackoffError::CapTooLong { .. } => PolicyError::DurationTooLong {
                    field: cap_field.clone(),
                    value: unchecked.cap.to_owned(),
                },
                BackoffError::CapBelowBase { .. } => PolicyError::CapBelowBase {
                    cap_field: cap_field.clone(),
                    cap: unchecked.cap.to_owned(),
                    base_field: base_field.clone(),
                    base: unchecked.base.to_owned(),
                },
            })?;
        if !(0.0..=1.0).contains(&unchecked.max_retry_ratio) {
            return Err(PolicyError::RetryRatioOutOfRange {
                field: format!("{prefix}.retryBudget.maxRetryRatio"),
                value: unchecked.max_retry_ratio,
            });
        }
        // -0.0 and 0.0 mean the same; only one may reach the hash.
        let max_retry_ratio = unchecked.max_retry_ratio + 0.0;
        let classification = normalize_rules(prefix, unchecked.rules, unchecked.default_class)?;
        let mut policy = Self {
            max_attempts,
            backoff,
            classification,
            default_class: unchecked.default_class,
            max_retry_ratio,
            policy_hash: String::new(),
        };
        policy.policy_hash = hash_canonical(&policy.to_canonical())?;
        Ok(policy)
    }

    /// Executions allowed per event, attempt 1 included (1..=20).
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The backoff between attempts.
    pub fn backoff(&self) -> &BackoffSchedule {
        &self.backoff
    }

    /// The normalized classification rules (see the module documentation).
    pub fn classification(&self) -> &[ClassificationRule] {
        &self.classification
    }

    /// The class of codes no rule names.
    pub fn default_class(&self) -> FailureClass {
        self.default_class
    }

    /// Retries may be at most this share of primary executions, in `[0, 1]`.
    pub fn max_retry_ratio(&self) -> f64 {
        self.max_retry_ratio
    }

    /// The policy's version: `sha256:` and the first 16 hex digits of the SHA-256 of the
    /// canonical JSON (see [`CanonicalPolicy`]). Equal for specs with the same meaning,
    /// different for any change in meaning.
    pub fn policy_hash(&self) -> &str {
        &self.policy_hash
    }

    /// The failure class of an error code under this policy.
    pub fn classify(&self, error_code: &str) -> FailureClass {
        classify(&self.classification, self.default_class, error_code)
    }

    /// A retry planner with this policy's attempts and backoff.
    pub fn planner(&self) -> RetryPlanner {
        RetryPlanner::new(self.max_attempts, self.backoff)
    }

    /// The worst-case schedule: per-retry upper bounds and the totals.
    ///
    /// ```
    /// use std::time::Duration;
    /// use backlog_consumer::{EffectivePolicy, RetryPolicyDefinition, format_go_duration};
    ///
    /// let spec: RetryPolicyDefinition = serde_json::from_str(
    ///     r#"{"maxAttempts": 5, "backoff": {"base": "100ms", "cap": "10s"}}"#,
    /// )?;
    /// let schedule = EffectivePolicy::from_spec(&spec)?.schedule();
    /// let bounds: Vec<String> = schedule.retries.iter().map(|retry| format_go_duration(retry.upper_bound)).collect();
    /// assert_eq!(bounds, ["100ms", "200ms", "400ms", "800ms"]);
    /// assert_eq!(schedule.worst_case_retry_delay, Duration::from_millis(1500));
    /// assert_eq!(schedule.worst_case_amplification, 5);
    /// assert_eq!(schedule.budgeted_amplification, 1.1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn schedule(&self) -> RetrySchedule {
        RetrySchedule::for_policy(self)
    }

    /// The normalized policy in its serializable, canonical form.
    pub fn to_canonical(&self) -> CanonicalPolicy {
        CanonicalPolicy {
            max_attempts: self.max_attempts,
            backoff: CanonicalBackoff {
                base: format_go_duration(self.backoff.base()),
                cap: format_go_duration(self.backoff.cap()),
                jitter: self.backoff.jitter(),
            },
            classification: self.classification.clone(),
            default_class: self.default_class,
            retry_budget: CanonicalRetryBudget {
                max_retry_ratio: self.max_retry_ratio,
            },
        }
    }
}

impl ValidatedRetryPolicy for EffectivePolicy {
    fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    fn backoff(&self) -> &BackoffSchedule {
        &self.backoff
    }

    fn max_retry_ratio(&self) -> f64 {
        self.max_retry_ratio
    }
}

fn positive_duration(field: &str, value: &str) -> Result<Duration, PolicyError> {
    let error_field = field.to_owned();
    let error_value = value.to_owned();
    match parse_go_duration(value) {
        Ok(duration) if !duration.is_zero() => Ok(duration),
        Ok(_) | Err(GoDurationError::Negative) => Err(PolicyError::NotPositive {
            field: error_field,
            value: error_value,
        }),
        Err(GoDurationError::TooLong) => Err(PolicyError::DurationTooLong {
            field: error_field,
            value: error_value,
        }),
        Err(GoDurationError::Malformed) => Err(PolicyError::NotADuration {
            field: error_field,
            value: error_value,
        }),
    }
}

/// Normalizes classification rules as the module documentation describes.
fn normalize_rules(
    prefix: &str,
    rules: &[ClassificationRule],
    default_class: FailureClass,
) -> Result<Vec<ClassificationRule>, PolicyError> {
    let mut class_of_code: BTreeMap<&str, FailureClass> = BTreeMap::new();
    for (rule_index, rule) in rules.iter().enumerate() {
        for (code_index, code) in rule.error_codes.iter().enumerate() {
            let code = code.trim();
            if code.is_empty() {
                return Err(PolicyError::BlankErrorCode {
                    field: format!(
                        "{prefix}.classification[{rule_index}].errorCodes[{code_index}]"
                    ),
                });
            }
            class_of_code.entry(code).or_insert(rule.class);
        }
    }
    let mut codes_of_class: BTreeMap<FailureClass, Vec<String>> = BTreeMap::new();
    // BTreeMap iteration is sorted, so each class's codes come out sorted.
    for (code, class) in class_of_code {
        if class != default_class {
            codes_of_class
                .entry(class)
                .or_default()
                .push(code.to_owned());
        }
    }
    Ok(codes_of_class
        .into_iter()
        .map(|(class, error_codes)| ClassificationRule { error_codes, class })
        .collect())
}

fn hash_canonical(policy: &CanonicalPolicy) -> Result<String, PolicyError> {
    let json = serde_json::to_vec(policy)
        .map_err(|error| PolicyError::NotSerializable(error.to_string()))?;
    // The first 8 bytes, as 16 hex digits.
    Ok(format!("sha256:{}", &sha256_hex(&json)[..16]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use backlog_core::retry_policy::{BackoffDefinition, RetryBudgetDefinition};
    use proptest::prelude::*;

    fn spec(max_attempts: i32, base: &str, cap: &str) -> RetryPolicyDefinition {
        RetryPolicyDefinition {
            max_attempts,
            backoff: BackoffDefinition {
                base: base.to_owned(),
                cap: cap.to_owned(),
                jitter: Jitter::Full,
            },
            classification: Vec::new(),
            default_class: FailureClass::Unknown,
            retry_budget: RetryBudgetDefinition::default(),
        }
    }

    fn rule(codes: &[&str], class: FailureClass) -> ClassificationRule {
        ClassificationRule {
            error_codes: codes.iter().map(|code| (*code).to_owned()).collect(),
            class,
        }
    }

    fn error_of(spec: &RetryPolicyDefinition) -> String {
        match EffectivePolicy::from_spec(spec) {
            Ok(_) => panic!("expected {spec:?} to be refused"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn accepts_the_documented_example() {
        let policy = EffectivePolicy::from_spec(&spec(5, "100ms", "10s")).expect("valid");
        assert_eq!(policy.max_attempts(), 5);
        assert_eq!(policy.backoff().base(), Duration::from_millis(100));
        assert_eq!(policy.backoff().cap(), Duration::from_secs(10));
        assert_eq!(policy.max_retry_ratio(), 0.1);
        assert_eq!(policy.policy_hash().len(), "sha256:".len() + 16);
    }

    #[test]
    fn errors_name_the_field_and_the_fix() {
        assert_eq!(
            error_of(&spec(5, "100ms", "abc")),
            "spec.backoff.cap \"abc\" is not a duration: use Go syntax such as 250ms, 30s or 5m"
        );
        assert_eq!(
            error_of(&spec(5, "0s", "1s")),
            "spec.backoff.base \"0s\" must be positive: use a duration such as 100ms"
        );
        assert!(error_of(&spec(5, "-1s", "1s")).contains("must be positive"));
        assert_eq!(
            error_of(&spec(5, "2s", "1s")),
            "spec.backoff.cap \"1s\" is shorter than spec.backoff.base \"2s\": raise cap or lower base"
        );
        assert!(error_of(&spec(5, "1s", "99999999999h")).contains("longer than the largest"));
        for attempts in [0, 21, -3] {
            assert!(error_of(&spec(attempts, "1s", "1s")).starts_with(&format!(
                "spec.maxAttempts {attempts} is out of range: use 1 to 20"
            )));
        }
        for ratio in [-0.1, 1.5, f64::NAN, f64::INFINITY] {
            let mut bad = spec(5, "1s", "1s");
            bad.retry_budget.max_retry_ratio = ratio;
            assert!(error_of(&bad).starts_with("spec.retryBudget.maxRetryRatio"));
        }
        let mut blank = spec(5, "1s", "1s");
        blank.classification = vec![
            rule(&["A"], FailureClass::Transient),
            rule(&["B", "  "], FailureClass::Business),
        ];
        assert_eq!(
            error_of(&blank),
            "spec.classification[1].errorCodes[1] is blank: remove it or name the error code exactly as consumers report it"
        );
    }

    #[test]
    fn bounds_of_max_attempts_are_accepted() {
        assert!(EffectivePolicy::from_spec(&spec(1, "1s", "1s")).is_ok());
        assert!(EffectivePolicy::from_spec(&spec(20, "1s", "1s")).is_ok());
    }

    #[test]
    fn normalizes_durations_and_rules() {
        let mut raw = spec(5, "1000ms", "0.5m");
        raw.classification = vec![
            rule(&["  HTTP_503 ", "TIMEOUT"], FailureClass::Transient),
            rule(&["HTTP_503", "AUTH"], FailureClass::Persistent),
            rule(&["GONE", "TIMEOUT"], FailureClass::Unknown),
            rule(&["ACCT_CLOSED"], FailureClass::Business),
            rule(&["DEADLOCK"], FailureClass::Transient),
        ];
        let canonical = EffectivePolicy::from_spec(&raw)
            .expect("valid")
            .to_canonical();
        assert_eq!(canonical.backoff.base, "1s");
        assert_eq!(canonical.backoff.cap, "30s");
        assert_eq!(
            canonical.classification,
            vec![
                rule(
                    &["DEADLOCK", "HTTP_503", "TIMEOUT"],
                    FailureClass::Transient
                ),
                rule(&["AUTH"], FailureClass::Persistent),
                rule(&["ACCT_CLOSED"], FailureClass::Business),
            ]
        );
    }

    #[test]
    fn normalization_keeps_every_codes_class() {
        let mut raw = spec(5, "1s", "1s");
        raw.default_class = FailureClass::Persistent;
        raw.classification = vec![
            rule(&["A", "B"], FailureClass::Transient),
            rule(&["B", "C"], FailureClass::Persistent),
            rule(&["C", "D"], FailureClass::Unknown),
        ];
        let policy = EffectivePolicy::from_spec(&raw).expect("valid");
        for code in ["A", "B", "C", "D", "E"] {
            assert_eq!(
                policy.classify(code),
                classify(&raw.classification, raw.default_class, code),
                "{code}"
            );
        }
    }

    #[test]
    fn canonical_form_round_trips() {
        let mut raw = spec(7, "250ms", "1m30s");
        raw.backoff.jitter = Jitter::Equal;
        raw.classification = vec![rule(&["X"], FailureClass::Business)];
        let policy = EffectivePolicy::from_spec(&raw).expect("valid");
        let json = serde_json::to_string(&policy.to_canonical()).expect("serializable");
        assert_eq!(
            json,
            r#"{"maxAttempts":7,"backoff":{"base":"250ms","cap":"1m30s","jitter":"Equal"},"classification":[{"errorCodes":["X"],"class":"Business"}],"defaultClass":"Unknown","retryBudget":{"maxRetryRatio":0.1}}"#
        );
        let parsed: CanonicalPolicy = serde_json::from_str(&json).expect("parses");
        assert_eq!(EffectivePolicy::from_canonical(&parsed), Ok(policy));
    }

    /// Pins the canonical form: if this changes, every published policyHash changes with it,
    /// which consumers see as a new policy version. Computed independently with Python's
    /// hashlib over the canonical JSON.
    #[test]
    fn hash_of_a_known_policy() {
        let mut raw = spec(5, "100ms", "10s");
        raw.classification = vec![rule(&["HTTP_503"], FailureClass::Transient)];
        let policy = EffectivePolicy::from_spec(&raw).expect("valid");
        assert_eq!(policy.policy_hash(), "sha256:a354a4828b496272");
    }

    #[test]
    fn canonical_errors_name_the_document_field() {
        let mut canonical = EffectivePolicy::from_spec(&spec(5, "1s", "1s"))
            .expect("valid")
            .to_canonical();
        canonical.max_attempts = 50;
        assert!(
            EffectivePolicy::from_canonical(&canonical)
                .map_err(|error| error.to_string())
                .is_err_and(|message| message.starts_with("retryPolicy.maxAttempts 50"))
        );
    }

    fn any_class() -> impl Strategy<Value = FailureClass> {
        prop_oneof![
            Just(FailureClass::Transient),
            Just(FailureClass::Persistent),
            Just(FailureClass::Business),
            Just(FailureClass::Unknown),
        ]
    }

    fn any_jitter() -> impl Strategy<Value = Jitter> {
        prop_oneof![Just(Jitter::Full), Just(Jitter::Equal), Just(Jitter::None)]
    }

    /// A valid spec with base and cap in whole milliseconds.
    fn any_spec() -> impl Strategy<Value = RetryPolicyDefinition> {
        (
            1i32..=20,
            1u64..=5_000,
            0u64..=100_000,
            any_jitter(),
            prop::collection::vec((prop::collection::vec("[A-F]", 1..4), any_class()), 0..5),
            any_class(),
            0u32..=100,
        )
            .prop_map(
                |(max_attempts, base_ms, extra_ms, jitter, rules, default_class, percent)| {
                    RetryPolicyDefinition {
                        max_attempts,
                        backoff: BackoffDefinition {
                            base: format!("{base_ms}ms"),
                            cap: format!("{}ms", base_ms + extra_ms),
                            jitter,
                        },
                        classification: rules
                            .into_iter()
                            .map(|(error_codes, class)| ClassificationRule { error_codes, class })
                            .collect(),
                        default_class,
                        retry_budget: RetryBudgetDefinition {
                            max_retry_ratio: f64::from(percent) / 100.0,
                        },
                    }
                },
            )
    }

    fn hash(spec: &RetryPolicyDefinition) -> String {
        EffectivePolicy::from_spec(spec)
            .expect("generated specs are valid")
            .policy_hash()
            .to_owned()
    }

    /// Milliseconds written another way: whole seconds as `s`, otherwise as fractional seconds.
    fn respell_millis(text: &str) -> String {
        let millis: u64 = text
            .trim_end_matches("ms")
            .parse()
            .expect("generated as NNNms");
        if millis.is_multiple_of(1000) {
            format!("{}s", millis / 1000)
        } else if millis > 60_000 {
            format!("1m{}ms", millis - 60_000)
        } else {
            format!("{}s", millis as f64 / 1000.0)
        }
    }

    proptest! {
        #[test]
        fn equivalent_specs_hash_equal(spec in any_spec(), code in "[A-F]", rotate in 0usize..5) {
            let original = hash(&spec);

            let mut respelled = spec.clone();
            respelled.backoff.base = respell_millis(&spec.backoff.base);
            respelled.backoff.cap = respell_millis(&spec.backoff.cap);
            prop_assert_eq!(hash(&respelled), original.clone());

            // Repeating a code later, padding codes with spaces, splitting rules into
            // one-code rules and listing a code in the default class (when no earlier rule
            // names it) do not change any code's class.
            let mut noisy = spec.clone();
            noisy.classification = spec
                .classification
                .iter()
                .flat_map(|rule| rule.error_codes.iter().map(|code| ClassificationRule {
                    error_codes: vec![format!(" {code} ")],
                    class: rule.class,
                }))
                .collect();
            noisy.classification.push(ClassificationRule {
                error_codes: vec![code.clone()],
                class: spec.default_class,
            });
            if let Some(first) = spec.classification.first() {
                noisy.classification.push(first.clone());
            }
            prop_assert_eq!(hash(&noisy), original.clone());

            // Rules whose codes no other rule names can be listed in any order.
            let mut disjoint = EffectivePolicy::from_spec(&spec).expect("valid").to_canonical();
            if !disjoint.classification.is_empty() {
                let len = disjoint.classification.len();
                disjoint.classification.rotate_left(rotate % len);
            }
            let reordered = EffectivePolicy::from_canonical(&disjoint).expect("valid");
            prop_assert_eq!(reordered.policy_hash(), original.as_str());
        }

        #[test]
        fn any_change_in_meaning_changes_the_hash(spec in any_spec(), code in "[G-Z]", class in any_class()) {
            let original = hash(&spec);
            let mut changes = Vec::new();

            let mut more_attempts = spec.clone();
            more_attempts.max_attempts = spec.max_attempts % 20 + 1;
            changes.push(more_attempts);

            let mut longer_cap = spec.clone();
            longer_cap.backoff.cap = format!("{}s", 100_000 + spec.max_attempts);
            changes.push(longer_cap);

            let mut shorter_base = spec.clone();
            shorter_base.backoff.base = "1ns".to_owned();
            changes.push(shorter_base);

            let mut other_jitter = spec.clone();
            other_jitter.backoff.jitter = match spec.backoff.jitter {
                Jitter::Full => Jitter::Equal,
                Jitter::Equal => Jitter::None,
                Jitter::None => Jitter::Full,
            };
            changes.push(other_jitter);

            let mut other_ratio = spec.clone();
            other_ratio.retry_budget.max_retry_ratio = (spec.retry_budget.max_retry_ratio + 0.005) % 1.0;
            changes.push(other_ratio);

            if class != spec.default_class {
                // A new code outside the default class, listed first so that it wins.
                let mut new_code = spec.clone();
                new_code.classification.insert(0, rule(&[code.as_str()], class));
                changes.push(new_code);

                // A new default class changes the class of every unnamed code.
                let mut new_default = spec.clone();
                new_default.default_class = class;
                changes.push(new_default);
            }

            for changed in changes {
                prop_assert_ne!(hash(&changed), original.clone(), "{:?}", changed);
            }
        }
    }
}
