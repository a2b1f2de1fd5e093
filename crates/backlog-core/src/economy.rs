//! Economy: running a count that completes less than arrives, because the deadline has room
//! for the backlog it lets grow. It is the cheapest way to serve a steady load whose
//! keep-up count would idle, and it ends in a scale-up when the room is used. So that this
//! never becomes a limit cycle, economy is not entered again within `scaling.economyDwell`
//! of leaving it at about the same load: at most one planned pair of rebalances per dwell.
//!
//! Pure: the decision keeps this memory in status.

use jiff::Timestamp;

use super::stabilization::seconds_between;

/// The current stretch of economy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EconomyRun {
    pub since: Timestamp,
    /// The load when it began, in replicas' worth of work (λ / per-replica rate), its
    /// recent peaks included: leaving it at a higher load (more arrivals, or slower
    /// consumers) is a new load, not the end of the room; at a peak that returns it is.
    pub load: f64,
}

/// What economy remembers between polls.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EconomyMemory {
    pub run: Option<EconomyRun>,
    /// When economy last ended because its room was used.
    pub left_at: Option<Timestamp>,
}

/// The load may rise this much during economy and a scale-up out of it still counts as the
/// room running out (rates read through a window wobble by a few percent).
const SAME_LOAD_SHARE: f64 = 0.1;

/// Whether a count that falls behind may be entered now.
pub fn allowed(memory: &EconomyMemory, dwell_seconds: f64, now: Timestamp) -> bool {
    dwell_seconds > 0.0
        && memory
            .left_at
            .is_none_or(|left| seconds_between(left, now) >= dwell_seconds)
}

/// The memory after a decision: `falls_behind` says whether the chosen count completes less
/// than today's λ, `scaled_up` whether the decision raised the count, `load` is λ (or the
/// recent past's peak, if higher) / the per-replica rate.
///
/// Any count held while it falls behind spends the room, also one the budget found running
/// or raised to: a scale-up out of it at the same load closes economy like the end of a
/// chosen one. Otherwise a budget that starts below the load would use the room once, then
/// enter economy and use it again: two more changes at a constant load.
pub fn record(
    memory: &EconomyMemory,
    falls_behind: bool,
    scaled_up: bool,
    load: f64,
    now: Timestamp,
) -> EconomyMemory {
    let room_used = |run: &EconomyRun| scaled_up && load <= run.load * (1.0 + SAME_LOAD_SHARE);
    match (memory.run, falls_behind) {
        // Raised to a count that still falls behind (a peak above what the next count
        // completes): the room is used all the same, or economy would end at the next
        // trough without a scale-up and be entered again at once.
        (Some(run), true) => EconomyMemory {
            run: Some(run),
            left_at: if room_used(&run) {
                Some(now)
            } else {
                memory.left_at
            },
        },
        (None, true) => EconomyMemory {
            run: Some(EconomyRun { since: now, load }),
            ..*memory
        },
        (Some(run), false) => EconomyMemory {
            run: None,
            left_at: if room_used(&run) {
                Some(now)
            } else {
                memory.left_at
            },
        },
        (None, false) => *memory,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn leaving_economy_at_the_same_load_locks_it_for_the_dwell() {
        let entered = record(&EconomyMemory::default(), true, false, 700.0, at(0));
        assert_eq!(entered.run.map(|r| r.since), Some(at(0)));
        let held = record(&entered, true, false, 720.0, at(600));
        assert_eq!(held.run.map(|r| r.since), Some(at(0)));
        let left = record(&held, false, true, 710.0, at(5000));
        assert_eq!((left.run, left.left_at), (None, Some(at(5000))));
        assert!(!allowed(&left, 3600.0, at(8599)));
        assert!(allowed(&left, 3600.0, at(8600)));
    }

    #[test]
    fn leaving_economy_for_a_new_load_does_not_lock_it() {
        // 2.8 replicas' worth of work, then a burst of 14, or consumers at half speed (5.6).
        let entered = record(&EconomyMemory::default(), true, false, 2.8, at(0));
        for load in [14.0, 5.6] {
            let left = record(&entered, false, true, load, at(1200));
            assert_eq!((left.run, left.left_at), (None, None));
            assert!(allowed(&left, 3600.0, at(1300)));
        }
    }

    #[test]
    fn a_raise_to_a_count_still_behind_uses_the_room() {
        // Entered at a trough, raised at the returning peak to a count that still falls
        // behind it, ended at the next trough with no change: the room was used at the raise.
        let entered = record(&EconomyMemory::default(), true, false, 4.7, at(0));
        let raised = record(&entered, true, true, 4.7, at(60));
        assert_eq!(raised.left_at, Some(at(60)));
        let ended = record(&raised, false, false, 4.7, at(150));
        assert_eq!((ended.run, ended.left_at), (None, Some(at(60))));
        assert!(!allowed(&ended, 3600.0, at(200)));
    }

    #[test]
    fn a_zero_dwell_turns_economy_off() {
        assert!(!allowed(&EconomyMemory::default(), 0.0, at(0)));
    }

    proptest! {
        #[test]
        fn economy_is_never_entered_within_the_dwell_of_a_lock(
            steps in proptest::collection::vec((any::<bool>(), any::<bool>(), 100.0..2000.0f64), 1..60),
        ) {
            let mut memory = EconomyMemory::default();
            for (i, (behind, up, rate)) in steps.into_iter().enumerate() {
                let now = at(60 * i as i64);
                let next = record(&memory, behind, up, rate, now);
                if let Some(left) = next.left_at {
                    prop_assert!(left <= now);
                    prop_assert!(!allowed(&next, 3600.0, now));
                }
                memory = next;
            }
        }
    }
}
