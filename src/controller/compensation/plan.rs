//! What a compensation's decision does, as steps in order (pure), and the Events a status
//! transition announces (pure). The order is what runs the worker once whatever fails or
//! whenever the operator stops: the start is recorded before the Job is created, the Job is
//! created suspended and resumed only once its uid is recorded, and the result an id's
//! duplicates point at exists before the end is written.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;

use crate::api::compensation::{CompensationPhase, CompensationStatus};
use crate::controller::plan::{OnFailure, PlannedEvent, Step};
use crate::core::compensation_plan::Action;

/// One side effect of a compensation's pass.
#[derive(Clone, Debug, PartialEq)]
pub enum CompensationStep {
    /// Claim the compensationId with the frozen request (a plain create: the first wins).
    CreateClaim(Box<ConfigMap>),
    /// Apply the status onto the version the decision was made from.
    WriteStatus(Box<CompensationStatus>),
    /// Create the worker's Job, suspended (its start is recorded already).
    CreateJob(Box<Job>),
    /// Record the uid the create answered with, onto the status as last written.
    RecordJobUid,
    /// Let the Job run: only once its uid is recorded.
    ResumeJob(String),
    /// Keep the end for duplicates and the audit (a plain create, once).
    CreateResult(Box<ConfigMap>),
}

impl Step for CompensationStep {
    fn on_failure(&self) -> OnFailure {
        match self {
            // Recorded and suspended, the Job runs nothing until a later pass resumes it.
            CompensationStep::ResumeJob(_) => OnFailure::Defer,
            _ => OnFailure::Stop,
        }
    }
}

/// What the shell built for the plan: the claim to create, the Job to create, the result.
pub struct Built {
    pub claim: Option<ConfigMap>,
    pub job: Option<Job>,
    pub result: Option<ConfigMap>,
}

/// Whether `next` writes an end (other than a duplicate's) for the first time: the pass that
/// keeps the result.
pub fn ends(previous: &CompensationStatus, next: &CompensationStatus) -> bool {
    next.phase.is_some_and(|p| p.terminal())
        && next.phase != Some(CompensationPhase::Duplicate)
        && previous.phase != next.phase
}

/// The steps of one pass.
pub fn plan(
    previous: &CompensationStatus,
    next: &CompensationStatus,
    action: Option<&Action>,
    built: Built,
) -> Vec<CompensationStep> {
    let mut steps = Vec::new();
    if let (Some(Action::Freeze), Some(claim)) = (action, built.claim) {
        // The next pass reads whose the claim is, and writes the status then.
        steps.push(CompensationStep::CreateClaim(Box::new(claim)));
        return steps;
    }
    if let (true, Some(result)) = (ends(previous, next), built.result) {
        steps.push(CompensationStep::CreateResult(Box::new(result)));
    }
    if next != previous {
        steps.push(CompensationStep::WriteStatus(Box::new(next.clone())));
    }
    match (action, built.job) {
        (Some(Action::Start), Some(job)) => {
            let name = job.metadata.name.clone().unwrap_or_default();
            steps.push(CompensationStep::CreateJob(Box::new(job)));
            steps.push(CompensationStep::RecordJobUid);
            steps.push(CompensationStep::ResumeJob(name));
        }
        (Some(Action::Resume { .. }), _) => {
            if let Some(job) = &next.job {
                steps.push(CompensationStep::ResumeJob(job.clone()));
            }
        }
        _ => {}
    }
    steps
}

/// The Events the transition from `before` to `after` (both as written) announces.
pub fn announcements(before: &CompensationStatus, after: &CompensationStatus) -> Vec<PlannedEvent> {
    let mut events = Vec::new();
    if before.request.is_none()
        && let Some(request) = &after.request
    {
        events.push(PlannedEvent::new(
            false,
            "RequestFrozen",
            "Compensation",
            format!(
                "request frozen in ConfigMap {} (sha256 {})",
                request.config_map, request.sha256
            ),
        ));
    }
    if before.job_uid.is_none()
        && let (Some(job), Some(uid)) = (&after.job, &after.job_uid)
    {
        events.push(PlannedEvent::new(
            false,
            "WorkerStarted",
            "Compensation",
            format!(
                "Job {job} (uid {uid}) runs the worker, approved by {}",
                after.approved_by.as_deref().unwrap_or("-")
            ),
        ));
    }
    if before.phase != after.phase
        && let Some(phase) = after.phase
    {
        let warning = matches!(
            phase,
            CompensationPhase::Refused
                | CompensationPhase::PreconditionFailed
                | CompensationPhase::Unknown
                | CompensationPhase::Failed
        );
        events.push(PlannedEvent::new(
            warning,
            format!("{phase:?}"),
            "Compensation",
            after.message.clone().unwrap_or_default(),
        ));
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::plan::execute;
    use crate::controller::plan::testing::Recorder;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn status(phase: CompensationPhase) -> CompensationStatus {
        CompensationStatus {
            phase: Some(phase),
            ..CompensationStatus::default()
        }
    }

    fn named<T: Default>(name: &str, meta: impl FnOnce(&mut T) -> &mut ObjectMeta) -> T {
        let mut object = T::default();
        meta(&mut object).name = Some(name.to_owned());
        object
    }

    fn built() -> Built {
        Built {
            claim: Some(named::<ConfigMap>("compensation-1", |c| &mut c.metadata)),
            job: Some(named::<Job>("compensation-1", |j| &mut j.metadata)),
            result: Some(named::<ConfigMap>("compensation-1-result", |c| {
                &mut c.metadata
            })),
        }
    }

    fn kinds(steps: &[CompensationStep]) -> Vec<&'static str> {
        steps
            .iter()
            .map(|s| match s {
                CompensationStep::CreateClaim(_) => "CreateClaim",
                CompensationStep::WriteStatus(_) => "WriteStatus",
                CompensationStep::CreateJob(_) => "CreateJob",
                CompensationStep::RecordJobUid => "RecordJobUid",
                CompensationStep::ResumeJob(_) => "ResumeJob",
                CompensationStep::CreateResult(_) => "CreateResult",
            })
            .collect()
    }

    #[tokio::test]
    async fn the_worker_starts_only_after_its_start_and_its_uid_are_recorded() {
        let mut started = status(CompensationPhase::Executing);
        started.job = Some("compensation-1".into());
        let steps = plan(
            &status(CompensationPhase::AwaitingApproval),
            &started,
            Some(&Action::Start),
            built(),
        );
        assert_eq!(
            kinds(&steps),
            ["WriteStatus", "CreateJob", "RecordJobUid", "ResumeJob"]
        );
        for (failing, ran) in [
            (0, vec![]),
            (1, vec!["WriteStatus"]),
            (2, vec!["WriteStatus", "CreateJob"]),
        ] {
            let recorder = Recorder::failing([failing]);
            execute(&steps, &recorder).await;
            assert_eq!(kinds(&recorder.performed()), ran, "step {failing} failed");
        }
        // A Job found after a restart: its uid is written with the status, then it runs.
        let steps = plan(
            &started,
            &CompensationStatus {
                job_uid: Some("job-1".into()),
                ..started.clone()
            },
            Some(&Action::Resume {
                uid: "job-1".into(),
            }),
            built(),
        );
        assert_eq!(kinds(&steps), ["WriteStatus", "ResumeJob"]);
        let recorder = Recorder::failing([0]);
        execute(&steps, &recorder).await;
        assert!(recorder.performed().is_empty());
    }

    #[tokio::test]
    async fn the_result_exists_before_the_end_is_written() {
        let steps = plan(
            &status(CompensationPhase::Executing),
            &status(CompensationPhase::Unknown),
            None,
            built(),
        );
        assert_eq!(kinds(&steps), ["CreateResult", "WriteStatus"]);
        let recorder = Recorder::failing([0]);
        execute(&steps, &recorder).await;
        assert!(recorder.performed().is_empty(), "no end without its result");
        // A duplicate keeps no result of its own; an end already written writes none again.
        let duplicate = status(CompensationPhase::Duplicate);
        assert_eq!(
            kinds(&plan(
                &CompensationStatus::default(),
                &duplicate,
                None,
                built()
            )),
            ["WriteStatus"]
        );
        let ended = status(CompensationPhase::Succeeded);
        assert!(plan(&ended, &ended, None, built()).is_empty());
    }

    #[test]
    fn a_claim_is_made_alone() {
        let steps = plan(
            &CompensationStatus::default(),
            &status(CompensationPhase::AwaitingApproval),
            Some(&Action::Freeze),
            built(),
        );
        assert_eq!(kinds(&steps), ["CreateClaim"]);
    }

    #[test]
    fn transitions_announce_what_the_written_status_shows() {
        let before = status(CompensationPhase::AwaitingApproval);
        let mut started = status(CompensationPhase::Executing);
        started.job = Some("compensation-1".into());
        let reasons = |events: Vec<PlannedEvent>| -> Vec<String> {
            events.into_iter().map(|e| e.reason).collect()
        };
        assert_eq!(reasons(announcements(&before, &started)), ["Executing"]);
        let mut recorded = started.clone();
        recorded.job_uid = Some("job-1".into());
        assert_eq!(
            reasons(announcements(&started, &recorded)),
            ["WorkerStarted"]
        );
        let unknown = announcements(&recorded, &status(CompensationPhase::Unknown));
        assert_eq!(unknown[0].type_, kube::runtime::events::EventType::Warning);
    }
}
