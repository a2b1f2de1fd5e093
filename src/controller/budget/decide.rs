//! One budget decision (pure): from the spec, the facts gathered once, the previous status (the
//! decision's memory) and the time, a plan covering scaling, event classes, the control
//! document, the status and the Events together, in the order the steps must run.
//!
//! The order loses nothing when a step fails: the scale comes first and stops the rest when it
//! fails (status would describe a scale that did not happen); the status that records the
//! decision comes next and stops the rest when it fails (Events and the document describe it,
//! and the whole decision is made again at the retry); then the Events, derived from the
//! status change; the control document last, so a failed document write is retried without
//! losing an Event.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;

use crate::api::backlog_budget::{BacklogBudget, BacklogBudgetStatus, BudgetPhase};
use crate::api::conditions::{ConditionSpec, Truth};
use crate::api::readiness;
use crate::controller::plan::{OnFailure, PlannedEvent, Step};
use crate::core::budget_config::BudgetConfig;
use crate::core::scaling::{
    SCALING_ACTIVE, ScaleChange, ScalingDecision, decide as decide_scaling,
};

use super::facts::{BudgetFacts, ScalingFacts};
use super::inputs::{conflict_inputs, scaling_inputs};
use super::{capacity, classes, control_document, grouping, status};

/// How soon a budget whose spec cannot be used is looked at again.
pub const INVALID_RETRY: Duration = Duration::from_secs(30);

/// The spec as the decision reads it: the object, and its scaling settings or why they are
/// unusable.
pub struct BudgetSettings<'a> {
    pub budget: &'a BacklogBudget,
    pub config: Result<BudgetConfig, String>,
}

impl<'a> BudgetSettings<'a> {
    pub fn of(budget: &'a BacklogBudget) -> Self {
        BudgetSettings {
            budget,
            config: BudgetConfig::from_spec(&(&budget.spec).into()).map_err(|e| e.to_string()),
        }
    }

    /// How often the budget is evaluated, when its spec says.
    pub fn poll(&self) -> Option<Duration> {
        self.config
            .as_ref()
            .ok()
            .map(|config| Duration::from_secs_f64(config.poll_interval_seconds))
    }
}

/// One step of a budget's plan.
#[derive(Clone, Debug, PartialEq)]
pub enum BudgetStep {
    /// Set the target's replicas through `/scale`.
    Scale(ScaleChange),
    /// Apply the status.
    WriteStatus(Box<BacklogBudgetStatus>),
    Publish(PlannedEvent),
    /// Apply the control document's ConfigMap, on the capacity the other requests leave.
    WriteDocument(Box<ConfigMap>),
}

impl Step for BudgetStep {
    fn on_failure(&self) -> OnFailure {
        match self {
            BudgetStep::Scale(_) | BudgetStep::WriteStatus(_) => OnFailure::Stop,
            BudgetStep::Publish(_) => OnFailure::Ignore,
            BudgetStep::WriteDocument(_) => OnFailure::Defer,
        }
    }
}

/// What one poll decided.
#[derive(Clone, Debug, PartialEq)]
pub struct BudgetPlan {
    pub steps: Vec<BudgetStep>,
    /// The status after this poll (written only if it says something new).
    pub status: BacklogBudgetStatus,
    /// The scaling decision, for the operator's own metrics; `None` when nothing was decided.
    pub decision: Option<ScalingDecision>,
    /// When to look again.
    pub requeue: Duration,
}

/// Decides one poll of a budget (pure).
pub fn decide(
    settings: &BudgetSettings,
    facts: &BudgetFacts,
    previous: &BacklogBudgetStatus,
    now: Timestamp,
) -> BudgetPlan {
    let budget = settings.budget;
    let generation = budget.meta().generation;
    let config = match &settings.config {
        Ok(config) => config,
        Err(problem) => {
            let condition =
                ConditionSpec::new(SCALING_ACTIVE, Truth::False, "InvalidSpec", problem.clone());
            return unusable(previous, condition, generation, now, INVALID_RETRY);
        }
    };
    let poll = Duration::from_secs_f64(config.poll_interval_seconds);
    let observed = match facts {
        BudgetFacts::TargetUnusable(problem) => {
            let condition = ConditionSpec::new(
                SCALING_ACTIVE,
                Truth::False,
                "TargetUnavailable",
                problem.to_string(),
            );
            return unusable(
                previous,
                condition,
                generation,
                now,
                poll.max(INVALID_RETRY),
            );
        }
        BudgetFacts::Observed(observed) => observed,
        // Facts are left unread only for an unusable spec, handled above; decide nothing.
        BudgetFacts::Unread => {
            return BudgetPlan {
                steps: Vec::new(),
                status: previous.clone(),
                decision: None,
                requeue: poll,
            };
        }
    };

    let classes = classes::decide(
        &budget.spec.event_classes,
        &previous.event_classes,
        &observed.classes,
        now,
    );
    let inputs = match &observed.scaling {
        ScalingFacts::OwnedElsewhere(owner) => conflict_inputs(owner, observed.workload),
        ScalingFacts::Observed(metrics) => {
            scaling_inputs(metrics, &classes.statuses, observed.workload)
        }
    };
    let decision = decide_scaling(config, &inputs, &status::memory_of(previous), now);

    let mut steps = Vec::new();
    if let Some(change) = &decision.change {
        steps.push(BudgetStep::Scale(change.clone()));
        steps.push(BudgetStep::Publish(PlannedEvent::new(
            false,
            if change.to > change.from {
                "ScaledUp"
            } else {
                "ScaledDown"
            },
            format!("ScaleTo{}", change.to),
            format!(
                "{} → {} replicas: {}",
                change.from, change.to, change.reason
            ),
        )));
    }
    let next = status::after_decision(previous, &decision, generation, now);
    let next = match &observed.scaling {
        ScalingFacts::Observed(metrics) => {
            let check = capacity::capacity_of(
                config,
                &decision.used,
                &decision.memory,
                metrics,
                &observed.policy,
            );
            capacity::record(next, &check, generation, now)
        }
        // Nothing was asked while another autoscaler owns the target.
        ScalingFacts::OwnedElsewhere(_) => next,
    };
    let next = grouping::record(next, observed.grouping.as_ref(), generation, now);
    let next = classes.record(next, generation, now);
    let document =
        control_document::prepare(budget, &observed.policy, &observed.configmap, &next, now);
    let next = document.record(next, generation, now);
    let next = with_readiness(next, now);
    if status::differs(previous, &next) {
        steps.push(BudgetStep::WriteStatus(Box::new(next.clone())));
        steps.extend(phase_event(previous, &next).map(BudgetStep::Publish));
        steps.extend(classes.events().into_iter().map(BudgetStep::Publish));
    }
    if let Some(configmap) = document.write {
        steps.push(BudgetStep::WriteDocument(Box::new(configmap)));
    }
    BudgetPlan {
        steps,
        status: next,
        decision: Some(decision),
        requeue: poll,
    }
}

/// The plan when the spec or the target is unusable: only the status says why.
fn unusable(
    previous: &BacklogBudgetStatus,
    condition: ConditionSpec,
    generation: Option<i64>,
    now: Timestamp,
    requeue: Duration,
) -> BudgetPlan {
    let next = with_readiness(status::invalid(previous, condition, generation, now), now);
    let mut steps = Vec::new();
    if status::differs(previous, &next) {
        steps.push(BudgetStep::WriteStatus(Box::new(next.clone())));
        steps.extend(phase_event(previous, &next).map(BudgetStep::Publish));
    }
    BudgetPlan {
        steps,
        status: next,
        decision: None,
        requeue,
    }
}

/// `Ready` and `Stalled`, for GitOps tools (kstatus); transition times stay when unchanged.
fn with_readiness(mut next: BacklogBudgetStatus, now: Timestamp) -> BacklogBudgetStatus {
    let readiness = readiness::of_budget(next.phase, next.explanation.as_deref());
    next.conditions =
        readiness::merged(&next.conditions, &readiness, next.observed_generation, now);
    next
}

/// An Event when the phase changed: a warning for every phase but Healthy. A budget found
/// Healthy at its first look has no change to report (thousands of budgets applied together
/// would otherwise send thousands of Events that say nothing).
fn phase_event(previous: &BacklogBudgetStatus, next: &BacklogBudgetStatus) -> Option<PlannedEvent> {
    let phase = next.phase?;
    if previous.phase == Some(phase) || (previous.phase.is_none() && phase == BudgetPhase::Healthy)
    {
        return None;
    }
    Some(PlannedEvent::new(
        !matches!(phase, BudgetPhase::Healthy),
        format!("{phase:?}"),
        "Reconcile",
        next.explanation.clone().unwrap_or_default(),
    ))
}

#[cfg(test)]
mod tests;
