//! Seed 000's second recovery experiment, run with `cargo bench --bench classes`: every
//! scenario of examples/scenarios/classes/ (one event class failing persistently, each failing
//! execution going through the RetryPolicy's planner) without and with the event-class
//! breaker, as a table, then the breaker's transitions and the wall time of a run.

use std::path::Path;
use std::time::Instant;

use backlog_operator::sim::classes::{self, ExperimentModel, report, run::simulate};

fn load(path: &Path) -> ExperimentModel {
    classes::load(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn main() {
    let mut paths: Vec<_> = std::fs::read_dir("examples/scenarios/classes")
        .expect("examples/scenarios/classes")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    let experiments: Vec<ExperimentModel> = paths.iter().map(|p| load(p)).collect();

    let mut summaries = Vec::new();
    let mut timings = Vec::new();
    for experiment in &experiments {
        for breaker in [false, true] {
            let started = Instant::now();
            let run = simulate(experiment, breaker);
            timings.push((experiment.model.name.clone(), breaker, started.elapsed()));
            summaries.push(run.summary);
        }
    }

    println!("## Persistent failure: without and with the event-class breaker\n");
    print!("{}", report::table(&summaries));
    println!("\n## Breaker transitions of the failing class\n");
    print!("{}", report::transitions(&summaries));
    println!("\n## Wall time of one run\n");
    for (name, breaker, elapsed) in timings {
        println!(
            "- {name}, breaker {}: {elapsed:?}",
            if breaker { "on" } else { "off" }
        );
    }
}
