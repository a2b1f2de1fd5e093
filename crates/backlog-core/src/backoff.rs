//! Capped exponential backoff with jitter (seed 000, section 2).
//!
//! `upper(n) = min(cap, base · 2^(n−1))` is the longest a retry may wait after failed attempt
//! `n`; the jitter strategy decides where below that bound the actual delay falls. Jitter
//! matters because failures are correlated: without it, every consumer that failed at the same
//! moment retries at the same moment and hits the recovering dependency together again.

use std::time::Duration;

use rand::{Rng, RngExt};
use thiserror::Error;

use super::go_duration::{MAX_GO_DURATION, format_go_duration};
use crate::retry_policy::Jitter;

/// A validated backoff: `0 < base ≤ cap ≤` [`MAX_GO_DURATION`], plus the jitter strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BackoffSchedule {
    base: Duration,
    cap: Duration,
    jitter: Jitter,
}

/// Why a base/cap pair is not a usable backoff.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum BackoffError {
    /// A zero base would make every retry immediate, which is the retry storm backoff exists
    /// to prevent.
    #[error("the base delay must be positive, such as 100ms")]
    ZeroBase,
    /// The cap bounds every delay, so it cannot be below the first one.
    #[error("the cap {cap} is shorter than the base {base}: raise the cap or lower the base")]
    CapBelowBase {
        /// The base, formatted as a Go duration.
        base: String,
        /// The cap, formatted as a Go duration.
        cap: String,
    },
    /// Longer than any Go consumer could represent.
    #[error("the cap {cap} is longer than the largest Go duration, 2562047h47m16.854775807s")]
    CapTooLong {
        /// The cap, formatted as a Go duration.
        cap: String,
    },
}

impl BackoffSchedule {
    /// A backoff with first upper bound `base`, growing ×2 per failed attempt up to `cap`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use backlog_core::retry_policy::Jitter;
    /// use backlog_core::backoff::BackoffSchedule;
    ///
    /// let backoff = BackoffSchedule::new(Duration::from_millis(100), Duration::from_secs(10), Jitter::Full)?;
    /// assert_eq!(backoff.upper_bound(1), Duration::from_millis(100));
    /// assert_eq!(backoff.upper_bound(4), Duration::from_millis(800));
    /// assert_eq!(backoff.upper_bound(u32::MAX), Duration::from_secs(10));
    /// # Ok::<(), backlog_core::backoff::BackoffError>(())
    /// ```
    pub fn new(base: Duration, cap: Duration, jitter: Jitter) -> Result<Self, BackoffError> {
        if base.is_zero() {
            return Err(BackoffError::ZeroBase);
        }
        if cap < base {
            return Err(BackoffError::CapBelowBase {
                base: format_go_duration(base),
                cap: format_go_duration(cap),
            });
        }
        if cap > MAX_GO_DURATION {
            return Err(BackoffError::CapTooLong {
                cap: format_go_duration(cap),
            });
        }
        Ok(Self { base, cap, jitter })
    }

    /// The upper bound of the first retry's delay.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The longest any retry waits.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// How delays are drawn below the upper bound.
    pub fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// `upper(n) = min(cap, base · 2^(n−1))`: the longest the retry after failed attempt `n`
    /// may wait. Saturates at `cap` for any `n`, `u32::MAX` included; `n = 0` is treated as 1
    /// (attempt 1 is the first execution, so there is no attempt 0).
    pub fn upper_bound(&self, failed_attempt: u32) -> Duration {
        let doublings = failed_attempt.max(1) - 1;
        let cap_nanos = duration_nanos(self.cap);
        // base ≥ 1ns and cap ≤ 2^63 ns, so 63 or more doublings always reach the cap; below
        // that, a multiplication that overflows u64 has passed the cap as well.
        let unclamped = 1_u64
            .checked_shl(doublings)
            .and_then(|factor| duration_nanos(self.base).checked_mul(factor));
        let upper_nanos = unclamped.map_or(cap_nanos, |nanos| nanos.min(cap_nanos));
        Duration::from_nanos(upper_nanos)
    }

    /// The delay before the retry after failed attempt `n`, drawn from `rng`:
    /// Full jitter uniformly in `[0, upper(n)]`, Equal jitter uniformly in
    /// `[⌈upper(n)/2⌉, upper(n)]`, None exactly `upper(n)`. Nanosecond resolution.
    pub fn draw_delay<R: Rng + ?Sized>(&self, failed_attempt: u32, rng: &mut R) -> Duration {
        let upper = duration_nanos(self.upper_bound(failed_attempt));
        let nanos = match self.jitter {
            Jitter::Full => rng.random_range(0..=upper),
            // Rounding the lower end up keeps the delay at or above half the bound.
            Jitter::Equal => rng.random_range(upper - upper / 2..=upper),
            Jitter::None => upper,
        };
        Duration::from_nanos(nanos)
    }
}

/// Nanoseconds of a duration known to be at most [`MAX_GO_DURATION`] (so it fits a u64).
fn duration_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn schedule(base_ms: u64, cap_ms: u64, jitter: Jitter) -> BackoffSchedule {
        BackoffSchedule::new(
            Duration::from_millis(base_ms),
            Duration::from_millis(cap_ms),
            jitter,
        )
        .expect("valid backoff")
    }

    pub(crate) fn any_backoff() -> impl Strategy<Value = BackoffSchedule> {
        (
            1u64..=MAX_GO_DURATION.as_nanos() as u64,
            0.0f64..=1.0,
            prop_oneof![Just(Jitter::Full), Just(Jitter::Equal), Just(Jitter::None)],
        )
            .prop_map(|(cap, base_share, jitter)| {
                let base = ((cap as f64 * base_share) as u64).clamp(1, cap);
                BackoffSchedule::new(
                    Duration::from_nanos(base),
                    Duration::from_nanos(cap),
                    jitter,
                )
                .expect("base ≤ cap by construction")
            })
    }

    #[test]
    fn known_bounds() {
        let backoff = schedule(100, 10_000, Jitter::Full);
        let bounds: Vec<u64> = (1..=9)
            .map(|n| backoff.upper_bound(n).as_millis() as u64)
            .collect();
        assert_eq!(
            bounds,
            [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000]
        );
        assert_eq!(backoff.upper_bound(0), backoff.upper_bound(1));
        assert_eq!(backoff.upper_bound(64), Duration::from_secs(10));
        assert_eq!(backoff.upper_bound(u32::MAX), Duration::from_secs(10));
    }

    #[test]
    fn refuses_invalid_pairs() {
        let second = Duration::from_secs(1);
        assert_eq!(
            BackoffSchedule::new(Duration::ZERO, second, Jitter::Full),
            Err(BackoffError::ZeroBase)
        );
        assert!(matches!(
            BackoffSchedule::new(second * 2, second, Jitter::Full),
            Err(BackoffError::CapBelowBase { .. })
        ));
        assert!(matches!(
            BackoffSchedule::new(second, MAX_GO_DURATION + second, Jitter::Full),
            Err(BackoffError::CapTooLong { .. })
        ));
    }

    #[test]
    fn no_jitter_waits_exactly_the_bound() {
        let backoff = schedule(100, 10_000, Jitter::None);
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(backoff.draw_delay(3, &mut rng), Duration::from_millis(400));
    }

    proptest! {
        #[test]
        fn upper_bound_is_monotone_and_capped(backoff in any_backoff(), n in any::<u32>()) {
            let upper = backoff.upper_bound(n);
            prop_assert!(upper <= backoff.cap());
            prop_assert!(upper >= backoff.base().min(backoff.cap()));
            prop_assert!(backoff.upper_bound(n.saturating_add(1)) >= upper);
        }

        #[test]
        fn upper_bound_doubles_until_the_cap(backoff in any_backoff(), n in 1u32..70) {
            let expected = backoff.upper_bound(n).saturating_mul(2).min(backoff.cap());
            prop_assert_eq!(backoff.upper_bound(n + 1), expected);
        }

        #[test]
        fn delays_stay_within_the_jitter_range(backoff in any_backoff(), n in any::<u32>(), seed in any::<u64>()) {
            let mut rng = StdRng::seed_from_u64(seed);
            let upper = backoff.upper_bound(n);
            let delay = backoff.draw_delay(n, &mut rng);
            prop_assert!(delay <= upper);
            match backoff.jitter() {
                Jitter::Full => {}
                Jitter::Equal => prop_assert!(delay * 2 >= upper, "{delay:?} below half of {upper:?}"),
                Jitter::None => prop_assert_eq!(delay, upper),
            }
        }

        #[test]
        fn same_seed_same_delays(backoff in any_backoff(), seed in any::<u64>()) {
            let draw = |seed| {
                let mut rng = StdRng::seed_from_u64(seed);
                (1..=20).map(|n| backoff.draw_delay(n, &mut rng)).collect::<Vec<_>>()
            };
            prop_assert_eq!(draw(seed), draw(seed));
        }
    }
}
