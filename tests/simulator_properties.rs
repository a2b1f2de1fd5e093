//! Properties of the budget's decision on generated workloads, run through the simulator (the
//! same decision code as the controller, offline): it settles at a constant λ from any start,
//! and without a configured capacity it comes back to the constant optimum after a burst.

use backlog_operator::core::drain::group_capacity;
use backlog_operator::sim::policy::PolicyKind;
use backlog_operator::sim::run::{SimulationResult, simulate};
use backlog_operator::sim::scenario::{Model, Scenario};
use proptest::prelude::*;

/// Seconds of the scale-down stabilization window every generated budget uses.
const WINDOW_SECONDS: f64 = 180.0;

fn model(yaml: &str) -> Model {
    let scenario: Scenario = serde_yaml::from_str(yaml).expect("a generated scenario parses");
    scenario.model().expect("a generated scenario is valid")
}

/// A constant λ for 90 minutes.
fn constant(lambda: f64, rate: f64, partitions: u32, start: u32, configured: bool) -> Model {
    constant_with(lambda, rate, partitions, start, configured, "10m", "5m")
}

/// [`constant`] with the deadline and the drain limit given.
fn constant_with(
    lambda: f64,
    rate: f64,
    partitions: u32,
    start: u32,
    configured: bool,
    deadline: &str,
    drain: &str,
) -> Model {
    let capacity = if configured {
        format!("capacity: {{perReplicaRate: {rate}, reservedRetryShare: 0}}")
    } else {
        "capacity: {reservedRetryShare: 0}".to_owned()
    };
    model(&format!(
        r#"
name: constant
duration: 90m
partitions: {partitions}
initialReplicas: {start}
production:
  - {{from: 0s, rate: {lambda}}}
consumer: {{perReplicaRate: {rate}}}
budget:
  minReplicas: 1
  maxReplicas: {partitions}
  completionDeadline: {deadline}
  {capacity}
  scaling: {{targetDrainTime: {drain}, scaleDownStabilization: 3m, rebalanceCost: 10s}}
"#
    ))
}

/// The cheapest count that keeps up with `lambda` for good (a finite run's static count may
/// fall behind slowly enough to end before the deadline).
fn keep_up_optimum(lambda: f64, rate: f64, partitions: u32) -> u32 {
    (1..=partitions)
        .find(|k| group_capacity(*k, partitions, rate) >= lambda)
        .unwrap_or(partitions)
}

/// The most replicas the timeline shows from `from` seconds on.
fn highest_from(result: &SimulationResult, from: f64) -> u32 {
    result
        .timeline
        .iter()
        .filter(|row| row.t >= from)
        .map(|row| row.replicas)
        .max()
        .unwrap_or(0)
}

/// Replica changes in the timeline after `after` seconds.
fn changes_after(result: &SimulationResult, after: f64) -> usize {
    result
        .timeline
        .windows(2)
        .filter(|w| w[1].t > after && w[1].replicas != w[0].replicas)
        .count()
}

/// A constant λ for 80 minutes over a consumer slowed by `factor` from minute 10 to 30: with
/// no configured rate, a 10-minute deadline and 5-minute drain limit; with one, 5 and 2.
fn slowdown(
    lambda: f64,
    rate: f64,
    partitions: u32,
    factor: f64,
    configured: Option<f64>,
) -> Model {
    let (capacity, deadline, drain) = match configured {
        Some(prior) => (
            format!("capacity: {{perReplicaRate: {prior}, reservedRetryShare: 0}}"),
            "5m",
            "2m",
        ),
        None => ("capacity: {reservedRetryShare: 0}".to_owned(), "10m", "5m"),
    };
    model(&format!(
        r#"
name: slowdown
duration: 80m
partitions: {partitions}
initialReplicas: 2
production:
  - {{from: 0s, rate: {lambda}}}
consumer:
  perReplicaRate: {rate}
  slowdowns:
    - {{from: 10m, to: 30m, factor: {factor:.2}}}
budget:
  minReplicas: 1
  maxReplicas: {partitions}
  completionDeadline: {deadline}
  {capacity}
  scaling: {{targetDrainTime: {drain}, scaleDownStabilization: 3m, rebalanceCost: 10s}}
"#
    ))
}

/// 40 minutes after the slowdown the replicas are within one of the constant optimum, and
/// the deadline was kept throughout.
fn returns_after_slowdown(
    scenario: &Model,
    lambda: f64,
    rate: f64,
    partitions: u32,
    factor: f64,
) -> Result<(), TestCaseError> {
    let result = simulate(scenario, PolicyKind::Budget);
    let optimum = keep_up_optimum(lambda, rate, partitions);
    let highest = highest_from(&result, 70.0 * 60.0);
    prop_assert!(
        highest <= optimum + 1,
        "λ {lambda}/s, {rate}/s per replica slowed to {factor:.2}, {partitions} partitions: {highest} replicas 40 minutes after the slowdown, the constant optimum is {optimum}"
    );
    prop_assert_eq!(result.summary.breach_seconds, 0.0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// At a constant λ, whatever the starting count and the capacity, the replicas settle:
    /// at most two changes after the first stabilization window.
    #[test]
    fn at_a_constant_load_the_replicas_settle(
        rate in 100.0..500.0f64,
        partitions in 4u32..=32,
        load in 0.1..0.95f64,
        start_share in 0.0..1.0f64,
        configured in any::<bool>(),
    ) {
        let lambda = (load * rate * f64::from(partitions)).round().max(1.0);
        let start = ((start_share * f64::from(partitions)).ceil() as u32).clamp(1, partitions);
        let result = simulate(&constant(lambda, rate, partitions, start, configured), PolicyKind::Budget);
        let changes = changes_after(&result, WINDOW_SECONDS);
        prop_assert!(
            changes <= 2,
            "λ {lambda}/s, {rate}/s per replica, {partitions} partitions, start {start}: {changes} changes after the first window"
        );
        prop_assert_eq!(result.summary.breach_seconds, 0.0);
    }

    /// The same at any deadline the API server accepts (up to a week) and any drain limit:
    /// a long deadline makes a long horizon, and the plans must still resolve a poll and the
    /// drain limit (at 16 hours the budget once jumped to the cap and back every 4 minutes).
    #[test]
    fn at_a_constant_load_the_replicas_settle_at_any_deadline(
        rate in 100.0..500.0f64,
        partitions in 4u32..=32,
        load in 0.1..0.95f64,
        start_share in 0.0..1.0f64,
        deadline_minutes in 10u32..=(7 * 24 * 60),
        drain_minutes in 1u32..=120,
    ) {
        let lambda = (load * rate * f64::from(partitions)).round().max(1.0);
        let start = ((start_share * f64::from(partitions)).ceil() as u32).clamp(1, partitions);
        let (deadline, drain) = (format!("{deadline_minutes}m"), format!("{drain_minutes}m"));
        let model = constant_with(lambda, rate, partitions, start, true, &deadline, &drain);
        let result = simulate(&model, PolicyKind::Budget);
        let changes = changes_after(&result, WINDOW_SECONDS);
        prop_assert!(
            changes <= 2,
            "λ {lambda}/s, {rate}/s per replica, {partitions} partitions, start {start}, deadline {deadline}, drain limit {drain}: {changes} changes after the first window"
        );
        prop_assert_eq!(result.summary.breach_seconds, 0.0);
    }

    /// Without capacity.perReplicaRate, idle consumers only bound their capacity from below,
    /// and a budget that starts with more replicas than the load needs cannot see it. It
    /// tries fewer once, safely within the deadline: 30 minutes in, the replicas are within
    /// one of the cheapest count that keeps up. That holds from the partition count too (the
    /// usual deployment), where at the bound the cap only just keeps up and the try is judged
    /// by the age it may leave, not by a drain the bound cannot promise.
    #[test]
    fn without_a_prior_an_oversized_start_finds_the_optimum(
        rate in 100.0..500.0f64,
        partitions in 8u32..=32,
        load in 0.1..0.45f64,
        from_the_cap in any::<bool>(),
    ) {
        let lambda = (load * rate * f64::from(partitions)).round().max(1.0);
        let optimum = keep_up_optimum(lambda, rate, partitions);
        let start = if from_the_cap { partitions } else { (2 * optimum).min(partitions - 1) };
        prop_assume!(start > optimum + 1);
        let result = simulate(&constant(lambda, rate, partitions, start, false), PolicyKind::Budget);
        let highest = highest_from(&result, 30.0 * 60.0);
        prop_assert!(
            highest <= optimum + 1,
            "λ {lambda}/s, {rate}/s per replica, {partitions} partitions, start {start}: {highest} replicas after 30 minutes, the optimum is {optimum}"
        );
        prop_assert_eq!(result.summary.breach_seconds, 0.0);
    }

    /// Without capacity.perReplicaRate, a burst that saturates the consumers teaches the
    /// budget their capacity: 30 minutes after it the replicas are within one of the
    /// cheapest count that keeps up with the base load.
    #[test]
    fn without_a_prior_the_replicas_return_to_the_base_optimum_after_a_burst(
        rate in 100.0..500.0f64,
        partitions in 8u32..=32,
        load in 0.1..0.5f64,
        burst in 1.6..3.0f64,
    ) {
        let base = (load * rate * f64::from(partitions)).round().max(1.0);
        let peak = (base * burst).min(0.9 * rate * f64::from(partitions)).round();
        let scenario = model(&format!(
            r#"
name: no-prior-burst
duration: 70m
partitions: {partitions}
initialReplicas: 2
production:
  - {{from: 0s, rate: {base}}}
  - {{from: 10m, rate: {peak}}}
  - {{from: 20m, rate: {base}}}
consumer: {{perReplicaRate: {rate}}}
budget:
  minReplicas: 1
  maxReplicas: {partitions}
  completionDeadline: 10m
  capacity: {{reservedRetryShare: 0}}
  scaling: {{targetDrainTime: 5m, scaleDownStabilization: 3m, rebalanceCost: 10s}}
"#
        ));
        let result = simulate(&scenario, PolicyKind::Budget);
        let optimum = keep_up_optimum(base, rate, partitions);
        let highest = highest_from(&result, 50.0 * 60.0);
        prop_assert!(
            highest <= optimum + 1,
            "base {base}/s, {rate}/s per replica, {partitions} partitions: {highest} replicas 30 minutes after the burst, the constant optimum is {optimum}"
        );
    }
    /// Without capacity.perReplicaRate, a consumer that slows down is measured slow while it
    /// falls behind, and the replicas sized for that are never saturated once it recovers:
    /// their completions only show the arrivals. The stale measurement is tried again by the
    /// count that keeps up at the rate seen before the slowdown, so 40 minutes after the
    /// slowdown ends the replicas are within one of the cheapest count that keeps up with the
    /// recovered consumer, and the deadline is kept throughout.
    #[test]
    fn without_a_prior_the_replicas_return_to_the_base_optimum_after_a_slowdown(
        rate in 100.0..500.0f64,
        partitions in 8u32..=32,
        load in 0.15..0.4f64,
        factor in 0.4..0.75f64,
    ) {
        let lambda = (load * rate * f64::from(partitions)).round().max(1.0);
        let scenario = slowdown(lambda, rate, partitions, factor, None);
        returns_after_slowdown(&scenario, lambda, rate, partitions, factor)?;
    }
    /// The same with the consumer's true rate configured and a 5-minute deadline: sizing by
    /// the configured rate again once the slowdown's measurement is stale would let the age
    /// grow for longer than the deadline affords, should the consumers still be slow. The
    /// measurement then stays, as a bound that fewer replicas test when even at the bound
    /// the try is safe; left standing, it kept the count sized for the slowdown for good.
    #[test]
    fn with_a_prior_too_dear_to_size_by_again_the_replicas_return_after_a_slowdown(
        rate in 100.0..500.0f64,
        partitions in 8u32..=32,
        load in 0.15..0.4f64,
        factor in 0.4..0.75f64,
    ) {
        let lambda = (load * rate * f64::from(partitions)).round().max(1.0);
        // Where the cap at the slowed rate has as much to spare as λ, a try is safe even if
        // the slowdown is not over; with less, nothing affordable can show that it is.
        prop_assume!(group_capacity(partitions, partitions, rate * factor) >= 2.0 * lambda);
        let scenario = slowdown(lambda, rate, partitions, factor, Some(rate));
        returns_after_slowdown(&scenario, lambda, rate, partitions, factor)?;
    }
    /// A configured rate well above the truth under a deadline too short to try it again: once
    /// measured, the slower rate keeps it out for good. Noisy arrivals let idle consumers
    /// prove more than the stale measurement now and then; that raises the measurement and
    /// must not forget it, or the prior sizes the group again and the age passes the deadline
    /// long after the first measurement.
    #[test]
    fn a_prior_refuted_under_a_short_deadline_stays_refuted_under_noisy_load(
        rate in 200.0..800.0f64,
        partitions in 16u32..=32,
        load in 0.4..0.6f64,
        overstated in 1.6..2.4f64,
        noise_seed in 0u64..1000,
        pod_start in 30u32..60,
    ) {
        let lambda = (load * rate * f64::from(partitions)).round().max(1.0);
        let prior = (rate * overstated).round();
        let scenario = model(&format!(
            r#"
name: refuted-prior
duration: 60m
partitions: {partitions}
initialReplicas: {partitions}
podStartDelay: {pod_start}s
rebalancePause: 20s
production:
  - {{from: 0s, rate: {lambda}}}
productionNoise: {{share: 0.4, every: 15s, seed: {noise_seed}}}
consumer:
  perReplicaRate: {rate}
budget:
  minReplicas: 1
  maxReplicas: {partitions}
  completionDeadline: 2m
  capacity: {{perReplicaRate: {prior}, reservedRetryShare: 0}}
  scaling: {{targetDrainTime: 1m, scaleDownStabilization: 5m, rebalanceCost: 20s}}
"#
        ));
        let result = simulate(&scenario, PolicyKind::Budget);
        // Until the consumers are measured the prior is all there is, and trying it may cost
        // the deadline; what is asserted is the time after a measurement, once the
        // measurement and the reaction to it are done.
        let measured_at = result
            .changes
            .iter()
            .find(|change| change.reason.contains("(measured while saturated)"))
            .map(|change| change.t);
        prop_assume!(measured_at.is_some());
        let settled_from = measured_at.unwrap_or(f64::INFINITY) + 10.0 * 60.0;
        let worst_later = result
            .timeline
            .iter()
            .filter(|row| row.t >= settled_from)
            .map(|row| row.oldest_age)
            .fold(0.0, f64::max);
        prop_assert!(
            worst_later <= 120.0,
            "λ {lambda}/s, {rate}/s per replica configured as {prior}/s, {partitions} partitions, noise seed {noise_seed}: the oldest event reached {worst_later:.0} s from {settled_from:.0} s on, after the prior was refuted (deadline 120 s)"
        );
    }
    /// Without capacity.perReplicaRate, a budget that starts with too few replicas for a
    /// partition count they do not divide sees only some consumers fall behind (those
    /// owning one partition more); their average completions understate a replica, and a
    /// budget that took them for its bound reached for the cap and stayed there for good.
    /// With a deadline that a pod start and a rebalance use most of, it may still reach for
    /// the cap (a count that falls behind by a hair is held until the count that keeps up
    /// no longer leaves a spike room to react, and then only the cap drains in time), but
    /// once nothing waits it never stays more than one above the cheapest count that keeps
    /// up (after the share kept for retries) for longer than the scale-down window and two
    /// rate windows.
    #[test]
    fn without_a_prior_an_undersized_start_on_uneven_partitions_does_not_stay_high(
        rate in 100.0..500.0f64,
        partitions in 6u32..=32,
        load in 0.2..0.6f64,
    ) {
        let lambda = (load * rate * f64::from(partitions)).round().max(1.0);
        let optimum = keep_up_optimum(lambda, 0.9 * rate, partitions);
        let start = optimum - 1;
        prop_assume!(start >= 2 && partitions % start != 0);
        let scenario = model(&format!(
            r#"
name: no-prior-undersized
duration: 60m
partitions: {partitions}
initialReplicas: {start}
podStartDelay: 60s
rebalancePause: 20s
production:
  - {{from: 0s, rate: {lambda}}}
consumer: {{perReplicaRate: {rate}}}
budget:
  minReplicas: 1
  maxReplicas: {partitions}
  completionDeadline: 2m
  scaling: {{targetDrainTime: 1m, scaleDownStabilization: 5m, rebalanceCost: 20s}}
"#
        ));
        let result = simulate(&scenario, PolicyKind::Budget);
        let longest = longest_idle_above(&result, optimum + 1);
        prop_assert!(
            longest <= 300.0 + 2.0 * 60.0,
            "λ {lambda}/s, {rate}/s per replica, {partitions} partitions, start {start}: {longest} s above {} replicas with nothing waiting",
            optimum + 1
        );
        prop_assert_eq!(result.summary.breach_seconds, 0.0);
    }
}

/// The longest stretch of the timeline with more than `above` replicas asked for and
/// nothing waiting (seconds).
fn longest_idle_above(result: &SimulationResult, above: u32) -> f64 {
    let mut longest: f64 = 0.0;
    let mut since: Option<f64> = None;
    for row in &result.timeline {
        if row.replicas > above && row.backlog <= 0.0 {
            let from = *since.get_or_insert(row.t);
            longest = longest.max(row.t - from);
        } else {
            since = None;
        }
    }
    longest
}
