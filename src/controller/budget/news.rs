//! When a budget's status is worth writing (pure).
//!
//! Every poll decides a new status, but most polls only move the observed numbers a little:
//! writing each of them costs the API server a write, every watcher of budgets an event, and
//! says nothing a reader acts on. The live numbers are on `/metrics`. A status is written when
//! what it says changes — phase, decision, conditions, the explanation's wording, class
//! states, the control document — when an observed number moves by more than
//! [`NUMBER_TOLERANCE`] of itself, or when [`REFRESH_AFTER`] has passed since the last write
//! and anything at all differs.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::api::backlog_budget::BacklogBudgetStatus;
use crate::core::stabilization::seconds_between;

/// How far an observed number may move, as a share of itself, before it is news.
pub const NUMBER_TOLERANCE: f64 = 0.1;

/// How old the written status may grow while only its numbers drift within the tolerance.
pub const REFRESH_AFTER: Duration = Duration::from_secs(300);

/// What is kept of a status written (or about to be): enough to tell whether another is
/// news, at a small fraction of its size (the operator keeps one per budget).
#[derive(Clone, Debug, PartialEq)]
pub struct Written {
    /// A fingerprint of everything but the observation time.
    content: u64,
    /// A fingerprint of what a reader acts on ([`headline`]).
    headline: u64,
    /// The live numbers, to single precision: they are compared at a tolerance of a tenth,
    /// and the operator keeps them for every budget. A number the status does not hold is
    /// NaN (a status never holds one: JSON cannot), which halves the list.
    numbers: Box<[f32]>,
}

impl Written {
    pub fn of(status: &BacklogBudgetStatus) -> Written {
        let mut without_time = status.clone();
        if let Some(observed) = without_time.observed.as_mut() {
            observed.at = None;
            observed.backlog_since = None;
            observed.previous_backlog_stood_seconds = None;
        }
        Written {
            content: fingerprint(&without_time),
            headline: fingerprint(&headline(status)),
            numbers: numbers(status),
        }
    }
}

/// A 64-bit hash of the status as JSON (its fields are all ordered: equal statuses print the
/// same). Two different statuses sharing one would only delay a write to the next change.
fn fingerprint(status: &BacklogBudgetStatus) -> u64 {
    use std::hash::Hasher;
    let mut hasher = std::hash::DefaultHasher::new();
    // The status serializes (no maps with non-string keys); were it ever not to, every
    // status would print empty and the refresh would still write it.
    hasher.write(&serde_json::to_vec(status).unwrap_or_default());
    hasher.finish()
}

/// Whether `next` is worth writing over `written`, last written at `written_at` (`None`:
/// unknown, so it is due).
pub fn is_news(
    written: &Written,
    written_at: Option<Timestamp>,
    next: &Written,
    now: Timestamp,
) -> bool {
    if written.content == next.content {
        return false;
    }
    if written.headline != next.headline || numbers_moved(&written.numbers, &next.numbers) {
        return true;
    }
    written_at.is_none_or(|at| seconds_between(at, now) >= REFRESH_AFTER.as_secs_f64())
}

/// The status without its live numbers and the decision's working memory, with numbers
/// blanked out of its texts: what a reader acts on.
fn headline(status: &BacklogBudgetStatus) -> BacklogBudgetStatus {
    let mut status = status.clone();
    if let Some(observed) = status.observed.as_mut() {
        observed.backlog = None;
        observed.produce_rate = None;
        observed.completion_rate = None;
        observed.retry_rate = None;
        observed.quarantine_rate = None;
        observed.oldest_unfinished_age = None;
        observed.oldest_unfinished_age_text = None;
        observed.at = None;
        observed.backlog_since = None;
        observed.previous_backlog_stood_seconds = None;
    }
    status.drain_time_seconds = None;
    status.drain_time = None;
    status.explanation = status.explanation.as_deref().map(without_numbers);
    // The decision's memory: it is kept by the operator between polls, and written along
    // with the next news.
    status.scale_down_window.clear();
    status.scale_up_pending = None;
    status.recent_demand.clear();
    status.pod_start_seconds = None;
    if let Some(capacity) = status.capacity.as_mut() {
        capacity.per_replica_rate = 0.0;
        capacity.measured_per_replica_rate = None;
        capacity.measured_at = None;
    }
    if let Some(economy) = status.economy.as_mut() {
        economy.load = None;
    }
    status.capacity_headroom = None;
    for condition in &mut status.conditions {
        condition.message = without_numbers(&condition.message);
    }
    for class in &mut status.event_classes {
        class.failure_ratio = None;
        class.transition_ratio = None;
        class.message = without_numbers(&class.message);
    }
    status
}

/// Whether any live number moved by more than the tolerance, or appeared or went away.
fn numbers_moved(before: &[f32], after: &[f32]) -> bool {
    before.len() != after.len() || before.iter().zip(after).any(|(&a, &b)| number_moved(a, b))
}

fn number_moved(a: f32, b: f32) -> bool {
    let held = |n: f32| (!n.is_nan()).then_some(f64::from(n));
    match (held(a), held(b)) {
        (Some(a), Some(b)) => (a - b).abs() > NUMBER_TOLERANCE * a.abs().max(b.abs()),
        (None, None) => false,
        _ => true,
    }
}

fn numbers(status: &BacklogBudgetStatus) -> Box<[f32]> {
    let observed = status.observed.as_ref();
    let capacity = status.capacity.as_ref();
    let mut numbers = vec![
        observed.and_then(|o| o.backlog),
        observed.and_then(|o| o.produce_rate),
        observed.and_then(|o| o.completion_rate),
        observed.and_then(|o| o.retry_rate),
        observed.and_then(|o| o.quarantine_rate),
        observed.and_then(|o| o.oldest_unfinished_age),
        status.drain_time_seconds,
        capacity.map(|c| c.per_replica_rate),
        capacity.and_then(|c| c.measured_per_replica_rate),
        status.capacity_headroom,
        status.economy.as_ref().and_then(|e| e.load),
    ];
    for class in &status.event_classes {
        numbers.push(class.failure_ratio);
        numbers.push(class.transition_ratio);
    }
    numbers
        .into_iter()
        .map(|number| number.map_or(f32::NAN, |n| n as f32))
        .collect()
}

/// `text` with every number replaced by `#`: "drains in 4m10s" and "drains in 4m12s" say
/// the same.
fn without_numbers(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_number = false;
    for c in text.chars() {
        let part_of_number = c.is_ascii_digit() || (in_number && (c == '.' || c == ','));
        if part_of_number {
            if !in_number {
                out.push('#');
            }
        } else {
            out.push(c);
        }
        in_number = part_of_number;
    }
    out
}

#[cfg(test)]
mod tests;
