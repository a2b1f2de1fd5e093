//! The budget on load shapes nobody tuned it for: `cargo bench -p backlog-sim --bench sweep`.
//!
//! The scenarios in examples/scenarios/ are samples; this draws many more of each class at
//! random (benches/sweep/shapes.rs) and checks the policies bench's acceptance on every one:
//! replica-seconds ≤ the best constant count's and ≤ 1.3 × the hindsight oracle's, scale
//! events ≤ the lag-threshold baseline's, and no breach where always running the cap has
//! none. It prints every miss, a pass rate per class and criterion, and the geometric means.
//!
//! `SWEEP_SEEDS` (default 1,2,3,4) and `SWEEP_COUNT` (scenarios per seed, default 96) choose
//! the draw; `SWEEP_DUMP=DIR` writes each missed scenario there, to replay with
//! `backlog-operator simulate --scenario`. `SWEEP_NOISE=0.2` draws the same scenarios with
//! their production multiplied by a factor within ±20 % that changes every 15 s
//! (`productionNoise`), as real arrivals are never flat.

#[path = "sweep/shapes.rs"]
mod shapes;

use std::path::PathBuf;

use backlog_sim::policy::PolicyKind;
use backlog_sim::run::{Summary, simulate};
use backlog_sim::scenario::Scenario;

use shapes::{Rng, SHAPES, scenario};

/// How far above the oracle's replica-seconds the budget may land.
const ORACLE_SLACK: f64 = 1.3;

const CRITERIA: [&str; 4] = [
    "≤ static",
    "≤ 1.3 × oracle",
    "events ≤ lag-threshold",
    "no breach where max has none",
];

struct Drawn {
    seed: u64,
    shape: &'static str,
    name: String,
    yaml: String,
}

struct Outcome {
    budget: Summary,
    fixed: Summary,
    oracle: Summary,
    lag: Summary,
    max: Summary,
    /// warningAt × deadline: the oldest age the budget plans never to reach; `static` is
    /// held to the deadline only.
    warning_age: f64,
}

impl Outcome {
    fn checks(&self) -> [bool; 4] {
        [
            self.budget.replica_seconds <= self.fixed.replica_seconds,
            self.budget.replica_seconds <= ORACLE_SLACK * self.oracle.replica_seconds,
            self.budget.scale_events <= self.lag.scale_events,
            self.max.breach_seconds > 0.0 || self.budget.breach_seconds == 0.0,
        ]
    }

    /// Above 1, `static` let the oldest event pass the age the budget plans to stay under:
    /// a miss of `≤ static` there is the margin, not a worse schedule.
    fn static_age_over_warning(&self) -> f64 {
        self.fixed.max_oldest_age_seconds / self.warning_age
    }
}

fn run(drawn: &Drawn) -> Outcome {
    let model = serde_yaml::from_str::<Scenario>(&drawn.yaml)
        .map_err(|e| e.to_string())
        .and_then(|s| s.model().map_err(|e| e.to_string()))
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", drawn.name, drawn.yaml));
    let summary = |kind| simulate(&model, kind).summary;
    Outcome {
        budget: summary(PolicyKind::Budget),
        fixed: summary(PolicyKind::Static),
        oracle: summary(PolicyKind::Oracle),
        lag: summary(PolicyKind::LagThreshold),
        max: summary(PolicyKind::Max),
        warning_age: model.budget.warning_at * model.budget.deadline_seconds,
    }
}

fn env_list(name: &str, default: &[u64]) -> Vec<u64> {
    std::env::var(name).map_or_else(
        |_| default.to_vec(),
        |v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect(),
    )
}

fn geometric_mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, count) = values.fold((0.0, 0.0), |(s, n), v| (s + v.ln(), n + 1.0));
    (sum / count).exp()
}

fn main() {
    let seeds = env_list("SWEEP_SEEDS", &[1, 2, 3, 4]);
    let count = env_list("SWEEP_COUNT", &[96])
        .first()
        .copied()
        .unwrap_or(96) as usize;
    let dump = std::env::var_os("SWEEP_DUMP").map(PathBuf::from);
    if let Some(dir) = &dump
        && let Err(e) = std::fs::create_dir_all(dir)
    {
        eprintln!("{}: {e}", dir.display());
    }
    let noise = std::env::var("SWEEP_NOISE")
        .ok()
        .and_then(|share| share.parse::<f64>().ok())
        .filter(|share| *share > 0.0);

    let drawn: Vec<Drawn> = seeds
        .iter()
        .flat_map(|&seed| {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            (0..count)
                .map(|index| {
                    let (name, mut yaml) = scenario(&mut rng, index);
                    if let Some(share) = noise {
                        let noise_seed = seed * 1000 + index as u64;
                        yaml.push_str(&format!(
                            "productionNoise: {{share: {share}, every: 15s, seed: {noise_seed}}}\n"
                        ));
                    }
                    Drawn {
                        seed,
                        shape: SHAPES[index % SHAPES.len()],
                        name,
                        yaml,
                    }
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
        let workers: Vec<_> = drawn
            .chunks(drawn.len().div_ceil(threads).max(1))
            .map(|chunk| scope.spawn(move || chunk.iter().map(run).collect::<Vec<_>>()))
            .collect();
        workers
            .into_iter()
            .flat_map(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|e| std::panic::resume_unwind(e))
            })
            .collect()
    });

    println!("## Misses ({} scenarios, seeds {seeds:?})\n", drawn.len());
    println!(
        "| seed | scenario | budget | static | oracle | lag-threshold | ÷ static | ÷ oracle | events (lag) | breach s (max) | static's oldest age ÷ warning | missed |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for (d, o) in drawn.iter().zip(&outcomes) {
        let checks = o.checks();
        if checks.iter().all(|c| *c) {
            continue;
        }
        let missed: Vec<&str> = CRITERIA
            .iter()
            .zip(checks)
            .filter(|(_, ok)| !ok)
            .map(|(name, _)| *name)
            .collect();
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {} ({}) | {:.0} ({:.0}) | {:.2} | {} |",
            d.seed,
            d.name,
            o.budget.replica_seconds,
            o.fixed.replica_seconds,
            o.oracle.replica_seconds,
            o.lag.replica_seconds,
            o.budget.replica_seconds / o.fixed.replica_seconds,
            o.budget.replica_seconds / o.oracle.replica_seconds,
            o.budget.scale_events,
            o.lag.scale_events,
            o.budget.breach_seconds,
            o.max.breach_seconds,
            o.static_age_over_warning(),
            missed.join(", "),
        );
        if let Some(dir) = &dump {
            let path = dir.join(format!("{}-seed{}.yaml", d.name, d.seed));
            if let Err(e) = std::fs::write(&path, &d.yaml) {
                eprintln!("{}: {e}", path.display());
            }
        }
    }

    println!("\n## Pass rate per class\n");
    println!(
        "| class | scenarios | all four | {} |",
        CRITERIA.join(" | ")
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut classes: Vec<Option<&str>> = SHAPES.iter().map(|s| Some(*s)).collect();
    classes.push(None);
    for class in classes {
        let rows: Vec<[bool; 4]> = drawn
            .iter()
            .zip(&outcomes)
            .filter(|(d, _)| class.is_none_or(|c| d.shape == c))
            .map(|(_, o)| o.checks())
            .collect();
        let passed = |test: &dyn Fn(&[bool; 4]) -> bool| rows.iter().filter(|r| test(r)).count();
        let each: Vec<String> = (0..4)
            .map(|i| format!("{}", passed(&|r: &[bool; 4]| r[i])))
            .collect();
        println!(
            "| {} | {} | {} | {} |",
            class.unwrap_or("**all**"),
            rows.len(),
            passed(&|r: &[bool; 4]| r.iter().all(|c| *c)),
            each.join(" | ")
        );
    }

    let above_static: Vec<&Outcome> = outcomes.iter().filter(|o| !o.checks()[0]).collect();
    println!(
        "\n{} of {} misses of ≤ static are where static's oldest age passed warningAt × deadline",
        above_static
            .iter()
            .filter(|o| o.static_age_over_warning() > 1.0)
            .count(),
        above_static.len()
    );
    println!(
        "geometric mean of budget ÷ static {:.3}, of budget ÷ oracle {:.3}; scale events {} (lag-threshold {})",
        geometric_mean(
            outcomes
                .iter()
                .map(|o| o.budget.replica_seconds / o.fixed.replica_seconds)
        ),
        geometric_mean(
            outcomes
                .iter()
                .map(|o| o.budget.replica_seconds / o.oracle.replica_seconds)
        ),
        outcomes.iter().map(|o| o.budget.scale_events).sum::<u32>(),
        outcomes.iter().map(|o| o.lag.scale_events).sum::<u32>(),
    );
}
