//! The workload a budget scales: any kind with a `/scale` subresource, found by discovery.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::api::{DynamicObject, Patch};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client};

use crate::api::backlog_budget::ScaleTargetRef;
use crate::controller::apply::apply_params;

/// The target's replica counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workload {
    /// spec.replicas.
    pub replicas: u32,
    /// status.readyReplicas, when the workload reports it.
    pub ready: Option<u32>,
}

/// Why the target cannot be used; each names the field and the fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
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
    #[error("spec.scaleTargetRef: {0}")]
    Unreadable(String),
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

impl Kinds {
    async fn resource(
        &self,
        client: &Client,
        target: &ScaleTargetRef,
    ) -> Result<ApiResource, TargetProblem> {
        let gvk = group_version_kind(target)?;
        let known = self
            .resolved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&gvk)
            .cloned();
        if let Some(resource) = known {
            return Ok(resource);
        }
        let (resource, _) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .map_err(|_| TargetProblem::UnknownKind {
                api_version: target.api_version.clone(),
                kind: target.kind.clone(),
            })?;
        self.resolved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(gvk, resource.clone());
        Ok(resource)
    }

    /// The target's API in `namespace`.
    pub async fn api(
        &self,
        client: &Client,
        namespace: &str,
        target: &ScaleTargetRef,
    ) -> Result<Api<DynamicObject>, TargetProblem> {
        let resource = self.resource(client, target).await?;
        Ok(Api::namespaced_with(client.clone(), namespace, &resource))
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
    target: &ScaleTargetRef,
) -> Result<Workload, TargetProblem> {
    let object = api
        .get_opt(&target.name)
        .await
        .map_err(|e| TargetProblem::Unreadable(e.to_string()))?
        .ok_or_else(|| TargetProblem::NotFound {
            kind: target.kind.clone(),
            name: target.name.clone(),
        })?;
    let spec = object.data.get("spec");
    let status = object.data.get("status");
    // Only a workload whose controller has reported on it has a meaningful ready count (an
    // omitted readyReplicas then means 0).
    let reported = status.is_some_and(|s| s.get("observedGeneration").is_some());
    Ok(Workload {
        // A workload without spec.replicas runs one (the API default).
        replicas: count(spec.and_then(|s| s.get("replicas"))).unwrap_or(1),
        ready: reported.then(|| count(status.and_then(|s| s.get("readyReplicas"))).unwrap_or(0)),
    })
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
