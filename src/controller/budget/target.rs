//! The workload a budget scales: any kind with a `/scale` subresource, found by discovery.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use kube::api::{DynamicObject, Patch};
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::Scope;
use kube::{Api, Client};
use tokio::time::Instant;

use super::replica_counts::ReplicaCounts;
use crate::api::backlog_budget::ScaleTargetRef;
use crate::controller::apply::apply_params;
use crate::controller::error::{ApiCall, Error, Persistence, Verb, persistence_of};

/// The target's replica counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workload {
    /// spec.replicas.
    pub replicas: u32,
    /// status.readyReplicas, when the workload reports it.
    pub ready: Option<u32>,
}

/// Watch caches of the kinds most budgets scale, so a poll reads their replicas without a
/// GET. Other kinds, and a target the cache does not hold (yet), are read from the API server.
#[derive(Clone)]
pub struct WorkloadCaches {
    pub deployments: ReplicaCounts,
    pub statefulsets: ReplicaCounts,
    /// Until when a reconcile waits for a cache that has not listed, from the first wait.
    give_up_at: Arc<OnceLock<Instant>>,
}

/// How long reconciles wait, after the first one did, for the workload caches to list.
/// A start with thousands of budgets would otherwise read each target with a GET while its
/// kind is being listed, before the budgets' first statuses; a cache that never lists (the
/// operator may not list the kind) costs this once, then every poll GETs as before.
const LIST_PATIENCE: Duration = Duration::from_secs(30);

impl WorkloadCaches {
    pub fn new(deployments: ReplicaCounts, statefulsets: ReplicaCounts) -> Self {
        Self {
            deployments,
            statefulsets,
            give_up_at: Arc::default(),
        }
    }

    /// Returns once the cache of the target's kind has listed, or at the latest
    /// [`LIST_PATIENCE`] after the first reconcile waited; at once for other kinds.
    pub async fn wait_listed(&self, target: &ScaleTargetRef) {
        if target.api_version != "apps/v1" {
            return;
        }
        let give_up_at = *self
            .give_up_at
            .get_or_init(|| Instant::now() + LIST_PATIENCE);
        let listed = async {
            match target.kind.as_str() {
                "Deployment" => self.deployments.wait_listed().await,
                "StatefulSet" => self.statefulsets.wait_listed().await,
                _ => true,
            }
        };
        let _ = tokio::time::timeout_at(give_up_at, listed).await;
    }

    /// The target's replicas as the watch cache has them, if it holds the target.
    pub fn workload(&self, namespace: &str, target: &ScaleTargetRef) -> Option<Workload> {
        if target.api_version != "apps/v1" {
            return None;
        }
        match target.kind.as_str() {
            "Deployment" => self.deployments.get(namespace, &target.name),
            "StatefulSet" => self.statefulsets.get(namespace, &target.name),
            _ => None,
        }
    }
}

/// Replica counts as [`read`] reads them from any kind: an omitted spec.replicas is the API
/// default of one, and only a workload whose controller has reported on it has a ready count
/// (an omitted readyReplicas then means 0).
pub(super) fn workload_of(
    replicas: Option<i32>,
    observed_generation: Option<i64>,
    ready: Option<i32>,
) -> Workload {
    let count = |value: i32| u32::try_from(value).unwrap_or(0);
    Workload {
        replicas: replicas.map_or(1, count),
        ready: observed_generation.map(|_| ready.map_or(0, count)),
    }
}

/// Why the target cannot be used; each names the field and the fix. A failure that may pass
/// by itself (a timeout, an overloaded API server) is an [`Error`] instead, retried with
/// backoff without touching the status.
#[derive(Debug, thiserror::Error)]
pub enum TargetProblem {
    #[error("spec.scaleTargetRef.apiVersion {0:?} is not group/version or version")]
    BadApiVersion(String),
    #[error(
        "spec.scaleTargetRef: the API server does not serve kind {kind} in {api_version}; check apiVersion and kind"
    )]
    UnknownKind { api_version: String, kind: String },
    #[error(
        "spec.scaleTargetRef: {kind} {name} does not exist in this namespace; create it or fix the name"
    )]
    NotFound { kind: String, name: String },
    #[error(
        "spec.scaleTargetRef: kind {kind} in {api_version} has no /scale subresource, so it cannot be scaled; point the budget at a Deployment, StatefulSet or another kind with /scale"
    )]
    NotScalable { api_version: String, kind: String },
    #[error(
        "spec.scaleTargetRef: kind {kind} in {api_version} is cluster-scoped; a budget scales a workload in its own namespace"
    )]
    ClusterScoped { api_version: String, kind: String },
    /// The API server refuses to show the target for good (a missing RBAC rule, most likely).
    #[error(
        "spec.scaleTargetRef: the API server refuses to show {kind} {name} to the operator ({source}); grant it get on this kind (the chart's rbac.extraScaleTargets) or point the budget at another workload"
    )]
    Refused {
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Kinds resolved by discovery, so a poll does not rediscover them.
#[derive(Default)]
pub struct Kinds {
    resolved: Mutex<HashMap<GroupVersionKind, ApiResource>>,
}

fn group_version_kind(target: &ScaleTargetRef) -> Result<GroupVersionKind, TargetProblem> {
    let (group, version) = match target.api_version.split_once('/') {
        Some((group, version)) if !group.is_empty() && !version.is_empty() => (group, version),
        None if !target.api_version.is_empty() => ("", target.api_version.as_str()),
        _ => return Err(TargetProblem::BadApiVersion(target.api_version.clone())),
    };
    Ok(GroupVersionKind::gvk(group, version, &target.kind))
}

/// A target that cannot be used (`Ok(Err)`), or a failure worth retrying (`Err`).
pub type Lookup<T> = Result<Result<T, TargetProblem>, Error>;

impl Kinds {
    async fn resource(&self, client: &Client, target: &ScaleTargetRef) -> Lookup<ApiResource> {
        let gvk = match group_version_kind(target) {
            Ok(gvk) => gvk,
            Err(problem) => return Ok(Err(problem)),
        };
        let known = self
            .resolved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&gvk)
            .cloned();
        if let Some(resource) = known {
            return Ok(Ok(resource));
        }
        let resource = match kube::discovery::pinned_kind(client, &gvk).await {
            // Served but unusable: said as such, not as an object to create.
            Ok((_, capabilities)) if capabilities.scope != Scope::Namespaced => {
                return Ok(Err(TargetProblem::ClusterScoped {
                    api_version: target.api_version.clone(),
                    kind: target.kind.clone(),
                }));
            }
            Ok((_, capabilities))
                if !capabilities
                    .subresources
                    .iter()
                    .any(|(subresource, _)| subresource.plural == "scale") =>
            {
                return Ok(Err(TargetProblem::NotScalable {
                    api_version: target.api_version.clone(),
                    kind: target.kind.clone(),
                }));
            }
            Ok((resource, _)) => resource,
            // The group, version or kind is not served (404, or missing from the list): the
            // spec names something this cluster does not have.
            Err(error) if unserved(&error) => {
                return Ok(Err(TargetProblem::UnknownKind {
                    api_version: target.api_version.clone(),
                    kind: target.kind.clone(),
                }));
            }
            Err(source) => {
                return Err(Error::api(
                    ApiCall {
                        verb: Verb::Discover,
                        kind: target.kind.clone().into(),
                        subresource: None,
                        namespace: None,
                        name: Some(target.api_version.clone()),
                    },
                    source,
                ));
            }
        };
        self.resolved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(gvk, resource.clone());
        Ok(Ok(resource))
    }

    /// The target's API in `namespace`.
    pub async fn api(
        &self,
        client: &Client,
        namespace: &str,
        target: &ScaleTargetRef,
    ) -> Lookup<Api<DynamicObject>> {
        Ok(self
            .resource(client, target)
            .await?
            .map(|resource| Api::namespaced_with(client.clone(), namespace, &resource)))
    }
}

/// Whether discovery failed because the cluster does not serve the kind at all.
fn unserved(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 404,
        kube::Error::Discovery(_) => persistence_of(error) == Persistence::Permanent,
        _ => false,
    }
}

fn count(value: Option<&serde_json::Value>) -> Option<u32> {
    value
        .and_then(serde_json::Value::as_u64)
        .and_then(|v| u32::try_from(v).ok())
}

/// Reads the target's replicas.
pub async fn read(
    api: &Api<DynamicObject>,
    namespace: &str,
    target: &ScaleTargetRef,
) -> Lookup<Workload> {
    let object = match api.get_opt(&target.name).await {
        Ok(Some(object)) => object,
        Ok(None) => {
            return Ok(Err(TargetProblem::NotFound {
                kind: target.kind.clone(),
                name: target.name.clone(),
            }));
        }
        Err(source) if persistence_of(&source) == Persistence::Permanent => {
            return Ok(Err(TargetProblem::Refused {
                kind: target.kind.clone(),
                name: target.name.clone(),
                source,
            }));
        }
        Err(source) => {
            return Err(Error::api(
                ApiCall::new(Verb::Get, target.kind.clone(), namespace, &target.name),
                source,
            ));
        }
    };
    let spec = object.data.get("spec");
    let status = object.data.get("status");
    // Only a workload whose controller has reported on it has a meaningful ready count (an
    // omitted readyReplicas then means 0).
    let reported = status.is_some_and(|s| s.get("observedGeneration").is_some());
    Ok(Ok(Workload {
        // A workload without spec.replicas runs one (the API default).
        replicas: count(spec.and_then(|s| s.get("replicas"))).unwrap_or(1),
        ready: reported.then(|| count(status.and_then(|s| s.get("readyReplicas"))).unwrap_or(0)),
    }))
}

/// Sets the target's replicas through its `/scale` subresource.
pub async fn scale(api: &Api<DynamicObject>, name: &str, replicas: u32) -> Result<(), kube::Error> {
    let body = serde_json::json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "spec": {"replicas": replicas},
    });
    api.patch_scale(name, &apply_params(), &Patch::Apply(body))
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(api_version: &str) -> ScaleTargetRef {
        ScaleTargetRef {
            api_version: api_version.into(),
            kind: "Deployment".into(),
            name: "c".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn reconciles_wait_for_the_workload_list_but_not_for_ever() {
        use super::super::replica_counts::{DeploymentReplicas, replica_counts};
        use kube::runtime::watcher;
        let (deployments, writer) = replica_counts();
        let (statefulsets, _statefulsets) = replica_counts();
        let caches = WorkloadCaches::new(deployments, statefulsets);
        let started = Instant::now();
        // Other kinds are never cached: nothing to wait for.
        caches.wait_listed(&target("batch/v1")).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        // A list that never comes is waited for once, from the first wait.
        caches.wait_listed(&target("apps/v1")).await;
        assert_eq!(started.elapsed(), LIST_PATIENCE);
        caches.wait_listed(&target("apps/v1")).await;
        assert_eq!(started.elapsed(), LIST_PATIENCE);
        // A listed cache is not waited for at all.
        let deployments = caches.deployments.clone();
        writer.apply(&watcher::Event::<DeploymentReplicas>::InitDone);
        let listed = WorkloadCaches::new(deployments, caches.statefulsets.clone());
        let before = Instant::now();
        listed.wait_listed(&target("apps/v1")).await;
        assert_eq!(before.elapsed(), Duration::ZERO);
    }

    #[test]
    fn api_versions_split_into_group_and_version() {
        assert_eq!(
            group_version_kind(&target("apps/v1")).unwrap(),
            GroupVersionKind::gvk("apps", "v1", "Deployment")
        );
        assert_eq!(
            group_version_kind(&target("v1")).unwrap(),
            GroupVersionKind::gvk("", "v1", "Deployment")
        );
        assert!(group_version_kind(&target("/v1")).is_err());
        assert!(group_version_kind(&target("")).is_err());
    }
}
