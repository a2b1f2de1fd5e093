//! The retry budget: retries may be at most `maxRetryRatio` of primary executions.
//!
//! `maxAttempts` bounds retries per event; the budget bounds them per consumer. Without it, a
//! dependency that fails for everyone turns every event into `maxAttempts` executions at the
//! worst possible moment (seed 000: retries amplify load on an already overloaded dependency).
//! With it, a consumer whose retries would exceed the share quarantines instead, and the fleet
//! executes at most `1 + maxRetryRatio` times its primary work.
//!
//! The tracker counts over a sliding window split into [`WINDOW_SLOTS`] slots. It is pure: the
//! caller passes the current time as a [`Duration`] since any fixed origin of its choosing
//! (for example `start.elapsed()` for an `Instant` taken at startup).

use std::time::Duration;

use thiserror::Error;

use super::retry_policy::ValidatedRetryPolicy;

/// How many slots the window is split into: the window slides one slot at a time, so it
/// always covers between 90% and 100% of its nominal length.
pub const WINDOW_SLOTS: usize = 10;

/// The window used by [`RetryBudgetTracker::for_policy`]: long enough to smooth bursts, short
/// enough that a recovered dependency gets its retries back quickly.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);

/// Why a tracker cannot be built.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum RetryBudgetError {
    /// The ratio is a share of primary executions.
    #[error("maxRetryRatio {0} is out of range: use a share between 0 and 1, such as 0.1")]
    RatioOutOfRange(f64),
    /// A window of zero length counts nothing.
    #[error("the retry budget window must be positive, such as 10s")]
    EmptyWindow,
}

/// Executions counted in the current window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowCounts {
    /// First executions of events (attempt 1).
    pub primaries: u64,
    /// Re-executions (attempt 2 and later) the budget granted.
    pub retries: u64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum RetryLimit {
    Unlimited,
    Share {
        max_retry_ratio: f64,
        minimum_retries: u64,
    },
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct WindowSlot {
    index: u64,
    counts: WindowCounts,
}

/// Answers "may I retry now?" so that retries in the window stay within
/// `max(minimum_retries, ⌊maxRetryRatio × primaries⌋)`.
///
/// Use: call [`record_primary`](Self::record_primary) for every first execution and
/// [`try_acquire_retry`](Self::try_acquire_retry) before every retry (the
/// [`RetryPlanner`](crate::retry_planner::RetryPlanner) does the latter for you). A granted retry is counted;
/// a refused one is not.
///
/// ```
/// use std::time::Duration;
/// use backlog_core::retry_budget::RetryBudgetTracker;
///
/// let mut budget = RetryBudgetTracker::new(0.1, Duration::from_secs(10))?;
/// let now = Duration::from_secs(100);
/// for _ in 0..20 {
///     budget.record_primary(now);
/// }
/// assert!(budget.try_acquire_retry(now)); // 1 of 2 allowed
/// assert!(budget.try_acquire_retry(now)); // 2 of 2
/// assert!(!budget.try_acquire_retry(now)); // the third would exceed 10% of 20
/// // Ten seconds later the window has slid past those executions.
/// assert!(!budget.may_retry(now + Duration::from_secs(10)));
/// # Ok::<(), backlog_core::retry_budget::RetryBudgetError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RetryBudgetTracker {
    limit: RetryLimit,
    slot_width_nanos: u128,
    slots: [WindowSlot; WINDOW_SLOTS],
    latest_slot: u64,
}

impl RetryBudgetTracker {
    /// A tracker allowing retries up to `max_retry_ratio` (in `[0, 1]`) of the primary
    /// executions seen in the last `window`.
    pub fn new(max_retry_ratio: f64, window: Duration) -> Result<Self, RetryBudgetError> {
        if !(0.0..=1.0).contains(&max_retry_ratio) {
            return Err(RetryBudgetError::RatioOutOfRange(max_retry_ratio));
        }
        if window.is_zero() {
            return Err(RetryBudgetError::EmptyWindow);
        }
        Ok(Self::with_limit(
            RetryLimit::Share {
                max_retry_ratio,
                minimum_retries: 0,
            },
            window,
        ))
    }

    /// The tracker for a validated policy's `retryBudget`, over [`DEFAULT_WINDOW`].
    pub fn for_policy(policy: &impl ValidatedRetryPolicy) -> Self {
        Self::with_limit(
            RetryLimit::Share {
                max_retry_ratio: policy.max_retry_ratio(),
                minimum_retries: 0,
            },
            DEFAULT_WINDOW,
        )
    }

    /// A tracker that grants every retry: for consumers without a budget, and for tests.
    /// `maxAttempts` still bounds retries per event.
    pub fn unlimited() -> Self {
        Self::with_limit(RetryLimit::Unlimited, DEFAULT_WINDOW)
    }

    /// Allows at least `minimum` retries per window whatever the traffic. The default is 0,
    /// which makes the ratio a hard cap; a small floor keeps a quiet consumer (a few events per
    /// window) from quarantining its first transient failures, at the price of exceeding the
    /// ratio at low volume, where the extra load is negligible.
    #[must_use]
    pub fn with_minimum_retries(mut self, minimum: u32) -> Self {
        if let RetryLimit::Share {
            minimum_retries, ..
        } = &mut self.limit
        {
            *minimum_retries = u64::from(minimum);
        }
        self
    }

    fn with_limit(limit: RetryLimit, window: Duration) -> Self {
        let slot_width_nanos = (window.as_nanos() / WINDOW_SLOTS as u128).max(1);
        Self {
            limit,
            slot_width_nanos,
            slots: [WindowSlot::default(); WINDOW_SLOTS],
            latest_slot: 0,
        }
    }

    /// The configured share, or `None` for an unlimited tracker.
    pub fn max_retry_ratio(&self) -> Option<f64> {
        match self.limit {
            RetryLimit::Unlimited => None,
            RetryLimit::Share {
                max_retry_ratio, ..
            } => Some(max_retry_ratio),
        }
    }

    /// Counts one primary execution (attempt 1) at `now`.
    pub fn record_primary(&mut self, now: Duration) {
        let slot = self.slot_for_update(now);
        slot.primaries = slot.primaries.saturating_add(1);
    }

    /// Whether a retry at `now` would be granted, without counting it.
    pub fn may_retry(&self, now: Duration) -> bool {
        let counts = self.counts(now);
        match self.limit {
            RetryLimit::Unlimited => true,
            RetryLimit::Share {
                max_retry_ratio,
                minimum_retries,
            } => counts.retries < allowance(max_retry_ratio, counts.primaries).max(minimum_retries),
        }
    }

    /// Grants and counts a retry at `now` if the budget allows it; returns whether it did.
    pub fn try_acquire_retry(&mut self, now: Duration) -> bool {
        if !self.may_retry(now) {
            return false;
        }
        let slot = self.slot_for_update(now);
        slot.retries = slot.retries.saturating_add(1);
        true
    }

    /// Primary executions and granted retries in the window ending at `now`.
    pub fn counts(&self, now: Duration) -> WindowCounts {
        let current = self.slot_index(now);
        self.slots
            .iter()
            .filter(|slot| slot.index <= current && current - slot.index < WINDOW_SLOTS as u64)
            .fold(WindowCounts::default(), |total, slot| WindowCounts {
                primaries: total.primaries.saturating_add(slot.counts.primaries),
                retries: total.retries.saturating_add(slot.counts.retries),
            })
    }

    /// The slot `now` falls in. A clock that goes backwards is treated as standing still, so
    /// counts are never attributed to a slot that has already slid out of the window.
    fn slot_index(&self, now: Duration) -> u64 {
        let index = u64::try_from(now.as_nanos() / self.slot_width_nanos).unwrap_or(u64::MAX);
        index.max(self.latest_slot)
    }

    fn slot_for_update(&mut self, now: Duration) -> &mut WindowCounts {
        let index = self.slot_index(now);
        self.latest_slot = index;
        let slot = &mut self.slots[(index % WINDOW_SLOTS as u64) as usize];
        if slot.index != index {
            *slot = WindowSlot {
                index,
                counts: WindowCounts::default(),
            };
        }
        &mut slot.counts
    }
}

/// `⌊ratio × primaries⌋`, with a tolerance so that decimal ratios such as 0.1 × 30 are not
/// rounded down to 2 by binary floating point.
fn allowance(max_retry_ratio: f64, primaries: u64) -> u64 {
    const ROUNDING_TOLERANCE: f64 = 1e-9;
    // `as` saturates for floats out of the u64 range, which is the behavior wanted here.
    (max_retry_ratio * primaries as f64 + ROUNDING_TOLERANCE).floor() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn refuses_bad_configuration() {
        assert_eq!(
            RetryBudgetTracker::new(1.5, SECOND),
            Err(RetryBudgetError::RatioOutOfRange(1.5))
        );
        assert!(RetryBudgetTracker::new(f64::NAN, SECOND).is_err());
        assert_eq!(
            RetryBudgetTracker::new(0.1, Duration::ZERO),
            Err(RetryBudgetError::EmptyWindow)
        );
    }

    #[test]
    fn ratio_of_primaries_in_window() {
        let mut budget = RetryBudgetTracker::new(0.1, 10 * SECOND).expect("valid");
        for _ in 0..30 {
            budget.record_primary(SECOND);
        }
        let granted = (0..10).filter(|_| budget.try_acquire_retry(SECOND)).count();
        assert_eq!(granted, 3);
        assert_eq!(
            budget.counts(SECOND),
            WindowCounts {
                primaries: 30,
                retries: 3
            }
        );
    }

    #[test]
    fn window_slides() {
        let mut budget = RetryBudgetTracker::new(0.5, 10 * SECOND).expect("valid");
        budget.record_primary(Duration::ZERO);
        budget.record_primary(Duration::ZERO);
        assert!(budget.try_acquire_retry(5 * SECOND));
        assert!(!budget.may_retry(5 * SECOND));
        // The primaries at 0s leave the window at 10s, the retry at 5s at 15s.
        assert_eq!(budget.counts(10 * SECOND).primaries, 0);
        assert_eq!(budget.counts(10 * SECOND).retries, 1);
        assert_eq!(budget.counts(15 * SECOND), WindowCounts::default());
    }

    #[test]
    fn zero_ratio_never_retries_and_minimum_is_a_floor() {
        let mut budget = RetryBudgetTracker::new(0.0, SECOND).expect("valid");
        budget.record_primary(Duration::ZERO);
        assert!(!budget.may_retry(Duration::ZERO));
        let mut quiet = RetryBudgetTracker::new(0.1, SECOND)
            .expect("valid")
            .with_minimum_retries(2);
        assert!(quiet.try_acquire_retry(Duration::ZERO));
        assert!(quiet.try_acquire_retry(Duration::ZERO));
        assert!(!quiet.try_acquire_retry(Duration::ZERO));
    }

    #[test]
    fn clock_going_backwards_counts_in_the_latest_slot() {
        let mut budget = RetryBudgetTracker::new(1.0, 10 * SECOND).expect("valid");
        budget.record_primary(100 * SECOND);
        budget.record_primary(SECOND);
        assert_eq!(budget.counts(100 * SECOND).primaries, 2);
    }

    #[test]
    fn unlimited_grants_everything() {
        let mut budget = RetryBudgetTracker::unlimited();
        assert!((0..1000).all(|_| budget.try_acquire_retry(Duration::MAX)));
        assert_eq!(budget.max_retry_ratio(), None);
    }

    proptest! {
        #[test]
        fn retries_never_exceed_the_share(
            ratio in 0.0f64..=1.0,
            steps in prop::collection::vec((any::<bool>(), 0u64..2_000), 1..400),
        ) {
            let mut budget = RetryBudgetTracker::new(ratio, 10 * SECOND).expect("valid");
            let mut now = Duration::ZERO;
            for (is_primary, advance_ms) in steps {
                now += Duration::from_millis(advance_ms);
                if is_primary {
                    budget.record_primary(now);
                } else if budget.try_acquire_retry(now) {
                    // Checked at grant time: later, primaries may slide out of the window
                    // before the retries they paid for do.
                    let counts = budget.counts(now);
                    prop_assert!(counts.retries as f64 <= ratio * counts.primaries as f64 + 1e-6);
                }
            }
        }
    }
}
