//! A compensation's life (pure): a new business action with a contract, not a rollback.
//!
//! The request is frozen and claimed under its `compensationId` (the first Compensation to
//! claim an id is the only one that can ever run it), a second person approves exactly the
//! frozen request, and the worker runs once as a Job. What the worker reports decides the end:
//! a precondition that no longer holds stops everything (nothing is overwritten), a sub-action
//! whose outcome is not known is never run again (it is reconciled by its operation id), and
//! every end is terminal.

use crate::digest::sha256_hex;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::condition::{ConditionSpec, Truth};
pub use crate::phase::CompensationPhase;

/// Condition types of a Compensation.
pub const FROZEN: &str = "RequestFrozen";
pub const APPROVED: &str = "Approved";
pub const PRECONDITION_HELD: &str = "PreconditionHeld";

/// Longest termination message the kubelet keeps (bytes): a report must fit. A longer one is
/// cut to its last 4096 bytes, which are no JSON.
pub const REPORT_LIMIT: usize = 4096;

/// Bytes a report keeps for the worker's own words: messages and the precondition as found.
pub const REPORT_WORDS_ROOM: usize = 512;

/// Bytes of a report beyond its sub-action records, counted as the admission rule counts them.
pub const REPORT_HEADER_BYTES: usize = 142;

/// Bytes of one sub-action record beyond its name (twice: the name and in the operation id) and
/// the compensation id, counted as the admission rule counts them (two index digits, both
/// timestamps at their longest, the comma before the next record).
pub const REPORT_RECORD_BYTES: usize = 154;

/// The bytes the admission rule counts for a report in which every sub-action succeeded,
/// without any of the worker's words: what `compensationId` and `proposedAction.subActions`
/// alone make the worker write. With [`REPORT_WORDS_ROOM`] it must stay within
/// [`REPORT_LIMIT`], or the worker could not report a success the operator can read.
pub fn report_floor(compensation_id: &str, sub_actions: &[&str]) -> usize {
    REPORT_HEADER_BYTES
        + sub_actions
            .iter()
            .map(|name| REPORT_RECORD_BYTES + compensation_id.len() + 2 * name.len())
            .sum::<usize>()
}

/// The name of everything an id owns in its namespace (the claim, the Job, the result): the
/// same id always gives the same name, so a second Compensation with that id can neither claim
/// it nor create a second Job, whatever its own name and however stale a cache is.
pub fn child_name(compensation_id: &str) -> String {
    format!(
        "compensation-{}",
        &sha256_hex(compensation_id.as_bytes())[..20]
    )
}

/// The stable operation id of sub-action `index` (0-based) named `name`: what the downstream
/// system deduplicates on, and what an unknown outcome is looked up by.
pub fn operation_id(compensation_id: &str, index: usize, name: &str) -> String {
    format!("{compensation_id}/{index}-{name}")
}

// ---------------------------------------------------------------------------------------------
// The worker's report

/// What a sub-action's record says.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SubActionState {
    /// Begun, with no result recorded: as good as unknown.
    Started,
    Succeeded,
    Failed,
    /// The call went out and no answer came back (a timeout, a lost connection).
    Unknown,
}

/// One sub-action as the worker records it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubActionRecord {
    pub name: String,
    pub operation_id: String,
    pub state: SubActionState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The precondition as the worker read it, before any sub-action.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreconditionRecord {
    pub held: bool,
    /// The state and version the worker found.
    #[serde(default)]
    pub observed: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The worker's report: its termination message, one JSON object.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkerReport {
    /// The sha256 of the request file the worker acted on.
    pub request_sha256: String,
    pub precondition: PreconditionRecord,
    #[serde(default)]
    pub sub_actions: Vec<SubActionRecord>,
}

/// Why a report cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ReportProblem {
    #[error("the worker ended without a report (no termination message)")]
    Missing,
    #[error("the worker's report is not the contract's JSON: {0}")]
    Unreadable(String),
    #[error(
        "the worker's report reached the {REPORT_LIMIT}-byte limit of a termination message and was cut: the worker must keep its messages short (the contract leaves {REPORT_WORDS_ROOM} bytes for them)"
    )]
    Cut,
}

/// Reads a termination message.
pub fn parse_report(text: &str) -> Result<WorkerReport, ReportProblem> {
    let at_the_limit = text.len() >= REPORT_LIMIT;
    let text = text.trim();
    if text.is_empty() {
        return Err(ReportProblem::Missing);
    }
    serde_json::from_str(text).map_err(|e| {
        if at_the_limit {
            ReportProblem::Cut
        } else {
            ReportProblem::Unreadable(e.to_string())
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Facts and decisions

/// The approval in the spec, checked against the frozen request.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ApprovalProblem {
    #[error(
        "waiting for approval: a member of the approvers group other than {requested_by} reviews the frozen request and the spec and sets spec.approval.approvedBy to their own user name, spec.approval.requestSha256 to status.request.sha256 and spec.approval.specSha256 to status.specSha256"
    )]
    Missing { requested_by: String },
    #[error(
        "spec.approval.approvedBy {approved_by:?} is the requester: a compensation needs a second person's approval"
    )]
    SelfApproved { approved_by: String },
    #[error(
        "spec.approval.requestSha256 {approved} is not the frozen request's sha256 (status.request.sha256 {frozen}): an approver reviews ConfigMap {config_map} and approves again with requestSha256 {frozen}"
    )]
    Mismatch {
        approved: String,
        frozen: String,
        config_map: String,
    },
    #[error(
        "spec.approval.specSha256 {approved} is not the sha256 of the spec as it stands ({current}, status.specSha256): the spec (its worker template, say) changed after it was reviewed. An approver reads it again and approves with specSha256 {current}"
    )]
    SpecMismatch { approved: String, current: String },
}

/// Who holds the compensation id in the namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Not claimed yet (the claim is made by freezing the request).
    Free,
    /// This Compensation's, with the frozen request's sha256.
    Ours { sha256: String },
    /// Another Compensation claimed it first, and what it ended with if it did.
    Theirs {
        name: String,
        result: Option<(CompensationPhase, String)>,
    },
}

/// What the Job under the id's name is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobSeen {
    Absent,
    /// Not created by this Compensation (another uid than the one recorded or remembered).
    Foreign,
    Ours {
        uid: String,
        suspended: bool,
        outcome: JobEnd,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobEnd {
    Running,
    /// Finished; the pod's report (or why there is none).
    Finished {
        succeeded: bool,
        report: Result<WorkerReport, ReportProblem>,
    },
}

/// Everything a decision depends on.
#[derive(Clone, Debug)]
pub struct CompensationFacts {
    pub compensation_id: String,
    pub claim: Claim,
    pub approval: Result<String, ApprovalProblem>,
    /// What the operator's checks or the API server refuse in the template.
    pub refused: Vec<String>,
    /// When the status records the start (written before the Job is created).
    pub started_at: Option<Timestamp>,
    /// The Job uid the status records.
    pub job_uid: Option<String>,
    /// The uid this process got from the create, not recorded yet.
    pub uid_unrecorded: Option<String>,
    pub job: JobSeen,
    /// The terminal phase and message the status records: a terminal compensation stays so.
    pub ended: Option<(CompensationPhase, String)>,
    pub now: Timestamp,
}

/// A side effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Claim the id and freeze the request (create the immutable ConfigMap).
    Freeze,
    /// Record the start, then create the Job (suspended) if none exists.
    Start,
    /// Record the Job's uid (the status write) and resume it.
    Resume { uid: String },
}

/// What to do, and what the status says.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub phase: CompensationPhase,
    pub message: String,
    pub conditions: Vec<ConditionSpec>,
    pub action: Option<Action>,
    /// The report to record (precondition and sub-actions), when there is one.
    pub report: Option<WorkerReport>,
    /// The claim holder this one duplicates.
    pub duplicate_of: Option<String>,
}

impl Decision {
    fn new(phase: CompensationPhase, message: impl Into<String>) -> Decision {
        Decision {
            phase,
            message: message.into(),
            conditions: Vec::new(),
            action: None,
            report: None,
            duplicate_of: None,
        }
    }

    fn action(mut self, action: Action) -> Decision {
        self.action = Some(action);
        self
    }

    fn condition(mut self, condition: ConditionSpec) -> Decision {
        self.conditions.retain(|c| c.type_ != condition.type_);
        self.conditions.push(condition);
        self
    }
}

/// Decides what to do next. Pure: the same facts give the same decision.
pub fn decide(facts: &CompensationFacts) -> Decision {
    if let Some((phase, message)) = &facts.ended {
        // A duplicate stays one; it only follows the first's result into its message.
        if let (CompensationPhase::Duplicate, Claim::Theirs { name, result }) =
            (phase, &facts.claim)
        {
            return duplicate(facts, name, result.as_ref());
        }
        return Decision::new(*phase, message.clone());
    }
    let sha256 = match &facts.claim {
        Claim::Theirs { name, result } => return duplicate(facts, name, result.as_ref()),
        Claim::Free => {
            return Decision::new(
                CompensationPhase::AwaitingApproval,
                "freezing the request and claiming its compensationId",
            )
            .action(Action::Freeze);
        }
        Claim::Ours { sha256 } => sha256,
    };
    let frozen = ConditionSpec::new(
        FROZEN,
        Truth::True,
        "Frozen",
        format!(
            "the request is frozen with sha256 {sha256}; compensationId {} is this Compensation's",
            facts.compensation_id
        ),
    );
    let decision = match facts.started_at {
        None => before_start(facts),
        Some(_) => during(facts),
    };
    let approved = match &facts.approval {
        Ok(approver) => ConditionSpec::new(
            APPROVED,
            Truth::True,
            "Approved",
            format!("approved by {approver}"),
        ),
        Err(problem) => {
            ConditionSpec::new(APPROVED, Truth::False, "NotApproved", problem.to_string())
        }
    };
    decision.condition(frozen).condition(approved)
}

fn duplicate(
    facts: &CompensationFacts,
    first: &str,
    result: Option<&(CompensationPhase, String)>,
) -> Decision {
    let outcome = match result {
        Some((phase, message)) => format!("it ended {phase:?}: {message}"),
        None => "it has not ended yet; its status says how it goes".to_owned(),
    };
    let mut decision = Decision::new(
        CompensationPhase::Duplicate,
        format!(
            "compensationId {} belongs to Compensation {first}, which came first; this one never runs, and {outcome}",
            facts.compensation_id
        ),
    );
    decision.duplicate_of = Some(first.to_owned());
    decision
}

fn before_start(facts: &CompensationFacts) -> Decision {
    if !facts.refused.is_empty() {
        return Decision::new(
            CompensationPhase::Refused,
            format!(
                "the operator refuses to run this compensation: {}. Fix spec.template: an approver removes spec.approval, the requester corrects it, an approver approves again",
                facts.refused.join("; ")
            ),
        );
    }
    match &facts.approval {
        Err(problem) => Decision::new(CompensationPhase::AwaitingApproval, problem.to_string()),
        Ok(approver) => Decision::new(
            CompensationPhase::Executing,
            format!("approved by {approver}; starting the worker"),
        )
        .action(Action::Start),
    }
}

fn during(facts: &CompensationFacts) -> Decision {
    let executing = |message: String| Decision::new(CompensationPhase::Executing, message);
    match (&facts.job, &facts.job_uid) {
        (JobSeen::Foreign, _) => Decision::new(
            CompensationPhase::Unknown,
            "the Job under this compensation's name is not the one the operator created: whatever it did is not known. Reconcile the sub-actions by their operation ids downstream and find out who replaced the Job (the API server's audit log)",
        ),
        // Recorded, and gone before it was seen to end: it may have run.
        (JobSeen::Absent, Some(uid)) => Decision::new(
            CompensationPhase::Unknown,
            format!(
                "Job {uid} vanished before the operator saw it end: its sub-actions may have run. Reconcile them by their operation ids downstream; the operator never runs them again"
            ),
        ),
        // Never recorded: created suspended and never resumed, or never created at all. Either
        // way nothing ran, so it is created (again).
        (JobSeen::Absent, None) => {
            executing("creating the worker's Job".to_owned()).action(Action::Start)
        }
        (
            JobSeen::Ours {
                uid,
                suspended,
                outcome,
            },
            recorded,
        ) => {
            if recorded.is_none() {
                let known = facts.uid_unrecorded.as_deref() == Some(uid.as_str());
                // A Job of ours that this process did not create is one a previous process
                // created: it is ours only if still suspended (it never ran).
                if known || *suspended {
                    return executing(format!("recording Job {uid} and starting it"))
                        .action(Action::Resume { uid: uid.clone() });
                }
                return Decision::new(
                    CompensationPhase::Unknown,
                    format!(
                        "Job {uid} runs without the status recording it: what it did is not known. Reconcile the sub-actions by their operation ids downstream"
                    ),
                );
            }
            if recorded.as_deref() != Some(uid.as_str()) {
                return Decision::new(
                    CompensationPhase::Unknown,
                    format!(
                        "Job {uid} replaced the one the status records: whatever either did is not known. Reconcile the sub-actions by their operation ids downstream"
                    ),
                );
            }
            match outcome {
                JobEnd::Running if *suspended => executing(format!("resuming Job {uid}"))
                    .action(Action::Resume { uid: uid.clone() }),
                JobEnd::Running => executing(format!("the worker runs in Job {uid}")),
                JobEnd::Finished { succeeded, report } => ended(facts, *succeeded, report),
            }
        }
    }
}

fn ended(
    facts: &CompensationFacts,
    succeeded: bool,
    report: &Result<WorkerReport, ReportProblem>,
) -> Decision {
    let report = match report {
        Ok(report) => report,
        Err(problem) => {
            return Decision::new(
                CompensationPhase::Unknown,
                format!(
                    "{problem}, after the Job {}: its sub-actions may have run. Reconcile them by their operation ids downstream; the operator never runs them again",
                    if succeeded { "succeeded" } else { "failed" }
                ),
            );
        }
    };
    let expected_sha = match &facts.claim {
        Claim::Ours { sha256 } => sha256.as_str(),
        _ => "",
    };
    let mut decision = outcome_of(report, expected_sha);
    let precondition = &report.precondition;
    decision = decision.condition(ConditionSpec::new(
        PRECONDITION_HELD,
        Truth::from_bool(precondition.held),
        if precondition.held { "Held" } else { "NotHeld" },
        format!(
            "found {}{}",
            if precondition.observed.is_empty() {
                "nothing reported"
            } else {
                &precondition.observed
            },
            if precondition.message.is_empty() {
                String::new()
            } else {
                format!(": {}", precondition.message)
            }
        ),
    ));
    decision.report = Some(report.clone());
    decision
}

/// The end a report means.
fn outcome_of(report: &WorkerReport, expected_sha: &str) -> Decision {
    use CompensationPhase::*;
    if report.request_sha256 != expected_sha {
        return Decision::new(
            Unknown,
            format!(
                "the worker acted on a request with sha256 {}, not the approved {expected_sha}: what it did is not what was approved. Reconcile its sub-actions by their operation ids downstream",
                report.request_sha256
            ),
        );
    }
    let not = |state: SubActionState| {
        report
            .sub_actions
            .iter()
            .filter(move |s| s.state == state)
            .map(|s| format!("{} ({})", s.name, s.operation_id))
            .collect::<Vec<_>>()
    };
    let unknown: Vec<String> = not(SubActionState::Unknown)
        .into_iter()
        .chain(not(SubActionState::Started))
        .collect();
    if !report.precondition.held {
        if report.sub_actions.is_empty() {
            return Decision::new(
                PreconditionFailed,
                format!(
                    "the precondition no longer holds (found {}): nothing was done. Re-evaluate with the current state; a new compensation needs a new compensationId",
                    report.precondition.observed
                ),
            );
        }
        return Decision::new(
            Unknown,
            "the worker reports a precondition that does not hold and sub-actions anyway: reconcile them by their operation ids downstream",
        );
    }
    if !unknown.is_empty() {
        return Decision::new(
            Unknown,
            format!(
                "the outcome of {} is not known: reconcile by operation id downstream; the operator never runs them again",
                unknown.join(", ")
            ),
        );
    }
    let failed = not(SubActionState::Failed);
    if !failed.is_empty() {
        return Decision::new(Failed, format!("{} failed", failed.join(", ")));
    }
    if report.sub_actions.is_empty() {
        return Decision::new(Failed, "the worker reports no sub-action: nothing was done");
    }
    Decision::new(
        Succeeded,
        format!("{} sub-actions succeeded", report.sub_actions.len()),
    )
}

#[cfg(test)]
mod tests;
