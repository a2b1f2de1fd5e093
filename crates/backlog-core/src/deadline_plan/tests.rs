use super::*;
use crate::demand_history::Replay;
use crate::demand_history::tests::replay_of;
use proptest::prelude::*;

/// A history of `rates`, one per 30 s bucket, ending now (t = 30 × len).
fn recent(rates: &[f64]) -> Replay {
    let steps: Vec<(i64, f64)> = rates
        .iter()
        .enumerate()
        .map(|(i, rate)| (30 * i as i64, *rate))
        .collect();
    replay_of(&steps, 30 * rates.len() as i64)
}

/// Three periods of `first` then `second`, each for `buckets` 30 s buckets.
fn alternating(first: f64, second: f64, buckets: usize) -> Vec<f64> {
    (0..3)
        .flat_map(|_| [vec![first; buckets], vec![second; buckets]].concat())
        .collect()
}

/// A 10-minute deadline with the default warning fraction (limit 5 minutes), 15 s polls,
/// 20 s pod starts, 10 s rebalances, a 15-minute horizon and a 1-hour economy dwell.
fn settings() -> PlanSettings {
    PlanSettings {
        age_limit: 300.0,
        critical_age: 480.0,
        deadline: 600.0,
        drain_limit: 300.0,
        poll: 15.0,
        pod_start: 20.0,
        rebalance: 10.0,
        horizon: 900.0,
        down_delay: 180.0,
        economy_dwell: 3600.0,
        rate_window: 60.0,
    }
}

/// 16 partitions of 250 events/s: 1, 2, 3, 4, 6, 8 and 16 replicas are the counts that
/// change the assignment (500, 667, 1000, 1333, 2000 and 4000 events/s from 2 on).
fn inputs<'a>(
    recent: &'a Replay,
    backlog: f64,
    age: f64,
    lambda: f64,
    current: u32,
) -> PlanInputs<'a> {
    PlanInputs {
        queue: QueueNow::even(backlog, age),
        produce_rate: lambda,
        recent,
        current_run_seconds: 900.0,
        ahead_seconds: 0.0,
        per_replica_rate: 250.0,
        partitions: 16,
        hot_share: None,
        current,
        ready: current,
        starting_in: 0.0,
        floor: 1,
        cap: 16,
        economy_allowed: true,
        down_waits: &[],
        capacity_is_lower_bound: false,
        recovered_rate: None,
        backlog_rising: false,
        measurement_seconds: 0.0,
        probed_seconds_ago: None,
        changed_seconds_ago: None,
        raised_under: None,
    }
}

#[test]
fn a_constant_load_gets_the_fewest_replicas_that_keep_up() {
    let replay = recent(&[950.0; 24]);
    let p = plan(&inputs(&replay, 0.0, 0.0, 950.0, 12), &settings());
    assert_eq!((p.replicas, p.reason), (4, PlanReason::ScaleDown), "{p:?}");
    let p = plan(&inputs(&replay, 0.0, 0.0, 950.0, 4), &settings());
    assert_eq!((p.replicas, p.reason), (4, PlanReason::Holding), "{p:?}");
}

#[test]
fn economy_serves_a_steady_load_whose_keep_up_count_idles() {
    // 700/s: 4 replicas complete 1000/s and idle 30 %. 3 complete 667/s; the oldest age
    // grows by 5 % of the elapsed time, so they keep the margin for over an hour.
    let replay = recent(&[700.0; 24]);
    let p = plan(&inputs(&replay, 0.0, 0.0, 700.0, 4), &settings());
    assert_eq!((p.replicas, p.reason), (3, PlanReason::ScaleDown), "{p:?}");
    assert!(p.falls_behind);
    assert_eq!(p.keep_up, Some(4));
    // Not while economy is closed (left lately at this load), nor when turned off.
    let mut closed = inputs(&replay, 0.0, 0.0, 700.0, 4);
    closed.economy_allowed = false;
    assert_eq!(plan(&closed, &settings()).replicas, 4);
}

#[test]
fn economy_is_not_entered_for_a_small_saving_or_a_short_stay() {
    // 950/s: 3 replicas (750/s) would save little before 4 are needed again.
    let replay = recent(&[950.0; 24]);
    let p = plan(&inputs(&replay, 0.0, 0.0, 950.0, 4), &settings());
    assert_eq!(p.replicas, 4, "{p:?}");
    // 800/s: 2 replicas (500/s) would reach the margin within the horizon.
    let replay = recent(&[800.0; 24]);
    let p = plan(&inputs(&replay, 0.0, 0.0, 800.0, 4), &settings());
    assert!(p.replicas >= 3, "{p:?}");
}

#[test]
fn a_count_that_falls_behind_is_held_while_the_deadline_leaves_time() {
    // 1200/s arrive and 4 replicas complete 1000/s: the backlog grows by 200/s and the
    // oldest age by a sixth of the elapsed time. Six minutes in, the oldest event is a
    // minute old; six replicas from the next decision would still keep it below the limit.
    let replay = recent(&[1200.0; 24]);
    let p = plan(&inputs(&replay, 72_000.0, 60.0, 1200.0, 4), &settings());
    assert_eq!((p.replicas, p.reason), (4, PlanReason::Holding), "{p:?}");
    assert_eq!(p.keep_up, Some(6));
    // Twenty-five minutes in, the oldest event is 255 s old: waiting longer would pass the
    // limit (270 s), so the keep-up count now (not the cap).
    let p = plan(&inputs(&replay, 306_000.0, 255.0, 1200.0, 4), &settings());
    assert_eq!((p.replicas, p.reason), (6, PlanReason::ScaleUp), "{p:?}");
}

#[test]
fn a_short_spike_is_absorbed_by_the_time_budget() {
    // Base 500/s, the last bucket at 5000/s: if it lasted, 16 replicas from the next decision
    // would still keep the deadline; it began a poll ago, so nothing moves yet.
    let mut rates = vec![500.0; 23];
    rates.push(5000.0);
    let replay = recent(&rates);
    let mut spike = inputs(&replay, 60_000.0, 20.0, 5000.0, 4);
    spike.current_run_seconds = 15.0;
    let p = plan(&spike, &settings());
    assert_eq!((p.replicas, p.reason), (4, PlanReason::Holding), "{p:?}");
}

#[test]
fn a_load_above_the_cap_is_held_only_while_it_is_new() {
    // 6000/s is more than the cap completes (4000/s), but it began a poll ago over a recent
    // past of 500/s: expected to last a poll or two, it is absorbed.
    let mut rates = vec![500.0; 23];
    rates.push(6000.0);
    let replay = recent(&rates);
    let mut seen = inputs(&replay, 40_000.0, 10.0, 6000.0, 4);
    seen.current_run_seconds = 15.0;
    let p = plan(&seen, &settings());
    assert!(p.replicas < 16, "{p:?}");
    // Had it lasted the whole window, every second below the cap would make it worse.
    let lasting = recent(&[6000.0; 24]);
    let p = plan(&inputs(&lasting, 40_000.0, 10.0, 6000.0, 4), &settings());
    assert_eq!(
        (p.replicas, p.reason),
        (16, PlanReason::CapFallsShort),
        "{p:?}"
    );
    assert_eq!(p.keep_up, None);
}

#[test]
fn an_alternating_load_is_not_chased_down_at_its_trough() {
    // 2000/s and 500/s alternating every 3 minutes; now at the trough with 8 replicas.
    let replay = recent(&alternating(2000.0, 500.0, 6));
    let p = plan(&inputs(&replay, 0.0, 0.0, 500.0, 8), &settings());
    assert!(p.replicas >= 4, "{p:?}");
}

#[test]
fn a_count_below_an_alternating_load_s_mean_is_not_entered_where_one_between_carries_it() {
    // 600/s and 2400/s alternating every 4 minutes (mean 1500/s), now at the trough with 8
    // replicas (2000/s). 6 (1333/s) keep the age low for a while, but fall further behind
    // every period until 16 must drain them: a cycle that costs more than holding 8.
    let mut rates = alternating(600.0, 2400.0, 8);
    rates.extend([600.0; 4]);
    let replay = recent(&rates);
    let p = plan(&inputs(&replay, 0.0, 0.0, 600.0, 8), &settings());
    assert_eq!((p.replicas, p.reason), (8, PlanReason::Holding), "{p:?}");
    // At 600/s and 3800/s (mean 2200/s) the count that carries the mean, 16, is the one
    // that carries the peak: no count holds the load steadily for less, so following it
    // (8 until the backlog needs 16) is left to the costs.
    let mut rates = alternating(600.0, 3800.0, 8);
    rates.extend([600.0; 4]);
    let replay = recent(&rates);
    let idle = inputs(&replay, 0.0, 0.0, 600.0, 16);
    let planner = Planner {
        inputs: &idle,
        settings: &settings(),
    };
    let period = replay.recurring_above(2000.0);
    assert!(
        period.is_some_and(|period| planner.carries_mean_or_no_count_between(8, &period)),
        "{replay:?}"
    );
}

#[test]
fn a_one_off_peak_does_not_hold_replicas_after_it() {
    // One 6-minute peak at 2000/s, over for 3 minutes: nothing says it comes back.
    let mut rates = vec![500.0; 12];
    rates.extend([2000.0; 12]);
    rates.extend([500.0; 6]);
    let replay = recent(&rates);
    let p = plan(&inputs(&replay, 0.0, 0.0, 500.0, 8), &settings());
    assert_eq!((p.replicas, p.reason), (2, PlanReason::ScaleDown), "{p:?}");
}

#[test]
fn a_short_spike_seen_once_does_not_hold_the_cap_on_a_tight_deadline() {
    // 1000/s, a 30 s spike to 2500/s two minutes ago, 1000/s since; 16 replicas (the cap)
    // met it. On a 2-minute deadline a reaction takes 90 s, so a spike that lasted the whole
    // horizon would need the cap held; one that returns as it was (30 s) is met from 4
    // (1000/s) with the oldest event near 70 s, below the 96 s critical age.
    // The plan with the cap running, two minutes after the last spike, idle since.
    let after = |rates: &[f64]| {
        let replay = recent(rates);
        let mut idle = inputs(&replay, 0.0, 0.0, 1000.0, 16);
        idle.current_run_seconds = 120.0;
        idle.down_waits = &[0.0; 17];
        plan(&idle, &tight_settings())
    };
    let mut rates = vec![1000.0; 20];
    rates.push(2500.0);
    rates.extend([1000.0; 4]);
    let p = after(&rates);
    assert!(p.replicas < 16, "{p:?}");
    // Peaks that came twice are taken to last: the cap holds.
    let mut rates = vec![1000.0; 12];
    for _ in 0..2 {
        rates.push(2500.0);
        rates.extend([1000.0; 4]);
    }
    let p = after(&rates);
    assert_eq!(p.replicas, 16, "{p:?}");
}

#[test]
fn a_spike_seen_once_is_insured_against_only_up_to_the_deadline() {
    // 1000/s, then a 2-minute spike two minutes ago, 1000/s since; the cap (4000/s) met it.
    // A lower count is kept only if the spike, should it return as it was, is met within
    // the 120 s deadline from it (the cap asked for a poll later).
    let after_spike = |rate: f64, settings: &PlanSettings| {
        let mut rates = vec![1000.0; 20];
        rates.extend([rate; 4]);
        rates.extend([1000.0; 4]);
        let replay = recent(&rates);
        let mut idle = inputs(&replay, 0.0, 0.0, 1000.0, 16);
        idle.current_run_seconds = 120.0;
        idle.down_waits = &[0.0; 17];
        let p = plan(&idle, settings);
        let spike = replay.peak_above(1000.0);
        let returns_to = spike.map(|spike| {
            let planner = Planner {
                inputs: &idle,
                settings,
            };
            let arrivals = |t: f64| {
                if t < spike.span() {
                    spike.rate_at(t)
                } else {
                    1000.0
                }
            };
            planner.predict(p.replicas, 16, &arrivals, 600.0).peak_age
        });
        (p, returns_to)
    };
    let tight = tight_settings();
    // At 5000/s its return from 6 replicas passes the 96 s critical age but not the
    // deadline: 6, not the insurance of 16 for the whole demand window.
    let (p, returns_to) = after_spike(5000.0, &tight);
    assert_eq!((p.replicas, p.reason), (6, PlanReason::ScaleDown), "{p:?}");
    let age = returns_to.unwrap_or(f64::INFINITY);
    assert!(age > tight.critical_age && age <= tight.deadline, "{age}");
    // Held to the critical age instead, that spike would keep the cap.
    let strict = PlanSettings {
        deadline: tight.critical_age,
        ..tight
    };
    assert_eq!(after_spike(5000.0, &strict).0.replicas, 16);
    // At 6000/s no lower count meets its return within the deadline: the cap stays.
    let (p, _) = after_spike(6000.0, &tight);
    assert_eq!(p.replicas, 16, "{p:?}");
}

#[test]
fn past_the_critical_fraction_the_cap_works_until_it_recovers() {
    let replay = recent(&[1000.0; 24]);
    let p = plan(&inputs(&replay, 60_000.0, 500.0, 1000.0, 4), &settings());
    assert_eq!(
        (p.replicas, p.reason),
        (16, PlanReason::Recovering),
        "{p:?}"
    );
}

#[test]
fn a_load_only_the_cap_matches_goes_to_the_cap_at_once() {
    // 4000/s is exactly what 16 replicas complete: whatever waits when they start stays.
    let replay = recent(&[4000.0; 24]);
    let p = plan(&inputs(&replay, 0.0, 0.0, 4000.0, 8), &settings());
    assert_eq!(p.replicas, 16, "{p:?}");
}

#[test]
fn pods_already_starting_are_not_asked_for_twice() {
    // 8 replicas asked for, 4 ready, the rest ready in 5 s: 8 complete what arrives.
    let replay = recent(&[1800.0; 24]);
    let mut starting = inputs(&replay, 60_000.0, 200.0, 1800.0, 8);
    starting.ready = 4;
    starting.starting_in = 5.0;
    assert_eq!(plan(&starting, &settings()).replicas, 8);
}

proptest! {
    /// At a constant λ the plan is a fixed point after one change: whatever the start, the
    /// count it chooses holds at the next decision.
    #[test]
    fn at_a_constant_load_the_plan_settles(
        lambda in 10.0..3900.0f64,
        start in 1u32..=16,
    ) {
        let replay = recent(&[lambda; 24]);
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
        let replay = recent(&[lambda; 4]);
        let p = plan(&inputs(&replay, backlog, age, lambda, start), &settings());
        prop_assert!((1..=16).contains(&p.replicas));
    }

    /// A count the plan holds or enters keeps the oldest age below the limit, with the
    /// keep-up count from the next decision when it falls behind (or it is the cap). The
    /// queue is one that arrivals could have built: what waits arrived over the oldest age.
    #[test]
    fn a_chosen_count_keeps_the_limit_or_is_the_most_there_is(
        lambda in 0.0..3900.0f64,
        density in 0.0..2.0f64,
        age in 0.0..250.0f64,
        start in 1u32..=16,
    ) {
        let replay = recent(&[lambda; 24]);
        let backlog = density * lambda * age;
        let p = plan(&inputs(&replay, backlog, age, lambda, start), &settings());
        prop_assert!(
            p.replicas == 16 || p.outlook.peak_age <= settings().age_limit + 1e-6
                || p.outlook.peak_age <= age + 60.0,
            "{:?}", p
        );
    }

    /// Economy is never entered while it is closed.
    #[test]
    fn a_closed_economy_is_never_entered(
        lambda in 10.0..3900.0f64,
        start in 1u32..=16,
    ) {
        let replay = recent(&[lambda; 24]);
        let mut closed = inputs(&replay, 0.0, 0.0, lambda, start);
        closed.economy_allowed = false;
        let p = plan(&closed, &settings());
        prop_assert!(!(p.reason == PlanReason::ScaleDown && p.falls_behind), "{:?}", p);
    }
}

#[test]
fn a_scale_down_keeps_a_way_back_to_the_recent_load() {
    // The producer stalled (λ 0) after a steady 2000/s. With a 2-minute deadline and a
    // slow way back (30 s polls, 30 s pod start, 30 s rebalance) the floor would let the
    // load's return age events past the limit before the replicas are back: the plan keeps
    // enough to recover. With a 10-minute deadline the way back is short enough to go low.
    let mut rates = vec![2000.0; 20];
    rates.extend([0.0; 4]);
    let replay = recent(&rates);
    let mut stalled = inputs(&replay, 0.0, 0.0, 0.0, 8);
    stalled.current_run_seconds = 120.0;
    stalled.down_waits = &[0.0; 17];
    let short = PlanSettings {
        age_limit: 60.0,
        critical_age: 96.0,
        deadline: 120.0,
        drain_limit: 60.0,
        poll: 30.0,
        pod_start: 30.0,
        rebalance: 30.0,
        ..settings()
    };
    let p = plan(&stalled, &short);
    assert!(p.replicas >= 3, "{p:?}");
    let long = PlanSettings {
        poll: 30.0,
        pod_start: 30.0,
        rebalance: 30.0,
        ..settings()
    };
    let p = plan(&stalled, &long);
    assert!(p.replicas < 3, "{p:?}");
}

#[test]
fn a_level_that_came_as_a_slow_climb_is_expected_back_as_one() {
    // 2000/s for 15 minutes, now 1000/s again, on a 2-minute deadline where going to 4 and
    // back to 8 takes two 10 s rebalances, two 30 s polls and a 30 s pod start. Should that
    // level return at once, 4 replicas (1000/s) let the age reach 63 s before 8 work: 6
    // (1333/s) are kept. Where it came as a 10-minute climb, a return that fast was never
    // seen: read as it climbs, the age stays near 30 s, and 4 suffice.
    let short = PlanSettings {
        poll: 30.0,
        rebalance: 10.0,
        horizon: 900.0,
        ..tight_settings()
    };
    let plan_after = |rates: &[f64]| {
        let replay = recent(rates);
        let mut after = inputs(&replay, 0.0, 0.0, 1000.0, 8);
        after.current_run_seconds = 120.0;
        after.down_waits = &[0.0; 17];
        plan(&after, &short)
    };
    let climb: Vec<f64> = (1..=20).map(|i| 1000.0 + 50.0 * f64::from(i)).collect();
    let came_slowly = [vec![1000.0; 20], climb, vec![2000.0; 30], vec![1000.0; 4]].concat();
    let p = plan_after(&came_slowly);
    assert_eq!(p.replicas, 4, "{p:?}");
    let jumped = [vec![1000.0; 20], vec![2000.0; 50], vec![1000.0; 4]].concat();
    let p = plan_after(&jumped);
    assert_eq!(p.replicas, 6, "{p:?}");
}

#[test]
fn a_slowdown_measured_long_ago_is_tried_again_by_the_count_the_recovery_needs() {
    // 950/s over 16 partitions, a slowdown measured at 70/s per replica (16 replicas kept
    // up) that has gone stale; before it the consumers completed 250/s. The budget changed
    // replicas before, so the probe that starts a budget is over: only the chance of a
    // recovery allows another one, and to 4 replicas (the fewest that keep up at 250/s),
    // not to the fewest that merely leave the way back, which would only measure the
    // slowdown again if it lasts.
    let replay = recent(&[950.0; 24]);
    let mut stale = inputs(&replay, 0.0, 0.0, 950.0, 16);
    stale.per_replica_rate = 70.0;
    stale.capacity_is_lower_bound = true;
    stale.changed_seconds_ago = Some(3600.0);
    let settled = plan(&stale, &settings());
    assert_ne!(settled.reason, PlanReason::Probe, "{settled:?}");
    stale.recovered_rate = Some(250.0);
    let p = plan(&stale, &settings());
    assert_eq!((p.replicas, p.reason), (4, PlanReason::Probe), "{p:?}");
    // Where no fewer replicas would keep up even at the recovered rate, nothing is tried.
    stale.recovered_rate = Some(950.0 / 15.0);
    assert_ne!(plan(&stale, &settings()).reason, PlanReason::Probe);
}

/// `idle` deployed at the cap of 16, its bound exactly λ / 16, a probe measured after 90 s.
fn at_cap_exact(idle: PlanInputs<'_>) -> PlanInputs<'_> {
    PlanInputs {
        current: 16,
        ready: 16,
        per_replica_rate: 950.0 / 16.0,
        measurement_seconds: 90.0,
        ..idle
    }
}

#[test]
fn idle_consumers_with_only_a_lower_bound_try_fewer_replicas() {
    // 950/s over 12 idle replicas: 79/s each is all that is known. Even at that bound the
    // 16 replicas asked for at the next decision would undo one replica's deficit in time,
    // so one replica is tried: it keeps up, or its saturation measures the capacity.
    let replay = recent(&[950.0; 24]);
    let mut idle = inputs(&replay, 0.0, 0.0, 950.0, 12);
    idle.per_replica_rate = 950.0 / 12.0;
    assert_eq!(plan(&idle, &settings()).reason, PlanReason::Holding);
    idle.capacity_is_lower_bound = true;
    let p = plan(&idle, &settings());
    assert_eq!((p.replicas, p.reason), (1, PlanReason::Probe), "{p:?}");
    // With a shorter deadline, the fewest that still leave the way back.
    let shorter = PlanSettings {
        age_limit: 60.0,
        ..settings()
    };
    let p = plan(&idle, &shorter);
    assert_eq!(p.reason, PlanReason::Probe, "{p:?}");
    assert!(p.replicas > 1 && p.replicas < 12, "{p:?}");
    // Deployed at the cap, the bound is λ / 16 and the way back only just completes λ (or
    // a hair more, a rate read through a window): a probe's backlog would stand there for
    // good if the bound were the truth. It is still tried, by its age: at the bound its
    // oldest event stays within the down limit, so the worst it leaves is a young queue;
    // refused, the group stayed at the cap for good.
    let mut at_cap = idle;
    at_cap.current = 16;
    at_cap.ready = 16;
    for surplus in [0.0, 1e-12, 1e-3] {
        at_cap.per_replica_rate = 950.0 / 16.0 * (1.0 + surplus);
        let p = plan(&at_cap, &settings());
        assert_eq!(p.reason, PlanReason::Probe, "surplus {surplus}: {p:?}");
        assert!(p.replicas < 16, "surplus {surplus}: {p:?}");
        assert!(
            p.outlook.peak_age <= settings().age_limit,
            "surplus {surplus}: {p:?}"
        );
    }
    // A poll into that probe it falls behind, as a probe at the bound must: it is held
    // until it is measured, not undone before it taught anything.
    let tried = plan(&at_cap_exact(idle), &settings()).replicas;
    let mut probing = at_cap_exact(idle);
    probing.current = tried;
    probing.ready = tried;
    probing.changed_seconds_ago = Some(15.0);
    probing.probed_seconds_ago = Some(15.0);
    probing.backlog_rising = true;
    probing.queue = QueueNow::even(950.0 * 15.0, 15.0);
    let p = plan(&probing, &settings());
    assert_eq!((p.replicas, p.reason), (tried, PlanReason::Probe), "{p:?}");
    // Once measured, the probe is over: the plan follows the measurement.
    probing.probed_seconds_ago = Some(probing.measurement_seconds);
    assert_ne!(plan(&probing, &settings()).reason, PlanReason::Probe);
    // Below λ at the bound, the way back falls behind too: nothing could undo a deficit.
    at_cap.per_replica_rate = 950.0 / 16.0 * 0.99;
    assert_ne!(plan(&at_cap, &settings()).reason, PlanReason::Probe);
    // Work waiting means the consumers may be saturated already: no probe.
    let mut busy = idle;
    busy.queue = QueueNow::even(950.0 * 60.0, 60.0);
    assert_ne!(plan(&busy, &settings()).reason, PlanReason::Probe);
    // A backlog that rose since the last decision, however small: some consumers are
    // saturated, and the bound is what they complete; there is nothing to learn.
    let mut rising = idle;
    rising.backlog_rising = true;
    assert_ne!(plan(&rising, &settings()).reason, PlanReason::Probe);
    // A deadline that leaves no room at the bound: no probe either.
    let tight = PlanSettings {
        age_limit: 20.0,
        ..settings()
    };
    assert_ne!(plan(&idle, &tight).reason, PlanReason::Probe);
}

#[test]
fn a_scale_up_is_held_to_the_age_it_was_asked_under_while_it_turns_the_age() {
    // 4 replicas complete 1000/s of 950/s: they turn the age, slowly. It is 280 s, past the
    // hold limit (270 s), because the scale-up to 4 was asked for at 250 s with 60 s to work.
    let replay = recent(&[950.0; 24]);
    let mut asked = inputs(&replay, 950.0 * 280.0, 280.0, 950.0, 4);
    asked.raised_under = Some(250.0 + 60.0);
    let p = plan(&asked, &settings());
    assert_eq!((p.replicas, p.reason), (4, PlanReason::Holding), "{p:?}");
    // Not asked for by a scale-up, the same age asks for more: the model may be wrong.
    let mut found = asked;
    found.raised_under = None;
    assert_eq!(plan(&found, &settings()).reason, PlanReason::ScaleUp);
    // Past the age it was asked under, too.
    let mut passed = asked;
    passed.queue.oldest_age = 320.0;
    assert_eq!(plan(&passed, &settings()).reason, PlanReason::ScaleUp);
    // And a count that falls behind never turns the age: the hold limit.
    let mut behind = asked;
    behind.current = 3;
    behind.ready = 3;
    assert_eq!(plan(&behind, &settings()).reason, PlanReason::ScaleUp);
}

/// A 2-minute deadline (limit 1 minute, critical at 96 s) with 30 s pod starts and 30 s
/// rebalances: a reaction (two polls, a pod start, a rebalance) takes 90 s of it.
fn tight_settings() -> PlanSettings {
    PlanSettings {
        age_limit: 60.0,
        critical_age: 96.0,
        deadline: 120.0,
        drain_limit: 60.0,
        pod_start: 30.0,
        rebalance: 30.0,
        horizon: 600.0,
        ..settings()
    }
}

#[test]
fn a_standing_queue_that_leaves_a_spike_no_room_is_drained() {
    // 4 replicas complete exactly the 1000/s arriving: the 45 s old queue would stand for
    // good, and a spike would find 51 s of the 96 before the critical age, not the 90 s a
    // reaction takes.
    let replay = recent(&[1000.0; 24]);
    let p = plan(
        &inputs(&replay, 45_000.0, 45.0, 1000.0, 4),
        &tight_settings(),
    );
    // The new pods work 60 s from now, over 75k events; the queue must be gone a reaction
    // (90 s) after the 75 s by which a scale-up asked for now can drain (a poll after they
    // work). 8 replicas complete the events waiting now at 72 s and the whole queue at
    // 135 s; 6 (1333/s) would take until 285 s. The cap drains sooner, at twice the cost.
    assert_eq!((p.replicas, p.reason), (8, PlanReason::ScaleUp), "{p:?}");
    assert_eq!(p.outlook.end_backlog, 0.0, "{p:?}");
    assert!(p.outlook.drained_at.is_some_and(|t| t <= 75.0), "{p:?}");
}

#[test]
fn a_drain_limit_shorter_than_a_pod_start_does_not_send_a_small_queue_to_the_cap() {
    // 4 replicas complete exactly the 1000/s arriving, over a 20 s old queue that leaves a
    // spike too little room. The 30 s drain limit ends before any new pod works (45 s start,
    // 5 s rebalance): judged from then, no count meets it and the queue went to the cap.
    // Given a poll once the new pods work, and a reaction more for the queue behind the
    // events waiting now, 6 replicas drain it.
    let replay = recent(&[1000.0; 24]);
    let short_drain = PlanSettings {
        drain_limit: 30.0,
        pod_start: 45.0,
        rebalance: 5.0,
        ..tight_settings()
    };
    let p = plan(&inputs(&replay, 20_000.0, 20.0, 1000.0, 4), &short_drain);
    assert_eq!((p.replicas, p.reason), (6, PlanReason::ScaleUp), "{p:?}");
    assert!(p.outlook.peak_age <= short_drain.age_limit, "{p:?}");
    assert_eq!(p.outlook.end_backlog, 0.0, "{p:?}");
}

#[test]
fn a_standing_queue_that_leaves_room_to_react_is_held() {
    // The same queue under a 10-minute deadline: 45 s of age leaves the reaction its time.
    let replay = recent(&[1000.0; 24]);
    let p = plan(&inputs(&replay, 45_000.0, 45.0, 1000.0, 4), &settings());
    assert_eq!((p.replicas, p.reason), (4, PlanReason::Holding), "{p:?}");
}

#[test]
fn a_standing_queue_is_held_where_no_reaction_fits_the_deadline_anyway() {
    // A 20 s deadline (critical at 16 s) with the 30 s pod start assumed before one is seen:
    // even an empty queue leaves a spike no time, so draining this one buys nothing.
    let short = PlanSettings {
        age_limit: 10.0,
        critical_age: 16.0,
        deadline: 20.0,
        drain_limit: 10.0,
        poll: 1.0,
        pod_start: 30.0,
        rebalance: 0.33,
        horizon: 60.0,
        ..settings()
    };
    let replay = recent(&[1000.0; 24]);
    let p = plan(&inputs(&replay, 5_000.0, 5.0, 1000.0, 4), &short);
    assert_eq!((p.replicas, p.reason), (4, PlanReason::Holding), "{p:?}");
}

#[test]
fn the_way_back_after_a_scale_down_starts_new_pods() {
    // Pods of the current count, asked for earlier and nearly started, are stopped by a
    // scale-down: a plan that goes lower now and back up later waits a whole pod start, so
    // its outlook is the same however far along those pods were.
    let replay = recent(&[2000.0; 24]);
    let nearly_started = PlanInputs {
        ready: 4,
        starting_in: 0.0,
        ..inputs(&replay, 40_000.0, 60.0, 2000.0, 16)
    };
    let not_started = PlanInputs {
        starting_in: settings().pod_start,
        ..nearly_started
    };
    let settings = settings();
    let outlook = |inputs: &PlanInputs<'_>| {
        Planner {
            inputs,
            settings: &settings,
        }
        .predict(2, 16, &|_| 2000.0, settings.horizon)
    };
    assert_eq!(outlook(&nearly_started), outlook(&not_started));
    // Kept, the pods already starting still count.
    let kept = |inputs: &PlanInputs<'_>| {
        Planner {
            inputs,
            settings: &settings,
        }
        .predict(16, 16, &|_| 2000.0, settings.horizon)
    };
    let (sooner, later) = (kept(&nearly_started), kept(&not_started));
    assert!(
        matches!((sooner.drained_at, later.drained_at), (Some(a), Some(b)) if a < b),
        "{sooner:?} {later:?}"
    );
}

#[test]
fn a_peak_of_a_load_that_alternates_is_not_priced_as_lasting() {
    // 64 partitions, 576/s a replica: 3 complete 1728/s. The load has alternated for 20
    // minutes, a minute or two above 2000/s and a minute at 1262/s (as a rate window and the
    // runs' highest values show it). Half a minute into a peak, 3 hold: priced as if the peak
    // (keep-up 5) took over once the age nears the limit, 3 looked dearer than 4 at every
    // peak and cheaper at every trough, a pair of rebalances per period; what takes over
    // then is a count for the forecast's mean.
    let steps = [
        (0, 2593.2),
        (68, 2132.4),
        (128, 1262.0),
        (203, 2695.6),
        (263, 2311.6),
        (323, 1262.0),
        (398, 2618.8),
        (473, 2106.8),
        (533, 1313.2),
        (608, 2670.0),
        (668, 2286.0),
        (728, 1262.0),
        (803, 2670.0),
        (878, 2081.2),
        (938, 1338.8),
        (1013, 2618.8),
        (1073, 2234.8),
        (1133, 1262.0),
        (1208, 2311.6),
    ];
    let replay = replay_of(&steps, 1238);
    let mut at_peak = inputs(&replay, 36_000.0, 14.0, 2311.6, 3);
    at_peak.per_replica_rate = 576.0;
    at_peak.partitions = 64;
    at_peak.cap = 32;
    at_peak.current_run_seconds = 30.0;
    at_peak.capacity_is_lower_bound = true;
    at_peak.backlog_rising = true;
    at_peak.changed_seconds_ago = Some(270.0);
    let periodic = PlanSettings {
        drain_limit: 297.0,
        pod_start: 45.0,
        rebalance: 4.0,
        horizon: 619.0,
        down_delay: 60.0,
        ..settings()
    };
    let p = plan(&at_peak, &periodic);
    assert_eq!((p.replicas, p.reason), (3, PlanReason::Holding), "{p:?}");
}

#[test]
fn a_count_replaced_before_it_works_is_not_asked_for() {
    // Captured two minutes into a peak of 4151/s over a base of 685/s: 48 partitions, 429/s
    // a replica, 12 keep up. 6 were asked for half a minute ago (5 ready) and the oldest
    // event is 205 s old. 7 would hold only until the next poll: asked for, it was replaced
    // by 8 a poll later, then 10, each a rebalance that stopped the whole group, before its
    // pods had even started. A count that falls behind is asked for only if it works first.
    let replay = replay_of(
        &[
            (0, 685.0),
            (355, 4719.0),
            (490, 3576.0),
            (595, 746.7),
            (1330, 1203.0),
            (1435, 685.0),
            (2350, 4151.0),
        ],
        2470,
    );
    let down_waits = [300.0; 6];
    let mut peak = inputs(&replay, 850_955.0, 205.0, 4151.0, 6);
    peak.per_replica_rate = 429.0;
    peak.partitions = 48;
    peak.cap = 24;
    peak.ready = 5;
    peak.current_run_seconds = 120.0;
    peak.economy_allowed = false;
    peak.down_waits = &down_waits;
    peak.backlog_rising = true;
    peak.measurement_seconds = 260.0;
    peak.changed_seconds_ago = Some(30.0);
    peak.raised_under = Some(280.0);
    let spiky = PlanSettings {
        drain_limit: 427.0,
        pod_start: 45.0,
        rebalance: 20.0,
        horizon: 1235.0,
        down_delay: 300.0,
        ..settings()
    };
    let p = plan(&peak, &spiky);
    assert_eq!((p.replicas, p.reason), (12, PlanReason::ScaleUp), "{p:?}");
    assert!(!p.falls_behind);
}

#[test]
fn pods_about_to_work_are_not_outbid_by_a_count_given_more_time_to_drain() {
    // Captured from a consumer slowed to 593/s a replica under 2495/s, 64 partitions: 5 were
    // asked for 75 s ago (4 ready, the new pod works in 15 s plus the rebalance) and keep up.
    // The 42 s drain limit ends before any pod asked for now could work (90 s start). When a
    // count's own start set how long it may take to drain, 6 was given 15 s more than the 5
    // already starting, so it was asked for, then 7, 8, 10, 11, 13 and 16 at the next polls.
    let replay = replay_of(&[(0, 2495.0)], 2370);
    let down_waits = [300.0; 5];
    let mut slowed = inputs(&replay, 107_285.0, 43.0, 2495.0, 5);
    slowed.per_replica_rate = 592.8;
    slowed.partitions = 64;
    slowed.cap = 32;
    slowed.ready = 4;
    slowed.starting_in = 15.0;
    slowed.current_run_seconds = 2370.0;
    slowed.economy_allowed = false;
    slowed.down_waits = &down_waits;
    slowed.backlog_rising = true;
    slowed.measurement_seconds = 298.0;
    slowed.changed_seconds_ago = Some(75.0);
    slowed.raised_under = Some(172.0);
    let tight = PlanSettings {
        age_limit: 60.0,
        critical_age: 96.0,
        deadline: 120.0,
        drain_limit: 42.0,
        pod_start: 90.0,
        rebalance: 13.0,
        horizon: 1228.0,
        down_delay: 300.0,
        ..settings()
    };
    let p = plan(&slowed, &tight);
    assert_eq!((p.replicas, p.reason), (5, PlanReason::Holding), "{p:?}");
}

/// A load of 1491/s that rises to 2443/s for 152 s every 440 s, over 12 partitions of
/// 382/s: 6 replicas complete 2292/s, above the period's mean (1820/s) and below its peak;
/// the next count that changes the assignment is 12. A 2-minute deadline (limit 1 minute)
/// with 84 s pod starts and 37 s rebalances: a reaction takes longer than the limit.
fn recurring_peaks(peak_lasted: i64, now: i64) -> (Replay, PlanSettings) {
    let mut steps = Vec::new();
    for start in [269, 709] {
        steps.push((start, 2443.0));
        steps.push((start + 152, 1491.0));
    }
    steps.insert(0, (0, 1491.0));
    steps.push((1150, 2443.0));
    assert!(now - 1150 == peak_lasted);
    let slow_reaction = PlanSettings {
        age_limit: 60.0,
        critical_age: 108.0,
        deadline: 120.0,
        drain_limit: 116.0,
        poll: 15.0,
        pod_start: 84.0,
        rebalance: 37.0,
        horizon: 1352.0,
        down_delay: 300.0,
        economy_dwell: 0.0,
        rate_window: 60.0,
    };
    (replay_of(&steps, now), slow_reaction)
}

fn at_recurring_peak(replay: &Replay, lasted: f64, backlog: f64, age: f64) -> PlanInputs<'_> {
    let mut at_peak = inputs(replay, backlog, age, 2443.0, 6);
    at_peak.per_replica_rate = 382.0;
    at_peak.partitions = 12;
    at_peak.cap = 12;
    at_peak.current_run_seconds = lasted;
    at_peak.economy_allowed = false;
    at_peak.changed_seconds_ago = Some(600.0);
    at_peak
}

#[test]
fn a_count_that_carries_a_recurring_load_rides_out_its_peak() {
    // 30 s into the third peak, 6 have fallen 4.5k events behind. Should 2443/s last, only
    // 12 would keep up, and asked for later they would start too late for the limit; but the
    // peak has come and gone twice, 6 catch up at every trough (the age grows about 10 s
    // over a peak), and 12 asked for at every peak would be a rebalance each way per period
    // (with a trough shorter than the scale-down window, never undone).
    let (replay, settings) = recurring_peaks(30, 1180);
    let p = plan(&at_recurring_peak(&replay, 30.0, 36_600.0, 15.0), &settings);
    assert_eq!((p.replicas, p.reason), (6, PlanReason::Holding), "{p:?}");
    assert!(p.falls_behind && p.rides_out, "{p:?}");
}

#[test]
fn a_peak_that_outlasts_the_last_one_is_not_ridden_out() {
    // The same load 200 s into a peak that lasted 152 s before: it may have become the load.
    let (replay, settings) = recurring_peaks(200, 1350);
    let p = plan(
        &at_recurring_peak(&replay, 200.0, 30_200.0, 13.0),
        &settings,
    );
    assert_eq!((p.replicas, p.reason), (12, PlanReason::ScaleUp), "{p:?}");
}

#[test]
fn a_scale_down_followed_later_is_judged_at_the_phase_it_meets() {
    // 1000/s rising to 2600/s for 152 s every 440 s; 6 replicas (2292/s) carry the mean and
    // fall 18 s behind over a peak. The history ends at the third peak's start, with 12
    // replicas idle. 6 carry the load when their 37 s rebalance falls into a trough, not
    // when it falls onto a peak's start: the oldest event then waits the pause and the
    // peak's 18 s, past the 42 s a scale-down must stay under.
    let (_, settings) = recurring_peaks(0, 1150);
    let replay = replay_of(
        &[
            (0, 1000.0),
            (269, 2600.0),
            (421, 1000.0),
            (709, 2600.0),
            (861, 1000.0),
            (1150, 2600.0),
        ],
        1150,
    );
    let mut idle = inputs(&replay, 0.0, 0.0, 2600.0, 12);
    idle.per_replica_rate = 382.0;
    idle.partitions = 12;
    idle.cap = 12;
    let judged_at = |ahead: f64| {
        let later = PlanInputs {
            ahead_seconds: ahead,
            ..idle
        };
        Planner {
            inputs: &later,
            settings: &settings,
        }
        .carries_returning_peaks(6, DOWN_AGE_SHARE * settings.age_limit)
    };
    assert!(!judged_at(0.0), "followed at once, at the peak's start");
    assert!(judged_at(152.0 + 15.0), "followed at the trough after it");
    assert!(!judged_at(441.0), "followed at the next peak's start");
}
