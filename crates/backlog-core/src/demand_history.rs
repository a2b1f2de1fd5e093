//! The arrival rate of the recent past, kept in a few buckets (each its highest λ), and the
//! forecast made from it: the recent past repeats. A load that alternates returns to its peak,
//! a short spike may come again, a constant load stays constant; a scale-down is judged
//! against all of that, not against the one poll it happens to be taken in.

use jiff::Timestamp;

use super::stabilization::seconds_between;

/// The highest λ seen in the bucket that starts at `at`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DemandSample {
    pub at: Timestamp,
    pub rate: f64,
}

/// Buckets a history keeps at most (the status stays small whatever the window).
pub const MAX_BUCKETS: usize = 24;

/// Width of one bucket for a window.
pub fn bucket_seconds(window_seconds: f64, poll_seconds: f64) -> f64 {
    (window_seconds / MAX_BUCKETS as f64)
        .max(poll_seconds)
        .max(1.0)
}

/// The history with `rate` observed at `now`: older buckets than the window dropped, the
/// rate merged into the newest bucket while it is open.
pub fn record(
    history: &[DemandSample],
    rate: f64,
    now: Timestamp,
    window_seconds: f64,
    bucket_seconds: f64,
) -> Vec<DemandSample> {
    let mut kept: Vec<DemandSample> = history
        .iter()
        .copied()
        .filter(|s| {
            let age = seconds_between(s.at, now);
            (0.0..window_seconds).contains(&age) && s.rate.is_finite() && s.rate >= 0.0
        })
        .collect();
    if !(rate.is_finite() && rate >= 0.0) {
        return kept;
    }
    match kept.last_mut() {
        Some(last) if seconds_between(last.at, now) < bucket_seconds => {
            last.rate = last.rate.max(rate);
        }
        _ => kept.push(DemandSample { at: now, rate }),
    }
    while kept.len() > MAX_BUCKETS {
        kept.remove(0);
    }
    kept
}

/// λ over the next seconds if the recent past repeats: `rate_at(t)` for t seconds from now.
#[derive(Clone, Debug, PartialEq)]
pub struct Replay {
    /// (seconds after the history's start, λ), ascending.
    steps: Vec<(f64, f64)>,
    span: f64,
}

impl Replay {
    pub fn new(history: &[DemandSample], now: Timestamp, bucket_seconds: f64) -> Self {
        let Some(first) = history.first() else {
            return Self {
                steps: Vec::new(),
                span: 0.0,
            };
        };
        let steps: Vec<(f64, f64)> = history
            .iter()
            .map(|s| (seconds_between(first.at, s.at).max(0.0), s.rate))
            .collect();
        let span = (seconds_between(first.at, now) + bucket_seconds).max(bucket_seconds);
        Self { steps, span }
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    pub fn rate_at(&self, t: f64) -> f64 {
        if self.steps.is_empty() {
            return 0.0;
        }
        let offset = t.max(0.0) % self.span;
        self.steps
            .iter()
            .rev()
            .find(|(start, _)| *start <= offset)
            .or(self.steps.first())
            .map_or(0.0, |(_, rate)| *rate)
    }

    /// The time-weighted mean λ of one repetition.
    pub fn mean(&self) -> f64 {
        if self.steps.is_empty() || self.span <= 0.0 {
            return 0.0;
        }
        let mut total = 0.0;
        for (i, (start, rate)) in self.steps.iter().enumerate() {
            let end = self.steps.get(i + 1).map_or(self.span, |next| next.0);
            total += rate * (end - start).max(0.0);
        }
        total / self.span
    }

    pub fn peak(&self) -> f64 {
        self.steps.iter().map(|(_, r)| *r).fold(0.0, f64::max)
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
    fn a_bucket_keeps_its_highest_rate_and_old_buckets_leave() {
        let mut history = Vec::new();
        for (second, rate) in [(0, 100.0), (15, 300.0), (30, 200.0), (60, 50.0)] {
            history = record(&history, rate, at(second), 90.0, 30.0);
        }
        let rates: Vec<f64> = history.iter().map(|s| s.rate).collect();
        assert_eq!(rates, vec![300.0, 200.0, 50.0]);
        history = record(&history, 10.0, at(130), 90.0, 30.0);
        let rates: Vec<f64> = history.iter().map(|s| s.rate).collect();
        assert_eq!(rates, vec![50.0, 10.0]);
    }

    #[test]
    fn the_replay_repeats_the_window() {
        let history = vec![
            DemandSample {
                at: at(0),
                rate: 2000.0,
            },
            DemandSample {
                at: at(180),
                rate: 500.0,
            },
        ];
        let replay = Replay::new(&history, at(330), 30.0);
        assert_eq!(replay.rate_at(10.0), 2000.0);
        assert_eq!(replay.rate_at(200.0), 500.0);
        assert_eq!(replay.rate_at(370.0), 2000.0);
        assert!((replay.mean() - 1250.0).abs() < 1e-9);
        assert_eq!(replay.peak(), 2000.0);
    }

    proptest! {
        #[test]
        fn a_history_stays_bounded_and_ordered(rates in proptest::collection::vec(0.0..1e5f64, 1..300)) {
            let mut history = Vec::new();
            for (i, rate) in rates.iter().enumerate() {
                history = record(&history, *rate, at(15 * i as i64), 720.0, 30.0);
                prop_assert!(history.len() <= MAX_BUCKETS);
                prop_assert!(history.windows(2).all(|w| w[0].at < w[1].at));
            }
            let replay = Replay::new(&history, at(15 * rates.len() as i64), 30.0);
            prop_assert!(replay.mean() <= replay.peak() + 1e-9);
        }
    }
}
