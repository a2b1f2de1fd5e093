//! The worker's Job (pure): one pod, run once (no retries: a retry would run the sub-actions
//! again), under the restricted profile, with the frozen request mounted read-only. Named after
//! the compensationId, so two Compensations with one id can never both have a Job.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::EnvVar;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};

use super::request::{LABEL_ID, REQUEST_KEY, id_label};
use crate::api::compensation::Compensation;
use crate::controller::apply::FIELD_MANAGER;
use crate::controller::worker_pod::{self, FrozenMount};
use crate::core::compensation_plan::child_name;

/// Label on the worker's Job and Pod: the Compensation's name.
pub const LABEL_COMPENSATION: &str = "backlog.dev/compensation";
/// Where the request is mounted in the worker (read-only).
pub const REQUEST_MOUNT_DIR: &str = "/etc/backlog-compensation";
/// `COMPENSATION_REQUEST_FILE`.
pub const REQUEST_FILE: &str = "/etc/backlog-compensation/request.json";
const REQUEST_VOLUME: &str = "backlog-compensation-request";
/// How long a worker may run.
const DEADLINE_SECONDS: i64 = 3600;

/// The operation id of the whole compensation (and the annotations that identify the
/// operator's Job, as for replays).
pub fn operation(compensation: &Compensation) -> String {
    format!("compensation-{}", compensation.uid().unwrap_or_default())
}

fn contract_env(compensation: &Compensation, sha: &str) -> Vec<EnvVar> {
    [
        ("COMPENSATION_ID", compensation.spec.compensation_id.clone()),
        ("COMPENSATION_NAME", compensation.name_any()),
        (
            "COMPENSATION_NAMESPACE",
            compensation.namespace().unwrap_or_default(),
        ),
        ("COMPENSATION_REQUEST_FILE", REQUEST_FILE.to_owned()),
        ("COMPENSATION_REQUEST_SHA256", sha.to_owned()),
        (
            "COMPENSATION_REPORT_FILE",
            "/dev/termination-log".to_owned(),
        ),
    ]
    .into_iter()
    .map(|(name, value)| EnvVar {
        name: name.to_owned(),
        value: Some(value),
        value_from: None,
    })
    .collect()
}

/// The worker's Job, created suspended. `None` without a uid (no owner to name), or when the
/// template is not a pod template (refused before the start).
pub fn build(
    compensation: &Compensation,
    config_map: &str,
    sha: &str,
    worker_account: &str,
) -> Option<Job> {
    let owner = compensation.controller_owner_ref(&())?;
    let labels = BTreeMap::from([
        (
            "app.kubernetes.io/managed-by".to_owned(),
            FIELD_MANAGER.to_owned(),
        ),
        (LABEL_COMPENSATION.to_owned(), compensation.name_any()),
        (
            LABEL_ID.to_owned(),
            id_label(&compensation.spec.compensation_id),
        ),
    ]);
    let env = contract_env(compensation, sha);
    let mut template = worker_pod::prepare(
        compensation.spec.template.decode().ok()?,
        &labels,
        &env,
        &FrozenMount {
            volume: REQUEST_VOLUME,
            dir: REQUEST_MOUNT_DIR,
            config_map,
            key: REQUEST_KEY,
        },
        worker_account,
    );
    // The report is the termination message, whatever the template says.
    if let Some(pod) = template.spec.as_mut() {
        for container in &mut pod.containers {
            container.termination_message_path = Some("/dev/termination-log".to_owned());
            container.termination_message_policy = Some("File".to_owned());
        }
    }
    Some(Job {
        metadata: ObjectMeta {
            name: Some(child_name(&compensation.spec.compensation_id)),
            namespace: compensation.namespace(),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([
                (
                    "backlog.dev/operation-id".to_owned(),
                    operation(compensation),
                ),
                ("backlog.dev/scope-sha256".to_owned(), sha.to_owned()),
            ])),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            completions: Some(1),
            parallelism: Some(1),
            // Never a second pod: a retry would run the sub-actions again.
            backoff_limit: Some(0),
            active_deadline_seconds: Some(DEADLINE_SECONDS),
            suspend: Some(true),
            template,
            ..JobSpec::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worker_runs_once_suspended_restricted_with_the_contract() {
        let mut compensation: Compensation = serde_json::from_value(serde_json::json!({
            "apiVersion": "backlog.dev/v1alpha1",
            "kind": "Compensation",
            "metadata": {"name": "refund", "namespace": "shop", "uid": "u-1"},
            "spec": {
                "compensationId": "refund-o-123",
                "sourceEventId": "evt-1",
                "businessKey": "order/o-123",
                "reasonCode": "Other",
                "requestedBy": "alice",
                "expectedCurrentStateAndVersion": {"resource": "r", "state": "S", "version": "1"},
                "proposedAction": {"description": "d", "subActions": ["refund"]},
                "affectedResources": ["r"],
                "dryRunEvidence": "e",
                "template": {"spec": {"containers": [{"name": "worker", "image": "worker",
                    "env": [{"name": "COMPENSATION_REQUEST_SHA256", "value": "forged"}],
                    "terminationMessagePolicy": "FallbackToLogsOnError"}]}},
            }
        }))
        .expect("a Compensation");
        compensation.metadata.uid = Some("u-1".into());
        let job = build(&compensation, "compensation-x", "5e3c", "replay-worker").expect("a Job");
        assert_eq!(
            job.metadata.name.as_deref(),
            Some(child_name("refund-o-123").as_str())
        );
        let spec = job.spec.expect("spec");
        assert_eq!(
            (spec.backoff_limit, spec.suspend, spec.completions),
            (Some(0), Some(true), Some(1))
        );
        let pod = spec.template.spec.expect("pod");
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        assert_eq!(pod.service_account_name.as_deref(), Some("replay-worker"));
        let container = &pod.containers[0];
        let env: BTreeMap<String, String> = container
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect();
        assert_eq!(
            env["COMPENSATION_REQUEST_SHA256"], "5e3c",
            "the template cannot forge it"
        );
        assert_eq!(env["COMPENSATION_REQUEST_FILE"], REQUEST_FILE);
        assert_eq!(
            container.termination_message_policy.as_deref(),
            Some("File")
        );
        let context = container.security_context.as_ref().expect("restricted");
        assert_eq!(context.allow_privilege_escalation, Some(false));
        assert!(pod.volumes.iter().flatten().any(|v| {
            v.config_map
                .as_ref()
                .is_some_and(|c| c.name == "compensation-x")
        }));
    }
}
