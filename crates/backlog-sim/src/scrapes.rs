//! What Prometheus would hold: samples of the workload every scrape interval, and `rate()`
//! over a window of them. Policies see the workload only through this (with its lag).

use std::collections::VecDeque;

/// One scrape of the workload's exporters.
#[derive(Clone, Debug, PartialEq)]
pub struct Scrape {
    pub at: f64,
    pub backlog: f64,
    pub oldest_age: f64,
    pub produced_total: f64,
    pub completed_total: f64,
    pub ready_replicas: u32,
    /// Unfinished events per partition (index = partition number).
    pub partition_backlogs: Vec<f64>,
}

/// Recent scrapes, enough for the rate window.
#[derive(Clone, Debug)]
pub struct ScrapeHistory {
    samples: VecDeque<Scrape>,
    rate_window: f64,
}

impl ScrapeHistory {
    pub fn new(rate_window: f64) -> Self {
        Self {
            samples: VecDeque::new(),
            rate_window,
        }
    }

    pub fn record(&mut self, scrape: Scrape) {
        let at = scrape.at;
        self.samples.push_back(scrape);
        while self
            .samples
            .front()
            .is_some_and(|s| at - s.at > self.rate_window * 2.0)
        {
            self.samples.pop_front();
        }
    }

    pub fn latest(&self) -> Option<&Scrape> {
        self.samples.back()
    }

    /// Per-second increase of a counter over the rate window, like PromQL `rate()` without
    /// extrapolation; `None` until two samples fall in the window.
    pub fn rate(&self, counter: impl Fn(&Scrape) -> f64) -> Option<f64> {
        let last = self.samples.back()?;
        let first = self
            .samples
            .iter()
            .find(|s| last.at - s.at <= self.rate_window)?;
        let elapsed = last.at - first.at;
        (elapsed > 0.0).then(|| ((counter(last) - counter(first)) / elapsed).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(at: f64, produced: f64) -> Scrape {
        Scrape {
            at,
            backlog: 0.0,
            oldest_age: 0.0,
            produced_total: produced,
            completed_total: 0.0,
            ready_replicas: 1,
            partition_backlogs: vec![0.0],
        }
    }

    #[test]
    fn rate_needs_two_samples_in_the_window() {
        let mut history = ScrapeHistory::new(60.0);
        history.record(scrape(0.0, 0.0));
        assert_eq!(history.rate(|s| s.produced_total), None);
        history.record(scrape(15.0, 1500.0));
        assert_eq!(history.rate(|s| s.produced_total), Some(100.0));
        for i in 2..10 {
            history.record(scrape(
                15.0 * i as f64,
                1500.0 * i as f64 + 1500.0 * (i as f64 - 1.0),
            ));
        }
        // The window only sees the last minute.
        let rate = history.rate(|s| s.produced_total).unwrap();
        assert!((rate - 200.0).abs() < 1e-9, "{rate}");
    }
}
