//! The BacklogBudget decision: from observed inputs, the previous decision and the time, how
//! many replicas the consumer should have, the budget's phase, and why.
//!
//! Pure: the controller and the simulator call the same function.

use jiff::Timestamp;

use super::arrival_shape::ArrivalShape;
use super::budget_config::BudgetConfig;
use super::capacity_estimate::{CapacitySource, MeasuredCapacity};
use super::change_budget::{self, Allowance};
use super::condition::{ConditionSpec, Truth};
use super::deadline_plan::{PlanInputs, PlanReason, PlanSettings, plan};
use super::demand_history::{self, DemandSample, Replay};
use super::drain::{
    drain_seconds, drain_window, estimate_oldest_age, group_capacity, unbounded_replicas_for,
};
use super::economy::{self, EconomyMemory};
use super::metric_input::{MetricProblem, MissingInput, Observation};
use super::partition_skew::{self, PartitionSample, Skew};
use super::phase::BudgetPhase;
use super::stabilization::{
    Stabilized, WindowSettings, Windows, down_wait, seconds_between, stabilize,
};
use super::trajectory::QueueNow;
use gather::{Values, gather};
use timing::{
    assumed_pod_start_seconds, demand_window_seconds, measurement_settle_seconds,
    measurement_stale_seconds, plan_horizon_seconds, rate_window_seconds,
};
use wording::{deadline_condition, explain, metrics_message, skew_condition};

pub const METRICS_AVAILABLE: &str = "MetricsAvailable";
pub const PARTITION_LIMITED: &str = "PartitionLimited";
pub const DEADLINE_AT_RISK: &str = "DeadlineAtRisk";
pub const SCALING_ACTIVE: &str = "ScalingActive";
pub const CONFLICT: &str = "Conflict";
pub const PARTITION_SKEW: &str = "PartitionSkew";

/// One poll's inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct ScalingInputs {
    pub backlog: Observation,
    /// `None` when `metrics.oldestUnfinishedAge` is not configured (the age is then estimated).
    pub oldest_age: Option<Observation>,
    /// `None` when not configured (λ is then estimated from the backlog trend).
    pub produce_rate: Option<Observation>,
    pub completion_rate: Option<Observation>,
    pub retry_rate: Option<Observation>,
    pub quarantine_rate: Option<Observation>,
    /// `Some` when the partition count comes from a query.
    pub partitions: Option<Observation>,
    /// Backlog queries of paused event classes, taken out of the scaling input.
    pub paused_class_backlogs: Vec<(String, Observation)>,
    /// The target's `spec.replicas`.
    pub current_replicas: u32,
    /// The target's ready replicas, when known.
    pub ready_replicas: Option<u32>,
    /// Another autoscaler that owns the target, if any (names it).
    pub conflict: Option<String>,
    /// `metrics.partitionBacklog`, one sample per partition, when configured and answered.
    pub partition_backlogs: Option<Vec<PartitionSample>>,
}

/// The previous observation: λ's trend, and λ itself when no produce-rate query exists.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PreviousObservation {
    pub at: Timestamp,
    pub backlog: f64,
    pub produce_rate: Option<f64>,
    /// When this backlog value was first seen: a scrape slower than the poll shows the same
    /// sample to several polls, and the next sample's change spans the time between the
    /// samples, not the one poll that sees it.
    pub value_since: Timestamp,
    /// How long the value before this one was seen unchanged (seconds; `None` until a change
    /// was seen). A value that stands longer than the one before it is a level the gauge
    /// holds (an empty queue is one), not a sample a slow scrape repeats: its change came
    /// within about that time, not the whole time it stood.
    pub previous_stood: Option<f64>,
}

impl PreviousObservation {
    /// The observation of `backlog` at `now`, following `previous`.
    pub fn next(
        previous: Option<&PreviousObservation>,
        backlog: f64,
        produce_rate: Option<f64>,
        now: Timestamp,
    ) -> Self {
        let (value_since, previous_stood) = match previous {
            Some(p) if p.backlog == backlog && p.value_since <= now => {
                (p.value_since, p.previous_stood)
            }
            Some(p) if p.value_since <= now => (now, Some(seconds_between(p.value_since, now))),
            _ => (now, None),
        };
        Self {
            at: now,
            backlog,
            produce_rate,
            value_since,
            previous_stood,
        }
    }
}

/// What the decision remembers between polls (kept in status).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScalingMemory {
    pub previous: Option<PreviousObservation>,
    pub windows: Windows,
    /// When the replicas last changed (status.lastScale.at).
    pub last_change_at: Option<Timestamp>,
    /// Whether that change raised the replicas (status.lastScale: to > from).
    pub last_change_raised: bool,
    /// The oldest age the last change was asked to stay under, only when it raised the
    /// replicas (status.lastScale.ageLimitSeconds).
    pub raised_under: Option<f64>,
    /// When the replicas changed in the last hour, oldest first (status.recentScaleChanges).
    pub recent_changes: Vec<Timestamp>,
    /// λ of the recent past, as runs of about the same rate (status.recentDemand).
    pub demand: Vec<DemandSample>,
    /// The last capacity measured while the consumers were saturated (status.capacity).
    pub capacity: Option<MeasuredCapacity>,
    /// Since when pods asked for by a scale-up have not all been ready.
    pub pods_pending_since: Option<Timestamp>,
    /// How long the last scale-up took until every pod was ready (status.podStartSeconds).
    pub pod_start_seconds: Option<f64>,
    /// Since when work has waited beyond what the consumers complete in two polls
    /// (status.capacity.busySince).
    pub busy_since: Option<Timestamp>,
    /// The current stretch of economy and when the last one ended (status.economy).
    pub economy: EconomyMemory,
    /// When fewer replicas were last tried to learn a capacity known only as a lower bound
    /// (status.capacity.probedAt).
    pub probed_at: Option<Timestamp>,
}

impl ScalingMemory {
    /// The budget has decided from data for less than `seconds` (its λ history begins
    /// later than that ago, or has not begun) and has changed nothing. An outage keeps the λ
    /// history, so a return from one is not new.
    pub fn is_new_budget(&self, now: Timestamp, seconds: f64) -> bool {
        self.last_change_at.is_none()
            && self.windows.up.is_none()
            && self
                .demand
                .first()
                .is_none_or(|first| seconds_between(first.at, now) < seconds)
    }
}

/// The numbers the decision used.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UsedValues {
    pub backlog: Option<f64>,
    /// Backlog minus paused classes' backlog.
    pub scaling_backlog: Option<f64>,
    pub produce_rate: Option<f64>,
    pub produce_rate_estimated: bool,
    /// λ is the backlog's rise plus completions, well above the queried rate (whose window
    /// has not caught up with a step).
    pub produce_rate_from_backlog: bool,
    pub completion_rate: Option<f64>,
    pub retry_rate: Option<f64>,
    pub quarantine_rate: Option<f64>,
    pub oldest_age: Option<f64>,
    pub oldest_age_estimated: bool,
    pub partitions: Option<u32>,
    pub per_replica_rate: Option<f64>,
    /// Where the per-replica rate comes from, when there is one.
    pub capacity_source: Option<CapacitySource>,
    pub replicas: u32,
}

impl UsedValues {
    /// The per-replica rate comes from completions, not from the spec.
    pub fn per_replica_rate_measured(&self) -> bool {
        matches!(
            self.capacity_source,
            Some(CapacitySource::Measured | CapacitySource::Prior | CapacitySource::Stale)
        )
    }

    /// The rate was measured on consumers that were not saturated, or saturated too long ago:
    /// only a lower bound of their capacity.
    pub fn per_replica_rate_is_lower_bound(&self) -> bool {
        matches!(
            self.capacity_source,
            Some(CapacitySource::Prior | CapacitySource::Stale)
        )
    }
}

/// A change to the target's replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleChange {
    pub from: u32,
    pub to: u32,
    pub reason: String,
}

/// The outcome of one poll.
#[derive(Clone, Debug, PartialEq)]
pub struct ScalingDecision {
    pub phase: BudgetPhase,
    pub used: UsedValues,
    /// Clamped recommendation before stabilization; `None` when holding.
    pub recommendation: Option<u32>,
    /// Replicas the target should have after this poll.
    pub desired: u32,
    pub change: Option<ScaleChange>,
    pub drain_time_seconds: Option<f64>,
    pub explanation: String,
    pub conditions: Vec<ConditionSpec>,
    pub memory: ScalingMemory,
}

/// Decides one poll.
pub fn decide(
    config: &BudgetConfig,
    inputs: &ScalingInputs,
    memory: &ScalingMemory,
    now: Timestamp,
) -> ScalingDecision {
    let current = inputs.current_replicas;
    if let Some(owner) = &inputs.conflict {
        return conflict(current, owner, memory);
    }
    let gathered = gather(config, inputs, memory, now);
    match gathered.values {
        Some(values) => scale(config, inputs, values, memory, now),
        None => metrics_unavailable(current, &gathered.missing, gathered.used, memory, now),
    }
}

/// When the events waiting now arrived, as the demand history read them: a rate is the mean
/// over its window, so each change shows about half a window late.
fn arrival_shape(demand: &[DemandSample], now: Timestamp, config: &BudgetConfig) -> ArrivalShape {
    let runs: Vec<(f64, f64)> = demand
        .iter()
        .rev()
        .map(|run| (seconds_between(run.at, now).max(0.0), run.rate))
        .collect();
    ArrivalShape::from_runs(&runs, rate_window_seconds(config) / 2.0)
}

fn conflict(current: u32, owner: &str, memory: &ScalingMemory) -> ScalingDecision {
    let message = format!(
        "{owner} also scales this target; the budget does not write to it until that autoscaler is removed or points elsewhere"
    );
    ScalingDecision {
        phase: BudgetPhase::Conflict,
        used: UsedValues {
            replicas: current,
            ..UsedValues::default()
        },
        recommendation: None,
        desired: current,
        change: None,
        drain_time_seconds: None,
        explanation: message.clone(),
        conditions: vec![
            ConditionSpec::new(CONFLICT, Truth::True, "OtherAutoscaler", message.clone()),
            ConditionSpec::new(SCALING_ACTIVE, Truth::False, "Conflict", message),
        ],
        memory: ScalingMemory {
            windows: Windows::default(),
            ..memory.clone()
        },
    }
}

fn metrics_unavailable(
    current: u32,
    missing: &[MissingInput],
    used: UsedValues,
    memory: &ScalingMemory,
    now: Timestamp,
) -> ScalingDecision {
    let problems = missing
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    let reason = if missing
        .iter()
        .all(|m| matches!(m.problem, MetricProblem::QueryFailed(_)))
    {
        "QueryFailed"
    } else {
        "NoUsableData"
    };
    let hold = format!("holding {current} replicas until the metrics return (fail static)");
    ScalingDecision {
        phase: BudgetPhase::MetricsUnavailable,
        recommendation: None,
        desired: current,
        change: None,
        drain_time_seconds: None,
        explanation: format!("{problems}; {hold}"),
        conditions: vec![
            ConditionSpec::new(METRICS_AVAILABLE, Truth::False, reason, problems.clone()),
            ConditionSpec::new(SCALING_ACTIVE, Truth::False, "MetricsUnavailable", hold),
            ConditionSpec::new(CONFLICT, Truth::False, "NoOtherAutoscaler", ""),
        ],
        // A scale-down window restarts after an outage: decisions are never made from data
        // that was not seen.
        memory: ScalingMemory {
            previous: used
                .backlog
                .map(|backlog| {
                    PreviousObservation::next(
                        memory.previous.as_ref(),
                        backlog,
                        used.produce_rate,
                        now,
                    )
                })
                .or(memory.previous),
            windows: Windows {
                up: memory.windows.up,
                down: Vec::new(),
            },
            ..memory.clone()
        },
        used,
    }
}

fn scale(
    config: &BudgetConfig,
    inputs: &ScalingInputs,
    values: Values,
    memory: &ScalingMemory,
    now: Timestamp,
) -> ScalingDecision {
    let current = inputs.current_replicas;
    let ready = inputs.ready_replicas.unwrap_or(current);
    let lambda = values.produce_rate;
    let rate = values.per_replica_rate;
    let capacity = config.usable_rate(rate);
    let cap = config.max_replicas.min(values.partitions);
    let floor = config.min_replicas.min(cap);
    let partition_bound = values.partitions <= config.max_replicas;
    let bounded = current.clamp(floor, cap);
    // A new budget has no earlier recommendation to wait out (the HPA's rule for a new
    // autoscaler): the replicas it finds were chosen by someone else, not by a load that may
    // return. But its rates may come from series younger than their window (a workload
    // started with its budget), which Prometheus' rate() reads low: a scale-down waits one
    // rate window from the first poll instead of a whole stabilization window.
    let young_seconds = rate_window_seconds(config) + config.poll_interval_seconds;
    let down_window = if memory.is_new_budget(now, young_seconds) {
        rate_window_seconds(config).min(config.scale_down_stabilization_seconds)
    } else {
        config.scale_down_stabilization_seconds
    };

    let window = demand_window_seconds(config);
    // The history keeps λ as queried: a rise the backlog shows first is this poll's news,
    // and the window confirms it (or not) before it becomes a peak that may recur.
    let lifted = demand_history::lifted_while_young(
        &memory.demand,
        values.queried_produce_rate,
        now,
        young_seconds,
    );
    let demand = demand_history::record(
        &lifted,
        values.queried_produce_rate,
        now,
        window,
        config.poll_interval_seconds,
    );
    let recent = Replay::new(&demand, now, window, config.poll_interval_seconds);

    // A hot partition (a backlog below a second of arrivals is in flight, not skew). When it
    // alone receives more than one consumer completes, its backlog is one consumer's work
    // whatever the count, so the count is what the other partitions need. Otherwise its
    // consumer keeps up once it owns little else: the count is planned with the hot
    // partition's share of arrivals.
    let skew = inputs
        .partition_backlogs
        .as_deref()
        .and_then(|samples| {
            let held = values.backlog - values.scaling_backlog;
            partition_skew::detect(samples, values.scaling_backlog, lambda, held)
        })
        .map(|skew| {
            let hot_rate = skew.hot_rate(values.oldest_age, lambda);
            let helped = hot_rate.is_some_and(|hot| hot < capacity);
            HotPartition {
                skew,
                hot_rate,
                helped,
            }
        });
    let hot_share = skew
        .as_ref()
        .filter(|hot| hot.helped && lambda > 0.0)
        .and_then(|hot| hot.hot_rate)
        .map(|hot| hot / lambda);
    let unhelped = skew.as_ref().filter(|hot| !hot.helped).map(|hot| &hot.skew);
    let queue = match unhelped {
        Some(skew) => QueueNow::even(
            skew.others_backlog,
            estimate_oldest_age(
                skew.others_backlog,
                lambda,
                group_capacity(ready.max(1), values.partitions, capacity),
            ),
        ),
        None => QueueNow {
            backlog: values.scaling_backlog,
            oldest_age: values.oldest_age,
            shape: arrival_shape(&demand, now, config),
        }
        .as_oldest_partition_sees_it(lambda),
    };
    let pod_start = assumed_pod_start_seconds(config, memory);
    let starting_in = match memory.pods_pending_since {
        Some(since) if ready < bounded => (pod_start - seconds_between(since, now)).max(0.0),
        _ => pod_start,
    };
    let settings = PlanSettings {
        age_limit: config.warning_at * config.deadline_seconds,
        critical_age: config.critical_at * config.deadline_seconds,
        deadline: config.deadline_seconds,
        drain_limit: config.target_drain_seconds,
        poll: config.poll_interval_seconds,
        pod_start,
        rebalance: config.rebalance_cost_seconds,
        horizon: plan_horizon_seconds(config),
        down_delay: config.scale_down_stabilization_seconds,
        economy_dwell: config.economy_dwell_seconds,
        rate_window: rate_window_seconds(config),
    };
    // How long fewer replicas must run, saturated, before their completions are measured.
    let measurement_seconds = memory.pod_start_seconds.unwrap_or(0.0).max(0.0)
        + measurement_settle_seconds(config)
        + rate_window_seconds(config)
        + config.poll_interval_seconds;
    // How long a scale-down to each count would wait for the window, if asked now.
    let down_waits: Vec<f64> = (0..=cap)
        .map(|k| down_wait(&memory.windows.down, bounded, k, down_window, now))
        .collect();
    let planned = plan(
        &PlanInputs {
            queue,
            produce_rate: lambda,
            recent: &recent,
            ahead_seconds: 0.0,
            current_run_seconds: demand
                .last()
                .map_or(0.0, |run| seconds_between(run.at, now).max(0.0)),
            per_replica_rate: capacity,
            partitions: values.partitions,
            hot_share,
            current: bounded,
            ready,
            starting_in,
            floor,
            cap,
            economy_allowed: economy::allowed(&memory.economy, config.economy_dwell_seconds, now),
            down_waits: &down_waits,
            capacity_is_lower_bound: values.used.per_replica_rate_is_lower_bound(),
            // One try per stale period: a try that neither kept up nor was saturated left a
            // bound still low, and trying again at once would be a cycle of rebalances.
            recovered_rate: values
                .recovery_to_test
                .filter(|_| {
                    memory.probed_at.is_none_or(|at| {
                        seconds_between(at, now) >= measurement_stale_seconds(config)
                    })
                })
                .map(|recovery| config.usable_rate(recovery.rate)),
            backlog_rising: values.backlog_rising,
            measurement_seconds,
            probed_seconds_ago: memory.probed_at.map(|at| seconds_between(at, now)),
            changed_seconds_ago: memory.last_change_at.map(|at| seconds_between(at, now)),
            raised_under: memory.raised_under,
        },
        &settings,
    );
    let capped_capacity = group_capacity(cap, values.partitions, rate);
    let undrainable =
        lambda > 0.0 && capped_capacity <= lambda && !values.used.per_replica_rate_is_lower_bound();
    // Sizing follows a λ read from the backlog's rise, but the claim that the backlog can never
    // catch up (the phase, its condition and explanation) rests on the rate Prometheus measured
    // too: a rise read between two samples whose times the operator does not know can
    // over-read the arrivals for a poll, and a claim that comes and goes is worse than one a
    // poll late.
    let claimed_undrainable = undrainable && capped_capacity <= values.queried_produce_rate;
    // What the deadline would need without the cap, for the PartitionLimited message.
    let raw = if planned.reason == PlanReason::CapFallsShort || claimed_undrainable {
        let drain = drain_window(
            config.target_drain_seconds,
            config.deadline_seconds,
            queue.oldest_age,
            config.poll_interval_seconds.max(1.0),
        );
        unbounded_replicas_for(lambda + queue.backlog / drain, capacity).max(u64::from(cap) + 1)
    } else {
        u64::from(planned.replicas)
    };
    // Even when λ now exceeds what the cap completes, the count is the plan's: a spike above
    // the cap is absorbed by the time budget when the recent past says it is one.
    let mut recommendation = planned.replicas;
    if values.awaiting_measurement {
        // A scale-down judged on a capacity the consumers have not confirmed since the last
        // change could be undone by the measurement: with a slowed consumer that is a cycle
        // of scale-downs and scale-ups, each paying a rebalance.
        recommendation = recommendation.max(bounded);
    }
    if unhelped.is_some() {
        // The hot partition neither drives the count up nor takes replicas away: with fewer
        // consumers its owner would own more partitions again.
        recommendation = recommendation.max(bounded);
    }
    let limited_by_partitions = raw > u64::from(cap) && partition_bound;

    // Pace the change. Replicas outside [floor, cap] are corrected at once; from there the
    // stabilization windows apply, except that an event already past the critical fraction of
    // its deadline does not wait for scale-up stabilization.
    let urgent = values.oldest_age >= config.critical_at * config.deadline_seconds || undrainable;
    let up_window = if urgent {
        0.0
    } else {
        config.scale_up_stabilization_seconds
    };
    // Replicas that change no partition's owner complete nothing more: dropping them costs
    // no capacity, so it does not wait for the scale-down window.
    let idle_only = recommendation < bounded
        && group_capacity(recommendation, values.partitions, capacity)
            >= group_capacity(bounded, values.partitions, capacity);
    let stabilized = if idle_only {
        Stabilized {
            replicas: recommendation,
            waiting_seconds: None,
            windows: Windows::default(),
        }
    } else {
        stabilize(
            bounded,
            recommendation,
            &memory.windows,
            WindowSettings {
                up_seconds: up_window,
                down_seconds: down_window,
                poll_seconds: config.poll_interval_seconds,
            },
            now,
        )
    };
    let (windows, waiting) = (stabilized.windows, stabilized.waiting_seconds);
    let mut target = stabilized.replicas;
    if config.max_step > 0 {
        target = if target > bounded {
            target.min(bounded.saturating_add(config.max_step))
        } else {
            target.max(bounded.saturating_sub(config.max_step))
        };
    }
    // The change cap never costs the deadline: a correction into [floor, cap], and a scale-up
    // while an event is past the warning fraction or the backlog cannot drain, always go.
    let necessary = bounded != current
        || (target > current
            && (undrainable || values.oldest_age >= config.warning_at * config.deadline_seconds));
    let held = match change_budget::allow(
        &memory.recent_changes,
        config.max_changes_per_hour,
        necessary,
        now,
    ) {
        Allowance::Held { made, next_at } if target != current => {
            let held = format!(
                "; holding {current} instead of {target}: {made} changes in the last hour reach scaling.maxChangesPerHour (the next is allowed at {next_at})"
            );
            target = current;
            Some(held)
        }
        _ => None,
    };

    // Drain prediction at the capacity the workload has now.
    let completing_now = group_capacity(ready, values.partitions, capacity);
    let drain_now = if undrainable {
        None
    } else {
        drain_seconds(values.scaling_backlog, lambda, completing_now)
    };

    let ratio = values.oldest_age / config.deadline_seconds;
    let phase = if claimed_undrainable {
        BudgetPhase::Undrainable
    } else if ratio >= config.critical_at {
        BudgetPhase::Breaching
    } else if ratio >= config.warning_at {
        BudgetPhase::AtRisk
    } else {
        BudgetPhase::Healthy
    };

    let mut explanation = explain(
        &values,
        &planned,
        &settings,
        capacity,
        claimed_undrainable,
        (recommendation, current),
        (floor, cap),
        limited_by_partitions,
        waiting,
    );
    if let Some(held) = &held {
        explanation.push_str(held);
    }
    let change = (target != current).then(|| ScaleChange {
        from: current,
        to: target,
        reason: explanation.clone(),
    });

    let mut conditions = vec![
        ConditionSpec::new(
            METRICS_AVAILABLE,
            Truth::True,
            "AllQueriesAnswered",
            metrics_message(&values.used),
        ),
        if limited_by_partitions || (claimed_undrainable && partition_bound) {
            ConditionSpec::new(
                PARTITION_LIMITED,
                Truth::True,
                "AtPartitionCount",
                format!(
                    "{raw} replicas would be needed but there are only {} partitions: more consumers cannot help; add partitions or speed up the consumer",
                    values.partitions
                ),
            )
        } else {
            ConditionSpec::new(PARTITION_LIMITED, Truth::False, "BelowPartitionCount", "")
        },
        deadline_condition(phase, values.oldest_age, ratio, config, &explanation),
        ConditionSpec::new(
            SCALING_ACTIVE,
            Truth::True,
            match &change {
                Some(c) if c.to > c.from => "ScaledUp",
                Some(_) => "ScaledDown",
                None if waiting.is_some() => "Stabilizing",
                None if held.is_some() => "ChangeCapReached",
                None => "Steady",
            },
            format!("{target} replicas: {explanation}"),
        ),
        ConditionSpec::new(CONFLICT, Truth::False, "NoOtherAutoscaler", ""),
    ];
    if inputs.partition_backlogs.is_some() {
        conditions.push(skew_condition(skew.as_ref(), target));
    }

    let scaled_up = target > current;
    let pods_pending_since = if scaled_up {
        memory.pods_pending_since.or(Some(now))
    } else if ready >= current {
        None
    } else {
        memory.pods_pending_since
    };
    let pod_start_seconds = match memory.pods_pending_since {
        Some(since) if ready >= current && !scaled_up => Some(seconds_between(since, now).max(1.0)),
        _ => memory.pod_start_seconds,
    };

    ScalingDecision {
        phase,
        recommendation: Some(recommendation),
        desired: target,
        change,
        drain_time_seconds: drain_now,
        explanation,
        conditions,
        memory: ScalingMemory {
            previous: Some(PreviousObservation::next(
                memory.previous.as_ref(),
                values.backlog,
                Some(values.queried_produce_rate),
                now,
            )),
            windows,
            last_change_at: if target != current {
                Some(now)
            } else {
                memory.last_change_at
            },
            last_change_raised: if target != current {
                target > current
            } else {
                memory.last_change_raised
            },
            raised_under: match target.cmp(&current) {
                std::cmp::Ordering::Greater => Some(planned.up_limit),
                std::cmp::Ordering::Less => None,
                std::cmp::Ordering::Equal => memory.raised_under,
            },
            recent_changes: {
                let mut recent = change_budget::within_hour(&memory.recent_changes, now);
                if target != current {
                    recent.push(now);
                }
                recent
            },
            demand,
            capacity: values.capacity_measured,
            busy_since: values.busy_since,
            pods_pending_since,
            pod_start_seconds,
            economy: economy::record(
                &memory.economy,
                group_capacity(target, values.partitions, capacity) < lambda,
                target > current,
                // The peaks of the recent past are part of the load economy is entered
                // under (its scale-down was judged to carry them): leaving it at one that
                // returns is its room used, not a new load.
                lambda.max(recent.peak()) / capacity,
                now,
            ),
            probed_at: if planned.reason == PlanReason::Probe && target < current {
                Some(now)
            } else {
                memory.probed_at
            },
        },
        used: values.used,
    }
}

/// A hot partition, what it receives, and whether more consumers help it.
struct HotPartition {
    skew: Skew,
    /// Its arrivals, estimated from its backlog and the oldest age.
    hot_rate: Option<f64>,
    /// One consumer completes what it receives: fewer other partitions on its consumer help.
    helped: bool,
}

mod gather;
mod timing;
mod wording;

pub use timing::{Reaction, reaction};

#[cfg(test)]
mod tests;
