//! Which pods a worker's Job ran (pure). Anyone who may create pods in the namespace can give
//! one the Job's labels, and a pod's termination message is whatever its container writes: a
//! report is read only from a pod whose controller is the Job (by uid) and that runs the Job's
//! own worker, so a forged pod cannot report for it.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::ResourceExt;

/// Why `pod` is not one `job` ran, or `None` when it is: its controller owner reference names
/// the Job's uid, it runs as the Job's ServiceAccount, it has the Job's volumes, and every
/// container of the Job's template is in it with the same image, command, arguments,
/// environment and mounts. (Mutating admission may add containers, variables or volumes; it
/// cannot take the template's away or change them.)
pub fn not_of_job(job: &Job, pod: &Pod) -> Option<String> {
    let Some(job_uid) = job.uid() else {
        return Some("the Job has no uid".to_owned());
    };
    let owned = pod
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.kind == "Job" && o.uid == job_uid);
    if !owned {
        return Some("its controller is not the Job".to_owned());
    }
    let Some(template) = job.spec.as_ref().and_then(|s| s.template.spec.as_ref()) else {
        return Some("the Job has no pod template".to_owned());
    };
    let Some(spec) = pod.spec.as_ref() else {
        return Some("it has no spec".to_owned());
    };
    if spec.service_account_name != template.service_account_name {
        return Some(format!(
            "it runs as ServiceAccount {:?}, not {:?}",
            spec.service_account_name, template.service_account_name
        ));
    }
    let volumes = spec.volumes.as_deref().unwrap_or_default();
    if let Some(missing) = template
        .volumes
        .iter()
        .flatten()
        .find(|wanted| !volumes.contains(wanted))
    {
        return Some(format!("volume {} differs from the Job's", missing.name));
    }
    containers_differ(
        template.init_containers.as_deref(),
        spec.init_containers.as_deref(),
    )
    .or_else(|| containers_differ(Some(&template.containers), Some(&spec.containers)))
}

fn containers_differ(wanted: Option<&[Container]>, found: Option<&[Container]>) -> Option<String> {
    let found = found.unwrap_or_default();
    wanted.unwrap_or_default().iter().find_map(|wanted| {
        let Some(container) = found.iter().find(|c| c.name == wanted.name) else {
            return Some(format!("container {} is missing", wanted.name));
        };
        container_differs(wanted, container)
            .map(|what| format!("container {}: {what}", wanted.name))
    })
}

fn container_differs(wanted: &Container, found: &Container) -> Option<String> {
    if found.image != wanted.image {
        return Some(format!("image {:?}, not {:?}", found.image, wanted.image));
    }
    if found.command != wanted.command || found.args != wanted.args {
        return Some("another command or arguments".to_owned());
    }
    if found.working_dir != wanted.working_dir || found.env_from != wanted.env_from {
        return Some("another working directory or environment source".to_owned());
    }
    let env = found.env.as_deref().unwrap_or_default();
    if let Some(variable) = wanted.env.iter().flatten().find(|v| !env.contains(v)) {
        return Some(format!("variable {} differs", variable.name));
    }
    let mounts = found.volume_mounts.as_deref().unwrap_or_default();
    if let Some(mount) = wanted
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| !mounts.contains(m))
    {
        return Some(format!("mount {} differs", mount.mount_path));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job() -> Job {
        serde_json::from_value(json!({
            "metadata": {"name": "c-1", "uid": "job-uid"},
            "spec": {"template": {"spec": {
                "serviceAccountName": "replay-worker",
                "restartPolicy": "Never",
                "volumes": [{"name": "request", "configMap": {"name": "c-1-request"}}],
                "containers": [{
                    "name": "worker",
                    "image": "registry.example.com/worker@sha256:aa",
                    "env": [{"name": "COMPENSATION_ID", "value": "refund-1"}],
                    "volumeMounts": [{"name": "request", "mountPath": "/etc/req", "readOnly": true}],
                }],
            }}},
        }))
        .expect("a Job")
    }

    /// The pod the Job controller makes of it, with what admission adds.
    fn its_pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "c-1-abcde", "ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "Job", "name": "c-1", "uid": "job-uid",
                "controller": true,
            }]},
            "spec": {
                "serviceAccountName": "replay-worker",
                "nodeName": "node-1",
                "volumes": [
                    {"name": "request", "configMap": {"name": "c-1-request"}},
                    {"name": "kube-api-access-x", "projected": {"sources": []}},
                ],
                "containers": [
                    {
                        "name": "worker",
                        "image": "registry.example.com/worker@sha256:aa",
                        "env": [
                            {"name": "COMPENSATION_ID", "value": "refund-1"},
                            {"name": "HTTP_PROXY", "value": "http://proxy:3128"},
                        ],
                        "volumeMounts": [
                            {"name": "request", "mountPath": "/etc/req", "readOnly": true},
                            {"name": "kube-api-access-x", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
                        ],
                    },
                    {"name": "injected-sidecar", "image": "proxy:1"},
                ],
            },
        }))
        .expect("a Pod")
    }

    #[test]
    fn the_jobs_own_pod_is_its_pod_whatever_admission_added() {
        assert_eq!(not_of_job(&job(), &its_pod()), None);
    }

    #[test]
    fn a_pod_that_only_claims_the_job_is_not_its_pod() {
        // Each a field of the Job's own pod, changed: (what, JSON pointer, value).
        let forged = [
            ("no owner", "/metadata/ownerReferences", json!(null)),
            ("another Job", "/metadata/ownerReferences/0/uid", json!("x")),
            (
                "not controller",
                "/metadata/ownerReferences/0/controller",
                json!(false),
            ),
            ("image", "/spec/containers/0/image", json!("busybox")),
            (
                "command",
                "/spec/containers/0/command",
                json!(["sh", "-c", "echo"]),
            ),
            ("variable", "/spec/containers/0/env/0/value", json!("other")),
            ("account", "/spec/serviceAccountName", json!("default")),
            ("volume", "/spec/volumes/0/configMap/name", json!("hers")),
            (
                "mount",
                "/spec/containers/0/volumeMounts/0/mountPath",
                json!("/x"),
            ),
        ];
        for (what, pointer, value) in forged {
            let mut pod = serde_json::to_value(its_pod()).expect("json");
            match pod.pointer_mut(pointer) {
                Some(field) => *field = value,
                None => {
                    let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
                    pod.pointer_mut(parent).expect(what)[key] = value;
                }
            }
            let pod: Pod = serde_json::from_value(pod).expect("a Pod");
            assert!(not_of_job(&job(), &pod).is_some(), "{what}");
        }
        let mut renamed = its_pod();
        renamed.spec.as_mut().expect("spec").containers[0].name = "other".into();
        assert_eq!(
            not_of_job(&job(), &renamed).as_deref(),
            Some("container worker is missing")
        );
    }
}
