//! `backlog-operator watch`: a BacklogBudget's status as a live timeline, then a summary.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use kube::{Api, Client};

use crate::api::BacklogBudget;
use crate::api::backlog_budget::BudgetPhase;
use crate::core::duration::positive_seconds;
use crate::core::format::{seconds, si};

/// One line of the timeline, from a status.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub elapsed: f64,
    pub produce_rate: Option<f64>,
    pub completion_rate: Option<f64>,
    pub backlog: Option<f64>,
    pub oldest_age: Option<f64>,
    pub deadline: Option<f64>,
    pub replicas: Option<i32>,
    pub desired: Option<i32>,
    pub phase: Option<BudgetPhase>,
}

impl Row {
    pub fn of(budget: &BacklogBudget, elapsed: f64) -> Row {
        let status = budget.status.clone().unwrap_or_default();
        let observed = status.observed.unwrap_or_default();
        Row {
            elapsed,
            produce_rate: observed.produce_rate,
            completion_rate: observed.completion_rate,
            backlog: observed.backlog,
            oldest_age: observed.oldest_unfinished_age,
            deadline: positive_seconds("completionDeadline", &budget.spec.completion_deadline).ok(),
            replicas: observed.replicas,
            desired: status.desired_replicas,
            phase: status.phase,
        }
    }

    fn same_reading(&self, other: &Row) -> bool {
        Row {
            elapsed: 0.0,
            ..self.clone()
        } == Row {
            elapsed: 0.0,
            ..other.clone()
        }
    }
}

fn or_dash(value: Option<String>) -> String {
    value.unwrap_or_else(|| "-".to_owned())
}

pub fn header() -> String {
    format!(
        "{:>7} {:>8} {:>8} {:>8} {:>15} {:>9}  {}",
        "time", "λ/s", "μ/s", "backlog", "oldest/deadline", "replicas", "phase"
    )
}

pub fn line(row: &Row) -> String {
    let late = matches!((row.oldest_age, row.deadline), (Some(a), Some(d)) if a > d);
    format!(
        "{:>7} {:>8} {:>8} {:>8} {:>15} {:>9}  {}",
        seconds(row.elapsed),
        or_dash(row.produce_rate.map(si)),
        or_dash(row.completion_rate.map(si)),
        or_dash(row.backlog.map(si)),
        format!(
            "{}/{}{}",
            or_dash(row.oldest_age.map(seconds)),
            or_dash(row.deadline.map(seconds)),
            if late { "!" } else { "" }
        ),
        format!(
            "{}→{}",
            or_dash(row.replicas.map(|r| r.to_string())),
            or_dash(row.desired.map(|r| r.to_string()))
        ),
        or_dash(row.phase.map(|p| format!("{p:?}")))
    )
}

/// What the timeline adds up to.
pub fn summary(rows: &[Row]) -> String {
    let mut out = String::new();
    let peak = rows.iter().filter_map(|r| r.desired).max();
    let max_age = rows
        .iter()
        .filter_map(|r| r.oldest_age)
        .fold(None, |m: Option<f64>, a| Some(m.map_or(a, |m| m.max(a))));
    let deadline = rows.iter().find_map(|r| r.deadline);
    let late = rows
        .windows(2)
        .filter(|w| matches!((w[0].oldest_age, w[0].deadline), (Some(a), Some(d)) if a > d))
        .map(|w| w[1].elapsed - w[0].elapsed)
        .sum::<f64>();
    let changes = rows
        .windows(2)
        .filter(|w| w[0].desired.is_some() && w[0].desired != w[1].desired)
        .count();
    let _ = writeln!(
        out,
        "summary over {}:",
        seconds(rows.last().map_or(0.0, |r| r.elapsed))
    );
    let _ = writeln!(
        out,
        "  oldest unfinished event peaked at {} against a {} deadline; above it for {}",
        or_dash(max_age.map(seconds)),
        or_dash(deadline.map(seconds)),
        seconds(late)
    );
    let _ = writeln!(
        out,
        "  replicas peaked at {}, {} scale changes, last phase {}",
        or_dash(peak.map(|p| p.to_string())),
        changes,
        or_dash(rows.last().and_then(|r| r.phase).map(|p| format!("{p:?}")))
    );
    out
}

/// Seconds between timeline lines while nothing but the numbers changes.
const QUIET_LINE_SECONDS: f64 = 4.0;

/// Prints the budget's status as a timeline for `duration`.
pub async fn watch(
    client: Client,
    namespace: &str,
    name: &str,
    duration: Duration,
) -> Result<(), kube::Error> {
    let api: Api<BacklogBudget> = Api::namespaced(client, namespace);
    let started = Instant::now();
    let mut rows: Vec<Row> = Vec::new();
    println!("{}", header());
    while started.elapsed() < duration {
        if let Some(budget) = api.get_opt(name).await? {
            let row = Row::of(&budget, started.elapsed().as_secs_f64());
            // A line when the decision or the phase changes, otherwise one per few seconds.
            let due = rows.last().is_none_or(|last| {
                last.phase != row.phase
                    || last.desired != row.desired
                    || last.replicas != row.replicas
                    || (row.elapsed - last.elapsed >= QUIET_LINE_SECONDS
                        && !last.same_reading(&row))
            });
            if due {
                println!("{}", line(&row));
                rows.push(row);
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    print!("\n{}", summary(&rows));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(elapsed: f64, age: f64, desired: i32) -> Row {
        Row {
            elapsed,
            produce_rate: Some(1500.0),
            completion_rate: Some(1200.0),
            backlog: Some(18_000.0),
            oldest_age: Some(age),
            deadline: Some(20.0),
            replicas: Some(4),
            desired: Some(desired),
            phase: Some(BudgetPhase::Healthy),
        }
    }

    #[test]
    fn a_line_reads_left_to_right() {
        let text = line(&row(75.0, 12.0, 6));
        assert!(text.contains("1m15s"), "{text}");
        assert!(text.contains("1.5k"), "{text}");
        assert!(text.contains("12s/20s"), "{text}");
        assert!(text.contains("4→6"), "{text}");
        assert!(line(&row(0.0, 25.0, 6)).contains("25s/20s!"));
    }

    #[test]
    fn the_summary_counts_lateness_and_changes() {
        let rows = [
            row(0.0, 10.0, 4),
            row(10.0, 25.0, 8),
            row(15.0, 5.0, 8),
            row(30.0, 1.0, 2),
        ];
        let text = summary(&rows);
        assert!(
            text.contains("peaked at 25s against a 20s deadline; above it for 5s"),
            "{text}"
        );
        assert!(
            text.contains("replicas peaked at 8, 2 scale changes"),
            "{text}"
        );
    }
}
