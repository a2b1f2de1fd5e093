//! A replica count per time bucket, fixed before the run and replayed as a policy.

use super::policy::{Outcome, Policy, View};

/// `counts[i]` replicas from `i × bucket_seconds` on (the last count holds to the end).
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    pub bucket_seconds: f64,
    pub counts: Vec<u32>,
}

impl Schedule {
    pub fn constant(replicas: u32) -> Self {
        Self {
            bucket_seconds: f64::INFINITY,
            counts: vec![replicas],
        }
    }

    /// The count at the start (the run begins with it ready).
    pub fn first(&self) -> u32 {
        self.counts.first().copied().unwrap_or(0)
    }

    pub fn count_at(&self, t: f64) -> u32 {
        // A decision lands on a bucket's start up to float error in the accumulated clock.
        let bucket = ((t + 1e-6) / self.bucket_seconds).floor();
        let index = if bucket.is_finite() {
            bucket as usize
        } else {
            0
        };
        self.counts
            .get(index)
            .or(self.counts.last())
            .copied()
            .unwrap_or(0)
    }

    /// The count after each change, in order.
    pub fn changes(&self) -> impl Iterator<Item = u32> + '_ {
        self.counts
            .windows(2)
            .filter(|pair| pair[0] != pair[1])
            .map(|pair| pair[1])
    }
}

/// Asks for the schedule's count at every decision.
pub struct Replay {
    pub schedule: Schedule,
    /// Seconds between decisions (the count may change only at one).
    pub interval: f64,
    pub label: &'static str,
}

impl Policy for Replay {
    fn interval(&self) -> f64 {
        self.interval
    }

    fn decide(&mut self, view: &View<'_>) -> Outcome {
        let replicas = self.schedule.count_at(view.now);
        Outcome {
            replicas,
            label: format!("{} {replicas}", self.label),
            predicted_drain_seconds: None,
            explanation: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_hold_per_bucket_and_the_last_holds_to_the_end() {
        let schedule = Schedule {
            bucket_seconds: 30.0,
            counts: vec![2, 2, 5, 3],
        };
        assert_eq!(schedule.first(), 2);
        assert_eq!(schedule.count_at(0.0), 2);
        assert_eq!(schedule.count_at(59.0), 2);
        assert_eq!(schedule.count_at(60.0 - 1e-9), 5);
        assert_eq!(schedule.count_at(60.0), 5);
        assert_eq!(schedule.count_at(95.0), 3);
        assert_eq!(schedule.count_at(1e9), 3);
        assert_eq!(schedule.changes().collect::<Vec<_>>(), vec![5, 3]);
        assert_eq!(Schedule::constant(4).count_at(1e9), 4);
    }
}
