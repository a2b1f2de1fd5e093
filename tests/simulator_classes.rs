//! Seed 000's second recovery experiment (examples/scenarios/classes/), deterministic: one
//! event class fails persistently, every failing execution goes through the RetryPolicy's
//! planner, and the run is compared without and with the event-class breaker.

use std::path::{Path, PathBuf};

use backlog_operator::api::backlog_budget::ClassState;
use backlog_operator::sim::classes::run::{ExperimentSummary, simulate};
use backlog_operator::sim::classes::{self, ExperimentModel};

fn scenario(name: &str) -> ExperimentModel {
    let path = Path::new("examples/scenarios/classes").join(format!("{name}.yaml"));
    classes::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn scenario_files() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir("examples/scenarios/classes")
        .expect("examples/scenarios/classes exists")
        .map(|entry| entry.expect("readable entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    paths
}

fn runs(experiment: &ExperimentModel) -> (ExperimentSummary, ExperimentSummary) {
    (
        simulate(experiment, false).summary,
        simulate(experiment, true).summary,
    )
}

/// No event is ever executed more than maxAttempts times, with or without the breaker, in
/// every scenario.
#[test]
fn executions_per_failing_event_never_exceed_max_attempts() {
    for path in scenario_files() {
        let experiment = classes::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let max_attempts = experiment.policy.max_attempts();
        let (without, with) = runs(&experiment);
        for run in [&without, &with] {
            for class in &run.classes {
                assert!(
                    class.max_executions_failing_event <= max_attempts,
                    "{} (breaker {}): {} executed an event {} times, maxAttempts is {max_attempts}",
                    run.scenario,
                    run.breaker,
                    class.name,
                    class.max_executions_failing_event
                );
                let beyond: u64 = class
                    .failing_events_by_executions
                    .iter()
                    .skip(max_attempts as usize + 1)
                    .sum();
                assert_eq!(beyond, 0, "{} {}", run.scenario, class.name);
            }
        }
    }
}

#[test]
fn the_breaker_pauses_the_failing_class_and_helps_the_healthy_ones() {
    let experiment = scenario("persistent-failure");
    let (without, with) = runs(&experiment);
    let failing = with.failing().next().expect("a failing class");
    assert_eq!(failing.name, "refund.requested");
    let paused_after = failing
        .paused_after_seconds
        .expect("the breaker pauses the failing class");
    // The ratio window (1m) fills, `for` (1m) passes, plus scrape and poll lag.
    assert!(paused_after <= 150.0, "paused only after {paused_after}s");
    assert!(
        failing.transitions.iter().all(|(_, from, to)| matches!(
            (from, to),
            (ClassState::Active, ClassState::Paused)
                | (ClassState::Paused, ClassState::Probing)
                | (ClassState::Probing, ClassState::Paused)
                | (ClassState::Probing, ClassState::Active)
        )),
        "{:?}",
        failing.transitions
    );
    let without_failing = without.failing().next().expect("a failing class");
    assert!(without_failing.paused_after_seconds.is_none());
    assert!(without_failing.transitions.is_empty());

    let p99 = |run: &ExperimentSummary| run.healthy_p99_seconds.expect("healthy completions");
    assert!(
        p99(&with) < p99(&without),
        "healthy p99 with the breaker {}s, without {}s",
        p99(&with),
        p99(&without)
    );
    // The failing class executes far less: most of its events wait, untouched.
    assert!(failing.executions * 3 < without_failing.executions);
    assert!(
        failing.pending_at_end > 0,
        "paused events are kept, not dropped"
    );
    // A spent retry budget quarantines fewer of the healthy classes' transient failures.
    assert!(with.healthy_quarantined < without.healthy_quarantined);
}

#[test]
fn a_fixed_class_probes_back_to_active_and_its_held_events_run() {
    let experiment = scenario("persistent-failure-fixed");
    let with = simulate(&experiment, true).summary;
    let failing = with.failing().next().expect("a failing class");
    assert_eq!(
        failing.transitions.last().map(|(_, _, to)| *to),
        Some(ClassState::Active),
        "{:?}",
        failing.transitions
    );
    assert!(
        failing.pending_at_end < 100,
        "the held events ran once the class was Active: {} left",
        failing.pending_at_end
    );
}

#[test]
fn class_runs_are_deterministic() {
    let experiment = scenario("persistent-failure");
    assert_eq!(simulate(&experiment, true), simulate(&experiment, true));
}
