//! How many replicas to run, decided by the deadline: the cheapest count whose predicted
//! oldest-age trajectory stays below the warning age, changed only when it must be or when the
//! change pays for its rebalance.
//!
//! - **Hold** the current count while it keeps the deadline if the recent past repeats, and
//!   while the cap could still recover from the next decision should today's λ last about as
//!   long as it already has. A short spike is absorbed by the time budget instead of by
//!   replicas sized for a peak that is over.
//! - **Scale up**, when holding fails, to the fewest replicas that keep the deadline at today's
//!   λ and if the recent past repeats: one step, sized for what is observed.
//! - **Scale down** only to a count that completes at least the recent mean λ, keeps the
//!   deadline with a margin both at today's λ and if the recent past repeats, and saves more
//!   replica-seconds over the horizon than its rebalance costs. At a constant λ that is the
//!   smallest count that keeps up, so the decision settles; no count that falls behind is ever
//!   entered and left again (the limit cycle of an economy mode).
//!
//! `targetDrainTime` bounds how long the events waiting now may wait: every plan completes
//! them within it. It is not the speed every backlog is drained at.

use super::demand_history::Replay;
use super::drain::group_capacity;
use super::trajectory::{Outlook, QueueNow, predict};

/// What the plan starts from.
#[derive(Clone, Copy, Debug)]
pub struct PlanInputs<'a> {
    pub queue: QueueNow,
    /// λ now.
    pub produce_rate: f64,
    /// λ of the recent past, which the forecast repeats.
    pub recent: &'a Replay,
    /// How long λ has been about what it is now (seconds).
    pub current_run_seconds: f64,
    /// Events per second one replica completes, after the share kept for retries.
    pub per_replica_rate: f64,
    pub partitions: u32,
    /// spec.replicas, already within [floor, cap].
    pub current: u32,
    pub ready: u32,
    pub floor: u32,
    pub cap: u32,
}

/// The budget's limits and the workload's reaction times, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlanSettings {
    /// warningAt × deadline: the oldest age no plan may predict.
    pub age_limit: f64,
    /// targetDrainTime: the events waiting now complete within it.
    pub drain_limit: f64,
    pub poll: f64,
    pub pod_start: f64,
    /// Consumption stops this long on every membership change (scaling.rebalanceCost).
    pub rebalance: f64,
    /// How far plans look ahead.
    pub horizon: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanReason {
    /// The current count keeps the deadline.
    Holding,
    /// The current count would not keep the deadline.
    ScaleUp,
    /// Fewer replicas keep it too, and the change pays for its rebalance.
    ScaleDown,
    /// Not even the cap keeps the deadline at today's λ.
    CapFallsShort,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan {
    pub replicas: u32,
    pub reason: PlanReason,
    /// The predicted trajectory at the chosen count (today's λ).
    pub outlook: Outlook,
}

/// Share of the age limit a plan may use when it is entered by a scale-up or held.
const HOLD_AGE_SHARE: f64 = 0.9;
/// Share of the age limit a lower count must stay under to be entered: the gap to
/// `HOLD_AGE_SHARE` is the hysteresis between scaling down and holding.
const DOWN_AGE_SHARE: f64 = 0.7;

pub fn plan(inputs: &PlanInputs<'_>, settings: &PlanSettings) -> Plan {
    let planner = Planner { inputs, settings };
    let current = inputs.current;
    let now_lambda = |_: f64| inputs.produce_rate;
    let hold_limit = HOLD_AGE_SHARE * settings.age_limit;

    let mean = if inputs.recent.is_empty() {
        inputs.produce_rate
    } else {
        inputs.recent.mean()
    };
    // A count that falls behind is held while the deadline has room: a slowdown or a peak may
    // be over before it matters. It is never entered by a scale-down, so holding it ends in
    // one scale-up at most, not in a cycle.
    // Should today's λ go on, the cap must still recover from the next decision. A level is
    // expected to last about as long as it has lasted so far, then the recent past repeats:
    // a spike seen for one poll is not planned as if it were the new load.
    let persisting = |t: f64| {
        if t < inputs.current_run_seconds + settings.poll {
            inputs.produce_rate
        } else {
            planner.repeated(t)
        }
    };
    let holds = planner.keeps(current, &persisting, hold_limit, true)
        && planner.keeps(current, &|t| planner.repeated(t), hold_limit, false);
    if holds {
        let down_limit = DOWN_AGE_SHARE * settings.age_limit;
        let mean = mean.max(inputs.produce_rate);
        let lower_ok = |k: u32| {
            planner.capacity(k) >= mean
                && planner.keeps(k, &now_lambda, down_limit, true)
                && planner.keeps(k, &|t| planner.repeated(t), down_limit, false)
                && planner.saving(current, k) > 0.0
        };
        if let Some(lower) = smallest(inputs.floor, current.saturating_sub(1), lower_ok)
            && lower < current
        {
            return planner.outcome(lower, PlanReason::ScaleDown);
        }
        return planner.outcome(current, PlanReason::Holding);
    }
    // Sized for today's λ over the whole horizon: one step, not a staircase that follows a
    // rising estimate of how long the level lasts.
    let enough = |k: u32| {
        planner.capacity(k) >= mean
            && planner.keeps(k, &now_lambda, hold_limit, false)
            && planner.keeps(k, &|t| planner.repeated(t), hold_limit, false)
    };
    match smallest(current.saturating_add(1), inputs.cap, enough) {
        Some(k) => planner.outcome(k, PlanReason::ScaleUp),
        None if current >= inputs.cap => planner.outcome(current, PlanReason::CapFallsShort),
        None => planner.outcome(inputs.cap, PlanReason::CapFallsShort),
    }
}

/// The smallest k in [low, high] for which `ok` holds, assuming `ok` is monotone in k (more
/// replicas never keep the deadline worse); `None` when even `high` fails.
fn smallest(low: u32, high: u32, ok: impl Fn(u32) -> bool) -> Option<u32> {
    if low > high || !ok(high) {
        return None;
    }
    let (mut low, mut high) = (low, high);
    while low < high {
        let middle = low + (high - low) / 2;
        if ok(middle) {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    Some(high)
}

struct Planner<'p, 'a> {
    inputs: &'p PlanInputs<'a>,
    settings: &'p PlanSettings,
}

impl Planner<'_, '_> {
    fn capacity(&self, replicas: u32) -> f64 {
        group_capacity(
            replicas,
            self.inputs.partitions,
            self.inputs.per_replica_rate,
        )
    }

    /// λ if the recent past repeats, after today's λ until the next decision.
    fn repeated(&self, t: f64) -> f64 {
        if t < self.settings.poll || self.inputs.recent.is_empty() {
            self.inputs.produce_rate
        } else {
            self.inputs.recent.rate_at(t - self.settings.poll)
        }
    }

    /// Completion capacity t seconds after going from `ready` ready replicas to `to`:
    /// new pods start, then everyone stops for the rebalance.
    fn transition(&self, ready: u32, to: u32, t: f64) -> f64 {
        let settings = self.settings;
        if to > ready {
            if t < settings.pod_start {
                self.capacity(ready)
            } else if t < settings.pod_start + settings.rebalance {
                0.0
            } else {
                self.capacity(to)
            }
        } else if to < ready && t < settings.rebalance {
            0.0
        } else {
            self.capacity(to)
        }
    }

    /// Running `replicas` from now (and, with `then_cap`, the cap from the next decision on)
    /// keeps the oldest age below `age_limit` and completes what waits now within the drain
    /// limit.
    fn keeps(
        &self,
        replicas: u32,
        arrivals: &dyn Fn(f64) -> f64,
        age_limit: f64,
        then_cap: bool,
    ) -> bool {
        let outlook = self.predict(replicas, arrivals, then_cap);
        outlook.peak_age <= age_limit
            && outlook
                .drained_at
                .is_some_and(|t| t <= self.settings.drain_limit.max(self.settings.poll))
    }

    fn predict(&self, replicas: u32, arrivals: &dyn Fn(f64) -> f64, then_cap: bool) -> Outlook {
        let (ready, cap, poll) = (self.inputs.ready, self.inputs.cap, self.settings.poll);
        let horizon = self.settings.horizon;
        predict(
            self.inputs.queue,
            arrivals,
            |t| {
                if then_cap && t >= poll {
                    let ready_then = if replicas > ready { ready } else { replicas };
                    self.transition(ready_then, cap, t - poll)
                } else {
                    self.transition(ready, replicas, t)
                }
            },
            horizon,
            (horizon / 150.0).max(1.0),
        )
    }

    /// Replica-seconds a lower count saves over the horizon, less what its rebalance costs
    /// (every remaining consumer stops for it).
    fn saving(&self, from: u32, to: u32) -> f64 {
        f64::from(from.saturating_sub(to)) * self.settings.horizon
            - f64::from(to) * self.settings.rebalance
    }

    fn outcome(&self, replicas: u32, reason: PlanReason) -> Plan {
        let outlook = self.predict(replicas, &|_| self.inputs.produce_rate, false);
        Plan {
            replicas,
            reason,
            outlook,
        }
    }
}

#[cfg(test)]
mod tests;
