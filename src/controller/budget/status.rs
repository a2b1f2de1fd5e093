//! Between the decision and the API: the decision's memory read back from status, and the new
//! status built from a decision. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

use crate::api::backlog_budget::{
    BacklogBudgetStatus, BudgetPhase, CapacityStatus, DemandBucket, EconomyStatus, LastScale,
    Observed, PendingScale,
};
use crate::api::conditions::{ConditionSpec, merge_conditions};
use crate::core::capacity_estimate::MeasuredCapacity;
use crate::core::demand_history::DemandSample;
use crate::core::economy::{EconomyMemory, EconomyRun};
use crate::core::format::seconds;
use crate::core::scaling::{PreviousObservation, ScalingDecision, ScalingMemory};
use crate::core::stabilization::{Pending, Windows};

fn pending_of(p: &PendingScale) -> Pending {
    Pending {
        since: p.since.0,
        replicas: u32::try_from(p.replicas).unwrap_or(0),
    }
}

fn pending_to_api(p: &Pending) -> PendingScale {
    PendingScale {
        since: MicroTime(p.since),
        replicas: i32::try_from(p.replicas).unwrap_or(i32::MAX),
    }
}

/// What the decision remembers, as kept in status.
pub fn memory_of(status: &BacklogBudgetStatus) -> ScalingMemory {
    let previous = status.observed.as_ref().and_then(|observed| {
        let at = observed.at.as_ref()?.0;
        Some(PreviousObservation {
            at,
            backlog: observed.backlog?,
            produce_rate: observed.produce_rate,
            value_since: observed
                .backlog_since
                .as_ref()
                .map_or(at, |since| since.0.min(at)),
            previous_stood: observed
                .previous_backlog_stood_seconds
                .filter(|stood| stood.is_finite() && *stood >= 0.0),
        })
    });
    ScalingMemory {
        previous,
        windows: Windows {
            up: status.scale_up_pending.as_ref().map(pending_of),
            down: status.scale_down_window.iter().map(pending_of).collect(),
        },
        last_change_at: status.last_scale.as_ref().map(|s| s.at.0),
        last_change_raised: status.last_scale.as_ref().is_some_and(|s| s.to > s.from),
        raised_under: status
            .last_scale
            .as_ref()
            .filter(|s| s.to > s.from)
            .and_then(|s| s.age_limit_seconds)
            .filter(|limit| limit.is_finite()),
        recent_changes: status.recent_scale_changes.iter().map(|t| t.0).collect(),
        demand: status
            .recent_demand
            .iter()
            .map(|bucket| DemandSample {
                at: bucket.at.0,
                rate: bucket.produce_rate,
            })
            .collect(),
        capacity: status.capacity.as_ref().and_then(|c| {
            Some(MeasuredCapacity {
                per_replica_rate: c.measured_per_replica_rate?,
                at: c.measured_at.as_ref()?.0,
                lower_bound: c.measured_lower_bound,
                confirmations: c.measured_confirmations,
                most_seen: c.most_seen_per_replica_rate.unwrap_or(0.0),
            })
        }),
        pods_pending_since: status.pods_pending_since.as_ref().map(|t| t.0),
        pod_start_seconds: status.pod_start_seconds,
        busy_since: status.busy_since.as_ref().map(|t| t.0),
        economy: status
            .economy
            .as_ref()
            .map_or_else(EconomyMemory::default, economy_of),
        probed_at: status
            .capacity
            .as_ref()
            .and_then(|c| c.probed_at.as_ref())
            .map(|t| t.0),
    }
}

fn economy_of(status: &EconomyStatus) -> EconomyMemory {
    EconomyMemory {
        run: match (&status.since, status.load) {
            (Some(since), Some(load)) => Some(EconomyRun {
                since: since.0,
                load,
            }),
            _ => None,
        },
        left_at: status.left_at.as_ref().map(|t| t.0),
    }
}

/// Economy's memory as kept in status; `None` when there is nothing to remember.
fn economy_to_api(memory: &EconomyMemory) -> Option<EconomyStatus> {
    (*memory != EconomyMemory::default()).then(|| EconomyStatus {
        since: memory.run.map(|run| MicroTime(run.since)),
        load: memory.run.map(|run| run.load),
        left_at: memory.left_at.map(MicroTime),
    })
}

fn to_i32(value: u32) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

/// The status after a decision.
pub fn after_decision(
    previous: &BacklogBudgetStatus,
    decision: &ScalingDecision,
    generation: Option<i64>,
    now: Timestamp,
) -> BacklogBudgetStatus {
    let used = &decision.used;
    let last_scale = match &decision.change {
        Some(change) => Some(LastScale {
            at: MicroTime(now),
            from: to_i32(change.from),
            to: to_i32(change.to),
            reason: change.reason.clone(),
            age_limit_seconds: decision.memory.raised_under,
        }),
        None => previous.last_scale.clone(),
    };
    BacklogBudgetStatus {
        observed_generation: generation,
        phase: Some(decision.phase),
        observed: Some(Observed {
            backlog: used.backlog,
            produce_rate: used.produce_rate,
            completion_rate: used.completion_rate,
            retry_rate: used.retry_rate,
            quarantine_rate: used.quarantine_rate,
            oldest_unfinished_age: used.oldest_age,
            oldest_unfinished_age_text: used.oldest_age.map(seconds),
            oldest_age_estimated: used.oldest_age_estimated,
            partitions: used.partitions.map(to_i32),
            replicas: Some(to_i32(used.replicas)),
            at: Some(MicroTime(now)),
            backlog_since: decision.memory.previous.map(|p| MicroTime(p.value_since)),
            previous_backlog_stood_seconds: decision
                .memory
                .previous
                .and_then(|p| p.previous_stood)
                .map(|stood| (stood * 1000.0).round() / 1000.0),
        }),
        drain_time_seconds: decision
            .drain_time_seconds
            .map(|s| (s * 10.0).round() / 10.0),
        drain_time: decision.drain_time_seconds.map(seconds),
        desired_replicas: Some(to_i32(decision.desired)),
        explanation: Some(decision.explanation.clone()),
        last_scale,
        scale_down_window: decision
            .memory
            .windows
            .down
            .iter()
            .map(pending_to_api)
            .collect(),
        scale_up_pending: decision.memory.windows.up.as_ref().map(pending_to_api),
        capacity: match (used.capacity_source, used.per_replica_rate) {
            (Some(source), Some(rate)) => Some(CapacityStatus {
                source,
                per_replica_rate: rate,
                measured_per_replica_rate: decision.memory.capacity.map(|m| m.per_replica_rate),
                measured_at: decision.memory.capacity.map(|m| MicroTime(m.at)),
                measured_lower_bound: decision.memory.capacity.is_some_and(|m| m.lower_bound),
                measured_confirmations: decision.memory.capacity.map_or(0, |m| m.confirmations),
                most_seen_per_replica_rate: decision
                    .memory
                    .capacity
                    .map(|m| m.most_seen)
                    .filter(|&rate| rate > 0.0),
                probed_at: decision.memory.probed_at.map(MicroTime),
            }),
            _ => previous.capacity.clone(),
        },
        recent_demand: decision
            .memory
            .demand
            .iter()
            .map(|sample| DemandBucket {
                at: MicroTime(sample.at),
                produce_rate: sample.rate,
            })
            .collect(),
        pods_pending_since: decision.memory.pods_pending_since.map(MicroTime),
        busy_since: decision.memory.busy_since.map(MicroTime),
        economy: economy_to_api(&decision.memory.economy),
        pod_start_seconds: decision.memory.pod_start_seconds,
        recent_scale_changes: decision
            .memory
            .recent_changes
            .iter()
            .copied()
            .map(MicroTime)
            .collect(),
        conditions: merge_conditions(&previous.conditions, &decision.conditions, generation, now),
        ..previous.clone()
    }
}

/// The status when the spec or the target is unusable: nothing else changes.
pub fn invalid(
    previous: &BacklogBudgetStatus,
    condition: ConditionSpec,
    generation: Option<i64>,
    now: Timestamp,
) -> BacklogBudgetStatus {
    BacklogBudgetStatus {
        observed_generation: generation,
        phase: Some(BudgetPhase::Invalid),
        explanation: Some(condition.message.clone()),
        conditions: merge_conditions(&previous.conditions, &[condition], generation, now),
        ..previous.clone()
    }
}

/// Whether `next` says anything `current` does not; the observation time alone is not news,
/// so an idle budget does not rewrite its status every poll.
pub fn differs(current: &BacklogBudgetStatus, next: &BacklogBudgetStatus) -> bool {
    let without_time = |status: &BacklogBudgetStatus| {
        let mut status = status.clone();
        if let Some(observed) = status.observed.as_mut() {
            observed.at = None;
        }
        status
    };
    without_time(current) != without_time(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::budget_config::BudgetConfig;
    use crate::core::metric_input::Observation;
    use crate::core::scaling::{ScalingInputs, decide};

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn config() -> BudgetConfig {
        BudgetConfig {
            max_replicas: 12,
            scale_down_stabilization_seconds: 180.0,
            per_replica_rate: Some(100.0),
            ..crate::core::budget_config::example()
        }
    }

    fn inputs(backlog: f64, lambda: f64, replicas: u32) -> ScalingInputs {
        let v = |x: f64| Observation::Samples(vec![x]);
        ScalingInputs {
            backlog: v(backlog),
            oldest_age: Some(v(10.0)),
            produce_rate: Some(v(lambda)),
            completion_rate: None,
            retry_rate: None,
            quarantine_rate: None,
            partitions: None,
            paused_class_backlogs: vec![],
            current_replicas: replicas,
            ready_replicas: None,
            conflict: None,
            partition_backlogs: None,
        }
    }

    #[test]
    fn memory_survives_a_round_trip_through_status() {
        let first = decide(
            &config(),
            &inputs(0.0, 100.0, 6),
            &ScalingMemory::default(),
            at(0),
        );
        let status = after_decision(&BacklogBudgetStatus::default(), &first, Some(1), at(0));
        let memory = memory_of(&status);
        assert_eq!(memory.windows, first.memory.windows);
        assert_eq!(memory.previous, first.memory.previous);
        assert_eq!(memory.demand, first.memory.demand);
        assert_eq!(memory.capacity, first.memory.capacity);
        // A scrape slower than the poll: the next poll sees the same sample, and the time it
        // was first seen must survive, or the next sample's change reads as one poll's worth.
        let again = decide(&config(), &inputs(0.0, 100.0, 6), &memory, at(15));
        let status = after_decision(&status, &again, Some(1), at(15));
        let memory = memory_of(&status);
        assert_eq!(memory.previous, again.memory.previous);
        assert_eq!(memory.previous.map(|p| p.value_since), Some(at(0)));
        // A new sample: how long the one before it stood survives too, so a level (an
        // empty queue) is told from a slow scrape after a restart.
        let changed = decide(&config(), &inputs(500.0, 100.0, 6), &memory, at(30));
        let status = after_decision(&status, &changed, Some(1), at(30));
        let memory = memory_of(&status);
        assert_eq!(memory.previous, changed.memory.previous);
        assert_eq!(memory.previous.and_then(|p| p.previous_stood), Some(30.0));
    }

    #[test]
    fn a_measurement_and_the_most_seen_survive_a_round_trip_through_status() {
        use crate::api::backlog_budget::CapacityStatus;
        use crate::core::capacity_estimate::CapacitySource;
        let status = BacklogBudgetStatus {
            capacity: Some(CapacityStatus {
                source: CapacitySource::Measured,
                per_replica_rate: 154.0,
                measured_per_replica_rate: Some(154.0),
                measured_at: Some(MicroTime(at(0))),
                measured_lower_bound: false,
                measured_confirmations: 1,
                most_seen_per_replica_rate: Some(233.0),
                probed_at: None,
            }),
            ..BacklogBudgetStatus::default()
        };
        let memory = memory_of(&status);
        let kept = MeasuredCapacity {
            per_replica_rate: 154.0,
            at: at(0),
            lower_bound: false,
            confirmations: 1,
            most_seen: 233.0,
        };
        assert_eq!(memory.capacity, Some(kept));
        // Without a prior and long after it, the measurement is a lower bound that may be
        // tried again; status keeps what the next poll needs to judge it.
        let no_prior = BudgetConfig {
            per_replica_rate: None,
            ..config()
        };
        let later = decide(&no_prior, &inputs(0.0, 100.0, 6), &memory, at(7200));
        let status = after_decision(&status, &later, Some(1), at(7200));
        let capacity = status.capacity.as_ref().expect("a capacity is known");
        assert_eq!(capacity.source, CapacitySource::Stale);
        assert_eq!(capacity.most_seen_per_replica_rate, Some(233.0));
        assert_eq!(memory_of(&status).capacity, Some(kept));
    }

    #[test]
    fn an_idle_poll_is_not_a_status_change() {
        // 1200/s needs all 12 replicas: nothing to wait for, nothing to change.
        let decision = decide(
            &config(),
            &inputs(0.0, 1200.0, 12),
            &ScalingMemory::default(),
            at(0),
        );
        let first = after_decision(&BacklogBudgetStatus::default(), &decision, Some(1), at(0));
        let again = decide(
            &config(),
            &inputs(0.0, 1200.0, 12),
            &memory_of(&first),
            at(15),
        );
        let second = after_decision(&first, &again, Some(1), at(15));
        assert!(!differs(&first, &second), "{first:?}\n{second:?}");
        let busier = decide(
            &config(),
            &inputs(5000.0, 1200.0, 12),
            &memory_of(&first),
            at(30),
        );
        assert!(differs(
            &first,
            &after_decision(&first, &busier, Some(1), at(30))
        ));
    }

    #[test]
    fn a_scale_is_recorded() {
        let decision = decide(
            &config(),
            &inputs(200_000.0, 600.0, 2),
            &ScalingMemory::default(),
            at(0),
        );
        let status = after_decision(&BacklogBudgetStatus::default(), &decision, Some(1), at(0));
        // The age the scale-up was asked under comes back as the decision kept it.
        let memory = memory_of(&status);
        assert!(memory.last_change_raised);
        assert!(memory.raised_under.is_some());
        assert_eq!(memory.raised_under, decision.memory.raised_under);
        let last = status.last_scale.expect("scaled");
        assert_eq!(last.from, 2);
        assert!(last.to > 2);
        assert_eq!(status.desired_replicas, Some(last.to));
    }
}
