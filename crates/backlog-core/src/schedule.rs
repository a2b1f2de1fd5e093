//! The worst case a policy allows: what `backlog-operator explain` prints and the RetryPolicy
//! controller publishes in status.
//!
//! An event fails at most `maxAttempts − 1` times before its last attempt, and each retry waits
//! at most `upper(n)` after failed attempt `n`, so the longest an event can spend waiting for
//! retries is `Σ upper(n)` for `n = 1 … maxAttempts − 1`. A budget whose completion deadline is
//! shorter than that cannot be met by an event that needs all its attempts.

use std::fmt;
use std::time::Duration;

use super::go_duration::format_go_duration;
use super::retry_policy::ValidatedRetryPolicy;

/// One retry in the worst case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduledRetry {
    /// The execution this retry is: 2 for the first retry, up to `maxAttempts`.
    pub attempt: u32,
    /// The longest it waits: `upper(attempt − 1)`.
    pub upper_bound: Duration,
    /// The sum of the upper bounds up to and including this retry.
    pub cumulative_worst_case: Duration,
}

/// A policy's worst-case retry schedule and amplification (the consumer library's
/// `EffectivePolicy::schedule` has an example).
#[derive(Clone, Debug, PartialEq)]
pub struct RetrySchedule {
    /// Every retry, in order: `maxAttempts − 1` of them.
    pub retries: Vec<ScheduledRetry>,
    /// The sum of all upper bounds: the longest an event can spend waiting between attempts.
    pub worst_case_retry_delay: Duration,
    /// Executions per event in the worst case: `maxAttempts`.
    pub worst_case_amplification: u32,
    /// Executions per primary execution the retry budget allows across the fleet:
    /// `1 + maxRetryRatio`.
    pub budgeted_amplification: f64,
}

impl RetrySchedule {
    /// The schedule of a validated policy (at most 19 retries, so it is always small).
    pub fn for_policy(policy: &impl ValidatedRetryPolicy) -> Self {
        let backoff = policy.backoff();
        let mut cumulative = Duration::ZERO;
        let retries = (1..policy.max_attempts())
            .map(|failed_attempt| {
                let upper_bound = backoff.upper_bound(failed_attempt);
                cumulative = cumulative.saturating_add(upper_bound);
                ScheduledRetry {
                    attempt: failed_attempt + 1,
                    upper_bound,
                    cumulative_worst_case: cumulative,
                }
            })
            .collect();
        Self {
            retries,
            worst_case_retry_delay: cumulative,
            worst_case_amplification: policy.max_attempts(),
            budgeted_amplification: 1.0 + policy.max_retry_ratio(),
        }
    }
}

/// A table for people, durations in Go form:
///
/// ```text
/// attempt  waits up to  worst case so far
///       2        100ms              100ms
///       3        200ms              300ms
/// worst-case retry delay:    1.5s
/// worst-case amplification:  5 executions per event
/// budgeted amplification:    1.1 executions per primary execution
/// ```
impl fmt::Display for RetrySchedule {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.retries.is_empty() {
            writeln!(formatter, "no retries: attempt 1 is the only execution")?;
        } else {
            writeln!(formatter, "attempt  waits up to  worst case so far")?;
            for retry in &self.retries {
                writeln!(
                    formatter,
                    "{:>7}  {:>11}  {:>17}",
                    retry.attempt,
                    format_go_duration(retry.upper_bound),
                    format_go_duration(retry.cumulative_worst_case)
                )?;
            }
        }
        writeln!(
            formatter,
            "worst-case retry delay:    {}",
            format_go_duration(self.worst_case_retry_delay)
        )?;
        writeln!(
            formatter,
            "worst-case amplification:  {} executions per event",
            self.worst_case_amplification
        )?;
        writeln!(
            formatter,
            "budgeted amplification:    {} executions per primary execution",
            self.budgeted_amplification
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff::BackoffSchedule;
    use crate::go_duration::parse_go_duration;
    use crate::retry_policy::Jitter;
    use proptest::prelude::*;

    /// A valid policy without the consumer library's validation: the tests only build valid
    /// ones.
    struct Policy {
        max_attempts: u32,
        backoff: BackoffSchedule,
        max_retry_ratio: f64,
    }

    impl ValidatedRetryPolicy for Policy {
        fn max_attempts(&self) -> u32 {
            self.max_attempts
        }
        fn backoff(&self) -> &BackoffSchedule {
            &self.backoff
        }
        fn max_retry_ratio(&self) -> f64 {
            self.max_retry_ratio
        }
    }

    impl Policy {
        fn schedule(&self) -> RetrySchedule {
            RetrySchedule::for_policy(self)
        }
    }

    fn policy(max_attempts: i32, base: &str, cap: &str, ratio: f64) -> Policy {
        let duration = |text: &str| parse_go_duration(text).expect("valid duration");
        Policy {
            max_attempts: u32::try_from(max_attempts).expect("positive attempts"),
            backoff: BackoffSchedule::new(duration(base), duration(cap), Jitter::Full)
                .expect("valid backoff"),
            max_retry_ratio: ratio,
        }
    }

    #[test]
    fn documented_example() {
        let schedule = policy(5, "100ms", "10s", 0.1).schedule();
        let rows: Vec<(u32, u64, u64)> = schedule
            .retries
            .iter()
            .map(|retry| {
                (
                    retry.attempt,
                    retry.upper_bound.as_millis() as u64,
                    retry.cumulative_worst_case.as_millis() as u64,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [(2, 100, 100), (3, 200, 300), (4, 400, 700), (5, 800, 1500)]
        );
        assert_eq!(schedule.worst_case_retry_delay, Duration::from_millis(1500));
        assert_eq!(schedule.worst_case_amplification, 5);
        assert_eq!(schedule.budgeted_amplification, 1.1);
        assert_eq!(
            schedule.to_string(),
            "attempt  waits up to  worst case so far\n\
             \x20     2        100ms              100ms\n\
             \x20     3        200ms              300ms\n\
             \x20     4        400ms              700ms\n\
             \x20     5        800ms               1.5s\n\
             worst-case retry delay:    1.5s\n\
             worst-case amplification:  5 executions per event\n\
             budgeted amplification:    1.1 executions per primary execution\n"
        );
    }

    #[test]
    fn the_cap_binds() {
        let schedule = policy(20, "1s", "1m", 0.0).schedule();
        assert_eq!(schedule.retries.len(), 19);
        assert_eq!(schedule.retries[6].upper_bound, Duration::from_secs(60));
        // 1+2+4+8+16+32 = 63s, then 13 retries at the 60s cap.
        assert_eq!(
            schedule.worst_case_retry_delay,
            Duration::from_secs(63 + 13 * 60)
        );
        assert_eq!(format_go_duration(schedule.worst_case_retry_delay), "14m3s");
        assert_eq!(schedule.budgeted_amplification, 1.0);
    }

    #[test]
    fn a_single_attempt_has_no_retries() {
        let schedule = policy(1, "1s", "1s", 0.1).schedule();
        assert!(schedule.retries.is_empty());
        assert_eq!(schedule.worst_case_retry_delay, Duration::ZERO);
        assert_eq!(schedule.worst_case_amplification, 1);
        assert!(schedule.to_string().starts_with("no retries"));
    }

    proptest! {
        #[test]
        fn worst_case_is_the_sum_of_upper_bounds(
            max_attempts in 1i32..=20,
            base_ms in 1u64..10_000,
            extra_ms in 0u64..1_000_000,
            percent in 0u32..=100,
        ) {
            let ratio = f64::from(percent) / 100.0;
            let policy = policy(max_attempts, &format!("{base_ms}ms"), &format!("{}ms", base_ms + extra_ms), ratio);
            let schedule = policy.schedule();
            prop_assert_eq!(schedule.retries.len(), max_attempts as usize - 1);
            let sum: Duration = schedule.retries.iter().map(|retry| retry.upper_bound).sum();
            prop_assert_eq!(schedule.worst_case_retry_delay, sum);
            for (index, retry) in schedule.retries.iter().enumerate() {
                prop_assert_eq!(retry.attempt, index as u32 + 2);
                prop_assert_eq!(retry.upper_bound, policy.backoff().upper_bound(index as u32 + 1));
                prop_assert!(retry.upper_bound <= policy.backoff().cap());
            }
            prop_assert_eq!(schedule.worst_case_amplification, max_attempts as u32);
            prop_assert_eq!(schedule.budgeted_amplification, 1.0 + ratio);
        }
    }
}
