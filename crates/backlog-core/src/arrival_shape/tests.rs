use super::*;
use proptest::prelude::*;

#[test]
fn an_even_shape_places_the_head_linearly() {
    let mut head = ArrivalShape::even().head(1000.0, 100.0);
    assert_eq!(head.seconds_ago(0.0), 100.0);
    assert_eq!(head.seconds_ago(500.0), 50.0);
    assert_eq!(head.seconds_ago(1000.0), 0.0);
}

#[test]
fn a_spike_at_the_head_holds_most_of_the_queue() {
    // 100 s of 4000/s, then 50 s of 1000/s: 450 000 waiting, the oldest 150 s old (the rate
    // readings without lag).
    let shape = ArrivalShape::from_runs(&[(50.0, 1000.0), (150.0, 4000.0)], 0.0);
    let mut head = shape.head(450_000.0, 150.0);
    assert_eq!(head.seconds_ago(0.0), 150.0);
    // Half the spike done: 50 s of its arrivals, not a third of the whole age.
    assert!((head.seconds_ago(200_000.0) - 100.0).abs() < 1e-6);
    assert!((head.seconds_ago(400_000.0) - 50.0).abs() < 1e-6);
    assert!((head.seconds_ago(425_000.0) - 25.0).abs() < 1e-6);
}

#[test]
fn a_reading_lag_moves_each_change_back() {
    let shape = ArrivalShape::from_runs(&[(20.0, 1000.0), (200.0, 4000.0)], 30.0);
    // The newer run covers the last 50 s, the spike before that.
    let mut head = shape.head(1000.0 * 50.0 + 4000.0 * 50.0, 100.0);
    assert!((head.seconds_ago(200_000.0) - 50.0).abs() < 1e-6);
}

#[test]
fn the_measured_backlog_scales_the_read_rates() {
    // The readings say 2000/s throughout; the backlog says half as many wait: even again.
    let shape = ArrivalShape::from_runs(&[(300.0, 2000.0)], 0.0);
    let mut head = shape.head(100_000.0, 100.0);
    assert!((head.seconds_ago(50_000.0) - 50.0).abs() < 1e-6);
}

#[test]
fn a_stall_in_the_queue_is_skipped_at_once() {
    // 1000/s, then nothing for 60 s, then 1000/s for the last 40 s.
    let shape = ArrivalShape::from_runs(&[(40.0, 1000.0), (100.0, 0.0), (400.0, 1000.0)], 0.0);
    let mut head = shape.head(60_000.0, 120.0);
    assert!((head.seconds_ago(20_000.0) - 100.0).abs() < 1e-6);
    assert!((head.seconds_ago(20_001.0) - 40.0).abs() < 1e-2);
}

#[test]
fn nonsense_readings_leave_the_shape_even() {
    assert!(ArrivalShape::from_runs(&[(10.0, f64::NAN)], 0.0).is_even());
    assert!(ArrivalShape::from_runs(&[(-1.0, 10.0)], 0.0).is_even());
    assert!(ArrivalShape::from_runs(&[(10.0, 10.0)], f64::INFINITY).is_even());
    assert!(ArrivalShape::from_runs(&[], 0.0).is_even());
    // Rates of zero throughout: nothing to shape by.
    let mut head = ArrivalShape::from_runs(&[(10.0, 0.0)], 0.0).head(100.0, 10.0);
    assert_eq!(head.seconds_ago(50.0), 5.0);
}

#[test]
fn ageing_adds_the_new_arrivals_at_the_front() {
    let shape = ArrivalShape::from_runs(&[(100.0, 4000.0)], 0.0).aged_by(50.0, 1000.0);
    let mut head = shape.head(4000.0 * 100.0 + 1000.0 * 50.0, 150.0);
    assert!((head.seconds_ago(400_000.0) - 50.0).abs() < 1e-6);
    assert!(ArrivalShape::even().aged_by(50.0, 1000.0).is_even());
}

proptest! {
    #[test]
    fn the_head_moves_only_toward_now_and_stays_within_the_age(
        runs in proptest::collection::vec((0.0..2000.0f64, 0.0..10_000.0f64), 1..30),
        lag in 0.0..120.0f64,
        backlog in 1.0..1e7f64,
        age in 1.0..3000.0f64,
        steps in proptest::collection::vec(0.0..1.0f64, 1..50),
    ) {
        let mut runs = runs;
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let shape = ArrivalShape::from_runs(&runs, lag);
        let mut head = shape.head(backlog, age);
        let mut fractions = steps;
        fractions.sort_by(f64::total_cmp);
        let mut last = f64::INFINITY;
        for fraction in fractions {
            let ago = head.seconds_ago(fraction * backlog);
            prop_assert!((0.0..=age).contains(&ago), "{ago} outside 0..={age}");
            prop_assert!(ago <= last + 1e-9);
            last = ago;
        }
    }
}
