use super::*;
use crate::demand_history::{DemandSample, Replay};
use jiff::Timestamp;
use proptest::prelude::*;

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + seconds).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// A history of `rates`, one per 30 s bucket, ending now (t = 30 × len).
fn recent(rates: &[f64]) -> (Replay, Timestamp) {
    let history: Vec<DemandSample> = rates
        .iter()
        .enumerate()
        .map(|(i, rate)| DemandSample {
            at: at(30 * i as i64),
            rate: *rate,
        })
        .collect();
    let now = at(30 * rates.len() as i64);
    (
        Replay::new(&history, now, 30.0 * rates.len() as f64, 15.0),
        now,
    )
}

fn settings() -> PlanSettings {
    PlanSettings {
        age_limit: 300.0,
        drain_limit: 300.0,
        poll: 15.0,
        pod_start: 20.0,
        rebalance: 10.0,
        horizon: 900.0,
    }
}

fn inputs<'a>(
    recent: &'a Replay,
    backlog: f64,
    age: f64,
    lambda: f64,
    current: u32,
) -> PlanInputs<'a> {
    PlanInputs {
        queue: QueueNow {
            backlog,
            oldest_age: age,
        },
        produce_rate: lambda,
        recent,
        current_run_seconds: 900.0,
        per_replica_rate: 250.0,
        partitions: 16,
        current,
        ready: current,
        floor: 1,
        cap: 16,
    }
}

#[test]
fn a_constant_load_gets_the_fewest_replicas_that_keep_up() {
    let (replay, _) = recent(&[950.0; 24]);
    let p = plan(&inputs(&replay, 0.0, 0.0, 950.0, 12), &settings());
    assert_eq!((p.replicas, p.reason), (4, PlanReason::ScaleDown));
    let p = plan(&inputs(&replay, 0.0, 0.0, 950.0, 4), &settings());
    assert_eq!((p.replicas, p.reason), (4, PlanReason::Holding));
}

#[test]
fn a_count_that_falls_behind_is_not_entered() {
    // 3 replicas complete 750/s of 800/s: the backlog would grow slowly, well inside the
    // horizon's age limit, but such a count is the first half of a limit cycle.
    let (replay, _) = recent(&[800.0; 24]);
    let p = plan(&inputs(&replay, 0.0, 0.0, 800.0, 6), &settings());
    assert_eq!(p.replicas, 4);
}

#[test]
fn a_short_spike_is_absorbed_by_the_time_budget() {
    // Base 500/s, the last bucket at 5000/s: with 4 replicas (1000/s) the cap could still
    // recover if it lasted, and the recent past is mostly base load.
    let mut rates = vec![500.0; 23];
    rates.push(5000.0);
    let (replay, _) = recent(&rates);
    let p = plan(&inputs(&replay, 60_000.0, 20.0, 5000.0, 4), &settings());
    assert_eq!((p.replicas, p.reason), (4, PlanReason::Holding));
}

#[test]
fn a_spike_above_the_cap_seen_for_one_poll_is_not_the_new_load() {
    // 6000/s is more than the cap of 16 completes (4000/s), but it began a poll ago over a
    // recent past of 500/s: expected to last a poll or two, it is absorbed.
    let mut rates = vec![500.0; 23];
    rates.push(6000.0);
    let (replay, _) = recent(&rates);
    let mut seen = inputs(&replay, 40_000.0, 10.0, 6000.0, 4);
    seen.current_run_seconds = 15.0;
    assert_eq!(plan(&seen, &settings()).reason, PlanReason::Holding);
    // Had it lasted the whole window, it would be planned as the load.
    let (lasting, _) = recent(&[6000.0; 24]);
    let lasted = inputs(&lasting, 40_000.0, 10.0, 6000.0, 4);
    assert_eq!(plan(&lasted, &settings()).replicas, 16);
}

#[test]
fn a_load_that_persists_above_the_count_scales_up_in_one_step() {
    let (replay, _) = recent(&[3500.0; 24]);
    let p = plan(&inputs(&replay, 400_000.0, 150.0, 3500.0, 3), &settings());
    assert_eq!(p.reason, PlanReason::ScaleUp);
    assert!(p.replicas >= 15, "{p:?}");
    assert!(p.outlook.peak_age <= 0.9 * 300.0, "{p:?}");
}

#[test]
fn an_alternating_load_is_not_chased_down_at_its_trough() {
    // 2000/s and 500/s alternating every 3 minutes; now at the trough with 7 replicas.
    let mut rates = Vec::new();
    for _ in 0..2 {
        rates.extend([2000.0; 6]);
        rates.extend([500.0; 6]);
    }
    let (replay, _) = recent(&rates);
    let p = plan(&inputs(&replay, 0.0, 0.0, 500.0, 7), &settings());
    assert!(p.replicas >= 5, "{p:?}");
}

#[test]
fn nothing_keeps_the_deadline_above_the_cap() {
    let (replay, _) = recent(&[6000.0; 24]);
    let p = plan(&inputs(&replay, 0.0, 0.0, 6000.0, 4), &settings());
    assert_eq!((p.replicas, p.reason), (16, PlanReason::CapFallsShort));
}

proptest! {
    /// At a constant λ the plan is a fixed point after one change: whatever the start, the
    /// count it chooses holds at the next decision.
    #[test]
    fn at_a_constant_load_the_plan_settles(
        lambda in 10.0..3900.0f64,
        start in 1u32..=16,
    ) {
        let (replay, _) = recent(&[lambda; 24]);
        let first = plan(&inputs(&replay, 0.0, 0.0, lambda, start), &settings());
        let second = plan(&inputs(&replay, 0.0, 0.0, lambda, first.replicas), &settings());
        prop_assert_eq!(second.replicas, first.replicas, "{:?} then {:?}", first, second);
    }

    #[test]
    fn the_plan_stays_within_floor_and_cap(
        lambda in 0.0..10_000.0f64,
        backlog in 0.0..2e6f64,
        age in 0.0..900.0f64,
        start in 1u32..=16,
    ) {
        let (replay, _) = recent(&[lambda; 4]);
        let p = plan(&inputs(&replay, backlog, age, lambda, start), &settings());
        prop_assert!((1..=16).contains(&p.replicas));
    }
}
