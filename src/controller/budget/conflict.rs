//! Who else scales the target: a HorizontalPodAutoscaler (KEDA's ScaledObjects create one) or
//! another BacklogBudget. The oldest budget keeps the target; everyone else hands off.

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Resource, ResourceExt};

use super::cached::CachedBudget;
use crate::api::backlog_budget::{BacklogBudget, ScaleTargetRef};

fn group_of(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(group, _)| group)
}

fn same_target(a: &ScaleTargetRef, kind: &str, name: &str, api_version: Option<&str>) -> bool {
    a.kind == kind
        && a.name == name
        && api_version.is_none_or(|v| group_of(v) == group_of(&a.api_version))
}

/// The autoscaler, other than `budget`, that owns the same target; named for the status.
/// `budgets` may be every budget or only those on the same target (see [`super::targets`]).
pub fn other_owner(
    budget: &BacklogBudget,
    autoscalers: &[std::sync::Arc<HorizontalPodAutoscaler>],
    budgets: &[std::sync::Arc<CachedBudget>],
) -> Option<String> {
    let target = &budget.spec.scale_target_ref;
    let namespace = &budget.metadata.namespace;
    if let Some(hpa) = autoscalers.iter().find(|hpa| {
        hpa.metadata.namespace == *namespace
            && hpa.spec.as_ref().is_some_and(|spec| {
                let r = &spec.scale_target_ref;
                same_target(target, &r.kind, &r.name, r.api_version.as_deref())
            })
    }) {
        return Some(format!("HorizontalPodAutoscaler {}", hpa.name_any()));
    }
    budgets
        .iter()
        .filter(|other| {
            other.target_name() == target.name
                && other.metadata.namespace == *namespace
                && other.metadata.uid != budget.metadata.uid
                && same_target(
                    target,
                    other.target_kind(),
                    other.target_name(),
                    Some(other.target_api_version()),
                )
        })
        .filter(|other| age(other.as_ref()) < age(budget))
        .min_by_key(|other| age(other.as_ref()))
        .map(|other| format!("BacklogBudget {}", other.name_any()))
}

/// Older budgets own a target first; the name breaks a tie.
fn age(budget: &impl Resource) -> (Option<Time>, String) {
    (budget.creation_timestamp(), budget.name_any())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::autoscaling::v2::{
        CrossVersionObjectReference, HorizontalPodAutoscalerSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use kube::api::ObjectMeta;

    use super::*;

    fn budget(name: &str, created: i64, target: &str) -> BacklogBudget {
        let mut spec: crate::api::BacklogBudgetSpec = serde_yaml::from_str(&format!(
            "{{scaleTargetRef: {{kind: Deployment, name: {target}}}, minReplicas: 1, maxReplicas: 2, completionDeadline: 1m, metrics: {{backlog: x}}, partitionCount: 2, capacity: {{perReplicaRate: 1}}}}"
        ))
        .unwrap();
        spec.scale_target_ref.api_version = "apps/v1".into();
        let mut b = BacklogBudget::new(name, spec);
        b.metadata.namespace = Some("ns".into());
        b.metadata.uid = Some(name.into());
        b.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
        b
    }

    fn hpa(target: &str) -> HorizontalPodAutoscaler {
        HorizontalPodAutoscaler {
            metadata: ObjectMeta {
                name: Some("keda-hpa-orders".into()),
                namespace: Some("ns".into()),
                ..ObjectMeta::default()
            },
            spec: Some(HorizontalPodAutoscalerSpec {
                max_replicas: 10,
                scale_target_ref: CrossVersionObjectReference {
                    api_version: Some("apps/v1".into()),
                    kind: "Deployment".into(),
                    name: target.into(),
                },
                ..HorizontalPodAutoscalerSpec::default()
            }),
            status: None,
        }
    }

    #[test]
    fn an_hpa_on_the_same_target_is_a_conflict() {
        let b = budget("a", 0, "orders");
        assert_eq!(
            other_owner(&b, &[Arc::new(hpa("orders"))], &[]),
            Some("HorizontalPodAutoscaler keda-hpa-orders".into())
        );
        assert_eq!(other_owner(&b, &[Arc::new(hpa("payments"))], &[]), None);
    }

    #[test]
    fn the_oldest_budget_keeps_the_target() {
        let old = budget("old", 0, "orders");
        let new = budget("new", 10, "orders");
        let all = vec![
            Arc::new(CachedBudget::from(old.clone())),
            Arc::new(CachedBudget::from(new.clone())),
        ];
        assert_eq!(other_owner(&old, &[], &all), None);
        assert_eq!(
            other_owner(&new, &[], &all),
            Some("BacklogBudget old".into())
        );
    }
}
