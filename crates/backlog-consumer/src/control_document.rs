//! The consumer control document: the contract between the operator and consumers in any
//! language.
//!
//! For each BacklogBudget the operator keeps one ConfigMap holding this JSON document under
//! the key [`CONTROL_DOCUMENT_CONFIGMAP_KEY`]: the effective retry policy with its
//! `policyHash`, the state of every event class, a `revision` that only grows and the time it
//! was generated. Consumers mount the ConfigMap (the kubelet refreshes it within about a
//! minute, without a restart) or read it through the API.
//!
//! Its JSON Schema (draft 2020-12) is committed next to this file as
//! `control-document.schema.json` and generated from these types; a test fails when the two
//! drift apart.
//!
//! Compatibility: within `backlog.dev/control/v1` fields are only added, never removed or
//! redefined, so readers must ignore fields they do not know (this library does). A breaking
//! change gets a new `apiVersion`.
//!
//! ```json
//! {
//!   "apiVersion": "backlog.dev/control/v1",
//!   "budget": {"namespace": "shop", "name": "orders"},
//!   "revision": 12,
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
//!   "eventClasses": [
//!     {"name": "refund", "state": "Probing", "probeRatio": 0.1, "since": "2026-03-01T11:58:00Z"}
//!   ]
//! }
//! ```

use std::collections::HashSet;
use std::str::FromStr;

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::policy::{CanonicalPolicy, EffectivePolicy, PolicyError};
use super::probe::is_probe;
use backlog_core::event_class::ClassState;

/// The `apiVersion` of the documents this library reads and writes.
pub const CONTROL_API_VERSION: &str = "backlog.dev/control/v1";

/// The key of the document in the budget's ConfigMap (and so its file name when mounted).
pub const CONTROL_DOCUMENT_CONFIGMAP_KEY: &str = "control.json";

/// What a consumer of one BacklogBudget should do: which retry policy to run and which event
/// classes to process.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(title = "backlog.dev consumer control document")]
pub struct ControlDocument {
    /// Always `backlog.dev/control/v1` for this shape; a reader refuses versions it does not
    /// know rather than guessing.
    #[schemars(extend("const" = CONTROL_API_VERSION))]
    pub api_version: String,
    /// The BacklogBudget this document belongs to.
    pub budget: BudgetReference,
    /// Starts at 1 and grows by at least 1 whenever the content changes, so a reader can tell
    /// a stale copy (from a lagging cache or mount) from a newer one.
    #[schemars(range(min = 1))]
    pub revision: u64,
    /// When the operator generated this revision (RFC 3339).
    #[schemars(extend("format" = "date-time"))]
    pub generated_at: String,
    /// The effective retry policy; absent when the budget references no usable RetryPolicy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "PublishedRetryPolicy")]
    pub retry_policy: Option<PublishedRetryPolicy>,
    /// The state of each event class the budget declares. Classes not listed are Active.
    #[serde(default)]
    pub event_classes: Vec<EventClassControl>,
}

/// A BacklogBudget's namespace and name.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Hash)]
pub struct BudgetReference {
    /// Namespace of the BacklogBudget.
    #[schemars(length(min = 1))]
    pub namespace: String,
    /// Name of the BacklogBudget.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// The effective retry policy as published: its name, its version and its normalized content.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PublishedRetryPolicy {
    /// Name of the RetryPolicy (in the budget's namespace).
    #[schemars(length(min = 1))]
    pub name: String,
    /// The policy's version: changes exactly when its meaning changes. Treat it as opaque;
    /// use it to label metrics and logs with the policy in force.
    #[schemars(regex(pattern = r"^sha256:[0-9a-f]{16}$"))]
    pub policy_hash: String,
    /// The normalized policy.
    #[serde(flatten)]
    pub policy: CanonicalPolicy,
}

/// One event class's state as consumers must honor it.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend(
    "if" = {"properties": {"state": {"const": "Probing"}}},
    "then" = {"required": ["probeRatio"]},
    "else" = {"not": {"required": ["probeRatio"]}}
))]
pub struct EventClassControl {
    /// The class name, as consumers report it.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Active: process every event. Paused: process none (leave them in the queue; pausing
    /// never deletes or moves events). Probing: process only the events selected by the
    /// probe function at `probeRatio`.
    pub state: ClassState,
    /// Share of the class processed while Probing, in (0, 1]; present exactly when Probing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "f64", extend("exclusiveMinimum" = 0, "maximum" = 1))]
    pub probe_ratio: Option<f64>,
    /// When the class entered this state (RFC 3339).
    #[schemars(extend("format" = "date-time"))]
    pub since: String,
}

/// A control document that is not one this library can act on. Messages name the field.
#[derive(Debug, Error)]
pub enum DocumentError {
    /// Not JSON, or JSON of the wrong shape.
    #[error("the control document is not valid {CONTROL_API_VERSION} JSON: {0}")]
    Malformed(#[source] serde_json::Error),
    /// No `apiVersion` string.
    #[error(
        "apiVersion is missing: a control document names its version, e.g. {CONTROL_API_VERSION:?}"
    )]
    MissingApiVersion,
    /// A version this library does not read.
    #[error(
        "apiVersion {found:?} is not supported: this library reads {CONTROL_API_VERSION:?}; upgrade the consumer library"
    )]
    UnsupportedApiVersion {
        /// The version found.
        found: String,
    },
    /// Revision 0.
    #[error("revision 0 is not valid: revisions start at 1 and only grow")]
    ZeroRevision,
    /// A required name that is empty.
    #[error("{field} is empty: it must name the object")]
    EmptyName {
        /// Path of the field.
        field: String,
    },
    /// A timestamp that is not RFC 3339.
    #[error("{field} {value:?} is not an RFC 3339 timestamp such as 2026-01-02T15:04:05Z")]
    NotATimestamp {
        /// Path of the field.
        field: String,
        /// The string found.
        value: String,
    },
    /// Two entries for the same class.
    #[error("{field} {name:?} repeats an earlier class: each class appears once")]
    DuplicateClass {
        /// Path of the repeated name.
        field: String,
        /// The class name.
        name: String,
    },
    /// A Probing class without a ratio.
    #[error("{field} is missing: a Probing class needs a probeRatio in (0, 1]")]
    MissingProbeRatio {
        /// Path of the missing field.
        field: String,
    },
    /// A ratio outside (0, 1].
    #[error("{field} {value} is out of range: use a share in (0, 1], such as 0.1")]
    ProbeRatioOutOfRange {
        /// Path of the field.
        field: String,
        /// The value found.
        value: f64,
    },
    /// A ratio on a class that is not Probing.
    #[error("{field} is set but the class is {state:?}: only Probing classes carry a probeRatio")]
    UnexpectedProbeRatio {
        /// Path of the field.
        field: String,
        /// The class's state.
        state: ClassState,
    },
    /// A `policyHash` of the wrong form.
    #[error("retryPolicy.policyHash {value:?} is not of the form sha256:<16 lowercase hex digits>")]
    BadPolicyHash {
        /// The string found.
        value: String,
    },
    /// A retry policy that does not validate.
    #[error(transparent)]
    RetryPolicy(#[from] PolicyError),
    /// The document could not be serialized.
    #[error("the control document could not be serialized: {0}")]
    NotSerializable(#[source] serde_json::Error),
}

impl ControlDocument {
    /// Parses a control document and checks everything a consumer relies on: the version,
    /// `revision ≥ 1`, RFC 3339 timestamps, non-empty names, unique class names, `probeRatio`
    /// in (0, 1] exactly on Probing classes, and a retry policy that validates.
    ///
    /// A consumer that gets an error should keep acting on the last document it accepted.
    pub fn parse_and_validate(json: &str) -> Result<Self, DocumentError> {
        // The version is checked before the shape: a document of a newer version may have a
        // different shape, and "unsupported version" is the useful message then.
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(DocumentError::Malformed)?;
        match value.get("apiVersion").and_then(serde_json::Value::as_str) {
            None => return Err(DocumentError::MissingApiVersion),
            Some(CONTROL_API_VERSION) => {}
            Some(other) => {
                return Err(DocumentError::UnsupportedApiVersion {
                    found: other.to_owned(),
                });
            }
        }
        let document: Self = serde_json::from_value(value).map_err(DocumentError::Malformed)?;
        document.validate()?;
        Ok(document)
    }

    /// The checks of [`parse_and_validate`](Self::parse_and_validate), for a document built in
    /// code (the operator runs them before publishing).
    pub fn validate(&self) -> Result<(), DocumentError> {
        if self.api_version != CONTROL_API_VERSION {
            return Err(DocumentError::UnsupportedApiVersion {
                found: self.api_version.clone(),
            });
        }
        if self.revision == 0 {
            return Err(DocumentError::ZeroRevision);
        }
        require_name("budget.namespace", &self.budget.namespace)?;
        require_name("budget.name", &self.budget.name)?;
        require_timestamp("generatedAt", &self.generated_at)?;
        if let Some(published) = &self.retry_policy {
            require_name("retryPolicy.name", &published.name)?;
            if !is_policy_hash(&published.policy_hash) {
                return Err(DocumentError::BadPolicyHash {
                    value: published.policy_hash.clone(),
                });
            }
            published.effective()?;
        }
        let mut seen = HashSet::new();
        for (index, class) in self.event_classes.iter().enumerate() {
            class.validate(&format!("eventClasses[{index}]"))?;
            if !seen.insert(class.name.as_str()) {
                return Err(DocumentError::DuplicateClass {
                    field: format!("eventClasses[{index}].name"),
                    name: class.name.clone(),
                });
            }
        }
        Ok(())
    }

    /// The document as pretty-printed JSON, after [`validate`](Self::validate).
    pub fn to_json(&self) -> Result<String, DocumentError> {
        self.validate()?;
        let mut json =
            serde_json::to_string_pretty(self).map_err(DocumentError::NotSerializable)?;
        json.push('\n');
        Ok(json)
    }

    /// Whether a consumer should process an event of `class` now: Active → yes, Paused → no,
    /// Probing → only if [`is_probe`]`(event_id, probeRatio)`. A class the document does not
    /// list is processed: only classes the budget declares can be paused.
    ///
    /// A Probing entry without a ratio (which validation refuses) processes nothing: when in
    /// doubt, a failing class stays paused rather than flooding the dependency.
    pub fn should_process(&self, class: &str, event_id: &str) -> bool {
        match self.event_class(class) {
            None => true,
            Some(control) => match control.state {
                ClassState::Active => true,
                ClassState::Paused => false,
                ClassState::Probing => is_probe(event_id, control.probe_ratio.unwrap_or(0.0)),
            },
        }
    }

    /// The entry for `class`, if the document lists it.
    pub fn event_class(&self, class: &str) -> Option<&EventClassControl> {
        self.event_classes
            .iter()
            .find(|control| control.name == class)
    }

    /// The retry policy to run, validated; `None` when the document carries none.
    pub fn effective_retry_policy(&self) -> Result<Option<EffectivePolicy>, PolicyError> {
        self.retry_policy
            .as_ref()
            .map(PublishedRetryPolicy::effective)
            .transpose()
    }

    /// Whether the two documents say the same thing, ignoring `revision` and `generatedAt`.
    /// The operator rewrites the ConfigMap (with the next revision) only when this is false,
    /// so an unchanged state does not churn every consumer's mount.
    pub fn content_equals(&self, other: &Self) -> bool {
        self.api_version == other.api_version
            && self.budget == other.budget
            && self.retry_policy == other.retry_policy
            && self.event_classes == other.event_classes
    }

    /// Whether this document should replace `previous` in a consumer: same budget and a
    /// higher revision. An older or equal revision is a stale read and is ignored.
    pub fn supersedes(&self, previous: &Self) -> bool {
        self.budget == previous.budget && self.revision > previous.revision
    }
}

impl PublishedRetryPolicy {
    /// The published form of an effective policy.
    pub fn new(name: impl Into<String>, policy: &EffectivePolicy) -> Self {
        Self {
            name: name.into(),
            policy_hash: policy.policy_hash().to_owned(),
            policy: policy.to_canonical(),
        }
    }

    /// The policy, validated, ready to classify and plan with.
    pub fn effective(&self) -> Result<EffectivePolicy, PolicyError> {
        EffectivePolicy::from_canonical(&self.policy)
    }
}

impl EventClassControl {
    fn validate(&self, path: &str) -> Result<(), DocumentError> {
        require_name(&format!("{path}.name"), &self.name)?;
        require_timestamp(&format!("{path}.since"), &self.since)?;
        let ratio_field = format!("{path}.probeRatio");
        match (self.state, self.probe_ratio) {
            (ClassState::Probing, None) => {
                Err(DocumentError::MissingProbeRatio { field: ratio_field })
            }
            (ClassState::Probing, Some(ratio)) if !(ratio > 0.0 && ratio <= 1.0) => {
                Err(DocumentError::ProbeRatioOutOfRange {
                    field: ratio_field,
                    value: ratio,
                })
            }
            (ClassState::Probing, Some(_)) | (_, None) => Ok(()),
            (state, Some(_)) => Err(DocumentError::UnexpectedProbeRatio {
                field: ratio_field,
                state,
            }),
        }
    }
}

fn require_name(field: &str, value: &str) -> Result<(), DocumentError> {
    if value.trim().is_empty() {
        return Err(DocumentError::EmptyName {
            field: field.to_owned(),
        });
    }
    Ok(())
}

fn require_timestamp(field: &str, value: &str) -> Result<(), DocumentError> {
    Timestamp::from_str(value)
        .map(|_| ())
        .map_err(|_| DocumentError::NotATimestamp {
            field: field.to_owned(),
            value: value.to_owned(),
        })
}

fn is_policy_hash(value: &str) -> bool {
    value.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 16
            && hex
                .bytes()
                .all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// The JSON Schema (draft 2020-12) of [`ControlDocument`], as committed in
/// `crates/backlog-consumer/src/control-document.schema.json`.
pub fn control_document_schema() -> schemars::Schema {
    schemars::generate::SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<ControlDocument>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use backlog_core::retry_policy::{
        BackoffDefinition, FailureClass, Jitter, RetryBudgetDefinition, RetryPolicyDefinition,
    };
    use proptest::prelude::*;
    use serde_json::{Value, json};
    use std::path::PathBuf;

    const SCHEMA_FILE: &str = "src/control-document.schema.json";

    fn policy() -> EffectivePolicy {
        EffectivePolicy::from_spec(&RetryPolicyDefinition {
            max_attempts: 5,
            backoff: BackoffDefinition {
                base: "100ms".to_owned(),
                cap: "10s".to_owned(),
                jitter: Jitter::Full,
            },
            classification: vec![backlog_core::retry_policy::ClassificationRule {
                error_codes: vec!["HTTP_503".to_owned()],
                class: FailureClass::Transient,
            }],
            default_class: FailureClass::Unknown,
            retry_budget: RetryBudgetDefinition::default(),
        })
        .expect("valid policy")
    }

    fn class(name: &str, state: ClassState, probe_ratio: Option<f64>) -> EventClassControl {
        EventClassControl {
            name: name.to_owned(),
            state,
            probe_ratio,
            since: "2026-03-01T11:58:00Z".to_owned(),
        }
    }

    fn document() -> ControlDocument {
        ControlDocument {
            api_version: CONTROL_API_VERSION.to_owned(),
            budget: BudgetReference {
                namespace: "shop".to_owned(),
                name: "orders".to_owned(),
            },
            revision: 12,
            generated_at: "2026-03-01T12:00:00Z".to_owned(),
            retry_policy: Some(PublishedRetryPolicy::new("standard", &policy())),
            event_classes: vec![
                class("order", ClassState::Active, None),
                class("refund", ClassState::Paused, None),
                class("invoice", ClassState::Probing, Some(0.1)),
            ],
        }
    }

    fn document_json() -> Value {
        serde_json::to_value(document()).expect("serializable")
    }

    fn parse(value: &Value) -> Result<ControlDocument, DocumentError> {
        ControlDocument::parse_and_validate(&value.to_string())
    }

    fn remove(value: &mut Value, key: &str) {
        if let Some(object) = value.as_object_mut() {
            object.remove(key);
        }
    }

    /// Documents that break one rule each, with the start of the expected message.
    fn invalid_documents() -> Vec<(&'static str, Value, &'static str)> {
        let mut cases = Vec::new();
        let mut edit = |label, change: &dyn Fn(&mut Value), message| {
            let mut value = document_json();
            change(&mut value);
            cases.push((label, value, message));
        };
        edit(
            "unknown version",
            &|v| v["apiVersion"] = json!("backlog.dev/control/v2"),
            "apiVersion \"backlog.dev/control/v2\" is not supported",
        );
        edit(
            "no version",
            &|v| remove(v, "apiVersion"),
            "apiVersion is missing",
        );
        edit(
            "revision 0",
            &|v| v["revision"] = json!(0),
            "revision 0 is not valid",
        );
        edit(
            "negative revision",
            &|v| v["revision"] = json!(-1),
            "the control document is not valid",
        );
        edit(
            "no budget",
            &|v| remove(v, "budget"),
            "the control document is not valid",
        );
        edit(
            "bad timestamp",
            &|v| v["generatedAt"] = json!("yesterday"),
            "generatedAt \"yesterday\" is not an RFC 3339 timestamp",
        );
        edit(
            "unknown state",
            &|v| v["eventClasses"][0]["state"] = json!("HalfOpen"),
            "the control document is not valid",
        );
        edit(
            "ratio above 1",
            &|v| v["eventClasses"][2]["probeRatio"] = json!(1.5),
            "eventClasses[2].probeRatio 1.5 is out of range",
        );
        edit(
            "ratio 0",
            &|v| v["eventClasses"][2]["probeRatio"] = json!(0),
            "eventClasses[2].probeRatio 0 is out of range",
        );
        edit(
            "probing without ratio",
            &|v| remove(&mut v["eventClasses"][2], "probeRatio"),
            "eventClasses[2].probeRatio is missing",
        );
        edit(
            "ratio on a paused class",
            &|v| v["eventClasses"][1]["probeRatio"] = json!(0.5),
            "eventClasses[1].probeRatio is set but the class is Paused",
        );
        edit(
            "bad policy hash",
            &|v| v["retryPolicy"]["policyHash"] = json!("md5:abc"),
            "retryPolicy.policyHash \"md5:abc\"",
        );
        edit(
            "bad policy",
            &|v| v["retryPolicy"]["maxAttempts"] = json!(21),
            "retryPolicy.maxAttempts 21 is out of range",
        );
        edit(
            "bad duration",
            &|v| v["retryPolicy"]["backoff"]["cap"] = json!("soon"),
            "retryPolicy.backoff.cap \"soon\" is not a duration",
        );
        cases
    }

    #[test]
    fn round_trip() {
        let original = document();
        let json = original.to_json().expect("valid document");
        let parsed = ControlDocument::parse_and_validate(&json).expect("parses");
        assert_eq!(parsed, original);
        let effective = parsed
            .effective_retry_policy()
            .expect("valid policy")
            .expect("present");
        assert_eq!(effective, policy());
        assert_eq!(
            parsed
                .retry_policy
                .as_ref()
                .map(|published| published.policy_hash.as_str()),
            Some(policy().policy_hash())
        );
    }

    #[test]
    fn readers_ignore_unknown_fields() {
        let mut value = document_json();
        value["futureField"] = json!({"anything": true});
        value["eventClasses"][0]["futureField"] = json!(1);
        assert!(parse(&value).is_ok());
    }

    #[test]
    fn retry_policy_and_classes_are_optional() {
        let value = json!({
            "apiVersion": CONTROL_API_VERSION,
            "budget": {"namespace": "shop", "name": "orders"},
            "revision": 1,
            "generatedAt": "2026-03-01T12:00:00.5+01:00"
        });
        let parsed = parse(&value).expect("minimal document");
        assert_eq!(parsed.effective_retry_policy(), Ok(None));
        assert!(parsed.should_process("anything", "evt-1"));
    }

    #[test]
    fn validation_rejects_bad_documents() {
        for (label, value, message) in invalid_documents() {
            match parse(&value) {
                Ok(_) => panic!("{label}: accepted"),
                Err(error) => assert!(
                    error.to_string().starts_with(message),
                    "{label}: {error} does not start with {message:?}"
                ),
            }
        }
    }

    #[test]
    fn duplicate_classes_and_empty_names_are_rejected() {
        let mut duplicate = document();
        duplicate
            .event_classes
            .push(class("refund", ClassState::Active, None));
        assert_eq!(
            duplicate.validate().map_err(|error| error.to_string()),
            Err(
                "eventClasses[3].name \"refund\" repeats an earlier class: each class appears once"
                    .to_owned()
            )
        );
        let mut unnamed = document();
        unnamed.budget.namespace = String::new();
        assert!(unnamed.validate().is_err());
        assert!(unnamed.to_json().is_err());
    }

    #[test]
    fn should_process_follows_the_class_state() {
        let document = document();
        assert!(document.should_process("order", "evt-1"));
        assert!(!document.should_process("refund", "evt-1"));
        assert!(document.should_process("unlisted", "evt-1"));
        // Probing at 0.1: the probe test vectors decide.
        assert!(document.should_process("invoice", "order-1"));
        assert!(!document.should_process("invoice", "order-42"));
        let mut broken = document.clone();
        broken.event_classes[2].probe_ratio = None;
        assert!(!broken.should_process("invoice", "order-1"));
    }

    #[test]
    fn content_equality_ignores_revision_and_time() {
        let first = document();
        let mut later = first.clone();
        later.revision = 13;
        later.generated_at = "2026-03-01T12:05:00Z".to_owned();
        assert!(first.content_equals(&later));
        assert!(later.supersedes(&first));
        assert!(!first.supersedes(&later));
        let mut changed = later.clone();
        changed.event_classes[1].state = ClassState::Probing;
        changed.event_classes[1].probe_ratio = Some(0.1);
        assert!(!first.content_equals(&changed));
        let mut no_policy = later;
        no_policy.retry_policy = None;
        assert!(!first.content_equals(&no_policy));
    }

    fn schema_path() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(SCHEMA_FILE)
    }

    fn committed_schema() -> Value {
        let text = std::fs::read_to_string(schema_path())
            .unwrap_or_else(|error| panic!("cannot read {SCHEMA_FILE}: {error}"));
        serde_json::from_str(&text).unwrap_or_else(|error| panic!("{SCHEMA_FILE}: {error}"))
    }

    /// Fails when the committed schema differs from the one the types generate. Regenerate
    /// with `UPDATE_SCHEMA=1 cargo test -p backlog-consumer --lib committed_schema_matches_the_types`.
    #[test]
    fn committed_schema_matches_the_types() {
        let generated = control_document_schema();
        if std::env::var_os("UPDATE_SCHEMA").is_some() {
            let mut text = serde_json::to_string_pretty(&generated).expect("serializable");
            text.push('\n');
            std::fs::write(schema_path(), text).expect("schema file is writable");
            return;
        }
        // Compared as JSON values, so key order (which serde_json features can change) does
        // not matter.
        assert!(
            committed_schema() == generated.to_value(),
            "{SCHEMA_FILE} is out of date with the Rust types; regenerate it with \
             UPDATE_SCHEMA=1 cargo test -p backlog-consumer --lib committed_schema_matches_the_types and commit the result"
        );
    }

    fn schema_validator() -> jsonschema::Validator {
        jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .should_validate_formats(true)
            .build(&committed_schema())
            .expect("the committed schema is a valid draft 2020-12 schema")
    }

    #[test]
    fn committed_schema_accepts_valid_documents() {
        let validator = schema_validator();
        let minimal = json!({
            "apiVersion": CONTROL_API_VERSION,
            "budget": {"namespace": "shop", "name": "orders"},
            "revision": 1,
            "generatedAt": "2026-03-01T12:00:00Z"
        });
        for value in [document_json(), minimal] {
            let errors: Vec<String> = validator
                .iter_errors(&value)
                .map(|e| e.to_string())
                .collect();
            assert!(errors.is_empty(), "{errors:?}");
        }
    }

    #[test]
    fn committed_schema_rejects_invalid_documents() {
        let validator = schema_validator();
        // Every rule the invalid samples break is expressible in the schema; the uniqueness of
        // class names is not, and is checked in code only.
        for (label, value, _) in invalid_documents() {
            assert!(
                !validator.is_valid(&value),
                "{label}: the schema accepted it"
            );
        }
    }

    fn any_class_control() -> impl Strategy<Value = EventClassControl> {
        (
            "[a-z][a-z0-9-]{0,20}",
            prop_oneof![
                Just(ClassState::Active),
                Just(ClassState::Paused),
                Just(ClassState::Probing)
            ],
            0.001f64..=1.0,
            0i64..4_000_000_000,
        )
            .prop_map(|(name, state, ratio, seconds)| EventClassControl {
                name,
                state,
                probe_ratio: (state == ClassState::Probing).then_some(ratio),
                since: Timestamp::from_second(seconds)
                    .map(|time| time.to_string())
                    .unwrap_or_default(),
            })
    }

    fn any_document() -> impl Strategy<Value = ControlDocument> {
        (
            1u64..,
            any::<bool>(),
            prop::collection::vec(any_class_control(), 0..6),
        )
            .prop_map(|(revision, with_policy, classes)| {
                let mut seen = HashSet::new();
                ControlDocument {
                    revision,
                    retry_policy: with_policy
                        .then(|| PublishedRetryPolicy::new("standard", &policy())),
                    event_classes: classes
                        .into_iter()
                        .filter(|class| seen.insert(class.name.clone()))
                        .collect(),
                    ..document()
                }
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn valid_documents_round_trip_and_match_the_schema(document in any_document()) {
            let json = document.to_json().expect("generated documents are valid");
            let parsed = ControlDocument::parse_and_validate(&json).expect("parses");
            prop_assert!(parsed.content_equals(&document));
            prop_assert_eq!(&parsed, &document);
            let value: Value = serde_json::from_str(&json).expect("JSON");
            prop_assert!(schema_validator().is_valid(&value));
        }
    }
}
