//! Text renderings of a simulation: a readable table, JSON and CSV.

use std::fmt::Write as _;

use super::run::{SimulationResult, Summary, TimelineRow};
use backlog_core::format::{seconds, si};

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
    Csv,
    Svg,
}

/// About this many rows in a table: enough to read the story, few enough to read at all.
const TABLE_ROWS: f64 = 60.0;

pub fn timeline_header() -> String {
    format!(
        "{:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>9}  {}",
        "time", "λ/s", "μ/s", "backlog", "oldest", "deadline", "replicas", "phase"
    )
}

pub fn timeline_line(row: &TimelineRow) -> String {
    let marker = if row.oldest_age > row.deadline {
        "!"
    } else {
        " "
    };
    format!(
        "{:>8} {:>8} {:>8} {:>9} {:>7}{marker} {:>8} {:>9}  {}",
        seconds(row.t),
        si(row.lambda),
        si(row.mu),
        si(row.backlog),
        seconds(row.oldest_age),
        seconds(row.deadline),
        format!("{}/{}", row.ready, row.replicas),
        row.label
    )
}

pub fn summary_lines(summary: &Summary) -> String {
    let mut out = String::new();
    let optional = |value: Option<f64>| value.map_or("never".to_owned(), seconds);
    let _ = writeln!(
        out,
        "scenario {} / policy {}",
        summary.scenario,
        summary.policy.name()
    );
    let _ = writeln!(
        out,
        "  breach {} (oldest age above the deadline), max oldest age {}",
        seconds(summary.breach_seconds),
        seconds(summary.max_oldest_age_seconds)
    );
    let _ = writeln!(
        out,
        "  replica-seconds {}, scale events {}, rebalances {}, peak replicas {}",
        si(summary.replica_seconds),
        summary.scale_events,
        summary.rebalances,
        summary.peak_replicas
    );
    let _ = writeln!(
        out,
        "  peak backlog {}, drained {} after the peak, completed {} of {} events",
        si(summary.peak_backlog),
        optional(summary.drain_seconds),
        si(summary.completed),
        si(summary.produced)
    );
    let _ = writeln!(
        out,
        "  completion latency p50 {} p95 {} p99 {}",
        optional(summary.latency_p50_seconds),
        optional(summary.latency_p95_seconds),
        optional(summary.latency_p99_seconds)
    );
    out
}

pub fn table(result: &SimulationResult) -> String {
    let mut out = String::new();
    let span = result.timeline.last().map_or(0.0, |r| r.t);
    let every = (span / TABLE_ROWS).max(1.0);
    let _ = writeln!(out, "{}", timeline_header());
    let mut next = 0.0;
    for row in &result.timeline {
        if row.t >= next {
            let _ = writeln!(out, "{}", timeline_line(row));
            next = row.t + every;
        }
    }
    out.push('\n');
    out.push_str(&summary_lines(&result.summary));
    if !result.changes.is_empty() {
        let _ = writeln!(out, "\n  scale changes:");
        for change in &result.changes {
            let _ = writeln!(
                out,
                "  {:>8}  {} → {}  {}",
                seconds(change.t),
                change.from,
                change.to,
                change.reason
            );
        }
    }
    out
}

pub fn json(result: &SimulationResult) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(result)
}

pub fn csv(result: &SimulationResult) -> String {
    let mut out = String::from("t,lambda,mu,backlog,oldest_age,deadline,replicas,ready,label\n");
    for r in &result.timeline {
        let _ = writeln!(
            out,
            "{},{:.3},{:.3},{:.3},{:.3},{},{},{},{}",
            r.t,
            r.lambda,
            r.mu,
            r.backlog,
            r.oldest_age,
            r.deadline,
            r.replicas,
            r.ready,
            r.label.replace(',', ";")
        );
    }
    out
}
