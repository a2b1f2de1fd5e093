//! What a replay's decision does, as steps in order (pure), and the Events a status transition
//! announces (pure). The order is what makes a replay safe to kill at any point: a stage's
//! start is recorded before its Job is created, the Job is created suspended, its uid is
//! recorded before it is resumed, and the trail is archived only once the end is written.
//! Events come from the status as written, so a step that fails loses none: the next pass
//! writes the same transition and announces it then.

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;

use crate::api::replay_job::{ReplayJobStatus, ReplayPhase};
use crate::controller::plan::{OnFailure, PlannedEvent, Step};
use crate::core::replay_plan::{Action, StageName};

use super::ended;

/// One side effect of a replay's pass.
#[derive(Clone, Debug, PartialEq)]
pub enum ReplayStep {
    /// Apply the status onto the version the decision was made from.
    WriteStatus(Box<ReplayJobStatus>),
    /// Create the stage's Job, suspended (its start is recorded already).
    CreateJob { stage: StageName, job: Box<Job> },
    /// Record the uid the create answered with, onto the status as last written.
    RecordJobUid { stage: StageName },
    /// Let the created Job run: only once its uid is recorded.
    ResumeJob { job: String },
    /// Suspend or resume a running stage's Job (a halt, `spec.suspend`).
    SetSuspend { job: String, suspend: bool },
    /// Archive the trail of a replay that ended, and record where.
    Archive,
}

impl Step for ReplayStep {
    fn on_failure(&self) -> OnFailure {
        match self {
            // Recorded and suspended, the Job runs nothing until a later pass resumes it.
            ReplayStep::ResumeJob { .. } => OnFailure::Defer,
            // Everything after a write depends on it.
            _ => OnFailure::Stop,
        }
    }
}

/// The steps of one pass: the status if it changed, then the stage to start (`to_create`,
/// a Job the API server accepted in a dry run), then the decided action, then the archive.
pub fn plan(
    previous: &ReplayJobStatus,
    next: &ReplayJobStatus,
    action: Option<&Action>,
    to_create: Option<(StageName, Job)>,
) -> Vec<ReplayStep> {
    let mut steps = Vec::new();
    if next != previous {
        steps.push(ReplayStep::WriteStatus(Box::new(next.clone())));
    }
    if let Some((stage, job)) = to_create {
        let name = job.name_any();
        steps.push(ReplayStep::CreateJob {
            stage,
            job: Box::new(job),
        });
        steps.push(ReplayStep::RecordJobUid { stage });
        steps.push(ReplayStep::ResumeJob { job: name });
    }
    if let Some(Action::Suspend { job, suspend }) = action {
        steps.push(ReplayStep::SetSuspend {
            job: job.clone(),
            suspend: *suspend,
        });
    }
    if ended(next.phase) && next.audit_config_map.is_none() {
        steps.push(ReplayStep::Archive);
    }
    steps
}

/// The Events the transition from `before` to `after` (both as written) announces.
pub fn announcements(
    requested_by: &str,
    before: &ReplayJobStatus,
    after: &ReplayJobStatus,
) -> Vec<PlannedEvent> {
    let mut events = Vec::new();
    if before.scope.is_none()
        && let Some(scope) = &after.scope
    {
        events.push(PlannedEvent::new(
            false,
            "ScopeFrozen",
            "Replay",
            format!(
                "{} event id(s) frozen in ConfigMap {} (sha256 {})",
                scope.count, scope.config_map, scope.sha256
            ),
        ));
    }
    if after.approved_by != before.approved_by
        && let Some(approver) = &after.approved_by
    {
        let reference = after
            .approval_reference
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        events.push(PlannedEvent::new(
            false,
            "Approved",
            "Replay",
            format!("approved by {approver}{reference}; requested by {requested_by}"),
        ));
    }
    for stage in &after.stages {
        let newly_recorded = stage.job_uid.is_some()
            && before
                .stages
                .iter()
                .find(|s| s.name == stage.name)
                .is_none_or(|s| s.job_uid.is_none());
        if let (true, Some(uid)) = (newly_recorded, &stage.job_uid) {
            let scope = after.scope.as_ref().map_or("-", |s| s.config_map.as_str());
            events.push(PlannedEvent::new(
                false,
                "StageStarted",
                "Replay",
                format!(
                    "{} stage: Job {} (uid {uid}) replays {} event(s) (lines {}-{} of ConfigMap {scope}) in {} batch(es)",
                    stage.name,
                    stage.job,
                    stage.events,
                    stage.first_event + 1,
                    stage.first_event + stage.events,
                    stage.batches
                ),
            ));
        }
    }
    if before.phase != after.phase
        && let Some(phase) = after.phase
    {
        let warning = matches!(
            phase,
            ReplayPhase::Halted | ReplayPhase::Failed | ReplayPhase::Refused
        );
        events.push(PlannedEvent::new(
            warning,
            format!("{phase:?}"),
            "Replay",
            after.message.clone().unwrap_or_default(),
        ));
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::replay_job::{FrozenScope, StageStatus};
    use crate::controller::plan::execute;
    use crate::controller::plan::testing::Recorder;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;

    fn job(name: &str) -> Job {
        Job {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            ..Job::default()
        }
    }

    fn status(phase: ReplayPhase) -> ReplayJobStatus {
        ReplayJobStatus {
            phase: Some(phase),
            ..ReplayJobStatus::default()
        }
    }

    fn kinds(steps: &[ReplayStep]) -> Vec<&'static str> {
        steps
            .iter()
            .map(|s| match s {
                ReplayStep::WriteStatus(_) => "WriteStatus",
                ReplayStep::CreateJob { .. } => "CreateJob",
                ReplayStep::RecordJobUid { .. } => "RecordJobUid",
                ReplayStep::ResumeJob { .. } => "ResumeJob",
                ReplayStep::SetSuspend { .. } => "SetSuspend",
                ReplayStep::Archive => "Archive",
            })
            .collect()
    }

    fn start_plan() -> Vec<ReplayStep> {
        plan(
            &status(ReplayPhase::Approved),
            &status(ReplayPhase::Canary),
            None,
            Some((StageName::Canary, job("orders-canary-1"))),
        )
    }

    #[tokio::test]
    async fn a_start_records_before_it_creates_and_creates_before_it_resumes() {
        let steps = start_plan();
        assert_eq!(
            kinds(&steps),
            ["WriteStatus", "CreateJob", "RecordJobUid", "ResumeJob"]
        );
        // Whichever step fails, nothing after it that depends on it runs: no Job without a
        // recorded start, no running Job without a recorded uid.
        for (failing, ran) in [
            (0, vec![]),
            (1, vec!["WriteStatus"]),
            (2, vec!["WriteStatus", "CreateJob"]),
        ] {
            let recorder = Recorder::failing([failing]);
            let executed = execute(&steps, &recorder).await;
            assert_eq!(kinds(&recorder.performed()), ran, "step {failing} failed");
            assert_eq!(executed.failure.map(|(i, _)| i), Some(failing));
        }
        // A resume that failed fails the pass, after everything else ran; the Job stays
        // suspended until the next pass resumes it.
        let recorder = Recorder::failing([3]);
        let executed = execute(&steps, &recorder).await;
        assert_eq!(
            kinds(&recorder.performed()),
            ["WriteStatus", "CreateJob", "RecordJobUid"]
        );
        assert!(executed.into_result().is_err());
    }

    #[tokio::test]
    async fn a_halt_is_written_before_the_job_is_suspended_and_archived_last() {
        let halted = status(ReplayPhase::Halted);
        let action = Action::Suspend {
            job: "orders-main-1".into(),
            suspend: true,
        };
        let steps = plan(&status(ReplayPhase::Running), &halted, Some(&action), None);
        assert_eq!(kinds(&steps), ["WriteStatus", "SetSuspend", "Archive"]);
        let recorder = Recorder::failing([0]);
        execute(&steps, &recorder).await;
        assert!(
            recorder.performed().is_empty(),
            "nothing without the written halt"
        );
        // Archived once: a status that records the archive plans none.
        let mut archived = halted.clone();
        archived.audit_config_map = Some("orders-audit-x".into());
        assert!(plan(&archived, &archived, None, None).is_empty());
    }

    #[test]
    fn an_unchanged_status_is_not_written() {
        let same = status(ReplayPhase::AwaitingApproval);
        assert!(plan(&same, &same, None, None).is_empty());
    }

    #[test]
    fn transitions_announce_what_the_written_status_shows() {
        let before = status(ReplayPhase::Approved);
        let mut after = status(ReplayPhase::Canary);
        after.scope = Some(FrozenScope {
            config_map: "orders-scope-1".into(),
            config_map_uid: None,
            count: 3,
            sha256: "5e3c".into(),
            frozen_at: Time(Timestamp::UNIX_EPOCH),
        });
        after.approved_by = Some("bob".into());
        let stage = StageStatus {
            name: "canary".into(),
            job: "orders-canary-1".into(),
            job_uid: None,
            batches: 1,
            first_event: 0,
            events: 2,
            batch_size: 2,
            first_batch: 0,
            started_at: Some(Time(Timestamp::UNIX_EPOCH)),
            finished_at: None,
            succeeded: 0,
            failed: 0,
        };
        after.stages = vec![stage.clone()];
        let reasons = |events: Vec<PlannedEvent>| -> Vec<String> {
            events.into_iter().map(|e| e.reason).collect()
        };
        // The start is recorded, the Job not yet: no StageStarted.
        assert_eq!(
            reasons(announcements("alice", &before, &after)),
            ["ScopeFrozen", "Approved", "Canary"]
        );
        // Its uid recorded: StageStarted, once.
        let mut recorded = after.clone();
        recorded.stages[0].job_uid = Some("job-1".into());
        let started = announcements("alice", &after, &recorded);
        assert_eq!(reasons(started.clone()), ["StageStarted"]);
        assert!(started[0].note.contains("uid job-1") && started[0].note.contains("lines 1-2"));
        assert!(announcements("alice", &recorded, &recorded).is_empty());
        // Ends that need a person are warnings.
        let halted = announcements("alice", &recorded, &status(ReplayPhase::Halted));
        assert!(
            halted
                .iter()
                .any(|e| e.reason == "Halted"
                    && e.type_ == kube::runtime::events::EventType::Warning)
        );
    }
}
