//! The capacity plan of a live budget, checked against what was measured: replicas the
//! partitions leave idle, a peak the partitions cannot carry, and a deadline the retry policy
//! alone can exceed. The result is the `CapacityPlan` condition and the headroom at the peak.

use crate::condition::{ConditionSpec, Truth};
use crate::drain::{group_capacity, replicas_for};
use crate::format::{busiest_owning, seconds, si};
use crate::scaling::Reaction;

pub const CAPACITY_PLAN: &str = "CapacityPlan";

/// What the check reads; every measurement is optional, and an unknown one is never zero.
#[derive(Clone, Debug, PartialEq)]
pub struct CapacityFacts {
    /// spec.maxReplicas.
    pub max_replicas: u32,
    pub partitions: Option<u32>,
    /// Events per second one replica completes, when known as a capacity: configured, or
    /// measured while the consumers were saturated. A rate measured on idle consumers is only
    /// a lower bound and does not count.
    pub per_replica_rate: Option<f64>,
    /// Share of capacity kept for retries.
    pub reserved_retry_share: f64,
    /// The highest produce rate of the last 24 hours.
    pub peak_produce_rate: Option<f64>,
    pub deadline_seconds: f64,
    /// alerts.warningAt × the deadline: the oldest age the budget plans to stay under.
    pub age_limit_seconds: f64,
    /// spec.minReplicas: the replicas always running.
    pub min_replicas: u32,
    /// How long a scale-up takes to work after a rise is seen.
    pub reaction: Reaction,
    /// The RetryPolicy the budget names and its worst-case retry delay in seconds.
    pub retry_worst_case: Option<(String, f64)>,
}

/// The outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct CapacityCheck {
    pub condition: ConditionSpec,
    /// What the replica cap completes over the 24-hour peak (2.0 = twice the peak); `None`
    /// when either is unknown.
    pub headroom: Option<f64>,
}

/// The check.
pub fn check(facts: &CapacityFacts) -> CapacityCheck {
    let mut problems: Vec<(&'static str, String)> = Vec::new();
    if let Some(partitions) = facts.partitions
        && facts.max_replicas > partitions
    {
        problems.push((
            "ReplicasAbovePartitions",
            format!(
                "spec.maxReplicas {} is above the {partitions} partitions, and a consumer beyond the partition count idles: lower spec.maxReplicas to {partitions} or add partitions",
                facts.max_replicas
            ),
        ));
    }

    let usable_rate = facts
        .per_replica_rate
        .filter(|rate| rate.is_finite() && *rate > 0.0)
        .map(|rate| rate * (1.0 - facts.reserved_retry_share));
    let cap = facts
        .partitions
        .map(|partitions| facts.max_replicas.min(partitions));
    let peak = facts
        .peak_produce_rate
        .filter(|peak| peak.is_finite() && *peak >= 0.0);
    let known = match (cap, usable_rate, peak) {
        (Some(cap), Some(rate), Some(peak)) => {
            let partitions = facts.partitions.unwrap_or(cap);
            Some(Known {
                cap,
                partitions,
                rate,
                peak,
                capacity: group_capacity(cap, partitions, rate),
            })
        }
        _ => None,
    };
    let mut unknown = Vec::new();
    if cap.is_none() {
        unknown.push("the partition count");
    }
    if usable_rate.is_none() {
        unknown.push("the per-replica rate (set capacity.perReplicaRate, or wait for a saturated interval to measure it)");
    }
    if peak.is_none() {
        unknown.push("the 24-hour peak produce rate (metrics.produceRate)");
    }
    let headroom = known
        .as_ref()
        .and_then(|k| (k.peak > 0.0).then(|| k.capacity / k.peak));
    if let Some(known) = &known {
        if let Some(problem) = undrainable_at_peak(known) {
            problems.push(("UndrainableAtPeak", problem));
        }
        if let Some(problem) = slower_than_a_rise(facts, known) {
            problems.push(("ReactionSlowerThanAgeLimit", problem));
        }
    }
    if let Some((policy, worst)) = &facts.retry_worst_case
        && *worst > facts.deadline_seconds
    {
        problems.push((
            "DeadlineBelowRetryWorstCase",
            format!(
                "spec.completionDeadline ({}) is shorter than RetryPolicy {policy}'s worst-case retry delay ({}): an event that needs every attempt misses it however many replicas run; see the policy's DeadlineConflict condition",
                seconds(facts.deadline_seconds),
                seconds(*worst)
            ),
        ));
    }

    let condition = if let Some((reason, _)) = problems.first() {
        let message = problems
            .iter()
            .map(|(_, message)| message.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        ConditionSpec::new(CAPACITY_PLAN, Truth::False, *reason, message)
    } else if !unknown.is_empty() {
        ConditionSpec::new(
            CAPACITY_PLAN,
            Truth::Unknown,
            "NotMeasured",
            format!("not checked yet: unknown {}", unknown.join(", ")),
        )
    } else {
        let message = match (&known, headroom) {
            (Some(known), Some(headroom)) => format!(
                "{} replicas complete {}/s, {headroom:.1}× the peak produce rate of the last 24h ({}/s)",
                known.cap,
                si(known.capacity),
                si(known.peak)
            ),
            _ => "no produce rate in the last 24h; the partitions and replicas fit".to_owned(),
        };
        ConditionSpec::new(CAPACITY_PLAN, Truth::True, "Fits", message)
    };
    CapacityCheck {
        condition,
        headroom: headroom.map(|h| (h * 100.0).round() / 100.0),
    }
}

/// The measurements every capacity claim needs, with what the cap completes from them.
struct Known {
    /// The replicas that can work: spec.maxReplicas, at most the partitions.
    cap: u32,
    partitions: u32,
    /// Per replica, after the retry reserve.
    rate: f64,
    /// The 24-hour peak produce rate.
    peak: f64,
    /// What the cap completes, the busiest consumer limiting the group.
    capacity: f64,
}

/// Where the cap completes less than the 24-hour peak: the claim and the fix.
fn undrainable_at_peak(known: &Known) -> Option<String> {
    let Known {
        cap,
        partitions,
        rate,
        peak,
        capacity,
    } = *known;
    if capacity >= peak {
        return None;
    }
    let fix = match replicas_for(peak, rate, partitions) {
        Some(replicas) => format!("raise spec.maxReplicas to {replicas}"),
        None => {
            let needed = (peak / rate).ceil();
            format!(
                "{needed} partitions (and spec.maxReplicas {needed}) are needed, or a faster consumer"
            )
        }
    };
    let busiest = busiest_owning(cap, partitions).map_or_else(String::new, |b| format!(", {b}"));
    Some(format!(
        "the peak produce rate of the last 24h, {}/s, is above what {cap} replicas complete: {}/s at {}/s each after the retry reserve{busiest}: at that peak the backlog cannot drain; {fix}",
        si(peak),
        si(capacity),
        si(rate),
    ))
}

/// Where a scale-up takes longer than the age limit: the replicas that must already run for a
/// rise to the peak, arriving at once, to stay under the limit until new pods work, when
/// `spec.minReplicas` holds fewer.
///
/// From an empty queue, λ jumping to the peak, and `μ` completed until the rebalance of the
/// new pods stops every consumer: at the reaction's end `R` the oldest waiting event arrived
/// when `μ (R - rebalance)` events had, so its age is `R - μ (R - rebalance) / peak`. That
/// stays under the limit `L` where `μ ≥ peak (R - L) / (R - rebalance)`. A count that
/// completes the peak asks for no new pods and needs no reaction at all.
fn slower_than_a_rise(facts: &CapacityFacts, known: &Known) -> Option<String> {
    let Known {
        cap,
        partitions,
        rate,
        peak,
        ..
    } = *known;
    let reaction = facts.reaction;
    let total = reaction.seconds();
    let limit = facts.age_limit_seconds;
    let working = total - reaction.rebalance_seconds;
    if total <= limit || working <= 0.0 || peak <= 0.0 {
        return None;
    }
    let needed = peak * ((total - limit) / working).min(1.0);
    let held = replicas_for(needed, rate, partitions);
    if held.is_some_and(|replicas| facts.min_replicas >= replicas) {
        return None;
    }
    let started = if reaction.pod_start_seen {
        "the last seen"
    } else {
        "scaling.podStartTime, no start seen yet"
    };
    let why = format!(
        "a scale-up works {} after a rise is seen (two {} polls, a {} pod start ({started}), a {} rebalance), longer than the {} the oldest event may reach (alerts.warningAt × spec.completionDeadline): should the 24h peak of {}/s arrive at once, only the replicas already running hold the age until then, and they must complete {}/s",
        seconds(total),
        seconds(reaction.poll_seconds),
        seconds(reaction.pod_start_seconds),
        seconds(reaction.rebalance_seconds),
        seconds(limit),
        si(peak),
        si(needed),
    );
    let fix = match held {
        Some(replicas) if replicas <= cap => format!(
            "{replicas} replicas do, spec.minReplicas holds {}: raise spec.minReplicas to {replicas}, or make pods start faster",
            facts.min_replicas
        ),
        _ => format!(
            "not even the {cap} replicas of the cap do: make pods start faster, or give the budget a longer deadline"
        ),
    };
    Some(format!("{why}; {fix}"))
}

#[cfg(test)]
mod tests;
