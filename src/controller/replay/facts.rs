//! What the API shows, in the planning core's terms (pure): recorded stages, halts and
//! verification from the status, Job progress from a Job, and a replay's place in its queue.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::api::conditions::{find, is_true};
use crate::api::replay_job::{ReplayJob, ReplayJobStatus, ReplayPhase, StageStatus};
use crate::core::replay_plan::{
    HALTED, Halt, JobObservation, JobOutcome, JobShape, JobView, QueueMember, Stage, StageName,
    StageRecord, VERIFIED, count_indexes,
};

use super::ended;

fn to_u32(value: i32) -> u32 {
    u32::try_from(value).unwrap_or(0)
}

fn to_i32(value: u32) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

/// The stages the status recorded; entries with an unknown stage name are ignored.
pub fn recorded_stages(status: &ReplayJobStatus) -> Vec<StageRecord> {
    let mut records: Vec<StageRecord> = status
        .stages
        .iter()
        .filter_map(|s| {
            Some(StageRecord {
                stage: Stage {
                    name: StageName::parse(&s.name)?,
                    first_event: to_u32(s.first_event),
                    events: to_u32(s.events),
                    batch_size: to_u32(s.batch_size),
                    first_batch: to_u32(s.first_batch),
                },
                job: s.job.clone(),
                job_uid: s.job_uid.clone(),
                started_at: s.started_at.as_ref().map(|t| t.0),
                finished_at: s.finished_at.as_ref().map(|t| t.0),
                succeeded: to_u32(s.succeeded),
                failed: to_u32(s.failed),
            })
        })
        .collect();
    records.sort_by_key(|r| r.stage.name);
    records
}

/// A stage as the status records it.
pub fn stage_status(record: &StageRecord) -> StageStatus {
    StageStatus {
        name: record.stage.name.as_str().to_owned(),
        job: record.job.clone(),
        job_uid: record.job_uid.clone(),
        batches: to_i32(record.stage.batches()),
        first_event: to_i32(record.stage.first_event),
        events: to_i32(record.stage.events),
        batch_size: to_i32(record.stage.batch_size),
        first_batch: to_i32(record.stage.first_batch),
        started_at: record.started_at.map(Time),
        finished_at: record.finished_at.map(Time),
        succeeded: to_i32(record.succeeded),
        failed: to_i32(record.failed),
    }
}

/// The halt the status recorded.
pub fn recorded_halt(status: &ReplayJobStatus) -> Option<Halt> {
    find(&status.conditions, HALTED)
        .filter(|c| c.status == "True")
        .map(|c| Halt {
            reason: c.reason.clone(),
            message: c.message.clone(),
        })
}

/// The message of the failure the status recorded: a failed replay is never decided again.
pub fn recorded_failure(status: &ReplayJobStatus) -> Option<String> {
    (status.phase == Some(ReplayPhase::Failed)).then(|| status.message.clone().unwrap_or_default())
}

/// Whether the status records that every check held after the canary.
pub fn recorded_verified(status: &ReplayJobStatus) -> bool {
    is_true(&status.conditions, VERIFIED)
}

fn condition_true(job: &Job, type_: &str) -> Option<String> {
    job.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_ && c.status == "True")
        .map(|c| {
            let reason = c.reason.clone().unwrap_or_default();
            match c.message.as_deref() {
                Some(message) if !message.is_empty() => format!("{reason}: {message}"),
                _ => reason,
            }
        })
}

/// The fields of a Job's spec that bound what it does.
fn shape(job: &Job) -> JobShape {
    let Some(spec) = &job.spec else {
        return JobShape::default();
    };
    JobShape {
        completion_mode: spec.completion_mode.clone(),
        completions: spec.completions.map(i64::from),
        parallelism: spec.parallelism.map(i64::from),
        backoff_limit_per_index: spec.backoff_limit_per_index.map(i64::from),
        max_failed_indexes: spec.max_failed_indexes.map(i64::from),
        active_deadline_seconds: spec.active_deadline_seconds,
    }
}

/// A stage's Job, if any, as progress the core understands. Whose Job it is, is the core's
/// decision, by the uid the status recorded (owner references prove nothing: anyone who may
/// create Jobs may write them). Whether its controller owner reference still names the replay
/// (uid `replay_uid`) is read too: without it the Job would outlive a delete of the replay.
pub fn observe_job(job: Option<&Job>, replay_uid: &str) -> JobObservation {
    let Some(job) = job else {
        return JobObservation::Absent;
    };
    let status = job.status.clone().unwrap_or_default();
    let succeeded = status
        .completed_indexes
        .as_deref()
        .and_then(|list| count_indexes(list).ok())
        .unwrap_or_else(|| to_u32(status.succeeded.unwrap_or(0)));
    let failed = status
        .failed_indexes
        .as_deref()
        .and_then(|list| count_indexes(list).ok())
        .unwrap_or(0);
    // FailureTarget comes before Failed while the last Pods terminate; either means no further
    // batch will succeed.
    let outcome =
        match condition_true(job, "Failed").or_else(|| condition_true(job, "FailureTarget")) {
            Some(why) => JobOutcome::Failed(why),
            None if condition_true(job, "Complete").is_some() => JobOutcome::Succeeded,
            None => JobOutcome::Running,
        };
    JobObservation::Present(JobView {
        uid: job.uid().unwrap_or_default(),
        suspended: job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false),
        succeeded,
        failed,
        outcome,
        finished_at: status.completion_time.map(|t| t.0),
        shape: shape(job),
        owned_by_replay: job
            .owner_references()
            .iter()
            .any(|owner| owner.uid == replay_uid && owner.controller == Some(true)),
    })
}

/// The key of a replay's source queue: queues are a namespace's own, so a replay in another
/// namespace never holds up this one.
pub fn queue_key(replay: &ReplayJob) -> String {
    format!(
        "{}/{}",
        replay.namespace().unwrap_or_default(),
        replay.spec.source.queue
    )
}

/// `namespace/name` of a replay.
pub fn key(replay: &ReplayJob) -> String {
    format!(
        "{}/{}",
        replay.namespace().unwrap_or_default(),
        replay.name_any()
    )
}

/// When a replay was created (the epoch if the server did not say).
pub fn created(replay: &ReplayJob) -> Timestamp {
    replay
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

/// A replay as its queue sees it.
pub fn queue_member(replay: &ReplayJob) -> QueueMember {
    let status = replay.status.clone().unwrap_or_default();
    let started = status.stages.iter().any(|s| s.started_at.is_some());
    QueueMember {
        key: key(replay),
        created: created(replay),
        active: started && !ended(status.phase) && replay.metadata.deletion_timestamp.is_none(),
        queued: status.phase == Some(ReplayPhase::Approved)
            && replay.metadata.deletion_timestamp.is_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn job(status: JobStatus, owner: &str) -> Job {
        Job {
            metadata: ObjectMeta {
                uid: Some("job-1".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "backlog.dev/v1alpha1".into(),
                    kind: "ReplayJob".into(),
                    name: "r".into(),
                    uid: owner.into(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(status),
        }
    }

    fn condition(type_: &str, reason: &str) -> JobCondition {
        JobCondition {
            type_: type_.into(),
            status: "True".into(),
            reason: Some(reason.into()),
            ..JobCondition::default()
        }
    }

    #[test]
    fn a_job_is_seen_with_its_uid_and_shape_whoever_it_claims_to_belong_to() {
        assert_eq!(observe_job(None, "me"), JobObservation::Absent);
        let mut found = job(JobStatus::default(), "other");
        found.spec = Some(k8s_openapi::api::batch::v1::JobSpec {
            parallelism: Some(3),
            active_deadline_seconds: Some(600),
            ..Default::default()
        });
        let JobObservation::Present(view) = observe_job(Some(&found), "me") else {
            panic!("present");
        };
        assert_eq!(view.uid, "job-1");
        assert!(!view.owned_by_replay, "its owner is another replay");
        let JobObservation::Present(view) = observe_job(Some(&found), "other") else {
            panic!("present");
        };
        assert!(view.owned_by_replay);
        found.metadata.owner_references = Some(vec![]);
        let JobObservation::Present(view) = observe_job(Some(&found), "other") else {
            panic!("present");
        };
        assert!(!view.owned_by_replay, "its owner reference was removed");
        assert_eq!(view.shape.parallelism, Some(3));
        assert_eq!(view.shape.active_deadline_seconds, Some(600));
    }

    #[test]
    fn queues_belong_to_their_namespace() {
        let spec: crate::api::replay_job::ReplayJobSpec =
            serde_json::from_value(serde_json::json!({
                "source": {"queue": "orders.dlq"},
                "scope": {"eventIds": ["a"]},
                "reason": "r",
                "requestedBy": "alice",
                "batches": {"size": 1, "canary": 1, "ratePerSecond": 1},
                "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}},
            }))
            .unwrap();
        let mut a = ReplayJob::new("r", spec.clone());
        a.metadata.namespace = Some("team-a".into());
        let mut b = ReplayJob::new("r", spec);
        b.metadata.namespace = Some("team-b".into());
        assert_eq!(queue_key(&a), "team-a/orders.dlq");
        assert_ne!(queue_key(&a), queue_key(&b));
    }

    #[test]
    fn progress_comes_from_the_index_lists_and_the_conditions() {
        let running = observe_job(
            Some(&job(
                JobStatus {
                    completed_indexes: Some("0-2".into()),
                    ..JobStatus::default()
                },
                "me",
            )),
            "me",
        );
        let JobObservation::Present(view) = running else {
            panic!("present");
        };
        assert_eq!((view.succeeded, view.failed), (3, 0));
        assert_eq!(view.outcome, JobOutcome::Running);

        let failed = observe_job(
            Some(&job(
                JobStatus {
                    completed_indexes: Some("0".into()),
                    failed_indexes: Some("1".into()),
                    conditions: Some(vec![
                        condition("FailureTarget", "MaxFailedIndexesExceeded"),
                        condition("Failed", "MaxFailedIndexesExceeded"),
                    ]),
                    ..JobStatus::default()
                },
                "me",
            )),
            "me",
        );
        let JobObservation::Present(view) = failed else {
            panic!("present");
        };
        assert_eq!((view.succeeded, view.failed), (1, 1));
        assert_eq!(
            view.outcome,
            JobOutcome::Failed("MaxFailedIndexesExceeded".into())
        );

        let done = observe_job(
            Some(&job(
                JobStatus {
                    completed_indexes: Some("0".into()),
                    conditions: Some(vec![
                        condition("SuccessCriteriaMet", "CompletionsReached"),
                        condition("Complete", "CompletionsReached"),
                    ]),
                    ..JobStatus::default()
                },
                "me",
            )),
            "me",
        );
        assert!(matches!(
            done,
            JobObservation::Present(JobView {
                outcome: JobOutcome::Succeeded,
                ..
            })
        ));
    }

    #[test]
    fn stages_survive_a_round_trip_through_the_status() {
        let stage = crate::core::replay_plan::stages(
            10,
            crate::core::replay_plan::BatchPlan { canary: 2, size: 3 },
        )[1];
        let record = StageRecord {
            stage,
            job: "r-main-abc".into(),
            job_uid: Some("u".into()),
            started_at: Some(Timestamp::UNIX_EPOCH),
            finished_at: None,
            succeeded: 1,
            failed: 0,
        };
        let status = ReplayJobStatus {
            stages: vec![stage_status(&record)],
            ..ReplayJobStatus::default()
        };
        assert_eq!(recorded_stages(&status), vec![record]);
    }
}
