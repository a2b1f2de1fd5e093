//! Drain math: how fast the workload must complete events to meet its deadline, and how long
//! the backlog takes to drain at a given capacity (B / (μ − λ), seed 000 section 5).

/// Completion rate (events/s) that clears `backlog` within `window_seconds` while `produce_rate`
/// keeps arriving: μ* = λ + B / T.
pub fn required_rate(produce_rate: f64, backlog: f64, window_seconds: f64) -> f64 {
    produce_rate + backlog / window_seconds
}

/// The time the backlog may take: the target drain time, or less when the oldest event is
/// already close to its deadline. Bounded below by `floor_seconds` so a deadline that has
/// already passed asks for the most capacity instead of dividing by zero.
pub fn drain_window(
    target_drain_seconds: f64,
    deadline_seconds: f64,
    oldest_age_seconds: f64,
    floor_seconds: f64,
) -> f64 {
    target_drain_seconds
        .min(deadline_seconds - oldest_age_seconds)
        .max(floor_seconds)
}

/// Replicas needed for `rate` when one replica gives `per_replica_capacity` (> 0).
pub fn replicas_for(rate: f64, per_replica_capacity: f64) -> u64 {
    let replicas = (rate / per_replica_capacity).ceil();
    if replicas.is_finite() && replicas > 0.0 {
        // Saturates for absurd inputs instead of wrapping.
        replicas.min(u32::MAX as f64) as u64
    } else {
        0
    }
}

/// Seconds to drain `backlog` when completing at `completion_rate` while `produce_rate`
/// arrives; `None` when the backlog cannot shrink.
pub fn drain_seconds(backlog: f64, produce_rate: f64, completion_rate: f64) -> Option<f64> {
    if backlog <= 0.0 {
        Some(0.0)
    } else if completion_rate > produce_rate {
        Some(backlog / (completion_rate - produce_rate))
    } else {
        None
    }
}

/// Estimated age of the oldest unfinished event when no query reports it: by Little's law
/// the wait in a FIFO queue is B / λ; with nothing arriving, the time to work through it.
pub fn estimate_oldest_age(backlog: f64, produce_rate: f64, completion_capacity: f64) -> f64 {
    if backlog <= 0.0 {
        0.0
    } else if produce_rate > 0.0 {
        backlog / produce_rate
    } else if completion_capacity > 0.0 {
        backlog / completion_capacity
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn required_rate_adds_the_backlog_share() {
        assert_eq!(required_rate(1000.0, 60_000.0, 300.0), 1200.0);
    }

    #[test]
    fn window_shrinks_near_the_deadline_and_never_reaches_zero() {
        assert_eq!(drain_window(300.0, 600.0, 100.0, 15.0), 300.0);
        assert_eq!(drain_window(300.0, 600.0, 400.0, 15.0), 200.0);
        assert_eq!(drain_window(300.0, 600.0, 700.0, 15.0), 15.0);
    }

    #[test]
    fn replicas_round_up() {
        assert_eq!(replicas_for(1001.0, 250.0), 5);
        assert_eq!(replicas_for(1000.0, 250.0), 4);
        assert_eq!(replicas_for(0.0, 250.0), 0);
        assert_eq!(replicas_for(1e30, 1e-30), u32::MAX as u64);
    }

    #[test]
    fn drain_time_is_b_over_mu_minus_lambda() {
        assert_eq!(drain_seconds(60_000.0, 1000.0, 1200.0), Some(300.0));
        assert_eq!(drain_seconds(60_000.0, 1000.0, 1000.0), None);
        assert_eq!(drain_seconds(0.0, 1000.0, 10.0), Some(0.0));
    }

    #[test]
    fn oldest_age_estimate_uses_littles_law() {
        assert_eq!(estimate_oldest_age(3000.0, 100.0, 500.0), 30.0);
        assert_eq!(estimate_oldest_age(3000.0, 0.0, 500.0), 6.0);
        assert_eq!(estimate_oldest_age(0.0, 100.0, 500.0), 0.0);
    }
}
