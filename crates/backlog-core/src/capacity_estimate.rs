//! What one replica can complete per second, and where that number comes from.
//!
//! Completions per ready replica measure capacity only while the consumers are saturated (a
//! backlog waits and every partition has work): otherwise they measure the arrival rate, and a
//! budget that took that for capacity would size the workload for its own idleness and never
//! scale back down. The last saturated measurement is kept with its time; the configured rate
//! is a prior used until one exists; with neither, the unsaturated rate is only a lower bound.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// Where the per-replica rate comes from.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapacitySource {
    /// spec.capacity.perReplicaRate, before any saturated measurement.
    Configured,
    /// completionRate / ready replicas while the consumers were saturated.
    Measured,
    /// The completions of consumers never seen saturated: a lower bound only.
    Prior,
    /// A saturated measurement older than it stands, with no configured rate the deadline can
    /// afford to size by instead: a lower bound now. Consumers sized for a slowdown are never
    /// saturated once it is over, so only fewer replicas can show the recovery; one try is
    /// made per stale period.
    Stale,
}

/// A measurement and when it was taken: exact when the consumers were saturated, otherwise
/// the highest completions per ready replica seen, a lower bound of their capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MeasuredCapacity {
    pub per_replica_rate: f64,
    pub at: Timestamp,
    pub lower_bound: bool,
    /// How many times in a row the configured rate took over when this measurement went
    /// stale and the consumers fell short of it again: each doubles how long the measurement
    /// stands, so a wrong prior is not tried again and again at the price of two rebalances.
    pub confirmations: u32,
    /// The most per replica these consumers were ever shown to complete (this measurement, a
    /// bound or one before): without a configured rate, only a measurement below it is tested
    /// again once stale, since only then may the consumers have recovered from it.
    pub most_seen: f64,
}

impl MeasuredCapacity {
    /// Seconds this measurement stands before a configured rate above it is tried again.
    pub fn stands_for_seconds(&self, base_seconds: f64) -> f64 {
        base_seconds * f64::from(1_u32 << self.confirmations.min(MAX_DOUBLINGS))
    }
}

/// What this poll shows about the consumers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CapacityEvidence {
    pub configured: Option<f64>,
    /// Completions per second of the whole group.
    pub completion_rate: Option<f64>,
    /// Completions per second the group made since the previous poll at least: the drop of
    /// the backlog. It reacts within a poll where the completion rate still averages its
    /// window: a fast drain proves a recovered consumer at once, and a scale-up's drain what
    /// consumers never seen saturated can do. Set only where no more replicas than the ready
    /// ones can have worked since the previous poll, so the drop per ready replica never
    /// overstates one; the arrivals added to it are λ's only after a whole steady window.
    pub completed_at_least: Option<f64>,
    /// Completions per second of the whole group shown by the backlog's change while work
    /// stands on its partitions, since the previous poll: arrivals minus the rise. Set only
    /// once the samples fall after a change's pod starts and rebalance. It reacts within a
    /// poll or two where a saturated completion rate needs settling and a whole window: a
    /// configured rate far above the truth is refuted before a short deadline is.
    pub completed_while_busy: Option<BusyCompletions>,
    /// The fewest consumers that own the partitions with work when that reading was taken
    /// (all ready ones when every partition has work): they are saturated, the others may
    /// idle, so what the group completes per such consumer bounds one replica's rate from
    /// above. Busy replicas owning a single partition each more than the rest stand behind a
    /// backlog that never drains while the rest idle, and no poll finds every partition busy.
    pub busy_consumers_at_least: u32,
    pub ready_replicas: u32,
    /// What the ready replicas complete together, in replicas' worth, when arrivals spread
    /// evenly over the partitions: the busiest consumer owns ⌈P / ready⌉ of them, and the
    /// group keeps up only as far as it does (P / ⌈P / ready⌉; `ready_replicas` when the
    /// partitions are unknown). Idle consumers' completions over it bound the capacity.
    pub busiest_consumer_shares: f64,
    /// What arrives per second (the queried λ over the same window as the completions) and
    /// over how many partitions: where the group falls behind, they tell which consumers
    /// are the saturated ones ([`partly_saturated_rate`]).
    pub arrivals: Option<f64>,
    pub partitions: Option<u32>,
    /// The backlog rose since the previous poll: the group completes less than arrives, so
    /// a completion rate below the arrivals is not a window's noise.
    pub backlog_rising: bool,
    /// The group completes what arrives and little waits: only then is the busiest
    /// consumer known to keep up with its partitions (saturated, every consumer completes
    /// the same, and the busiest share would overstate it).
    pub keeping_up: bool,
    /// A backlog waits, every partition has work and the rate window saw no change of
    /// replicas.
    pub saturated: bool,
    /// No change of replicas fell in the rate window: completions per ready replica mean
    /// something only then (right after a scale-down they read high, after a scale-up low).
    pub settled: bool,
    /// After this many seconds without a saturated poll, a measurement gives way to the
    /// configured rate again: consumers sized for a slowdown that is over are never saturated,
    /// so the measurement alone could not see the recovery.
    pub stale_after_seconds: f64,
    /// How long consumers sized by the configured rate would run before a shortfall is
    /// measured and met (a measurement after the change, then a reaction). Trying the prior
    /// again costs an age that grows at the measured shortfall for that long.
    pub prior_test_seconds: f64,
    /// The age such a test may cost; where it would cost more, the measurement stands.
    pub prior_test_age_room: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CapacityEstimate {
    pub per_replica_rate: f64,
    pub source: CapacitySource,
    /// The measurement to keep (the new one, or the previous one still standing).
    pub measured: Option<MeasuredCapacity>,
}

impl CapacityEstimate {
    /// The consumers were never seen saturated, or not for long: they can do at least this
    /// much.
    pub fn is_lower_bound(&self) -> bool {
        matches!(self.source, CapacitySource::Prior | CapacitySource::Stale)
    }

    /// The rate the consumers may have recovered to, when only fewer replicas can show it: a
    /// bound (a stale measurement, or what idle consumers show since) below the most they
    /// were ever seen to complete or the `configured` rate. Consumers sized for a slowdown
    /// are never saturated once it is over.
    pub fn recovery_to_test(&self, configured: Option<f64>) -> Option<Recovery> {
        let most_seen = self.measured?.most_seen;
        let recovery = match configured {
            Some(rate) if rate > most_seen => Recovery {
                rate,
                configured: true,
            },
            _ => Recovery {
                rate: most_seen,
                configured: false,
            },
        };
        (self.is_lower_bound() && self.per_replica_rate < RECOVERY_GAP * recovery.rate)
            .then_some(recovery)
    }
}

/// A per-replica rate the consumers may have recovered to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Recovery {
    pub rate: f64,
    /// It is `spec.capacity.perReplicaRate`, above anything the consumers were seen to
    /// complete; otherwise it is the most they were seen to complete.
    pub configured: bool,
}

/// A measurement confirmed again and again stands at most 2^this times the base period.
const MAX_DOUBLINGS: u32 = 3;

/// Busy replicas completing below this share of the estimate in use refute it: the backlog
/// and a rate window's λ are noisy, a smaller gap is within their error.
const REFUTED_BELOW: f64 = 0.8;

/// A measurement within this factor of the stale one it follows confirms it.
const CONFIRMS_WITHIN: f64 = 1.25;

/// Without a configured rate, a bound below this share of the most the consumers were seen to
/// complete may be a slowdown they have recovered from. Even a small gap can cost whole
/// replicas where partitions divide unevenly; whether a cheaper count would keep up at the
/// most seen is the probe's question, so this only leaves out rounding.
const RECOVERY_GAP: f64 = 0.99;

/// What busy replicas completed since the previous poll, read as λ minus the backlog's rise.
/// λ is read through a rate window, which lags a step and averages noise the poll's own
/// arrivals do not: the reading is only known to within how far the window may be off.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BusyCompletions {
    /// Completions per second with λ as the window reads it.
    pub read: f64,
    /// The most the group can have completed: with λ as high as a window that moved as it did
    /// since the previous poll may hide, or as the completion rate shows where more than the
    /// move left the window. Equal to `read` where λ held still.
    pub at_most: f64,
}

impl BusyCompletions {
    /// A reading under a λ known to hold still.
    pub fn exact(completed: f64) -> Self {
        Self {
            read: completed,
            at_most: completed,
        }
    }
}

/// The estimate for this poll; `None` when nothing at all is known.
pub fn estimate(
    evidence: CapacityEvidence,
    previous: Option<MeasuredCapacity>,
    now: Timestamp,
) -> Option<CapacityEstimate> {
    let seen_before = previous.map_or(0.0, |m| m.most_seen.max(m.per_replica_rate));
    let mut estimate = estimate_now(evidence, previous, seen_before, now)?;
    if let Some(kept) = estimate.measured.as_mut() {
        kept.most_seen = seen_before.max(kept.per_replica_rate);
    }
    Some(estimate)
}

fn estimate_now(
    evidence: CapacityEvidence,
    previous: Option<MeasuredCapacity>,
    seen_before: f64,
    now: Timestamp,
) -> Option<CapacityEstimate> {
    let per_ready = match evidence.completion_rate {
        Some(rate)
            if evidence.settled
                && rate.is_finite()
                && rate > 0.0
                && evidence.ready_replicas > 0 =>
        {
            Some(rate / f64::from(evidence.ready_replicas))
        }
        _ => None,
    };
    let configured = evidence
        .configured
        .filter(|rate| rate.is_finite() && *rate > 0.0);
    // What the replicas proved they complete, per replica; it can raise an estimate, never
    // make one. A drop faster than the configured rate is more likely a scrape slower than the
    // poll (two intervals' drop seen at once) than a consumer faster than its owner says, so
    // it restores at most the configured rate.
    let proven = match evidence.completed_at_least {
        Some(rate) if rate.is_finite() && evidence.ready_replicas > 0 => {
            let shown = rate / f64::from(evidence.ready_replicas);
            let shown = configured.map_or(shown, |limit| shown.min(limit));
            Some(per_ready.map_or(shown, |seen| seen.max(shown)))
        }
        _ => per_ready,
    };
    let usable = |m: &MeasuredCapacity| m.per_replica_rate.is_finite() && m.per_replica_rate > 0.0;
    let previous = previous.filter(usable);
    // A saturated measurement stands until it is stale, and only where the consumers may
    // have recovered to more (a configured prior above it, or more seen before): one that
    // slowed shows it by falling behind and is measured again. A lower bound stands until
    // an exact measurement replaces it.
    // Sizing by the prior again is only worth it where the deadline can afford it being as
    // wrong as measured: the age grows by the shortfall's share of the time a test takes.
    let test_affordable = |m: &MeasuredCapacity, prior: f64| {
        (1.0 - m.per_replica_rate / prior) * evidence.prior_test_seconds
            <= evidence.prior_test_age_room
    };
    // Otherwise a stale measurement stays the estimate but only as a lower bound, which
    // fewer replicas may test (the planner's probe, safe even at the bound).
    let prior_to_try = |m: &MeasuredCapacity| {
        configured.filter(|&prior| prior > m.per_replica_rate && test_affordable(m, prior))
    };
    let recover_to = configured.unwrap_or(0.0).max(seen_before);
    let standing = |m: &MeasuredCapacity| {
        (prior_to_try(m).is_none() && m.per_replica_rate >= RECOVERY_GAP * recover_to)
            || super::stabilization::seconds_between(m.at, now)
                < m.stands_for_seconds(evidence.stale_after_seconds)
    };
    let previous_exact = previous.filter(|m| !m.lower_bound && standing(m));
    // A stale measurement is kept while the configured rate is tried again: if the
    // consumers fall short of that rate as before, the next measurement stands longer.
    let previous_stale = previous.filter(|m| !m.lower_bound && !standing(m));
    let confirmations = |rate: f64| match (previous_exact, previous_stale) {
        (Some(before), _) => before.confirmations,
        (None, Some(stale))
            if rate <= stale.per_replica_rate * CONFIRMS_WITHIN
                && rate * CONFIRMS_WITHIN >= stale.per_replica_rate =>
        {
            (stale.confirmations + 1).min(MAX_DOUBLINGS)
        }
        _ => 0,
    };
    let previous_bound = previous.filter(|m| m.lower_bound);
    let exact = match (per_ready, previous_exact) {
        (Some(rate), _) if evidence.saturated => Some(MeasuredCapacity {
            per_replica_rate: rate,
            at: now,
            lower_bound: false,
            confirmations: confirmations(rate),
            most_seen: 0.0,
        }),
        // Unsaturated consumers completing more than the last measurement prove it stale (the
        // consumer got faster while it had no backlog): it rises to what is proven.
        (_, Some(before)) if proven.is_some_and(|rate| rate > before.per_replica_rate) => {
            Some(MeasuredCapacity {
                per_replica_rate: proven.unwrap_or(before.per_replica_rate),
                ..before
            })
        }
        (_, before) => before,
    };
    // Busy replicas that complete well below the measurement or the prior in use, even with
    // λ as high as the window may hide, refute it: what they complete is the measurement
    // until a saturated window measures it again.
    let shown_while_busy = evidence
        .completed_while_busy
        .filter(|c| {
            c.read.is_finite()
                && c.at_most.is_finite()
                && c.read >= 0.0
                && evidence.busy_consumers_at_least > 0
        })
        .map(|c| {
            let owners = f64::from(evidence.busy_consumers_at_least);
            (c.read / owners, c.at_most.max(c.read) / owners)
        });
    let in_use = exact
        .map(|m| m.per_replica_rate)
        .or(configured)
        .or(previous_stale.map(|m| m.per_replica_rate));
    let exact = match (shown_while_busy, in_use) {
        (Some((shown, at_most)), Some(estimate))
            if !evidence.saturated && shown > 0.0 && at_most < REFUTED_BELOW * estimate =>
        {
            // The truth lies between the reading and its bound: near the bound where the
            // window lags a step, near the reading where it averages noise away. Halfway is
            // off by at most half the gap either way.
            let measured = (shown + at_most) / 2.0;
            Some(MeasuredCapacity {
                per_replica_rate: measured,
                at: now,
                lower_bound: false,
                confirmations: confirmations(measured),
                most_seen: 0.0,
            })
        }
        _ => exact,
    };
    if let Some(m) = exact {
        return Some(CapacityEstimate {
            per_replica_rate: m.per_replica_rate,
            source: CapacitySource::Measured,
            measured: Some(m),
        });
    }
    // Whatever idle consumers once completed per replica, they can still complete; the
    // busiest of them completed its partitions' share, more than the average.
    let per_ready = match (per_ready, evidence.completion_rate) {
        (Some(average), Some(rate))
            if evidence.keeping_up && evidence.busiest_consumer_shares > 0.0 =>
        {
            Some(average.max(rate / evidence.busiest_consumer_shares))
        }
        // Falling behind with work on only some partitions: the consumers owning the most
        // are saturated and the others complete their share, so the average understates
        // what one replica does. Only a bound still: averaged over a window in which λ moved,
        // the rate solved reads low.
        (Some(average), Some(rate)) if evidence.settled && evidence.backlog_rising => Some(
            evidence
                .arrivals
                .zip(evidence.partitions)
                .and_then(|(arrivals, partitions)| {
                    partly_saturated_rate(rate, arrivals, partitions, evidence.ready_replicas)
                })
                .map_or(average, |solved| average.max(solved)),
        ),
        (seen, _) => seen,
    };
    // A drain proves what the replicas complete as well as idleness does.
    let per_ready = match (per_ready, proven) {
        (Some(seen), Some(shown)) => Some(seen.max(shown)),
        (seen, shown) => seen.or(shown),
    };
    let bound = match (per_ready, previous_bound) {
        (Some(rate), Some(before)) if before.per_replica_rate >= rate => Some(before),
        (Some(rate), _) => Some(MeasuredCapacity {
            per_replica_rate: rate,
            at: now,
            lower_bound: true,
            confirmations: 0,
            most_seen: 0.0,
        }),
        (None, before) => before,
    };
    // The configured rate sizes the group until a measurement exists, and again once one is
    // stale where the deadline affords it; a stale one it cannot afford stays as a bound.
    let try_prior =
        configured.filter(|_| previous_stale.is_none_or(|stale| prior_to_try(&stale).is_some()));
    match (try_prior, bound) {
        (Some(configured), bound) => Some(CapacityEstimate {
            per_replica_rate: configured.max(bound.map_or(0.0, |b| b.per_replica_rate)),
            source: CapacitySource::Configured,
            // Idle consumers completing more than the stale measurement prove it obsolete.
            measured: match (previous_stale, bound) {
                (Some(stale), Some(b)) if b.per_replica_rate > stale.per_replica_rate => Some(b),
                (stale, b) => stale.or(b),
            },
        }),
        // What the consumers completed when last saturated they can do at least; the stale
        // measurement is kept so that measuring it again counts as a confirmation.
        (None, bound) => match (previous_stale, bound) {
            (Some(stale), bound)
                if bound.is_none_or(|b| b.per_replica_rate <= stale.per_replica_rate) =>
            {
                Some(CapacityEstimate {
                    per_replica_rate: stale.per_replica_rate,
                    source: CapacitySource::Stale,
                    measured: Some(stale),
                })
            }
            // Idle consumers proving more than a stale measurement that keeps a too-dear prior
            // out raise it rather than replace it: replaced by a bound, the measurement would
            // be forgotten, and the prior it refuted sized the group again at once.
            (Some(stale), Some(bound)) if configured.is_some() => Some(CapacityEstimate {
                per_replica_rate: bound.per_replica_rate,
                source: CapacitySource::Stale,
                measured: Some(MeasuredCapacity {
                    per_replica_rate: bound.per_replica_rate,
                    ..stale
                }),
            }),
            (_, Some(bound)) => Some(CapacityEstimate {
                per_replica_rate: bound.per_replica_rate,
                source: CapacitySource::Prior,
                measured: Some(bound),
            }),
            (_, None) => None,
        },
    }
}

/// The per-replica rate at which `ready` consumers, owning `partitions` evenly loaded
/// partitions round-robin, complete `completed` of the `arrivals` per second: the busiest
/// consumers (⌈P/n⌉ partitions each) are saturated at that rate and the others complete
/// their partitions' share. `None` while the group completes everything that arrives (no
/// consumer is shown saturated) or the inputs are unusable.
///
/// A lower bound of the true rate whenever the completions come from that model: averaged
/// over a window in which λ moved, a saturated consumer's completions stay at its rate while
/// its share of the window's λ only rises above it part of the time, so the rate solved from
/// the averages reads low, never high.
pub fn partly_saturated_rate(
    completed: f64,
    arrivals: f64,
    partitions: u32,
    ready: u32,
) -> Option<f64> {
    let usable = |v: f64| v.is_finite() && v > 0.0;
    // Equal but for rounding: the group keeps up. (Completions a little below the arrivals
    // through a window's noise solve to a rate below the busiest consumers' load, which
    // their true rate is not: low, as a bound may be.)
    let keeps_up = completed >= arrivals * (1.0 - 1e-9);
    if !usable(completed) || !usable(arrivals) || keeps_up || partitions == 0 {
        return None;
    }
    // Consumers beyond the partition count own none and complete nothing.
    let owners = ready.min(partitions);
    if owners == 0 {
        return None;
    }
    let per_partition = arrivals / f64::from(partitions);
    let fewer = partitions / owners;
    // The first P mod n consumers own one partition more.
    let busiest = partitions % owners;
    let lighter = owners - busiest;
    let lighter_load = f64::from(fewer) * per_partition;
    // Everyone saturated (the completions are below what the lighter consumers alone are
    // given): all complete the same. (With no busiest consumer that is always so; the
    // second test only keeps the division below defined.)
    if completed <= f64::from(owners) * lighter_load || busiest == 0 {
        return Some(completed / f64::from(owners));
    }
    Some((completed - f64::from(lighter) * lighter_load) / f64::from(busiest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn evidence(completion: f64, ready: u32, saturated: bool) -> CapacityEvidence {
        CapacityEvidence {
            configured: None,
            completion_rate: Some(completion),
            completed_at_least: None,
            ready_replicas: ready,
            busiest_consumer_shares: f64::from(ready),
            arrivals: None,
            partitions: None,
            backlog_rising: false,
            keeping_up: false,
            saturated,
            settled: true,
            completed_while_busy: None,
            busy_consumers_at_least: ready,
            stale_after_seconds: 1800.0,
            prior_test_seconds: 0.0,
            prior_test_age_room: 300.0,
        }
    }

    #[test]
    fn an_idle_consumer_is_only_a_lower_bound_until_it_is_saturated() {
        let idle = estimate(evidence(500.0, 5, false), None, at(0)).expect("estimate");
        assert_eq!(idle.source, CapacitySource::Prior);
        assert!(idle.is_lower_bound());
        let busy = estimate(evidence(1250.0, 5, true), None, at(15)).expect("estimate");
        assert_eq!(busy.source, CapacitySource::Measured);
        assert_eq!(busy.per_replica_rate, 250.0);
        // Idle again: the saturated measurement stands, with its time.
        let later = estimate(evidence(300.0, 5, false), busy.measured, at(600)).expect("estimate");
        assert_eq!(later.per_replica_rate, 250.0);
        assert_eq!(later.measured.map(|m| m.at), Some(at(15)));
    }

    #[test]
    fn the_configured_rate_is_a_prior_until_a_measurement_exists() {
        let mut e = evidence(400.0, 4, false);
        e.configured = Some(500.0);
        let prior = estimate(e, None, at(0)).expect("estimate");
        assert_eq!(
            (prior.source, prior.per_replica_rate),
            (CapacitySource::Configured, 500.0)
        );
        e.saturated = true;
        e.completion_rate = Some(1000.0);
        let measured = estimate(e, None, at(15)).expect("estimate");
        assert_eq!(
            (measured.source, measured.per_replica_rate),
            (CapacitySource::Measured, 250.0)
        );
    }

    #[test]
    fn a_stale_measurement_gives_way_to_the_configured_rate() {
        let mut e = evidence(1000.0, 8, true);
        e.configured = Some(250.0);
        let slow = estimate(e, None, at(0)).expect("estimate");
        assert_eq!(slow.per_replica_rate, 125.0);
        e.saturated = false;
        let still = estimate(e, slow.measured, at(1799)).expect("estimate");
        assert_eq!(still.source, CapacitySource::Measured);
        let stale = estimate(e, still.measured, at(1800)).expect("estimate");
        assert_eq!(
            (stale.source, stale.per_replica_rate),
            (CapacitySource::Configured, 250.0)
        );
    }

    #[test]
    fn without_a_prior_a_slowdown_gone_stale_is_a_lower_bound_to_test() {
        // Idle consumers show at least 233/s each; then, saturated, they complete 154/s.
        let idle = estimate(evidence(932.0, 4, false), None, at(0)).expect("estimate");
        assert_eq!(idle.per_replica_rate, 233.0);
        let slow = estimate(evidence(1232.0, 8, true), idle.measured, at(60)).expect("estimate");
        assert_eq!(
            (slow.source, slow.per_replica_rate),
            (CapacitySource::Measured, 154.0)
        );
        assert_eq!(slow.measured.map(|m| m.most_seen), Some(233.0));
        assert_eq!(slow.recovery_to_test(None), None);
        // Sized for the slowdown, the consumers idle once it is over and show only λ.
        let e = evidence(900.0, 8, false);
        let still = estimate(e, slow.measured, at(60 + 1799)).expect("estimate");
        assert_eq!(
            (still.source, still.recovery_to_test(None)),
            (CapacitySource::Measured, None)
        );
        let stale = estimate(e, still.measured, at(60 + 1800)).expect("estimate");
        assert_eq!(
            (stale.source, stale.per_replica_rate),
            (CapacitySource::Stale, 154.0)
        );
        assert!(stale.is_lower_bound());
        assert_eq!(stale.recovery_to_test(None).map(|r| r.rate), Some(233.0));
        // Fewer replicas saturated at the slowed rate again: a confirmation, which doubles
        // how long the measurement stands before the next try.
        let again = estimate(evidence(616.0, 4, true), stale.measured, at(60 + 1900));
        let again = again.expect("estimate");
        assert_eq!(
            (again.source, again.per_replica_rate),
            (CapacitySource::Measured, 154.0)
        );
        assert_eq!(again.measured.map(|m| m.confirmations), Some(1));
        // Or they keep up: the bound rises to what they complete, and is tested no more once
        // it is the most ever seen.
        let kept_up = estimate(evidence(932.0, 4, false), stale.measured, at(60 + 1900));
        let kept_up = kept_up.expect("estimate");
        assert_eq!(
            (kept_up.source, kept_up.per_replica_rate),
            (CapacitySource::Prior, 233.0)
        );
        assert_eq!(kept_up.recovery_to_test(None), None);
    }

    #[test]
    fn without_a_prior_a_measurement_never_bettered_stands() {
        let idle = estimate(evidence(800.0, 4, false), None, at(0)).expect("estimate");
        let busy = estimate(evidence(1000.0, 4, true), idle.measured, at(60)).expect("estimate");
        let later = estimate(evidence(500.0, 4, false), busy.measured, at(60 + 7200));
        let later = later.expect("estimate");
        assert_eq!(
            (later.source, later.per_replica_rate),
            (CapacitySource::Measured, 250.0)
        );
        assert_eq!(later.recovery_to_test(None), None);
    }

    #[test]
    fn a_prior_the_deadline_cannot_afford_to_try_is_left_to_a_probe() {
        // Measured at half the prior. Sizing by the prior again would let the age grow at half
        // the time a test takes (measuring after the change, then a reaction): 400 s of test
        // cost 200 s of age, more than the 60 s the deadline leaves. So the measurement stays
        // the estimate, but stale, as a bound: the consumers may have recovered, and fewer
        // replicas show it where the planner finds a try the deadline affords even at the
        // bound. Left standing instead, consumers sized for a slowdown would stay so for good.
        let mut e = evidence(1000.0, 8, true);
        e.configured = Some(250.0);
        e.prior_test_seconds = 400.0;
        e.prior_test_age_room = 60.0;
        let slow = estimate(e, None, at(0)).expect("estimate");
        e.saturated = false;
        let held = estimate(e, slow.measured, at(1799)).expect("estimate");
        assert_eq!(held.source, CapacitySource::Measured);
        let later = estimate(e, slow.measured, at(100_000)).expect("estimate");
        assert_eq!(
            (later.source, later.per_replica_rate),
            (CapacitySource::Stale, 125.0)
        );
        assert_eq!(
            later.recovery_to_test(Some(250.0)),
            Some(Recovery {
                rate: 250.0,
                configured: true
            })
        );
        // Saturated at the slowed rate again: a confirmation, as without a prior.
        e.saturated = true;
        let again = estimate(e, later.measured, at(100_060)).expect("estimate");
        assert_eq!(
            (again.source, again.measured.map(|m| m.confirmations)),
            (CapacitySource::Measured, Some(1))
        );
        e.saturated = false;
        // Idle consumers proving 150/s each raise the stale measurement, and it stays the
        // bound it was: forgotten, the prior it refuted would size the group again at once.
        let mut idle = evidence(1200.0, 8, false);
        idle.configured = e.configured;
        idle.prior_test_seconds = e.prior_test_seconds;
        idle.prior_test_age_room = e.prior_test_age_room;
        let raised = estimate(idle, later.measured, at(100_015)).expect("estimate");
        let next = estimate(idle, raised.measured, at(100_030)).expect("estimate");
        for step in [raised, next] {
            assert_eq!(
                (step.source, step.per_replica_rate),
                (CapacitySource::Stale, 150.0)
            );
        }
        // Proving nearly the prior, they make trying it cheap enough: it sizes the group.
        let near = CapacityEvidence {
            completion_rate: Some(1800.0),
            ..idle
        };
        let proven = estimate(near, next.measured, at(100_045)).expect("estimate");
        let after = estimate(near, proven.measured, at(100_060)).expect("estimate");
        assert_eq!(after.source, CapacitySource::Configured);
        // Where the deadline leaves 300 s, the test costs less and the prior is tried again.
        e.prior_test_age_room = 300.0;
        let stale = estimate(e, slow.measured, at(100_000)).expect("estimate");
        assert_eq!(stale.source, CapacitySource::Configured);
    }

    #[test]
    fn busy_replicas_completing_well_below_the_prior_refute_it_at_once() {
        // The owner says 361/s; 8 busy replicas complete 1600/s (the backlog rises by 48/s
        // under 1648/s): 200/s each is the measurement, long before a saturated window is.
        let mut e = evidence(1100.0, 8, false);
        e.configured = Some(361.0);
        e.completed_while_busy = Some(BusyCompletions::exact(1600.0));
        let refuted = estimate(e, None, at(0)).expect("estimate");
        assert_eq!(
            (refuted.source, refuted.per_replica_rate),
            (CapacitySource::Measured, 200.0)
        );
        // Within the noise of the backlog and the rate window (300/s of 361/s): the prior
        // stands.
        e.completed_while_busy = Some(BusyCompletions::exact(2400.0));
        let kept = estimate(e, None, at(0)).expect("estimate");
        assert_eq!(kept.source, CapacitySource::Configured);
        // A saturated window's measurement is the better one: it is not overruled.
        let mut saturated = evidence(2000.0, 8, true);
        saturated.configured = Some(361.0);
        saturated.completed_while_busy = Some(BusyCompletions::exact(1600.0));
        let measured = estimate(saturated, None, at(0)).expect("estimate");
        assert_eq!(measured.per_replica_rate, 250.0);
    }

    #[test]
    fn a_reading_refutes_only_where_even_its_bound_is_far_below() {
        // 8 busy replicas, said to do 361/s: read at 1200/s, but λ may have been as much
        // higher as to make it 2400/s (300/s each, within the noise of 361/s): it stands.
        let mut e = evidence(1100.0, 8, false);
        e.configured = Some(361.0);
        e.completed_while_busy = Some(BusyCompletions {
            read: 1200.0,
            at_most: 2400.0,
        });
        let kept = estimate(e, None, at(0)).expect("estimate");
        assert_eq!(kept.source, CapacitySource::Configured);
        // At most 2000/s (250/s each): refuted, measured halfway between the two readings.
        e.completed_while_busy = Some(BusyCompletions {
            read: 1200.0,
            at_most: 2000.0,
        });
        let refuted = estimate(e, None, at(0)).expect("estimate");
        assert_eq!(
            (refuted.source, refuted.per_replica_rate),
            (CapacitySource::Measured, 200.0)
        );
    }

    #[test]
    fn a_backlog_standing_on_the_busiest_consumers_refutes_the_prior() {
        // 23 partitions on 12 consumers: 11 own two, and their 22 partitions hold a backlog
        // that does not drain while the one owning a single partition idles. The group
        // completes about λ, 2266/s: at most 206/s for each of the 11, not the 402/s said.
        let mut e = evidence(2266.0, 12, false);
        e.configured = Some(402.0);
        e.completed_while_busy = Some(BusyCompletions::exact(2266.0));
        e.busy_consumers_at_least = 11;
        let refuted = estimate(e, None, at(0)).expect("estimate");
        assert_eq!(refuted.source, CapacitySource::Measured);
        assert!((refuted.per_replica_rate - 2266.0 / 11.0).abs() < 1e-9);
        // A single hot partition with work proves no more than the group's completions for
        // its one owner: far above the prior, so it stands.
        e.busy_consumers_at_least = 1;
        let kept = estimate(e, None, at(0)).expect("estimate");
        assert_eq!(kept.source, CapacitySource::Configured);
    }

    #[test]
    fn a_measurement_above_the_configured_rate_does_not_go_stale() {
        // Measured faster than the prior says: a consumer that slows later falls behind and
        // is measured again, so nothing is gained by going back to the pessimistic prior.
        let mut e = evidence(3200.0, 8, true);
        e.configured = Some(289.0);
        let fast = estimate(e, None, at(0)).expect("estimate");
        assert_eq!(fast.per_replica_rate, 400.0);
        e.saturated = false;
        e.completion_rate = Some(800.0);
        let later = estimate(e, fast.measured, at(7200)).expect("estimate");
        assert_eq!(
            (later.source, later.per_replica_rate),
            (CapacitySource::Measured, 400.0)
        );
    }

    #[test]
    fn a_prior_disproved_again_is_tried_again_later_each_time() {
        // The owner says 200/s; the consumers do 100/s. Stale after 600 s, the prior takes
        // over and the consumers fall short of it again: each time, the new measurement
        // stands twice as long (at most eight times).
        let mut busy = evidence(800.0, 8, true);
        busy.configured = Some(200.0);
        busy.stale_after_seconds = 600.0;
        let mut idle = busy;
        idle.saturated = false;
        idle.completion_rate = Some(400.0);
        let mut measured = estimate(busy, None, at(0)).expect("estimate");
        let mut start = 0;
        for (confirmations, stands) in [(0, 600), (1, 1200), (2, 2400), (3, 4800), (3, 4800)] {
            let m = measured.measured.expect("measurement");
            assert_eq!(m.confirmations, confirmations);
            let held = estimate(idle, Some(m), at(start + stands - 1)).expect("estimate");
            assert_eq!(held.source, CapacitySource::Measured);
            let stale = estimate(idle, Some(m), at(start + stands)).expect("estimate");
            assert_eq!(
                (stale.source, stale.per_replica_rate),
                (CapacitySource::Configured, 200.0)
            );
            // The stale measurement is kept while the prior is tried, to be confirmed.
            assert_eq!(stale.measured, Some(m));
            start += stands + 60;
            measured = estimate(busy, stale.measured, at(start)).expect("estimate");
        }
        // A measurement unlike the stale one is news, not a confirmation: back to the base.
        let m = measured.measured.expect("measurement");
        let stale = estimate(idle, Some(m), at(start + 4800)).expect("estimate");
        let mut slower = busy;
        slower.completion_rate = Some(400.0);
        let other = estimate(slower, stale.measured, at(start + 4860)).expect("estimate");
        assert_eq!(other.measured.map(|m| m.confirmations), Some(0));
    }

    #[test]
    fn idle_consumers_faster_than_a_stale_measurement_replace_it() {
        let mut busy = evidence(800.0, 8, true);
        busy.configured = Some(200.0);
        busy.stale_after_seconds = 600.0;
        let slow = estimate(busy, None, at(0)).expect("estimate").measured;
        let mut idle = busy;
        idle.saturated = false;
        // 4 idle replicas complete 600/s: 150/s each, more than the stale 100/s.
        idle.ready_replicas = 4;
        idle.completion_rate = Some(600.0);
        let later = estimate(idle, slow, at(900)).expect("estimate");
        assert_eq!(later.source, CapacitySource::Configured);
        let kept = later.measured.expect("kept");
        assert!(kept.lower_bound);
        assert_eq!(kept.per_replica_rate, 150.0);
        // Slower idle replicas leave the stale measurement in place, to be confirmed.
        idle.completion_rate = Some(200.0);
        let still = estimate(idle, slow, at(900)).expect("estimate");
        assert_eq!(still.measured, slow);
    }

    #[test]
    fn idle_consumers_prove_what_their_busiest_completes() {
        // 14 replicas on 32 partitions keep up with 2297/s: the busiest owns 3 partitions,
        // so each replica completes at least 2297 × 3 / 32 = 215/s, not the average 164/s.
        let mut idle = evidence(2297.0, 14, false);
        idle.busiest_consumer_shares = 32.0 / 3.0;
        idle.keeping_up = true;
        let bound = estimate(idle, None, at(0)).expect("estimate");
        assert_eq!(bound.source, CapacitySource::Prior);
        assert!((bound.per_replica_rate - 2297.0 * 3.0 / 32.0).abs() < 1e-9);
        // Falling behind, every consumer completes the same: the busiest share would
        // overstate them, so only the average is a bound.
        idle.keeping_up = false;
        let behind = estimate(idle, None, at(0)).expect("estimate");
        assert!((behind.per_replica_rate - 2297.0 / 14.0).abs() < 1e-9);
    }

    #[test]
    fn a_lower_bound_is_the_highest_ever_seen_until_a_measurement() {
        let busy = estimate(evidence(400.0, 2, false), None, at(0)).expect("estimate");
        assert_eq!(
            (busy.source, busy.per_replica_rate),
            (CapacitySource::Prior, 200.0)
        );
        // Eight idle replicas complete 50/s each: the consumers can still do 200/s.
        let idle = estimate(evidence(400.0, 8, false), busy.measured, at(60)).expect("estimate");
        assert_eq!(idle.per_replica_rate, 200.0);
        let exact = estimate(evidence(2000.0, 8, true), idle.measured, at(120)).expect("estimate");
        assert_eq!(
            (exact.source, exact.per_replica_rate),
            (CapacitySource::Measured, 250.0)
        );
    }

    #[test]
    fn completions_read_across_a_change_of_replicas_teach_nothing() {
        // 28 replicas completed 2800/s until a scale-down to 14 a moment ago: the rate window
        // still holds the 28, and 2800/14 would read as twice the real speed.
        let measured = estimate(evidence(1400.0, 14, true), None, at(0)).expect("estimate");
        let mut unsettled = evidence(2800.0, 14, false);
        unsettled.settled = false;
        let after = estimate(unsettled, measured.measured, at(60)).expect("estimate");
        assert_eq!(after.per_replica_rate, 100.0);
        let mut saturated = evidence(2800.0, 14, true);
        saturated.settled = false;
        assert_eq!(estimate(saturated, None, at(60)), None);
    }

    #[test]
    fn a_fast_drain_proves_a_recovered_consumer_at_once() {
        // Measured at 125/s while slow; now 12 replicas completing what arrives (1100/s) say
        // nothing, but the backlog fell by 45 000 in 15 s: 3000/s at least, 250 each.
        let slow = estimate(evidence(1500.0, 12, true), None, at(0)).expect("estimate");
        let mut drained = evidence(1100.0, 12, false);
        drained.completed_at_least = Some(45_000.0 / 15.0);
        let after = estimate(drained, slow.measured, at(600)).expect("estimate");
        assert!((after.per_replica_rate - 250.0).abs() < 0.01, "{after:?}");
        assert_eq!(after.source, CapacitySource::Measured);
    }

    /// What `ready` consumers at `rate` each complete of `arrivals` spread evenly over
    /// `partitions`, round-robin: the simulator's model.
    fn completions(rate: f64, arrivals: f64, partitions: u32, ready: u32) -> f64 {
        let per_partition = arrivals / f64::from(partitions);
        (0..ready)
            .map(|consumer| {
                let owned = (0..partitions).filter(|p| p % ready == consumer).count();
                rate.min(per_partition * owned as f64)
            })
            .sum()
    }

    #[test]
    fn consumers_falling_behind_on_their_extra_partition_show_their_rate() {
        // 12 partitions over 5 consumers: two own three (210/s at 840/s), three own two
        // (140/s). At 176/s each the two fall behind, and the group completes 772/s: 154 a
        // replica on average, 176 for the two that show what one replica does.
        let completed = completions(176.0, 840.0, 12, 5);
        assert!((completed - 772.0).abs() < 1e-9);
        let solved = partly_saturated_rate(completed, 840.0, 12, 5).expect("a rate");
        assert!((solved - 176.0).abs() < 1e-9, "{solved}");
        let mut behind = evidence(completed, 5, false);
        (behind.arrivals, behind.partitions) = (Some(840.0), Some(12));
        let bound = estimate(behind, None, at(0)).expect("estimate");
        assert_eq!(bound.per_replica_rate, 154.4);
        behind.backlog_rising = true;
        let bound = estimate(behind, None, at(0)).expect("estimate");
        assert!((bound.per_replica_rate - 176.0).abs() < 1e-9, "{bound:?}");
        assert!(bound.is_lower_bound());
        // A group completing all that arrives shows no consumer's rate.
        assert_eq!(partly_saturated_rate(840.0, 840.0, 12, 5), None);
        // Consumers beyond the partitions own none.
        let completed = completions(50.0, 840.0, 12, 20);
        let solved = partly_saturated_rate(completed, 840.0, 12, 20).expect("a rate");
        assert!((solved - 50.0).abs() < 1e-9, "{solved}");
    }

    #[test]
    fn nothing_known_is_no_estimate() {
        assert_eq!(estimate(evidence(0.0, 0, false), None, at(0)), None);
    }

    proptest! {
        /// From the model's completions the rate is found exactly, and from a window in
        /// which λ stepped (both rates averaged over it) it is never overstated.
        #[test]
        fn the_rate_of_partly_saturated_consumers_is_never_overstated(
            rate in 1.0..1e4f64,
            low in 1.0..1e5f64,
            high_share in 1.0..4.0f64,
            low_share in 0.0..=1.0f64,
            partitions in 1u32..128,
            ready in 1u32..160,
        ) {
            let high = low * high_share;
            let exact = completions(rate, high, partitions, ready);
            if let Some(solved) = partly_saturated_rate(exact, high, partitions, ready) {
                prop_assert!((solved - rate).abs() <= 1e-6 * rate, "{} for {}", solved, rate);
            }
            let mean = |a: f64, b: f64| low_share * a + (1.0 - low_share) * b;
            let completed = mean(
                completions(rate, low, partitions, ready),
                exact,
            );
            let arrivals = mean(low, high);
            if let Some(solved) = partly_saturated_rate(completed, arrivals, partitions, ready) {
                prop_assert!(solved <= rate * (1.0 + 1e-9), "{} above {}", solved, rate);
                prop_assert!(solved * f64::from(ready.min(partitions)) >= completed * (1.0 - 1e-9));
            }
        }

        #[test]
        fn an_unsaturated_rate_never_lowers_a_measurement(
            measured in 1.0..1e4f64,
            completion in 0.0..1e5f64,
            ready in 1u32..50,
        ) {
            let before = MeasuredCapacity { per_replica_rate: measured, at: at(0), lower_bound: false, confirmations: 0, most_seen: measured };
            let e = estimate(evidence(completion, ready, false), Some(before), at(60));
            let e = e.expect("a measurement exists");
            prop_assert!(e.per_replica_rate >= measured);
            prop_assert_eq!(e.source, CapacitySource::Measured);
        }
    }
}
