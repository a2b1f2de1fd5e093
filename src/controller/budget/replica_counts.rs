//! Deployments and StatefulSets as the workload caches hold them: only the replica counts a
//! budget reads. Watched and listed through these types, so a workload's pod template, volume
//! claims and conditions are never kept, not even parsed into a `Deployment`: at thousands of
//! budgets a full `Deployment` in a cache cost several kilobytes per budget.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::Deserialize;

/// A Deployment's replica counts.
#[derive(Resource, Clone, Debug, Default, Deserialize)]
#[resource(inherit = "Deployment")]
pub struct DeploymentReplicas {
    pub metadata: ObjectMeta,
    pub spec: Option<ReplicasSpec>,
    pub status: Option<ReplicasStatus>,
}

/// A StatefulSet's replica counts.
#[derive(Resource, Clone, Debug, Default, Deserialize)]
#[resource(inherit = "StatefulSet")]
pub struct StatefulSetReplicas {
    pub metadata: ObjectMeta,
    pub spec: Option<ReplicasSpec>,
    pub status: Option<ReplicasStatus>,
}

/// spec.replicas (omitted: the API default of one).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct ReplicasSpec {
    pub replicas: Option<i32>,
}

/// What the workload's controller last reported.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReplicasStatus {
    pub observed_generation: Option<i64>,
    pub ready_replicas: Option<i32>,
}

/// Keeps of the metadata only what the cache and the watch need.
pub fn slim<K: Resource>(workload: &mut K) {
    crate::controller::slim::identity_only(workload.meta_mut());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_becomes_its_replica_counts() {
        let full = serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {
                "name": "orders", "namespace": "shop", "generation": 7, "resourceVersion": "42",
                "labels": {"app": "orders"},
                "annotations": {"deployment.kubernetes.io/revision": "3"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
            },
            "spec": {
                "replicas": 5,
                "selector": {"matchLabels": {"app": "orders"}},
                "template": {"metadata": {"labels": {"app": "orders"}},
                             "spec": {"containers": [{"name": "c", "image": "orders:1"}]}},
            },
            "status": {"observedGeneration": 7, "readyReplicas": 4, "replicas": 5,
                       "conditions": [{"type": "Available", "status": "True"}]},
        });
        let mut counts: DeploymentReplicas =
            serde_json::from_value(full).expect("a Deployment reads as its replica counts");
        slim(&mut counts);
        assert_eq!(counts.spec, Some(ReplicasSpec { replicas: Some(5) }));
        assert_eq!(
            counts.status,
            Some(ReplicasStatus {
                observed_generation: Some(7),
                ready_replicas: Some(4),
            })
        );
        assert_eq!(
            counts.metadata,
            ObjectMeta {
                name: Some("orders".into()),
                namespace: Some("shop".into()),
                resource_version: Some("42".into()),
                ..ObjectMeta::default()
            }
        );
        // Listed and watched as what it is.
        assert_eq!(DeploymentReplicas::kind(&()), "Deployment");
        assert_eq!(DeploymentReplicas::api_version(&()), "apps/v1");
        assert_eq!(StatefulSetReplicas::plural(&()), "statefulsets");
        assert!(std::mem::size_of::<DeploymentReplicas>() < std::mem::size_of::<Deployment>() / 4);
    }

    #[test]
    fn a_workload_without_spec_or_status_still_reads() {
        let counts: StatefulSetReplicas =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "s"}}))
                .expect("a bare StatefulSet");
        assert_eq!((counts.spec, counts.status), (None, None));
    }
}
