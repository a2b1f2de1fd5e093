//! The capacity plan of a live budget, checked against what was measured: replicas the
//! partitions leave idle, a peak the partitions cannot carry, and a deadline the retry policy
//! alone can exceed. The result is the `CapacityPlan` condition and the headroom at the peak.

use crate::condition::{ConditionSpec, Truth};
use crate::drain::{group_capacity, uneven_busiest_share};
use crate::format::{seconds, si};

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
    let mut headroom = None;
    let mut unknown = Vec::new();
    match (cap, usable_rate, peak) {
        (Some(cap), Some(rate), Some(peak)) => {
            let partitions = facts.partitions.unwrap_or(cap);
            let capacity = group_capacity(cap, partitions, rate);
            headroom = (peak > 0.0).then(|| capacity / peak);
            if capacity < peak {
                let fix = match fewest_replicas_completing(peak, partitions, rate) {
                    Some(replicas) => format!("raise spec.maxReplicas to {replicas}"),
                    None => {
                        let needed = (peak / rate).ceil();
                        format!(
                            "{needed} partitions (and spec.maxReplicas {needed}) are needed, or a faster consumer"
                        )
                    }
                };
                problems.push((
                    "UndrainableAtPeak",
                    format!(
                        "the peak produce rate of the last 24h, {}/s, is above what {cap} replicas complete: {}/s at {}/s each after the retry reserve{}: at that peak the backlog cannot drain; {fix}",
                        si(peak),
                        si(capacity),
                        si(rate),
                        busiest_note(cap, partitions)
                    ),
                ));
            }
        }
        _ => {
            if cap.is_none() {
                unknown.push("the partition count");
            }
            if usable_rate.is_none() {
                unknown.push("the per-replica rate (set capacity.perReplicaRate, or wait for a saturated interval to measure it)");
            }
            if peak.is_none() {
                unknown.push("the 24-hour peak produce rate (metrics.produceRate)");
            }
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
        let message = match (cap, usable_rate, peak, headroom) {
            (Some(cap), Some(rate), Some(peak), Some(headroom)) => format!(
                "{cap} replicas complete {}/s, {headroom:.1}× the peak produce rate of the last 24h ({}/s)",
                si(group_capacity(cap, facts.partitions.unwrap_or(cap), rate)),
                si(peak)
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

/// The fewest replicas, at most one per partition, that complete `rate_needed`: a count that
/// leaves one consumer more partitions than another completes no more than the next lower
/// count that divides them evenly.
fn fewest_replicas_completing(
    rate_needed: f64,
    partitions: u32,
    per_replica_rate: f64,
) -> Option<u32> {
    (1..=partitions)
        .find(|&replicas| group_capacity(replicas, partitions, per_replica_rate) >= rate_needed)
}

/// Where the replicas do not divide the partitions, which consumer limits the group.
fn busiest_note(replicas: u32, partitions: u32) -> String {
    uneven_busiest_share(replicas, partitions).map_or_else(String::new, |busiest| {
        format!(", the busiest owning {busiest} of the {partitions} partitions")
    })
}

#[cfg(test)]
mod tests;
