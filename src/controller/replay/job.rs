//! A stage's Indexed Job: built from the spec and the recorded stage (pure), created once with a
//! plain create (POST: it fails if anything of that name exists, so nothing is ever taken
//! over), and afterwards only ever suspended or resumed.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::EnvVar;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};

use crate::api::replay_job::{FrozenScope, ReplayJob};
use crate::controller::apply::FIELD_MANAGER;
use crate::controller::worker_pod::{self, FrozenMount};
use crate::core::replay_plan::{Pacing, StageRecord, expected_shape, operation_id};

/// Label on every Job (and its Pods) of a replay: the replay's name.
pub const LABEL_REPLAY: &str = "backlog.dev/replay";
/// Label on every Job (and its Pods) of a replay: `canary` or `main`.
pub const LABEL_STAGE: &str = "backlog.dev/replay-stage";
/// The frozen ids' key in the scope ConfigMap, and the file name the worker reads.
pub const EVENT_IDS_KEY: &str = "event-ids";
/// Where the scope ConfigMap is mounted in the worker (read-only).
pub const SCOPE_MOUNT_DIR: &str = "/etc/backlog-replay";
/// `REPLAY_EVENT_IDS_FILE`.
pub const EVENT_IDS_FILE: &str = "/etc/backlog-replay/event-ids";
/// The volume holding the scope ConfigMap.
pub const SCOPE_VOLUME: &str = "backlog-replay-scope";

/// The worker's environment (the contract in `examples/replay-worker/README.md`); the
/// operator's values replace any of the same name in the template, so the template cannot
/// point the worker at other ids.
fn contract_env(replay: &ReplayJob, record: &StageRecord, scope: &FrozenScope) -> Vec<EnvVar> {
    let spec = &replay.spec;
    let stage = &record.stage;
    let time_range = spec.scope.time_range.as_ref();
    let pairs: [(&str, String); 18] = [
        (
            "REPLAY_OPERATION_ID",
            operation_id(replay.uid().as_deref().unwrap_or_default()),
        ),
        ("REPLAY_NAME", replay.name_any()),
        ("REPLAY_NAMESPACE", replay.namespace().unwrap_or_default()),
        ("REPLAY_SOURCE", spec.source.queue.clone()),
        (
            "REPLAY_DESTINATION",
            spec.destination
                .as_ref()
                .map(|d| d.queue.clone())
                .unwrap_or_default(),
        ),
        ("REPLAY_EVENT_IDS_FILE", EVENT_IDS_FILE.to_owned()),
        ("REPLAY_EVENT_IDS_SHA256", scope.sha256.clone()),
        ("REPLAY_STAGE", stage.name.as_str().to_owned()),
        ("REPLAY_FIRST_EVENT", stage.first_event.to_string()),
        ("REPLAY_EVENT_COUNT", stage.events.to_string()),
        ("REPLAY_BATCH_SIZE", stage.batch_size.to_string()),
        ("REPLAY_FIRST_BATCH", stage.first_batch.to_string()),
        (
            "REPLAY_RATE_PER_SECOND",
            spec.batches.rate_per_second.to_string(),
        ),
        (
            "REPLAY_PAUSE_BETWEEN",
            spec.batches
                .pause_between
                .clone()
                .unwrap_or_else(|| "0s".to_owned()),
        ),
        (
            "REPLAY_EVENT_TYPE",
            spec.scope.event_type.clone().unwrap_or_default(),
        ),
        (
            "REPLAY_TENANT",
            spec.scope.tenant.clone().unwrap_or_default(),
        ),
        (
            "REPLAY_TIME_FROM",
            time_range.map(|t| t.from.clone()).unwrap_or_default(),
        ),
        (
            "REPLAY_TIME_TO",
            time_range.map(|t| t.to.clone()).unwrap_or_default(),
        ),
    ];
    pairs
        .into_iter()
        .map(|(name, value)| EnvVar {
            name: name.to_owned(),
            value: Some(value),
            value_from: None,
        })
        .collect()
}

/// The labels of a stage's Job and Pods.
pub fn labels(replay: &str, record: &StageRecord) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/managed-by".to_owned(),
            FIELD_MANAGER.to_owned(),
        ),
        (LABEL_REPLAY.to_owned(), replay.to_owned()),
        (
            LABEL_STAGE.to_owned(),
            record.stage.name.as_str().to_owned(),
        ),
    ])
}

/// The Job of a stage. `None` when the replay has no uid (it was not read from the API
/// server), since the Job could not name its owner, or when its template is not a pod
/// template (refused before any stage starts).
pub fn build(
    replay: &ReplayJob,
    record: &StageRecord,
    scope: &FrozenScope,
    pacing: Pacing,
    worker_account: &str,
) -> Option<Job> {
    let owner = replay.controller_owner_ref(&())?;
    let name = replay.name_any();
    let labels = labels(&name, record);
    let env = contract_env(replay, record, scope);

    let template = worker_pod::prepare(
        replay.spec.template.decode().ok()?,
        &labels,
        &env,
        &FrozenMount {
            volume: SCOPE_VOLUME,
            dir: SCOPE_MOUNT_DIR,
            config_map: &scope.config_map,
            key: EVENT_IDS_KEY,
        },
        worker_account,
    );

    let shape = expected_shape(&record.stage, pacing);
    let small = |value: Option<i64>| value.and_then(|v| i32::try_from(v).ok());
    Some(Job {
        metadata: ObjectMeta {
            name: Some(record.job.clone()),
            namespace: replay.namespace(),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([
                (
                    "backlog.dev/operation-id".to_owned(),
                    operation_id(replay.uid().as_deref().unwrap_or_default()),
                ),
                ("backlog.dev/scope-sha256".to_owned(), scope.sha256.clone()),
            ])),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        // The shape the core expects of it (one batch per index, one at a time, a failed batch
        // stops the Job, a deadline): a Job found with another shape was edited.
        spec: Some(JobSpec {
            completion_mode: shape.completion_mode,
            completions: small(shape.completions),
            parallelism: small(shape.parallelism),
            backoff_limit_per_index: small(shape.backoff_limit_per_index),
            max_failed_indexes: small(shape.max_failed_indexes),
            active_deadline_seconds: shape.active_deadline_seconds,
            // Created suspended, resumed once the status records its uid: a Job that vanishes
            // before that record ran nothing, so the stage can be created again safely.
            suspend: Some(true),
            template,
            ..JobSpec::default()
        }),
        status: None,
    })
}

/// The API server's verdict on a Job it was asked to validate.
pub enum Verdict {
    Valid,
    /// Refused, with the server's message (names the field).
    Refused(String),
    /// Something of that name exists already: not the operator's to take over.
    Exists,
}

fn post_params(dry_run: bool) -> PostParams {
    PostParams {
        dry_run,
        field_manager: Some(FIELD_MANAGER.to_owned()),
    }
}

/// Asks the API server to validate the Job without creating it, so a template it refuses is
/// reported before the replay records a start.
pub async fn dry_run(api: &Api<Job>, job: &Job) -> Result<Verdict, kube::Error> {
    match api.create(&post_params(true), job).await {
        Ok(_) => Ok(Verdict::Valid),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(Verdict::Exists),
        Err(kube::Error::Api(status)) if matches!(status.code, 400 | 403 | 422) => {
            Ok(Verdict::Refused(status.message))
        }
        Err(error) => Err(error),
    }
}

/// Creates the Job; the API server refuses if any object of that name exists, so the Job the
/// answer describes (and its uid) is the operator's own.
pub async fn create(api: &Api<Job>, job: &Job) -> Result<Job, kube::Error> {
    api.create(&post_params(false), job).await
}

/// Suspends or resumes a Job. A merge patch of this one field: applying a partial Job under the
/// field manager that created it would drop (and so try to change) everything else.
pub async fn set_suspend(api: &Api<Job>, name: &str, suspend: bool) -> Result<Job, kube::Error> {
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    api.patch(
        name,
        &params,
        &Patch::Merge(serde_json::json!({"spec": {"suspend": suspend}})),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::replay_job::ReplayJobSpec;
    use crate::core::replay_plan::{BatchPlan, job_name, stages};
    use k8s_openapi::api::core::v1::Container;
    use k8s_openapi::jiff::Timestamp;

    fn replay(template: serde_json::Value) -> ReplayJob {
        let spec: ReplayJobSpec = serde_json::from_value(serde_json::json!({
            "source": {"queue": "orders.dlq"},
            "scope": {"eventIds": ["a", "b", "c"], "tenant": "acme"},
            "reason": "fix shipped",
            "requestedBy": "alice",
            "batches": {"size": 2, "canary": 1, "ratePerSecond": 2.5, "retriesPerBatch": 2},
            "template": template,
        }))
        .unwrap();
        let mut replay = ReplayJob::new("orders", spec);
        replay.metadata.namespace = Some("team".into());
        replay.metadata.uid = Some("5e3c1a2b-1111".into());
        replay
    }

    const WORKER: &str = "replay-worker";

    const PACING: Pacing = Pacing {
        rate_per_second: 2.5,
        pause_between_seconds: 0.0,
        retries_per_batch: 2,
    };

    fn scope() -> FrozenScope {
        FrozenScope {
            config_map: "orders-scope-5e3c1a".into(),
            config_map_uid: Some("cm-uid".into()),
            count: 3,
            sha256: "abc".into(),
            frozen_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
        }
    }

    fn main_record() -> StageRecord {
        let stage = stages(3, BatchPlan { canary: 1, size: 2 })[1];
        StageRecord {
            stage,
            job: job_name("orders", "5e3c1a2b-1111", stage.name),
            job_uid: None,
            started_at: None,
            finished_at: None,
            succeeded: 0,
            failed: 0,
        }
    }

    fn env_of(container: &Container) -> BTreeMap<String, String> {
        container
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect()
    }

    #[test]
    fn the_job_is_indexed_one_batch_per_index_owned_and_labelled() {
        let replay =
            replay(serde_json::json!({"spec": {"containers": [{"name": "w", "image": "tool:1"}]}}));
        let job = build(&replay, &main_record(), &scope(), PACING, WORKER).unwrap();
        assert_eq!(job.metadata.name.as_deref(), Some("orders-main-5e3c1a"));
        let spec = job.spec.as_ref().unwrap();
        assert_eq!(spec.completion_mode.as_deref(), Some("Indexed"));
        assert_eq!(spec.completions, Some(1));
        assert_eq!(spec.parallelism, Some(1));
        assert_eq!(spec.backoff_limit_per_index, Some(2));
        assert_eq!(spec.max_failed_indexes, Some(0));
        let deadline =
            crate::core::replay_plan::stage_deadline_seconds(&main_record().stage, PACING);
        assert_eq!(spec.active_deadline_seconds, Some(deadline));
        let owner = &job.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("ReplayJob", Some(true))
        );
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        let labels = spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap();
        assert_eq!(labels[LABEL_STAGE], "main");
    }

    #[test]
    fn the_worker_gets_the_contract_and_the_frozen_ids_read_only() {
        let replay = replay(serde_json::json!({"spec": {"containers": [{
            "name": "w", "image": "tool:1",
            "env": [{"name": "REPLAY_EVENT_IDS_FILE", "value": "/elsewhere"}, {"name": "KEEP", "value": "1"}]
        }]}}));
        let job = build(&replay, &main_record(), &scope(), PACING, WORKER).unwrap();
        let pod = job.spec.unwrap().template.spec.unwrap();
        let env = env_of(&pod.containers[0]);
        assert_eq!(env["REPLAY_EVENT_IDS_FILE"], EVENT_IDS_FILE);
        assert_eq!(env["KEEP"], "1");
        assert_eq!(env["REPLAY_OPERATION_ID"], "replay-5e3c1a2b-1111");
        assert_eq!(env["REPLAY_SOURCE"], "orders.dlq");
        assert_eq!(env["REPLAY_DESTINATION"], "");
        assert_eq!(env["REPLAY_STAGE"], "main");
        assert_eq!(env["REPLAY_FIRST_EVENT"], "1");
        assert_eq!(env["REPLAY_EVENT_COUNT"], "2");
        assert_eq!(env["REPLAY_BATCH_SIZE"], "2");
        assert_eq!(env["REPLAY_FIRST_BATCH"], "1");
        assert_eq!(env["REPLAY_RATE_PER_SECOND"], "2.5");
        assert_eq!(env["REPLAY_PAUSE_BETWEEN"], "0s");
        assert_eq!(env["REPLAY_TENANT"], "acme");
        let mounts = pod.containers[0].volume_mounts.clone().unwrap();
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].read_only, Some(true));
        assert_eq!(mounts[0].mount_path, SCOPE_MOUNT_DIR);
        let volume = &pod.volumes.unwrap()[0];
        assert_eq!(
            volume.config_map.as_ref().map(|c| c.name.as_str()),
            Some("orders-scope-5e3c1a")
        );
    }

    #[test]
    fn the_template_cannot_pick_the_batch_or_shadow_the_frozen_ids() {
        // Its own JOB_COMPLETION_INDEX would make every index replay the same batch; a mount
        // of another volume within the frozen directory, however spelled, would put other
        // ids where the worker reads the approved ones. Mounts elsewhere stay.
        let shadows = [
            "/etc/backlog-replay/event-ids",
            "/etc//backlog-replay/./event-ids",
            "/etc/backlog-replay/",
            "/etc/x/../backlog-replay/event-ids",
        ];
        let mut mounts: Vec<serde_json::Value> = shadows
            .iter()
            .enumerate()
            .map(|(i, path)| serde_json::json!({"name": format!("other-{i}"), "mountPath": path, "subPath": "ids"}))
            .collect();
        mounts.push(serde_json::json!({"name": "cache", "mountPath": "/etc/backlog-replay-cache"}));
        let replay = replay(serde_json::json!({"spec": {"containers": [{
            "name": "w", "image": "tool:1",
            "env": [{"name": "JOB_COMPLETION_INDEX", "value": "0"}],
            "volumeMounts": mounts,
        }]}}));
        let job = build(&replay, &main_record(), &scope(), PACING, WORKER).unwrap();
        let container = &job.spec.unwrap().template.spec.unwrap().containers[0];
        assert!(!env_of(container).contains_key("JOB_COMPLETION_INDEX"));
        let paths: Vec<&str> = container
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert_eq!(paths, ["/etc/backlog-replay-cache", SCOPE_MOUNT_DIR]);
    }

    #[test]
    fn workers_are_restricted_unless_the_template_says_otherwise() {
        let replay = replay(serde_json::json!({"spec": {
            "containers": [
                {"name": "plain", "image": "tool:1"},
                {"name": "writable", "image": "tool:1", "securityContext": {"readOnlyRootFilesystem": false}}
            ]
        }}));
        let job = build(&replay, &main_record(), &scope(), PACING, WORKER).unwrap();
        let pod = job.spec.unwrap().template.spec.unwrap();
        let plain = pod.containers[0].security_context.clone().unwrap();
        assert_eq!(plain.run_as_non_root, Some(true));
        assert_eq!(plain.read_only_root_filesystem, Some(true));
        assert_eq!(plain.allow_privilege_escalation, Some(false));
        assert_eq!(
            plain.capabilities.unwrap().drop,
            Some(vec!["ALL".to_owned()])
        );
        assert_eq!(plain.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let writable = pod.containers[1].security_context.clone().unwrap();
        assert_eq!(writable.read_only_root_filesystem, Some(false));
        assert_eq!(writable.allow_privilege_escalation, Some(false));
        let pod_context = pod.security_context.unwrap();
        assert_eq!(pod_context.run_as_non_root, Some(true));
    }

    #[test]
    fn every_capability_is_dropped_and_the_worker_gets_its_own_service_account() {
        let replay = replay(serde_json::json!({"spec": {"containers": [
            {"name": "w", "image": "tool:1", "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]}}}
        ]}}));
        let job = build(&replay, &main_record(), &scope(), PACING, WORKER).unwrap();
        let pod = job.spec.unwrap().template.spec.unwrap();
        let capabilities = pod.containers[0]
            .security_context
            .clone()
            .unwrap()
            .capabilities
            .unwrap();
        assert_eq!(capabilities.drop, Some(vec!["ALL".to_owned()]));
        assert_eq!(capabilities.add, Some(vec!["NET_BIND_SERVICE".to_owned()]));
        assert_eq!(pod.service_account_name.as_deref(), Some(WORKER));
    }

    #[test]
    fn the_same_stage_builds_the_same_job() {
        let replay =
            replay(serde_json::json!({"spec": {"containers": [{"name": "w", "image": "tool:1"}]}}));
        assert_eq!(
            build(&replay, &main_record(), &scope(), PACING, WORKER),
            build(&replay, &main_record(), &scope(), PACING, WORKER)
        );
    }
}
