//! What to do after a failed execution (seed 000, sections 1 and 2).
//!
//! The state flow the planner implements:
//!
//! ```text
//! READY → RUNNING → SUCCEEDED
//!           ├─ Transient, attempts and budget left → RETRY_SCHEDULED → READY   (Retry)
//!           ├─ Unknown outcome                      → RECONCILING             (Reconcile)
//!           ├─ Business rejection                   → TERMINAL_REJECTED       (Reject)
//!           └─ Persistent, or attempts/budget spent → QUARANTINED             (Quarantine)
//! ```
//!
//! Attempt numbering: attempt 1 is the first real execution, not the first retry. After failed
//! attempt `n`, a retry is scheduled only if `n < maxAttempts`, so an event is executed at most
//! `maxAttempts` times.

use std::fmt;
use std::time::Duration;

use rand::Rng;

use super::backoff::BackoffSchedule;
use super::retry_budget::RetryBudgetTracker;
use crate::retry_policy::FailureClass;

/// The next step for an event whose execution just failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RetryDecision {
    /// Execute the event again as attempt `attempt`, no earlier than `delay` from now.
    Retry {
        /// The attempt number of the re-execution (the failed attempt + 1).
        attempt: u32,
        /// How long to wait before it.
        delay: Duration,
    },
    /// Take the event off the hot path into the quarantine (dead-letter queue, failure table),
    /// keeping its event id, payload and failure history queryable.
    Quarantine {
        /// Why.
        reason: QuarantineReason,
    },
    /// A business rejection: record a terminal state (`TERMINAL_REJECTED`), never retry.
    Reject,
    /// The outcome is unknown: the side effect may have happened. Query the target by the
    /// stable event id before anything else. If it did not happen, plan again with
    /// [`FailureClass::Transient`]; if it did, advance the event's state; if that cannot be
    /// established, keep the event in `RECONCILING` for a person or a dedicated checker.
    /// Never re-execute blind.
    Reconcile,
}

/// Why an event was quarantined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuarantineReason {
    /// A persistent failure (credentials, routing, schema, configuration, code): retrying will
    /// not heal it. Alert; replay after the fix.
    PersistentFailure,
    /// A transient failure on attempt `maxAttempts`: no attempts left.
    AttemptsExhausted,
    /// A transient failure the retry budget had no room for: the fleet is already retrying as
    /// much as the policy allows.
    RetryBudgetExhausted,
}

impl QuarantineReason {
    /// A short, stable, lower-case description, suitable for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            QuarantineReason::PersistentFailure => "persistent failure",
            QuarantineReason::AttemptsExhausted => "attempts exhausted",
            QuarantineReason::RetryBudgetExhausted => "retry budget exhausted",
        }
    }

    /// Whether the quarantine calls for an alert on its own. Persistent failures do (someone
    /// must fix the cause); exhausted attempts and budget show up in the quarantine rate the
    /// operator watches.
    pub fn requires_alert(self) -> bool {
        matches!(self, QuarantineReason::PersistentFailure)
    }
}

impl fmt::Display for QuarantineReason {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// Decides, for each failure, between retry, quarantine, rejection and reconciliation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RetryPlanner {
    max_attempts: u32,
    backoff: BackoffSchedule,
}

impl RetryPlanner {
    /// A planner allowing `max_attempts` executions per event (attempt 1 included) with the
    /// given backoff. `0` behaves like `1`: the first execution is never withheld, it just gets
    /// no retries.
    pub fn new(max_attempts: u32, backoff: BackoffSchedule) -> Self {
        Self {
            max_attempts: max_attempts.max(1),
            backoff,
        }
    }

    /// Executions allowed per event, attempt 1 included.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The backoff between attempts.
    pub fn backoff(&self) -> &BackoffSchedule {
        &self.backoff
    }

    /// The decision after attempt `failed_attempt` (1 for the first execution) failed with
    /// `class`.
    ///
    /// Only `Transient` failures are ever retried, and only if `failed_attempt < maxAttempts`
    /// and `budget` grants the retry at `now` (a granted retry is counted in `budget`). The
    /// delay is drawn from `rng` by the backoff's jitter strategy. Safe for any attempt number,
    /// `u32::MAX` included; `0` is treated as 1.
    ///
    /// ```
    /// use std::time::Duration;
    /// use backlog_core::retry_policy::{FailureClass, Jitter};
    /// use backlog_core::backoff::BackoffSchedule;
    /// use backlog_core::retry_budget::RetryBudgetTracker;
    /// use backlog_core::retry_planner::{QuarantineReason, RetryDecision, RetryPlanner};
    /// use rand::{SeedableRng, rngs::StdRng};
    ///
    /// let backoff = BackoffSchedule::new(Duration::from_millis(100), Duration::from_secs(10), Jitter::Full)?;
    /// let planner = RetryPlanner::new(3, backoff);
    /// let mut budget = RetryBudgetTracker::unlimited();
    /// let mut rng = StdRng::seed_from_u64(42);
    /// let now = Duration::ZERO;
    ///
    /// let RetryDecision::Retry { attempt, delay } = planner.decide(FailureClass::Transient, 2, &mut budget, now, &mut rng) else {
    ///     panic!("attempt 2 of 3 failed transiently: expected a retry");
    /// };
    /// assert_eq!(attempt, 3);
    /// assert!(delay <= Duration::from_millis(200));
    /// assert_eq!(
    ///     planner.decide(FailureClass::Transient, 3, &mut budget, now, &mut rng),
    ///     RetryDecision::Quarantine { reason: QuarantineReason::AttemptsExhausted },
    /// );
    /// assert_eq!(planner.decide(FailureClass::Unknown, 1, &mut budget, now, &mut rng), RetryDecision::Reconcile);
    /// # Ok::<(), backlog_core::backoff::BackoffError>(())
    /// ```
    pub fn decide<R: Rng + ?Sized>(
        &self,
        class: FailureClass,
        failed_attempt: u32,
        budget: &mut RetryBudgetTracker,
        now: Duration,
        rng: &mut R,
    ) -> RetryDecision {
        let failed_attempt = failed_attempt.max(1);
        match class {
            FailureClass::Unknown => RetryDecision::Reconcile,
            FailureClass::Business => RetryDecision::Reject,
            FailureClass::Persistent => RetryDecision::Quarantine {
                reason: QuarantineReason::PersistentFailure,
            },
            FailureClass::Transient if failed_attempt >= self.max_attempts => {
                RetryDecision::Quarantine {
                    reason: QuarantineReason::AttemptsExhausted,
                }
            }
            // Checked after the attempt limit so that a retry that would be refused anyway
            // does not consume budget.
            FailureClass::Transient if !budget.try_acquire_retry(now) => {
                RetryDecision::Quarantine {
                    reason: QuarantineReason::RetryBudgetExhausted,
                }
            }
            FailureClass::Transient => RetryDecision::Retry {
                attempt: failed_attempt.saturating_add(1),
                delay: self.backoff.draw_delay(failed_attempt, rng),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff::tests::any_backoff;
    use crate::retry_policy::Jitter;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn planner(max_attempts: u32) -> RetryPlanner {
        let backoff = BackoffSchedule::new(
            Duration::from_millis(100),
            Duration::from_secs(10),
            Jitter::Full,
        )
        .expect("valid backoff");
        RetryPlanner::new(max_attempts, backoff)
    }

    fn any_class() -> impl Strategy<Value = FailureClass> {
        prop_oneof![
            Just(FailureClass::Transient),
            Just(FailureClass::Persistent),
            Just(FailureClass::Business),
            Just(FailureClass::Unknown),
        ]
    }

    #[test]
    fn class_semantics() {
        let planner = planner(5);
        let mut budget = RetryBudgetTracker::unlimited();
        let mut rng = StdRng::seed_from_u64(0);
        let mut decide = |class| planner.decide(class, 1, &mut budget, Duration::ZERO, &mut rng);
        assert_eq!(decide(FailureClass::Unknown), RetryDecision::Reconcile);
        assert_eq!(decide(FailureClass::Business), RetryDecision::Reject);
        assert_eq!(
            decide(FailureClass::Persistent),
            RetryDecision::Quarantine {
                reason: QuarantineReason::PersistentFailure
            }
        );
        assert!(matches!(
            decide(FailureClass::Transient),
            RetryDecision::Retry { attempt: 2, .. }
        ));
    }

    #[test]
    fn exhausted_budget_quarantines() {
        let planner = planner(5);
        let mut budget = RetryBudgetTracker::new(0.1, Duration::from_secs(10)).expect("valid");
        let mut rng = StdRng::seed_from_u64(0);
        for _ in 0..10 {
            budget.record_primary(Duration::ZERO);
        }
        let mut decide = || {
            planner.decide(
                FailureClass::Transient,
                1,
                &mut budget,
                Duration::ZERO,
                &mut rng,
            )
        };
        assert!(matches!(decide(), RetryDecision::Retry { .. }));
        assert_eq!(
            decide(),
            RetryDecision::Quarantine {
                reason: QuarantineReason::RetryBudgetExhausted
            }
        );
    }

    #[test]
    fn attempts_exhausted_does_not_spend_budget() {
        let planner = planner(1);
        let mut budget = RetryBudgetTracker::unlimited();
        let mut rng = StdRng::seed_from_u64(0);
        assert_eq!(
            planner.decide(
                FailureClass::Transient,
                1,
                &mut budget,
                Duration::ZERO,
                &mut rng
            ),
            RetryDecision::Quarantine {
                reason: QuarantineReason::AttemptsExhausted
            }
        );
        assert_eq!(budget.counts(Duration::ZERO).retries, 0);
    }

    #[test]
    fn reasons_read_well() {
        assert_eq!(
            QuarantineReason::AttemptsExhausted.to_string(),
            "attempts exhausted"
        );
        assert!(QuarantineReason::PersistentFailure.requires_alert());
        assert!(!QuarantineReason::RetryBudgetExhausted.requires_alert());
    }

    proptest! {
        #[test]
        fn retries_only_transient_failures_below_max_attempts(
            backoff in any_backoff(),
            max_attempts in 1u32..=20,
            class in any_class(),
            failed_attempt in any::<u32>(),
            seed in any::<u64>(),
        ) {
            let planner = RetryPlanner::new(max_attempts, backoff);
            let mut rng = StdRng::seed_from_u64(seed);
            let decision = planner.decide(class, failed_attempt, &mut RetryBudgetTracker::unlimited(), Duration::ZERO, &mut rng);
            if let RetryDecision::Retry { attempt, delay } = decision {
                prop_assert_eq!(class, FailureClass::Transient);
                prop_assert!(failed_attempt.max(1) < max_attempts);
                prop_assert_eq!(attempt, failed_attempt.max(1) + 1);
                prop_assert!(delay <= backoff.upper_bound(failed_attempt));
            } else if class == FailureClass::Transient {
                prop_assert!(failed_attempt.max(1) >= max_attempts);
            }
        }

        #[test]
        fn executions_per_event_never_exceed_max_attempts(
            backoff in any_backoff(),
            max_attempts in 1u32..=20,
            ratio in 0.0f64..=1.0,
            primaries in 0usize..100,
            seed in any::<u64>(),
        ) {
            let planner = RetryPlanner::new(max_attempts, backoff);
            let mut rng = StdRng::seed_from_u64(seed);
            for mut budget in [
                RetryBudgetTracker::unlimited(),
                RetryBudgetTracker::new(ratio, Duration::from_secs(10)).expect("valid"),
            ] {
                let unlimited = budget.max_retry_ratio().is_none();
                for _ in 0..primaries {
                    budget.record_primary(Duration::ZERO);
                }
                let mut executions = 1;
                let mut attempt = 1;
                while let RetryDecision::Retry { attempt: next, .. } =
                    planner.decide(FailureClass::Transient, attempt, &mut budget, Duration::ZERO, &mut rng)
                {
                    prop_assert_eq!(next, attempt + 1);
                    attempt = next;
                    executions += 1;
                    prop_assert!(executions <= max_attempts);
                }
                if unlimited {
                    prop_assert_eq!(executions, max_attempts);
                }
            }
        }

        #[test]
        fn same_seed_same_decisions(backoff in any_backoff(), seed in any::<u64>()) {
            let planner = RetryPlanner::new(20, backoff);
            let run = || {
                let mut rng = StdRng::seed_from_u64(seed);
                let mut budget = RetryBudgetTracker::unlimited();
                (1..=19)
                    .map(|n| planner.decide(FailureClass::Transient, n, &mut budget, Duration::ZERO, &mut rng))
                    .collect::<Vec<_>>()
            };
            prop_assert_eq!(run(), run());
        }

        #[test]
        fn never_panics_near_u32_max(backoff in any_backoff(), class in any_class(), below_max in 0u32..4, seed in any::<u64>()) {
            let planner = RetryPlanner::new(u32::MAX, backoff);
            let mut rng = StdRng::seed_from_u64(seed);
            let failed_attempt = u32::MAX - below_max;
            let decision = planner.decide(class, failed_attempt, &mut RetryBudgetTracker::unlimited(), Duration::ZERO, &mut rng);
            if let RetryDecision::Retry { attempt, delay } = decision {
                prop_assert_eq!(attempt, failed_attempt + 1);
                prop_assert!(delay <= backoff.cap());
            }
        }
    }
}
