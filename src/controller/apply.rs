//! Server-side apply under the operator's one field manager.

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::synced::SYNCED;

/// The field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "backlog-operator";

/// Apply parameters: the operator owns the fields it writes and takes them over if another
/// manager set them (e.g. `kubectl scale` on a workload the budget governs).
pub fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Applies `status` to the status subresource of `name`.
pub async fn apply_status<K, S>(api: &Api<K>, name: &str, status: &S) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    S: Serialize,
{
    apply_status_at(api, name, status, None).await
}

/// Applies `status` to the status subresource of `name`; with `resource_version`, only onto
/// that version of the object (a 409 otherwise: the decision was made on a stale view).
pub async fn apply_status_at<K, S>(
    api: &Api<K>,
    name: &str,
    status: &S,
    resource_version: Option<&str>,
) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    S: Serialize,
{
    let mut status = serde_json::to_value(status).map_err(kube::Error::SerdeError)?;
    // The Synced condition has a field manager of its own: leaving it out of this apply keeps
    // it as that manager last wrote it.
    if let Some(conditions) = status
        .get_mut("conditions")
        .and_then(serde_json::Value::as_array_mut)
    {
        conditions.retain(|c| c.get("type").and_then(serde_json::Value::as_str) != Some(SYNCED));
    }
    let mut body = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    if let Some(version) = resource_version {
        body["metadata"] = serde_json::json!({ "resourceVersion": version });
    }
    api.patch_status(name, &apply_params(), &Patch::Apply(body))
        .await
}
