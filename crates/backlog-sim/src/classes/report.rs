//! The persistent-failure experiment as a table: each scenario with and without the breaker.

use super::run::{ClassSummary, ExperimentSummary};
use backlog_core::format::seconds;

fn optional_seconds(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), seconds)
}

fn failing_columns(class: &ClassSummary, max_attempts: u32) -> String {
    format!(
        "{} | {} | {:.2} / {} (≤ {max_attempts}) | {} / {} / {} | {} | {} | {} |",
        class.name,
        class.produced,
        class.mean_executions_failing_event().unwrap_or(0.0),
        class.max_executions_failing_event,
        class.quarantined_persistent,
        class.quarantined_attempts_exhausted,
        class.quarantined_budget_exhausted,
        class.pending_at_end,
        optional_seconds(class.paused_after_seconds),
        seconds(class.paused_seconds),
    )
}

/// A Markdown table of runs (typically each scenario without and with the breaker).
pub fn table(runs: &[ExperimentSummary]) -> String {
    let mut out = String::from(
        "| scenario | breaker | failing class | produced | executions per failing event: mean / max | quarantined: persistent / attempts / budget | held at end | paused after | paused for | healthy p95 | healthy p99 | deadline | healthy late | healthy quarantined | replica-s | mean replicas | peak |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for run in runs {
        for class in run.failing() {
            out.push_str(&format!(
                "| {} | {} | {} {} | {} | {} | {} | {} | {:.0} | {:.1} | {} |\n",
                run.scenario,
                if run.breaker { "on" } else { "off" },
                failing_columns(class, run.max_attempts),
                optional_seconds(run.healthy_p95_seconds),
                optional_seconds(run.healthy_p99_seconds),
                seconds(run.deadline_seconds),
                run.healthy_late,
                run.healthy_quarantined,
                run.replica_seconds,
                run.mean_replicas,
                run.peak_replicas,
            ));
        }
    }
    out
}

/// The breaker's transitions of each failing class, one line per run.
pub fn transitions(runs: &[ExperimentSummary]) -> String {
    let mut out = String::new();
    for run in runs.iter().filter(|run| run.breaker) {
        for class in run.failing() {
            let steps: Vec<String> = class
                .transitions
                .iter()
                .map(|(t, _, to)| format!("{} {to:?}", seconds(*t)))
                .collect();
            out.push_str(&format!(
                "- {} / {}: {}\n",
                run.scenario,
                class.name,
                if steps.is_empty() {
                    "no transition".to_owned()
                } else {
                    steps.join(" → ")
                }
            ));
        }
    }
    out
}
