//! The status after a decision (pure): the audit trail — who asked, who approved and when, each
//! stage's Job and times, batches done and failed, check results — and the conditions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::api::conditions::merge_conditions;
use crate::api::replay_job::{CheckStatus, FrozenScope, ReplayJob, ReplayJobStatus};
use crate::core::replay_plan::{
    BatchPlan, CheckOutcome, CheckResult, Decision, StageName, operation_id, stages,
};

use super::facts::stage_status;

fn check_status(outcome: &CheckOutcome) -> CheckStatus {
    let (value, result, message) = match &outcome.result {
        CheckResult::Holds(v) => (Some(*v), "Holds", None),
        CheckResult::Fails(v) => (Some(*v), "Fails", None),
        CheckResult::Unknown(why) => (None, "Unknown", Some(why.clone())),
    };
    CheckStatus {
        name: outcome.name.clone(),
        value,
        result: result.to_owned(),
        message,
    }
}

/// Everything the next status needs besides the decision.
pub struct StatusInputs<'a> {
    pub replay: &'a ReplayJob,
    pub uid: &'a str,
    pub scope: Option<&'a FrozenScope>,
    pub plan: Option<BatchPlan>,
    /// The approver, if the approval counts.
    pub approver: Option<&'a str>,
    /// What an approval must name for the spec of this status's generation.
    pub spec_sha256: &'a str,
    pub now: Timestamp,
}

/// The status after `decision`.
pub fn next(
    previous: &ReplayJobStatus,
    inputs: &StatusInputs,
    decision: &Decision,
) -> ReplayJobStatus {
    let spec = &inputs.replay.spec;
    let generation = inputs.replay.metadata.generation;
    let started = decision.stages.iter().any(|s| s.started_at.is_some());

    // The approval is part of the audit trail from the start on: it no longer follows the spec.
    let (approved_by, approved_at, approval_reference) =
        if started && previous.approved_by.is_some() {
            (
                previous.approved_by.clone(),
                previous.approved_at.clone(),
                previous.approval_reference.clone(),
            )
        } else {
            match inputs.approver {
                Some(approver) => (
                    Some(approver.to_owned()),
                    match (&previous.approved_by, &previous.approved_at) {
                        (Some(before), Some(at)) if before == approver => Some(at.clone()),
                        _ => Some(Time(inputs.now)),
                    },
                    spec.approval.as_ref().and_then(|a| a.reference.clone()),
                ),
                None => (None, None, None),
            }
        };

    let batches_total = if decision.stages.is_empty() {
        match (inputs.scope, inputs.plan) {
            (Some(scope), Some(plan)) => Some(
                stages(u32::try_from(scope.count).unwrap_or(0), plan)
                    .iter()
                    .map(|s| s.batches())
                    .sum::<u32>(),
            ),
            _ => None,
        }
    } else {
        Some(decision.stages.iter().map(|s| s.stage.batches()).sum())
    };
    let sum = |of: fn(&crate::core::replay_plan::StageRecord) -> u32| {
        decision.stages.iter().map(of).sum::<u32>()
    };
    let to_i32 = |value: u32| i32::try_from(value).unwrap_or(i32::MAX);

    let ended = super::ended(Some(decision.phase));
    ReplayJobStatus {
        // The trail written when the replay ended; a replay that runs again (a refused
        // template fixed and approved anew) writes another when it ends again.
        audit_config_map: previous.audit_config_map.clone().filter(|_| ended),
        observed_generation: generation,
        phase: Some(decision.phase),
        message: Some(decision.message.clone()),
        operation_id: Some(operation_id(inputs.uid)),
        scope: inputs.scope.cloned().or_else(|| previous.scope.clone()),
        // Paired with observed_generation in the same write: the admission policy trusts it
        // only when that is the generation being approved.
        spec_sha256: Some(inputs.spec_sha256.to_owned()),
        requested_by: Some(spec.requested_by.clone()),
        approved_by,
        approved_at,
        approval_reference,
        batches_total: batches_total.map(to_i32),
        batches_succeeded: Some(to_i32(sum(|s| s.succeeded))),
        batches_failed: Some(to_i32(sum(|s| s.failed))),
        stages: decision.stages.iter().map(stage_status).collect(),
        verification: match &decision.checks {
            Some(checks) => checks.iter().map(check_status).collect(),
            None => previous.verification.clone(),
        },
        conditions: merge_conditions(
            &previous.conditions,
            &decision.conditions,
            generation,
            inputs.now,
        ),
    }
}

/// `status` with the uid of the stage's Job, as the API server answered the create.
pub fn with_job_uid(status: &ReplayJobStatus, stage: StageName, uid: &str) -> ReplayJobStatus {
    let mut recorded = status.clone();
    for record in recorded
        .stages
        .iter_mut()
        .filter(|s| s.name == stage.as_str())
    {
        record.job_uid = Some(uid.to_owned());
    }
    recorded
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::replay_job::{ReplayJobSpec, ReplayPhase};
    use crate::core::replay_plan::{
        ApprovalProblem, QueueState, ReplayFacts, ScopeFacts, decide, scope_config_map_name,
    };

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn replay() -> ReplayJob {
        let spec: ReplayJobSpec = serde_json::from_value(serde_json::json!({
            "source": {"queue": "q"},
            "scope": {"eventIds": ["a", "b", "c"]},
            "reason": "r",
            "requestedBy": "alice",
            "approval": {"approvedBy": "bob", "reference": "CHG-1", "scopeSha256": "0000000000000000000000000000000000000000000000000000000000000000", "specSha256": "0000000000000000000000000000000000000000000000000000000000000000"},
            "batches": {"size": 2, "canary": 1, "ratePerSecond": 1},
            "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}},
        }))
        .unwrap();
        let mut replay = ReplayJob::new("r", spec);
        replay.metadata.generation = Some(2);
        replay
    }

    fn scope() -> FrozenScope {
        FrozenScope {
            config_map: scope_config_map_name("r", "uid"),
            config_map_uid: Some("cm-uid".into()),
            count: 3,
            sha256: "s".into(),
            frozen_at: Time(at(0)),
        }
    }

    fn facts(approval: Result<String, ApprovalProblem>, now: Timestamp) -> ReplayFacts {
        ReplayFacts {
            replay: "r".into(),
            uid: "uid".into(),
            source_queue: "q".into(),
            scope: ScopeFacts::Frozen {
                count: 3,
                config_map: scope().config_map,
                sha256: "s".into(),
            },
            plan: Ok(BatchPlan { canary: 1, size: 2 }),
            approval,
            recorded_approver: None,
            suspend: false,
            stages: vec![],
            jobs: vec![],
            halted: None,
            failed: None,
            verified: false,
            has_checks: false,
            verification_delay: std::time::Duration::ZERO,
            verification: None,
            queue: Some(QueueState::Free),
            rejected: None,
            refused: Vec::new(),
            pacing: crate::core::replay_plan::Pacing {
                rate_per_second: 1.0,
                pause_between_seconds: 0.0,
                retries_per_batch: 0,
            },
            scope_check: Some(crate::core::replay_plan::ScopeCheck::Intact),
            uid_unrecorded: Vec::new(),
            now,
        }
    }

    #[test]
    fn the_audit_trail_keeps_the_approval_time_and_the_plan() {
        let replay = replay();
        let scope = scope();
        let inputs = |now| StatusInputs {
            replay: &replay,
            uid: "uid",
            scope: Some(&scope),
            plan: Some(BatchPlan { canary: 1, size: 2 }),
            approver: Some("bob"),
            spec_sha256: "5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef",
            now,
        };
        let first = decide(&facts(Ok("bob".into()), at(10)));
        let status = next(&ReplayJobStatus::default(), &inputs(at(10)), &first);
        assert_eq!(status.phase, Some(ReplayPhase::Canary));
        assert_eq!(status.approved_by.as_deref(), Some("bob"));
        assert_eq!(status.approved_at, Some(Time(at(10))));
        assert_eq!(status.approval_reference.as_deref(), Some("CHG-1"));
        assert_eq!(status.requested_by.as_deref(), Some("alice"));
        assert_eq!(status.operation_id.as_deref(), Some("replay-uid"));
        assert_eq!(
            status.spec_sha256.as_deref(),
            Some("5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef")
        );
        assert_eq!(status.batches_total, Some(2));
        assert_eq!(status.stages.len(), 2);
        assert!(status.stages[0].started_at.is_some());
        // The same decision later is no news: nothing to write.
        let again = next(&status, &inputs(at(20)), &first);
        assert_eq!(again, status);
    }

    #[test]
    fn before_the_start_the_approval_follows_the_spec() {
        let replay = replay();
        let scope = scope();
        let waiting = decide(&facts(
            Err(ApprovalProblem::Missing {
                requested_by: "alice".into(),
            }),
            at(10),
        ));
        let inputs = StatusInputs {
            replay: &replay,
            uid: "uid",
            scope: Some(&scope),
            plan: Some(BatchPlan { canary: 1, size: 2 }),
            approver: None,
            spec_sha256: "5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef",
            now: at(10),
        };
        let status = next(&ReplayJobStatus::default(), &inputs, &waiting);
        assert_eq!(status.phase, Some(ReplayPhase::AwaitingApproval));
        assert_eq!(status.approved_by, None);
        assert_eq!(status.batches_total, Some(2));
        assert!(status.stages.is_empty());
    }
}
