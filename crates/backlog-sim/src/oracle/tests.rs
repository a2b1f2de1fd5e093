use super::*;
use crate::run::simulate;
use crate::scenario::Scenario;

fn repo_scenarios() -> Vec<Model> {
    let directory =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/scenarios");
    let mut paths: Vec<_> = std::fs::read_dir(&directory)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|path| Scenario::load(path).and_then(|s| s.model()).unwrap())
        .collect()
}

fn model(yaml: &str) -> Model {
    serde_yaml::from_str::<Scenario>(yaml)
        .unwrap()
        .model()
        .unwrap()
}

/// A constant 950 events/s that four replicas of 250 keep up with; a change costs more
/// replica-seconds (rebalanceCost 10m × the new count) than the deadline's slack could save,
/// even at the run's end.
const CONSTANT_LOAD: &str = "
name: constant
duration: 1h
partitions: 12
production: [{from: 0s, rate: 950}]
consumer: {perReplicaRate: 250}
budget:
  minReplicas: 1
  maxReplicas: 12
  completionDeadline: 2m
  capacity: {perReplicaRate: 250, reservedRetryShare: 0}
  scaling: {rebalanceCost: 10m}
";

#[test]
fn on_a_constant_load_it_is_the_static_count_without_changes() {
    let model = model(CONSTANT_LOAD);
    let oracle = simulate(&model, PolicyKind::Oracle).summary;
    let reference = simulate(&model, PolicyKind::Static).summary;
    assert_eq!(oracle.scale_events, 0);
    assert_eq!(oracle.peak_replicas, reference.peak_replicas);
    assert_eq!(oracle.peak_replicas, 4);
    assert_eq!(oracle.replica_seconds, reference.replica_seconds);
    assert_eq!(oracle.breach_seconds, 0.0);
    assert_eq!(oracle.policy, PolicyKind::Oracle);
}

#[test]
fn on_every_repo_scenario_it_keeps_the_deadline_where_max_does_and_costs_at_most_static() {
    for model in repo_scenarios() {
        let name = &model.name;
        let oracle = simulate(&model, PolicyKind::Oracle).summary;
        let reference = simulate(&model, PolicyKind::Static).summary;
        let max = simulate(&model, PolicyKind::Max).summary;
        if max.breach_seconds == 0.0 {
            assert_eq!(oracle.breach_seconds, 0.0, "{name}: the oracle breached");
        }
        assert!(
            oracle.replica_seconds <= reference.replica_seconds,
            "{name}: oracle {} replica-seconds, static {}",
            oracle.replica_seconds,
            reference.replica_seconds
        );
        assert!(oracle.peak_replicas <= replica_cap(&model), "{name}");
    }
}

#[test]
fn it_changes_the_count_only_at_decisions() {
    for (duration, poll) in [
        (3600.0, 15.0),
        (3600.0, 20.0),
        (86400.0, 15.0),
        (3600.0, 45.0),
    ] {
        let mut model = model(CONSTANT_LOAD);
        model.duration = duration;
        model.budget.poll_interval_seconds = poll;
        let bucket = bucket_seconds(&model);
        let polls = bucket / poll;
        assert!(
            (polls - polls.round()).abs() < 1e-9 && polls >= 1.0,
            "{bucket} / {poll}"
        );
        assert!(
            (30.0..=60.0).contains(&bucket) || bucket == poll,
            "{bucket}"
        );
    }
}

/// Two consumers would keep up with the hot partition's 230 events/s if its owner had
/// nothing else; it also owns three more partitions, so the oracle runs more than the total
/// rate alone asks for.
#[test]
fn a_hot_partition_needs_more_consumers_than_the_total_rate() {
    let hot = model(
        "
name: hot
duration: 2h
partitions: 8
partitionWeights: [{partition: 0, weight: 9}]
production: [{from: 0s, rate: 410}]
consumer: {perReplicaRate: 250}
budget:
  minReplicas: 2
  maxReplicas: 8
  completionDeadline: 10m
  capacity: {perReplicaRate: 250, reservedRetryShare: 0}
  scaling: {rebalanceCost: 10s}
",
    );
    let mut even = hot.clone();
    even.partition_shares = vec![1.0 / 8.0; 8];
    let skewed = simulate(&hot, PolicyKind::Oracle).summary;
    let spread = simulate(&even, PolicyKind::Oracle).summary;
    assert_eq!(skewed.breach_seconds, 0.0);
    assert_eq!(spread.peak_replicas, 2);
    assert!(skewed.peak_replicas >= 4, "{}", skewed.peak_replicas);
    assert!(skewed.replica_seconds > spread.replica_seconds);
}

#[test]
fn without_any_count_that_keeps_the_deadline_it_runs_the_cap() {
    let mut model = model(CONSTANT_LOAD);
    model.production = vec![(0.0, 5000.0, None)];
    model.budget.deadline_seconds = 60.0;
    let oracle = simulate(&model, PolicyKind::Oracle).summary;
    assert!(oracle.breach_seconds > 0.0);
    assert_eq!(oracle.peak_replicas, 12);
    assert_eq!(oracle.scale_events, 0);
}
