//! The `Ready` and `Stalled` conditions every kind carries for GitOps tools: kstatus (what
//! Flux's health checks and `kubectl wait`-style tooling read) takes `Stalled=True` as Failed,
//! `Ready=True` as Current and `Ready=False` as InProgress. A pure function of the phase.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use super::backlog_budget::BudgetPhase;
use super::compensation::CompensationPhase;
use super::conditions::{ConditionSpec, Truth, merge_conditions};
use super::replay_job::ReplayPhase;

pub const READY: &str = "Ready";
pub const STALLED: &str = "Stalled";

/// What a GitOps tool should make of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Reconciled and doing its job.
    Ready { reason: String, message: String },
    /// Not there yet, and may get there without anyone's help.
    InProgress { reason: String, message: String },
    /// Will not get there until someone changes something.
    Stalled { reason: String, message: String },
}

impl Readiness {
    /// The two conditions that say so.
    pub fn conditions(&self) -> [ConditionSpec; 2] {
        let (ready, stalled, reason, message) = match self {
            Readiness::Ready { reason, message } => (Truth::True, Truth::False, reason, message),
            Readiness::InProgress { reason, message } => {
                (Truth::False, Truth::False, reason, message)
            }
            Readiness::Stalled { reason, message } => (Truth::False, Truth::True, reason, message),
        };
        let stalled_message = if stalled == Truth::True {
            message.clone()
        } else {
            "nothing waits for a change by a person".to_owned()
        };
        let stalled_reason = if stalled == Truth::True {
            reason.clone()
        } else {
            "NotStalled".to_owned()
        };
        [
            ConditionSpec::new(READY, ready, reason.clone(), message.clone()),
            ConditionSpec::new(STALLED, stalled, stalled_reason, stalled_message),
        ]
    }
}

/// A budget is Ready while the operator enforces it (even when the deadline is at risk or
/// breached: that is the workload's state, alerted on by the phase, not a failed rollout);
/// Stalled when its spec or target is unusable or another autoscaler owns the target; in
/// progress while metrics are missing or before the first evaluation.
pub fn of_budget(phase: Option<BudgetPhase>, explanation: Option<&str>) -> Readiness {
    let message = explanation.unwrap_or_default().to_owned();
    let reason = phase.map_or_else(|| "NotEvaluated".to_owned(), |p| format!("{p:?}"));
    match phase {
        Some(
            BudgetPhase::Healthy
            | BudgetPhase::AtRisk
            | BudgetPhase::Breaching
            | BudgetPhase::Undrainable,
        ) => Readiness::Ready { reason, message },
        Some(BudgetPhase::Invalid | BudgetPhase::Conflict) => {
            Readiness::Stalled { reason, message }
        }
        Some(BudgetPhase::MetricsUnavailable) | None => Readiness::InProgress { reason, message },
    }
}

/// A replay is Ready once it succeeded; Stalled when it failed or halted (it is never retried
/// as a whole) or was refused before the start (it waits for a fixed spec and a new
/// approval); in progress otherwise, including while it waits for its approval.
pub fn of_replay(phase: Option<ReplayPhase>, message: Option<&str>) -> Readiness {
    let reason = phase.map_or_else(|| "Pending".to_owned(), |p| format!("{p:?}"));
    let message = message.unwrap_or_default().to_owned();
    match phase {
        Some(ReplayPhase::Succeeded) => Readiness::Ready { reason, message },
        Some(ReplayPhase::Failed | ReplayPhase::Halted | ReplayPhase::Refused) => {
            Readiness::Stalled { reason, message }
        }
        _ => Readiness::InProgress { reason, message },
    }
}

/// A compensation is Ready once it succeeded or turned out to be a duplicate (the id's first
/// Compensation has the result; this one has no second effect); Stalled at every other end
/// and when refused (each waits for a person: to re-evaluate, to reconcile an unknown outcome
/// downstream, to fix the template); in progress otherwise.
pub fn of_compensation(phase: Option<CompensationPhase>, message: Option<&str>) -> Readiness {
    let reason = phase.map_or_else(|| "Pending".to_owned(), |p| format!("{p:?}"));
    let message = message.unwrap_or_default().to_owned();
    match phase {
        Some(CompensationPhase::Succeeded | CompensationPhase::Duplicate) => {
            Readiness::Ready { reason, message }
        }
        Some(
            CompensationPhase::Refused
            | CompensationPhase::PreconditionFailed
            | CompensationPhase::Unknown
            | CompensationPhase::Failed,
        ) => Readiness::Stalled { reason, message },
        Some(CompensationPhase::AwaitingApproval | CompensationPhase::Executing) | None => {
            Readiness::InProgress { reason, message }
        }
    }
}

/// `conditions` with Ready and Stalled set to `readiness` (transition times kept when the
/// status is unchanged).
pub fn merged(
    conditions: &[Condition],
    readiness: &Readiness,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    merge_conditions(conditions, &readiness.conditions(), generation, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_of(readiness: &Readiness) -> (String, String) {
        let [ready, stalled] = readiness.conditions();
        (
            ready.status.as_str().to_owned(),
            stalled.status.as_str().to_owned(),
        )
    }

    #[test]
    fn budgets_in_every_phase() {
        let t = |p| status_of(&of_budget(Some(p), Some("x")));
        let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
        assert_eq!(t(BudgetPhase::Healthy), pair("True", "False"));
        assert_eq!(t(BudgetPhase::Breaching), pair("True", "False"));
        assert_eq!(t(BudgetPhase::MetricsUnavailable), pair("False", "False"));
        assert_eq!(t(BudgetPhase::Invalid), pair("False", "True"));
        assert_eq!(t(BudgetPhase::Conflict), pair("False", "True"));
        assert_eq!(status_of(&of_budget(None, None)), pair("False", "False"));
    }

    #[test]
    fn replays_in_every_phase() {
        let t = |p| status_of(&of_replay(Some(p), None));
        let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
        assert_eq!(t(ReplayPhase::Succeeded), pair("True", "False"));
        assert_eq!(t(ReplayPhase::Halted), pair("False", "True"));
        assert_eq!(t(ReplayPhase::Failed), pair("False", "True"));
        assert_eq!(t(ReplayPhase::Refused), pair("False", "True"));
        assert_eq!(t(ReplayPhase::AwaitingApproval), pair("False", "False"));
        assert_eq!(t(ReplayPhase::Running), pair("False", "False"));
    }

    #[test]
    fn the_reason_names_the_phase() {
        let [ready, _] =
            of_budget(Some(BudgetPhase::MetricsUnavailable), Some("no data")).conditions();
        assert_eq!(
            (ready.reason.as_str(), ready.message.as_str()),
            ("MetricsUnavailable", "no data")
        );
    }
}
