//! How long things take, from the budget's settings and the pod starts seen: the windows
//! the decision looks through and the reaction times it plans with.

use super::ScalingMemory;
use crate::budget_config::BudgetConfig;

/// Time after a change of replicas before a completion rate reflects the new count: pods
/// starting, the rebalance, then a whole rate window.
pub(super) fn measurement_settle_seconds(config: &BudgetConfig) -> f64 {
    2.0 * rate_window_seconds(config) + config.rebalance_cost_seconds
}

/// The window the completion rate spans (the budget's, from its queries), and at least two
/// polls: a rate is only seen at polls.
pub(super) fn rate_window_seconds(config: &BudgetConfig) -> f64 {
    config
        .rate_window_seconds
        .max(2.0 * config.poll_interval_seconds)
}

/// How long a measurement stands without a saturated poll before it is tested again (by the
/// configured rate, or without one by fewer replicas); each confirmation doubles it.
pub(super) fn measurement_stale_seconds(config: &BudgetConfig) -> f64 {
    2.0 * config.scale_down_stabilization_seconds.max(300.0)
}

/// How long fewer replicas sized by a configured rate run before a shortfall is met: their
/// completions measured after the change (no pod starts for a scale-down), then a reaction
/// (two polls, a pod start, a rebalance).
pub(super) fn prior_test_seconds(config: &BudgetConfig, memory: &ScalingMemory) -> f64 {
    measurement_settle_seconds(config)
        + rate_window_seconds(config)
        + config.poll_interval_seconds
        + reaction_seconds(config, memory)
}

/// From a rise to new pods working, as the decision plans it: two polls (one to see it, one
/// to act), a pod start, then a rebalance during which no consumer completes anything.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reaction {
    pub poll_seconds: f64,
    /// The last pod start seen, else `scaling.podStartTime`.
    pub pod_start_seconds: f64,
    pub pod_start_seen: bool,
    pub rebalance_seconds: f64,
}

impl Reaction {
    pub fn seconds(&self) -> f64 {
        2.0 * self.poll_seconds + self.pod_start_seconds + self.rebalance_seconds
    }
}

/// The reaction a budget plans with, from its settings and the pod starts it has seen.
pub fn reaction(config: &BudgetConfig, memory: &ScalingMemory) -> Reaction {
    Reaction {
        poll_seconds: config.poll_interval_seconds,
        pod_start_seconds: assumed_pod_start_seconds(config, memory),
        pod_start_seen: memory.pod_start_seconds.is_some(),
        rebalance_seconds: config.rebalance_cost_seconds,
    }
}

/// From a decision to new pods working: two polls, a pod start (the last seen, else
/// `scaling.podStartTime`), a rebalance.
pub(super) fn reaction_seconds(config: &BudgetConfig, memory: &ScalingMemory) -> f64 {
    reaction(config, memory).seconds()
}

/// How long a pod takes to start: the last start seen, else `scaling.podStartTime`.
pub(super) fn assumed_pod_start_seconds(config: &BudgetConfig, memory: &ScalingMemory) -> f64 {
    memory
        .pod_start_seconds
        .unwrap_or(config.pod_start_seconds)
        .max(0.0)
}

/// How far back λ is remembered: long enough to see a peak return within a plan's horizon.
pub(super) fn demand_window_seconds(config: &BudgetConfig) -> f64 {
    (2.0 * plan_horizon_seconds(config))
        .max(2.0 * config.scale_down_stabilization_seconds)
        .max(8.0 * config.poll_interval_seconds)
}

/// How far plans look ahead: long enough that a count which falls behind shows it, and that
/// a change made now is not undone within four scale-down windows.
pub(super) fn plan_horizon_seconds(config: &BudgetConfig) -> f64 {
    (4.0 * config.scale_down_stabilization_seconds)
        .max(config.deadline_seconds)
        .max(config.target_drain_seconds)
        + config.poll_interval_seconds
        + config.rebalance_cost_seconds
}
