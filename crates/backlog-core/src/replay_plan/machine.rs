//! The phase machine of a replay (pure): from what the status recorded, what the Jobs show and
//! the facts asked for (the queue, the verification checks), the phase, the conditions and the
//! one thing to do next.

use std::time::Duration;

use jiff::Timestamp;

use super::{
    ApprovalProblem, BatchPlan, CheckOutcome, CheckResult, Halt, JobObservation, JobOutcome,
    JobView, MAX_STAGE_DEADLINE_SECONDS, Pacing, PlanProblem, QueueState, Stage, StageName,
    StageRecord, expected_shape, stage_least_seconds, stages,
};
use crate::condition::{ConditionSpec, Truth};
use crate::phase::ReplayPhase;
use crate::stabilization::seconds_between;

/// Condition types of a ReplayJob.
pub const SCOPE_FROZEN: &str = "ScopeFrozen";
pub const APPROVED: &str = "Approved";
pub const WAITING: &str = "Waiting";
pub const VERIFIED: &str = "Verified";
pub const HALTED: &str = "Halted";
pub const JOB_ACCEPTED: &str = "JobAccepted";
/// Whether the operator's own checks of the spec (the worker pod policy, the Prometheus
/// allowlist) let the replay run.
pub const ADMITTED: &str = "Admitted";

/// How long checks may keep returning no usable sample after the canary before the replay
/// halts: long enough for a scrape or two and a Prometheus restart, short enough that nobody
/// forgets a half-done replay.
pub const VERIFICATION_PATIENCE: Duration = Duration::from_secs(300);

/// How long after the canary checks wait by default: two scrapes at Prometheus's default
/// interval, after consumers handled the canary's events.
pub const DEFAULT_VERIFICATION_DELAY: Duration = Duration::from_secs(30);

/// How soon checks without a usable sample are asked again.
pub const VERIFICATION_RETRY: Duration = Duration::from_secs(5);

/// How soon a replay waiting for its queue looks again (besides the watch that wakes it when
/// the replay ahead of it ends).
pub const WAIT_RETRY: Duration = Duration::from_secs(30);

/// How soon a replay whose `eventIdsFrom` ConfigMap is missing or unusable looks again: no
/// watch on every ConfigMap, a cheap read instead.
pub const SCOPE_RETRY: Duration = Duration::from_secs(10);
/// How soon a suspended Job whose uid is not recorded yet is looked at again.
pub const RECORD_RETRY: Duration = Duration::from_secs(1);

/// The scope as far as the decision is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScopeFacts {
    Frozen {
        count: u32,
        config_map: String,
        sha256: String,
    },
    /// Not frozen: why, and whether waiting can help (a missing ConfigMap may appear; a scope
    /// without ids never gets any, the scope being immutable).
    NotFrozen { message: String, permanent: bool },
    /// A ConfigMap under the frozen scope's name that the operator did not create: the replay
    /// halts rather than replay a list nobody froze.
    Foreign { message: String },
}

/// The frozen ConfigMap, looked at again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScopeCheck {
    /// The ConfigMap the operator created, immutable, with the approved bytes.
    Intact,
    /// What changed (deleted, replaced, other bytes): the replay halts.
    Changed(String),
    /// It could not be read (e.g. the operator may no longer read ConfigMaps there): nothing
    /// starts until it can, and nothing halts for it either.
    Unreadable(String),
}

/// Everything a decision depends on.
#[derive(Clone, Debug)]
pub struct ReplayFacts {
    pub replay: String,
    pub uid: String,
    pub source_queue: String,
    pub scope: ScopeFacts,
    pub plan: Result<BatchPlan, PlanProblem>,
    /// The approval in the spec, checked.
    pub approval: Result<String, ApprovalProblem>,
    /// The approver the status recorded when the replay started.
    pub recorded_approver: Option<String>,
    pub suspend: bool,
    /// Stages recorded in the status (both, once the canary started).
    pub stages: Vec<StageRecord>,
    /// The Job found under each stage's name.
    pub jobs: Vec<(StageName, JobObservation)>,
    /// The halt the status recorded, if any: a halted replay stays halted.
    pub halted: Option<Halt>,
    /// The message of the failure the status recorded, if any: a failed replay stays failed.
    pub failed: Option<String>,
    /// Whether the status records that every check held after the canary.
    pub verified: bool,
    /// Whether `spec.verification` has checks.
    pub has_checks: bool,
    /// How long after the canary the checks wait (`spec.verificationDelay`): the canary's
    /// effects reach the metrics only after consumers handled them and Prometheus scraped
    /// them, and a check asked before then holds on numbers from before the canary.
    pub verification_delay: Duration,
    /// Check results, when asked for ([`Need::Verification`]).
    pub verification: Option<Vec<CheckOutcome>>,
    /// The queue, when asked for ([`Need::Queue`]).
    pub queue: Option<QueueState>,
    /// The API server refused the stage's Job (a dry run), with its message.
    pub rejected: Option<(StageName, String)>,
    /// What the operator's own checks refuse in the spec, each naming the field and the fix.
    pub refused: Vec<String>,
    /// How the replay is paced: the Jobs' expected shape and deadline follow from it.
    pub pacing: Pacing,
    /// The frozen ConfigMap checked against the status (same uid, immutable, same sha256),
    /// when asked for ([`Need::ScopeCheck`]).
    pub scope_check: Option<ScopeCheck>,
    /// Stages whose Job uid this process remembers from the create's answer but the status
    /// does not record yet. Their Job, created suspended, stays suspended until the status
    /// records it: a Job that vanished before that record then never ran, and the stage can
    /// be created again.
    pub uid_unrecorded: Vec<StageName>,
    pub now: Timestamp,
}

/// A side effect the controller carries out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Record the stage as started (the status write comes first), then create its Job if it
    /// does not exist.
    Start(StageRecord),
    /// Set the Job's `spec.suspend`.
    Suspend { job: String, suspend: bool },
}

/// A fact the decision needs before it can say more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Whether another replay holds the source queue.
    Queue,
    /// The verification checks' results.
    Verification,
    /// The frozen ConfigMap, checked again before a stage starts and while it runs.
    ScopeCheck,
}

/// What to do, and what the status says.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub phase: ReplayPhase,
    pub message: String,
    pub conditions: Vec<ConditionSpec>,
    /// The stages to record, with progress from the Jobs.
    pub stages: Vec<StageRecord>,
    pub halt: Option<Halt>,
    /// Check results to record (`None`: keep what the status has).
    pub checks: Option<Vec<CheckOutcome>>,
    pub action: Option<Action>,
    pub need: Option<Need>,
    /// Look again after this long even if nothing changes.
    pub recheck_after: Option<Duration>,
}

impl Decision {
    fn new(phase: ReplayPhase, message: impl Into<String>, stages: Vec<StageRecord>) -> Self {
        Decision {
            phase,
            message: message.into(),
            conditions: Vec::new(),
            stages,
            halt: None,
            checks: None,
            action: None,
            need: None,
            recheck_after: None,
        }
    }

    fn condition(mut self, condition: ConditionSpec) -> Self {
        self.conditions.retain(|c| c.type_ != condition.type_);
        self.conditions.push(condition);
        self
    }

    fn action(mut self, action: Action) -> Self {
        self.action = Some(action);
        self
    }

    fn recheck(mut self, after: Duration) -> Self {
        self.recheck_after = Some(after);
        self
    }
}

pub(super) fn job_of(facts: &ReplayFacts, name: StageName) -> &JobObservation {
    facts
        .jobs
        .iter()
        .find(|(stage, _)| *stage == name)
        .map(|(_, job)| job)
        .unwrap_or(&JobObservation::Absent)
}

/// Whose the Job under a stage's name is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ownership<'a> {
    Absent,
    /// The Job whose uid the stage recorded when the operator created it.
    Ours(&'a JobView),
    /// A Job the operator did not create (no uid recorded) or a different one (another uid).
    Foreign,
}

fn ownership<'a>(facts: &'a ReplayFacts, record: &StageRecord) -> Ownership<'a> {
    match job_of(facts, record.stage.name) {
        JobObservation::Absent => Ownership::Absent,
        JobObservation::Present(view) if record.job_uid.as_deref() == Some(view.uid.as_str()) => {
            Ownership::Ours(view)
        }
        JobObservation::Present(_) => Ownership::Foreign,
    }
}

/// The stages recorded in the status, completed with the uids this process remembers having
/// created (a record write that failed, or a watch cache behind the operator's own writes, does
/// not make its own Job look foreign).
pub fn remembered_stages(
    mut recorded: Vec<StageRecord>,
    remembered: &[(StageName, String)],
) -> Vec<StageRecord> {
    for record in recorded.iter_mut() {
        if record.started_at.is_some() && record.job_uid.is_none() {
            record.job_uid = remembered
                .iter()
                .find(|(stage, _)| *stage == record.stage.name)
                .map(|(_, uid)| uid.clone());
        }
    }
    recorded
}

/// The recorded stages with the progress their own Jobs show.
fn observe(facts: &ReplayFacts) -> Vec<StageRecord> {
    facts
        .stages
        .iter()
        .map(|record| {
            let mut record = record.clone();
            if record.started_at.is_none() {
                return record;
            }
            if let Ownership::Ours(view) = ownership(facts, &record) {
                record.succeeded = view.succeeded;
                record.failed = view.failed;
                if view.outcome == JobOutcome::Succeeded && record.finished_at.is_none() {
                    record.finished_at = Some(view.finished_at.unwrap_or(facts.now));
                }
            }
            record
        })
        .collect()
}

fn batch_lines(stage: &Stage, index: u32) -> String {
    match stage.lines(index) {
        Some(lines) if lines.end > lines.start => {
            format!("lines {}-{}", lines.start + 1, lines.end)
        }
        _ => "no lines".to_owned(),
    }
}

/// Decides what to do next. Pure: the same facts give the same decision.
pub fn decide(facts: &ReplayFacts) -> Decision {
    let stages = observe(facts);
    let decision = match (&facts.halted, &facts.failed) {
        (Some(halt), _) => halted(facts, stages, halt.clone()),
        // Failed means nothing ran: there is no Job to keep suspended, and nothing to start.
        (None, Some(message)) => Decision::new(ReplayPhase::Failed, message.clone(), stages),
        (None, None) => match &facts.scope {
            ScopeFacts::NotFrozen { message, permanent } => not_frozen(stages, message, *permanent),
            ScopeFacts::Foreign { message } => {
                halt(facts, stages, "ForeignConfigMap", message.clone())
            }
            ScopeFacts::Frozen { count, .. } => match facts.plan {
                Err(ref problem) => Decision::new(
                    ReplayPhase::Refused,
                    format!("{problem}; fix spec.batches before the start"),
                    stages,
                ),
                Ok(plan) => {
                    if stages.iter().any(|s| s.started_at.is_some()) {
                        during(facts, stages)
                    } else {
                        before_start(facts, stages, *count, plan)
                    }
                }
            },
        },
    };
    with_standing_conditions(facts, guard_scope(facts, decision))
}

/// Before a stage starts and while one runs, the frozen ConfigMap must still be the one the
/// operator created, immutable, with the content whose sha256 was approved: a ConfigMap
/// deleted and created again under its name (with other ids) halts the replay.
fn guard_scope(facts: &ReplayFacts, decision: Decision) -> Decision {
    if decision.need.is_some() || decision.halt.is_some() {
        return decision;
    }
    let starting = matches!(decision.action, Some(Action::Start(_)));
    let running = matches!(decision.phase, ReplayPhase::Canary | ReplayPhase::Running)
        || (decision.phase == ReplayPhase::Suspended
            && decision.stages.iter().any(|s| s.started_at.is_some()));
    if !starting && !running {
        return decision;
    }
    match &facts.scope_check {
        None => Decision {
            need: Some(Need::ScopeCheck),
            action: None,
            ..decision
        },
        Some(ScopeCheck::Intact) => decision,
        Some(ScopeCheck::Unreadable(why)) if starting => {
            let stages = observe(facts);
            let phase = if stages.iter().any(|s| s.started_at.is_some()) {
                decision.phase
            } else {
                ReplayPhase::Approved
            };
            let message = format!(
                "{why}; no stage starts until the operator can check the frozen scope again"
            );
            Decision::new(phase, message, stages).recheck(SCOPE_RETRY)
        }
        Some(ScopeCheck::Unreadable(_)) => decision.recheck(SCOPE_RETRY),
        Some(ScopeCheck::Changed(problem)) => {
            let message = format!(
                "{problem}; the frozen list is not what was approved, so the replay stops before running another batch. Find out who changed it (the API server's audit log), then create a new ReplayJob"
            );
            // A start that did not happen is not recorded.
            let stages = if starting {
                observe(facts)
            } else {
                decision.stages
            };
            halt(facts, stages, "ScopeTampered", message)
        }
    }
}

/// Conditions every decision reports unless it said otherwise.
fn with_standing_conditions(facts: &ReplayFacts, mut decision: Decision) -> Decision {
    let scope = match &facts.scope {
        ScopeFacts::Frozen {
            count,
            config_map,
            sha256,
        } => ConditionSpec::new(
            SCOPE_FROZEN,
            Truth::True,
            "Frozen",
            format!("{count} event ids frozen in ConfigMap {config_map} (sha256 {sha256})"),
        ),
        ScopeFacts::NotFrozen { message, permanent } => ConditionSpec::new(
            SCOPE_FROZEN,
            Truth::False,
            if *permanent { "Unusable" } else { "NotYet" },
            message.clone(),
        ),
        ScopeFacts::Foreign { message } => {
            ConditionSpec::new(SCOPE_FROZEN, Truth::False, "Foreign", message.clone())
        }
    };
    let approval = match &facts.approval {
        Ok(approver) => ConditionSpec::new(
            APPROVED,
            Truth::True,
            "Approved",
            format!("approved by {approver}"),
        ),
        Err(problem) => ConditionSpec::new(
            APPROVED,
            Truth::False,
            problem.reason(),
            problem.to_string(),
        ),
    };
    let halted = match &decision.halt {
        Some(halt) => ConditionSpec::new(HALTED, Truth::True, &halt.reason, &halt.message),
        None => ConditionSpec::new(
            HALTED,
            Truth::False,
            "NotHalted",
            "the replay has not halted",
        ),
    };
    let verified = if facts.verified {
        verified_condition(facts.has_checks)
    } else {
        ConditionSpec::new(
            VERIFIED,
            Truth::Unknown,
            "NotYet",
            "spec.verification is checked when the canary has succeeded",
        )
    };
    let admitted = if facts.refused.is_empty() {
        ConditionSpec::new(
            ADMITTED,
            Truth::True,
            "Admitted",
            "spec.template and spec.prometheus pass the operator's checks",
        )
    } else {
        ConditionSpec::new(ADMITTED, Truth::False, "Refused", refusal(facts))
    };
    let waiting = ConditionSpec::new(
        WAITING,
        Truth::False,
        "NotWaiting",
        "not waiting for another replay",
    );
    let accepted = match &facts.rejected {
        Some((stage, message)) => ConditionSpec::new(
            JOB_ACCEPTED,
            Truth::False,
            "Refused",
            format!(
                "the API server refuses the {stage} Job built from spec.template: {message}. Fix spec.template (before the start: an approver removes spec.approval, the requester corrects the template, an approver approves again)"
            ),
        ),
        None if decision.stages.iter().any(|s| s.job_uid.is_some()) => ConditionSpec::new(
            JOB_ACCEPTED,
            Truth::True,
            "Accepted",
            "the API server accepted the replay's Job",
        ),
        None => ConditionSpec::new(
            JOB_ACCEPTED,
            Truth::Unknown,
            "NotSubmitted",
            "no Job has been submitted yet",
        ),
    };
    // A halted replay keeps the verification result it recorded (it may be why it halted).
    let verified = (decision.halt.is_none() || facts.verified).then_some(verified);
    for standing in [
        Some(scope),
        Some(admitted),
        Some(approval),
        Some(halted),
        verified,
        Some(waiting),
        Some(accepted),
    ]
    .into_iter()
    .flatten()
    {
        if !decision
            .conditions
            .iter()
            .any(|c| c.type_ == standing.type_)
        {
            decision.conditions.push(standing);
        }
    }
    decision.conditions.sort_by(|a, b| a.type_.cmp(b.type_));
    decision
}

fn refusal(facts: &ReplayFacts) -> String {
    format!(
        "the operator refuses to run this replay: {}",
        facts.refused.join("; ")
    )
}

fn not_frozen(stages: Vec<StageRecord>, message: &str, permanent: bool) -> Decision {
    if permanent {
        Decision::new(ReplayPhase::Failed, message, stages)
    } else {
        Decision::new(ReplayPhase::Pending, message, stages).recheck(SCOPE_RETRY)
    }
}

/// A halted replay stays halted: it starts nothing and resumes nothing, and keeps a Job that
/// is still running suspended.
fn halted(facts: &ReplayFacts, stages: Vec<StageRecord>, halt: Halt) -> Decision {
    // Only the operator's own Job is suspended: someone else's is never touched.
    let running = stages
        .iter()
        .filter(|s| s.started_at.is_some() && s.finished_at.is_none())
        .find_map(|s| match ownership(facts, s) {
            Ownership::Ours(view) if view.outcome == JobOutcome::Running && !view.suspended => {
                Some(s.job.clone())
            }
            _ => None,
        });
    let mut decision = Decision::new(ReplayPhase::Halted, halt.message.clone(), stages);
    decision.halt = Some(halt);
    match running {
        Some(job) => decision.action(Action::Suspend { job, suspend: true }),
        None => decision,
    }
}

fn halt(facts: &ReplayFacts, stages: Vec<StageRecord>, reason: &str, message: String) -> Decision {
    halted(
        facts,
        stages,
        Halt {
            reason: reason.to_owned(),
            message,
        },
    )
}

fn before_start(
    facts: &ReplayFacts,
    stages: Vec<StageRecord>,
    count: u32,
    plan: BatchPlan,
) -> Decision {
    // Said at once, before anyone approves what could never run.
    if !facts.refused.is_empty() {
        let message = format!(
            "{}. Fix the spec: before the start, an approver removes spec.approval if it is set, the requester corrects the spec, an approver approves again",
            refusal(facts)
        );
        return Decision::new(ReplayPhase::Refused, message, stages);
    }
    // A stage slower than the longest deadline a Job gets would be stopped part-way, days in:
    // said before anyone approves it too.
    if let Some((stage, seconds)) = self::stages(count, plan).into_iter().find_map(|s| {
        stage_least_seconds(&s, facts.pacing)
            .filter(|seconds| *seconds > MAX_STAGE_DEADLINE_SECONDS as f64)
            .map(|seconds| (s.name, seconds))
    }) {
        return Decision::new(
            ReplayPhase::Refused,
            format!(
                "at spec.batches.ratePerSecond {} with pauseBetween {}s, the {stage} stage needs at least {:.0} hours, beyond the {} days a Job may run: its Job would be stopped part-way. Nothing has run. Raise ratePerSecond or batches.size, shorten pauseBetween, or split the ids into several replays",
                facts.pacing.rate_per_second,
                facts.pacing.pause_between_seconds,
                seconds / 3600.0,
                MAX_STAGE_DEADLINE_SECONDS / 86_400
            ),
            stages,
        );
    }
    let approver = match &facts.approval {
        Ok(approver) => approver.clone(),
        Err(problem) => {
            return Decision::new(ReplayPhase::AwaitingApproval, problem.to_string(), stages);
        }
    };
    let planned: Vec<StageRecord> = self::stages(count, plan)
        .into_iter()
        .map(|stage| StageRecord::planned(stage, &facts.replay, &facts.uid))
        .collect();
    let Some(canary) = planned.first().cloned() else {
        return Decision::new(
            ReplayPhase::Failed,
            "the frozen scope holds no event ids; create a new ReplayJob with ids to replay",
            stages,
        );
    };
    if facts.suspend {
        return Decision::new(
            ReplayPhase::Suspended,
            format!(
                "approved by {approver}; suspended before it started (spec.suspend): set spec.suspend to false to start the canary"
            ),
            stages,
        );
    }
    // Every stage's Job is checked before the canary starts: one refused only at the main
    // stage would stop the replay after the canary's events were replayed.
    if let Some((stage, message)) = &facts.rejected {
        let job = planned
            .iter()
            .find(|s| s.stage.name == *stage)
            .map_or(canary.job.as_str(), |s| s.job.as_str());
        return Decision::new(
            ReplayPhase::Refused,
            format!(
                "the API server refuses Job {job} of the {stage} stage: {message}. Nothing has run. Fix spec.template if the message names it (an approver removes spec.approval, the requester corrects the template, an approver approves again); a Job refused for its size or name needs a new ReplayJob with larger batches or a shorter name"
            ),
            stages,
        );
    }
    match &facts.queue {
        None => {
            let mut decision = Decision::new(
                ReplayPhase::Approved,
                format!("approved by {approver}; checking the source queue"),
                stages,
            );
            decision.need = Some(Need::Queue);
            decision
        }
        Some(QueueState::Busy { holder, active }) => {
            let why = if *active {
                format!(
                    "ReplayJob {holder} is replaying source queue {}",
                    facts.source_queue
                )
            } else {
                format!(
                    "ReplayJob {holder} is queued before this one for source queue {}",
                    facts.source_queue
                )
            };
            let message = format!(
                "approved by {approver}; waiting for ReplayJob {holder}: {why}; at most one replay runs per source queue, this one starts when {holder} has ended"
            );
            Decision::new(ReplayPhase::Approved, message.clone(), stages)
                .condition(ConditionSpec::new(
                    WAITING,
                    Truth::True,
                    "QueueBusy",
                    message,
                ))
                .recheck(WAIT_RETRY)
        }
        Some(QueueState::Free) => {
            // Nothing started, so no Job was created by the operator: any Job under a stage's
            // name was put there by someone else, and is neither adopted nor overwritten.
            if let Some(foreign) = planned
                .iter()
                .find(|s| matches!(job_of(facts, s.stage.name), JobObservation::Present(_)))
            {
                return halt(facts, stages, "ForeignJob", not_created(&foreign.job));
            }
            let mut planned = planned;
            planned[0].started_at = Some(facts.now);
            let started = planned[0].clone();
            let total: u32 = planned.iter().map(|s| s.stage.batches()).sum();
            let decision = Decision::new(
                ReplayPhase::Canary,
                format!(
                    "canary: batch 0 of {total} ({} event(s)) runs as Job {}",
                    canary.stage.events, canary.job
                ),
                planned,
            );
            start(decision, started)
        }
    }
}

/// Starts a stage: records it, then creates its Job (the callers checked that no Job has its
/// name).
fn start(decision: Decision, record: StageRecord) -> Decision {
    decision.action(Action::Start(record))
}

fn not_created(job: &str) -> String {
    format!(
        "Job {job} exists but was not created by the operator for this ReplayJob (its uid is not the one recorded in status.stages); the operator neither adopts nor overwrites it, whatever its owner references say. Find out who created it (the API server's audit log), delete it and create a new ReplayJob"
    )
}

/// After the first stage started: follow the Jobs, verify after the canary, start the main
/// stage, halt on any failure.
fn during(facts: &ReplayFacts, stages: Vec<StageRecord>) -> Decision {
    // Without the admission policy the approval could still change after the start: the
    // operator does not run batches nobody approved.
    let approval_problem = match (&facts.approval, &facts.recorded_approver) {
        (Err(problem), _) => Some(format!(
            "spec.approval no longer holds after the replay started ({problem}); the operator stops rather than run unapproved batches"
        )),
        (Ok(now), Some(recorded)) if now != recorded => Some(format!(
            "spec.approval.approvedBy changed from {recorded} to {now} after the replay started; an approval cannot change once a replay runs"
        )),
        _ => None,
    };
    if let Some(message) = approval_problem {
        return halt(facts, stages, "ApprovalChanged", message);
    }
    // Without the admission policy the spec could change after the start too.
    if !facts.refused.is_empty() {
        return halt(facts, stages, "SpecRefused", refusal(facts));
    }
    let Some(current) = stages
        .iter()
        .rev()
        .find(|s| s.started_at.is_some())
        .cloned()
    else {
        return Decision::new(ReplayPhase::Failed, "no stage has started", stages);
    };
    let name = current.stage.name;
    if current.finished_at.is_none() {
        match ownership(facts, &current) {
            Ownership::Foreign if current.job_uid.is_some() => {
                let message = format!(
                    "Job {} of the {name} stage was replaced by another Job of the same name (its uid is not the one the operator recorded); the operator does not follow a Job it did not create. Find out who replaced it (the API server's audit log) and create a new ReplayJob for the events not replayed",
                    current.job
                );
                return halt(facts, stages, "JobReplaced", message);
            }
            Ownership::Foreign => {
                return halt(facts, stages, "ForeignJob", not_created(&current.job));
            }
            Ownership::Absent => {
                if current.job_uid.is_some() {
                    let message = format!(
                        "Job {} of the {name} stage was deleted while it ran; its batches may have partly run, and the operator does not create it again (that could replay events twice). Create a new ReplayJob for the events not replayed",
                        current.job
                    );
                    return halt(facts, stages, "JobDeleted", message);
                }
                if let Some((stage, message)) = &facts.rejected
                    && *stage == name
                {
                    let message = format!(
                        "the API server refuses Job {} of the {name} stage: {message}",
                        current.job
                    );
                    return halt(facts, stages, "JobRejected", message);
                }
                // No Job was created (the operator stopped before the create, or the create was
                // refused), or one was created and deleted before its uid was recorded. Either
                // way nothing ran: the operator creates its Jobs suspended and resumes one only
                // once the status records its uid. Create it now, under the same name — unless
                // the replay was suspended since.
                if facts.suspend {
                    let message = format!(
                        "suspended (spec.suspend) before Job {} of the {name} stage was created; set spec.suspend to false to create it",
                        current.job
                    );
                    return Decision::new(ReplayPhase::Suspended, message, stages);
                }
                let message = format!("{name}: creating Job {}", current.job);
                return Decision::new(name.running_phase(), message, stages)
                    .action(Action::Start(current));
            }
            Ownership::Ours(view) => {
                let expected = expected_shape(&current.stage, facts.pacing);
                if let Some(difference) = view.shape.difference(&expected) {
                    let message = format!(
                        "Job {} of the {name} stage was edited after the operator created it ({difference}); the replay stops rather than run batches differently from what was approved. Find out who edited it (the API server's audit log), then create a new ReplayJob for the events not replayed",
                        current.job
                    );
                    return halt(facts, stages, "JobTampered", message);
                }
                if view.outcome == JobOutcome::Running && !view.owned_by_replay {
                    let message = format!(
                        "Job {} of the {name} stage no longer names this ReplayJob as its controller (metadata.ownerReferences was edited), so deleting the replay would leave it running unwatched; the replay halts and the Job is suspended. Find out who edited it (the API server's audit log), delete the Job, then create a new ReplayJob for the events not replayed",
                        current.job
                    );
                    return halt(facts, stages, "JobDisowned", message);
                }
                if let Some(decision) = failed_batch(facts, &stages, &current, view) {
                    return decision;
                }
                if view.outcome == JobOutcome::Running {
                    return running(facts, stages, &current, view);
                }
            }
        }
    }
    // The current stage succeeded.
    match name {
        StageName::Main => succeeded(stages),
        StageName::Canary => after_canary(facts, stages, &current),
    }
}

fn failed_batch(
    facts: &ReplayFacts,
    stages: &[StageRecord],
    current: &StageRecord,
    view: &JobView,
) -> Option<Decision> {
    let why = match &view.outcome {
        JobOutcome::Failed(why) => why.clone(),
        _ if view.failed > 0 => format!("{} batch(es) failed", view.failed),
        _ => return None,
    };
    let stage = &current.stage;
    // Indices run in order (parallelism 1), so the first batch not done is the one that failed.
    let index = view.succeeded.min(stage.batches().saturating_sub(1));
    let first_unreplayed = stage.first_event + (index * stage.batch_size).min(stage.events);
    let message = format!(
        "batch {} ({} of the frozen list) failed in Job {} of the {} stage: {why}. The replay halts and is not retried as a whole; {} batch(es) of the stage succeeded. See kubectl logs job/{}; to replay the rest, create a new ReplayJob for the events from line {} of ConfigMap {} on",
        stage.first_batch + index,
        batch_lines(stage, index),
        current.job,
        stage.name,
        view.succeeded,
        current.job,
        first_unreplayed + 1,
        match &facts.scope {
            ScopeFacts::Frozen { config_map, .. } => config_map.as_str(),
            ScopeFacts::NotFrozen { .. } | ScopeFacts::Foreign { .. } => "(not frozen)",
        }
    );
    Some(halt(facts, stages.to_vec(), "BatchFailed", message))
}

fn running(
    facts: &ReplayFacts,
    stages: Vec<StageRecord>,
    current: &StageRecord,
    view: &JobView,
) -> Decision {
    let name = current.stage.name;
    let batches = current.stage.batches();
    if facts.suspend {
        let decision = Decision::new(
            ReplayPhase::Suspended,
            format!(
                "suspended (spec.suspend) in the {name} stage after {} of {batches} batch(es) of Job {}; set spec.suspend to false to resume",
                view.succeeded, current.job
            ),
            stages,
        );
        return if view.suspended {
            decision
        } else {
            decision.action(Action::Suspend {
                job: current.job.clone(),
                suspend: true,
            })
        };
    }
    let decision = Decision::new(
        name.running_phase(),
        format!(
            "{name}: {} of {batches} batch(es) done in Job {}",
            view.succeeded, current.job
        ),
        stages,
    );
    if !view.suspended {
        decision
    } else if facts.uid_unrecorded.contains(&name) {
        decision.recheck(RECORD_RETRY)
    } else {
        decision.action(Action::Suspend {
            job: current.job.clone(),
            suspend: false,
        })
    }
}

fn succeeded(stages: Vec<StageRecord>) -> Decision {
    let batches: u32 = stages.iter().map(|s| s.stage.batches()).sum();
    let events: u32 = stages.iter().map(|s| s.stage.events).sum();
    Decision::new(
        ReplayPhase::Succeeded,
        format!("all {batches} batch(es), {events} event(s), replayed"),
        stages,
    )
}

fn after_canary(facts: &ReplayFacts, stages: Vec<StageRecord>, canary: &StageRecord) -> Decision {
    let mut checks = None;
    if facts.has_checks && !facts.verified {
        // Time since the canary ended, less the delay: what counts against the patience. A
        // canary without a recorded end counts from now.
        let settled = canary
            .finished_at
            .map(|at| seconds_between(at, facts.now))
            .unwrap_or(0.0)
            - facts.verification_delay.as_secs_f64();
        if settled < 0.0 {
            let message = format!(
                "canary succeeded; spec.verification runs {}s after it (spec.verificationDelay), once its effects can be in the metrics",
                facts.verification_delay.as_secs_f64()
            );
            return Decision::new(ReplayPhase::Verifying, message.clone(), stages)
                .condition(ConditionSpec::new(
                    VERIFIED,
                    Truth::Unknown,
                    "Settling",
                    message,
                ))
                .recheck(
                    Duration::try_from_secs_f64(-settled).unwrap_or(facts.verification_delay),
                );
        }
        let Some(outcomes) = &facts.verification else {
            let mut decision = Decision::new(
                ReplayPhase::Verifying,
                "canary succeeded; evaluating spec.verification",
                stages,
            );
            decision.need = Some(Need::Verification);
            return decision;
        };
        checks = Some(outcomes.clone());
        if let Some((check, value)) = outcomes.iter().find_map(|c| match c.result {
            CheckResult::Fails(value) => Some((c, value)),
            _ => None,
        }) {
            let message = format!(
                "verification check {:?} failed after the canary: {} returned {value}. The main stage does not start; find out why, then create a new ReplayJob for the events after the canary",
                check.name, check.query
            );
            let mut decision =
                halt(facts, stages, "VerificationFailed", message.clone()).condition(
                    ConditionSpec::new(VERIFIED, Truth::False, "CheckFailed", message),
                );
            decision.checks = checks;
            return decision;
        }
        let unknown: Vec<String> = outcomes
            .iter()
            .filter_map(|c| match &c.result {
                CheckResult::Unknown(why) => Some(format!("spec.verification {:?}: {why}", c.name)),
                _ => None,
            })
            .collect();
        if !unknown.is_empty() {
            if settled >= VERIFICATION_PATIENCE.as_secs_f64() {
                let message = format!(
                    "verification gave no answer within {}s after the canary and spec.verificationDelay: {}. The main stage does not start; fix the queries or Prometheus, then create a new ReplayJob for the events after the canary",
                    VERIFICATION_PATIENCE.as_secs(),
                    unknown.join("; ")
                );
                let mut decision =
                    halt(facts, stages, "VerificationUnavailable", message.clone()).condition(
                        ConditionSpec::new(VERIFIED, Truth::False, "NoAnswer", message),
                    );
                decision.checks = checks;
                return decision;
            }
            let message = format!(
                "canary succeeded; verification has no answer yet: {}",
                unknown.join("; ")
            );
            let mut decision = Decision::new(ReplayPhase::Verifying, message.clone(), stages)
                .condition(ConditionSpec::new(
                    VERIFIED,
                    Truth::Unknown,
                    "NoAnswerYet",
                    message,
                ))
                .recheck(VERIFICATION_RETRY);
            decision.checks = checks;
            return decision;
        }
    }
    let mut decision =
        next_after_canary(facts, stages).condition(verified_condition(facts.has_checks));
    decision.checks = checks;
    decision
}

fn verified_condition(has_checks: bool) -> ConditionSpec {
    if has_checks {
        ConditionSpec::new(
            VERIFIED,
            Truth::True,
            "ChecksHeld",
            "every spec.verification check held after the canary",
        )
    } else {
        ConditionSpec::new(
            VERIFIED,
            Truth::True,
            "NoChecks",
            "spec.verification has no checks; the canary's success is the only check",
        )
    }
}

fn next_after_canary(facts: &ReplayFacts, stages: Vec<StageRecord>) -> Decision {
    let Some(main) = stages
        .iter()
        .find(|s| s.stage.name == StageName::Main)
        .cloned()
    else {
        return succeeded(stages);
    };
    if facts.suspend {
        return Decision::new(
            ReplayPhase::Suspended,
            format!(
                "canary succeeded and verified; suspended (spec.suspend) before the main stage: set spec.suspend to false to start Job {}",
                main.job
            ),
            stages,
        );
    }
    if let Some((StageName::Main, message)) = &facts.rejected {
        let message = format!(
            "the API server refuses Job {} of the main stage: {message}",
            main.job
        );
        return halt(facts, stages, "JobRejected", message);
    }
    // The main stage has not started, so no Job of it was created by the operator.
    if matches!(job_of(facts, StageName::Main), JobObservation::Present(_)) {
        return halt(facts, stages, "ForeignJob", not_created(&main.job));
    }
    let mut stages = stages;
    let mut started = main.clone();
    started.started_at = Some(facts.now);
    if let Some(slot) = stages.iter_mut().find(|s| s.stage.name == StageName::Main) {
        *slot = started.clone();
    }
    let decision = Decision::new(
        ReplayPhase::Running,
        format!(
            "canary verified; main stage: {} batch(es) of up to {} event(s) run as Job {}",
            main.stage.batches(),
            main.stage.batch_size,
            main.job
        ),
        stages,
    );
    start(decision, started)
}
