//! What the watch caches keep of each object: only what a decision reads. A cache holds every
//! object of its kind in scope, so at thousands of budgets the bookkeeping the API server
//! attaches (managedFields, the last-applied annotation) would be most of the operator's memory.
//! Applied to each watch event before its cache sees it. (Workloads are cached as their replica
//! counts alone: [`super::budget::replica_counts`], control documents as their owners and
//! text: [`super::budget::document_copy`].)

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

use crate::api::backlog_budget::BacklogBudgetStatus;

use super::budget::cached::CachedBudget;

use super::synced::SYNCED;

/// The annotation `kubectl apply` writes: a copy of the whole object.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops the API server's and kubectl's bookkeeping, which no decision reads.
pub fn bookkeeping<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// Keeps of the metadata only what a cache and its watch need: the name, namespace and
/// resourceVersion (from which the watch resumes).
pub fn identity_only(meta: &mut ObjectMeta) {
    *meta = ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        resource_version: meta.resource_version.take(),
        ..ObjectMeta::default()
    };
}

/// A budget as the controllers read it: its whole status only until the decision remembers
/// it. The decision reads the cached status once, to continue from what was last written;
/// after that the status is its own memory, and a copy here would be a second one per budget.
/// The `Synced` condition stays: every reconcile reads it to tell whether a failure it
/// reported has cleared ([`super::synced`]).
pub fn budget(budget: &mut CachedBudget, remembered: impl Fn(&str, &str, Option<&str>) -> bool) {
    bookkeeping(budget);
    // The watch resumes from the versions it read off the events before this; nothing reads
    // a cached budget's, and the cache's key would hold a second copy of it.
    budget.metadata.resource_version = None;
    let meta = &budget.metadata;
    let known = match (meta.namespace.as_deref(), meta.name.as_deref()) {
        (Some(namespace), Some(name)) => remembered(namespace, name, meta.uid.as_deref()),
        _ => false,
    };
    if !known {
        return;
    }
    let synced: Vec<_> = budget
        .status
        .take()
        .map(|status| status.conditions)
        .unwrap_or_default()
        .into_iter()
        .filter(|condition| condition.type_ == SYNCED)
        .collect();
    budget.status = (!synced.is_empty()).then(|| {
        Box::new(BacklogBudgetStatus {
            conditions: synced,
            ..Default::default()
        })
    });
}

/// An HPA as conflict detection reads it: what it scales.
pub fn autoscaler(autoscaler: &mut HorizontalPodAutoscaler) {
    bookkeeping(autoscaler);
    if let Some(spec) = autoscaler.spec.as_mut() {
        spec.metrics = None;
        spec.behavior = None;
    }
    autoscaler.status = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_keeps_its_status_until_the_decision_remembers_it() {
        let mut full: crate::api::BacklogBudget =
            serde_yaml::from_str(include_str!("../../examples/backlog-budget.yaml"))
                .expect("the example BacklogBudget");
        full.metadata.namespace = Some("shop".to_owned());
        full.metadata.name = Some("orders".to_owned());
        full.metadata.uid = Some("u-2".to_owned());
        full.metadata.resource_version = Some("4711".to_owned());
        full.status = Some(
            serde_json::from_value(serde_json::json!({"phase": "Healthy", "conditions": [
                {"type": "Ready", "status": "True", "reason": "Healthy", "message": "",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Synced", "status": "False", "reason": "ApiServerError",
                 "message": "scale refused", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ]}))
            .expect("a status"),
        );
        let remembers = |uid: &'static str| {
            move |namespace: &str, name: &str, seen: Option<&str>| {
                (namespace, name, seen) == ("shop", "orders", Some(uid))
            }
        };
        let full = CachedBudget::from(full);
        let mut first_look = full.clone();
        budget(&mut first_look, remembers("u-1"));
        assert_eq!(
            first_look.status, full.status,
            "a predecessor's memory is not this one's"
        );
        assert_eq!(first_look.metadata.resource_version, None);
        let mut later = full.clone();
        budget(&mut later, remembers("u-2"));
        // Only a reported failure stays, for the check that clears it.
        let kept = later.status.as_ref().expect("the Synced condition");
        assert_eq!(kept.phase, None);
        let types: Vec<&str> = kept.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Synced"]);
        assert_eq!(
            later.budget().expect("unpacks").spec,
            full.budget().expect("unpacks").spec
        );
        let mut nothing_reported = full.clone();
        if let Some(status) = nothing_reported.status.as_mut() {
            status.conditions.retain(|c| c.type_ != "Synced");
        }
        budget(&mut nothing_reported, remembers("u-2"));
        assert!(nothing_reported.status.is_none());
    }

    #[test]
    fn a_slim_autoscaler_still_names_its_target() {
        let mut hpa: HorizontalPodAutoscaler = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "orders"},
                     "maxReplicas": 10,
                     "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]},
            "status": {"currentReplicas": 3, "desiredReplicas": 3},
        }))
        .expect("an HPA");
        autoscaler(&mut hpa);
        let target = &hpa.spec.as_ref().expect("spec").scale_target_ref;
        assert_eq!(
            (target.kind.as_str(), target.name.as_str()),
            ("Deployment", "orders")
        );
        assert!(hpa.status.is_none());
    }
}
