//! A stage's Job that the status does not record: the operator's own when it died between the
//! create and the record of the Job's uid, or someone else's. Which one cannot be known after a
//! restart, and does not need to be: a Job that is exactly the Job the operator would create
//! for the recorded stage runs the approved scope at the approved pace, whoever created it, so
//! it is followed as the stage's Job. Any other Job under the name stays foreign and halts the
//! replay.
//!
//! "Exactly" is judged on the API server's own form: the Job the operator would create is
//! validated and defaulted by a dry run, and the two are compared field by field, leaving out
//! only what the server generates per object (the selector and its labels) and `suspend`.

use k8s_openapi::api::batch::v1::Job;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use serde_json::Value;

use crate::controller::apply::FIELD_MANAGER;

/// Labels the API server puts on a Job's pod template for that one Job.
const GENERATED_LABELS: [&str; 4] = [
    "controller-uid",
    "batch.kubernetes.io/controller-uid",
    "job-name",
    "batch.kubernetes.io/job-name",
];

/// Annotations the operator sets on its Jobs; both must be equal.
const OUR_ANNOTATIONS: [&str; 2] = ["backlog.dev/operation-id", "backlog.dev/scope-sha256"];

/// The part of a Job spec that decides what it runs, without what the server generates.
fn workload(job: &Job) -> Option<Value> {
    let mut spec = serde_json::to_value(job.spec.as_ref()?).ok()?;
    let fields = spec.as_object_mut()?;
    fields.remove("selector");
    // Suspending only holds a Job back; it never makes it do more.
    fields.remove("suspend");
    if let Some(labels) = fields
        .get_mut("template")
        .and_then(|t| t.get_mut("metadata"))
        .and_then(|m| m.get_mut("labels"))
        .and_then(Value::as_object_mut)
    {
        for label in GENERATED_LABELS {
            labels.remove(label);
        }
    }
    Some(spec)
}

/// Whether `found` runs exactly what `intended` (the server's defaulted form of the Job the
/// operator would create) runs, under the same owner and operation.
pub fn same_workload(intended: &Job, found: &Job) -> bool {
    let found_workload = workload(found);
    found.metadata.owner_references == intended.metadata.owner_references
        && OUR_ANNOTATIONS.iter().all(|key| {
            let ours = found.annotations().get(*key);
            ours.is_some() && ours == intended.annotations().get(*key)
        })
        && found_workload.is_some()
        && found_workload == workload(intended)
}

/// The server's defaulted form of `job`, from a dry run under a generated name (the real name
/// is taken by the Job being judged). `None` when the server refuses it.
pub async fn defaulted(api: &Api<Job>, job: &Job) -> Result<Option<Job>, kube::Error> {
    let mut probe = job.clone();
    probe.metadata.name = None;
    probe.metadata.generate_name = Some("adoption-check-".to_owned());
    let params = PostParams {
        dry_run: true,
        field_manager: Some(FIELD_MANAGER.to_owned()),
    };
    match api.create(&params, &probe).await {
        Ok(defaulted) => Ok(Some(defaulted)),
        Err(kube::Error::Api(status)) if matches!(status.code, 400 | 403 | 409 | 422) => Ok(None),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A Job as the API server returns it, with its generated parts.
    fn server_job(uid: &str) -> Job {
        serde_json::from_value(json!({
            "metadata": {
                "name": "orders-canary-5e3c",
                "uid": uid,
                "annotations": {
                    "backlog.dev/operation-id": "op-1",
                    "backlog.dev/scope-sha256": "abc"
                },
                "ownerReferences": [{
                    "apiVersion": "backlog.dev/v1alpha1", "kind": "ReplayJob", "name": "orders",
                    "uid": "r-1", "controller": true, "blockOwnerDeletion": true
                }]
            },
            "spec": {
                "completionMode": "Indexed", "completions": 2, "parallelism": 1,
                "backoffLimitPerIndex": 1, "maxFailedIndexes": 0, "activeDeadlineSeconds": 600,
                "suspend": false,
                "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}},
                "template": {
                    "metadata": {"labels": {
                        "backlog.dev/replay": "orders",
                        "controller-uid": uid,
                        "batch.kubernetes.io/controller-uid": uid,
                        "job-name": "orders-canary-5e3c",
                        "batch.kubernetes.io/job-name": "orders-canary-5e3c"
                    }},
                    "spec": {
                        "restartPolicy": "Never",
                        "serviceAccountName": "replay-worker",
                        "containers": [{"name": "worker", "image": "worker@sha256:1", "env": [
                            {"name": "REPLAY_FIRST_EVENT", "value": "0"}
                        ]}]
                    }
                }
            }
        }))
        .unwrap()
    }

    #[test]
    fn the_same_job_under_other_generated_labels_is_the_same_workload() {
        assert!(same_workload(&server_job("dry-run"), &server_job("real")));
    }

    /// One change to a Job's JSON.
    type Edit = Box<dyn Fn(&mut Value)>;

    #[test]
    fn any_difference_in_what_it_runs_or_for_whom_is_another_workload() {
        let intended = server_job("dry-run");
        let edits: Vec<(&str, Edit)> = vec![
            (
                "image",
                Box::new(|j| {
                    j["spec"]["template"]["spec"]["containers"][0]["image"] = json!("evil:1")
                }),
            ),
            (
                "an added field",
                Box::new(|j| j["spec"]["template"]["spec"]["hostNetwork"] = json!(true)),
            ),
            (
                "parallelism",
                Box::new(|j| j["spec"]["parallelism"] = json!(5)),
            ),
            (
                "env",
                Box::new(|j| {
                    j["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = json!("3")
                }),
            ),
            (
                "owner",
                Box::new(|j| j["metadata"]["ownerReferences"][0]["uid"] = json!("r-2")),
            ),
            (
                "operation",
                Box::new(|j| {
                    j["metadata"]["annotations"]["backlog.dev/operation-id"] = json!("op-2")
                }),
            ),
            (
                "no annotations",
                Box::new(|j| j["metadata"]["annotations"] = json!({})),
            ),
            (
                "a label of its own",
                Box::new(|j| j["spec"]["template"]["metadata"]["labels"]["x"] = json!("y")),
            ),
        ];
        for (what, edit) in edits {
            let mut found = serde_json::to_value(server_job("real")).unwrap();
            edit(&mut found);
            let found: Job = serde_json::from_value(found).unwrap();
            assert!(!same_workload(&intended, &found), "{what} should differ");
        }
    }

    #[test]
    fn a_suspended_copy_is_still_the_same_workload() {
        let mut found = server_job("real");
        if let Some(spec) = found.spec.as_mut() {
            spec.suspend = Some(true);
        }
        assert!(same_workload(&server_job("dry-run"), &found));
    }
}
