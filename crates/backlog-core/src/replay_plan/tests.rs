use std::time::Duration;

use proptest::prelude::*;

use super::machine::job_of;
use super::*;
use crate::condition::Truth;

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(s).unwrap()
}

const UID: &str = "5e3c1a2b-0000-4000-8000-000000000001";

fn plan(canary: u32, size: u32) -> BatchPlan {
    BatchPlan { canary, size }
}

/// A fresh, approved replay of `count` ids that nothing has happened to yet.
fn facts(count: u32) -> ReplayFacts {
    ReplayFacts {
        replay: "orders".into(),
        uid: UID.into(),
        source_queue: "orders.dlq".into(),
        scope: ScopeFacts::Frozen {
            count,
            config_map: scope_config_map_name("orders", UID),
            sha256: "ab".into(),
        },
        plan: Ok(plan(2, 5)),
        approval: Ok("bob".into()),
        recorded_approver: None,
        suspend: false,
        stages: vec![],
        jobs: vec![],
        halted: None,
        failed: None,
        verified: false,
        has_checks: true,
        verification_delay: Duration::ZERO,
        verification: None,
        queue: None,
        rejected: None,
        refused: Vec::new(),
        pacing: PACING,
        scope_check: Some(ScopeCheck::Intact),
        uid_unrecorded: Vec::new(),
        now: at(1000),
    }
}

const PACING: Pacing = Pacing {
    rate_per_second: 5.0,
    pause_between_seconds: 10.0,
    retries_per_batch: 0,
};

/// A Job of the operator's (uid `job-uid`); `set_job` gives it its stage's shape.
fn view(outcome: JobOutcome, succeeded: u32, failed: u32) -> JobView {
    JobView {
        uid: "job-uid".into(),
        suspended: false,
        succeeded,
        failed,
        outcome,
        finished_at: None,
        shape: JobShape::default(),
        owned_by_replay: true,
    }
}

fn holds(name: &str) -> CheckOutcome {
    CheckOutcome {
        name: name.into(),
        query: "q".into(),
        result: CheckResult::Holds(1.0),
    }
}

/// Applies a decision the way the controller does: its stages become the recorded ones, and a
/// started stage's Job appears.
fn apply(mut facts: ReplayFacts, decision: &Decision) -> ReplayFacts {
    facts.stages = decision.stages.clone();
    facts.halted = decision.halt.clone();
    facts.failed = (decision.phase == ReplayPhase::Failed).then(|| decision.message.clone());
    facts.verified = decision
        .conditions
        .iter()
        .any(|c| c.type_ == VERIFIED && c.status == Truth::True);
    if let Some(Action::Start(record)) = &decision.action {
        // The create answered with the Job's uid, which the controller records.
        facts.recorded_approver = facts.approval.clone().ok();
        if let Some(stage) = facts
            .stages
            .iter_mut()
            .find(|s| s.stage.name == record.stage.name)
        {
            stage.job_uid = Some("job-uid".into());
        }
        set_job(
            &mut facts,
            record.stage.name,
            JobObservation::Present(view(JobOutcome::Running, 0, 0)),
        );
    }
    facts.verification = None;
    facts.queue = None;
    facts
}

/// Puts `job` under the stage's name; a Job of a recorded stage gets the shape the operator
/// gives it.
fn set_job(facts: &mut ReplayFacts, stage: StageName, mut job: JobObservation) {
    if let JobObservation::Present(view) = &mut job
        && let Some(record) = facts.stages.iter().find(|s| s.stage.name == stage)
    {
        view.shape = expected_shape(&record.stage, facts.pacing);
    }
    facts.jobs.retain(|(s, _)| *s != stage);
    facts.jobs.push((stage, job));
}

fn reason(decision: &Decision) -> Option<&str> {
    decision.halt.as_ref().map(|h| h.reason.as_str())
}

/// Runs the canary of a 12-id replay (canary 2, size 5) to success and returns the facts.
fn canary_done() -> ReplayFacts {
    let mut f = facts(12);
    f.queue = Some(QueueState::Free);
    let started = decide(&f);
    let mut f = apply(f, &started);
    set_job(
        &mut f,
        StageName::Canary,
        JobObservation::Present(view(JobOutcome::Succeeded, 1, 0)),
    );
    f
}

#[test]
fn stages_cut_the_list_canary_first() {
    let cut = stages(12, plan(2, 5));
    assert_eq!(cut.len(), 2);
    assert_eq!(cut[0].name, StageName::Canary);
    assert_eq!(
        (cut[0].first_event, cut[0].events, cut[0].batches()),
        (0, 2, 1)
    );
    assert_eq!(cut[1].name, StageName::Main);
    assert_eq!(
        (cut[1].first_event, cut[1].events, cut[1].batches()),
        (2, 10, 2)
    );
    assert_eq!(cut[1].lines(1), Some(7..12));
    assert_eq!(cut[1].lines(2), None);
    // Fewer ids than the canary: one stage, no main Job.
    let small = stages(1, plan(2, 5));
    assert_eq!(small.len(), 1);
    assert_eq!(small[0].lines(0), Some(0..1));
    assert!(stages(0, plan(2, 5)).is_empty());
}

#[test]
fn batches_in_order() {
    let ids: Vec<u32> = (0..8).collect();
    let cut = batches(&ids, plan(1, 3));
    assert_eq!(cut, vec![&[0][..], &[1, 2, 3], &[4, 5, 6], &[7]]);
}

#[test]
fn batch_settings_below_one_are_refused() {
    assert!(BatchPlan::new(0, 5).is_err());
    assert!(BatchPlan::new(1, -1).is_err());
    let problem = BatchPlan::new(1, 0).unwrap_err();
    assert!(problem.to_string().contains("spec.batches.size"));
    assert_eq!(BatchPlan::new(1, 5), Ok(plan(1, 5)));
}

#[test]
fn names_are_deterministic_short_and_distinct() {
    let canary = job_name("orders", UID, StageName::Canary);
    assert_eq!(canary, "orders-canary-5e3c1a");
    assert_eq!(canary, job_name("orders", UID, StageName::Canary));
    assert_eq!(
        job_name("orders", UID, StageName::Main),
        "orders-main-5e3c1a"
    );
    assert_eq!(scope_config_map_name("orders", UID), "orders-scope-5e3c1a");
    let long = "a".repeat(80);
    assert!(job_name(&long, UID, StageName::Canary).len() <= 63);
    assert_eq!(operation_id(UID), format!("replay-{UID}"));
}

const SHA: &str = "911169ddaaf146aff539f58c26c489af3b892dff0fe283c1c264c65ae5aa59a2";
const SPEC_SHA: &str = "5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef";

fn claim(approved_by: &str) -> Option<ApprovalClaim<'_>> {
    Some(ApprovalClaim {
        approved_by,
        scope_sha256: SHA,
        spec_sha256: SPEC_SHA,
    })
}

fn frozen() -> Option<FrozenList<'static>> {
    Some(FrozenList {
        sha256: SHA,
        config_map: "orders-scope-5e3c1a",
    })
}

#[test]
fn approvals_need_a_second_person() {
    assert_eq!(
        check_approval("alice", claim("bob"), frozen(), SPEC_SHA),
        Ok("bob".into())
    );
    assert!(matches!(
        check_approval("alice", None, frozen(), SPEC_SHA),
        Err(ApprovalProblem::Missing { .. })
    ));
    assert_eq!(
        check_approval("alice", claim("  "), frozen(), SPEC_SHA),
        Err(ApprovalProblem::Blank)
    );
    for same in ["alice", "Alice", " alice "] {
        assert!(matches!(
            check_approval("alice", claim(same), frozen(), SPEC_SHA),
            Err(ApprovalProblem::SelfApproved { .. })
        ));
    }
    let problem = check_approval("alice", claim("alice"), frozen(), SPEC_SHA).unwrap_err();
    assert!(problem.to_string().contains("spec.approval.approvedBy"));
}

#[test]
fn an_approval_signs_exactly_the_frozen_list() {
    // Given before the freeze, it names no list.
    let early = check_approval("alice", claim("bob"), None, SPEC_SHA).unwrap_err();
    assert_eq!(early, ApprovalProblem::BeforeFreeze);
    assert!(early.to_string().contains("status.scope.sha256"));
    // Another list's sha256 does not count, and the message says which one does.
    let other = Some(ApprovalClaim {
        approved_by: "bob",
        scope_sha256: "00",
        spec_sha256: SPEC_SHA,
    });
    let problem = check_approval("alice", other, frozen(), SPEC_SHA).unwrap_err();
    assert_eq!(problem.reason(), "ScopeMismatch");
    for fragment in ["spec.approval.scopeSha256", SHA, "orders-scope-5e3c1a"] {
        assert!(problem.to_string().contains(fragment), "{problem}");
    }
}

#[test]
fn an_approval_signs_exactly_the_spec_as_it_stands() {
    // The spec was edited after the approver read it: the approval covers the old one only.
    let edited = "0".repeat(64);
    let problem = check_approval("alice", claim("bob"), frozen(), &edited).unwrap_err();
    assert_eq!(problem.reason(), "SpecChangedSinceReview");
    for fragment in [
        "spec.approval.specSha256",
        SPEC_SHA,
        edited.as_str(),
        "status.specSha256",
    ] {
        assert!(problem.to_string().contains(fragment), "{problem}");
    }
    // The list is checked first: a wrong list is named as such, whatever the spec.
    let other = Some(ApprovalClaim {
        approved_by: "bob",
        scope_sha256: "00",
        spec_sha256: "11",
    });
    let problem = check_approval("alice", other, frozen(), SPEC_SHA).unwrap_err();
    assert_eq!(problem.reason(), "ScopeMismatch");
}

#[test]
fn index_lists_are_counted() {
    assert_eq!(count_indexes(""), Ok(0));
    assert_eq!(count_indexes("0"), Ok(1));
    assert_eq!(count_indexes("1,3-5"), Ok(4));
    assert_eq!(count_indexes("0-9"), Ok(10));
    assert!(count_indexes("5-3").is_err());
    assert!(count_indexes("x").is_err());
}

#[test]
fn check_results_need_exactly_one_sample() {
    let query = "sum(errors_total) == bool 0";
    assert_eq!(
        check_result(query, &Observation::Samples(vec![1.0])),
        CheckResult::Holds(1.0)
    );
    assert_eq!(
        check_result(query, &Observation::Samples(vec![0.0])),
        CheckResult::Fails(0.0)
    );
    for unknown in [
        Observation::Samples(vec![]),
        Observation::Samples(vec![1.0, 1.0]),
        Observation::Samples(vec![f64::NAN]),
        Observation::Failed("down".into()),
    ] {
        assert!(matches!(
            check_result(query, &unknown),
            CheckResult::Unknown(_)
        ));
    }
}

#[test]
fn an_empty_result_of_a_comparison_without_bool_says_to_add_it() {
    let empty = Observation::Samples(vec![]);
    let CheckResult::Unknown(why) = check_result("sum(errors_total) == 0", &empty) else {
        panic!("an empty result is no answer");
    };
    assert!(why.contains("== bool 0"), "{why}");
    let CheckResult::Unknown(why) = check_result("sum(errors_total) == bool 0", &empty) else {
        panic!("an empty result is no answer");
    };
    assert!(!why.contains("bool"), "{why}");
}

#[test]
fn comparisons_without_bool_are_told_from_label_matchers_and_strings() {
    for query in [
        "sum(x) == 0",
        "sum(x)==0",
        "sum(rate(x[5m])) > 0.5",
        "max(up{job=\"a\"}) < 1",
        "sum(x) >= bool 1 and sum(y) != 0",
    ] {
        assert!(compares_without_bool(query), "{query}");
    }
    for query in [
        "sum(x) == bool 0",
        "sum(x)==bool 0",
        "sum(up{job!=\"a\", env=~\"p.*\"}) > bool 0",
        "sum(x{msg=\"a > b\"})",
        "sum(rate(x[5m]))",
        "label_replace(x, \"a\", \"<\", \"b\", \"c\")",
    ] {
        assert!(!compares_without_bool(query), "{query}");
    }
}

#[test]
fn the_queue_goes_to_the_active_replay_then_the_oldest_waiting_one() {
    let member = |key: &str, created, active, queued| QueueMember {
        key: key.into(),
        created: at(created),
        active,
        queued,
    };
    assert_eq!(queue_state("ns/b", at(20), &[]), QueueState::Free);
    assert_eq!(
        queue_state("ns/b", at(20), &[member("ns/a", 30, true, false)]),
        QueueState::Busy {
            holder: "ns/a".into(),
            active: true
        }
    );
    // An older replay waiting goes first; a younger one does not hold this one back.
    assert_eq!(
        queue_state("ns/b", at(20), &[member("ns/a", 10, false, true)]),
        QueueState::Busy {
            holder: "ns/a".into(),
            active: false
        }
    );
    assert_eq!(
        queue_state("ns/b", at(20), &[member("ns/c", 30, false, true)]),
        QueueState::Free
    );
    // The same age: the name decides, so both sides agree.
    assert_eq!(
        queue_state("ns/b", at(20), &[member("ns/a", 20, false, true)]),
        QueueState::Busy {
            holder: "ns/a".into(),
            active: false
        }
    );
    assert_eq!(
        queue_state("ns/a", at(20), &[member("ns/b", 20, false, true)]),
        QueueState::Free
    );
    // Itself is never in the way.
    assert_eq!(
        queue_state("ns/b", at(20), &[member("ns/b", 20, true, false)]),
        QueueState::Free
    );
}

#[test]
fn without_approval_nothing_starts() {
    let mut f = facts(12);
    f.approval = Err(ApprovalProblem::Missing {
        requested_by: "alice".into(),
    });
    f.queue = Some(QueueState::Free);
    let decision = decide(&f);
    assert_eq!(decision.phase, ReplayPhase::AwaitingApproval);
    assert_eq!(decision.action, None);
    assert!(decision.message.contains("spec.approval.approvedBy"));
    let approved = decision
        .conditions
        .iter()
        .find(|c| c.type_ == APPROVED)
        .unwrap();
    assert_eq!(approved.status, Truth::False);
}

#[test]
fn an_approved_replay_asks_for_the_queue_then_starts_the_canary() {
    let f = facts(12);
    let asked = decide(&f);
    assert_eq!(asked.need, Some(Need::Queue));
    assert_eq!(asked.action, None);
    assert_eq!(asked.phase, ReplayPhase::Approved);

    let mut f = f;
    f.queue = Some(QueueState::Free);
    let decision = decide(&f);
    assert_eq!(decision.phase, ReplayPhase::Canary);
    let Some(Action::Start(record)) = &decision.action else {
        panic!("no start: {decision:?}");
    };
    assert_eq!(record.stage.name, StageName::Canary);
    assert_eq!(record.job, "orders-canary-5e3c1a");
    assert_eq!(record.started_at, Some(at(1000)));
    // Both stages are recorded, only the canary started.
    assert_eq!(decision.stages.len(), 2);
    assert!(decision.stages[1].started_at.is_none());
}

#[test]
fn a_busy_queue_makes_the_replay_wait_naming_the_holder() {
    let mut f = facts(12);
    f.queue = Some(QueueState::Busy {
        holder: "team/first".into(),
        active: true,
    });
    let decision = decide(&f);
    assert_eq!(decision.phase, ReplayPhase::Approved);
    assert_eq!(decision.action, None);
    let waiting = decision
        .conditions
        .iter()
        .find(|c| c.type_ == WAITING)
        .unwrap();
    assert_eq!(waiting.status, Truth::True);
    assert!(
        waiting.message.contains("team/first"),
        "{}",
        waiting.message
    );
    assert_eq!(decision.recheck_after, Some(WAIT_RETRY));
}

#[test]
fn the_canary_succeeds_verification_holds_and_the_main_stage_starts() {
    let f = canary_done();
    let asked = decide(&f);
    assert_eq!(asked.phase, ReplayPhase::Verifying);
    assert_eq!(asked.need, Some(Need::Verification));
    assert!(asked.stages[0].finished_at.is_some());

    let mut f = f;
    f.verification = Some(vec![holds("dups")]);
    let decision = decide(&f);
    assert_eq!(decision.phase, ReplayPhase::Running);
    let Some(Action::Start(main)) = &decision.action else {
        panic!("no main start: {decision:?}");
    };
    assert_eq!(main.stage.name, StageName::Main);
    assert_eq!(main.stage.first_event, 2);

    // The main Job succeeds: the replay succeeded.
    let mut f = apply(f, &decision);
    assert!(f.verified);
    set_job(
        &mut f,
        StageName::Main,
        JobObservation::Present(view(JobOutcome::Succeeded, 2, 0)),
    );
    let done = decide(&f);
    assert_eq!(done.phase, ReplayPhase::Succeeded);
    assert_eq!(done.action, None);
    assert!(done.stages.iter().all(|s| s.finished_at.is_some()));
}

#[test]
fn a_failed_canary_halts_without_a_main_stage() {
    let mut f = facts(12);
    f.queue = Some(QueueState::Free);
    let started = decide(&f);
    let mut f = apply(f, &started);
    set_job(
        &mut f,
        StageName::Canary,
        JobObservation::Present(view(
            JobOutcome::Failed("MaxFailedIndexesExceeded".into()),
            0,
            1,
        )),
    );
    let decision = decide(&f);
    assert_eq!(decision.phase, ReplayPhase::Halted);
    assert_eq!(decision.action, None);
    let halt = decision.halt.clone().unwrap();
    assert_eq!(halt.reason, "BatchFailed");
    assert!(halt.message.contains("batch 0"), "{}", halt.message);
    assert!(halt.message.contains("line 1"), "{}", halt.message);
    // Later reconciles: still halted, whatever happens.
    let mut f = apply(f, &decision);
    f.queue = Some(QueueState::Free);
    let again = decide(&f);
    assert_eq!(again.phase, ReplayPhase::Halted);
    assert_eq!(again.action, None);
}

#[test]
fn a_failed_check_halts_without_a_main_stage() {
    let mut f = canary_done();
    f.verification = Some(vec![
        holds("a"),
        CheckOutcome {
            name: "dups".into(),
            query: "sum(dups) == bool 0".into(),
            result: CheckResult::Fails(0.0),
        },
    ]);
    let decision = decide(&f);
    assert_eq!(decision.phase, ReplayPhase::Halted);
    assert_eq!(decision.action, None);
    assert_eq!(decision.halt.as_ref().unwrap().reason, "VerificationFailed");
    assert!(decision.message.contains("\"dups\""));
    let verified = decision
        .conditions
        .iter()
        .find(|c| c.type_ == VERIFIED)
        .unwrap();
    assert_eq!(verified.status, Truth::False);
}

/// A replay whose canary Job succeeded and whose status records its end at 1000 s.
fn canary_ended_at_1000() -> ReplayFacts {
    let mut f = canary_done();
    f.stages[0].finished_at = Some(at(1000));
    f.jobs.clear();
    set_job(
        &mut f,
        StageName::Canary,
        JobObservation::Present(view(JobOutcome::Succeeded, 1, 0)),
    );
    f
}

#[test]
fn checks_without_an_answer_are_retried_then_halt() {
    let mut f = canary_ended_at_1000();
    f.verification = Some(vec![CheckOutcome {
        name: "dups".into(),
        query: "q".into(),
        result: CheckResult::Unknown("no sample".into()),
    }]);
    f.now = at(1010);
    let waiting = decide(&f);
    assert_eq!(waiting.phase, ReplayPhase::Verifying);
    assert_eq!(waiting.action, None);
    assert_eq!(waiting.recheck_after, Some(VERIFICATION_RETRY));
    f.now = at(1000 + VERIFICATION_PATIENCE.as_secs() as i64);
    let halted = decide(&f);
    assert_eq!(halted.phase, ReplayPhase::Halted);
    assert_eq!(halted.halt.unwrap().reason, "VerificationUnavailable");
}

#[test]
fn checks_wait_until_the_canarys_effects_can_be_in_the_metrics() {
    let mut f = canary_ended_at_1000();
    f.verification_delay = Duration::from_secs(30);
    let holds = vec![CheckOutcome {
        name: "dups".into(),
        query: "q".into(),
        result: CheckResult::Holds(1.0),
    }];
    // Within the delay a check is not asked, and an answer at hand (from before the canary's
    // effects could show) decides nothing.
    for answer in [None, Some(holds.clone())] {
        f.verification = answer;
        f.now = at(1010);
        let settling = decide(&f);
        assert_eq!(settling.phase, ReplayPhase::Verifying);
        assert_eq!((settling.need, settling.action), (None, None));
        assert_eq!(settling.checks, None);
        assert_eq!(settling.recheck_after, Some(Duration::from_secs(20)));
        assert!(
            settling.message.contains("spec.verificationDelay"),
            "{}",
            settling.message
        );
    }
    // From the delay on, the checks are asked and decide.
    f.verification = None;
    f.now = at(1030);
    assert_eq!(decide(&f).need, Some(Need::Verification));
    f.verification = Some(holds);
    assert!(matches!(
        decide(&f).action,
        Some(Action::Start(ref r)) if r.stage.name == StageName::Main
    ));
    // The patience for an answer counts from the end of the delay.
    f.verification = Some(vec![CheckOutcome {
        name: "dups".into(),
        query: "q".into(),
        result: CheckResult::Unknown("no sample".into()),
    }]);
    f.now = at(1000 + VERIFICATION_PATIENCE.as_secs() as i64 + 29);
    assert_eq!(decide(&f).phase, ReplayPhase::Verifying);
    f.now = at(1000 + VERIFICATION_PATIENCE.as_secs() as i64 + 30);
    assert_eq!(decide(&f).phase, ReplayPhase::Halted);
}

#[test]
fn without_checks_the_canary_alone_decides() {
    let mut f = canary_done();
    f.has_checks = false;
    let decision = decide(&f);
    assert_eq!(decision.need, None);
    assert!(
        matches!(decision.action, Some(Action::Start(ref r)) if r.stage.name == StageName::Main)
    );
}

#[test]
fn a_replay_smaller_than_the_canary_ends_with_the_canary() {
    let mut f = facts(2);
    f.queue = Some(QueueState::Free);
    f.has_checks = false;
    let started = decide(&f);
    assert_eq!(started.stages.len(), 1);
    let mut f = apply(f, &started);
    set_job(
        &mut f,
        StageName::Canary,
        JobObservation::Present(view(JobOutcome::Succeeded, 1, 0)),
    );
    assert_eq!(decide(&f).phase, ReplayPhase::Succeeded);
}

#[test]
fn suspend_suspends_the_running_job_and_resume_resumes_it() {
    let mut f = facts(12);
    f.queue = Some(QueueState::Free);
    let started = decide(&f);
    let mut f = apply(f, &started);
    f.suspend = true;
    let suspended = decide(&f);
    assert_eq!(suspended.phase, ReplayPhase::Suspended);
    assert_eq!(
        suspended.action,
        Some(Action::Suspend {
            job: "orders-canary-5e3c1a".into(),
            suspend: true
        })
    );
    let mut job = view(JobOutcome::Running, 0, 0);
    job.suspended = true;
    set_job(&mut f, StageName::Canary, JobObservation::Present(job));
    assert_eq!(decide(&f).action, None);
    f.suspend = false;
    let resumed = decide(&f);
    assert_eq!(resumed.phase, ReplayPhase::Canary);
    assert_eq!(
        resumed.action,
        Some(Action::Suspend {
            job: "orders-canary-5e3c1a".into(),
            suspend: false
        })
    );
}

#[test]
fn a_suspended_replay_does_not_start() {
    let mut f = facts(12);
    f.suspend = true;
    f.queue = Some(QueueState::Free);
    let decision = decide(&f);
    assert_eq!(decision.phase, ReplayPhase::Suspended);
    assert_eq!(decision.action, None);
    let mut f = canary_done();
    f.suspend = true;
    f.verification = Some(vec![holds("a")]);
    let decision = decide(&f);
    assert_eq!(decision.phase, ReplayPhase::Suspended);
    assert_eq!(decision.action, None);
}

#[test]
fn a_stage_recorded_without_a_job_is_created_under_the_same_name() {
    let mut f = facts(12);
    f.queue = Some(QueueState::Free);
    let started = decide(&f);
    // The start was recorded, then the operator stopped before the create (or its Job, created
    // suspended, was deleted before its uid was recorded, so it ran nothing): create it, under
    // the same record.
    let mut f = facts(12);
    f.stages = started.stages.clone();
    let decision = decide(&f);
    assert_eq!(decision.phase, ReplayPhase::Canary);
    let Some(Action::Start(record)) = decision.action else {
        panic!("the stage should be created: {decision:?}");
    };
    assert_eq!(record, started.stages[0]);
}

#[test]
fn a_job_is_resumed_only_once_the_status_records_its_uid() {
    let mut f = facts(12);
    f.queue = Some(QueueState::Free);
    let started = decide(&f);
    let mut f = apply(f, &started);
    let mut suspended = view(JobOutcome::Running, 0, 0);
    suspended.suspended = true;
    set_job(
        &mut f,
        StageName::Canary,
        JobObservation::Present(suspended),
    );
    // Vouched for by this process only: it stays suspended, and is looked at again soon.
    f.uid_unrecorded = vec![StageName::Canary];
    let waiting = decide(&f);
    assert_eq!(waiting.action, None);
    assert_eq!(waiting.recheck_after, Some(RECORD_RETRY));
    // Recorded: resumed.
    f.uid_unrecorded.clear();
    let resumed = decide(&f);
    assert_eq!(
        resumed.action,
        Some(Action::Suspend {
            job: started.stages[0].job.clone(),
            suspend: false
        })
    );
}

#[test]
fn a_job_deleted_after_it_was_recorded_halts() {
    let mut f = facts(12);
    f.queue = Some(QueueState::Free);
    let started = decide(&f);
    let f = apply(f, &started);
    let seen = decide(&f);
    assert_eq!(seen.stages[0].job_uid.as_deref(), Some("job-uid"));
    let mut f = apply(f, &seen);
    f.jobs.clear();
    let decision = decide(&f);
    assert_eq!(decision.phase, ReplayPhase::Halted);
    assert_eq!(reason(&decision), Some("JobDeleted"));
    assert_eq!(decision.action, None);
}

#[test]
fn a_job_the_operator_did_not_create_is_never_adopted() {
    // Before the start, with owner references or not: a Job under the canary's (or the main
    // stage's) name halts the replay and is left alone.
    for stage in StageName::ALL {
        let mut f = facts(12);
        f.queue = Some(QueueState::Free);
        set_job(
            &mut f,
            stage,
            JobObservation::Present(view(JobOutcome::Running, 0, 0)),
        );
        let decision = decide(&f);
        assert_eq!(reason(&decision), Some("ForeignJob"), "{stage}");
        assert_eq!(decision.action, None);
        assert!(decision.message.contains(&job_name("orders", UID, stage)));
    }
    // After the start, a Job whose uid is not the recorded one is a replacement: halt, and the
    // replacement is not suspended (it is not the operator's to touch).
    let mut f = facts(12);
    f.queue = Some(QueueState::Free);
    let started = decide(&f);
    let mut f = apply(f, &started);
    let mut other = view(JobOutcome::Running, 0, 0);
    other.uid = "other-uid".into();
    set_job(&mut f, StageName::Canary, JobObservation::Present(other));
    let decision = decide(&f);
    assert_eq!(reason(&decision), Some("JobReplaced"));
    assert_eq!(decision.action, None);
    // Progress of a Job that is not the operator's is never recorded.
    assert_eq!(decision.stages[0].job_uid.as_deref(), Some("job-uid"));
    // A stage waiting to be created finds someone else's Job there: halt, never adopt.
    let mut f = facts(12);
    f.stages = started.stages.clone();
    set_job(
        &mut f,
        StageName::Canary,
        JobObservation::Present(view(JobOutcome::Succeeded, 1, 0)),
    );
    let decision = decide(&f);
    assert_eq!(reason(&decision), Some("ForeignJob"));
    assert_eq!(decision.stages[0].finished_at, None);
}

#[test]
fn the_main_job_found_before_its_start_halts() {
    let mut f = canary_done();
    f.verification = Some(vec![holds("a")]);
    set_job(
        &mut f,
        StageName::Main,
        JobObservation::Present(view(JobOutcome::Running, 0, 0)),
    );
    let decision = decide(&f);
    assert_eq!(reason(&decision), Some("ForeignJob"));
    assert!(!matches!(decision.action, Some(Action::Start(_))));
}

/// Facts of a replay whose canary the operator just started, and the canary's Job as created.
fn started_canary() -> (ReplayFacts, JobView) {
    let mut f = facts(12);
    f.queue = Some(QueueState::Free);
    let started = decide(&f);
    let f = apply(f, &started);
    let JobObservation::Present(job) = job_of(&f, StageName::Canary).clone() else {
        panic!("the canary Job");
    };
    (f, job)
}

#[test]
fn a_job_edited_after_its_creation_halts_and_is_suspended() {
    let (mut f, mut job) = started_canary();
    job.shape.parallelism = Some(10);
    f.jobs = vec![(StageName::Canary, JobObservation::Present(job))];
    let decision = decide(&f);
    assert_eq!(reason(&decision), Some("JobTampered"));
    assert!(decision.message.contains("spec.parallelism is 10, not 1"));
    assert_eq!(
        decision.action,
        Some(Action::Suspend {
            job: "orders-canary-5e3c1a".into(),
            suspend: true
        })
    );
}

#[test]
fn a_job_its_replay_no_longer_owns_halts_and_is_suspended() {
    let (mut f, mut job) = started_canary();
    job.owned_by_replay = false;
    f.jobs = vec![(StageName::Canary, JobObservation::Present(job.clone()))];
    let decision = decide(&f);
    assert_eq!(reason(&decision), Some("JobDisowned"));
    assert!(decision.message.contains("metadata.ownerReferences"));
    assert_eq!(
        decision.action,
        Some(Action::Suspend {
            job: "orders-canary-5e3c1a".into(),
            suspend: true
        })
    );
    // A Job that already finished runs nothing more: its owner does not matter.
    job.outcome = JobOutcome::Succeeded;
    job.succeeded = 1;
    f.jobs = vec![(StageName::Canary, JobObservation::Present(job))];
    assert_ne!(reason(&decide(&f)), Some("JobDisowned"));
}

#[test]
fn the_frozen_config_map_is_checked_before_each_stage_and_while_it_runs() {
    let mut f = facts(12);
    f.queue = Some(QueueState::Free);
    f.scope_check = None;
    let asked = decide(&f);
    assert_eq!(asked.need, Some(Need::ScopeCheck));
    assert_eq!(asked.action, None);
    f.scope_check = Some(ScopeCheck::Changed(
        "ConfigMap orders-scope-5e3c1a has uid x, not y".into(),
    ));
    let decision = decide(&f);
    assert_eq!(reason(&decision), Some("ScopeTampered"));
    assert_eq!(decision.action, None);
    assert!(decision.message.contains("orders-scope-5e3c1a"));
    assert!(decision.stages.iter().all(|s| s.started_at.is_none()));

    // While the canary runs: checked too, and a swap suspends the running Job.
    let mut f = facts(12);
    f.queue = Some(QueueState::Free);
    let started = decide(&f);
    let mut f = apply(f, &started);
    f.scope_check = None;
    assert_eq!(decide(&f).need, Some(Need::ScopeCheck));
    f.scope_check = Some(ScopeCheck::Changed(
        "ConfigMap orders-scope-5e3c1a was changed".into(),
    ));
    let decision = decide(&f);
    assert_eq!(reason(&decision), Some("ScopeTampered"));
    assert!(matches!(
        decision.action,
        Some(Action::Suspend { suspend: true, .. })
    ));

    // Before the main stage.
    let mut f = canary_done();
    f.verification = Some(vec![holds("a")]);
    f.scope_check = Some(ScopeCheck::Changed("changed".into()));
    let decision = decide(&f);
    assert_eq!(reason(&decision), Some("ScopeTampered"));
    assert!(!matches!(decision.action, Some(Action::Start(_))));
}

#[test]
fn an_unreadable_scope_holds_the_start_without_halting() {
    let mut f = facts(12);
    f.queue = Some(QueueState::Free);
    f.scope_check = Some(ScopeCheck::Unreadable("forbidden".into()));
    let decision = decide(&f);
    assert_eq!(decision.phase, ReplayPhase::Approved);
    assert_eq!(decision.action, None);
    assert_eq!(decision.halt, None);
    assert_eq!(decision.recheck_after, Some(SCOPE_RETRY));
    assert!(decision.stages.iter().all(|s| s.started_at.is_none()));
    assert!(decision.message.contains("forbidden"));
}

#[test]
fn a_config_map_under_the_scope_name_that_nobody_froze_halts() {
    let mut f = facts(12);
    f.scope = ScopeFacts::Foreign {
        message: "ConfigMap orders-scope-5e3c1a exists but was not created by the operator".into(),
    };
    f.queue = Some(QueueState::Free);
    let decision = decide(&f);
    assert_eq!(reason(&decision), Some("ForeignConfigMap"));
    assert_eq!(decision.action, None);
}

#[test]
fn remembered_uids_fill_only_missing_records_of_started_stages() {
    let cut = stages(12, plan(2, 5));
    let mut records: Vec<StageRecord> = cut
        .iter()
        .map(|s| StageRecord::planned(*s, "orders", UID))
        .collect();
    records[0].started_at = Some(at(1));
    let remembered = vec![
        (StageName::Canary, "u1".to_owned()),
        (StageName::Main, "u2".to_owned()),
    ];
    let filled = remembered_stages(records.clone(), &remembered);
    assert_eq!(filled[0].job_uid.as_deref(), Some("u1"));
    assert_eq!(filled[1].job_uid, None, "the main stage has not started");
    records[0].job_uid = Some("recorded".into());
    let kept = remembered_stages(records, &remembered);
    assert_eq!(kept[0].job_uid.as_deref(), Some("recorded"));
}

#[test]
fn stage_deadlines_allow_every_batch_its_time() {
    let cut = stages(1000, plan(10, 100));
    let main = cut[1];
    let deadline = stage_deadline_seconds(&main, PACING);
    // 990 events at 5/s, 10 batches with 10s pauses and the start-up allowance, twice over.
    assert_eq!(
        deadline,
        (2.0 * (990.0 / 5.0 + 10.0 * (10.0 + BATCH_OVERHEAD_SECONDS))).ceil() as i64
    );
    assert_eq!(
        stage_deadline_seconds(&stages(1, plan(1, 1))[0], PACING),
        MIN_STAGE_DEADLINE_SECONDS
    );
    let crawl = Pacing {
        rate_per_second: 1e-9,
        ..PACING
    };
    assert_eq!(
        stage_deadline_seconds(&main, crawl),
        MAX_STAGE_DEADLINE_SECONDS
    );
    let shape = expected_shape(&main, PACING);
    assert_eq!(shape.completions, Some(10));
    assert_eq!(shape.parallelism, Some(1));
    assert_eq!(shape.active_deadline_seconds, Some(deadline));
    assert_eq!(shape.difference(&shape), None);
}

#[test]
fn an_approval_changed_after_the_start_halts_and_suspends() {
    let mut f = facts(12);
    f.queue = Some(QueueState::Free);
    let started = decide(&f);
    let mut f = apply(f, &started);
    f.approval = Ok("mallory".into());
    let decision = decide(&f);
    assert_eq!(decision.phase, ReplayPhase::Halted);
    assert_eq!(decision.halt.unwrap().reason, "ApprovalChanged");
    assert_eq!(
        decision.action,
        Some(Action::Suspend {
            job: "orders-canary-5e3c1a".into(),
            suspend: true
        })
    );
}

#[test]
fn a_template_the_api_server_refuses_is_refused_before_the_start() {
    let mut f = facts(12);
    f.queue = Some(QueueState::Free);
    f.rejected = Some((
        StageName::Canary,
        "spec.template.spec.containers[0].image: Required value".into(),
    ));
    let decision = decide(&f);
    assert_eq!(decision.phase, ReplayPhase::Refused);
    assert_eq!(decision.action, None);
    assert!(decision.message.contains("spec.template"));
    assert!(decision.stages.iter().all(|s| s.started_at.is_none()));
    let accepted = decision
        .conditions
        .iter()
        .find(|c| c.type_ == JOB_ACCEPTED)
        .unwrap();
    assert_eq!(accepted.status, Truth::False);
    assert!(accepted.message.contains("containers[0].image"));
}

#[test]
fn a_main_stage_job_the_api_server_refuses_is_refused_before_the_canary() {
    let mut f = facts(12);
    f.queue = Some(QueueState::Free);
    f.rejected = Some((
        StageName::Main,
        "spec.template.spec.hostname: orders-main-5e3c1a-100000 must be no more than 63 characters"
            .into(),
    ));
    let decision = decide(&f);
    assert_eq!(decision.phase, ReplayPhase::Refused);
    assert_eq!(decision.action, None);
    assert!(
        decision.message.contains("orders-main-5e3c1a"),
        "{}",
        decision.message
    );
    assert!(decision.message.contains("Nothing has run"));
    assert!(decision.stages.iter().all(|s| s.started_at.is_none()));
}

#[test]
fn a_pace_slower_than_a_jobs_longest_deadline_is_refused_before_the_start() {
    let mut f = facts(12);
    f.queue = Some(QueueState::Free);
    // 12 events at one per ~3 days: the main stage needs 33 days.
    f.pacing.rate_per_second = 1.0 / (3.0 * 86_400.0);
    let decision = decide(&f);
    assert_eq!(decision.phase, ReplayPhase::Refused, "{}", decision.message);
    assert_eq!(decision.action, None);
    assert!(decision.message.contains("30 days"), "{}", decision.message);
    assert!(decision.message.contains("ratePerSecond"));
    // Said before anyone approves it.
    let mut unapproved = f.clone();
    unapproved.approval = Err(ApprovalProblem::Missing {
        requested_by: "alice".into(),
    });
    assert_eq!(decide(&unapproved).phase, ReplayPhase::Refused);
    // At a pace that fits, it starts.
    f.pacing.rate_per_second = 1.0 / 86_400.0;
    assert!(matches!(decide(&f).action, Some(Action::Start(_))));
}

#[test]
fn a_spec_the_operator_refuses_is_refused_before_anyone_approves_and_halts_a_run() {
    let mut f = facts(12);
    f.approval = Err(ApprovalProblem::Missing {
        requested_by: "alice".into(),
    });
    f.refused = vec!["spec.template.spec.hostNetwork is true: remove it".into()];
    let decision = decide(&f);
    assert_eq!(decision.phase, ReplayPhase::Refused);
    assert!(decision.message.contains("spec.template.spec.hostNetwork"));
    let admitted = decision
        .conditions
        .iter()
        .find(|c| c.type_ == ADMITTED)
        .unwrap();
    assert_eq!(admitted.status, Truth::False);
    let mut f = facts(12);
    f.queue = Some(QueueState::Free);
    let started = decide(&f);
    let mut f = apply(f, &started);
    f.refused = vec!["spec.prometheus.address is not allowed".into()];
    let decision = decide(&f);
    assert_eq!(reason(&decision), Some("SpecRefused"));
}

#[test]
fn a_scope_that_cannot_be_frozen_yet_is_pending() {
    let mut f = facts(12);
    f.scope = ScopeFacts::NotFrozen {
        message: "spec.scope.eventIdsFrom: ConfigMap ids not found".into(),
        permanent: false,
    };
    let decision = decide(&f);
    assert_eq!(decision.phase, ReplayPhase::Pending);
    assert_eq!(decision.action, None);
    assert_eq!(decision.recheck_after, Some(SCOPE_RETRY));
    f.scope = ScopeFacts::NotFrozen {
        message: "no ids".into(),
        permanent: true,
    };
    assert_eq!(decide(&f).phase, ReplayPhase::Failed);
}

#[test]
fn a_refused_replay_runs_once_fixed_and_a_failed_one_never_does() {
    let mut f = facts(12);
    f.queue = Some(QueueState::Free);
    f.refused = vec!["spec.template.spec.hostNetwork is true: remove it".into()];
    let refused = decide(&f);
    assert_eq!(refused.phase, ReplayPhase::Refused);
    let mut f = apply(f, &refused);
    f.refused.clear();
    f.queue = Some(QueueState::Free);
    assert_eq!(decide(&f).phase, ReplayPhase::Canary);

    // The same fixed spec after a recorded failure: it stays failed, with its message.
    let mut f = facts(12);
    f.queue = Some(QueueState::Free);
    f.scope = ScopeFacts::NotFrozen {
        message: "spec.scope.eventIds holds an empty id".into(),
        permanent: true,
    };
    let failed = decide(&f);
    assert_eq!(failed.phase, ReplayPhase::Failed);
    let mut f = apply(f, &failed);
    f.scope = facts(12).scope;
    f.queue = Some(QueueState::Free);
    let again = decide(&f);
    assert_eq!(again.phase, ReplayPhase::Failed);
    assert_eq!(again.message, failed.message);
    assert_eq!((again.action, again.need), (None, None));
}

// ---------------------------------------------------------------------------------------------
// Properties

fn arb_plan() -> impl Strategy<Value = BatchPlan> {
    (1u32..30, 0u32..60).prop_map(|(canary, extra)| plan(canary, canary + extra))
}

proptest! {
    /// Every id lands in exactly one batch, in order; the canary is the first batch and holds
    /// the first `canary` ids; no batch is empty or larger than its stage's batch size.
    #[test]
    fn every_id_lands_in_exactly_one_batch_in_order(count in 0u32..500, plan in arb_plan()) {
        let ids: Vec<u32> = (0..count).collect();
        let cut = batches(&ids, plan);
        let flat: Vec<u32> = cut.iter().flat_map(|b| b.iter().copied()).collect();
        prop_assert_eq!(&flat, &ids);
        prop_assert!(cut.iter().all(|b| !b.is_empty()));
        let planned = stages(count, plan);
        if count > 0 {
            prop_assert_eq!(planned[0].name, StageName::Canary);
            prop_assert_eq!(planned[0].first_event, 0);
            prop_assert_eq!(planned[0].batches(), 1);
            prop_assert_eq!(cut[0].len() as u32, plan.canary.min(count));
        }
        let mut next_batch = 0;
        let mut next_line = 0;
        for stage in &planned {
            prop_assert_eq!(stage.first_batch, next_batch);
            prop_assert_eq!(stage.first_event, next_line);
            for index in 0..stage.batches() {
                let lines = stage.lines(index).unwrap();
                prop_assert_eq!(lines.start, next_line);
                prop_assert!(lines.end > lines.start);
                prop_assert!(lines.end - lines.start <= stage.batch_size);
                next_line = lines.end;
            }
            next_batch += stage.batches();
        }
        prop_assert_eq!(next_line, count);
        prop_assert_eq!(next_batch as usize, cut.len());
    }

    /// Job names depend on nothing but the replay, its uid and the stage, differ per stage and
    /// are valid object names.
    #[test]
    fn job_names_are_deterministic(name in "[a-z][a-z0-9-]{0,47}", uid in "[0-9a-f]{8}-[0-9a-f]{4}") {
        let canary = job_name(&name, &uid, StageName::Canary);
        prop_assert_eq!(&canary, &job_name(&name, &uid, StageName::Canary));
        prop_assert_ne!(&canary, &job_name(&name, &uid, StageName::Main));
        for n in [canary, job_name(&name, &uid, StageName::Main), scope_config_map_name(&name, &uid)] {
            prop_assert!(n.len() <= 63);
            prop_assert!(!n.contains("--") || name.contains("--"));
            prop_assert!(n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
        }
    }

    /// Nothing starts without a valid approval; a halted replay never starts or resumes
    /// anything by itself; a stage starts only when its Job is absent and every stage before it
    /// finished; the canary is the first stage to start.
    #[test]
    fn the_phase_machine_keeps_its_promises(f in arb_facts()) {
        let decision = decide(&f);
        if f.approval.is_err() {
            prop_assert!(!matches!(decision.action, Some(Action::Start(_))), "{:?}", decision);
        }
        if f.halted.is_some() {
            prop_assert_eq!(decision.phase, ReplayPhase::Halted);
            prop_assert!(matches!(
                decision.action,
                None | Some(Action::Suspend { suspend: true, .. })
            ), "{:?}", decision);
        }
        if decision.halt.is_some() {
            prop_assert_eq!(decision.phase, ReplayPhase::Halted);
        }
        if let Some(Action::Suspend { job, .. }) = &decision.action {
            // Only the operator's own Job, by the uid it recorded, is ever touched.
            let record = f.stages.iter().find(|s| &s.job == job).expect("a recorded stage");
            let JobObservation::Present(view) = job_of(&f, record.stage.name) else {
                panic!("suspending an absent Job: {decision:?}");
            };
            prop_assert_eq!(record.job_uid.as_deref(), Some(view.uid.as_str()));
        }
        if let Some(Action::Start(record)) = &decision.action {
            prop_assert!(matches!(job_of(&f, record.stage.name), JobObservation::Absent));
            prop_assert_eq!(&f.scope_check, &Some(ScopeCheck::Intact), "{:?}", decision);
            prop_assert!(record.job_uid.is_none());
            prop_assert!(record.started_at.is_some());
            for earlier in decision.stages.iter().filter(|s| s.stage.name < record.stage.name) {
                prop_assert!(earlier.finished_at.is_some(), "{:?}", decision);
            }
            if f.stages.iter().all(|s| s.started_at.is_none()) {
                prop_assert_eq!(record.stage.name, StageName::Canary);
                prop_assert_eq!(record.stage.first_event, 0);
            }
            prop_assert!(!f.suspend);
            prop_assert_eq!(&record.job, &job_name(&f.replay, &f.uid, record.stage.name));
        }
        if let Some(Action::Suspend { suspend: false, .. }) = &decision.action {
            prop_assert!(!f.suspend);
            prop_assert!(f.halted.is_none());
        }
        // Recorded stages are never dropped or re-cut, and a Job uid is never taken from what
        // the cluster shows: only the create's answer records one.
        for (before, after) in f.stages.iter().zip(&decision.stages) {
            prop_assert_eq!(before.stage, after.stage);
            prop_assert_eq!(&before.job, &after.job);
            prop_assert!(before.started_at.is_none() || after.started_at == before.started_at);
            prop_assert_eq!(&before.job_uid, &after.job_uid);
        }
        // A started stage is created again only when no Job is under its name and none was
        // recorded: never beside a Job, never after a Job of its own ran.
        if let Some(Action::Start(record)) = &decision.action
            && let Some(before) = f.stages.iter().find(|s| s.stage.name == record.stage.name && s.started_at.is_some())
        {
            prop_assert!(before.job_uid.is_none());
            prop_assert!(matches!(job_of(&f, record.stage.name), JobObservation::Absent));
        }
    }

    /// Fed back its own decisions with Jobs that keep running, a replay that is halted stays
    /// halted however often it is reconciled.
    #[test]
    fn a_halted_replay_stays_halted(f in arb_facts(), rounds in 1usize..5) {
        let mut f = f;
        let first = decide(&f);
        if first.halt.is_some() {
            for _ in 0..rounds {
                let decision = decide(&f);
                f = apply(f, &decision);
                f.queue = Some(QueueState::Free);
                f.verification = Some(vec![holds("a")]);
                let again = decide(&f);
                prop_assert_eq!(again.phase, ReplayPhase::Halted);
                prop_assert!(!matches!(again.action, Some(Action::Start(_))));
            }
        }
    }

    /// Failed is terminal: whatever changes afterwards (a fixed spec, an approval, a free
    /// queue, checks that hold), a replay recorded as failed starts nothing and stays failed.
    #[test]
    fn a_failed_replay_stays_failed(f in arb_facts(), fixed in arb_facts()) {
        let mut f = f;
        f.stages.clear();
        f.halted = None;
        f.failed = Some("the frozen scope holds no event ids".into());
        let mut later = fixed;
        later.stages.clear();
        later.halted = None;
        later.failed = f.failed.clone();
        for facts in [f, later] {
            let decision = decide(&facts);
            prop_assert_eq!(decision.phase, ReplayPhase::Failed);
            prop_assert_eq!(&decision.message, "the frozen scope holds no event ids");
            prop_assert_eq!(decision.action, None);
            prop_assert_eq!(decision.need, None);
        }
    }
}

proptest! {
    /// A running stage's own Job that the replay no longer owns would outlive a delete of the
    /// replay: whatever else holds, the replay halts and the Job is suspended.
    #[test]
    fn a_running_job_the_replay_does_not_own_is_never_left_running(f in arb_facts()) {
        let mut f = f;
        // What the controller fills in before it acts on a running stage.
        f.scope_check = Some(ScopeCheck::Intact);
        let current = f
            .stages
            .iter()
            .find(|s| s.started_at.is_some() && s.finished_at.is_none())
            .cloned();
        if let Some(record) = current
            && let Some(uid) = record.job_uid.clone()
        {
            let disowned = JobView {
                uid,
                suspended: false,
                succeeded: 0,
                failed: 0,
                outcome: JobOutcome::Running,
                finished_at: None,
                shape: expected_shape(&record.stage, f.pacing),
                owned_by_replay: false,
            };
            f.jobs.retain(|(stage, _)| *stage != record.stage.name);
            f.jobs.push((record.stage.name, JobObservation::Present(disowned)));
            let decision = decide(&f);
            prop_assert_eq!(decision.phase, ReplayPhase::Halted, "{:?}", decision);
            prop_assert_eq!(
                &decision.action,
                &Some(Action::Suspend { job: record.job.clone(), suspend: true })
            );
        }
    }

    /// A stage's deadline is never below the time its batches need at the replay's rate with
    /// their pauses and retries, stays within its bounds, and grows with the stage.
    #[test]
    fn stage_deadlines_cover_the_paced_time(
        events in 1u32..100_000,
        size in 1u32..5000,
        rate in 0.01f64..10_000.0,
        pause in 0.0f64..600.0,
        retries in 0u32..10,
    ) {
        let stage = Stage { name: StageName::Main, first_event: 1, events, batch_size: size, first_batch: 1 };
        let pacing = Pacing { rate_per_second: rate, pause_between_seconds: pause, retries_per_batch: retries };
        let deadline = stage_deadline_seconds(&stage, pacing);
        prop_assert!((MIN_STAGE_DEADLINE_SECONDS..=MAX_STAGE_DEADLINE_SECONDS).contains(&deadline));
        let needed = (f64::from(events) / rate + f64::from(stage.batches()) * pause)
            * (f64::from(retries) + 1.0);
        prop_assert!(deadline == MAX_STAGE_DEADLINE_SECONDS || deadline as f64 >= needed);
        let bigger = Stage { events: events + size, ..stage };
        prop_assert!(stage_deadline_seconds(&bigger, pacing) >= deadline);
    }
}

/// A Job under a stage's name: absent, the operator's or another uid, with the shape the
/// operator gave it (filled in by `arb_facts`) or an edited one, owned by the replay or not.
fn arb_job() -> impl Strategy<Value = (JobObservation, bool)> {
    prop_oneof![
        Just((JobObservation::Absent, false)),
        (
            prop_oneof![
                Just(JobOutcome::Running),
                Just(JobOutcome::Succeeded),
                Just(JobOutcome::Failed("BackoffLimitExceeded".into()))
            ],
            any::<bool>(),
            0u32..4,
            0u32..2,
            prop_oneof![Just("job-uid"), Just("other-uid")],
            any::<bool>(),
            prop::bool::weighted(0.8),
        )
            .prop_map(
                |(outcome, suspended, succeeded, failed, uid, edited, owned)| {
                    let job = JobObservation::Present(JobView {
                        uid: uid.into(),
                        suspended,
                        succeeded,
                        failed,
                        outcome,
                        finished_at: None,
                        shape: JobShape::default(),
                        owned_by_replay: owned,
                    });
                    (job, edited)
                }
            ),
    ]
}

fn arb_facts() -> impl Strategy<Value = ReplayFacts> {
    let approval = prop_oneof![
        Just(Ok("bob".to_owned())),
        Just(Ok("carol".to_owned())),
        Just(Err(ApprovalProblem::Missing {
            requested_by: "alice".into()
        })),
        Just(Err(ApprovalProblem::SelfApproved {
            approved_by: "alice".into(),
            requested_by: "alice".into()
        })),
    ];
    let queue = prop_oneof![
        Just(None),
        Just(Some(QueueState::Free)),
        Just(Some(QueueState::Busy {
            holder: "ns/other".into(),
            active: true
        })),
    ];
    let verification = prop_oneof![
        Just(None),
        Just(Some(vec![holds("a")])),
        Just(Some(vec![CheckOutcome {
            name: "a".into(),
            query: "q".into(),
            result: CheckResult::Fails(0.0)
        }])),
        Just(Some(vec![CheckOutcome {
            name: "a".into(),
            query: "q".into(),
            result: CheckResult::Unknown("none".into())
        }])),
    ];
    let halted = prop_oneof![
        Just(None),
        Just(Some(Halt {
            reason: "BatchFailed".into(),
            message: "batch 1 failed".into()
        }))
    ];
    let rejected = prop_oneof![
        Just(None),
        Just(Some((StageName::Canary, "bad".to_owned()))),
        Just(Some((StageName::Main, "bad".to_owned()))),
    ];
    let scope_check = prop_oneof![
        Just(None),
        Just(Some(ScopeCheck::Intact)),
        Just(Some(ScopeCheck::Changed("ConfigMap changed".to_owned()))),
        Just(Some(ScopeCheck::Unreadable("forbidden".to_owned()))),
    ];
    let refused = prop_oneof![
        Just(None),
        Just(Some(StageName::Canary)),
        Just(Some(StageName::Main)),
    ];
    (
        (
            1u32..60,
            arb_plan(),
            approval,
            prop_oneof![Just(None), Just(Some("bob".to_owned()))],
        ),
        (
            any::<bool>(),
            0usize..5,
            any::<bool>(),
            arb_job(),
            arb_job(),
        ),
        (
            halted,
            any::<bool>(),
            any::<bool>(),
            verification,
            queue,
            rejected,
        ),
        (0i64..1000, scope_check, refused),
    )
        .prop_map(
            |(
                (count, plan, approval, recorded_approver),
                (suspend, progress, uid_known, canary_job, main_job),
                (halted, verified, has_checks, verification, queue, rejected),
                (later, scope_check, uid_unrecorded),
            )| {
                let mut f = facts(count);
                f.plan = Ok(plan);
                f.approval = approval;
                f.recorded_approver = recorded_approver;
                f.suspend = suspend;
                f.halted = halted;
                f.verified = verified;
                f.has_checks = has_checks;
                f.verification = verification;
                f.queue = queue;
                f.rejected = rejected;
                f.scope_check = scope_check;
                f.uid_unrecorded = uid_unrecorded.into_iter().collect();
                f.now = at(2000 + later);
                // progress: 0 nothing, 1 canary started, 2 canary finished, 3 main started,
                // 4 main finished.
                let mut records: Vec<StageRecord> = stages(count, plan)
                    .into_iter()
                    .map(|s| StageRecord::planned(s, &f.replay, &f.uid))
                    .collect();
                if progress > 0 {
                    for (i, record) in records.iter_mut().enumerate() {
                        let step = 1 + 2 * i;
                        if progress >= step {
                            record.started_at = Some(at(1500));
                            record.job_uid = uid_known.then(|| "job-uid".to_owned());
                        }
                        if progress > step {
                            record.finished_at = Some(at(1600));
                        }
                    }
                    f.stages = records;
                }
                let planned = stages(count, plan);
                for (name, (mut job, edited)) in
                    [(StageName::Canary, canary_job), (StageName::Main, main_job)]
                {
                    if let JobObservation::Present(view) = &mut job
                        && let Some(stage) = planned.iter().find(|s| s.name == name)
                    {
                        view.shape = expected_shape(stage, f.pacing);
                        if edited {
                            view.shape.parallelism = Some(4);
                        }
                    }
                    f.jobs.push((name, job));
                }
                f
            },
        )
}
