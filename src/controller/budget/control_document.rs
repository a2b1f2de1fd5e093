//! The consumer control document: for each BacklogBudget one ConfigMap `<budget>-control`,
//! owned by the budget, holding the JSON document of [`crate::consumer::ControlDocument`] under
//! [`CONTROL_DOCUMENT_CONFIGMAP_KEY`]: the effective retry policy with its hash, every event
//! class's state, a `revision` that only grows and `generatedAt`.
//!
//! The ConfigMap is rewritten only when what it says changes ([`ControlDocument::content_equals`]):
//! every rewrite reaches every consumer's mount, and an unchanged document must not look new.
//! The revision is the larger of the ConfigMap's and `status.controlDocumentRevision`, plus
//! one, so it keeps growing when the ConfigMap is deleted or edited by hand.
//!
//! When the referenced RetryPolicy is missing or unusable, the document keeps the policy it
//! last published (fail static: consumers keep retrying the way they did) and the condition
//! says why.
//!
//! Deciding is pure ([`prepare`], [`build`]) on what the reconcile read (the RetryPolicy and
//! the ConfigMap); the plan applies the ConfigMap with server-side apply under the operator's
//! field manager, after the status that records its revision.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};

use crate::api::backlog_budget::{
    BacklogBudget, BacklogBudgetStatus, ClassState, EventClassStatus,
};
use crate::api::conditions::{ConditionSpec, Truth, merge_conditions};
use crate::api::retry_policy::RetryPolicy;
use crate::consumer::{
    BudgetReference, CONTROL_API_VERSION, CONTROL_DOCUMENT_CONFIGMAP_KEY, ControlDocument,
    EffectivePolicy, EventClassControl, PublishedRetryPolicy,
};
use crate::controller::apply::FIELD_MANAGER;

use super::document_copy::DocumentCopy;

/// True when the ConfigMap holds the document for the current spec and class states.
pub const CONTROL_DOCUMENT_PUBLISHED: &str = "ControlDocumentPublished";

/// Labels every control document ConfigMap carries.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The budget a control document belongs to (when its name fits a label value).
pub const BUDGET_LABEL: &str = "backlog.dev/budget";

/// The ConfigMap of a budget's control document.
pub fn configmap_name(budget: &str) -> String {
    format!("{budget}-control")
}

/// What `spec.retryPolicyRef` resolved to.
#[derive(Clone, Debug, PartialEq)]
pub enum PolicySource {
    /// No reference: the document carries no retry policy.
    Unset,
    /// The referenced policy, validated and normalized.
    Resolved(PublishedRetryPolicy),
    /// The reference names nothing usable; the last published policy stays.
    Unusable {
        reason: &'static str,
        message: String,
    },
}

/// A document built from the current state, and whether it must be written.
#[derive(Clone, Debug, PartialEq)]
pub struct Built {
    pub document: ControlDocument,
    /// False when the previous document already says the same.
    pub write: bool,
}

/// RFC 3339 in whole seconds, as the rest of the API writes times.
pub fn rfc3339(time: Timestamp) -> String {
    time.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The document for the current state (pure). `previous` is the document in the ConfigMap, if
/// any could be read; `status_revision` the revision status last recorded.
pub fn build(
    budget: BudgetReference,
    policy: &PolicySource,
    classes: &[EventClassStatus],
    previous: Option<&ControlDocument>,
    status_revision: Option<i64>,
    now: Timestamp,
) -> Built {
    let retry_policy = match policy {
        PolicySource::Unset => None,
        PolicySource::Resolved(published) => Some(published.clone()),
        PolicySource::Unusable { .. } => previous.and_then(|p| p.retry_policy.clone()),
    };
    let event_classes = classes
        .iter()
        .map(|class| EventClassControl {
            name: class.name.clone(),
            state: class.state,
            probe_ratio: match class.state {
                ClassState::Probing => class.probe_ratio,
                ClassState::Active | ClassState::Paused => None,
            },
            since: rfc3339(class.since.0),
        })
        .collect();
    let candidate = ControlDocument {
        api_version: CONTROL_API_VERSION.to_owned(),
        budget,
        revision: 1,
        generated_at: rfc3339(now),
        retry_policy,
        event_classes,
    };
    if let Some(previous) = previous
        && previous.content_equals(&candidate)
    {
        return Built {
            document: previous.clone(),
            write: false,
        };
    }
    let last = previous.map(|p| p.revision).unwrap_or(0).max(
        status_revision
            .and_then(|r| u64::try_from(r).ok())
            .unwrap_or(0),
    );
    Built {
        document: ControlDocument {
            revision: last.saturating_add(1),
            ..candidate
        },
        write: true,
    }
}

/// The document read back from a ConfigMap; `None` when absent or not a valid document (it is
/// then rewritten whole).
pub fn document_of(configmap: &ConfigMap) -> Option<ControlDocument> {
    DocumentCopy::of(configmap).document()
}

/// The ConfigMap holding `document` (pure).
pub fn configmap(
    name: &str,
    namespace: &str,
    owner: OwnerReference,
    budget: &str,
    json: String,
) -> ConfigMap {
    let mut labels = BTreeMap::from([(MANAGED_BY_LABEL.to_owned(), FIELD_MANAGER.to_owned())]);
    // Label values are at most 63 characters; longer budget names go without the label.
    if budget.len() <= 63 {
        labels.insert(BUDGET_LABEL.to_owned(), budget.to_owned());
    }
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            CONTROL_DOCUMENT_CONFIGMAP_KEY.to_owned(),
            json,
        )])),
        ..ConfigMap::default()
    }
}

/// What one reconcile will publish, decided before the status is written.
#[derive(Clone, Debug, PartialEq)]
pub struct Prepared {
    name: String,
    /// The ConfigMap to apply, when the document changed.
    pub write: Option<ConfigMap>,
    revision: Option<u64>,
    condition: ConditionSpec,
}

impl Prepared {
    fn held(name: String, condition: ConditionSpec) -> Self {
        Self {
            name,
            write: None,
            revision: None,
            condition,
        }
    }

    /// The status with the document's name, revision and condition.
    pub fn record(
        &self,
        mut status: BacklogBudgetStatus,
        generation: Option<i64>,
        now: Timestamp,
    ) -> BacklogBudgetStatus {
        status.control_document = Some(self.name.clone());
        if let Some(revision) = self.revision.and_then(|r| i64::try_from(r).ok()) {
            status.control_document_revision = Some(revision);
        }
        status.conditions = merge_conditions(
            &status.conditions,
            std::slice::from_ref(&self.condition),
            generation,
            now,
        );
        status
    }
}

/// What `spec.retryPolicyRef` names, as read: `Err` when it could not be read.
pub type PolicyFact = Result<PolicySource, kube::Error>;

/// The budget's ConfigMap as read.
#[derive(Debug)]
pub enum ConfigMapFact {
    /// No ConfigMap of that name.
    Absent,
    /// The ConfigMap: whether this budget owns it, and its document if it holds a valid one.
    Present {
        owned: bool,
        document: Option<Box<ControlDocument>>,
    },
    /// It could not be read.
    Unreadable(kube::Error),
}

impl ConfigMapFact {
    /// The fact of a ConfigMap read for the budget with `uid`.
    pub fn of(copy: Option<&DocumentCopy>, uid: Option<&str>) -> ConfigMapFact {
        match copy {
            None => ConfigMapFact::Absent,
            Some(copy) => ConfigMapFact::Present {
                owned: uid.is_some_and(|uid| copy.owned_by(uid)),
                document: copy.document().map(Box::new),
            },
        }
    }
}

/// What `reference` resolves to, given the RetryPolicy it names (if any) (pure).
pub fn resolve_policy(
    reference: Option<&str>,
    policy: Option<&RetryPolicy>,
    namespace: &str,
) -> PolicySource {
    let Some(reference) = reference else {
        return PolicySource::Unset;
    };
    let Some(policy) = policy else {
        return PolicySource::Unusable {
            reason: "RetryPolicyNotFound",
            message: format!(
                "spec.retryPolicyRef.name {reference:?} names no RetryPolicy in namespace {namespace}; create it or fix the reference"
            ),
        };
    };
    match EffectivePolicy::from_spec(&(&policy.spec).into()) {
        Ok(effective) => {
            PolicySource::Resolved(PublishedRetryPolicy::new(reference.to_owned(), &effective))
        }
        Err(problem) => PolicySource::Unusable {
            reason: "RetryPolicyInvalid",
            message: format!(
                "RetryPolicy {reference} (spec.retryPolicyRef) is unusable: {problem}"
            ),
        },
    }
}

/// Decides what to publish for `status` (pure). A read that failed leaves the document as it
/// is for this poll and says so in the condition.
pub fn prepare(
    budget: &BacklogBudget,
    policy: &PolicyFact,
    existing: &ConfigMapFact,
    status: &BacklogBudgetStatus,
    now: Timestamp,
) -> Prepared {
    let budget_name = budget.name_any();
    let name = configmap_name(&budget_name);
    let namespace = budget.namespace().unwrap_or_default();
    let unreadable = |what: &str, error: &kube::Error| {
        // Cluster-wide, the operator writes ConfigMaps only where a namespace admin granted it.
        let grant = match error {
            kube::Error::Api(status) if status.code == 403 => {
                " (a namespace admin grants it by binding the operator's <release>-namespace ClusterRole to its ServiceAccount here; see the README's Security section)"
            }
            _ => "",
        };
        ConditionSpec::new(
            CONTROL_DOCUMENT_PUBLISHED,
            Truth::Unknown,
            "ApiError",
            format!("could not read {what}: {error}{grant}; retrying at the next poll"),
        )
    };
    let policy = match policy {
        Ok(policy) => policy,
        Err(error) => {
            let condition = unreadable("the RetryPolicy", error);
            return Prepared::held(name, condition);
        }
    };
    let (owned, previous) = match existing {
        ConfigMapFact::Absent => (true, None),
        ConfigMapFact::Present { owned, document } => (*owned, document.as_deref()),
        ConfigMapFact::Unreadable(error) => {
            let condition = unreadable(&format!("ConfigMap {name}"), error);
            return Prepared::held(name, condition);
        }
    };
    let (Some(owner), Some(_)) = (budget.controller_owner_ref(&()), budget.uid()) else {
        let condition = ConditionSpec::new(
            CONTROL_DOCUMENT_PUBLISHED,
            Truth::Unknown,
            "NoUid",
            "the BacklogBudget has no uid yet; retrying at the next poll",
        );
        return Prepared::held(name, condition);
    };
    if !owned {
        let condition = ConditionSpec::new(
            CONTROL_DOCUMENT_PUBLISHED,
            Truth::False,
            "NameTaken",
            format!(
                "ConfigMap {name} exists and is not owned by this BacklogBudget; delete or rename it so the operator can publish the control document there"
            ),
        );
        return Prepared::held(name, condition);
    }
    let built = build(
        BudgetReference {
            namespace: namespace.clone(),
            name: budget_name.clone(),
        },
        policy,
        &status.event_classes,
        previous,
        status.control_document_revision,
        now,
    );
    let json = match built.document.to_json() {
        Ok(json) => json,
        Err(problem) => {
            let condition = ConditionSpec::new(
                CONTROL_DOCUMENT_PUBLISHED,
                Truth::False,
                "InvalidDocument",
                format!("the control document would not validate: {problem}"),
            );
            return Prepared::held(name, condition);
        }
    };
    let condition = published_condition(&name, &built.document, policy);
    Prepared {
        write: built
            .write
            .then(|| configmap(&name, &namespace, owner, &budget_name, json)),
        revision: Some(built.document.revision),
        name,
        condition,
    }
}

/// The condition for a document that is (or is about to be) in the ConfigMap.
pub fn published_condition(
    name: &str,
    document: &ControlDocument,
    policy: &PolicySource,
) -> ConditionSpec {
    let classes = document.event_classes.len();
    let published_policy = match &document.retry_policy {
        Some(published) => format!("retry policy {} {}", published.name, published.policy_hash),
        None => "no retry policy".to_owned(),
    };
    let location = format!(
        "ConfigMap {name} key {CONTROL_DOCUMENT_CONFIGMAP_KEY}, revision {}",
        document.revision
    );
    match policy {
        PolicySource::Unusable { reason, message } => ConditionSpec::new(
            CONTROL_DOCUMENT_PUBLISHED,
            Truth::False,
            *reason,
            format!("{message}; {location} keeps {published_policy}"),
        ),
        PolicySource::Unset | PolicySource::Resolved(_) => ConditionSpec::new(
            CONTROL_DOCUMENT_PUBLISHED,
            Truth::True,
            "Published",
            format!("{location}: {published_policy}, {classes} event classes"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::retry_policy::RetryPolicySpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    fn reference() -> BudgetReference {
        BudgetReference {
            namespace: "shop".into(),
            name: "orders".into(),
        }
    }

    fn policy(max_attempts: i32) -> PolicySource {
        let spec: RetryPolicySpec = serde_json::from_value(serde_json::json!({
            "maxAttempts": max_attempts,
            "backoff": {"base": "100ms", "cap": "10s"}
        }))
        .unwrap();
        PolicySource::Resolved(PublishedRetryPolicy::new(
            "standard",
            &EffectivePolicy::from_spec(&(&spec).into()).unwrap(),
        ))
    }

    fn class(name: &str, state: ClassState) -> EventClassStatus {
        EventClassStatus {
            name: name.into(),
            state,
            since: MicroTime(at(100)),
            failure_ratio: Some(0.9),
            transition_ratio: Some(0.9),
            condition_since: None,
            open_duration: Some("3s".into()),
            probe_ratio: (state == ClassState::Probing).then_some(0.25),
            message: "why".into(),
        }
    }

    fn schema_validator() -> jsonschema::Validator {
        let schema: serde_json::Value = serde_json::from_str(include_str!(
            "../../../crates/backlog-consumer/src/control-document.schema.json"
        ))
        .unwrap();
        jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .should_validate_formats(true)
            .build(&schema)
            .unwrap()
    }

    #[test]
    fn the_first_document_is_revision_one_and_validates_against_the_schema() {
        let built = build(
            reference(),
            &policy(5),
            &[
                class("refund", ClassState::Paused),
                class("order", ClassState::Probing),
                class("invoice", ClassState::Active),
            ],
            None,
            None,
            at(200),
        );
        assert!(built.write);
        let document = built.document;
        assert_eq!(document.revision, 1);
        assert_eq!(document.generated_at, "1970-01-01T00:03:20Z");
        assert_eq!(document.event_classes[0].probe_ratio, None);
        assert_eq!(document.event_classes[1].probe_ratio, Some(0.25));
        assert_eq!(document.event_classes[0].since, "1970-01-01T00:01:40Z");
        let json: serde_json::Value = serde_json::from_str(&document.to_json().unwrap()).unwrap();
        let validator = schema_validator();
        let errors: Vec<String> = validator
            .iter_errors(&json)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{errors:?}\n{json:#}");
        assert!(!document.should_process("refund", "evt-1"));
    }

    #[test]
    fn an_unchanged_state_is_not_rewritten_and_a_change_raises_the_revision() {
        let classes = [class("refund", ClassState::Paused)];
        let first = build(reference(), &policy(5), &classes, None, None, at(0)).document;
        let again = build(
            reference(),
            &policy(5),
            &classes,
            Some(&first),
            Some(1),
            at(50),
        );
        assert!(!again.write);
        assert_eq!(again.document, first, "generatedAt stays too");

        let probing = [class("refund", ClassState::Probing)];
        let next = build(
            reference(),
            &policy(5),
            &probing,
            Some(&first),
            Some(1),
            at(60),
        );
        assert!(next.write);
        assert_eq!(next.document.revision, 2);

        let other_policy = build(
            reference(),
            &policy(3),
            &probing,
            Some(&next.document),
            Some(2),
            at(70),
        );
        assert!(other_policy.write);
        assert_eq!(other_policy.document.revision, 3);
    }

    #[test]
    fn the_revision_survives_a_deleted_configmap() {
        let classes = [class("refund", ClassState::Paused)];
        let rebuilt = build(reference(), &policy(5), &classes, None, Some(41), at(0));
        assert!(rebuilt.write);
        assert_eq!(rebuilt.document.revision, 42);
    }

    #[test]
    fn an_unusable_policy_keeps_the_last_published_one() {
        let classes = [class("refund", ClassState::Active)];
        let first = build(reference(), &policy(5), &classes, None, None, at(0)).document;
        let missing = PolicySource::Unusable {
            reason: "RetryPolicyNotFound",
            message: "spec.retryPolicyRef.name \"standard\" names no RetryPolicy".into(),
        };
        let held = build(
            reference(),
            &missing,
            &classes,
            Some(&first),
            Some(1),
            at(10),
        );
        assert!(!held.write);
        assert_eq!(held.document.retry_policy, first.retry_policy);
        let condition = published_condition("orders-control", &held.document, &missing);
        assert_eq!(condition.status, Truth::False);
        assert_eq!(condition.reason, "RetryPolicyNotFound");
        assert!(
            condition.message.contains(
                "names no RetryPolicy; ConfigMap orders-control key control.json, revision 1 keeps retry policy standard sha256:"
            ),
            "{}",
            condition.message
        );
        // Removing the reference removes the policy.
        let unset = build(
            reference(),
            &PolicySource::Unset,
            &classes,
            Some(&first),
            Some(1),
            at(20),
        );
        assert!(unset.write);
        assert_eq!(unset.document.retry_policy, None);
    }

    #[test]
    fn the_configmap_is_owned_labelled_and_holds_the_key() {
        let owner = OwnerReference {
            api_version: "backlog.dev/v1alpha1".into(),
            kind: "BacklogBudget".into(),
            name: "orders".into(),
            uid: "u-1".into(),
            controller: Some(true),
            ..OwnerReference::default()
        };
        let cm = configmap("orders-control", "shop", owner, "orders", "{}".into());
        let copy = DocumentCopy::of(&cm);
        assert!(copy.owned_by("u-1"));
        assert!(!copy.owned_by("u-2"));
        assert_eq!(
            cm.metadata
                .labels
                .as_ref()
                .unwrap()
                .get(BUDGET_LABEL)
                .map(String::as_str),
            Some("orders")
        );
        assert!(
            cm.data
                .unwrap()
                .contains_key(CONTROL_DOCUMENT_CONFIGMAP_KEY)
        );
        let json = serde_json::to_value(configmap(
            "x",
            "y",
            OwnerReference::default(),
            &"b".repeat(64),
            "{}".into(),
        ))
        .unwrap();
        assert_eq!(json["kind"], "ConfigMap");
        assert!(json["metadata"]["labels"].get(BUDGET_LABEL).is_none());
    }

    #[test]
    fn a_hand_edited_document_is_rewritten_whole() {
        let cm = ConfigMap {
            data: Some(BTreeMap::from([(
                CONTROL_DOCUMENT_CONFIGMAP_KEY.to_owned(),
                "{\"apiVersion\": \"backlog.dev/control/v1\", \"revision\": 0}".to_owned(),
            )])),
            ..ConfigMap::default()
        };
        assert_eq!(document_of(&cm), None);
    }
}
