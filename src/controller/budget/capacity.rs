//! The facts of the `CapacityPlan` check, taken from one poll's decision (what it used and the
//! pod starts it remembers), its queries and the RetryPolicy (pure); the check itself is [`crate::core::capacity_check`].

use k8s_openapi::jiff::Timestamp;

use crate::api::backlog_budget::BacklogBudgetStatus;
use crate::api::conditions::merge_conditions;
use crate::consumer::EffectivePolicy;
use crate::core::budget_config::BudgetConfig;
use crate::core::capacity_check::{CapacityCheck, CapacityFacts, check};
use crate::core::metric_input::{MetricProblem, Observation, single_value};
use crate::core::scaling::{ScalingMemory, UsedValues, reaction};

use super::control_document::{PolicyFact, PolicySource};
use super::inputs::MetricObservations;

/// The check for one poll.
pub fn capacity_of(
    config: &BudgetConfig,
    used: &UsedValues,
    memory: &ScalingMemory,
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
        peak_produce_rate: peak_so_far(
            metrics.peak_produce_rate.as_ref(),
            metrics.produce_rate.as_ref(),
        ),
        deadline_seconds: config.deadline_seconds,
        age_limit_seconds: config.warning_at * config.deadline_seconds,
        min_replicas: config.min_replicas,
        reaction: reaction(config, memory),
        retry_worst_case,
    })
}

/// The highest produce rate of the last 24 hours as far as this poll knows: the subquery's
/// peak, or the produce rate now where that is higher. The peak is renewed every few minutes
/// and steps at the poll, so it can miss a newer high, and a history younger than one step
/// has no sample in it yet (a new consumer's first polls); the rate now is part of the last
/// 24 hours either way. A failed or unusable peak stays unknown: the history may hold more
/// than the rate now.
fn peak_so_far(peak: Option<&Observation>, now: Option<&Observation>) -> Option<f64> {
    let now = now.and_then(|now| single_value(now).ok());
    match single_value(peak?) {
        Ok(peak) => Some(now.map_or(peak, |now| peak.max(now))),
        Err(MetricProblem::Empty) => now,
        Err(_) => None,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(values: &[f64]) -> Observation {
        Observation::Samples(values.to_vec())
    }

    #[test]
    fn the_peak_so_far_is_the_history_or_the_rate_now_whichever_is_higher() {
        let failed = Observation::Failed("timeout".into());
        for (peak, now, expected) in [
            (
                Some(answered(&[500.0])),
                Some(answered(&[400.0])),
                Some(500.0),
            ),
            (
                Some(answered(&[500.0])),
                Some(answered(&[650.0])),
                Some(650.0),
            ),
            (Some(answered(&[500.0])), None, Some(500.0)),
            (Some(answered(&[500.0])), Some(failed.clone()), Some(500.0)),
            // A history younger than one step of the subquery: the rate now is all it holds.
            (Some(answered(&[])), Some(answered(&[450.0])), Some(450.0)),
            (Some(answered(&[])), None, None),
            // Unknown history may hold more than the rate now.
            (Some(failed.clone()), Some(answered(&[450.0])), None),
            (Some(answered(&[1.0, 2.0])), Some(answered(&[450.0])), None),
            (None, Some(answered(&[450.0])), None),
        ] {
            assert_eq!(
                peak_so_far(peak.as_ref(), now.as_ref()),
                expected,
                "peak {peak:?}, now {now:?}"
            );
        }
    }
}
