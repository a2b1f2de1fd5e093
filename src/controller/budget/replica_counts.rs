//! Deployments and StatefulSets as the workload caches hold them: only the replica counts a
//! budget reads. Watched and listed through these types, so a workload's pod template, volume
//! claims and conditions are never parsed into a `Deployment`, and cached as their counts
//! alone ([`ReplicaCounts`]) by `namespace/name`: at thousands of budgets a full `Deployment`
//! in a cache cost several kilobytes per budget, and even the slim objects' `ObjectMeta` and
//! reflector keys half a kilobyte.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::watcher;
use serde::Deserialize;

use super::target::{Workload, workload_of};
use crate::controller::listed::{Listed, MarkListed, listed};

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

/// Keeps of the metadata only what the watch needs.
pub fn slim<K: Resource>(workload: &mut K) {
    crate::controller::slim::identity_only(workload.meta_mut());
}

/// A workload kind read as its replica counts.
pub trait Counted: Resource {
    fn workload(&self) -> Workload;
}

fn counted(spec: Option<&ReplicasSpec>, status: Option<&ReplicasStatus>) -> Workload {
    workload_of(
        spec.and_then(|spec| spec.replicas),
        status.and_then(|s| s.observed_generation),
        status.and_then(|s| s.ready_replicas),
    )
}

impl Counted for DeploymentReplicas {
    fn workload(&self) -> Workload {
        counted(self.spec.as_ref(), self.status.as_ref())
    }
}

impl Counted for StatefulSetReplicas {
    fn workload(&self) -> Workload {
        counted(self.spec.as_ref(), self.status.as_ref())
    }
}

/// The replica counts of every workload of one kind in scope, kept current from its watch.
#[derive(Clone)]
pub struct ReplicaCounts {
    counts: Arc<RwLock<Counts>>,
    listed: Listed,
}

#[derive(Default)]
struct Counts {
    by_name: HashMap<Box<str>, Workload>,
    /// During a relist: what it has shown so far; it replaces `by_name` when done, so
    /// workloads deleted while the watch was down leave.
    relisting: Option<HashMap<Box<str>, Workload>>,
}

/// Follows the watch into [`ReplicaCounts`].
pub struct CountsWriter {
    counts: Arc<RwLock<Counts>>,
    mark_listed: MarkListed,
}

fn key(namespace: &str, name: &str) -> Box<str> {
    format!("{namespace}/{name}").into_boxed_str()
}

fn key_of(workload: &impl Resource) -> Box<str> {
    let meta = workload.meta();
    key(
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

/// An empty cache and the writer that fills it.
pub fn replica_counts() -> (ReplicaCounts, CountsWriter) {
    let counts = Arc::new(RwLock::new(Counts::default()));
    let (mark_listed, listed) = listed();
    (
        ReplicaCounts {
            counts: Arc::clone(&counts),
            listed,
        },
        CountsWriter {
            counts,
            mark_listed,
        },
    )
}

impl CountsWriter {
    /// Follows one watch event.
    pub fn apply<K: Counted>(&self, event: &watcher::Event<K>) {
        let mut counts = self.counts.write().unwrap_or_else(PoisonError::into_inner);
        match event {
            watcher::Event::Apply(workload) => {
                counts.by_name.insert(key_of(workload), workload.workload());
            }
            watcher::Event::Delete(workload) => {
                counts.by_name.remove(&key_of(workload));
            }
            watcher::Event::Init => counts.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(workload) => {
                let relisting = counts.relisting.get_or_insert_with(HashMap::new);
                relisting.insert(key_of(workload), workload.workload());
            }
            watcher::Event::InitDone => {
                let mut listed = counts.relisting.take().unwrap_or_default();
                listed.shrink_to_fit();
                counts.by_name = listed;
                self.mark_listed.mark();
            }
        }
    }
}

impl ReplicaCounts {
    /// The counts of workload `namespace/name`, if the watch has shown it.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Workload> {
        self.counts
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .by_name
            .get(&*key(namespace, name))
            .copied()
    }

    /// Returns once the watch has listed (an error: it stopped before).
    pub async fn wait_listed(&self) -> bool {
        self.listed.wait().await.is_ok()
    }
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

    fn deployment(name: &str, replicas: i32, ready: Option<i32>) -> DeploymentReplicas {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"replicas": replicas},
            "status": {"observedGeneration": 1, "readyReplicas": ready},
        }))
        .expect("a Deployment")
    }

    #[tokio::test]
    async fn the_counts_follow_the_watch_and_a_relist_forgets_the_deleted() {
        let (counts, writer) = replica_counts();
        writer.apply(&watcher::Event::<DeploymentReplicas>::Init);
        writer.apply(&watcher::Event::InitApply(deployment("orders", 3, Some(2))));
        writer.apply(&watcher::Event::InitApply(deployment("gone", 1, None)));
        // Not listed yet: nothing is answered from a partial listing.
        assert_eq!(counts.get("shop", "orders"), None);
        writer.apply(&watcher::Event::<DeploymentReplicas>::InitDone);
        assert!(counts.wait_listed().await);
        let orders = Workload {
            replicas: 3,
            ready: Some(2),
        };
        assert_eq!(counts.get("shop", "orders"), Some(orders));
        assert_eq!(counts.get("other", "orders"), None);
        writer.apply(&watcher::Event::Apply(deployment("orders", 5, Some(5))));
        assert_eq!(counts.get("shop", "orders").map(|w| w.replicas), Some(5));
        writer.apply(&watcher::Event::Delete(deployment("orders", 5, Some(5))));
        assert_eq!(counts.get("shop", "orders"), None);
        // A relist: until it is done the counts answer as before; then only what it showed.
        writer.apply(&watcher::Event::Apply(deployment("orders", 4, Some(4))));
        writer.apply(&watcher::Event::<DeploymentReplicas>::Init);
        writer.apply(&watcher::Event::InitApply(deployment("orders", 4, Some(4))));
        assert!(counts.get("shop", "gone").is_some());
        writer.apply(&watcher::Event::<DeploymentReplicas>::InitDone);
        assert_eq!(counts.get("shop", "gone"), None);
        assert_eq!(counts.get("shop", "orders").map(|w| w.replicas), Some(4));
    }

    #[test]
    fn a_workload_without_spec_or_status_still_reads() {
        let counts: StatefulSetReplicas =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "s"}}))
                .expect("a bare StatefulSet");
        assert_eq!((counts.spec, counts.status), (None, None));
    }
}
