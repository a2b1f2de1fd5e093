//! The four-eyes set-up that replay and compensation tests share: the chart's admission
//! policies (its very files), the operator's ServiceAccount and what it may do, and RBAC for
//! alice and bob (group backlog-approvers) and carol (no group).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use backlog_operator::api::compensation::Compensation;
use backlog_operator::api::replay_job::ReplayJob;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::{TestEnv, wait_until};

const POLICY_DIR: &str = "charts/backlog-operator/policies";
/// The operator's ServiceAccount, as the policies' default parameters name it
/// (`system:serviceaccount:backlog-operator:backlog-operator`).
pub const POLICY_NAMESPACE: &str = "backlog-operator";
pub const OPERATOR_ACCOUNT: &str = "backlog-operator";
const STEP: Duration = Duration::from_secs(60);

/// The smallest replay the policies admit, as `requested_by`.
fn probe_replay(name: &str, requested_by: &str) -> Value {
    json!({
        "apiVersion": "backlog.dev/v1alpha1",
        "kind": "ReplayJob",
        "metadata": {"name": name},
        "spec": {
            "source": {"queue": "probe.dlq"},
            "scope": {"eventIds": ["a"]},
            "reason": "probe",
            "requestedBy": requested_by,
            "batches": {"size": 1, "canary": 1, "ratePerSecond": 1},
            "template": {"spec": {"containers": [{"name": "probe", "image": "probe"}]}},
        }
    })
}

/// The smallest compensation the policies admit, as `requested_by`.
pub fn probe_compensation(name: &str, requested_by: &str) -> Value {
    json!({
        "apiVersion": "backlog.dev/v1alpha1",
        "kind": "Compensation",
        "metadata": {"name": name},
        "spec": {
            "compensationId": name,
            "sourceEventId": "evt-1",
            "businessKey": "order-1",
            "reasonCode": "Other",
            "requestedBy": requested_by,
            "expectedCurrentStateAndVersion": {"resource": "orders/order-1", "state": "X", "version": "1"},
            "proposedAction": {"description": "probe", "subActions": ["probe"]},
            "affectedResources": ["orders/order-1"],
            "dryRunEvidence": "probe",
            "template": {"spec": {"containers": [{"name": "probe", "image": "probe"}]}},
        }
    })
}

pub async fn install(env: &TestEnv) -> Result<String, String> {
    let admin = env.admin();
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(POLICY_NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => return Err(format!("creating namespace {POLICY_NAMESPACE}: {e}")),
    }
    super::identity::ensure_service_account(env, POLICY_NAMESPACE, OPERATOR_ACCOUNT).await;
    let policies = Path::new(env!("CARGO_MANIFEST_DIR")).join(POLICY_DIR);
    kubectl(
        env,
        &[
            "apply",
            "--server-side",
            "--field-manager=replay-test",
            "-f",
            &policies.to_string_lossy(),
        ],
    )
    .await?;
    // The operator may do what its controllers do (tests/chart.rs proves the chart's own
    // rules); the status policy decides that only it writes status.
    let rbac = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: replay-test-operator}
rules:
  - apiGroups: [backlog.dev]
    resources: [replayjobs, compensations, backlogbudgets, retrypolicies]
    verbs: [get, list, watch]
  - apiGroups: [backlog.dev]
    resources: [replayjobs/status, compensations/status, backlogbudgets/status, retrypolicies/status]
    verbs: [get, patch]
  - apiGroups: [""]
    resources: [pods]
    verbs: [list]
  - apiGroups: [batch]
    resources: [jobs]
    verbs: [get, list, watch, create, patch]
  - apiGroups: [""]
    resources: [configmaps]
    verbs: [get, create, patch]
  - apiGroups: [apps]
    resources: [deployments, statefulsets]
    verbs: [get, list, watch]
  - apiGroups: [autoscaling]
    resources: [horizontalpodautoscalers]
    verbs: [list, watch]
  - apiGroups: [events.k8s.io]
    resources: [events]
    verbs: [create, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: replay-test-operator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: replay-test-operator}
subjects:
  - {kind: ServiceAccount, name: backlog-operator, namespace: backlog-operator}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: replay-test-users}
rules:
  - apiGroups: [backlog.dev]
    resources: [replayjobs, compensations]
    verbs: [get, list, watch, create, update, patch, delete]
  - apiGroups: [""]
    resources: [configmaps]
    verbs: [get, list, create, update, patch]
  - apiGroups: [batch]
    resources: [jobs]
    verbs: [get, list, watch]
  - apiGroups: [events.k8s.io]
    resources: [events]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: replay-test-users}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: replay-test-users}
subjects:
  - {apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}
  - {apiGroup: rbac.authorization.k8s.io, kind: User, name: bob}
  - {apiGroup: rbac.authorization.k8s.io, kind: User, name: carol}
"#;
    let rbac_file = env.cluster().state_dir().join("replay-test-rbac.yaml");
    std::fs::write(&rbac_file, rbac).map_err(|e| format!("writing {rbac_file:?}: {e}"))?;
    kubectl(
        env,
        &[
            "apply",
            "--server-side",
            "--field-manager=replay-test",
            "-f",
            &rbac_file.to_string_lossy(),
        ],
    )
    .await?;

    let token =
        super::identity::service_account_token(env, POLICY_NAMESPACE, OPERATOR_ACCOUNT).await;

    // The policy is enforced once a create on someone else's behalf is refused with its
    // message (a dry run: nothing is created).
    let probe = serde_json::from_value::<ReplayJob>(probe_replay("probe", "bob"))
        .map_err(|e| e.to_string())?;
    let replays = Api::<ReplayJob>::namespaced(env.client("alice"), "default");
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    wait_refused(
        "the four-eyes policy refuses a create on behalf of bob",
        "spec.requestedBy must be the user",
        || replays.create(&dry_run, &probe),
    )
    .await;

    // The compensation policy too, by the same kind of dry run.
    let compensation = serde_json::from_value::<Compensation>(probe_compensation("probe", "bob"))
        .map_err(|e| e.to_string())?;
    let compensations = Api::<Compensation>::namespaced(env.client("alice"), "default");
    wait_refused(
        "the compensation policy refuses a create on behalf of bob",
        "spec.requestedBy must be the user",
        || compensations.create(&dry_run, &compensation),
    )
    .await;

    // The status policy is a policy of its own, loaded on its own schedule: it is enforced once
    // an admin's status write to a replay is refused (a dry run on a probe alice owns).
    let probe = serde_json::from_value::<ReplayJob>(probe_replay("status-probe", "alice"))
        .map_err(|e| e.to_string())?;
    match replays.create(&PostParams::default(), &probe).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => return Err(format!("creating the status probe: {e}")),
    }
    let admin_replays = Api::<ReplayJob>::namespaced(admin.clone(), "default");
    let dry_patch = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let write = Patch::Merge(json!({"status": {"phase": "Succeeded"}}));
    wait_refused(
        "the status policy refuses an admin's status write",
        "is written only by the operator",
        || admin_replays.patch_status("status-probe", &dry_patch, &write),
    )
    .await;
    admin_replays
        .delete("status-probe", &Default::default())
        .await
        .map_err(|e| format!("deleting the status probe: {e}"))?;
    Ok(token)
}

/// Waits until `request` is refused with a message containing `fragment`: policies are loaded
/// on their own schedule, and are in effect once they refuse what they must.
async fn wait_refused<T, F, Fut>(what: &str, fragment: &str, request: F)
where
    T: std::fmt::Debug,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    wait_until(STEP, what, || async {
        match request().await {
            Err(kube::Error::Api(status)) if status.message.contains(fragment) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

pub async fn kubectl(env: &TestEnv, args: &[&str]) -> Result<String, String> {
    let kubectl = env
        .cluster()
        .kubectl_path()
        .ok_or("the control plane comes without kubectl")?
        .to_path_buf();
    let mut command = Command::new(kubectl);
    command
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .arg("--cache-dir")
        .arg(env.cluster().state_dir().join("kubectl-cache"))
        .args(args);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .map_err(|e| format!("kubectl task: {e}"))?
        .map_err(|e| format!("running kubectl: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// What an approver reads before approving a replay: the frozen list and the digest of the
/// rest of the spec, both as the operator wrote them for the stored generation.
#[derive(Clone, Debug)]
pub struct ReplayReview {
    pub scope_sha256: String,
    pub config_map: String,
    pub spec_sha256: String,
}

impl ReplayReview {
    /// The merge patch by which `approver` approves what was reviewed.
    pub fn approval(&self, approver: &str, reference: &str) -> Value {
        json!({"spec": {"approval": {
            "approvedBy": approver,
            "reference": reference,
            "scopeSha256": self.scope_sha256,
            "specSha256": self.spec_sha256,
        }}})
    }
}

/// Waits until ReplayJob `name`'s status describes its stored spec (the scope frozen, the
/// spec digested at `metadata.generation`) and returns what an approver reads there.
pub async fn review_replay(client: &kube::Client, namespace: &str, name: &str) -> ReplayReview {
    let replays = Api::<ReplayJob>::namespaced(client.clone(), namespace);
    wait_until(
        STEP,
        &format!("ReplayJob {name}'s scope is frozen and its spec digested"),
        || async {
            let replay = replays.get(name).await.ok()?;
            let status = replay.status?;
            let scope = status.scope?;
            (status.observed_generation.is_some()
                && status.observed_generation == replay.metadata.generation)
                .then_some(ReplayReview {
                    scope_sha256: scope.sha256,
                    config_map: scope.config_map,
                    spec_sha256: status.spec_sha256?,
                })
        },
    )
    .await
}

/// What an approver reads before approving a compensation: the frozen request and the digest
/// of the spec, both as the operator wrote them for the stored generation.
#[derive(Clone, Debug)]
pub struct CompensationReview {
    pub request_sha256: String,
    pub spec_sha256: String,
}

impl CompensationReview {
    /// The merge patch by which `approver` approves what was reviewed.
    pub fn approval(&self, approver: &str) -> Value {
        json!({"spec": {"approval": {
            "approvedBy": approver,
            "requestSha256": self.request_sha256,
            "specSha256": self.spec_sha256,
        }}})
    }
}

/// Waits until Compensation `name`'s status describes its stored spec (the request frozen,
/// the spec digested at `metadata.generation`) and returns what an approver reads there.
pub async fn review_compensation(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> CompensationReview {
    let compensations = Api::<Compensation>::namespaced(client.clone(), namespace);
    wait_until(
        STEP,
        &format!("Compensation {name}'s request is frozen and its spec digested"),
        || async {
            let compensation = compensations.get(name).await.ok()?;
            let status = compensation.status?;
            (status.observed_generation.is_some()
                && status.observed_generation == compensation.metadata.generation)
                .then_some(CompensationReview {
                    request_sha256: status.request?.sha256,
                    spec_sha256: status.spec_sha256?,
                })
        },
    )
    .await
}

/// Writes, as the operator (`operator`, its ServiceAccount's client), the spec digest it
/// would write for the current generation of `name`: for tests that run no operator.
pub async fn digest_as_the_operator<K>(
    operator: &kube::Client,
    namespace: &str,
    name: &str,
    digest: &str,
) where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let objects = Api::<K>::namespaced(operator.clone(), namespace);
    let generation = objects
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("reading {name}: {e}"))
        .meta()
        .generation;
    objects
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"observedGeneration": generation, "specSha256": digest}}),
            ),
        )
        .await
        .expect("the operator writes the status");
}
