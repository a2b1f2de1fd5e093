//! Benchmark report for BacklogBudget scaling, run with `cargo bench --bench policies`:
//! every scenario under every policy next to the static and the hindsight-optimal (oracle)
//! references, one acceptance line per scenario, a sweep of the baseline's lagThreshold (its
//! whole trade-off curve next to our point), the slow-consumer drain prediction against what
//! happened, and the wall time of simulating 24 hours at 1 s steps and of planning the oracle.

use std::path::Path;
use std::time::{Duration, Instant};

use backlog_operator::core::format::seconds;
use backlog_operator::sim::policy::PolicyKind;
use backlog_operator::sim::run::{Summary, simulate};
use backlog_operator::sim::scenario::{Model, Scenario};

fn load(path: &Path) -> Model {
    Scenario::load(path)
        .and_then(|s| s.model())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The policies of the per-scenario table, in row order.
const ROWS: [PolicyKind; 5] = [
    PolicyKind::Budget,
    PolicyKind::Static,
    PolicyKind::Oracle,
    PolicyKind::LagThreshold,
    PolicyKind::Max,
];

/// How far above the oracle's replica-seconds the budget may land.
const ORACLE_SLACK: f64 = 1.3;

fn mark(passed: bool) -> &'static str {
    if passed { "✓" } else { "✗" }
}

/// One line of what the budget must achieve on a scenario, so a failure shows.
fn verdict(
    scenario: &str,
    budget: &Summary,
    reference: &Summary,
    oracle: &Summary,
    keda: &Summary,
    max: &Summary,
) -> String {
    let keeps_deadline = max.breach_seconds > 0.0 || budget.breach_seconds == 0.0;
    format!(
        "- {scenario}: budget ≤ static {} · budget ≤ {ORACLE_SLACK} × oracle {} ({:.2}×) · \
         budget events ≤ lag-threshold events {} ({} vs {}) · zero breach where max has zero {}{}",
        mark(budget.replica_seconds <= reference.replica_seconds),
        mark(budget.replica_seconds <= ORACLE_SLACK * oracle.replica_seconds),
        budget.replica_seconds / oracle.replica_seconds,
        mark(budget.scale_events <= keda.scale_events),
        budget.scale_events,
        keda.scale_events,
        mark(keeps_deadline),
        if max.breach_seconds > 0.0 {
            " (max breaches)"
        } else {
            ""
        },
    )
}

/// Median, min and max wall time of `runs` calls.
fn wall_time(runs: usize, mut call: impl FnMut()) -> String {
    let mut samples: Vec<Duration> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            call();
            started.elapsed()
        })
        .collect();
    samples.sort();
    format!(
        "median {:?}, min {:?}, max {:?} over {} runs",
        samples[samples.len() / 2],
        samples[0],
        samples[samples.len() - 1],
        samples.len()
    )
}

fn main() {
    let mut paths: Vec<_> = std::fs::read_dir("examples/scenarios")
        .expect("examples/scenarios")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    let models: Vec<Model> = paths.iter().map(|p| load(p)).collect();

    println!("## Policies per scenario\n");
    println!(
        "| scenario | policy | breach s | max oldest age | replica-s | vs static | vs oracle | scale events | p99 latency |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut verdicts = Vec::new();
    for model in &models {
        let summaries = ROWS.map(|kind| simulate(model, kind).summary);
        let [budget, reference, oracle, keda, max] = &summaries;
        for (kind, s) in ROWS.iter().zip(&summaries) {
            println!(
                "| {} | {} | {:.0} | {} | {:.0} | {:.3} | {:.3} | {} | {} |",
                model.name,
                kind.name(),
                s.breach_seconds,
                seconds(s.max_oldest_age_seconds),
                s.replica_seconds,
                s.replica_seconds / reference.replica_seconds,
                s.replica_seconds / oracle.replica_seconds,
                s.scale_events,
                s.latency_p99_seconds.map_or("-".into(), seconds),
            );
        }
        verdicts.push(verdict(&model.name, budget, reference, oracle, keda, max));
    }
    println!("\n## Acceptance per scenario\n");
    for line in verdicts {
        println!("{line}");
    }

    // The oracle may run every event up to the deadline; the budget plans within
    // warningAt × deadline. The same oracle held to the budget's own age limit is the
    // like-for-like floor.
    println!("\n## Budget against the oracle held to warningAt × deadline\n");
    println!(
        "| scenario | budget replica-s | oracle within warningAt | budget ÷ it | budget ÷ oracle |"
    );
    println!("|---|---:|---:|---:|---:|");
    for model in &models {
        let budget = simulate(model, PolicyKind::Budget).summary;
        let oracle = simulate(model, PolicyKind::Oracle).summary;
        let mut within = model.clone();
        within.budget.deadline_seconds *= within.budget.warning_at;
        let strict = simulate(&within, PolicyKind::Oracle).summary;
        println!(
            "| {} | {:.0} | {:.0} | {:.3} | {:.3} |",
            model.name,
            budget.replica_seconds,
            strict.replica_seconds,
            budget.replica_seconds / strict.replica_seconds,
            budget.replica_seconds / oracle.replica_seconds,
        );
    }

    println!(
        "\n## lag-threshold sweep (KEDA's trade-off curve; × perReplicaRate·targetDrainTime)\n"
    );
    println!("| scenario | lagThreshold | breach s | replica-s | scale events |");
    println!("|---|---:|---:|---:|---:|");
    for model in &models {
        let base = model.lag_threshold;
        for factor in [0.05, 0.1, 0.25, 0.5, 1.0, 2.0] {
            let mut swept = model.clone();
            swept.lag_threshold = base * factor;
            let s = simulate(&swept, PolicyKind::LagThreshold).summary;
            println!(
                "| {} | {:.0} | {:.0} | {:.0} | {} |",
                model.name,
                swept.lag_threshold,
                s.breach_seconds,
                s.replica_seconds,
                s.scale_events
            );
        }
        let ours = simulate(model, PolicyKind::Budget).summary;
        println!(
            "| {} | **budget** | {:.0} | {:.0} | {} |",
            model.name, ours.breach_seconds, ours.replica_seconds, ours.scale_events
        );
    }

    if let Some(slow) = models.iter().find(|m| m.name == "slow-consumer") {
        println!("\n## Slow consumer: drain time predicted in status vs observed\n");
        let recovery = slow.slowdowns.iter().map(|s| s.1).fold(0.0, f64::max);
        let result = simulate(slow, PolicyKind::Budget);
        if let Some(at) = result.timeline.iter().find(|r| r.t >= recovery) {
            let drained = result
                .timeline
                .iter()
                .find(|r| r.t > at.t && r.backlog <= r.lambda.max(1.0))
                .map(|r| r.t - at.t);
            println!(
                "at recovery (t={}): backlog {:.0}, predicted drain {}, observed {}",
                seconds(at.t),
                at.backlog,
                at.predicted_drain_seconds.map_or("none".into(), seconds),
                drained.map_or("never".into(), seconds)
            );
        }
    }

    if let Some(day) = models.iter().find(|m| m.name == "diurnal") {
        println!(
            "\n## Wall time: simulate {} ({} steps)\n",
            seconds(day.duration),
            day.duration / day.step
        );
        println!(
            "budget: {}",
            wall_time(7, || {
                std::hint::black_box(simulate(day, PolicyKind::Budget));
            })
        );
        // Planning, the verifying run and the check against a constant count, together.
        println!(
            "oracle: {}",
            wall_time(5, || {
                std::hint::black_box(simulate(day, PolicyKind::Oracle));
            })
        );
    }
}
