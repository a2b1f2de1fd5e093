//! The BacklogBudget decision: from observed inputs, the previous decision and the time, how
//! many replicas the consumer should have, the budget's phase, and why.
//!
//! Pure: the controller and the simulator call the same function.

use jiff::Timestamp;

use super::budget_config::{BudgetConfig, PartitionSource};
use super::capacity_estimate::{
    CapacityEvidence, CapacitySource, MeasuredCapacity, estimate as estimate_capacity,
};
use super::change_budget::{self, Allowance};
use super::condition::{ConditionSpec, Truth};
use super::deadline_plan::{KEEPS_UP_SHARE, Plan, PlanInputs, PlanReason, PlanSettings, plan};
use super::demand_history::{self, DemandSample, Replay};
use super::drain::{
    drain_seconds, drain_window, estimate_oldest_age, group_capacity, unbounded_replicas_for,
};
use super::economy::{self, EconomyMemory};
use super::format::{seconds, si};
use super::metric_input::{MetricProblem, MissingInput, Observation, single_value};
use super::partition_skew::{self, PartitionSample, Skew};
use super::phase::BudgetPhase;
use super::stabilization::{
    Stabilized, WindowSettings, Windows, down_wait, seconds_between, stabilize,
};
use super::trajectory::QueueNow;

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
}

impl PreviousObservation {
    /// The observation of `backlog` at `now`, following `previous`.
    pub fn next(
        previous: Option<&PreviousObservation>,
        backlog: f64,
        produce_rate: Option<f64>,
        now: Timestamp,
    ) -> Self {
        let value_since = match previous {
            Some(p) if p.backlog == backlog && p.value_since <= now => p.value_since,
            _ => now,
        };
        Self {
            at: now,
            backlog,
            produce_rate,
            value_since,
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
            Some(CapacitySource::Measured | CapacitySource::Prior)
        )
    }

    /// The rate was measured on consumers that were not saturated: only a lower bound of
    /// their capacity.
    pub fn per_replica_rate_is_lower_bound(&self) -> bool {
        self.capacity_source == Some(CapacitySource::Prior)
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

impl Values {
    /// What `replicas` complete together, at `rate` per replica.
    fn partition_capacity(&self, replicas: u32, rate: f64) -> f64 {
        group_capacity(replicas, self.partitions, rate)
    }
}

/// The inputs, validated.
struct Values {
    used: UsedValues,
    backlog: f64,
    scaling_backlog: f64,
    produce_rate: f64,
    /// λ as queried (or estimated without a query), before a rise the backlog shows replaces
    /// it: the next poll tells a rising window by it.
    queried_produce_rate: f64,
    oldest_age: f64,
    partitions: u32,
    per_replica_rate: f64,
    capacity_measured: Option<MeasuredCapacity>,
    busy_since: Option<Timestamp>,
    /// Work waits and the replicas changed too lately for the completion rate to show what
    /// the new count completes: the capacity that chose it is not confirmed yet.
    awaiting_measurement: bool,
    /// The backlog rose since the previous poll.
    backlog_rising: bool,
}

/// What one poll's queries gave: the validated values, or what is missing.
struct Gathered {
    used: UsedValues,
    values: Option<Values>,
    missing: Vec<MissingInput>,
}

fn gather(
    config: &BudgetConfig,
    inputs: &ScalingInputs,
    memory: &ScalingMemory,
    now: Timestamp,
) -> Gathered {
    let mut missing = Vec::new();
    let mut take = |field: &str, observation: &Observation| match single_value(observation) {
        Ok(value) => Some(value),
        Err(problem) => {
            missing.push(MissingInput {
                field: field.to_owned(),
                problem,
            });
            None
        }
    };
    let backlog = take("metrics.backlog", &inputs.backlog);
    let oldest_age = inputs
        .oldest_age
        .as_ref()
        .and_then(|o| take("metrics.oldestUnfinishedAge", o));
    let produce_rate = inputs
        .produce_rate
        .as_ref()
        .and_then(|o| take("metrics.produceRate", o));
    let partitions = match (&config.partitions, &inputs.partitions) {
        (PartitionSource::Fixed(count), _) => Some(*count),
        (PartitionSource::Query, Some(observation)) => {
            match take("metrics.partitions", observation) {
                Some(p) if p >= 1.0 => Some(p.floor().min(f64::from(u32::MAX)) as u32),
                Some(_) => {
                    missing_push(
                        &mut missing,
                        "metrics.partitions",
                        "returned fewer than 1 partition",
                    );
                    None
                }
                None => None,
            }
        }
        (PartitionSource::Query, None) => {
            missing_push(&mut missing, "metrics.partitions", "was not queried");
            None
        }
    };
    let mut paused_backlog = 0.0;
    for (class, observation) in &inputs.paused_class_backlogs {
        match single_value(observation) {
            Ok(value) => paused_backlog += value,
            Err(problem) => missing.push(MissingInput {
                field: format!("eventClasses[{class}].backlog"),
                problem,
            }),
        }
    }
    // Informational rates: a failure here is shown as absent, it does not block scaling.
    let optional = |o: &Option<Observation>| o.as_ref().and_then(|o| single_value(o).ok());
    let completion_rate = optional(&inputs.completion_rate);
    let retry_rate = optional(&inputs.retry_rate);
    let quarantine_rate = optional(&inputs.quarantine_rate);

    let current = inputs.current_replicas;
    let ready = inputs.ready_replicas.unwrap_or(current);
    let mut used = UsedValues {
        backlog,
        scaling_backlog: backlog.map(|b| (b - paused_backlog).max(0.0)),
        produce_rate,
        completion_rate,
        retry_rate,
        quarantine_rate,
        oldest_age,
        partitions,
        replicas: current,
        ..UsedValues::default()
    };

    // Capacity is measured only while the consumers are saturated: work waits beyond what
    // they complete in two polls, every partition has some, and the rate window saw no
    // change of replicas (right after one it mixes two capacities and reads low).
    // Pods asked for by a scale-up join the group only once started: the settling counts
    // from then (the last pod start seen). A scale-down starts nothing: waiting for a pod
    // start there can outlast a short deadline, and the count is never measured.
    // How long the last change's pods took to start: none for a scale-down; unknown after a
    // scale-up before any start was seen.
    let started_seconds = match (memory.last_change_raised, memory.pod_start_seconds) {
        (false, _) => Some(0.0),
        (true, seen) => seen.map(|seconds| seconds.max(0.0)),
    };
    let changed_lately = memory.last_change_at.is_some_and(|at| {
        seconds_between(at, now)
            < started_seconds.unwrap_or(0.0) + measurement_settle_seconds(config)
    });
    let settled = ready == current && !changed_lately;
    // Saturation is judged on the backlog the consumers work on: a held event class's
    // backlog waits by design while the replicas idle.
    let every_partition_busy = inputs
        .partition_backlogs
        .as_ref()
        .is_none_or(|samples| samples.iter().all(|p| p.backlog > 0.0));
    let busy = every_partition_busy
        && match (completion_rate, used.scaling_backlog) {
            (Some(completed), Some(b)) => {
                completed > 0.0 && b > completed * 2.0 * config.poll_interval_seconds
            }
            _ => false,
        };
    // The completion rate spans a window: it is the consumers' capacity once they have been
    // busy for all of it, not when work has just begun to wait.
    let busy_since = busy.then(|| memory.busy_since.unwrap_or(now));
    let saturated = settled
        && busy_since
            .is_some_and(|since| seconds_between(since, now) >= rate_window_seconds(config));
    // The backlog's drop since the previous poll plus what arrived meanwhile is what the
    // replicas completed at least. Arrivals count only while λ held still over both polls: λ
    // read through a rate window lags a change for the whole window, and after a fall it
    // would credit the consumers with work that no longer arrives. A window W long moves by
    // Δ when the last poll's arrivals differ by W × Δ from those that left the window: so
    // the rate must have stayed about the same for a whole window before the previous poll
    // (what left the window arrived at about that rate; a peak shorter than the window
    // passes through it with hardly a move), and W × Δ is taken off the credit.
    // The change is taken from when the previous sample was first seen: a sample seen again
    // proves nothing, and a new one after a repeated one covers the time since the first
    // sighting (over one poll it would read as twice the drop).
    // Only the replicas ready now may have worked since then: none was asked for and still
    // starting (it works only once ready), and the pods a scale-down stopped left before
    // the previous sample (they stop at the rebalance that follows it). Otherwise the drop
    // would be credited to too few replicas and overstate what one completes.
    let worked_at_most_ready = |previous: &PreviousObservation| {
        ready == current
            && (memory.last_change_raised
                || memory.last_change_at.is_none_or(|at| {
                    seconds_between(at, previous.value_since) >= config.rebalance_cost_seconds
                }))
    };
    let completed_at_least = match (memory.previous, backlog) {
        (Some(previous), Some(b))
            if b != previous.backlog
                && worked_at_most_ready(&previous)
                && seconds_between(previous.value_since, now) > 0.0 =>
        {
            let elapsed = sample_span(&previous, now, config.poll_interval_seconds);
            let window = rate_window_seconds(config);
            let steady_for_a_window = memory.demand.last().is_some_and(|run| {
                seconds_between(run.at, previous.value_since)
                    >= window + config.poll_interval_seconds
            });
            let arrived = match (previous.produce_rate, produce_rate) {
                (Some(before), Some(lambda))
                    if steady_for_a_window && (before - lambda).abs() <= 0.05 * lambda =>
                {
                    let hidden = window / elapsed * (before - lambda).abs();
                    (before.min(lambda) - hidden).max(0.0)
                }
                _ => 0.0,
            };
            Some((arrived + (previous.backlog - b) / elapsed).max(0.0))
        }
        _ => None,
    };
    // What busy replicas complete, from the backlog's change under a λ that held still over
    // both polls; the previous sample must have been seen a poll after the last change's pod
    // starts and rebalance, when the replicas that run now all worked. After a scale-up
    // before any pod start was seen, when that was is unknown: no reading.
    let completed_while_busy = match (memory.previous, backlog, produce_rate) {
        (Some(previous), Some(b), Some(lambda))
            if busy && ready == current && b != previous.backlog =>
        {
            let after_pause = memory.last_change_at.is_none_or(|at| {
                started_seconds.is_some_and(|started| {
                    seconds_between(at, previous.value_since)
                        >= started + config.rebalance_cost_seconds + config.poll_interval_seconds
                })
            });
            let steady = previous
                .produce_rate
                .is_some_and(|before| (before - lambda).abs() <= 0.05 * lambda);
            let elapsed = sample_span(&previous, now, config.poll_interval_seconds);
            (after_pause && steady && seconds_between(previous.value_since, now) > 0.0)
                .then(|| (lambda - (b - previous.backlog) / elapsed).max(0.0))
        }
        _ => None,
    };
    let busiest_consumer_shares =
        partitions.map_or(f64::from(ready), |p| group_capacity(ready, p, 1.0));
    let backlog_rising = memory
        .previous
        .zip(backlog)
        .is_some_and(|(previous, waiting)| waiting > previous.backlog);
    // A busiest consumer falling behind by a share f since the replicas last changed holds an
    // event at least f × that time old, while the others draining what a rebalance left can
    // lift the group's completions to λ: only an age within the keep-up tolerance of that
    // time shows it keeps up. Without an age query, the backlog as if all of it were the
    // busiest's stands in (an upper bound of its age).
    let evidence_seconds = memory
        .last_change_at
        .or(memory.demand.first().map(|run| run.at))
        .map_or(0.0, |since| seconds_between(since, now).max(0.0));
    let keeping_up = match (completion_rate, produce_rate, used.scaling_backlog) {
        (Some(completed), Some(lambda), Some(waiting)) if lambda > 0.0 => {
            let busiest_age = oldest_age.unwrap_or(waiting * busiest_consumer_shares / lambda);
            completed >= KEEPS_UP_SHARE * lambda
                && waiting <= lambda * config.poll_interval_seconds
                && busiest_age <= (1.0 - KEEPS_UP_SHARE) * evidence_seconds
        }
        _ => false,
    };
    let capacity = estimate_capacity(
        CapacityEvidence {
            configured: config.per_replica_rate,
            completion_rate,
            completed_at_least,
            completed_while_busy,
            ready_replicas: ready,
            busiest_consumer_shares,
            arrivals: produce_rate.filter(|_| config.produce_rate_configured),
            partitions,
            backlog_rising,
            keeping_up,
            saturated,
            settled,
            stale_after_seconds: 2.0 * config.scale_down_stabilization_seconds.max(300.0),
            prior_test_seconds: prior_test_seconds(config, memory),
            prior_test_age_room: config.warning_at * config.deadline_seconds,
        },
        memory.capacity,
        now,
    );
    let per_replica_rate = match capacity {
        Some(estimate) => {
            used.capacity_source = Some(estimate.source);
            Some(estimate.per_replica_rate)
        }
        None => {
            missing_push(
                &mut missing,
                "metrics.completionRate",
                "gave no usable completion rate with ready replicas, and capacity.perReplicaRate is unset, so capacity is unknown",
            );
            None
        }
    };
    used.per_replica_rate = per_replica_rate;

    let produce_rate = match (config.produce_rate_configured, produce_rate, backlog) {
        (true, rate, _) => rate,
        (false, _, Some(b)) => match memory.previous {
            Some(previous) if seconds_between(previous.at, now) > 0.0 => {
                let elapsed = seconds_between(previous.at, now);
                let completing = completion_rate
                    .or(per_replica_rate.map(|r| r * f64::from(ready)))
                    .unwrap_or(0.0);
                used.produce_rate_estimated = true;
                Some((completing + (b - previous.backlog) / elapsed).max(0.0))
            }
            _ => {
                missing_push(
                    &mut missing,
                    "metrics.produceRate",
                    "is not configured and there is no earlier observation to estimate it from yet",
                );
                None
            }
        },
        (false, _, None) => None,
    };
    let rising = match (config.produce_rate_configured, produce_rate, backlog) {
        (true, Some(lambda), Some(b)) => {
            // Right after a change the group may be starting or rebalancing, completing
            // nothing whatever its rate window says: the rise alone is then what it shows, a
            // lower bound of the arrivals. It is read only where a reaction takes a large
            // share of the age limit: a step must then be met at once, while with room to
            // spare the window is given the time to tell a step from a spike that is over
            // before new pods would work.
            let tight = reaction_seconds(config, memory)
                >= TIGHT_REACTION_SHARE * config.warning_at * config.deadline_seconds;
            let completing_at_most = if settled {
                per_replica_rate
                    .zip(partitions)
                    .map(|(rate, p)| rate * f64::from(ready.min(p)))
            } else {
                Some(0.0)
            };
            let readable = settled || tight;
            arrivals_seen_rising(
                memory.previous,
                b,
                lambda,
                completion_rate,
                completing_at_most,
                config.poll_interval_seconds,
                now,
            )
            .filter(|_| readable)
        }
        _ => None,
    };
    used.produce_rate_from_backlog = rising.is_some();
    let queried_produce_rate = produce_rate;
    let produce_rate = rising.or(produce_rate);
    used.produce_rate = produce_rate;
    let oldest_age = match (config.oldest_age_configured, oldest_age) {
        (true, age) => age,
        (false, _) => match (backlog, produce_rate, per_replica_rate) {
            (Some(b), Some(lambda), Some(rate)) => {
                used.oldest_age_estimated = true;
                Some(estimate_oldest_age(
                    b,
                    lambda,
                    rate * f64::from(ready.max(1)),
                ))
            }
            _ => None,
        },
    };
    used.oldest_age = oldest_age;

    let values = match (
        backlog,
        produce_rate,
        oldest_age,
        partitions,
        per_replica_rate,
    ) {
        (Some(backlog), Some(produce_rate), Some(oldest_age), Some(partitions), Some(rate))
            if missing.is_empty() =>
        {
            Some(Values {
                scaling_backlog: (backlog - paused_backlog).max(0.0),
                backlog,
                produce_rate,
                queried_produce_rate: queried_produce_rate.unwrap_or(produce_rate),
                oldest_age,
                partitions,
                per_replica_rate: rate,
                capacity_measured: capacity.and_then(|c| c.measured),
                busy_since,
                awaiting_measurement: busy && changed_lately,
                backlog_rising,
                used: used.clone(),
            })
        }
        _ => None,
    };
    Gathered {
        used,
        values,
        missing,
    }
}

/// How far the arrivals the backlog shows may exceed the queried λ before they replace it: a
/// gauge sampled between commits wobbles by a fraction of λ, and that is not a step.
const RISE_TOLERANCE: f64 = 0.25;

/// A reaction (two polls, a pod start, a rebalance) taking at least this share of the age
/// limit leaves no poll to wait for the rate window after a change.
const TIGHT_REACTION_SHARE: f64 = 0.25;

/// How much the queried λ must have risen since the previous poll to show that a step up in
/// arrivals has begun (a rate window's own wobble stays well below).
const WINDOW_RISE: f64 = 0.1;

/// λ as the backlog's rise since its previous sample shows it, when the queried λ has begun
/// to rise and the backlog shows a step well above it: a rate window lags a step up for the
/// whole window, while the rise plus what the consumers complete shows it within a poll.
/// Completions are taken from the completion rate, but never above what the ready replicas
/// complete at full speed: a window can still hold the work of a larger group. A backlog that rises while the queried λ holds still is consumers slowing
/// down (their completion window lags that fall too), not arrivals: the window stands. A
/// fall is the consumers catching up, and the window is the safer reading of a falling λ.
fn arrivals_seen_rising(
    previous: Option<PreviousObservation>,
    backlog: f64,
    queried: f64,
    completion_rate: Option<f64>,
    completing_at_most: Option<f64>,
    poll_seconds: f64,
    now: Timestamp,
) -> Option<f64> {
    let previous = previous?;
    let elapsed = seconds_between(previous.value_since, now);
    let span = sample_span(&previous, now, poll_seconds);
    let window_rising = previous
        .produce_rate
        .is_some_and(|before| queried > before.max(0.0) * (1.0 + WINDOW_RISE));
    if !window_rising || backlog <= previous.backlog || elapsed <= 0.0 {
        return None;
    }
    let completing = match (completion_rate, completing_at_most) {
        (Some(rate), Some(most)) => rate.min(most),
        (rate, most) => rate.or(most)?,
    }
    .max(0.0);
    let seen = completing + (backlog - previous.backlog) / span;
    (seen > queried.max(0.0) * (1.0 + RISE_TOLERANCE)).then_some(seen)
}

/// Time after a change of replicas before a completion rate reflects the new count: pods
/// starting, the rebalance, then a whole rate window.
fn measurement_settle_seconds(config: &BudgetConfig) -> f64 {
    2.0 * rate_window_seconds(config) + config.rebalance_cost_seconds
}

/// The window the completion rate spans (the budget's, from its queries), and at least two
/// polls: a rate is only seen at polls.
fn rate_window_seconds(config: &BudgetConfig) -> f64 {
    config
        .rate_window_seconds
        .max(2.0 * config.poll_interval_seconds)
}

/// The time the backlog's change since `previous` spans: from when its value was first seen,
/// and at least a poll. A reconcile a watch event brings early sees the next scrape's sample
/// a fraction of a poll after the last, though the samples are a scrape apart: over that
/// fraction the change would read several times too fast.
fn sample_span(previous: &PreviousObservation, now: Timestamp, poll_seconds: f64) -> f64 {
    seconds_between(previous.value_since, now).max(poll_seconds)
}

/// How long fewer replicas sized by a configured rate run before a shortfall is met: their
/// completions measured after the change (no pod starts for a scale-down), then a reaction
/// (two polls, a pod start, a rebalance).
fn prior_test_seconds(config: &BudgetConfig, memory: &ScalingMemory) -> f64 {
    measurement_settle_seconds(config)
        + rate_window_seconds(config)
        + config.poll_interval_seconds
        + reaction_seconds(config, memory)
}

/// From a decision to new pods working: two polls, a pod start (the last seen, else
/// `scaling.podStartTime`), a rebalance.
fn reaction_seconds(config: &BudgetConfig, memory: &ScalingMemory) -> f64 {
    2.0 * config.poll_interval_seconds
        + assumed_pod_start_seconds(config, memory)
        + config.rebalance_cost_seconds
}

/// How long a pod takes to start: the last start seen, else `scaling.podStartTime`.
fn assumed_pod_start_seconds(config: &BudgetConfig, memory: &ScalingMemory) -> f64 {
    memory
        .pod_start_seconds
        .unwrap_or(config.pod_start_seconds)
        .max(0.0)
}

fn missing_push(missing: &mut Vec<MissingInput>, field: &str, reason: &str) {
    missing.push(MissingInput {
        field: field.to_owned(),
        problem: MetricProblem::Unavailable(reason.to_owned()),
    });
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
    let capacity = rate * (1.0 - config.reserved_retry_share);
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
    let demand = demand_history::record(&lifted, values.queried_produce_rate, now, window);
    let recent = Replay::new(&demand, now, window, config.poll_interval_seconds);

    // A hot partition (a backlog below a second of arrivals is in flight, not skew). When it
    // alone receives more than one consumer completes, its backlog is one consumer's work
    // whatever the count, so the count is what the other partitions need. Otherwise its
    // consumer keeps up once it owns little else: the count is planned with the hot
    // partition's share of arrivals.
    let skew = inputs
        .partition_backlogs
        .as_deref()
        .and_then(|samples| partition_skew::detect(samples, values.scaling_backlog, lambda))
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
        Some(skew) => QueueNow {
            backlog: skew.others_backlog,
            oldest_age: estimate_oldest_age(
                skew.others_backlog,
                lambda,
                group_capacity(ready.max(1), values.partitions, capacity),
            ),
        },
        None => QueueNow {
            backlog: values.scaling_backlog,
            oldest_age: values.oldest_age,
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

/// How far back λ is remembered: long enough to see a peak return within a plan's horizon.
fn demand_window_seconds(config: &BudgetConfig) -> f64 {
    (2.0 * plan_horizon_seconds(config))
        .max(2.0 * config.scale_down_stabilization_seconds)
        .max(8.0 * config.poll_interval_seconds)
}

/// How far plans look ahead: long enough that a count which falls behind shows it, and that
/// a change made now is not undone within four scale-down windows.
fn plan_horizon_seconds(config: &BudgetConfig) -> f64 {
    (4.0 * config.scale_down_stabilization_seconds)
        .max(config.deadline_seconds)
        .max(config.target_drain_seconds)
        + config.poll_interval_seconds
        + config.rebalance_cost_seconds
}

/// A hot partition, what it receives, and whether more consumers help it.
struct HotPartition {
    skew: Skew,
    /// Its arrivals, estimated from its backlog and the oldest age.
    hot_rate: Option<f64>,
    /// One consumer completes what it receives: fewer other partitions on its consumer help.
    helped: bool,
}

fn skew_condition(hot: Option<&HotPartition>, replicas: u32) -> ConditionSpec {
    let Some(hot) = hot else {
        return ConditionSpec::new(PARTITION_SKEW, Truth::False, "BacklogSpread", "");
    };
    let (partition, share) = (&hot.skew.partition, hot.skew.share * 100.0);
    let receives = hot.hot_rate.map_or_else(String::new, |rate| {
        format!(" and receives about {}/s", si(rate))
    });
    if hot.helped {
        ConditionSpec::new(
            PARTITION_SKEW,
            Truth::True,
            "HotPartitionSharesAConsumer",
            format!(
                "partition {partition} holds {share:.0} % of the backlog{receives}, which one consumer completes: {replicas} replicas leave its consumer few other partitions; splitting the hot key would let fewer do"
            ),
        )
    } else {
        ConditionSpec::new(
            PARTITION_SKEW,
            Truth::True,
            "HotPartition",
            format!(
                "partition {partition} holds {share:.0} % of the backlog{receives}; more consumers cannot help: split the hot key or give it its own topic"
            ),
        )
    }
}

#[allow(clippy::too_many_arguments)]
fn explain(
    values: &Values,
    planned: &Plan,
    settings: &PlanSettings,
    usable_rate: f64,
    undrainable: bool,
    (recommendation, current): (u32, u32),
    (floor, cap): (u32, u32),
    limited_by_partitions: bool,
    waiting: Option<f64>,
) -> String {
    let lambda = values.produce_rate;
    let rate = values.per_replica_rate;
    // The claim comes first; what the plan does meanwhile follows, since it may rightly hold
    // fewer than the cap through a peak it expects to pass.
    let undrainable = undrainable.then(|| {
        format!(
            "λ {}/s is at or above the most {cap} replicas can complete ({cap} × {}/s = {}/s): the backlog can never catch up at this rate; add partitions or speed up the consumer. ",
            si(lambda),
            si(rate),
            si(f64::from(cap) * rate)
        )
    });
    let source = match values.used.capacity_source {
        Some(CapacitySource::Measured) => " (measured while saturated)",
        Some(CapacitySource::Prior) => " (lower bound: the consumers were never saturated)",
        _ => "",
    };
    let mut text = format!(
        "{}backlog {}, λ {}/s{}, μ/replica {}/s{}",
        undrainable.unwrap_or_default(),
        si(values.scaling_backlog),
        si(lambda),
        if values.used.produce_rate_estimated {
            " (estimated)"
        } else if values.used.produce_rate_from_backlog {
            " (from the backlog's rise)"
        } else {
            ""
        },
        si(rate),
        source,
    );
    let limit = seconds(settings.age_limit);
    let peak = seconds(planned.outlook.peak_age);
    let n = planned.replicas;
    // A count that falls behind is held (or entered) while the deadline leaves room: say how
    // much it completes, as planned (without the share kept for retries), and what follows.
    let behind = match planned.keep_up {
        Some(keep_up) if planned.falls_behind => format!(
            "{n} complete {}/s, less than λ: the backlog grows while the oldest age stays below {limit} with {keep_up} from the next decision (predicted peak {peak})",
            si(values.partition_capacity(n, usable_rate))
        ),
        // No count keeps up: the plan bets on λ passing, as long as it has lasted so far.
        None if planned.falls_behind => format!(
            "{n} complete {}/s, less than λ, and no count keeps up: the oldest age stays below {limit} if λ lasts about as long as it has so far (should it stay, the oldest age would reach {peak})",
            si(values.partition_capacity(n, usable_rate))
        ),
        _ => String::new(),
    };
    text.push_str(&match planned.reason {
        PlanReason::Holding if planned.falls_behind => format!(" → holding: {behind}"),
        PlanReason::Holding => format!(
            " → {n} replicas keep the oldest age below {limit} (predicted peak {peak})"
        ),
        PlanReason::ScaleUp if planned.falls_behind => {
            format!(" → {n}, the cheapest way through should λ last: {behind}")
        }
        PlanReason::ScaleUp => format!(
            " → need {n}: {current} would let the oldest age pass {limit} (predicted peak {peak} with {n})"
        ),
        PlanReason::ScaleDown if planned.falls_behind => format!(
            " → economy, {n} replicas for at least {} more: {behind}",
            seconds(settings.horizon)
        ),
        PlanReason::ScaleDown => format!(
            " → {n} suffice: they keep the oldest age below {limit}, also if a recurring peak returns (predicted peak {peak})"
        ),
        PlanReason::Probe => format!(
            " → trying {n} to learn what the consumers complete: the rate is only a lower bound while they idle, and even at it the partition count, asked for once the try could be measured, keeps the oldest age below {limit} (predicted peak {peak})"
        ),
        PlanReason::CapFallsShort => format!(
            " → need more than {cap}: even {cap} let the oldest age reach {peak} (limit {limit})"
        ),
        PlanReason::Recovering => format!(
            " → the oldest event is past the critical fraction: all {n} replicas until it is back below {limit}"
        ),
    });
    if limited_by_partitions {
        text.push_str(&format!(", capped at {} partitions", values.partitions));
    } else if values.awaiting_measurement && recommendation > planned.replicas {
        text.push_str(&format!(
            ", held at {recommendation} until the completions show what the last change gives (a scale-down waits for that measurement)"
        ));
    } else if recommendation != planned.replicas {
        text.push_str(&format!(", kept within [{floor}, {cap}] replicas"));
    }
    if let Some(wait) = waiting {
        text.push_str(&format!(
            "; {} to {recommendation} waits {} more (stabilization)",
            if recommendation < current {
                "scaling down"
            } else {
                "scaling up"
            },
            seconds(wait)
        ));
    }
    text
}

fn metrics_message(used: &UsedValues) -> String {
    let mut notes = Vec::new();
    if used.oldest_age_estimated {
        notes.push("oldest unfinished age is estimated as backlog / λ because metrics.oldestUnfinishedAge is not set; export it from the consumer for a real value");
    }
    if used.produce_rate_estimated {
        notes.push("λ is estimated from the backlog trend because metrics.produceRate is not set");
    }
    if used.per_replica_rate_measured() {
        notes.push("per-replica rate is measured as completionRate / ready replicas");
    }
    if notes.is_empty() {
        "every query returned one sample".to_owned()
    } else {
        notes.join("; ")
    }
}

fn deadline_condition(
    phase: BudgetPhase,
    oldest_age: f64,
    ratio: f64,
    config: &BudgetConfig,
    explanation: &str,
) -> ConditionSpec {
    let age = format!(
        "oldest unfinished event is {} old, {:.0}% of the {} deadline",
        seconds(oldest_age),
        ratio * 100.0,
        seconds(config.deadline_seconds)
    );
    match phase {
        BudgetPhase::Undrainable => ConditionSpec::new(
            DEADLINE_AT_RISK,
            Truth::True,
            "Undrainable",
            format!("{age}; {explanation}"),
        ),
        BudgetPhase::Breaching => {
            ConditionSpec::new(DEADLINE_AT_RISK, Truth::True, "PastCriticalThreshold", age)
        }
        BudgetPhase::AtRisk if ratio >= config.warning_at => {
            ConditionSpec::new(DEADLINE_AT_RISK, Truth::True, "PastWarningThreshold", age)
        }
        BudgetPhase::AtRisk => ConditionSpec::new(
            DEADLINE_AT_RISK,
            Truth::True,
            "BacklogGrowing",
            format!("{age}; the backlog grows at the current capacity"),
        ),
        _ => ConditionSpec::new(DEADLINE_AT_RISK, Truth::False, "WithinBudget", age),
    }
}

#[cfg(test)]
mod tests;
