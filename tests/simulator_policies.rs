//! The budget policy against KEDA's lag-threshold behaviour, the always-max bound, the best
//! constant count and the hindsight oracle, on every scenario in examples/scenarios: the same
//! decision code as the controller, offline.
//!
//! The baseline gets what a careful user knows: lagThreshold = perReplicaRate × targetDrainTime.

use std::path::Path;

use backlog_operator::sim::policy::PolicyKind;
use backlog_operator::sim::run::{Summary, simulate};
use backlog_operator::sim::scenario::{Model, Scenario};

fn scenarios() -> Vec<Model> {
    let mut paths: Vec<_> = std::fs::read_dir(Path::new("examples/scenarios"))
        .expect("examples/scenarios exists")
        .map(|entry| entry.expect("readable entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|path| {
            Scenario::load(path)
                .and_then(|s| s.model())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .collect()
}

fn run(model: &Model) -> (Summary, Summary, Summary) {
    (
        simulate(model, PolicyKind::Budget).summary,
        simulate(model, PolicyKind::LagThreshold).summary,
        simulate(model, PolicyKind::Max).summary,
    )
}

#[test]
fn the_issue_scenarios_are_all_there() {
    let names: Vec<String> = scenarios().into_iter().map(|m| m.name).collect();
    for expected in [
        "steady",
        "burst",
        "slow-consumer",
        "flash-sale",
        "diurnal",
        "undrainable",
        "short-spike",
        "periodic",
        "no-prior",
        "wrong-prior",
        "stepwise-slowdown",
        "slow-pods-slow-scrape",
        "stall-then-flood",
        "tight-deadline",
        "near-partition-cap",
        "hot-partition",
        "standing-queue-spike",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "missing scenario {expected}: {names:?}"
        );
    }
}

/// On every scenario: the budget keeps the deadline wherever the cap can, breaches no more
/// than the lag-threshold baseline, and rebalances no more often than it.
#[test]
fn budget_keeps_the_deadline_where_the_cap_can_with_fewer_rebalances_than_lag_threshold() {
    for model in scenarios() {
        let (budget, keda, max) = run(&model);
        let name = &model.name;
        assert!(
            budget.breach_seconds <= keda.breach_seconds,
            "{name}: budget breached {}s, lag-threshold {}s",
            budget.breach_seconds,
            keda.breach_seconds
        );
        if max.breach_seconds == 0.0 {
            assert_eq!(
                budget.breach_seconds, 0.0,
                "{name}: max does not breach, budget must not"
            );
        }
        assert!(
            budget.scale_events <= keda.scale_events,
            "{name}: budget scaled {} times, lag-threshold {}",
            budget.scale_events,
            keda.scale_events
        );
        assert!(
            budget.replica_seconds <= max.replica_seconds,
            "{name}: budget used more than the cap all along"
        );
    }
}

#[test]
fn no_policy_ever_asks_for_more_replicas_than_partitions() {
    for model in scenarios() {
        for kind in [
            PolicyKind::Budget,
            PolicyKind::LagThreshold,
            PolicyKind::Max,
            PolicyKind::Static,
            PolicyKind::Oracle,
        ] {
            let result = simulate(&model, kind);
            let highest = result
                .timeline
                .iter()
                .map(|r| r.replicas)
                .max()
                .unwrap_or(0);
            assert!(
                highest <= model.partitions.max(model.initial_replicas),
                "{} {}: {highest} replicas for {} partitions",
                model.name,
                kind.name(),
                model.partitions
            );
        }
    }
}

/// The static reference is what its name says: one count all along, with zero breach where
/// the cap has none, and one fewer replica would breach, in the run or after it (a constant
/// count that falls behind the run's average load breaches once such runs go on).
#[test]
fn static_is_the_smallest_constant_count_that_keeps_the_deadline() {
    for model in scenarios() {
        let reference = simulate(&model, PolicyKind::Static).summary;
        let max = simulate(&model, PolicyKind::Max).summary;
        let name = &model.name;
        assert_eq!(reference.scale_events, 0, "{name}: static never scales");
        if max.breach_seconds > 0.0 {
            continue;
        }
        assert_eq!(reference.breach_seconds, 0.0, "{name}: static breached");
        let count = reference.peak_replicas;
        if simulate(&going_on(&model, 2.0), PolicyKind::Max)
            .summary
            .breach_seconds
            > 0.0
        {
            // Not even the cap keeps the deadline once the run goes on: static is the cap.
            let cap = model.budget.max_replicas.min(model.partitions);
            assert_eq!(
                count, cap,
                "{name}: static is the cap when nothing keeps up"
            );
            continue;
        }
        let mut constant = model.clone();
        constant.initial_replicas = count;
        constant.budget.min_replicas = count;
        constant.budget.max_replicas = count;
        let going = simulate(&going_on(&constant, 2.0), PolicyKind::Max).summary;
        assert_eq!(
            going.breach_seconds, 0.0,
            "{name}: static breaches after the run"
        );
        if count > model.budget.min_replicas {
            let mut fewer = model.clone();
            fewer.initial_replicas = count - 1;
            fewer.budget.min_replicas = count - 1;
            fewer.budget.max_replicas = count - 1;
            let one_less = simulate(&fewer, PolicyKind::Max).summary;
            let going = simulate(&going_on(&fewer, 2.0), PolicyKind::Max).summary;
            let still_growing = going.remaining_backlog > one_less.remaining_backlog + 1.0;
            assert!(
                one_less.breach_seconds > 0.0 || going.breach_seconds > 0.0 || still_growing,
                "{name}: {} replicas would keep the deadline too, static chose {count}",
                count - 1
            );
        }
    }
}

#[test]
fn undrainable_is_reported_within_one_poll() {
    let model = scenarios()
        .into_iter()
        .find(|m| m.name == "undrainable")
        .expect("undrainable scenario");
    let result = simulate(&model, PolicyKind::Budget);
    // Decisions start once two scrapes give rates; from then one poll is enough.
    let first = result
        .timeline
        .iter()
        .find(|r| r.label == "Undrainable")
        .expect("the budget says Undrainable");
    assert!(
        first.t <= model.rate_window + 2.0 * model.budget.poll_interval_seconds,
        "Undrainable only at {}s",
        first.t
    );
}

#[test]
fn simulation_is_deterministic() {
    let model = &scenarios()[0];
    assert_eq!(
        simulate(model, PolicyKind::Budget),
        simulate(model, PolicyKind::Budget)
    );
}

#[test]
fn every_scale_change_is_listed_with_its_reason() {
    for model in scenarios() {
        for kind in [PolicyKind::Budget, PolicyKind::LagThreshold] {
            let result = simulate(&model, kind);
            assert_eq!(
                result.changes.len(),
                result.summary.scale_events as usize,
                "{}: {kind:?}",
                model.name
            );
            let mut replicas = model.initial_replicas;
            for change in &result.changes {
                assert_eq!(change.from, replicas, "{}: {change:?}", model.name);
                assert_ne!(change.to, change.from, "{}: {change:?}", model.name);
                assert!(!change.reason.is_empty(), "{}: {change:?}", model.name);
                replicas = change.to;
            }
            // The budget says why in its own words: the explanation it writes to status.
            if kind == PolicyKind::Budget {
                for change in &result.changes {
                    assert!(change.reason.contains(" → "), "{}: {change:?}", model.name);
                }
            }
        }
    }
}

/// The model run on for `deadlines` deadlines past its end at the run's average load.
fn going_on(model: &Model, deadlines: f64) -> Model {
    let seconds = model.duration.floor() as usize;
    let mean = (0..seconds)
        .map(|t| model.production_rate(t as f64 + 0.5))
        .sum::<f64>()
        / seconds.max(1) as f64;
    let mut longer = model.clone();
    longer.production.push((model.duration, mean, None));
    longer.duration = model.duration + deadlines * model.budget.deadline_seconds;
    longer
}
