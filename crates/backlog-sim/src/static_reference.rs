//! The reference a budget must beat: the cheapest constant replica count that keeps the
//! deadline, started with that count ready.

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

/// Whether a constant `replicas` keeps the deadline all run (the probe stops at the first
/// breach).
pub(crate) fn constant_keeps_deadline(model: &Model, replicas: u32) -> bool {
    run(&starting_with(model, replicas), PolicyKind::Static, true)
        .summary
        .breach_seconds
        == 0.0
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
