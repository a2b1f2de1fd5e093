//! `spec.scaling.maxChangesPerHour` (pure): every scale change is a consumer-group rebalance,
//! so a budget may cap how many it makes in any hour. The cap never costs the deadline: a
//! change that brings the replicas into [min, cap], or that scales up while the deadline is at
//! risk or the backlog cannot drain, is always made; anything else waits for the oldest change
//! of the hour to age out.

use jiff::Timestamp;

use crate::stabilization::seconds_between;

/// The window the cap counts in.
pub const WINDOW_SECONDS: f64 = 3600.0;

/// The changes of the last hour, oldest first (older ones are forgotten).
pub fn within_hour(changes: &[Timestamp], now: Timestamp) -> Vec<Timestamp> {
    let mut kept: Vec<Timestamp> = changes
        .iter()
        .copied()
        .filter(|at| {
            let age = seconds_between(*at, now);
            (0.0..WINDOW_SECONDS).contains(&age)
        })
        .collect();
    kept.sort();
    kept
}

/// Whether a change may be made now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Allowance {
    Allowed,
    /// Held: `made` changes in the last hour reach the cap; the next is allowed at `next_at`.
    Held {
        made: usize,
        next_at: Timestamp,
    },
}

/// Whether a change may be made now, given the changes of the last hour.
pub fn allow(
    recent: &[Timestamp],
    max_per_hour: Option<u32>,
    necessary: bool,
    now: Timestamp,
) -> Allowance {
    let Some(max) = max_per_hour else {
        return Allowance::Allowed;
    };
    let recent = within_hour(recent, now);
    if necessary || recent.len() < max as usize {
        return Allowance::Allowed;
    }
    // The change that makes room is the one `max` places from the newest.
    let oldest_counted = recent[recent.len() - max as usize];
    let next_at = oldest_counted
        .checked_add(jiff::SignedDuration::from_secs(WINDOW_SECONDS as i64))
        .unwrap_or(now);
    Allowance::Held {
        made: recent.len(),
        next_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn the_cap_counts_the_last_hour_and_says_when_it_frees() {
        let made = [at(0), at(600), at(1200)];
        assert_eq!(allow(&made, None, false, at(1300)), Allowance::Allowed);
        assert_eq!(allow(&made, Some(4), false, at(1300)), Allowance::Allowed);
        assert_eq!(
            allow(&made, Some(3), false, at(1300)),
            Allowance::Held {
                made: 3,
                next_at: at(3600)
            }
        );
        // Necessary changes are never held.
        assert_eq!(allow(&made, Some(3), true, at(1300)), Allowance::Allowed);
        // An hour after the first, it no longer counts.
        assert_eq!(allow(&made, Some(3), false, at(3600)), Allowance::Allowed);
        assert_eq!(within_hour(&made, at(3600)), vec![at(600), at(1200)]);
    }

    proptest! {
        /// Following the allowance, no hour ever holds more than the cap of unnecessary
        /// changes, whatever the times asked at.
        #[test]
        fn no_hour_holds_more_than_the_cap(
            max in 1u32..10,
            asks in proptest::collection::vec((0i64..30, any::<bool>()), 1..200),
        ) {
            let mut now = 0i64;
            let mut made: Vec<(Timestamp, bool)> = Vec::new();
            for (gap, necessary) in asks {
                now += gap * 15;
                let times: Vec<Timestamp> = made.iter().map(|(t, _)| *t).collect();
                if allow(&times, Some(max), necessary, at(now)) == Allowance::Allowed {
                    made.push((at(now), necessary));
                }
            }
            for (start, _) in &made {
                let optional = made
                    .iter()
                    .filter(|(t, necessary)| {
                        let age = seconds_between(*start, *t);
                        !necessary && (0.0..WINDOW_SECONDS).contains(&age)
                    })
                    .count();
                prop_assert!(optional <= max as usize, "{optional} optional changes within an hour of {start}");
            }
        }
    }
}
