//! The phases the decisions put a budget and a replay in, as the API spells them.

use serde::{Deserialize, Serialize};

/// The budget's health.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BudgetPhase {
    /// Oldest age below the warning fraction of the deadline and the backlog drains in time.
    Healthy,
    /// Oldest age past the warning fraction, or the drain is predicted to miss the deadline.
    AtRisk,
    /// Oldest age past the critical fraction of the deadline.
    Breaching,
    /// Even the capped replica count cannot complete events faster than they arrive.
    Undrainable,
    /// A required query returned nothing usable: the operator holds the last decision.
    MetricsUnavailable,
    /// Another autoscaler owns the target: the operator does not write to it.
    Conflict,
    /// Something the API server could not check is wrong (e.g. the target does not exist).
    Invalid,
}

/// Where a replay is in its life.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReplayPhase {
    /// The scope could not be frozen yet (e.g. the `eventIdsFrom` ConfigMap does not exist).
    Pending,
    AwaitingApproval,
    Approved,
    Canary,
    Verifying,
    Running,
    Suspended,
    Succeeded,
    /// Refused before it started, by the operator's checks or by the API server (the Job
    /// template): nothing ran, and the spec can still be fixed and approved again.
    Refused,
    /// Ended for good before anything ran (an empty or unusable frozen scope): never
    /// decided again; a new ReplayJob is the way on.
    Failed,
    /// Stopped for good after a stage started.
    Halted,
}

/// Where a compensation is in its life. Every phase from `Duplicate` on is terminal: the
/// operator never runs the compensation again, whatever changes afterwards.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompensationPhase {
    /// The request is frozen; a second person approves exactly that.
    AwaitingApproval,
    /// The operator's checks or the API server refuse the worker's template: fix the spec
    /// (an approver removes spec.approval first) and approve again.
    Refused,
    /// The worker runs: it reads the precondition, then executes the sub-actions.
    Executing,
    /// Another Compensation with the same compensationId came first: this one never runs.
    Duplicate,
    /// Every sub-action succeeded.
    Succeeded,
    /// The current state was not the expected one: nothing was done; re-evaluate.
    PreconditionFailed,
    /// Some outcome is not known: reconcile it by its operation id, never re-run it.
    Unknown,
    /// A sub-action failed with a known outcome.
    Failed,
}

impl CompensationPhase {
    /// Whether the phase is final: nothing is decided or run again.
    pub fn terminal(self) -> bool {
        !matches!(
            self,
            CompensationPhase::AwaitingApproval
                | CompensationPhase::Refused
                | CompensationPhase::Executing
        )
    }
}
