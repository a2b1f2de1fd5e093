//! Stabilization windows: a recommendation must persist before the replicas follow it.
//!
//! Scaling down waits `scaleDownStabilization` and then goes to the highest recommendation seen
//! during the wait; scaling up (when a window is set) goes to the lowest. The window's start is
//! kept in status, so an operator restart does not reset it.

use k8s_openapi::jiff::Timestamp;

/// A recommendation waiting out its window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pending {
    pub since: Timestamp,
    pub replicas: u32,
}

/// Direction-specific pending recommendations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Windows {
    pub up: Option<Pending>,
    pub down: Option<Pending>,
}

/// What the windows allow now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stabilized {
    /// Replicas to have now.
    pub replicas: u32,
    /// Seconds left before a pending change may happen, if one is waiting.
    pub waiting_seconds: Option<f64>,
    pub windows: Windows,
}

/// Seconds from `earlier` to `later` (negative if `later` is before `earlier`).
pub fn seconds_between(earlier: Timestamp, later: Timestamp) -> f64 {
    (later.as_millisecond() - earlier.as_millisecond()) as f64 / 1000.0
}

/// Applies the windows to a fresh recommendation.
pub fn stabilize(
    current: u32,
    recommendation: u32,
    windows: Windows,
    up_window_seconds: f64,
    down_window_seconds: f64,
    now: Timestamp,
) -> Stabilized {
    use std::cmp::Ordering;
    match recommendation.cmp(&current) {
        Ordering::Equal => Stabilized {
            replicas: current,
            waiting_seconds: None,
            windows: Windows::default(),
        },
        Ordering::Greater => {
            let pending = match windows.up {
                Some(p) => Pending {
                    since: p.since,
                    replicas: p.replicas.min(recommendation),
                },
                None => Pending {
                    since: now,
                    replicas: recommendation,
                },
            };
            settle(current, pending, up_window_seconds, now, |w| Windows {
                up: w,
                down: None,
            })
        }
        Ordering::Less => {
            let pending = match windows.down {
                Some(p) => Pending {
                    since: p.since,
                    replicas: p.replicas.max(recommendation),
                },
                None => Pending {
                    since: now,
                    replicas: recommendation,
                },
            };
            settle(current, pending, down_window_seconds, now, |w| Windows {
                up: None,
                down: w,
            })
        }
    }
}

fn settle(
    current: u32,
    pending: Pending,
    window_seconds: f64,
    now: Timestamp,
    windows: impl Fn(Option<Pending>) -> Windows,
) -> Stabilized {
    let waited = seconds_between(pending.since, now);
    if waited >= window_seconds {
        Stabilized {
            replicas: pending.replicas,
            waiting_seconds: None,
            windows: windows(None),
        }
    } else {
        Stabilized {
            replicas: current,
            waiting_seconds: Some(window_seconds - waited),
            windows: windows(Some(pending)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn scale_down_waits_and_takes_the_highest_recommendation() {
        let first = stabilize(10, 4, Windows::default(), 0.0, 300.0, at(0));
        assert_eq!(first.replicas, 10);
        let second = stabilize(10, 6, first.windows, 0.0, 300.0, at(100));
        assert_eq!(second.replicas, 10);
        assert_eq!(second.waiting_seconds, Some(200.0));
        let third = stabilize(10, 3, second.windows, 0.0, 300.0, at(300));
        assert_eq!(third.replicas, 6);
        assert_eq!(third.windows, Windows::default());
    }

    #[test]
    fn scale_up_without_window_is_immediate() {
        let s = stabilize(2, 8, Windows::default(), 0.0, 300.0, at(0));
        assert_eq!(s.replicas, 8);
    }

    #[test]
    fn a_recommendation_back_at_current_resets_the_window() {
        let first = stabilize(10, 4, Windows::default(), 0.0, 300.0, at(0));
        let second = stabilize(10, 10, first.windows, 0.0, 300.0, at(200));
        let third = stabilize(10, 4, second.windows, 0.0, 300.0, at(400));
        assert_eq!(third.replicas, 10);
        assert_eq!(third.waiting_seconds, Some(300.0));
    }
}
