//! When a failed reconcile runs again (pure, but for [`unit_random`]): with exponential
//! backoff and jitter, so that many objects failing together (an API server restart) do not
//! come back together.

use std::time::Duration;

use super::error::Persistence;

/// First retry after a transient failure.
pub const TRANSIENT_BASE: Duration = Duration::from_secs(1);
/// First retry after a permanent failure: at most as late as every failure was retried before
/// backoff, since a grant made a moment ago (a new RoleBinding) can still answer 403; later
/// retries back off until someone changes something.
pub const PERMANENT_BASE: Duration = Duration::from_secs(5);
/// Longest wait between retries of a failing object.
pub const RETRY_CAP: Duration = Duration::from_secs(300);

/// `min(cap, base · 2^(failures−1))`, saturating.
fn upper_bound(base: Duration, failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(32);
    base.checked_mul(1u32 << doublings.min(31))
        .unwrap_or(RETRY_CAP)
        .min(RETRY_CAP)
}

/// The wait before the next attempt after the `failures`-th consecutive failure, with equal
/// jitter: half the bound is fixed (no retry storm of immediate retries) and half is drawn,
/// from `unit` in [0, 1).
pub fn after_failure(persistence: Persistence, failures: u32, unit: f64) -> Duration {
    let base = match persistence {
        Persistence::Transient => TRANSIENT_BASE,
        Persistence::Permanent => PERMANENT_BASE,
    };
    let bound = upper_bound(base, failures.max(1));
    let half = bound / 2;
    half + half.mul_f64(unit.clamp(0.0, 1.0))
}

/// A uniformly distributed number in [0, 1) from the process's random hasher keys.
pub fn unit_random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(DRAWS.fetch_add(1, Ordering::Relaxed));
    // The top 53 bits as the mantissa of a number in [0, 1).
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn transient_failures_back_off_from_a_second_to_five_minutes() {
        let at = |failures, unit| after_failure(Persistence::Transient, failures, unit);
        assert_eq!(at(1, 0.0), Duration::from_millis(500));
        assert_eq!(at(1, 1.0), Duration::from_secs(1));
        assert_eq!(at(4, 1.0), Duration::from_secs(8));
        assert_eq!(at(40, 1.0), RETRY_CAP);
        assert_eq!(at(u32::MAX, 0.0), RETRY_CAP / 2);
        assert_eq!(
            after_failure(Persistence::Permanent, 1, 1.0),
            PERMANENT_BASE
        );
    }

    #[test]
    fn random_units_are_in_range_and_vary() {
        let draws: Vec<f64> = (0..100).map(|_| unit_random()).collect();
        assert!(draws.iter().all(|u| (0.0..1.0).contains(u)));
        let first = draws[0];
        assert!(draws.iter().any(|u| *u != first));
    }

    proptest! {
        /// The wait grows with the failures, stays within [bound/2, bound] and under the cap.
        #[test]
        fn backoff_is_bounded_and_monotone(failures in 1u32..100, unit in 0.0f64..1.0, transient: bool) {
            let persistence = if transient { Persistence::Transient } else { Persistence::Permanent };
            let wait = after_failure(persistence, failures, unit);
            let lowest = after_failure(persistence, failures, 0.0);
            let highest = after_failure(persistence, failures, 1.0);
            prop_assert!(lowest <= wait && wait <= highest);
            prop_assert!(highest <= RETRY_CAP);
            prop_assert!(highest <= lowest * 2 + Duration::from_nanos(1));
            prop_assert!(after_failure(persistence, failures + 1, 0.0) >= lowest);
        }
    }
}
