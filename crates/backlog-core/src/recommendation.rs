//! How many replicas the workload needs: a pure function of demand, capacity and the budget.
//!
//! Three regimes, chosen by how close the oldest event is to its deadline:
//! - **steady/draining** (oldest age below the warning fraction): keep up with arrivals and
//!   clear the backlog expected at the next decision within the drain window:
//!   μ* = max(λ', B' / T), where λ' projects a rising arrival rate one step ahead (so a ramp
//!   costs one larger step instead of many small ones) and B' adds what piles up until the
//!   next decision can act;
//! - **urgent** (oldest age past the warning fraction): drain net of arrivals within the time
//!   left before the deadline: μ* = λ' + B' / T, with T = min(targetDrainTime, deadline − age);
//! - **economy**: when the backlog and the oldest age are far below budget and arrivals are not
//!   rising, hold ⌊λ/c⌋ replicas instead of ⌈λ/c⌉ and let a small backlog build up; the budget
//!   is time, and idle headroom is spent only when the projection says it is needed. Entering
//!   economy needs room for a long dwell, staying in it only room until the next decision, so
//!   the workload does not flap between the two counts.
//!
//! Never above the cap min(maxReplicas, partitions); undrainable when even the cap completes no
//! more than arrives.

use super::budget_config::BudgetConfig;
use super::drain::{drain_window, group_capacity, replicas_for, shortfall, unbounded_replicas_for};

/// What arrives and what waits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Demand {
    /// λ, events per second.
    pub produce_rate: f64,
    /// dλ/dt, events per second per second (only a rise is projected).
    pub produce_rate_trend: f64,
    /// Backlog the workload has to drain (paused classes excluded).
    pub backlog: f64,
    /// Seconds.
    pub oldest_age: f64,
}

/// What the workload can do.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Supply {
    /// Events per second one replica completes.
    pub per_replica_rate: f64,
    pub current: u32,
    /// Lowest replicas allowed: min(minReplicas, cap).
    pub floor: u32,
    /// Highest replicas allowed: min(maxReplicas, partitions).
    pub cap: u32,
    pub partitions: u32,
    /// The economy count chosen at the previous decision, if any: staying in it needs less
    /// room than entering it.
    pub economy: Option<u32>,
}

/// Why the recommendation is what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Regime {
    /// Capacity for arrivals and the backlog within the drain window.
    Steady,
    /// The backlog, not arrivals, sets the need.
    Draining,
    /// The oldest event is past the warning fraction of its deadline.
    Urgent,
    /// ⌊λ/c⌋ replicas while the budget has room.
    Economy,
    /// Even the cap cannot complete more than arrives.
    Undrainable,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Recommendation {
    /// Replicas the formula asks for, before clamping to [floor, cap].
    pub raw: u64,
    pub replicas: u32,
    pub regime: Regime,
    /// μ*, events per second.
    pub required_rate: f64,
}

/// Shortest drain window: about one decision, so a breached deadline asks for the cap rather
/// than dividing by zero.
fn window_floor(config: &BudgetConfig) -> f64 {
    config.poll_interval_seconds.max(1.0)
}

/// Seconds until a decision made now has taken effect: the next poll plus the rebalance.
pub fn reaction_seconds(config: &BudgetConfig) -> f64 {
    config.poll_interval_seconds + config.rebalance_cost_seconds
}

pub fn recommend(config: &BudgetConfig, demand: &Demand, supply: &Supply) -> Recommendation {
    let lambda = demand.produce_rate;
    let rate = supply.per_replica_rate;
    let capacity = rate * (1.0 - config.reserved_retry_share);
    let reaction = reaction_seconds(config);
    let partitions = supply.partitions;
    let needed = |required: f64| -> (u64, u32) {
        match replicas_for(required, capacity, partitions) {
            Some(n) => (u64::from(n), n.clamp(supply.floor, supply.cap)),
            None => (unbounded_replicas_for(required, capacity), supply.cap),
        }
    };

    if lambda > 0.0 && group_capacity(supply.cap, partitions, rate) <= lambda {
        let (raw, _) = needed(lambda);
        return Recommendation {
            raw,
            replicas: supply.cap,
            regime: Regime::Undrainable,
            required_rate: lambda,
        };
    }

    // A rising arrival rate is projected two reaction times ahead (at most doubling it), so a
    // ramp is met by one larger step.
    // A projected rise below a tenth of λ is indistinguishable from the noise of a rate()
    // window and is ignored, so a steady workload is not mistaken for a ramp.
    let rise = (demand.produce_rate_trend.max(0.0) * 2.0 * reaction).min(lambda);
    let rise = if rise < TREND_NOISE_SHARE * lambda {
        0.0
    } else {
        rise
    };
    let lambda_ahead = lambda + rise;
    let completing = group_capacity(supply.current, partitions, capacity);
    let backlog_ahead = demand.backlog + (lambda - completing).max(0.0) * reaction;
    let window = drain_window(
        config.target_drain_seconds,
        config.deadline_seconds,
        demand.oldest_age,
        window_floor(config),
    );
    let urgent = demand.oldest_age >= config.warning_at * config.deadline_seconds;
    let (required_rate, regime) = if urgent {
        (lambda_ahead + backlog_ahead / window, Regime::Urgent)
    } else if backlog_ahead / window > lambda_ahead {
        (backlog_ahead / window, Regime::Draining)
    } else {
        (lambda_ahead, Regime::Steady)
    };
    let (raw, replicas) = needed(required_rate);

    if regime == Regime::Steady
        && rise == 0.0
        && let Some(economy) = economy_replicas(config, demand, supply, capacity, replicas, window)
    {
        return Recommendation {
            raw,
            replicas: economy,
            regime: Regime::Economy,
            required_rate,
        };
    }
    Recommendation {
        raw,
        replicas,
        regime,
        required_rate,
    }
}

/// The fewest replicas, below `needed`, that the budget has room for: each smaller count
/// that changes the partition assignment is tried while the backlog and the oldest age it lets
/// build up stay within budget for the dwell.
fn economy_replicas(
    config: &BudgetConfig,
    demand: &Demand,
    supply: &Supply,
    capacity: f64,
    needed: u32,
    window: f64,
) -> Option<u32> {
    let partitions = supply.partitions;
    if demand.produce_rate <= 0.0 || needed == 0 || needed > partitions {
        return None;
    }
    let lowest = supply.floor.max(1);
    let mut chosen = None;
    let mut busiest = partitions.div_ceil(needed);
    loop {
        busiest += 1;
        let fewer = partitions.div_ceil(busiest);
        if fewer < lowest || busiest > partitions {
            break;
        }
        if Some(fewer) == chosen || fewer >= needed {
            continue;
        }
        let staying = supply.economy == Some(fewer) && supply.current <= fewer;
        if !has_room(config, demand, staying, fewer, partitions, capacity, window) {
            break;
        }
        chosen = Some(fewer);
    }
    chosen
}

/// Whether running `replicas` keeps the budget: over the dwell, the backlog stays within what
/// they clear in the drain window and the oldest age stays well below the warning fraction.
fn has_room(
    config: &BudgetConfig,
    demand: &Demand,
    staying: bool,
    replicas: u32,
    partitions: u32,
    capacity: f64,
    window: f64,
) -> bool {
    let behind = shortfall(replicas, partitions, capacity, demand.produce_rate);
    // Entering economy must leave room for a long stay; staying needs room until the next
    // decision only. The difference is the hysteresis that keeps counts from flapping.
    let dwell = if staying {
        reaction_seconds(config)
    } else {
        2.0 * (config.scale_down_stabilization_seconds + reaction_seconds(config))
    };
    let backlog_fits = demand.backlog + behind.backlog_growth * dwell
        <= group_capacity(replicas, partitions, capacity) * window;
    // Economy keeps the oldest age below the warning fraction with a margin, so a budget in
    // economy never reads AtRisk.
    let age_limit = ECONOMY_AGE_SHARE * config.warning_at * config.deadline_seconds;
    let age_fits = demand.oldest_age + dwell * behind.age_growth <= age_limit;
    backlog_fits && age_fits
}

/// Projected rises smaller than this share of λ count as noise.
const TREND_NOISE_SHARE: f64 = 0.1;

/// Share of the warning age economy may use.
const ECONOMY_AGE_SHARE: f64 = 0.9;

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BudgetConfig {
        BudgetConfig {
            rebalance_cost_seconds: 10.0,
            ..crate::budget_config::example()
        }
    }

    fn supply(current: u32) -> Supply {
        Supply {
            per_replica_rate: 250.0,
            current,
            floor: 1,
            cap: 12,
            partitions: 12,
            economy: None,
        }
    }

    fn demand(lambda: f64, backlog: f64, age: f64) -> Demand {
        Demand {
            produce_rate: lambda,
            produce_rate_trend: 0.0,
            backlog,
            oldest_age: age,
        }
    }

    #[test]
    fn steady_load_with_room_runs_in_economy() {
        let r = recommend(&config(), &demand(950.0, 0.0, 0.0), &supply(4));
        assert_eq!(r.regime, Regime::Economy);
        assert_eq!(r.replicas, 3);
    }

    #[test]
    fn economy_ends_when_the_backlog_nears_its_window() {
        // 3 replicas complete 750/s; 225k is what they clear in 5 minutes.
        let in_economy = Supply {
            economy: Some(3),
            ..supply(3)
        };
        let stay = recommend(&config(), &demand(950.0, 150_000.0, 60.0), &in_economy);
        assert_eq!(stay.replicas, 3);
        let leave = recommend(&config(), &demand(950.0, 224_000.0, 60.0), &in_economy);
        assert_eq!(leave.replicas, 4);
        // ... and is not re-entered from 4 until there is room for a long stay.
        let hold = recommend(&config(), &demand(950.0, 150_000.0, 60.0), &supply(4));
        assert_eq!(hold.replicas, 4);
    }

    #[test]
    fn being_far_below_the_need_is_not_economy() {
        // 2500/s against 4 replicas that complete 1000/s: scale up, even with no trend.
        let r = recommend(&config(), &demand(2500.0, 0.0, 1.0), &supply(4));
        assert!(r.replicas >= 12, "{r:?}");
    }

    #[test]
    fn a_rising_rate_is_met_ahead() {
        let flat = recommend(&config(), &demand(1000.0, 0.0, 0.0), &supply(4));
        let mut rising = demand(1000.0, 0.0, 0.0);
        rising.produce_rate_trend = 20.0;
        let ahead = recommend(&config(), &rising, &supply(4));
        assert!(ahead.replicas > flat.replicas.max(4), "{ahead:?}");
    }

    #[test]
    fn urgent_drains_net_of_arrivals_in_the_time_left() {
        let r = recommend(&config(), &demand(1000.0, 100_000.0, 400.0), &supply(4));
        assert_eq!(r.regime, Regime::Urgent);
        // T = 600 − 400 = 200s: 1000 + (100k + 0)/200 = 1500/s → 6 replicas at least.
        assert!(r.replicas >= 6, "{r:?}");
    }

    #[test]
    fn undrainable_recommends_the_cap() {
        let r = recommend(&config(), &demand(3000.0, 0.0, 0.0), &supply(4));
        assert_eq!(r.regime, Regime::Undrainable);
        assert_eq!(r.replicas, 12);
    }
}
