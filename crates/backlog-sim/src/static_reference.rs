//! The reference a budget must beat: the cheapest constant replica count that keeps the
//! deadline, started with that count ready.
//!
//! A constant count never reacts, so it keeps the deadline only if it also keeps it after the
//! scenario ends: one that falls behind the load and has not breached yet only because the
//! run stopped first is not a count that keeps the deadline, it is a breach the window hides.

use super::policy::PolicyKind;
use super::run::{SimulationResult, run};
use super::scenario::Model;

/// The most replicas worth running: the budget's maxReplicas, but never more consumers than
/// partitions (an extra one would idle).
pub(crate) fn replica_cap(model: &Model) -> u32 {
    model.budget.max_replicas.min(model.partitions).max(1)
}

/// The fewest replicas a schedule may run: minReplicas, within the cap.
pub(crate) fn replica_floor(model: &Model) -> u32 {
    model.budget.min_replicas.clamp(1, replica_cap(model))
}

/// The model with `replicas` consumers ready from the start.
pub(crate) fn starting_with(model: &Model, replicas: u32) -> Model {
    let mut started = model.clone();
    started.initial_replicas = replicas;
    started
}

/// Whether a constant `replicas` keeps the deadline all run and after it: it keeps up with
/// the run's average load and completes what waits at the end within the deadline (the probe
/// stops at the first breach).
pub(crate) fn constant_keeps_deadline(model: &Model, replicas: u32) -> bool {
    keeps_up_on_average(model, replicas)
        && run(
            &starting_with(&continued_past_end(model), replicas),
            PolicyKind::Static,
            true,
        )
        .summary
        .breach_seconds
            == 0.0
}

/// The model run on for one deadline past its end at the load and consumer speed of its
/// last step: every event still waiting at the end completes or passes the deadline by then.
fn continued_past_end(model: &Model) -> Model {
    let end = model.duration;
    let last = (end - model.step).max(0.0);
    let mut continued = model.clone();
    continued.production.retain(|(from, _, _)| *from < end);
    continued
        .production
        .push((end, model.segment_rate(last), None));
    continued.slowdowns.retain(|(from, _, _)| *from <= last);
    for (_, to, _) in &mut continued.slowdowns {
        if *to > last {
            *to = f64::INFINITY;
        }
    }
    continued.duration = end + model.budget.deadline_seconds;
    continued
}

/// Whether every consumer of a constant `replicas` completes what its partitions receive
/// on average over the run (at the consumer speed of its end): otherwise its queue, and the
/// age of what waits in it, grows from one such run to the next. The average, not the last
/// load, so a run that happens to end in a peak does not ask a constant count to carry it.
fn keeps_up_on_average(model: &Model, replicas: u32) -> bool {
    let last = (model.duration - model.step).max(0.0);
    let (arrivals, speed) = (mean_production_rate(model), model.replica_rate(last));
    let consumers = replicas.min(model.partitions).max(1) as usize;
    let even = 1.0 / f64::from(model.partitions.max(1));
    (0..consumers).all(|consumer| {
        let share: f64 = (consumer..model.partitions as usize)
            .step_by(consumers)
            .map(|partition| {
                model
                    .partition_shares
                    .get(partition)
                    .copied()
                    .unwrap_or(even)
            })
            .sum();
        arrivals * share <= speed * (1.0 + 1e-9)
    })
}

/// The smallest constant count with zero breach, by binary search between the floor and the
/// cap (more consumers of a constant count never breach more); `None` when the cap breaches.
pub(crate) fn static_count(model: &Model) -> Option<u32> {
    let (mut low, mut high) = (replica_floor(model), replica_cap(model));
    if !constant_keeps_deadline(model, high) {
        return None;
    }
    // Invariant: `high` keeps the deadline; every count below `low` does not.
    while low < high {
        let middle = low + (high - low) / 2;
        if constant_keeps_deadline(model, middle) {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    Some(high)
}

/// The static policy's run: its count from the start; the cap, with its breach, when no count
/// has zero.
pub(crate) fn simulate_static(model: &Model) -> SimulationResult {
    let count = static_count(model).unwrap_or_else(|| replica_cap(model));
    run(&starting_with(model, count), PolicyKind::Static, false)
}

/// Events produced per second over the whole run.
fn mean_production_rate(model: &Model) -> f64 {
    let steps = (model.duration / model.step).ceil().max(1.0) as usize;
    let total: f64 = (0..steps)
        .map(|i| {
            let t = i as f64 * model.step;
            model.production_rate(t) * model.step.min(model.duration - t)
        })
        .sum();
    total / model.duration
}
