use proptest::prelude::*;

use super::gather::{arrivals_seen_rising, sample_span};
use super::*;
use crate::budget_config::PartitionSource;
use crate::partition_skew::PartitionSample;

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(s).unwrap()
}

fn config() -> BudgetConfig {
    crate::budget_config::example()
}

fn value(v: f64) -> Observation {
    Observation::Samples(vec![v])
}

fn inputs(backlog: f64, lambda: f64, age: f64, replicas: u32) -> ScalingInputs {
    ScalingInputs {
        backlog: value(backlog),
        oldest_age: Some(value(age)),
        produce_rate: Some(value(lambda)),
        completion_rate: None,
        retry_rate: None,
        quarantine_rate: None,
        partitions: None,
        paused_class_backlogs: vec![],
        current_replicas: replicas,
        ready_replicas: Some(replicas),
        conflict: None,
        partition_backlogs: None,
    }
}

#[test]
fn steady_load_needs_lambda_over_capacity() {
    let d = decide(
        &config(),
        &inputs(0.0, 1000.0, 1.0, 4),
        &ScalingMemory::default(),
        at(0),
    );
    assert_eq!(d.phase, BudgetPhase::Healthy);
    assert_eq!(d.desired, 4);
    assert_eq!(d.change, None);
}

#[test]
fn explanation_names_the_numbers_and_the_partition_cap() {
    let mut c = config();
    c.partitions = PartitionSource::Fixed(6);
    let d = decide(
        &c,
        &inputs(600_000.0, 1400.0, 60.0, 2),
        &ScalingMemory::default(),
        at(0),
    );
    assert_eq!(d.desired, 6);
    assert!(
        d.explanation
            .starts_with("backlog 600k, λ 1.4k/s, μ/replica 250/s → need"),
        "{}",
        d.explanation
    );
    assert!(
        d.explanation.contains("capped at 6 partitions"),
        "{}",
        d.explanation
    );
    let limited = d
        .conditions
        .iter()
        .find(|c| c.type_ == PARTITION_LIMITED)
        .unwrap();
    assert_eq!(limited.status, Truth::True);
    assert!(limited.message.contains("more consumers cannot help"));
}

#[test]
fn burst_scales_up_in_one_step() {
    // 600k behind with 5m to drain → at least 2000/s → 8 replicas of 250/s, in one change.
    let d = decide(
        &config(),
        &inputs(600_000.0, 1000.0, 30.0, 4),
        &ScalingMemory::default(),
        at(0),
    );
    assert!(d.desired >= 8, "{d:?}");
    let change = d.change.unwrap();
    assert_eq!(change.from, 4);
}

#[test]
fn deadline_close_shrinks_the_window() {
    let relaxed = decide(
        &config(),
        &inputs(60_000.0, 1000.0, 30.0, 4),
        &ScalingMemory::default(),
        at(0),
    );
    let urgent = decide(
        &config(),
        &inputs(60_000.0, 1000.0, 550.0, 4),
        &ScalingMemory::default(),
        at(0),
    );
    assert!(urgent.desired > relaxed.desired);
    assert_eq!(urgent.phase, BudgetPhase::Breaching);
}

#[test]
fn breached_deadline_asks_for_the_cap() {
    let d = decide(
        &config(),
        &inputs(60_000.0, 1000.0, 900.0, 4),
        &ScalingMemory::default(),
        at(0),
    );
    assert_eq!(d.desired, 12);
    assert_eq!(d.phase, BudgetPhase::Breaching);
}

#[test]
fn a_cap_that_misses_only_the_drain_limit_says_so() {
    // 900k waiting at 1000/s: the 12 replicas of the cap complete 3000/s and keep the age
    // near a minute, but need 450 s for the queue against a 300 s targetDrainTime.
    let d = decide(
        &config(),
        &inputs(900_000.0, 1000.0, 60.0, 12),
        &ScalingMemory::default(),
        at(0),
    );
    assert_eq!(d.desired, 12);
    assert!(
        d.explanation.contains("targetDrainTime 5m")
            && d.explanation.contains("only after")
            && !d.explanation.contains("let the oldest age reach"),
        "{}",
        d.explanation
    );
}

#[test]
fn undrainable_when_the_cap_cannot_outpace_arrivals() {
    let mut c = config();
    c.partitions = PartitionSource::Fixed(6);
    let d = decide(
        &c,
        &inputs(0.0, 1500.0, 1.0, 2),
        &ScalingMemory::default(),
        at(0),
    );
    assert_eq!(d.phase, BudgetPhase::Undrainable);
    assert_eq!(d.desired, 6);
    assert!(
        d.explanation.contains("can never catch up"),
        "{}",
        d.explanation
    );
    // And what the budget does meanwhile, in the words of any other decision.
    assert!(
        d.explanation.contains("→ ") && d.explanation.contains("μ/replica"),
        "{}",
        d.explanation
    );
    assert_eq!(d.drain_time_seconds, None);
}

#[test]
fn undrainable_counts_what_replicas_complete_over_partitions_they_do_not_divide() {
    // 8 replicas over 12 partitions: four own two each, so the group completes what 6 do,
    // 1500/s, below the 1600/s arriving although 8 × 250/s is 2000/s.
    let mut c = config();
    c.partitions = PartitionSource::Fixed(12);
    c.max_replicas = 8;
    let d = decide(
        &c,
        &inputs(0.0, 1600.0, 1.0, 8),
        &ScalingMemory::default(),
        at(0),
    );
    assert_eq!(d.phase, BudgetPhase::Undrainable);
    assert!(
        d.explanation.contains(
            "the most 8 replicas can complete (250/s each, the busiest owning 2 of the 12 partitions: 1.5k/s)"
        ),
        "{}",
        d.explanation
    );
}

#[test]
fn empty_backlog_query_holds_and_names_the_query() {
    let mut i = inputs(0.0, 100.0, 1.0, 7);
    i.backlog = Observation::Samples(vec![]);
    let d = decide(&config(), &i, &ScalingMemory::default(), at(0));
    assert_eq!(d.phase, BudgetPhase::MetricsUnavailable);
    assert_eq!(d.desired, 7);
    assert_eq!(d.change, None);
    let metrics = d
        .conditions
        .iter()
        .find(|c| c.type_ == METRICS_AVAILABLE)
        .unwrap();
    assert_eq!(metrics.status, Truth::False);
    assert!(
        metrics
            .message
            .contains("spec.metrics.backlog returned no sample"),
        "{}",
        metrics.message
    );
}

#[test]
fn unreachable_prometheus_holds() {
    let failed = || Observation::Failed("connection refused".into());
    let mut i = inputs(0.0, 0.0, 0.0, 3);
    i.backlog = failed();
    i.oldest_age = Some(failed());
    i.produce_rate = Some(failed());
    let d = decide(&config(), &i, &ScalingMemory::default(), at(0));
    assert_eq!(d.phase, BudgetPhase::MetricsUnavailable);
    assert_eq!(d.desired, 3);
    let metrics = d
        .conditions
        .iter()
        .find(|c| c.type_ == METRICS_AVAILABLE)
        .unwrap();
    assert_eq!(metrics.reason, "QueryFailed");
}

#[test]
fn conflict_hands_off() {
    let mut i = inputs(1e6, 1000.0, 500.0, 3);
    i.conflict = Some("HorizontalPodAutoscaler orders".into());
    let d = decide(&config(), &i, &ScalingMemory::default(), at(0));
    assert_eq!(d.phase, BudgetPhase::Conflict);
    assert_eq!(d.change, None);
    assert_eq!(d.desired, 3);
}

/// A budget that has decided before: its last change was an hour ago.
fn running_for_an_hour() -> ScalingMemory {
    ScalingMemory {
        last_change_at: Some(at(-3600)),
        ..ScalingMemory::default()
    }
}

#[test]
fn scale_down_waits_for_the_window() {
    let c = config();
    let first = decide(
        &c,
        &inputs(0.0, 240.0, 1.0, 10),
        &running_for_an_hour(),
        at(0),
    );
    assert_eq!(first.desired, 10);
    assert!(first.explanation.contains("waits"), "{}", first.explanation);
    let second = decide(&c, &inputs(0.0, 240.0, 1.0, 10), &first.memory, at(299));
    assert_eq!(second.desired, 10);
    let third = decide(&c, &inputs(0.0, 240.0, 1.0, 10), &second.memory, at(300));
    assert_eq!(third.desired, 1);
}

#[test]
fn max_step_bounds_a_change() {
    let mut c = config();
    c.max_step = 2;
    // The oldest event is near the limit: 12 are needed now, at most 2 more per change.
    let d = decide(
        &c,
        &inputs(400_000.0, 2500.0, 260.0, 4),
        &ScalingMemory::default(),
        at(0),
    );
    assert_eq!(d.desired, 6);
}

#[test]
fn oldest_age_is_estimated_when_not_configured() {
    let mut c = config();
    c.oldest_age_configured = false;
    let mut i = inputs(30_000.0, 1000.0, 0.0, 4);
    i.oldest_age = None;
    let d = decide(&c, &i, &ScalingMemory::default(), at(0));
    assert_eq!(d.used.oldest_age, Some(30.0));
    assert!(d.used.oldest_age_estimated);
    let metrics = d
        .conditions
        .iter()
        .find(|c| c.type_ == METRICS_AVAILABLE)
        .unwrap();
    assert!(metrics.message.contains("estimated"));
}

#[test]
fn produce_rate_is_estimated_from_the_trend_and_missing_on_the_first_poll() {
    let mut c = config();
    c.produce_rate_configured = false;
    let mut i = inputs(10_000.0, 0.0, 10.0, 4);
    i.produce_rate = None;
    let first = decide(&c, &i, &ScalingMemory::default(), at(0));
    assert_eq!(first.phase, BudgetPhase::MetricsUnavailable);
    i.backlog = value(13_000.0);
    let second = decide(&c, &i, &first.memory, at(10));
    // 4 × 250/s completing plus 300/s of growth.
    assert_eq!(second.used.produce_rate, Some(1300.0));
    assert!(second.used.produce_rate_estimated);
}

#[test]
fn paused_class_backlog_is_not_chased() {
    let mut i = inputs(100_000.0, 250.0, 30.0, 2);
    i.paused_class_backlogs = vec![("broken".into(), value(100_000.0))];
    let d = decide(&config(), &i, &ScalingMemory::default(), at(0));
    assert_eq!(d.used.scaling_backlog, Some(0.0));
    assert!(d.desired <= 2, "{d:?}");
}

#[test]
fn measured_capacity_of_idle_consumers_does_not_scale_up() {
    let mut c = config();
    c.per_replica_rate = None;
    let mut i = inputs(10.0, 900.0, 1.0, 4);
    i.completion_rate = Some(value(900.0));
    let d = decide(&c, &i, &ScalingMemory::default(), at(0));
    assert!(d.used.per_replica_rate_measured());
    assert!(d.desired <= 4);
}

#[test]
fn replicas_above_the_cap_are_corrected_at_once() {
    let d = decide(
        &config(),
        &inputs(0.0, 10.0, 1.0, 30),
        &running_for_an_hour(),
        at(0),
    );
    assert_eq!(d.desired, 12);
}

#[test]
fn a_new_budget_scales_down_after_one_rate_window() {
    // Nothing was decided before: the 10 replicas it finds were someone else's choice, and
    // no earlier recommendation is there to wait out (the HPA's rule for a new autoscaler).
    // But the rates it reads may come from series younger than their window (read low), so
    // the scale-down waits one rate window (60 s), not the whole 300 s window.
    let c = config();
    let first = decide(
        &c,
        &inputs(0.0, 240.0, 1.0, 10),
        &ScalingMemory::default(),
        at(0),
    );
    assert_eq!(first.desired, 10, "{}", first.explanation);
    let mut memory = first.memory;
    let mut scaled_down_at = None;
    for now in (15..=60).step_by(15) {
        let d = decide(&c, &inputs(0.0, 240.0, 1.0, 10), &memory, at(now));
        memory = d.memory;
        if d.desired < 10 {
            assert_eq!(d.desired, 1, "{}", d.explanation);
            scaled_down_at = Some(now);
            break;
        }
    }
    assert_eq!(scaled_down_at, Some(60));
    // After that, a lower recommendation waits for the whole window again.
    let steady = decide(&c, &inputs(0.0, 240.0, 1.0, 1), &memory, at(75));
    let up = decide(
        &c,
        &inputs(250_000.0, 900.0, 290.0, 1),
        &steady.memory,
        at(90),
    );
    assert!(up.desired > 1, "{}", up.explanation);
    let down = decide(
        &c,
        &inputs(0.0, 240.0, 1.0, up.desired),
        &up.memory,
        at(105),
    );
    assert_eq!(down.desired, up.desired, "{}", down.explanation);
}

fn bad_observation() -> impl Strategy<Value = Observation> {
    prop_oneof![
        Just(Observation::Samples(vec![])),
        Just(Observation::Samples(vec![f64::NAN])),
        Just(Observation::Samples(vec![f64::INFINITY])),
        Just(Observation::Samples(vec![f64::NEG_INFINITY])),
        (-1e9..-1e-9f64).prop_map(|v| Observation::Samples(vec![v])),
        prop::collection::vec(0.0..1e6f64, 2..5).prop_map(Observation::Samples),
        "[a-z ]{1,20}".prop_map(Observation::Failed),
    ]
}

fn any_config() -> impl Strategy<Value = BudgetConfig> {
    (
        1u32..10,
        0u32..40,
        1u32..64,
        60.0..3600.0f64,
        10.0..1200.0f64,
        0.0..600.0f64,
        0u32..6,
        1.0..500.0f64,
        0.0..0.5f64,
        0.0..60.0f64,
    )
        .prop_map(
            |(min, extra, partitions, deadline, drain, down, step, rate, share, rebalance)| {
                BudgetConfig {
                    min_replicas: min,
                    max_replicas: min + extra,
                    deadline_seconds: deadline,
                    target_drain_seconds: drain,
                    scale_down_stabilization_seconds: down,
                    max_step: step,
                    per_replica_rate: Some(rate),
                    reserved_retry_share: share,
                    rebalance_cost_seconds: rebalance,
                    partitions: PartitionSource::Fixed(partitions),
                    ..config()
                }
            },
        )
}

fn cap_of(c: &BudgetConfig) -> u32 {
    match c.partitions {
        PartitionSource::Fixed(p) => c.max_replicas.min(p),
        PartitionSource::Query => c.max_replicas,
    }
}

proptest! {
    #[test]
    fn recommendation_stays_within_bounds(
        c in any_config(),
        backlog in 0.0..1e7f64,
        lambda in 0.0..1e5f64,
        age in 0.0..1e4f64,
        current in 1u32..64,
    ) {
        let d = decide(&c, &inputs(backlog, lambda, age, current), &ScalingMemory::default(), at(0));
        let cap = cap_of(&c);
        let rec = d.recommendation.unwrap();
        prop_assert!(rec <= cap);
        prop_assert!(rec >= c.min_replicas.min(cap));
        // Whatever the current replicas, the decision never asks for more than the cap.
        prop_assert!(d.desired <= cap.max(current.min(cap)));
        if current <= cap && current >= c.min_replicas.min(cap) {
            prop_assert!(d.desired >= c.min_replicas.min(cap));
        }
    }

    #[test]
    fn unusable_inputs_never_change_anything(
        c in any_config(),
        bad in bad_observation(),
        which in 0usize..3,
        current in 1u32..64,
        backlog in 0.0..1e7f64,
    ) {
        let mut i = inputs(backlog, 100.0, 10.0, current);
        match which {
            0 => i.backlog = bad,
            1 => i.oldest_age = Some(bad),
            _ => i.produce_rate = Some(bad),
        }
        let d = decide(&c, &i, &ScalingMemory::default(), at(0));
        prop_assert_eq!(d.phase, BudgetPhase::MetricsUnavailable);
        prop_assert_eq!(d.change, None);
        prop_assert_eq!(d.desired, current);
    }

    #[test]
    fn no_scale_down_inside_the_window(
        c in any_config(),
        current in 2u32..64,
        elapsed in 0.0..1.0f64,
    ) {
        let cap = cap_of(&c);
        prop_assume!(current <= cap && c.scale_down_stabilization_seconds >= 1.0);
        let idle = inputs(0.0, 0.0, 0.0, current);
        let first = decide(&c, &idle, &running_for_an_hour(), at(0));
        let later = (elapsed * (c.scale_down_stabilization_seconds - 1.0)) as i64;
        let second = decide(&c, &idle, &first.memory, at(later));
        // Replicas that own no partition of their own (9 partitions: 6 consumers complete no
        // more than 5) go at once; none that add capacity do.
        let partitions = match c.partitions {
            PartitionSource::Fixed(p) => p,
            PartitionSource::Query => u32::MAX,
        };
        let rate = c.per_replica_rate.unwrap_or(1.0);
        let capacity = |k: u32| crate::drain::group_capacity(k, partitions, rate);
        let same = (1..=current).find(|&k| capacity(k) >= capacity(current)).unwrap_or(current);
        prop_assert!(first.desired >= same.max(c.min_replicas.min(cap)));
        prop_assert!(second.desired >= same.max(c.min_replicas.min(cap)));
        prop_assert!(capacity(second.desired) >= capacity(current));
    }

    #[test]
    fn desired_is_monotone_in_backlog_and_age(
        c in any_config(),
        backlog in 0.0..1e6f64,
        more in 0.0..1e6f64,
        age in 0.0..3600.0f64,
        older in 0.0..3600.0f64,
        lambda in 0.0..1e4f64,
        current in 1u32..64,
    ) {
        let m = ScalingMemory::default();
        let base = decide(&c, &inputs(backlog, lambda, age, current), &m, at(0));
        let bigger = decide(&c, &inputs(backlog + more, lambda, age, current), &m, at(0));
        let aged = decide(&c, &inputs(backlog, lambda, age + older, current), &m, at(0));
        // More waiting work never moves to a lower count than less work does. Holding the
        // current count is the one exception: with more waiting, the keep-up count is due
        // sooner, so an early intermediate step stops paying for its rebalance and the
        // budget holds until the keep-up count is due instead (the hold itself must keep the
        // deadline, which other properties check).
        let held = |d: &ScalingDecision| d.recommendation == Some(current.clamp(c.min_replicas, cap_of(&c)));
        prop_assert!(bigger.recommendation >= base.recommendation || held(&bigger));
        prop_assert!(aged.recommendation >= base.recommendation || held(&aged));
    }

    #[test]
    fn undrainable_exactly_when_the_capped_capacity_cannot_exceed_lambda(
        c in any_config(),
        share in 0.0..2.0f64,
        current in 1u32..64,
    ) {
        let partitions = match c.partitions {
            PartitionSource::Fixed(p) => p,
            PartitionSource::Query => unreachable!(),
        };
        let rate = c.per_replica_rate.unwrap();
        // The capped capacity: the cap's consumers, limited by the busiest one's partitions.
        let capped = crate::drain::group_capacity(cap_of(&c), partitions, rate);
        let lambda = capped * share;
        let d = decide(&c, &inputs(0.0, lambda, 0.0, current), &ScalingMemory::default(), at(0));
        prop_assert_eq!(d.phase == BudgetPhase::Undrainable, lambda > 0.0 && capped <= lambda);
    }
}

#[test]
fn a_held_class_backlog_does_not_make_idle_consumers_look_saturated() {
    // 400/s of healthy work on 4 replicas that can do 250/s each; a paused class has left
    // 99 600 events waiting. The replicas complete 100/s each because that is all there is
    // to do, not because that is all they can do.
    let mut held = inputs(100_000.0, 400.0, 5.0, 4);
    held.completion_rate = Some(value(400.0));
    held.paused_class_backlogs = vec![("refund".into(), value(99_600.0))];
    let d = decide(&config(), &held, &ScalingMemory::default(), at(0));
    assert!(!d.used.per_replica_rate_measured(), "{d:?}");
    assert_eq!(d.used.per_replica_rate, Some(250.0));
    assert!(d.desired <= 4, "{}", d.explanation);
}

/// Load that alternates every 3 minutes between 500/s and 2000/s with the deadline far away:
/// without a cap the budget follows it until it has seen it alternate (more than the cap's
/// changes within minutes); with `maxChangesPerHour` it changes at most that often in any
/// hour, and says why it holds.
#[test]
fn the_change_cap_holds_optional_changes_and_says_why() {
    let run = |cap: Option<u32>| {
        let c = BudgetConfig {
            max_changes_per_hour: cap,
            scale_down_stabilization_seconds: 0.0,
            ..config()
        };
        let (mut memory, mut replicas, mut changes) = (ScalingMemory::default(), 2u32, Vec::new());
        let mut held = false;
        for poll in 0..240i64 {
            let lambda = if (poll / 12) % 2 == 0 { 500.0 } else { 2000.0 };
            let d = decide(
                &c,
                &inputs(100.0, lambda, 5.0, replicas),
                &memory,
                at(poll * 15),
            );
            if let Some(change) = &d.change {
                changes.push(poll * 15);
                replicas = change.to;
            }
            held |= d.explanation.contains("scaling.maxChangesPerHour");
            memory = d.memory;
        }
        (changes, held)
    };
    let (free, held) = run(None);
    assert!(free.len() > 3 && !held, "{free:?}");
    let (capped, held) = run(Some(3));
    assert!(held, "the hold is explained");
    for start in &capped {
        let in_hour = capped
            .iter()
            .filter(|t| (*start..*start + 3600).contains(t))
            .count();
        assert!(
            in_hour <= 3,
            "{in_hour} changes within an hour of {start}s: {capped:?}"
        );
    }
}

#[test]
fn the_change_cap_never_holds_a_scale_up_the_deadline_needs() {
    let c = BudgetConfig {
        max_changes_per_hour: Some(1),
        ..config()
    };
    let memory = ScalingMemory {
        recent_changes: vec![at(0)],
        ..ScalingMemory::default()
    };
    // An event is 6 minutes old of a 10-minute deadline (past the 0.5 warning fraction).
    let d = decide(&c, &inputs(300_000.0, 1500.0, 360.0, 2), &memory, at(600));
    assert!(d.desired > 2, "{}", d.explanation);
    assert_eq!(d.memory.recent_changes, vec![at(0), at(600)]);
    // A scale-up that holding can no longer wait for, while the oldest event is still below
    // the warning fraction, waits for the hour to pass.
    let d = decide(&c, &inputs(240_000.0, 1500.0, 260.0, 2), &memory, at(600));
    assert_eq!(d.desired, 2, "{}", d.explanation);
    assert!(
        d.explanation.contains("the next is allowed at"),
        "{}",
        d.explanation
    );
}

fn partition_samples(backlogs: &[f64]) -> Vec<PartitionSample> {
    PartitionSample::numbered(backlogs)
}

#[test]
fn a_hot_partition_is_named_and_does_not_drive_the_count() {
    let mut backlogs = vec![50.0; 12];
    backlogs[7] = 200_000.0;
    let total: f64 = backlogs.iter().sum();
    let mut i = inputs(total, 1000.0, 400.0, 4);
    i.partition_backlogs = Some(partition_samples(&backlogs));
    let d = decide(&config(), &i, &ScalingMemory::default(), at(0));
    let skew = d
        .conditions
        .iter()
        .find(|c| c.type_ == PARTITION_SKEW)
        .expect("a PartitionSkew condition");
    assert_eq!(skew.status, Truth::True);
    assert!(
        skew.message
            .starts_with("partition 7 holds 100 % of the backlog"),
        "{}",
        skew.message
    );
    assert!(
        d.desired <= 4,
        "{} replicas for one hot partition",
        d.desired
    );
    // Without the per-partition query the same numbers ask for more.
    let plain = decide(
        &config(),
        &inputs(total, 1000.0, 400.0, 4),
        &ScalingMemory::default(),
        at(0),
    );
    assert!(
        plain.desired > d.desired,
        "{} vs {}",
        plain.desired,
        d.desired
    );
}

#[test]
fn a_held_class_waiting_on_one_partition_is_not_a_hot_key() {
    // A held class left 200 000 events on partition 7 (holding moves none); the 40 000 the
    // consumers work on are spread evenly: more consumers help, and no skew is claimed.
    let mut backlogs = vec![40_000.0 / 12.0; 12];
    backlogs[7] += 200_000.0;
    let mut held = inputs(240_000.0, 1000.0, 400.0, 4);
    held.paused_class_backlogs = vec![("refund".into(), value(200_000.0))];
    held.partition_backlogs = Some(partition_samples(&backlogs));
    let d = decide(&config(), &held, &ScalingMemory::default(), at(0));
    assert!(
        d.conditions
            .iter()
            .all(|c| c.type_ != PARTITION_SKEW || c.status != Truth::True),
        "{}",
        d.explanation
    );
    let mut spread = inputs(40_000.0, 1000.0, 400.0, 4);
    spread.partition_backlogs = Some(partition_samples(&[40_000.0 / 12.0; 12]));
    let plain = decide(&config(), &spread, &ScalingMemory::default(), at(0));
    assert_eq!(d.desired, plain.desired, "{}", d.explanation);
}

#[test]
fn a_hot_partition_a_consumer_can_carry_gets_a_consumer_with_room() {
    // 8 partitions; partition 0 receives 230/s of 410/s, the others 26/s each. Its consumer
    // keeps up only when it owns little else: 2 replicas leave it 4 partitions (307/s).
    let c = BudgetConfig {
        partitions: PartitionSource::Fixed(8),
        ..config()
    };
    // Two minutes in: partition 0 holds what arrived since (230/s), its co-owned partitions
    // a little each.
    let mut backlogs = vec![0.0; 8];
    backlogs[0] = 230.0 * 120.0;
    for p in [2, 4, 6] {
        backlogs[p] = 26.0 * 120.0;
    }
    let total: f64 = backlogs.iter().sum();
    let mut i = inputs(total, 410.0, 120.0, 2);
    i.partition_backlogs = Some(partition_samples(&backlogs));
    let d = decide(&c, &i, &ScalingMemory::default(), at(0));
    assert!((3..=4).contains(&d.desired), "{}", d.explanation);
    let skew = d
        .conditions
        .iter()
        .find(|c| c.type_ == PARTITION_SKEW)
        .expect("a PartitionSkew condition");
    assert_eq!(skew.reason, "HotPartitionSharesAConsumer");
    assert!(
        skew.message.contains("receives about 230/s"),
        "{}",
        skew.message
    );
}

#[test]
fn capacity_is_measured_only_while_saturated_and_shown_with_its_source() {
    let mut c = config();
    c.per_replica_rate = None;
    c.completion_rate_configured = true;
    // 5 idle replicas completing what arrives: a lower bound, never a reason for more.
    let mut idle = inputs(100.0, 500.0, 1.0, 5);
    idle.completion_rate = Some(value(500.0));
    let d = decide(&c, &idle, &ScalingMemory::default(), at(0));
    assert_eq!(d.used.capacity_source, Some(CapacitySource::Prior));
    assert!(d.memory.capacity.is_some_and(|m| m.lower_bound));
    // Busy: a backlog of many polls, completing 1250/s with 5 ready. The rate window still
    // holds the idle time before the backlog: not yet a measurement.
    let mut busy = inputs(200_000.0, 1000.0, 120.0, 5);
    busy.completion_rate = Some(value(1250.0));
    let d = decide(&c, &busy, &d.memory, at(600));
    assert_eq!(d.used.capacity_source, Some(CapacitySource::Prior));
    assert_eq!(d.memory.busy_since, Some(at(600)));
    // Busy for longer than a rate window, with no change of replicas in it: measured.
    let settled = ScalingMemory {
        last_change_at: None,
        ..d.memory
    };
    let d = decide(&c, &busy, &settled, at(660));
    assert_eq!(d.used.capacity_source, Some(CapacitySource::Measured));
    assert_eq!(d.memory.capacity.map(|m| m.per_replica_rate), Some(250.0));
}

proptest! {
    /// A hot partition that receives more than one consumer completes: whatever it holds,
    /// the count is never above what the same decision gives for the other partitions'
    /// backlog alone (more consumers cannot help it).
    #[test]
    fn a_skewed_partition_never_drives_the_count_above_what_the_others_need(
        hot in 10_000.0..5e6f64,
        others in proptest::collection::vec(0.0..500.0f64, 11),
        lambda in 100.0..2500.0f64,
        age in 0.0..500.0f64,
        current in 1u32..=12,
    ) {
        // Its arrivals: what it holds over the oldest age (250/s is what a replica completes).
        prop_assume!(age > 0.0 && (hot / age).min(lambda) >= 250.0);
        let mut backlogs = others.clone();
        backlogs.insert(3, hot);
        let total: f64 = backlogs.iter().sum();
        let mut skewed = inputs(total, lambda, age, current);
        skewed.partition_backlogs = Some(partition_samples(&backlogs));
        let with_hot = decide(&config(), &skewed, &ScalingMemory::default(), at(0));
        let rest: f64 = others.iter().sum();
        let mut spread = others.clone();
        spread.insert(3, 0.0);
        let mut alone = inputs(rest, lambda, 0.0, current);
        alone.partition_backlogs = Some(partition_samples(&spread));
        let without = decide(&config(), &alone, &ScalingMemory::default(), at(0));
        prop_assert!(
            with_hot.desired <= without.desired.max(current.clamp(1, 12)),
            "{} with the hot partition, {} without", with_hot.desired, without.desired
        );
    }
}

#[test]
fn a_scrape_slower_than_the_poll_does_not_prove_twice_the_drop() {
    // 5 replicas measured at 200/s each. Prometheus scrapes every 30 s, the budget polls
    // every 15 s: the backlog drops 15k per scrape while 500/s arrive, so they complete
    // 1000/s. The poll that sees the new sample must not read the drop as 15 s worth.
    let mut c = config();
    c.per_replica_rate = None;
    c.completion_rate_configured = true;
    let mut memory = ScalingMemory {
        capacity: Some(MeasuredCapacity {
            per_replica_rate: 200.0,
            at: at(900),
            lower_bound: false,
            confirmations: 0,
            most_seen: 200.0,
        }),
        ..ScalingMemory::default()
    };
    for (second, backlog) in [(1000, 28_000.0), (1015, 28_000.0), (1030, 13_000.0)] {
        let mut polled = inputs(backlog, 500.0, 20.0, 5);
        polled.completion_rate = Some(value(1000.0));
        let d = decide(&c, &polled, &memory, at(second));
        assert_eq!(d.used.per_replica_rate, Some(200.0), "at {second}: {d:?}");
        memory = d.memory;
    }
}

#[test]
fn a_scale_down_waits_for_a_measurement_after_a_change() {
    // 12 replicas drain 100k at 3000/s while 500/s arrive: fewer would do. Right after a
    // change the completions do not show yet what the 12 give, so no scale-down is asked.
    let mut c = config();
    c.completion_rate_configured = true;
    let mut busy = inputs(100_000.0, 500.0, 60.0, 12);
    busy.completion_rate = Some(value(3000.0));
    let changed = ScalingMemory {
        last_change_at: Some(at(970)),
        ..ScalingMemory::default()
    };
    let d = decide(&c, &busy, &changed, at(1000));
    assert_eq!(d.recommendation, Some(12), "{}", d.explanation);
    assert!(
        d.explanation.contains("waits for that measurement"),
        "{}",
        d.explanation
    );
    // Long after the change the same poll may plan fewer.
    let settled = ScalingMemory {
        last_change_at: Some(at(0)),
        ..ScalingMemory::default()
    };
    let d = decide(&c, &busy, &settled, at(1000));
    assert!(d.recommendation < Some(12), "{}", d.explanation);
}

#[test]
fn a_drain_does_not_pass_for_a_busiest_consumer_keeping_up() {
    // 21 partitions over 4 replicas: the busiest owns 6 (3.5 replicas' worth of λ). A
    // rebalance 135 s ago left a backlog that the other consumers drain, so the group
    // completes 385/s of 380/s, while the oldest event, on the busiest consumer's
    // partitions, grew to 20 s: it falls behind, and 385/3.5 = 110/s would overstate it.
    let mut c = config();
    c.per_replica_rate = None;
    c.completion_rate_configured = true;
    c.partitions = PartitionSource::Fixed(21);
    let memory = ScalingMemory {
        last_change_at: Some(at(0)),
        ..ScalingMemory::default()
    };
    let mut draining = inputs(2157.0, 380.0, 20.0, 4);
    draining.completion_rate = Some(value(385.0));
    let d = decide(&c, &draining, &memory, at(135));
    let bound = d.memory.capacity.map(|m| m.per_replica_rate);
    assert_eq!(bound, Some(385.0 / 4.0), "{}", d.explanation);
    // Five minutes after the change with the oldest event 1 s old, it keeps up: the busiest
    // consumer completes its six partitions' share.
    let mut keeping_up = inputs(200.0, 380.0, 1.0, 4);
    keeping_up.completion_rate = Some(value(380.0));
    let d = decide(&c, &keeping_up, &memory, at(300));
    let bound = d.memory.capacity.map(|m| m.per_replica_rate);
    assert!(
        bound.is_some_and(|rate| (rate - 380.0 / 3.5).abs() < 1e-9),
        "{bound:?}"
    );
}

#[test]
fn a_scale_down_is_measured_without_waiting_for_a_pod_start() {
    // Pods took 90 s to start at the last scale-up; a scale-down starts none. 130 s after
    // one, with work waiting all along, the completions are a measurement (settling is two
    // rate windows and a rebalance); after a scale-up they are not yet.
    let mut c = config();
    c.per_replica_rate = None;
    c.completion_rate_configured = true;
    let mut busy = inputs(200_000.0, 1000.0, 120.0, 5);
    busy.completion_rate = Some(value(750.0));
    let down = ScalingMemory {
        last_change_at: Some(at(0)),
        last_change_raised: false,
        pod_start_seconds: Some(90.0),
        busy_since: Some(at(0)),
        ..ScalingMemory::default()
    };
    let d = decide(&c, &busy, &down, at(130));
    assert_eq!(d.used.capacity_source, Some(CapacitySource::Measured));
    let up = ScalingMemory {
        last_change_raised: true,
        ..down
    };
    let d = decide(&c, &busy, &up, at(130));
    assert_ne!(d.used.capacity_source, Some(CapacitySource::Measured));
}

/// 48 partitions at 400/s each, a two-minute deadline, pods that take 30 s to start and a
/// 30 s rebalance: a reaction takes half the deadline, so a step up must be met in one change.
fn tight_deadline_at_the_partition_cap() -> BudgetConfig {
    BudgetConfig {
        min_replicas: 2,
        max_replicas: 96,
        deadline_seconds: 120.0,
        target_drain_seconds: 60.0,
        scale_down_stabilization_seconds: 180.0,
        rebalance_cost_seconds: 30.0,
        per_replica_rate: Some(400.0),
        partitions: PartitionSource::Fixed(48),
        ..config()
    }
}

/// The example budget with a configured rate and a completion-rate query, on `partitions`
/// fixed partitions and at most `max_replicas`.
fn with_prior(rate: f64, partitions: u32, max_replicas: u32) -> BudgetConfig {
    BudgetConfig {
        per_replica_rate: Some(rate),
        completion_rate_configured: true,
        partitions: PartitionSource::Fixed(partitions),
        max_replicas,
        ..config()
    }
}

/// The previous poll's observation: `backlog` and λ first seen at `seconds`.
fn seen_at(seconds: i64, backlog: f64, lambda: f64) -> PreviousObservation {
    PreviousObservation {
        at: at(seconds),
        backlog,
        produce_rate: Some(lambda),
        value_since: at(seconds),
        previous_stood: None,
    }
}

fn with_completions(mut i: ScalingInputs, completed: f64) -> ScalingInputs {
    i.completion_rate = Some(value(completed));
    i
}

#[test]
fn a_step_the_rate_window_lags_is_read_from_the_backlog_rise() {
    let c = tight_deadline_at_the_partition_cap();
    let steady = with_completions(inputs(10_800.0, 6249.0, 2.0, 16), 6400.0);
    let first = decide(&c, &steady, &running_for_an_hour(), at(0));
    assert_eq!(first.desired, 16, "{}", first.explanation);
    // 15 s later the one-minute window shows a quarter of the step, the backlog all of it:
    // 110k more waiting while 6.4k/s completed is 13.7k/s arriving.
    let stepped = with_completions(inputs(121_290.0, 8128.0, 5.0, 16), 6400.0);
    let second = decide(&c, &stepped, &first.memory, at(15));
    // Read from the window (8.1k/s), 24 looked enough; a second step would follow at the
    // next poll, and its rebalance would stop the group again while the backlog piles up.
    assert_eq!(second.desired, 48, "{}", second.explanation);
    let lambda = second.used.produce_rate.unwrap_or_default();
    assert!((lambda - 13_766.0).abs() < 1.0, "{lambda}");
    assert!(second.used.produce_rate_from_backlog);
    assert!(
        second.explanation.contains("from the backlog's rise"),
        "{}",
        second.explanation
    );
    // The trend kept for the next poll is the window's, so a rising window is still told.
    assert_eq!(
        second.memory.previous.and_then(|p| p.produce_rate),
        Some(8128.0)
    );
}

#[test]
fn a_backlog_rising_under_a_still_window_is_slower_consumers_not_arrivals() {
    let c = tight_deadline_at_the_partition_cap();
    let steady = with_completions(inputs(10_800.0, 6249.0, 2.0, 16), 6400.0);
    let first = decide(&c, &steady, &running_for_an_hour(), at(0));
    // The consumers slowed: the backlog rises while λ holds; the completion window still
    // shows the old speed, so rise + completions would overstate λ by the slowdown.
    let slowed = with_completions(inputs(60_000.0, 6249.0, 8.0, 16), 6400.0);
    let second = decide(&c, &slowed, &first.memory, at(15));
    assert_eq!(second.used.produce_rate, Some(6249.0));
    assert!(!second.used.produce_rate_from_backlog);
}

#[test]
fn a_rise_alone_sizes_the_group_but_does_not_claim_the_backlog_can_never_catch_up() {
    // The cap's 48 consumers complete 19.2k/s. The backlog's rise reads 25k/s arriving
    // (279k more in 15 s while 6.4k/s completed), the rate window 8.1k/s: the count follows
    // the rise, the claim waits for Prometheus' rate to say so too.
    let c = tight_deadline_at_the_partition_cap();
    let steady = with_completions(inputs(10_800.0, 6249.0, 2.0, 16), 6400.0);
    let first = decide(&c, &steady, &running_for_an_hour(), at(0));
    let flooded = with_completions(inputs(289_800.0, 8128.0, 5.0, 16), 6400.0);
    let second = decide(&c, &flooded, &first.memory, at(15));
    assert!(
        second.used.produce_rate_from_backlog,
        "{}",
        second.explanation
    );
    assert_eq!(second.desired, 48, "{}", second.explanation);
    assert_ne!(
        second.phase,
        BudgetPhase::Undrainable,
        "{}",
        second.explanation
    );
    assert!(
        !second.explanation.contains("can never catch up"),
        "{}",
        second.explanation
    );
    // Once the window measures it too, the claim is made.
    let measured = with_completions(inputs(289_800.0, 25_000.0, 5.0, 16), 6400.0);
    let third = decide(&c, &measured, &first.memory, at(15));
    assert_eq!(
        third.phase,
        BudgetPhase::Undrainable,
        "{}",
        third.explanation
    );
    assert!(
        third.explanation.contains("can never catch up"),
        "{}",
        third.explanation
    );
}

#[test]
fn arrivals_seen_rising_counts_no_more_completions_than_the_ready_replicas_make() {
    let previous = PreviousObservation {
        at: at(0),
        backlog: 0.0,
        produce_rate: Some(1000.0),
        value_since: at(0),
        previous_stood: None,
    };
    // Right after a scale-down the completion window still shows 3000/s, but the 2 ready
    // replicas complete at most 800/s: 10 s of 1500/s growth is 2300/s arriving, not 4500.
    let seen = arrivals_seen_rising(
        Some(previous),
        15_000.0,
        1500.0,
        Some(3000.0),
        Some(800.0),
        10.0,
        at(10),
    );
    assert_eq!(seen, Some(2300.0));
    // A rise within the tolerance of the queried λ is the gauge's wobble.
    let wobble = arrivals_seen_rising(
        Some(previous),
        2_000.0,
        1500.0,
        Some(1500.0),
        None,
        10.0,
        at(10),
    );
    assert_eq!(wobble, None);
    // A falling backlog says nothing about a step up.
    let falling = PreviousObservation {
        backlog: 50_000.0,
        ..previous
    };
    assert_eq!(
        arrivals_seen_rising(
            Some(falling),
            40_000.0,
            1500.0,
            Some(3000.0),
            None,
            10.0,
            at(10)
        ),
        None
    );
}

#[test]
fn completions_are_trusted_after_the_queries_own_rate_window() {
    // 60 s after a scale-down, busy all along: with `rate(…[5s])` queries the window holds
    // only the new count, so the completions measure it; read through `rate(…[1m])` they
    // still mix in the count before the change.
    let mut c = config();
    c.per_replica_rate = None;
    c.completion_rate_configured = true;
    c.poll_interval_seconds = 1.0;
    let mut busy = inputs(200_000.0, 1000.0, 120.0, 5);
    busy.completion_rate = Some(value(750.0));
    let down = ScalingMemory {
        last_change_at: Some(at(0)),
        last_change_raised: false,
        busy_since: Some(at(0)),
        ..ScalingMemory::default()
    };
    let short_window = BudgetConfig {
        rate_window_seconds: 5.0,
        ..c.clone()
    };
    let d = decide(&short_window, &busy, &down, at(60));
    assert_eq!(d.used.capacity_source, Some(CapacitySource::Measured));
    let d = decide(&c, &busy, &down, at(60));
    assert_ne!(d.used.capacity_source, Some(CapacitySource::Measured));
}

#[test]
fn an_older_queue_gets_no_fewer_replicas_than_a_younger_one() {
    // Nothing arrives and 777k wait; the warning limit is 862 s. At 436 s the budget needs 5
    // to stay under it. At 972 s, past it, a scale-up may let the age grow for a reaction
    // (no count undoes the age events have): 4 would stop the growth there, but an older
    // queue must not get fewer replicas than a younger one.
    let c = BudgetConfig {
        max_replicas: 5,
        deadline_seconds: 1724.0,
        target_drain_seconds: 974.0,
        scale_down_stabilization_seconds: 0.0,
        per_replica_rate: Some(489.6),
        reserved_retry_share: 0.48,
        partitions: PartitionSource::Fixed(13),
        ..config()
    };
    let memory = ScalingMemory::default();
    let younger = decide(&c, &inputs(777_451.0, 0.0, 436.0, 1), &memory, at(0));
    let older = decide(&c, &inputs(777_451.0, 0.0, 972.0, 1), &memory, at(0));
    assert_eq!(younger.recommendation, Some(5), "{}", younger.explanation);
    assert_eq!(older.recommendation, Some(5), "{}", older.explanation);
}

#[test]
fn a_prior_far_above_the_truth_is_refuted_by_the_backlog_rise_once_the_pods_work() {
    // The owner says 361/s; the 8 replicas started 90 s after a scale-up do 200/s. 1648/s
    // arrive and the backlog rises by 48/s: 1600/s completed, 200/s each. The completion
    // rate's window still holds the start, so only the backlog shows it.
    let c = BudgetConfig {
        per_replica_rate: Some(361.0),
        completion_rate_configured: true,
        partitions: PartitionSource::Fixed(32),
        max_replicas: 32,
        rebalance_cost_seconds: 10.0,
        ..config()
    };
    let changed = |seen_at: i64| ScalingMemory {
        last_change_at: Some(at(0)),
        last_change_raised: true,
        pod_start_seconds: Some(90.0),
        previous: Some(PreviousObservation {
            at: at(seen_at),
            backlog: 100_000.0,
            produce_rate: Some(1648.0),
            value_since: at(seen_at),
            previous_stood: None,
        }),
        ..ScalingMemory::default()
    };
    let mut busy = inputs(100_720.0, 1648.0, 60.0, 8);
    busy.completion_rate = Some(value(1100.0));
    // The previous sample was seen a poll after the pods started and the group rebalanced.
    let d = decide(&c, &busy, &changed(115), at(130));
    assert_eq!(d.used.capacity_source, Some(CapacitySource::Measured));
    assert_eq!(d.used.per_replica_rate, Some(200.0), "{}", d.explanation);
    // Seen during the rebalance, the rise holds the pause: no reading.
    let d = decide(&c, &busy, &changed(95), at(110));
    assert_eq!(d.used.capacity_source, Some(CapacitySource::Configured));
    // λ that moved between the polls may be a step the window lags: no reading.
    let mut moving = busy.clone();
    moving.produce_rate = Some(value(1900.0));
    let d = decide(&c, &moving, &changed(115), at(130));
    assert_eq!(d.used.capacity_source, Some(CapacitySource::Configured));
}

#[test]
fn a_noisy_lambda_refutes_only_a_prior_far_outside_what_the_window_may_hide() {
    // The owner says 1000/s; the 8 replicas do 100/s. λ's window moved from 1648/s to
    // 1900/s in a poll, so the arrivals may be up to 60 s / 15 s × 252/s higher than read.
    // The backlog rose by 16.5k: 800/s completed as read, at most 1808/s. Even that is 226/s
    // each, far below the prior: refuted, at the middle of what the reading allows.
    let c = BudgetConfig {
        per_replica_rate: Some(1000.0),
        completion_rate_configured: true,
        partitions: PartitionSource::Fixed(32),
        max_replicas: 32,
        rebalance_cost_seconds: 10.0,
        ..config()
    };
    let memory = ScalingMemory {
        last_change_at: Some(at(0)),
        last_change_raised: true,
        pod_start_seconds: Some(90.0),
        previous: Some(seen_at(115, 100_000.0, 1648.0)),
        ..ScalingMemory::default()
    };
    let noisy = with_completions(inputs(116_500.0, 1900.0, 60.0, 8), 900.0);
    let d = decide(&c, &noisy, &memory, at(130));
    assert_eq!(
        d.used.capacity_source,
        Some(CapacitySource::Measured),
        "{}",
        d.explanation
    );
    let rate = d.used.per_replica_rate.unwrap_or_default();
    assert!((rate - (800.0 + 1808.0) / 2.0 / 8.0).abs() < 1e-6, "{rate}");
    // A prior the bound does not rule out (at most 226/s each, 250/s said) stands.
    let near = BudgetConfig {
        per_replica_rate: Some(250.0),
        ..c
    };
    let d = decide(&near, &noisy, &memory, at(130));
    assert_eq!(d.used.capacity_source, Some(CapacitySource::Configured));
}

#[test]
fn a_step_entering_the_window_as_another_leaves_refutes_nothing() {
    // 3 replicas on 16 partitions do the 134/s they are said to. A periodic load steps from
    // 96/s to 489/s 12 s before the poll, while its last peak leaves the window: the window
    // moved only from 129/s to 175/s, so even at 4 × that move the backlog's 750 rise reads
    // at most 308/s, 103/s each. The completion rate, which no arrival moves, shows 342/s.
    let c = with_prior(134.0, 16, 8);
    let memory = ScalingMemory {
        previous: Some(PreviousObservation {
            at: at(1410),
            backlog: 10_397.0,
            produce_rate: Some(128.75),
            value_since: at(1410),
            previous_stood: Some(15.0),
        }),
        ..ScalingMemory::default()
    };
    let stepped = with_completions(inputs(11_147.0, 175.0, 90.0, 3), 342.0);
    let d = decide(&c, &stepped, &memory, at(1425));
    assert_eq!(
        d.used.capacity_source,
        Some(CapacitySource::Configured),
        "{}",
        d.explanation
    );
    // Consumers that really complete that little show it in both: refuted.
    let slow = with_completions(inputs(11_147.0, 175.0, 90.0, 3), 250.0);
    let d = decide(&c, &slow, &memory, at(1425));
    assert_eq!(d.used.capacity_source, Some(CapacitySource::Measured));
}

#[test]
fn partitions_holding_only_a_held_class_do_not_make_their_owners_saturated() {
    // 4 replicas on 4 partitions, said to do 100/s each. A held class leaves 4000 events,
    // 1000 on each partition (holding moves none); the 5000 the consumers work on all wait
    // on partition 0. Its owner is the only saturated one: the 150/s the group completes is
    // not 37.5/s per replica.
    let c = with_prior(100.0, 4, 4);
    let mut held = with_completions(inputs(9_000.0, 150.0, 40.0, 4), 150.0);
    held.paused_class_backlogs = vec![("refund".into(), value(4_000.0))];
    held.partition_backlogs = Some(partition_samples(&[6_000.0, 1_000.0, 1_000.0, 1_000.0]));
    let busy_for_long = ScalingMemory {
        busy_since: Some(at(0)),
        ..ScalingMemory::default()
    };
    let d = decide(&c, &held, &busy_for_long, at(600));
    assert_eq!(
        d.used.capacity_source,
        Some(CapacitySource::Configured),
        "{}",
        d.explanation
    );
    // The same backlog with nothing held is work on every partition: a measurement.
    let mut working = held.clone();
    working.paused_class_backlogs = vec![];
    let d = decide(&c, &working, &busy_for_long, at(600));
    assert_eq!(
        d.used.capacity_source,
        Some(CapacitySource::Measured),
        "{}",
        d.explanation
    );
}

#[test]
fn a_queue_empty_for_long_that_fills_within_a_poll_refutes_nothing() {
    // 3 replicas at the 521/s they are said to do; the producer stalled, then a flood begins
    // within the last poll: the queue that held 0 for 26 minutes holds 19.7k, and λ's window
    // rose from 115/s to 433/s. Spread over the 26 minutes the level stood, the window's move
    // would look like nothing and the flood's first poll like 144/s per replica; it is a
    // poll's move, and may hide arrivals far above 433/s.
    let c = with_prior(521.0, 24, 48);
    let memory = ScalingMemory {
        previous: Some(PreviousObservation {
            at: at(1545),
            backlog: 0.0,
            produce_rate: Some(115.0),
            value_since: at(0),
            previous_stood: None,
        }),
        ..ScalingMemory::default()
    };
    let flood = with_completions(inputs(19_748.0, 433.0, 15.0, 3), 104.0);
    let d = decide(&c, &flood, &memory, at(1560));
    assert_eq!(
        d.used.capacity_source,
        Some(CapacitySource::Configured),
        "{}",
        d.explanation
    );
}

#[test]
fn a_backlog_standing_on_the_busiest_consumers_refutes_a_prior_while_one_idles() {
    // 23 partitions on 12 replicas: 11 own two and one owns one. The owner says 402/s; they
    // do 200/s. 2266/s arrive, the 22 partitions of the busiest hold a backlog that stands
    // (it fell by 150 in 15 s) and the lone one idles, so no poll finds every partition busy.
    let c = BudgetConfig {
        per_replica_rate: Some(402.0),
        completion_rate_configured: true,
        partitions: PartitionSource::Fixed(23),
        max_replicas: 23,
        rebalance_cost_seconds: 20.0,
        ..config()
    };
    let memory = ScalingMemory {
        last_change_at: Some(at(0)),
        last_change_raised: true,
        pod_start_seconds: Some(44.0),
        previous: Some(seen_at(600, 150_150.0, 2266.0)),
        ..ScalingMemory::default()
    };
    let mut backlogs = vec![150_000.0 / 22.0; 23];
    backlogs[22] = 0.0;
    let mut standing = with_completions(inputs(150_000.0, 2266.0, 70.0, 12), 2276.0);
    standing.partition_backlogs = Some(partition_samples(&backlogs));
    let d = decide(&c, &standing, &memory, at(615));
    assert_eq!(
        d.used.capacity_source,
        Some(CapacitySource::Measured),
        "{}",
        d.explanation
    );
    // What the 11 saturated consumers complete, at most: the group's 2276/s over them.
    let rate = d.used.per_replica_rate.unwrap_or_default();
    assert!((rate - 2276.0 / 11.0).abs() < 1e-6, "{rate}");
    // Work on the lone consumer's partition alone proves only that one of them completes
    // the group's rate: far above the prior, it stands.
    let mut hot = vec![0.0; 23];
    hot[22] = 150_000.0;
    standing.partition_backlogs = Some(partition_samples(&hot));
    let d = decide(&c, &standing, &memory, at(615));
    assert_eq!(d.used.capacity_source, Some(CapacitySource::Configured));
}

#[test]
fn right_after_a_change_the_rise_alone_is_read_where_a_reaction_takes_the_room() {
    // 15 s after a scale-up the group may still be starting and rebalancing: it completes
    // nothing as far as the decision can tell, so the backlog's rise alone (12.6k/s) is a
    // lower bound of the arrivals, well above the rising window's 8.1k/s.
    let just_changed = ScalingMemory {
        last_change_at: Some(at(0)),
        last_change_raised: true,
        pod_start_seconds: Some(30.0),
        previous: Some(seen_at(0, 10_800.0, 6249.0)),
        ..ScalingMemory::default()
    };
    let stepped = with_completions(inputs(200_000.0, 8128.0, 5.0, 16), 6400.0);
    // A 2-minute deadline: a reaction (two polls, the pod start, the rebalance: 90 s) is
    // more than a quarter of the 60 s age limit, so the step is read at once.
    let tight = tight_deadline_at_the_partition_cap();
    let d = decide(&tight, &stepped, &just_changed, at(15));
    assert!(d.used.produce_rate_from_backlog, "{}", d.explanation);
    let lambda = d.used.produce_rate.unwrap_or_default();
    assert!((lambda - 189_200.0 / 15.0).abs() < 1.0, "{lambda}");
    // A 20-minute deadline leaves the window time to tell a step from a short spike.
    let wide = BudgetConfig {
        deadline_seconds: 1200.0,
        target_drain_seconds: 600.0,
        ..tight
    };
    let d = decide(&wide, &stepped, &just_changed, at(15));
    assert!(!d.used.produce_rate_from_backlog, "{}", d.explanation);
}

#[test]
fn a_sample_seen_soon_after_the_last_spans_at_least_a_poll() {
    // A reconcile a watch event brings 2 s after the last poll sees the next scrape's
    // sample: the 30k rise is at least a 15 s poll's, 2k/s, not 15k/s.
    let previous = PreviousObservation {
        at: at(0),
        backlog: 10_000.0,
        produce_rate: Some(1000.0),
        value_since: at(0),
        previous_stood: None,
    };
    assert_eq!(sample_span(&previous, at(2), 15.0), 15.0);
    assert_eq!(sample_span(&previous, at(40), 15.0), 40.0);
    let seen = arrivals_seen_rising(
        Some(previous),
        40_000.0,
        1200.0,
        None,
        Some(0.0),
        15.0,
        at(2),
    );
    assert_eq!(seen, Some(2000.0));
}

/// The observation after `samples` (second, backlog) seen one after another, λ 1000/s.
fn observed(samples: &[(i64, f64)]) -> Option<PreviousObservation> {
    samples.iter().fold(None, |previous, &(second, backlog)| {
        Some(PreviousObservation::next(
            previous.as_ref(),
            backlog,
            Some(1000.0),
            at(second),
        ))
    })
}

#[test]
fn a_step_from_an_empty_queue_is_read_at_the_first_poll() {
    // A queue that drained at 30 s held 0 at every 15 s scrape for ten minutes. The 25k
    // seen at 630 s came within one scrape: spread over the ten minutes it read as 40/s
    // more than completes, and the first poll after the step missed it.
    let mut samples = vec![(0, 3000.0), (15, 1500.0)];
    samples.extend((2..=41).map(|i| (15 * i, 0.0)));
    let previous = observed(&samples);
    assert_eq!(previous.map(|p| p.value_since), Some(at(30)));
    assert_eq!(previous.and_then(|p| p.previous_stood), Some(15.0));
    let Some(previous) = previous else {
        return;
    };
    assert_eq!(sample_span(&previous, at(630), 15.0), 15.0);
    let seen = arrivals_seen_rising(
        Some(previous),
        25_000.0,
        1200.0,
        Some(650.0),
        Some(700.0),
        15.0,
        at(630),
    );
    let Some(seen) = seen else {
        panic!("the step was not read");
    };
    assert!((seen - (650.0 + 25_000.0 / 15.0)).abs() < 1e-6, "{seen}");
}

#[test]
fn a_scrape_slower_than_the_poll_still_spans_its_interval() {
    // A 60 s scrape seen by 15 s polls: each value stands four polls, and the change after
    // it spans the 60 s between the samples, not the last poll.
    let samples: Vec<(i64, f64)> = (0..12)
        .map(|i| (15 * i, 1000.0 * (1 + i / 4) as f64))
        .collect();
    let Some(previous) = observed(&samples) else {
        return;
    };
    assert_eq!(previous.previous_stood, Some(60.0));
    assert_eq!(sample_span(&previous, at(180), 15.0), 60.0);
    // Seen early, by a reconcile a watch event brings, it still spans at least a poll.
    assert_eq!(sample_span(&previous, at(122), 15.0), 15.0);
}

#[test]
fn a_count_said_to_fall_behind_is_said_to_complete_what_the_plan_counts() {
    // 8 idle replicas complete the 275/s arriving: 34.4/s each is all that is known. With a
    // tenth kept for retries the plan counts 247.5/s for them, less than λ; the explanation
    // must say that number, not the 275/s that reads as "275/s, less than λ (275/s)".
    let c = BudgetConfig {
        per_replica_rate: None,
        completion_rate_configured: true,
        reserved_retry_share: 0.1,
        partitions: PartitionSource::Fixed(16),
        deadline_seconds: 300.0,
        target_drain_seconds: 240.0,
        scale_down_stabilization_seconds: 60.0,
        ..config()
    };
    let idle = with_completions(inputs(0.0, 275.0, 0.0, 8), 275.0);
    let d = decide(&c, &idle, &ScalingMemory::default(), at(0));
    assert!(d.explanation.contains("less than λ"), "{}", d.explanation);
    assert!(
        !d.explanation.contains("8 complete 275/s"),
        "{}",
        d.explanation
    );
    assert!(
        d.explanation.contains("8 complete 248/s"),
        "{}",
        d.explanation
    );
}

#[test]
fn a_drain_after_a_scale_up_raises_a_bound_never_measured_saturated() {
    // Eight replicas, never seen saturated (bound 500/s), drain what three left: the backlog
    // falls by 2200/s while 2600/s arrive, so they complete 4800/s, 600 each. The completion
    // rate still averages the window before the pods started (3000/s): the drop tells first.
    let mut c = config();
    c.per_replica_rate = None;
    c.completion_rate_configured = true;
    c.rebalance_cost_seconds = 30.0;
    let previous = PreviousObservation {
        at: at(190),
        backlog: 100_000.0,
        produce_rate: Some(2600.0),
        value_since: at(190),
        previous_stood: None,
    };
    // λ has been about 2600/s since long before the previous poll.
    let steady = vec![DemandSample {
        at: at(0),
        rate: 2600.0,
    }];
    let after_scale_up = ScalingMemory {
        previous: Some(previous),
        demand: steady,
        capacity: Some(MeasuredCapacity {
            per_replica_rate: 500.0,
            at: at(0),
            lower_bound: true,
            confirmations: 0,
            most_seen: 500.0,
        }),
        last_change_at: Some(at(100)),
        last_change_raised: true,
        pod_start_seconds: Some(60.0),
        ..ScalingMemory::default()
    };
    let draining = with_completions(inputs(67_000.0, 2600.0, 30.0, 8), 3000.0);
    let d = decide(&c, &draining, &after_scale_up, at(205));
    let bound = d.memory.capacity.expect("a bound");
    assert!(bound.lower_bound, "{bound:?}");
    assert!((bound.per_replica_rate - 600.0).abs() < 1e-9, "{bound:?}");
    assert_eq!(d.used.capacity_source, Some(CapacitySource::Prior));
    // Ten seconds before the previous sample a scale-down to eight stopped more replicas:
    // until its rebalance they worked too, and the drop is not the eight's alone.
    let after_scale_down = ScalingMemory {
        last_change_at: Some(at(180)),
        last_change_raised: false,
        ..after_scale_up.clone()
    };
    let d = decide(&c, &draining, &after_scale_down, at(205));
    let bound = d.memory.capacity.map(|m| m.per_replica_rate);
    assert_eq!(bound, Some(500.0), "{}", d.explanation);
    // Once the rebalance had passed by the previous sample, only the eight worked.
    let settled_down = ScalingMemory {
        last_change_at: Some(at(150)),
        ..after_scale_down
    };
    let d = decide(&c, &draining, &settled_down, at(205));
    let bound = d.memory.capacity.map(|m| m.per_replica_rate);
    assert!(
        bound.is_some_and(|rate| (rate - 600.0).abs() < 1e-9),
        "{bound:?}"
    );
    // The rate window fell by 100/s over the poll: a 60 s window moves that much when the
    // last 15 s brought 6000 fewer events than the 15 s that left it, so the fall may be
    // in the arrivals the drop is added to. 400/s less is credited: (2200 + 2100) / 8.
    let falling = with_completions(inputs(67_000.0, 2500.0, 30.0, 8), 3000.0);
    let d = decide(&c, &falling, &after_scale_up, at(205));
    let bound = d.memory.capacity.map(|m| m.per_replica_rate);
    assert!(
        bound.is_some_and(|rate| (rate - 537.5).abs() < 1e-9),
        "{bound:?}"
    );
    // A peak shorter than the window passes through it with hardly a move: λ about the
    // same for less than a window and a poll before the previous poll says nothing of the
    // last poll's arrivals, so only the drop is credited: 2200 / 8.
    let peak_passing = ScalingMemory {
        demand: vec![DemandSample {
            at: at(150),
            rate: 2600.0,
        }],
        ..after_scale_up.clone()
    };
    let d = decide(&c, &draining, &peak_passing, at(205));
    let bound = d.memory.capacity.map(|m| m.per_replica_rate);
    assert_eq!(bound, Some(500.0), "{}", d.explanation);
    // Pods still starting may work by the next poll: not every replica asked for is ready,
    // so the drop is not credited per replica.
    let mut starting = draining.clone();
    starting.current_replicas = 10;
    let d = decide(&c, &starting, &after_scale_up, at(205));
    let bound = d.memory.capacity.map(|m| m.per_replica_rate);
    assert_eq!(bound, Some(500.0), "{}", d.explanation);
}

#[test]
fn a_declared_pod_start_is_assumed_until_one_is_seen() {
    // 4 replicas complete 1000/s of 1400/s arriving, over a queue whose oldest event is
    // 200 s old under a 300 s age limit. Pods that start in 30 s (the default) leave time to
    // act at the next decision; pods declared to take 4 minutes do not: the scale-up is now.
    let behind = inputs(40_000.0, 1400.0, 200.0, 4);
    let slow_pods = BudgetConfig {
        pod_start_seconds: 240.0,
        ..config()
    };
    let fast = decide(&config(), &behind, &ScalingMemory::default(), at(0));
    let slow = decide(&slow_pods, &behind, &ScalingMemory::default(), at(0));
    assert_eq!(fast.desired, 4, "{}", fast.explanation);
    assert!(slow.desired > 4, "{}", slow.explanation);
    // Once a start has been seen, it is what the plan assumes, whatever was declared.
    let seen = ScalingMemory {
        pod_start_seconds: Some(30.0),
        ..ScalingMemory::default()
    };
    let measured = decide(&slow_pods, &behind, &seen, at(0));
    assert_eq!(measured.desired, fast.desired, "{}", measured.explanation);
}

#[test]
fn a_load_above_the_cap_read_through_a_young_series_gets_the_cap_at_once() {
    // A workload started with its budget, at 30× (a 20 s deadline, 1 s polls, a 5 s rate
    // window): λ arrives from the start, above the 72k/s that 12 partitions of 6k/s
    // complete, while Prometheus' rate over the young series climbs for up to its window.
    // The climb is not a lower past the load returns to: at the first poll that reads λ at
    // or above what the cap completes, the budget asks for the cap and says the backlog can
    // never catch up, whatever it asked for before.
    let c = BudgetConfig {
        deadline_seconds: 20.0,
        poll_interval_seconds: 1.0,
        rate_window_seconds: 5.0,
        pod_start_seconds: 1.0,
        rebalance_cost_seconds: 0.33,
        target_drain_seconds: 10.0,
        scale_down_stabilization_seconds: 10.0,
        per_replica_rate: Some(6000.0),
        ..config()
    };
    for lambda in [75_000.0, 80_000.0, 90_000.0, 120_000.0] {
        for climb_seconds in [2.0, 3.0, 5.0] {
            let mut memory = ScalingMemory::default();
            let mut replicas = 2;
            let mut backlog = 0.0;
            let crossed = (0..=10).find_map(|second| {
                let read = lambda * (f64::from(second + 1) / climb_seconds).min(1.0);
                let d = decide(
                    &c,
                    &inputs(backlog, read, f64::from(second), replicas),
                    &memory,
                    at(i64::from(second)),
                );
                if read >= 72_000.0 {
                    return Some(d);
                }
                assert_ne!(d.phase, BudgetPhase::Undrainable, "{}", d.explanation);
                backlog += lambda - 6000.0 * f64::from(replicas);
                replicas = d.desired;
                memory = d.memory;
                None
            });
            let d = crossed.expect("λ is read above what the cap completes");
            assert_eq!(
                (d.desired, d.phase),
                (12, BudgetPhase::Undrainable),
                "λ {lambda}/s read through a {climb_seconds} s climb: {}",
                d.explanation
            );
        }
    }
}
