//! Benchmark report for BacklogBudget scaling, run with `cargo bench --bench policies`:
//! every scenario under every policy, a sweep of the baseline's lagThreshold (its whole
//! trade-off curve next to our point), the slow-consumer drain prediction against what
//! happened, and the wall time of simulating 24 hours at 1 s steps.

use std::path::Path;
use std::time::{Duration, Instant};

use backlog_operator::core::format::seconds;
use backlog_operator::sim::policy::PolicyKind;
use backlog_operator::sim::run::simulate;
use backlog_operator::sim::scenario::{Model, Scenario};

fn load(path: &Path) -> Model {
    Scenario::load(path)
        .and_then(|s| s.model())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
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
        "| scenario | policy | breach s | max oldest age | replica-s | vs static | vs lag-threshold | scale events | drained after peak | p99 latency |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for model in &models {
        let keda = simulate(model, PolicyKind::LagThreshold).summary;
        let reference = simulate(model, PolicyKind::Static).summary;
        for kind in [
            PolicyKind::Budget,
            PolicyKind::Static,
            PolicyKind::LagThreshold,
            PolicyKind::Max,
        ] {
            let s = simulate(model, kind).summary;
            println!(
                "| {} | {} | {:.0} | {} | {:.0} | {:.3} | {:.3} | {} | {} | {} |",
                model.name,
                kind.name(),
                s.breach_seconds,
                seconds(s.max_oldest_age_seconds),
                s.replica_seconds,
                s.replica_seconds / reference.replica_seconds,
                s.replica_seconds / keda.replica_seconds,
                s.scale_events,
                s.drain_seconds.map_or("never".into(), seconds),
                s.latency_p99_seconds.map_or("-".into(), seconds),
            );
        }
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
        let mut samples: Vec<Duration> = (0..7)
            .map(|_| {
                let started = Instant::now();
                std::hint::black_box(simulate(day, PolicyKind::Budget));
                started.elapsed()
            })
            .collect();
        samples.sort();
        println!(
            "median {:?}, min {:?}, max {:?} over {} runs",
            samples[samples.len() / 2],
            samples[0],
            samples[samples.len() - 1],
            samples.len()
        );
    }
}
