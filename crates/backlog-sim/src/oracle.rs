//! The hindsight-optimal reference (`oracle`): the cheapest schedule with zero breach,
//! planned on a fluid model that knows the scenario's true production and consumer speed,
//! then verified on the real workload. Cost is replica-seconds plus the rebalance cost
//! (rebalanceCost × the new count) of every change.

mod fluid;
mod plan;
#[cfg(test)]
mod tests;

use super::policy::PolicyKind;
use super::run::{SimulationResult, run_policy};
use super::scenario::Model;
use super::schedule::{Replay, Schedule};
use super::static_reference::{
    constant_keeps_deadline, replica_cap, replica_floor, starting_with, static_count,
};

/// The fluid model approximates the real queues (substep checks, an even age across a
/// consumer's partitions), so a plan that breaches when run is planned again for a younger
/// oldest event, as fractions of the deadline.
const AGE_LIMITS: [f64; 8] = [1.0, 0.95, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4];

/// Runs longer than this plan in coarser buckets, so a day still plans in well under a second.
const LONG_RUN_SECONDS: f64 = 6.0 * 3600.0;

const LABEL: &str = "Oracle";

pub(crate) fn simulate_oracle(model: &Model) -> SimulationResult {
    let bucket_seconds = bucket_seconds(model);
    for fraction in AGE_LIMITS {
        let limit = model.budget.deadline_seconds * fraction;
        let Some(schedule) = plan::plan(model, bucket_seconds, limit) else {
            // A younger limit only makes planning harder.
            break;
        };
        let result = replay(model, schedule.clone());
        if result.summary.breach_seconds == 0.0 {
            return cheaper_than_constant(model, result, &schedule);
        }
    }
    fall_back_to_static(model)
}

/// Decision buckets: whole poll intervals (a policy acts only at a decision), about 30 s, or
/// about 60 s on a long run.
fn bucket_seconds(model: &Model) -> f64 {
    let poll = model.budget.poll_interval_seconds;
    let wanted = if model.duration > LONG_RUN_SECONDS {
        60.0
    } else {
        30.0
    };
    poll * (wanted / poll).round().max(1.0)
}

/// The run of a schedule, started with its first count ready.
fn replay(model: &Model, schedule: Schedule) -> SimulationResult {
    let started = starting_with(model, schedule.first());
    let policy = Replay {
        schedule,
        interval: model.budget.poll_interval_seconds,
        label: LABEL,
    };
    run_policy(&started, PolicyKind::Oracle, Box::new(policy), false)
}

/// What the oracle minimises: replica-seconds plus rebalanceCost × the count after every
/// change.
fn objective(model: &Model, result: &SimulationResult, schedule: &Schedule) -> f64 {
    let changed: u32 = schedule.changes().sum();
    result.summary.replica_seconds + model.budget.rebalance_cost_seconds * f64::from(changed)
}

/// The verified plan, unless a constant count keeps the deadline for no more (the fluid
/// model's approximations can make a plan worse than the static reference).
fn cheaper_than_constant(
    model: &Model,
    result: SimulationResult,
    schedule: &Schedule,
) -> SimulationResult {
    let cost = objective(model, &result, schedule);
    // The most replicas a constant count could run and still cost no more than the plan: if
    // that count breaches, so does every smaller one, and the plan is the cheaper.
    let affordable = (cost / model.duration).floor();
    if affordable < f64::from(replica_floor(model)) {
        return result;
    }
    let affordable = (affordable as u32).min(replica_cap(model));
    if !constant_keeps_deadline(model, affordable) {
        return result;
    }
    let count = static_count(model).unwrap_or(affordable);
    replay(model, Schedule::constant(count))
}

/// No plan verified: the static reference (the cap, with its breach, when nothing keeps the
/// deadline).
fn fall_back_to_static(model: &Model) -> SimulationResult {
    let count = static_count(model).unwrap_or_else(|| replica_cap(model));
    replay(model, Schedule::constant(count))
}
