//! How many replicas to run, decided by the deadline: the cheapest count whose predicted
//! oldest-age trajectory stays below the age limit, changed only when it must be or when the
//! change pays for its rebalance.
//!
//! Replicas cost money only while they idle: every count that changes the partition
//! assignment completes about the same events per replica-second while it has work. So the
//! plan keeps consumers busy and spends the time the deadline leaves instead of replicas.
//!
//! - **Hold** the current count for as long as the deadline still allows acting at the next
//!   decision: should today's λ last, the fewest replicas that complete it, started then, keep
//!   the oldest age below the limit. When no count completes λ, the cap must, with λ lasting
//!   about as long as it has so far. A peak that ends before that costs no replicas at all.
//!   A count that carries a recurring load over its period holds through its peak, for as
//!   long as the last peak lasted.
//! - **Cost** of a count over the cost window (`economy_dwell`, at least the horizon): it runs
//!   until holding it no longer leaves time to act, then the keep-up count runs for the rest,
//!   with today's λ lasting about as long as it has and the recent past after that. Where
//!   the load alternates, the count kept up with then is the forecast's mean, not today's
//!   peak. Every change pays its rebalance.
//! - **Change** to the cheapest count the deadline allows: up to any count that leaves time to
//!   act (even one still behind λ, if it leaves that time for as long as a reaction takes:
//!   one replaced before its pods work buys a rebalance and nothing else), down to one that
//!   also keeps a margin below the limit and carries a peak that has returned lately (a load
//!   that alternates is not chased down at its trough, nor below its mean where a count
//!   short of the peak's carries the mean; a one-off peak is not expected back).
//!   When holding fails, the cheapest count that brings the age back below the limit; the
//!   cap when none does.
//! - **Economy** is a count that completes less than λ, entered by a scale-down: only when it
//!   keeps the margin over the whole horizon, saves a tenth of what the keep-up count costs,
//!   and economy was not left within `economy_dwell` at about the same load
//!   ([`super::economy`]). So a steady load whose keep-up count idles is served for less,
//!   with at most one planned pair of rebalances per dwell, and never a limit cycle.
//! - Past the critical fraction of the deadline, the cap until the age is back.
//!
//! `targetDrainTime` bounds how long the events waiting now may wait: every plan completes
//! them within it, or within a poll of when a scale-up asked for now works where its pods
//! start and rebalance later than that (no count drains sooner). It is not the speed every
//! backlog is drained at. A queue that a count only just keeps up with may stay behind
//! them, but only while its age leaves a spike the time a reaction takes (two polls, a pod
//! start, a rebalance) before the critical age; otherwise it must be gone a reaction later.

use super::demand_history::Replay;
use super::drain::{group_capacity, skewed_group_capacity};
use super::trajectory::{Outlook, QueueNow, Steps, predict, predict_watching};

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
    /// Seconds after the end of `recent` at which this plan starts: 0 for a plan made now,
    /// the scale-down window's wait for a count judged by the time it will be followed
    /// (a load that recurs is then at another phase of its period).
    pub ahead_seconds: f64,
    /// Events per second one replica completes, after the share kept for retries.
    pub per_replica_rate: f64,
    pub partitions: u32,
    /// The share of arrivals a hot partition receives, when one does (its consumer is then
    /// the busiest).
    pub hot_share: Option<f64>,
    /// spec.replicas, already within [floor, cap].
    pub current: u32,
    pub ready: u32,
    /// Seconds until the pods already asked for (up to `current`) are expected ready.
    pub starting_in: f64,
    pub floor: u32,
    pub cap: u32,
    /// Whether economy may be entered now (enabled, and not left within its dwell).
    pub economy_allowed: bool,
    /// For each count below `current` (indexed by count), seconds until a scale-down to it
    /// would be followed (the scale-down window); counts beyond the slice wait `down_delay`.
    pub down_waits: &'a [f64],
    /// `per_replica_rate` is only a lower bound: the consumers were never seen saturated.
    pub capacity_is_lower_bound: bool,
    /// With no configured rate, the bound (a saturated measurement gone stale, or what idle
    /// consumers showed since) is below this, the most per replica the consumers were seen
    /// to complete: they may have recovered to it from a slowdown, and only fewer replicas
    /// show that, so a probe is allowed even after the budget's first change, to a count
    /// that keeps up if they have. `None` outside that case or within a stale period of
    /// the last probe.
    pub recovered_rate: Option<f64>,
    /// The backlog rose since the previous decision: some consumers are saturated, and the
    /// bound is what they complete, not an idle group's.
    pub backlog_rising: bool,
    /// How long fewer replicas must run, saturated, before their completions are a
    /// measurement (pods, rebalance, the rate window settling, a poll to see it).
    pub measurement_seconds: f64,
    /// Seconds since fewer replicas were last tried to learn the capacity: the try is held
    /// until it could be measured.
    pub probed_seconds_ago: Option<f64>,
    /// Seconds since the replicas last changed.
    pub changed_seconds_ago: Option<f64>,
    /// The oldest age the last change was asked to stay under, when it raised the replicas
    /// (a scale-up's `Plan::up_limit`).
    pub raised_under: Option<f64>,
}

/// The budget's limits and the workload's reaction times, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlanSettings {
    /// warningAt × deadline: the oldest age no plan may predict.
    pub age_limit: f64,
    /// criticalAt × deadline: past it, every replica the cap allows works until it recovers.
    pub critical_age: f64,
    /// The completion deadline: a spike seen once must be met within it, should it return.
    pub deadline: f64,
    /// targetDrainTime: the events waiting now complete within it (or within a poll of when
    /// a scale-up asked for now works, if that is later).
    pub drain_limit: f64,
    pub poll: f64,
    pub pod_start: f64,
    /// Consumption stops this long on every membership change (scaling.rebalanceCost).
    pub rebalance: f64,
    /// How far plans look ahead.
    pub horizon: f64,
    /// scaling.scaleDownStabilization: how long a scale-down waits at most.
    pub down_delay: f64,
    /// How far costs are compared, and how long economy stays closed after it ended
    /// (scaling.economyDwell; 0 = no economy).
    pub economy_dwell: f64,
    /// The rate window λ is read through: a step shows as a rise this long.
    pub rate_window: f64,
}

impl PlanSettings {
    /// When what waits now must be complete: the drain limit, but no sooner than a poll after
    /// a scale-up asked for now works (its pods start, the group rebalances). A limit that
    /// ends before then is met by no count, and every backlog that needed more replicas went
    /// to the cap. The same for every count: measured from each count's own start, a count
    /// asked for later would be granted more time than one whose pods are already starting,
    /// and every poll would ask for more.
    pub fn drain_by(&self) -> f64 {
        self.drain_limit
            .max(self.pod_start + self.rebalance + self.poll)
    }

    /// How long economy must keep the margin at today's λ to be entered: the horizon, and
    /// at least half the dwell.
    pub fn economy_stay(&self) -> f64 {
        self.horizon.max(self.economy_dwell / 2.0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanReason {
    /// The current count keeps the deadline, or leaves time to act at the next decision.
    Holding,
    /// Holding any longer would let the oldest age pass the limit, or keep the events
    /// waiting now past the drain limit.
    ScaleUp,
    /// Fewer replicas keep it too, and the change pays for its rebalance.
    ScaleDown,
    /// The capacity is only a lower bound and the group idles: fewer replicas, safe even at
    /// that bound, either keep up (the bound rises) or get saturated (it is measured).
    Probe,
    /// Not even the cap keeps the deadline at today's λ.
    CapFallsShort,
    /// The oldest event is past the critical fraction: the cap, until it recovers.
    Recovering,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan {
    pub replicas: u32,
    pub reason: PlanReason,
    /// The chosen count completes less than today's λ: the age grows, within the limit,
    /// until a scale-up to `keep_up`.
    pub falls_behind: bool,
    /// The fewest replicas that complete today's λ (none: not even the cap does).
    pub keep_up: Option<u32>,
    /// The chosen count falls behind a recurring peak and catches up after it, as after the
    /// last ones: no scale-up to `keep_up` is planned.
    pub rides_out: bool,
    /// The predicted trajectory of the plan at today's λ: the chosen count, and the keep-up
    /// count from the next decision when the chosen one falls behind.
    pub outlook: Outlook,
    /// The oldest age a scale-up asked for now is planned to stay under; the count it asks
    /// for is held to it, not to the hold limit, while that count turns the age.
    pub up_limit: f64,
}

/// Share of the age limit a plan may use when it is entered by a scale-up or held.
const HOLD_AGE_SHARE: f64 = 0.9;
/// Share of the age limit a lower count must stay under to be entered: the gap to
/// `HOLD_AGE_SHARE` is the hysteresis between scaling down and holding.
const DOWN_AGE_SHARE: f64 = 0.7;
/// How far below λ the fullest count's capacity at the bound may read and still be λ: the
/// bound is λ / ready, and its product with the count only rounds back to λ.
const BOUND_ROUNDING: f64 = 1e-9;
/// Completions within this share of λ keep up with it (rates read through windows differ
/// by a little).
pub(crate) const KEEPS_UP_SHARE: f64 = 0.99;
/// Economy must save at least this share of what the keep-up count costs over the dwell:
/// less is within the error of the capacity estimate, and not worth two rebalances and an
/// age near the warning fraction.
const ECONOMY_MIN_SAVING: f64 = 0.1;

pub fn plan(inputs: &PlanInputs<'_>, settings: &PlanSettings) -> Plan {
    let planned = plan_for_queue(inputs, settings);
    // A scale-up's limit follows the age once the age plus a reaction passes the hold limit
    // (`up_limit`): no count can undo the age events already have. Past that point an older
    // queue could be allowed fewer replicas than a younger one was asked for; it never is:
    // it gets at least what the queue would get at that point.
    let planner = Planner { inputs, settings };
    let pivot = (HOLD_AGE_SHARE * settings.age_limit - planner.reaction_seconds()).max(0.0);
    if inputs.queue.oldest_age <= pivot || planned.reason == PlanReason::Recovering {
        return planned;
    }
    let younger_inputs = PlanInputs {
        queue: QueueNow {
            oldest_age: pivot,
            ..inputs.queue
        },
        ..*inputs
    };
    let younger = plan_for_queue(&younger_inputs, settings);
    if younger.replicas > planned.replicas {
        planner.outcome(younger.replicas, younger.reason)
    } else {
        planned
    }
}

/// The plan for the queue as it is.
fn plan_for_queue(inputs: &PlanInputs<'_>, settings: &PlanSettings) -> Plan {
    let planner = Planner { inputs, settings };
    let current = inputs.current;
    if inputs.queue.backlog > 0.0 && inputs.queue.oldest_age >= settings.critical_age {
        return planner.outcome(planner.fullest().max(current), PlanReason::Recovering);
    }
    let hold_limit = HOLD_AGE_SHARE * settings.age_limit;
    // A scale-up asked for when the age is near the limit lets it grow for a reaction time
    // before the new pods work (`up_limit`). The count it asked for is judged by the limit it
    // was asked under while it completes more than arrives: by the lower one, the age it was
    // allowed would ask for more at every poll, each ask another rebalance that delays the
    // turn. An age that passes that limit, or past the hold limit at a count not asked for by
    // a scale-up, asks for more whatever the model says: the model may be what is wrong.
    let up_limit = planner.up_limit();
    let asked_under = inputs
        .raised_under
        .filter(|_| planner.capacity(current) >= inputs.produce_rate)
        .map_or(hold_limit, |limit| limit.max(hold_limit));
    let holds_if_lambda_lasts = planner.holds_if_lambda_lasts(current, asked_under);
    let rides_out = !holds_if_lambda_lasts && planner.rides_out_peak(current, asked_under);
    let holds = holds_if_lambda_lasts || rides_out;
    // A probe is held until it is measured, unless the deadline needs more: undone earlier
    // it taught nothing for its two rebalances. It tests something only while, at the bound,
    // it falls behind λ: once λ is down to what the bound carries, the consumers idle and
    // the probe can show no more than the bound says already.
    let probing = inputs.capacity_is_lower_bound
        && inputs
            .probed_seconds_ago
            .is_some_and(|ago| ago < inputs.measurement_seconds)
        && planner.capacity(current) < inputs.produce_rate;
    if probing && (holds || planner.probe_holds(hold_limit)) {
        return planner.outcome(current, PlanReason::Probe);
    }
    // A probe goes below any count the bound allows: it comes first, or a scale-down to
    // that count would be the budget's first change and leave no probe.
    if holds && let Some(probe) = probe_count(&planner, hold_limit) {
        return planner.outcome(probe, PlanReason::Probe);
    }
    if holds && let Some((lower, rides_out)) = cheaper_lower_count(&planner, hold_limit) {
        return Plan {
            rides_out,
            ..planner.outcome(lower, PlanReason::ScaleDown)
        };
    }
    // A scale-up that comes when the age is already past the limit must stop its growth
    // once the new pods work (`up_limit`); no count can undo the age events already have.
    let keep_up_cost = planner.keep_up_count().map(|k| planner.cost(k, hold_limit));
    let higher = planner
        .useful(current.saturating_add(1), inputs.cap)
        .filter(|&k| planner.holds(k, up_limit) && planner.works_before_replaced(k, hold_limit))
        .map(|k| (k, planner.cost(k, hold_limit)))
        .filter(|&(k, cost)| planner.economy_worth(k, cost, keep_up_cost))
        .map(|(k, cost)| (k, cost + settings.rebalance * f64::from(k)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    match higher {
        // While the current count holds, a scale-up must save a share of its cost: a smaller
        // saving is within the error of the estimates, and near such ties the choice would
        // flip between polls, or give more waiting work fewer replicas.
        Some((k, cost))
            if holds && cost < (1.0 - ECONOMY_MIN_SAVING) * planner.cost(current, hold_limit) =>
        {
            planner.outcome(k, PlanReason::ScaleUp)
        }
        _ if holds => Plan {
            rides_out,
            ..planner.outcome(current, PlanReason::Holding)
        },
        Some((k, _)) if k < inputs.cap || planner.keep_up_count().is_some() => {
            planner.outcome(k, PlanReason::ScaleUp)
        }
        _ => planner.outcome(planner.fullest().max(current), PlanReason::CapFallsShort),
    }
}

/// The cheapest count below the current one that the deadline allows, if it costs less than
/// holding. A scale-down is followed only after the scale-down window, so each count is judged
/// by the queue it will meet then: a backlog that drains meanwhile leads to one step down, not
/// a staircase that follows the drain. Also says whether the count rides out recurring peaks
/// it falls behind at (rather than entering economy).
fn cheaper_lower_count(planner: &Planner<'_, '_>, hold_limit: f64) -> Option<(u32, bool)> {
    let (inputs, settings) = (planner.inputs, planner.settings);
    let current = inputs.current;
    let lambda = inputs.produce_rate;
    let down_limit = DOWN_AGE_SHARE * settings.age_limit;
    planner
        .useful(inputs.floor, current.saturating_sub(1))
        .filter_map(|k| {
            let wait = planner.down_wait(k);
            let outlook = planner.predict(current, current, &|_| lambda, wait);
            let later_inputs = PlanInputs {
                queue: planner.queue_after(&outlook, wait),
                ahead_seconds: inputs.ahead_seconds + wait,
                ready: if wait > 0.0 { current } else { inputs.ready },
                starting_in: (inputs.starting_in - wait).max(0.0),
                ..*inputs
            };
            let later = Planner {
                inputs: &later_inputs,
                settings,
            };
            let falls_behind = later.capacity(k) < lambda;
            let rides_out = falls_behind && later.rides_out_recurring_peaks(k, down_limit);
            let allowed = later.holds(k, hold_limit)
                && later.carries_returning_peaks(k, down_limit)
                && later.recovers_if_peak_returns(k, hold_limit)
                && (!falls_behind
                    || rides_out
                    || (inputs.economy_allowed && later.economy_lasts(k, down_limit)));
            if !allowed {
                return None;
            }
            let cost = later.cost(k, hold_limit);
            let keep_up_cost = later.keep_up_count().map(|up| later.cost(up, hold_limit));
            let cheaper =
                cost + settings.rebalance * f64::from(k) < later.cost(current, hold_limit);
            (cheaper && later.economy_worth(k, cost, keep_up_cost)).then_some((k, cost, rides_out))
        })
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(k, _, rides_out)| (k, rides_out))
}

/// Idle consumers that were never saturated complete what arrives: per replica that is only
/// a lower bound of their capacity, and it sizes the group for its own idleness (the count
/// it has only just keeps up at the bound). The fewest replicas from which, even at the
/// bound, the fullest count asked for once they could be measured brings the age back below
/// the lower limit and drains in time, are tried: they either keep up (the bound rises to λ over
/// them) or get saturated (the capacity is measured), and in both cases the next decisions
/// plan with what is then known. One step, not a staircase: each step would pay a window
/// and a rebalance.
fn probe_count(planner: &Planner<'_, '_>, hold_limit: f64) -> Option<u32> {
    let (inputs, settings) = (planner.inputs, planner.settings);
    let lambda = inputs.produce_rate;
    // Idle: little waits, and the ready replicas complete λ at the bound (the bound is their
    // completions per replica: below λ, they are falling behind, so saturated already).
    let idle = lambda > 0.0
        && !inputs.backlog_rising
        && inputs.queue.backlog <= lambda * settings.poll
        && f64::from(inputs.ready) * inputs.per_replica_rate >= KEEPS_UP_SHARE * lambda;
    // A probe costs two changes, so it is how a budget starts, not something it does at a
    // load it has settled at: only before the budget's first change (a probe is one, so it
    // is tried once; one that ended without a measurement left a higher bound), or once per
    // stale period where the consumers may have recovered from a slowdown.
    let started = inputs.changed_seconds_ago.is_some() && inputs.recovered_rate.is_none();
    if !inputs.capacity_is_lower_bound || !idle || started {
        return None;
    }
    // Idle consumers at the fullest count show only λ / ready: at the bound the way back
    // completes what arrives and hardly more, and may never drain what a probe leaves.
    // Asking it to, a group deployed at the partition count without a prior stayed there
    // for good. The probe is judged by its age instead: should the consumers have no more
    // room than the bound, the backlog it leaves stands (or drains slowly) at the way back
    // with its oldest event within the down limit; consumers with no room would not idle.
    let way_back = planner.probe_way_back()?;
    let down_limit = DOWN_AGE_SHARE * settings.age_limit;
    // A probe undone before it is measured teaches nothing and costs two rebalances: it must
    // be able to last until its completions are a measurement.
    let lasts = inputs.measurement_seconds.max(2.0 * settings.poll);
    // The backlog the try leaves must be gone within targetDrainTime of the way back being
    // ready: a way back that only just keeps up at the bound would hold it for good.
    let back_by = lasts + settings.pod_start + settings.rebalance + settings.drain_limit;
    // A stale measurement is tested by the count that keeps up if the consumers recovered:
    // fewer would only measure the slowdown again, at a higher price in age.
    let recovered_keeps_up = |k: u32| {
        inputs
            .recovered_rate
            .is_none_or(|rate| group_capacity(k, inputs.partitions, rate) >= lambda)
    };
    planner
        .useful(inputs.floor, inputs.current.saturating_sub(1))
        .filter(|&k| recovered_keeps_up(k))
        .find(|&k| {
            let outlook = planner.predict_switching(
                k,
                way_back,
                lasts,
                &|_| lambda,
                settings.horizon.max(back_by),
            );
            outlook.peak_age <= down_limit
                && planner.carries_returning_peaks(k, down_limit)
                && planner.recovers_if_peak_returns(k, hold_limit)
        })
}

struct Planner<'p, 'a> {
    inputs: &'p PlanInputs<'a>,
    settings: &'p PlanSettings,
}

impl Planner<'_, '_> {
    fn capacity(&self, replicas: u32) -> f64 {
        let (partitions, rate) = (self.inputs.partitions, self.inputs.per_replica_rate);
        match self.inputs.hot_share {
            Some(share) => skewed_group_capacity(replicas, partitions, rate, share),
            None => group_capacity(replicas, partitions, rate),
        }
    }

    /// The counts that change the partition assignment in [low, high], ascending.
    fn useful(&self, low: u32, high: u32) -> impl Iterator<Item = u32> + '_ {
        (low.max(1)..=high)
            .filter(move |&k| k == self.inputs.floor || self.capacity(k) > self.capacity(k - 1))
    }

    /// A probe is held while, should the consumers have no more room than the bound, the
    /// backlog it leaves until it is measured stands or drains at the way back with its
    /// oldest event within `hold_limit`: where the way back only just keeps up at the bound,
    /// no count drains it in time, and the scale-up rule would undo the probe at its first
    /// poll, before it taught anything.
    fn probe_holds(&self, hold_limit: f64) -> bool {
        let inputs = self.inputs;
        let lambda = inputs.produce_rate;
        let (Some(way_back), Some(ago)) = (self.probe_way_back(), inputs.probed_seconds_ago) else {
            return false;
        };
        let remaining = (inputs.measurement_seconds - ago).max(0.0);
        let back_by = remaining + self.settings.pod_start + self.settings.rebalance;
        self.predict_switching(
            inputs.current,
            way_back,
            remaining.max(self.settings.poll),
            &|_| lambda,
            self.settings.horizon.max(back_by),
        )
        .peak_age
            <= hold_limit
    }

    /// The count a probe goes back to (the fullest, or the group's own if larger), where at
    /// the bound it completes λ at least: below λ it would fall behind too, and no probe
    /// has a way back.
    fn probe_way_back(&self) -> Option<u32> {
        let way_back = self.fullest().max(self.inputs.current);
        (self.capacity(way_back) >= self.inputs.produce_rate * (1.0 - BOUND_ROUNDING))
            .then_some(way_back)
    }

    /// The fewest replicas that complete what the cap completes: beyond them a consumer
    /// more gets no partition of its own to relieve the busiest one. Judged on the partition
    /// count alone: a hot partition seen at one poll must not take the cap's replicas away.
    fn fullest(&self) -> u32 {
        let (partitions, rate) = (self.inputs.partitions, self.inputs.per_replica_rate);
        let floor = self.inputs.floor.max(1);
        (floor..=self.inputs.cap.max(floor))
            .rev()
            .find(|&k| {
                k == floor
                    || group_capacity(k - 1, partitions, rate) < group_capacity(k, partitions, rate)
            })
            .unwrap_or(self.inputs.cap)
    }

    /// The smallest count that keeps up with today's λ, if any does: one that completes
    /// exactly λ keeps the backlog and its age where they are.
    fn keep_up_count(&self) -> Option<u32> {
        let lambda = self.inputs.produce_rate;
        self.useful(self.inputs.floor, self.inputs.cap)
            .find(|&k| self.capacity(k) >= lambda)
    }

    fn recent_mean(&self) -> f64 {
        if self.inputs.recent.is_empty() {
            self.inputs.produce_rate
        } else {
            self.inputs.recent.mean()
        }
    }

    /// λ if the recent past repeats, after today's λ until the next decision.
    fn repeated(&self, t: f64) -> f64 {
        if t < self.settings.poll || self.inputs.recent.is_empty() {
            self.inputs.produce_rate
        } else {
            self.inputs.recent.rate_at(t - self.settings.poll)
        }
    }

    /// Today's λ for about as long as it has lasted so far, then the recent past repeating:
    /// a peak seen for one poll is not planned as the new load.
    fn persisting(&self, t: f64) -> f64 {
        if t < self.inputs.current_run_seconds + self.settings.poll {
            self.inputs.produce_rate
        } else {
            self.repeated(t)
        }
    }

    /// A load that rose above what `replicas` completes more than once lately is expected
    /// to do so again: then `replicas` must carry its next period itself, since the peak
    /// returns before a scale-up pays off (a one-off peak is left to the next decisions).
    fn carries_returning_peaks(&self, replicas: u32, limit: f64) -> bool {
        let Some(period) = self.inputs.recent.recurring_above(self.capacity(replicas)) else {
            return true;
        };
        if !self.carries_mean_or_no_count_between(replicas, &period) {
            return false;
        }
        let poll = self.settings.poll;
        let lambda = self.inputs.produce_rate;
        let ahead = self.inputs.ahead_seconds;
        // Today's λ until the next decision, then the last period from the phase it will be
        // at; a plan that starts later starts at a later phase.
        let arrivals = |t: f64| {
            if t < poll && ahead <= 0.0 {
                lambda
            } else {
                period.rate_at((t - poll + ahead).max(0.0))
            }
        };
        self.keeps(replicas, &arrivals, limit, self.settings.horizon)
    }

    /// A count that carries a load which keeps returning above it over its period (it
    /// catches up at the trough what it falls behind at the peak) rides today's peak out:
    /// falling behind λ now is that peak, as long as it has not lasted longer than the last
    /// one did. Sized for today's λ instead, a count short of the peak asked for the next
    /// count at every peak and, where the trough is shorter than the scale-down window,
    /// never came back to the one that carried the load.
    fn rides_out_recurring_peaks(&self, replicas: u32, limit: f64) -> bool {
        let level = self.capacity(replicas);
        let Some((lasted_before, lasting_now)) =
            self.inputs.recent.recurring_stretches_above(level)
        else {
            return false;
        };
        lasting_now <= lasted_before + self.settings.poll
            && self.carries_returning_peaks(replicas, limit)
    }

    /// A count below the period's mean falls further behind every period, so it lasts only
    /// until a scale-up, and then comes back: a cycle. That cycle is the cheaper way only
    /// where the count that carries the mean also carries the peak; where a count in between
    /// carries the mean, it is held instead.
    fn carries_mean_or_no_count_between(&self, replicas: u32, period: &Replay) -> bool {
        let mean = period.mean();
        if self.capacity(replicas) >= KEEPS_UP_SHARE * mean {
            return true;
        }
        let fewest_carrying = |rate: f64| {
            self.useful(replicas, self.inputs.cap)
                .find(|&k| self.capacity(k) >= KEEPS_UP_SHARE * rate)
                .unwrap_or(self.inputs.cap)
        };
        fewest_carrying(mean) >= fewest_carrying(period.peak())
    }

    /// Should λ return to the highest of the recent past right away, the count that carries
    /// it, asked for at the next decision, brings it back in time: a scale-down is only as
    /// safe as the way back (pods start, the group rebalances). A peak beyond what the cap
    /// completes is taken at the cap's rate: no count carries more.
    ///
    /// A peak that rose above `replicas`' completions more than once lately, or lasted half
    /// the horizon or more, is taken to last the horizon and held to `limit`; it comes back
    /// as fast as it climbed there from what `replicas` complete within the window, at once
    /// where the window saw no such climb (a slow climb is read in time to follow). A spike
    /// seen once is a guess about the future: it returns as long and as high as it was seen
    /// and must only be met within the deadline: the line no event may cross, not the margins
    /// kept for the load the plan expects. Held to a stricter test, a short spike the budget
    /// met once would keep the count it asked for until the spike leaves the demand window,
    /// up to twice the horizon: insurance against an age that stays within the deadline
    /// anyway.
    fn recovers_if_peak_returns(&self, replicas: u32, limit: f64) -> bool {
        let cap = self.inputs.cap;
        let lambda = self.inputs.produce_rate;
        let level = self.capacity(replicas);
        if lambda.max(self.inputs.recent.peak()) <= level {
            return true;
        }
        let back_for = |peak: f64| {
            let peak = peak.min(self.capacity(cap));
            self.useful(replicas, cap)
                .find(|&k| self.capacity(k) >= peak)
                .unwrap_or(cap)
        };
        // A spike, not a level: it went, it came once, and it lasted less than half the
        // horizon (a load that stopped after most of the window is expected back as it was).
        // A window that began above the level saw it once before the rise within it.
        let once = lambda <= level
            && self.inputs.recent.recurring_above(level).is_none()
            && !self.inputs.recent.rose_again_above(level);
        let spike = self
            .inputs
            .recent
            .peak_above(level)
            .filter(|peak| once && peak.span() <= self.settings.horizon / 2.0);
        match spike {
            Some(peak) => {
                let lasts = peak.span();
                let arrivals = |t: f64| if t < lasts { peak.rate_at(t) } else { lambda };
                self.predict(
                    replicas,
                    back_for(peak.peak()),
                    &arrivals,
                    self.settings.horizon,
                )
                .peak_age
                    <= self.settings.deadline
            }
            None => {
                let peak = self
                    .inputs
                    .recent
                    .peak()
                    .max(lambda)
                    .min(self.capacity(cap));
                // From today's λ where it is above the count already.
                let rise = self.rise_seconds(level, peak);
                let arrivals = |t: f64| {
                    if t < rise {
                        (level + (peak - level) * t / rise).max(lambda)
                    } else {
                        peak
                    }
                };
                self.predict(replicas, back_for(peak), &arrivals, self.settings.horizon)
                    .peak_age
                    <= limit
            }
        }
    }

    /// The shortest time λ took within the window to climb from `level` to `peak`, less the
    /// rate window (a step read through the window shows as a rise that long): a load
    /// returns as fast as it came, not faster. Zero, a jump, where the window saw no climb.
    fn rise_seconds(&self, level: f64, peak: f64) -> f64 {
        self.inputs
            .recent
            .fastest_rise(level, peak)
            .map_or(0.0, |rise| (rise - self.settings.rate_window).max(0.0))
    }

    /// Holding `current` until the next decision leaves the deadline reachable: should
    /// today's λ last, the smallest count that keeps up with it, started at the next
    /// decision, keeps the age below `limit`; when none keeps up, the cap does if today's λ
    /// lasts about as long as it has. Or, where today's λ is a recurring peak above
    /// `current`, `current` rides it out.
    fn holds(&self, current: u32, limit: f64) -> bool {
        self.holds_if_lambda_lasts(current, limit) || self.rides_out_peak(current, limit)
    }

    /// Today's λ is a recurring peak above `current`, and `current` rides it out.
    fn rides_out_peak(&self, current: u32, limit: f64) -> bool {
        self.capacity(current) < self.inputs.produce_rate
            && self.rides_out_recurring_peaks(current, limit)
    }

    /// [`Self::holds`] with today's λ taken to last.
    fn holds_if_lambda_lasts(&self, current: u32, limit: f64) -> bool {
        let lambda = self.inputs.produce_rate;
        let horizon = self.settings.horizon;
        match self.keep_up_count() {
            // Only the cap completes λ, and no more: what waits when it starts never drains.
            Some(next) if next >= self.inputs.cap && self.capacity(next) <= lambda => {
                current >= self.inputs.cap
            }
            Some(next) => {
                let then = next.max(current);
                self.keeps_then(current, then, &|_| lambda, limit, horizon)
                    && (self.capacity(current) < lambda || self.leaves_room_to_react(current, then))
            }
            // A load the cap cannot carry on average ages the backlog at every count: each
            // second below the cap only makes the breach bigger.
            None if self.recent_mean() >= self.capacity(self.inputs.cap) => {
                current >= self.inputs.cap
            }
            None => self.keeps_then(
                current,
                self.inputs.cap,
                &|t| self.persisting(t),
                limit,
                horizon,
            ),
        }
    }

    /// Running `now` until the next decision and `then` from it leaves a spike the time a
    /// reaction takes before the critical age: a reaction after [`Self::drain_by`], the queue
    /// is gone (no more than a poll's arrivals wait), or the age it keeps is that far below
    /// the critical age. A count that only just keeps up completes the events waiting now,
    /// but the queue behind them stays with its age; where a pod start and a rebalance are a
    /// large share of the deadline, that age is room a spike would need.
    ///
    /// A queue gone a reaction after `drain_by` does not stand. Judged at `drain_by` itself,
    /// which a pod start and a rebalance fill but for a poll, only the cap drained a queue
    /// that grew while λ climbed past the count: the budget went from one count short to
    /// the cap and back, where a count or two more drain it a minute later.
    ///
    /// Where a reaction takes longer than the critical age even from an empty queue, no
    /// queue leaves room and draining one buys nothing: the rule does not apply.
    fn leaves_room_to_react(&self, now: u32, then: u32) -> bool {
        let reaction = self.reaction_seconds();
        if reaction >= self.settings.critical_age {
            return true;
        }
        let lambda = self.inputs.produce_rate;
        let poll = self.settings.poll;
        let within = self.settings.drain_by() + reaction;
        let outlook = self.predict(now, then, &|_| lambda, within);
        outlook.end_backlog <= lambda * poll
            || outlook.end_age + reaction <= self.settings.critical_age
    }

    /// From deciding to scale up until the new count works: the next decision may see data
    /// a poll old, then pods start and the group rebalances.
    fn reaction_seconds(&self) -> f64 {
        2.0 * self.settings.poll + self.settings.pod_start + self.settings.rebalance
    }

    /// Replica-seconds `replicas` is expected to cost over the cost window: it runs until
    /// holding it no longer leaves time to act, then a count that keeps up with what the
    /// forecast brings for the rest of the window (the cap when none does) runs, after its
    /// rebalance.
    fn cost(&self, replicas: u32, limit: f64) -> f64 {
        let window = self.cost_window();
        let after = self
            .leaves_time_to_act_for(replicas, limit)
            .filter(|&at| at < window)
            .map(|at| (at, self.carries_rest_of_window(replicas, at, window)));
        match after {
            Some((at, after)) if after > replicas => {
                f64::from(replicas) * at
                    + f64::from(after) * (window - at)
                    + self.settings.rebalance * f64::from(after)
            }
            _ => f64::from(replicas) * window,
        }
    }

    /// How long `replicas`, run from now under the forecast, leaves time to act before the
    /// oldest age passes `limit` (none: for the whole cost window).
    fn leaves_time_to_act_for(&self, replicas: u32, limit: f64) -> Option<f64> {
        let window = self.cost_window();
        predict_watching(
            self.inputs.queue,
            |t| self.persisting(t),
            |t| self.transition(self.inputs.ready, replicas, t),
            window,
            // Only when the age reaches the limit, less a reaction, is asked: a 150th of
            // the window resolves that.
            (window / 150.0).max(1.0),
            (limit - self.reaction_seconds()).max(0.0),
        )
        .reached_at
    }

    /// A count that falls behind λ is worth asking for only if it can work before it must
    /// be replaced: asked for now, it must leave time to act until its pods have started,
    /// the group has rebalanced and a decision has seen it. One replaced sooner pays a
    /// rebalance (the whole group stops) for nothing, and repeated at each poll it is a
    /// staircase of scale-ups through a single peak.
    fn works_before_replaced(&self, replicas: u32, limit: f64) -> bool {
        self.capacity(replicas) >= self.inputs.produce_rate
            || self
                .leaves_time_to_act_for(replicas, limit)
                .is_none_or(|at| at >= self.reaction_seconds())
    }

    /// The count that takes over from `replicas` at `from` for the rest of the cost window.
    /// Where the load has lately alternated above what `replicas` completes, the fewest from
    /// it on that complete the forecast's mean over that time; not the count for today's λ:
    /// a peak would be priced as lasting the whole window, every count would be dearer at
    /// the peak than at the trough, and the plan would scale up at each peak and down at
    /// each trough.
    fn carries_rest_of_window(&self, replicas: u32, from: f64, window: f64) -> u32 {
        const SAMPLES: u32 = 60;
        // A load that has not alternated lately may be rising for good: today's λ is then
        // the better guess for the rest of the window than a past it has left.
        if self
            .inputs
            .recent
            .recurring_above(self.capacity(replicas))
            .is_none()
        {
            return self
                .keep_up_count()
                .unwrap_or(self.inputs.cap)
                .max(replicas);
        }
        let step = (window - from) / f64::from(SAMPLES);
        let mean = (0..SAMPLES)
            .map(|i| self.persisting(from + (f64::from(i) + 0.5) * step))
            .sum::<f64>()
            / f64::from(SAMPLES);
        if self.capacity(replicas) >= mean {
            return replicas;
        }
        self.useful(replicas.saturating_add(1), self.inputs.cap)
            .find(|&k| self.capacity(k) >= mean)
            .unwrap_or(self.inputs.cap)
            .max(replicas)
    }

    /// A count that falls behind must save at least [`ECONOMY_MIN_SAVING`] of what the
    /// keep-up count costs: it is worth its rebalances and an age near the limit.
    fn economy_worth(&self, replicas: u32, cost: f64, keep_up_cost: Option<f64>) -> bool {
        self.capacity(replicas) >= self.inputs.produce_rate
            || keep_up_cost.is_none_or(|keep_up| cost <= (1.0 - ECONOMY_MIN_SAVING) * keep_up)
    }

    fn cost_window(&self) -> f64 {
        self.settings.economy_dwell.max(self.settings.horizon)
    }

    /// Economy keeps the age below `limit` at today's λ over the horizon and for at least
    /// half the dwell: each planned pair of rebalances buys that much, so at a constant load
    /// economy and the keep-up count each last at least half a dwell. At the end of that
    /// stay it must still hold: the queue it has grown must be one the keep-up count, asked
    /// for then, completes within the drain limit. Otherwise the hold test ends economy far
    /// sooner: with a 1-minute drain limit, economy entered "for at least 29 minutes" was
    /// left 105 s later, and entered again an hour on, at a constant load.
    fn economy_lasts(&self, replicas: u32, limit: f64) -> bool {
        let lambda = self.inputs.produce_rate;
        let stay = self.settings.economy_stay();
        if !self.keeps(replicas, &|_| lambda, limit, stay) {
            return false;
        }
        let outlook = self.predict(replicas, replicas, &|_| lambda, stay);
        let at_end = PlanInputs {
            queue: self.queue_after(&outlook, stay),
            current: replicas,
            ready: replicas,
            starting_in: 0.0,
            ..*self.inputs
        };
        Planner {
            inputs: &at_end,
            settings: self.settings,
        }
        .holds(replicas, limit)
    }

    /// The queue `seconds` from now as `outlook` predicted it, today's λ arriving meanwhile.
    fn queue_after(&self, outlook: &Outlook, seconds: f64) -> QueueNow {
        QueueNow {
            backlog: outlook.end_backlog,
            oldest_age: outlook.end_age,
            shape: self
                .inputs
                .queue
                .shape
                .aged_by(seconds, self.inputs.produce_rate),
        }
    }

    /// Completion capacity t seconds after going from `ready` ready replicas to `to`:
    /// new pods start, then everyone stops for the rebalance.
    fn transition(&self, ready: u32, to: u32, t: f64) -> f64 {
        self.transition_after(ready, to, t, false)
    }

    /// [`Self::transition`], where `fresh` says that the pods asked for earlier were given up
    /// before (a scale-down stops them): every new pod starts from the beginning.
    fn transition_after(&self, ready: u32, to: u32, t: f64, fresh: bool) -> f64 {
        let settings = self.settings;
        if to > ready {
            // Pods asked for earlier are partly started already.
            let start = if to <= self.inputs.current && !fresh {
                self.inputs.starting_in.clamp(0.0, settings.pod_start)
            } else {
                settings.pod_start
            };
            if t < start {
                self.capacity(ready)
            } else if t < start + settings.rebalance {
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

    /// Running `replicas` from now keeps the oldest age below `age_limit` over `horizon`
    /// and completes what waits now within the drain limit.
    fn keeps(
        &self,
        replicas: u32,
        arrivals: &dyn Fn(f64) -> f64,
        age_limit: f64,
        horizon: f64,
    ) -> bool {
        self.keeps_then(replicas, replicas, arrivals, age_limit, horizon)
    }

    /// Running `now` until the next decision and `then` from it keeps the oldest age below
    /// `age_limit` over `horizon` and completes what waits now by [`Self::drain_by`].
    fn keeps_then(
        &self,
        now: u32,
        then: u32,
        arrivals: &dyn Fn(f64) -> f64,
        age_limit: f64,
        horizon: f64,
    ) -> bool {
        let outlook = self.predict(now, then, arrivals, horizon);
        let drain_by = self.settings.drain_by();
        outlook.peak_age <= age_limit && outlook.drained_at.is_some_and(|t| t <= drain_by)
    }

    /// `now` until the next decision, then `then`. The next decision may act on data a poll
    /// old: `then` is assumed from two polls on.
    fn predict(&self, now: u32, then: u32, arrivals: &dyn Fn(f64) -> f64, horizon: f64) -> Outlook {
        self.predict_switching(now, then, 2.0 * self.settings.poll, arrivals, horizon)
    }

    /// `now` until `switch_at` seconds from now, then `then`.
    fn predict_switching(
        &self,
        now: u32,
        then: u32,
        switch_at: f64,
        arrivals: &dyn Fn(f64) -> f64,
        horizon: f64,
    ) -> Outlook {
        let ready = self.inputs.ready;
        predict(
            self.inputs.queue,
            arrivals,
            |t| {
                if then != now && t >= switch_at {
                    let ready_then = if now > ready { ready } else { now };
                    // Going below the count asked for stops its pods: the way back starts
                    // new ones.
                    let fresh = now < self.inputs.current;
                    self.transition_after(ready_then, then, t - switch_at, fresh)
                } else {
                    self.transition(ready, now, t)
                }
            },
            horizon,
            self.prediction_steps(horizon),
        )
    }

    /// Steps that resolve what the plans ask: a horizon in 150 steps, but no step longer
    /// than a poll (nor more than 2000 such steps) while the next decisions, a reaction and
    /// the drain limit play out. A long deadline makes a long horizon, and steps of minutes
    /// there could not tell whether a queue drains within the drain limit or a switch two
    /// polls away: at a 16-hour deadline every count, even the cap, seemed to keep waiting
    /// events past a 5-minute drain limit, and the budget jumped to the cap and back every
    /// few minutes.
    fn prediction_steps(&self, horizon: f64) -> Steps {
        let coarse = (horizon / 150.0).max(1.0);
        let fine_until =
            self.settings.drain_by() + self.reaction_seconds() + 2.0 * self.settings.poll;
        Steps {
            fine: coarse
                .min(self.settings.poll)
                .max(fine_until / 2000.0)
                .max(1.0),
            fine_until,
            coarse,
        }
    }

    /// How long a scale-down to `replicas` asked for now waits for the scale-down window.
    fn down_wait(&self, replicas: u32) -> f64 {
        self.inputs
            .down_waits
            .get(replicas as usize)
            .copied()
            .unwrap_or(self.settings.down_delay)
            .clamp(0.0, self.settings.down_delay)
    }

    /// The oldest age a scale-up asked for now may let pass: the hold limit, or the age now
    /// plus the reaction time when it is later than that (no count can undo the age events
    /// already have, nor work before it has started).
    fn up_limit(&self) -> f64 {
        (HOLD_AGE_SHARE * self.settings.age_limit)
            .max(self.inputs.queue.oldest_age + self.reaction_seconds())
    }

    fn outcome(&self, replicas: u32, reason: PlanReason) -> Plan {
        let lambda = self.inputs.produce_rate;
        let keep_up = self.keep_up_count();
        let falls_behind = self.capacity(replicas) < lambda;
        let then = match keep_up {
            // A probe is judged by its way back, should the bound be all there is.
            _ if reason == PlanReason::Probe => self.fullest().max(self.inputs.current),
            Some(k) if falls_behind => k.max(replicas),
            _ => replicas,
        };
        // A scale-down is followed once its window lets it: the current count until then.
        let outlook = if reason == PlanReason::ScaleDown {
            let current = self.inputs.current;
            let wait = self.down_wait(replicas);
            self.predict_switching(current, replicas, wait, &|_| lambda, self.settings.horizon)
        } else {
            self.predict(replicas, then, &|_| lambda, self.settings.horizon)
        };
        Plan {
            replicas,
            reason,
            falls_behind,
            keep_up,
            rides_out: false,
            outlook,
            up_limit: self.up_limit(),
        }
    }
}

#[cfg(test)]
mod tests;
