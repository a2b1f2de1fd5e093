//! The facts of the `CapacityPlan` check, taken from one poll's decision, its queries and the
//! RetryPolicy (pure); the check itself is [`crate::core::capacity_check`].

use k8s_openapi::jiff::Timestamp;

use crate::api::backlog_budget::BacklogBudgetStatus;
use crate::api::conditions::merge_conditions;
use crate::consumer::EffectivePolicy;
use crate::core::budget_config::BudgetConfig;
use crate::core::capacity_check::{CapacityCheck, CapacityFacts, check};
use crate::core::metric_input::single_value;
use crate::core::scaling::UsedValues;

use super::control_document::{PolicyFact, PolicySource};
use super::inputs::MetricObservations;

/// The check for one poll.
pub fn capacity_of(
    config: &BudgetConfig,
    used: &UsedValues,
    metrics: &MetricObservations,
    policy: &PolicyFact,
) -> CapacityCheck {
    let retry_worst_case = match policy {
        Ok(PolicySource::Resolved(published)) => EffectivePolicy::from_canonical(&published.policy)
            .ok()
            .map(|effective| {
                (
                    published.name.clone(),
                    effective.schedule().worst_case_retry_delay.as_secs_f64(),
                )
            }),
        _ => None,
    };
    check(&CapacityFacts {
        max_replicas: config.max_replicas,
        partitions: used.partitions,
        // A rate measured on idle consumers says what they did, not what they can do.
        per_replica_rate: used
            .per_replica_rate
            .filter(|_| !used.per_replica_rate_is_lower_bound()),
        reserved_retry_share: config.reserved_retry_share,
        peak_produce_rate: metrics
            .peak_produce_rate
            .as_ref()
            .and_then(|peak| single_value(peak).ok()),
        deadline_seconds: config.deadline_seconds,
        retry_worst_case,
    })
}

/// `status` with the check's condition and headroom.
pub fn record(
    mut status: BacklogBudgetStatus,
    capacity: &CapacityCheck,
    generation: Option<i64>,
    now: Timestamp,
) -> BacklogBudgetStatus {
    status.conditions = merge_conditions(
        &status.conditions,
        std::slice::from_ref(&capacity.condition),
        generation,
        now,
    );
    status.capacity_headroom = capacity.headroom;
    status
}
