//! Reading one poll's inputs: every query's value checked, λ, the backlog and the oldest
//! age as the plan will use them, and the capacity per replica with where it came from;
//! or what is missing, when a value cannot be used.

use jiff::Timestamp;

use super::timing::{
    measurement_settle_seconds, measurement_stale_seconds, prior_test_seconds, rate_window_seconds,
    reaction_seconds,
};
use super::{PreviousObservation, ScalingInputs, ScalingMemory, UsedValues};
use crate::budget_config::{BudgetConfig, PartitionSource};
use crate::capacity_estimate::{
    BusyCompletions, CapacityEvidence, MeasuredCapacity, Recovery, estimate as estimate_capacity,
};
use crate::deadline_plan::KEEPS_UP_SHARE;
use crate::drain::{estimate_oldest_age, fewest_owners, group_capacity};
use crate::metric_input::{MetricProblem, MissingInput, Observation, single_value};
use crate::stabilization::seconds_between;

/// The inputs, validated.
pub(super) struct Values {
    pub(super) used: UsedValues,
    pub(super) backlog: f64,
    pub(super) scaling_backlog: f64,
    pub(super) produce_rate: f64,
    /// λ as queried (or estimated without a query), before a rise the backlog shows replaces
    /// it: the next poll tells a rising window by it.
    pub(super) queried_produce_rate: f64,
    pub(super) oldest_age: f64,
    pub(super) partitions: u32,
    pub(super) per_replica_rate: f64,
    pub(super) capacity_measured: Option<MeasuredCapacity>,
    /// The per-replica rate the consumers may have recovered to from a slowdown measured
    /// long ago ([`crate::capacity_estimate::CapacityEstimate::recovery_to_test`]).
    pub(super) recovery_to_test: Option<Recovery>,
    pub(super) busy_since: Option<Timestamp>,
    /// Work waits and the replicas changed too lately for the completion rate to show what
    /// the new count completes: the capacity that chose it is not confirmed yet.
    pub(super) awaiting_measurement: bool,
    /// The backlog rose since the previous poll.
    pub(super) backlog_rising: bool,
}

impl Values {
    /// What `replicas` complete together, at `rate` per replica.
    pub(super) fn partition_capacity(&self, replicas: u32, rate: f64) -> f64 {
        group_capacity(replicas, self.partitions, rate)
    }
}

/// What one poll's queries gave: the validated values, or what is missing.
pub(super) struct Gathered {
    pub(super) used: UsedValues,
    pub(super) values: Option<Values>,
    pub(super) missing: Vec<MissingInput>,
}

pub(super) fn gather(
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
    // backlog waits by design while the replicas idle. Holding moves no event, and no query
    // tells on which partitions it waits: a partition has work only beyond all of it, or
    // one holding nothing but held events would count its idle owner as saturated.
    let partitions_with_work = inputs.partition_backlogs.as_ref().map(|samples| {
        samples
            .iter()
            .filter(|p| p.backlog > paused_backlog)
            .count()
    });
    let every_partition_busy = match (&inputs.partition_backlogs, partitions_with_work) {
        (Some(samples), Some(with_work)) => with_work == samples.len(),
        _ => true,
    };
    let much_waits = match (completion_rate, used.scaling_backlog) {
        (Some(completed), Some(b)) => {
            completed > 0.0 && b > completed * 2.0 * config.poll_interval_seconds
        }
        _ => false,
    };
    let busy = every_partition_busy && much_waits;
    // Where only some partitions have work, their owners are still saturated: a backlog that
    // stands on the busiest consumers' partitions while the others idle tells what those
    // complete, and no poll finds every partition busy.
    let owned_partitions = partitions.or_else(|| {
        inputs
            .partition_backlogs
            .as_ref()
            .and_then(|samples| u32::try_from(samples.len()).ok())
    });
    let busy_consumers_at_least = match (owned_partitions, partitions_with_work) {
        (Some(p), Some(with_work)) => {
            fewest_owners(ready, p, u32::try_from(with_work).unwrap_or(u32::MAX))
        }
        (Some(p), None) => ready.min(p),
        (None, _) => ready,
    };
    let busy_somewhere = much_waits && busy_consumers_at_least > 0;
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
    // passes through it with hardly a move), and its move ([`window_lag`]) is taken off the
    // credit, spread over the backlog sample's span: within one run of λ the window's moves
    // over the polls of a long span add up to its move from the span's start, which the
    // run keeps small.
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
            let steady_for_a_window = memory.demand.last().is_some_and(|run| {
                seconds_between(run.at, previous.value_since)
                    >= rate_window_seconds(config) + config.poll_interval_seconds
            });
            let arrived = match (previous.produce_rate, produce_rate) {
                (Some(before), Some(lambda))
                    if steady_for_a_window && held_still(before, lambda) =>
                {
                    let hidden = window_lag(config, before, lambda, elapsed);
                    (before.min(lambda) - hidden).max(0.0)
                }
                _ => 0.0,
            };
            Some((arrived + (previous.backlog - b) / elapsed).max(0.0))
        }
        _ => None,
    };
    // What busy replicas complete, from the backlog's change; the previous sample must have
    // been seen a poll after the last change's pod starts and rebalance, when the replicas
    // that run now all worked. After a scale-up before any pod start was seen, when that was
    // is unknown: no reading.
    // Under a λ that held still over both polls the reading stands as it is. Otherwise λ's
    // window may be off by its move since the previous poll ([`window_lag`]; a step moves it
    // that slowly, and noise it averages away moves it about as much), over the time since
    // that poll: with no steady run behind it, the move is all that is known of the span,
    // and spread over a level that stood for long and ended within the last poll, it would
    // read as nothing. Where what leaves the window moved too (a periodic load, one step
    // entering as another leaves), the move understates the lag, but the completion rate,
    // which no arrival moves, stays high: the reading is bounded by the higher of the two.
    // Waiting for a λ that holds still instead left a wrong prior sizing the group for many
    // minutes under a noisy load.
    let completed_while_busy = match (memory.previous, backlog, produce_rate) {
        (Some(previous), Some(b), Some(lambda))
            if busy_somewhere && ready == current && b != previous.backlog =>
        {
            let after_pause = memory.last_change_at.is_none_or(|at| {
                started_seconds.is_some_and(|started| {
                    seconds_between(at, previous.value_since)
                        >= started + config.rebalance_cost_seconds + config.poll_interval_seconds
                })
            });
            let elapsed = sample_span(&previous, now, config.poll_interval_seconds);
            let since_poll = seconds_between(previous.at, now).max(config.poll_interval_seconds);
            let read = (lambda - (b - previous.backlog) / elapsed).max(0.0);
            let readable = after_pause && seconds_between(previous.value_since, now) > 0.0;
            match (previous.produce_rate, completion_rate) {
                (Some(before), _) if readable && held_still(before, lambda) => {
                    Some(BusyCompletions::exact(read))
                }
                (Some(before), Some(completed)) if readable => {
                    let hidden = window_lag(config, before, lambda, since_poll);
                    Some(BusyCompletions {
                        read,
                        at_most: (read + hidden).max(completed),
                    })
                }
                _ => None,
            }
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
            busy_consumers_at_least,
            ready_replicas: ready,
            busiest_consumer_shares,
            arrivals: produce_rate.filter(|_| config.produce_rate_configured),
            partitions,
            backlog_rising,
            keeping_up,
            saturated,
            settled,
            stale_after_seconds: measurement_stale_seconds(config),
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
                recovery_to_test: capacity
                    .and_then(|c| c.recovery_to_test(config.per_replica_rate)),
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

/// A λ within this share of the previous poll's held still.
const HELD_STILL_SHARE: f64 = 0.05;

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
pub(super) fn arrivals_seen_rising(
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

/// λ moved by less than a rate window's own wobble since the previous poll, `before`.
fn held_still(before: f64, lambda: f64) -> bool {
    (before - lambda).abs() <= HELD_STILL_SHARE * lambda
}

/// How far arrivals per second over `seconds` may be from λ as its rate window reads it,
/// when the window moved from `before` to `lambda` over them: a window W long that moved by Δ
/// counts arrivals W × Δ apart from those that left it.
fn window_lag(config: &BudgetConfig, before: f64, lambda: f64, seconds: f64) -> f64 {
    rate_window_seconds(config) / seconds * (before - lambda).abs()
}

/// The time the backlog's change since `previous` spans: from when its value was first seen,
/// but no longer than the value before it stood, and at least a poll. A reconcile a watch
/// event brings early sees the next scrape's sample a fraction of a poll after the last,
/// though the samples are a scrape apart: over that fraction the change would read several
/// times too fast. A value that stood longer than the one before it was a level (an empty
/// queue holds 0 at every scrape): a step that ends it came within a sample interval, and
/// spread over the whole level it read as a fraction of itself, so the first poll after a
/// step from an empty queue missed it.
pub(super) fn sample_span(
    previous: &PreviousObservation,
    now: Timestamp,
    poll_seconds: f64,
) -> f64 {
    let stood = seconds_between(previous.value_since, now);
    previous
        .previous_stood
        .map_or(stood, |before| stood.min(before))
        .max(poll_seconds)
}

fn missing_push(missing: &mut Vec<MissingInput>, field: &str, reason: &str) {
    missing.push(MissingInput {
        field: field.to_owned(),
        problem: MetricProblem::Unavailable(reason.to_owned()),
    });
}
