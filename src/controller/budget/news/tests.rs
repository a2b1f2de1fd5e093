use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use proptest::prelude::*;

use super::*;
use crate::api::backlog_budget::{BudgetPhase, DemandBucket, Observed};

/// The statuses' own comparison, as the reconcile makes it through [`Written`].
fn is_news(
    written: &BacklogBudgetStatus,
    written_at: Option<Timestamp>,
    next: &BacklogBudgetStatus,
    now: Timestamp,
) -> bool {
    super::is_news(&Written::of(written), written_at, &Written::of(next), now)
}

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(s).expect("a time")
}

fn status(backlog: f64, explanation: &str) -> BacklogBudgetStatus {
    BacklogBudgetStatus {
        phase: Some(BudgetPhase::Healthy),
        desired_replicas: Some(4),
        observed: Some(Observed {
            backlog: Some(backlog),
            produce_rate: Some(1000.0),
            at: Some(MicroTime(at(0))),
            ..Default::default()
        }),
        explanation: Some(explanation.to_owned()),
        conditions: vec![Condition {
            type_: "DeadlineAtRisk".into(),
            status: "False".into(),
            reason: "WithinDeadline".into(),
            message: format!("the oldest event is {backlog} s old"),
            last_transition_time: Time(at(0)),
            observed_generation: Some(1),
        }],
        ..Default::default()
    }
}

#[test]
fn the_observation_time_alone_is_no_news() {
    let written = status(1000.0, "holding 4");
    let mut next = written.clone();
    if let Some(observed) = next.observed.as_mut() {
        observed.at = Some(MicroTime(at(15)));
    }
    assert!(!is_news(&written, Some(at(0)), &next, at(3600)));
}

#[test]
fn numbers_within_the_tolerance_wait_for_the_refresh() {
    let written = status(1000.0, "backlog 1000 drains in 4m10s");
    let next = status(1090.0, "backlog 1090 drains in 4m12s");
    assert!(!is_news(&written, Some(at(0)), &next, at(60)));
    assert!(is_news(&written, Some(at(0)), &next, at(300)));
    assert!(is_news(&written, None, &next, at(60)), "unknown write time");
}

#[test]
fn a_number_that_moves_beyond_the_tolerance_is_news() {
    let written = status(1000.0, "backlog 1000");
    assert!(is_news(
        &written,
        Some(at(0)),
        &status(1200.0, "backlog 1200"),
        at(15)
    ));
    assert!(is_news(
        &written,
        Some(at(0)),
        &status(0.0, "backlog 0"),
        at(15)
    ));
    let mut gone = status(1000.0, "backlog 1000");
    if let Some(observed) = gone.observed.as_mut() {
        observed.produce_rate = None;
    }
    assert!(
        is_news(&written, Some(at(0)), &gone, at(15)),
        "a number that went away"
    );
}

#[test]
fn what_a_reader_acts_on_is_news_at_once() {
    let written = status(1000.0, "holding 4");
    let mut phase = written.clone();
    phase.phase = Some(BudgetPhase::AtRisk);
    assert!(is_news(&written, Some(at(0)), &phase, at(1)));
    let mut desired = written.clone();
    desired.desired_replicas = Some(5);
    assert!(is_news(&written, Some(at(0)), &desired, at(1)));
    let worded = status(1000.0, "scale up to 5");
    assert!(is_news(&written, Some(at(0)), &worded, at(1)));
    let mut reason = written.clone();
    reason.conditions[0].reason = "PastWarning".into();
    assert!(is_news(&written, Some(at(0)), &reason, at(1)));
}

#[test]
fn the_decisions_memory_rides_along_with_the_next_news() {
    let written = status(1000.0, "holding 4");
    let mut next = written.clone();
    next.recent_demand.push(DemandBucket {
        at: MicroTime(at(10)),
        produce_rate: 1000.0,
    });
    assert!(!is_news(&written, Some(at(0)), &next, at(60)));
    assert!(is_news(&written, Some(at(0)), &next, at(300)));
}

#[test]
fn texts_compare_without_their_numbers() {
    assert_eq!(
        without_numbers("drains in 4m10s (1.5k/s)"),
        "drains in #m#s (#k/s)"
    );
    assert_eq!(without_numbers("no numbers"), "no numbers");
}

proptest! {
    #[test]
    fn news_within_the_tolerance_only_after_the_refresh(
        backlog in 1.0..1e7f64,
        share in -0.09..0.09f64,
        elapsed in 0i64..600,
    ) {
        let written = status(backlog, "holding");
        let next = status(backlog * (1.0 + share), "holding");
        let news = is_news(&written, Some(at(0)), &next, at(elapsed));
        prop_assert_eq!(news, elapsed >= 300 && next != written);
    }

    #[test]
    fn nothing_differs_is_never_news(backlog in 0.0..1e7f64, elapsed in 0i64..100_000) {
        let written = status(backlog, "holding");
        prop_assert!(!is_news(&written, Some(at(0)), &written.clone(), at(elapsed)));
        prop_assert!(!is_news(&written, None, &written.clone(), at(elapsed)));
    }
}
