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
