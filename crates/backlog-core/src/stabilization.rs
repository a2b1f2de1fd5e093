//! Stabilization windows: a recommendation must persist before the replicas follow it.
//!
//! Scaling down goes to the highest recommendation of the last `scaleDownStabilization`
//! seconds (the HPA's rule), and only once that value is not about to expire at the next poll,
//! so a fading burst ends in one step down instead of a staircase of rebalances. Scaling up
//! (when a window is set) goes to the lowest recommendation since the rise began. Both are
//! kept in status, so an operator restart does not reset them.

use jiff::Timestamp;

/// A recommendation and when it was made (or, for scale-up, since when it has held).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pending {
    pub since: Timestamp,
    pub replicas: u32,
}

/// Direction-specific memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Windows {
    pub up: Option<Pending>,
    /// The recommendations of the scale-down window that can still be its highest: oldest
    /// first, replicas strictly decreasing, so the first is the window's maximum.
    pub down: Vec<Pending>,
}

/// What the windows allow now.
#[derive(Clone, Debug, PartialEq)]
pub struct Stabilized {
    /// Replicas to have now.
    pub replicas: u32,
    /// Seconds left before a pending change may happen, if one is waiting.
    pub waiting_seconds: Option<f64>,
    pub windows: Windows,
}

/// Window lengths and the time to the next decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowSettings {
    pub up_seconds: f64,
    pub down_seconds: f64,
    pub poll_seconds: f64,
}

/// Seconds from `earlier` to `later` (negative if `later` is before `earlier`).
pub fn seconds_between(earlier: Timestamp, later: Timestamp) -> f64 {
    (later.as_millisecond() - earlier.as_millisecond()) as f64 / 1000.0
}

/// Applies the windows to a fresh recommendation.
pub fn stabilize(
    current: u32,
    recommendation: u32,
    windows: &Windows,
    settings: WindowSettings,
    now: Timestamp,
) -> Stabilized {
    let mut stabilized = stabilize_raw(current, recommendation, windows, settings, now);
    // A window holding only "the replicas we have" is what an empty window stands for (it is
    // seeded with them at the next lower recommendation), so keep it empty: a steady budget
    // then has nothing new to write to its status each poll.
    if let [only] = stabilized.windows.down.as_slice()
        && only.replicas == stabilized.replicas
    {
        stabilized.windows.down.clear();
    }
    stabilized
}

fn stabilize_raw(
    current: u32,
    recommendation: u32,
    windows: &Windows,
    settings: WindowSettings,
    now: Timestamp,
) -> Stabilized {
    let down = remember(
        &windows.down,
        current,
        recommendation,
        settings.down_seconds,
        now,
    );
    let highest = down.first().map_or(recommendation, |p| p.replicas);

    if recommendation > current {
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
        let waited = seconds_between(pending.since, now);
        return if waited >= settings.up_seconds {
            Stabilized {
                replicas: pending.replicas,
                waiting_seconds: None,
                windows: Windows { up: None, down },
            }
        } else {
            Stabilized {
                replicas: current,
                waiting_seconds: Some(settings.up_seconds - waited),
                windows: Windows {
                    up: Some(pending),
                    down,
                },
            }
        };
    }

    if highest < current {
        // The window's maximum is below the current count. Wait while it is about to fall
        // further at the next poll: one step to the settled level beats a staircase.
        let expires_in = down.first().map_or(0.0, |p| {
            settings.down_seconds - seconds_between(p.since, now)
        });
        if down.len() > 1 && expires_in <= settings.poll_seconds {
            return Stabilized {
                replicas: current,
                waiting_seconds: Some(expires_in.max(0.0)),
                windows: Windows { up: None, down },
            };
        }
        return Stabilized {
            replicas: highest,
            waiting_seconds: None,
            windows: Windows { up: None, down },
        };
    }

    // Nothing to do yet; if the recommendation is lower, say when the window lets it through.
    let waiting_seconds = (recommendation < current).then(|| {
        down.iter()
            .filter(|p| p.replicas > recommendation)
            .map(|p| settings.down_seconds - seconds_between(p.since, now))
            .fold(0.0, f64::max)
    });
    Stabilized {
        replicas: current,
        waiting_seconds,
        windows: Windows { up: None, down },
    }
}

/// The scale-down window after adding `recommendation`: expired entries dropped, entries that
/// can no longer be the maximum dropped. An empty window starts with the current replicas, as
/// if they had just been recommended, so nothing scales down before a whole window has passed.
/// Seconds until a recommendation of `candidate` replicas made now would be followed, if
/// none higher comes: until every higher one in the window has expired, or a whole window when
/// it is empty (the first lower recommendation starts it).
pub fn down_wait(
    window: &[Pending],
    current: u32,
    candidate: u32,
    window_seconds: f64,
    now: Timestamp,
) -> f64 {
    if candidate >= current || window_seconds <= 0.0 {
        return 0.0;
    }
    if window.is_empty() {
        return window_seconds;
    }
    window
        .iter()
        .filter(|p| p.replicas > candidate)
        .map(|p| window_seconds - seconds_between(p.since, now))
        .fold(0.0, f64::max)
}

fn remember(
    window: &[Pending],
    current: u32,
    recommendation: u32,
    window_seconds: f64,
    now: Timestamp,
) -> Vec<Pending> {
    let mut kept: Vec<Pending> = window
        .iter()
        .copied()
        .filter(|p| seconds_between(p.since, now) < window_seconds)
        .collect();
    if window.is_empty() && window_seconds > 0.0 {
        kept.push(Pending {
            since: now,
            replicas: current,
        });
    }
    while kept.last().is_some_and(|p| p.replicas <= recommendation) {
        kept.pop();
    }
    kept.push(Pending {
        since: now,
        replicas: recommendation,
    });
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn a_lower_count_waits_for_every_higher_recommendation_to_expire() {
        assert_eq!(down_wait(&[], 8, 4, 180.0, at(0)), 180.0);
        let window = [
            Pending {
                since: at(0),
                replicas: 8,
            },
            Pending {
                since: at(60),
                replicas: 6,
            },
        ];
        assert_eq!(down_wait(&window, 8, 4, 180.0, at(100)), 140.0);
        assert_eq!(down_wait(&window, 8, 6, 180.0, at(100)), 80.0);
        assert_eq!(down_wait(&window, 8, 8, 180.0, at(100)), 0.0);
        assert_eq!(down_wait(&window, 8, 4, 180.0, at(300)), 0.0);
    }

    const SETTINGS: WindowSettings = WindowSettings {
        up_seconds: 0.0,
        down_seconds: 300.0,
        poll_seconds: 15.0,
    };

    #[test]
    fn scale_down_waits_a_whole_window_and_takes_its_highest_recommendation() {
        let first = stabilize(10, 4, &Windows::default(), SETTINGS, at(0));
        assert_eq!(first.replicas, 10);
        let second = stabilize(10, 6, &first.windows, SETTINGS, at(100));
        assert_eq!(second.replicas, 10);
        assert_eq!(second.waiting_seconds, Some(200.0));
        let third = stabilize(10, 3, &second.windows, SETTINGS, at(300));
        assert_eq!(third.replicas, 6);
    }

    #[test]
    fn a_fading_burst_ends_in_one_step() {
        let mut windows = Windows::default();
        let mut replicas = 16;
        let mut changes = vec![];
        for (t, rec) in [(0, 16), (15, 14), (30, 10), (45, 6), (60, 3)]
            .into_iter()
            .chain((75..=600).step_by(15).map(|t| (t, 2)))
        {
            let s = stabilize(replicas, rec, &windows, SETTINGS, at(t));
            if s.replicas != replicas {
                changes.push((t, s.replicas));
                replicas = s.replicas;
            }
            windows = s.windows;
        }
        assert_eq!(changes, vec![(360, 2)]);
    }

    #[test]
    fn scale_up_without_window_is_immediate() {
        let s = stabilize(2, 8, &Windows::default(), SETTINGS, at(0));
        assert_eq!(s.replicas, 8);
    }

    #[test]
    fn a_recommendation_back_at_the_current_count_restarts_the_wait() {
        let first = stabilize(10, 4, &Windows::default(), SETTINGS, at(0));
        let second = stabilize(10, 10, &first.windows, SETTINGS, at(200));
        assert!(second.windows.down.is_empty());
        let third = stabilize(10, 4, &second.windows, SETTINGS, at(215));
        assert_eq!(third.replicas, 10);
        assert_eq!(third.waiting_seconds, Some(300.0));
        let fourth = stabilize(10, 4, &third.windows, SETTINGS, at(514));
        assert_eq!(fourth.replicas, 10);
        let fifth = stabilize(10, 4, &fourth.windows, SETTINGS, at(515));
        assert_eq!(fifth.replicas, 4);
    }

    #[test]
    fn scale_up_window_takes_the_lowest_recommendation() {
        let settings = WindowSettings {
            up_seconds: 60.0,
            ..SETTINGS
        };
        let first = stabilize(2, 8, &Windows::default(), settings, at(0));
        assert_eq!(first.replicas, 2);
        let second = stabilize(2, 6, &first.windows, settings, at(30));
        assert_eq!(second.replicas, 2);
        let third = stabilize(2, 9, &second.windows, settings, at(60));
        assert_eq!(third.replicas, 6);
    }
}
