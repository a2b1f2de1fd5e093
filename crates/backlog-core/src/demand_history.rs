//! The arrival rate of the recent past, kept as runs of about the same λ (each its mean),
//! and the forecast made from it: the recent past repeats. A load that alternates returns to
//! its peak, a short spike may come again, a constant load stays constant; a scale-down is
//! judged against all of that, not against the one poll it happens to be taken in. A steady λ
//! is one run, so an idle poll changes nothing in status.

use jiff::Timestamp;

use super::stabilization::seconds_between;

/// A run of λ that started at `at`, with its time-weighted mean.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DemandSample {
    pub at: Timestamp,
    pub rate: f64,
}

/// Runs a history keeps at most (the status stays small whatever the load).
pub const MAX_RUNS: usize = 24;

/// A λ within this share of its run's rate continues the run.
const SAME_RUN_SHARE: f64 = 0.1;

/// The history with `rate` observed at `now` (one poll's reading): runs that ended before the
/// window dropped, the rate averaged into the newest run when it is about the same, or the
/// start of a new one. A run keeps the events it saw (its mean): a run that kept its highest
/// reading made a load that moves ±20 % from poll to poll look a fifth heavier than it is,
/// and a count that carries it short of peaks that were only noise. Beyond [`MAX_RUNS`], the
/// two neighbouring runs that are shortest together become one: at their mean where they
/// differ by noise ([`NOISE_SHARE`]), otherwise at the higher λ, so a peak keeps its height
/// and is widened by the shorter run; merging the shortest keeps a spike about as long as it
/// was seen while the runs still cover the window. Runs of a fixed length instead widened a
/// 100 s spike read through a 1-minute rate window to 180 s.
pub fn record(
    history: &[DemandSample],
    rate: f64,
    now: Timestamp,
    window_seconds: f64,
    poll_seconds: f64,
) -> Vec<DemandSample> {
    let valid = |s: &DemandSample| s.rate.is_finite() && s.rate >= 0.0 && s.at <= now;
    let mut kept: Vec<DemandSample> = history.iter().copied().filter(valid).collect();
    // A run ends where the next begins; the newest is still open.
    while kept.len() > 1 && seconds_between(kept[1].at, now) >= window_seconds {
        kept.remove(0);
    }
    if !(rate.is_finite() && rate >= 0.0) {
        return kept;
    }
    match kept.last_mut() {
        Some(last) if (rate - last.rate).abs() <= SAME_RUN_SHARE * last.rate.max(rate) => {
            // The run's events: its rate so far over its length, and this reading over a poll.
            let elapsed = seconds_between(last.at, now).max(0.0);
            let weight = poll_seconds.max(f64::EPSILON);
            last.rate = (last.rate * elapsed + rate * weight) / (elapsed + weight);
        }
        Some(last) if last.at == now => last.rate = last.rate.max(rate),
        _ => kept.push(DemandSample { at: now, rate }),
    }
    while kept.len() > MAX_RUNS {
        merge_shortest_neighbours(&mut kept, now);
    }
    kept
}

/// Merges the two neighbouring runs that last the least together into the first of them.
fn merge_shortest_neighbours(runs: &mut Vec<DemandSample>, now: Timestamp) {
    let end = |i: usize| runs.get(i + 1).map_or(now, |next| next.at);
    let shortest = (0..runs.len().saturating_sub(1)).min_by(|&a, &b| {
        let together = |i: usize| seconds_between(runs[i].at, end(i + 1));
        together(a).total_cmp(&together(b))
    });
    if let Some(i) = shortest {
        let (first, second) = (
            seconds_between(runs[i].at, end(i)).max(0.0),
            seconds_between(runs[i + 1].at, end(i + 1)).max(0.0),
        );
        let merged = runs.remove(i + 1);
        let (low, high) = (runs[i].rate.min(merged.rate), runs[i].rate.max(merged.rate));
        runs[i].rate = if high - low <= NOISE_SHARE * high && first + second > 0.0 {
            (runs[i].rate * first + merged.rate * second) / (first + second)
        } else {
            high
        };
    }
}

/// Neighbouring runs within this share of the higher are the same load read through noise,
/// and merge at their mean.
const NOISE_SHARE: f64 = 0.3;

/// The history as a series younger than its rate window shows it: Prometheus' `rate()` reads
/// such a series low, and a workload started with its budget is one. While the history is
/// younger than `young_seconds`, a λ above every earlier run says the load was at least that
/// all along, so it replaces them as one run from the history's start: the earlier, lower
/// readings are not a past the load returns to. A lower λ is news and is left to [`record`].
pub fn lifted_while_young(
    history: &[DemandSample],
    rate: f64,
    now: Timestamp,
    young_seconds: f64,
) -> Vec<DemandSample> {
    let Some(first) = history.first() else {
        return Vec::new();
    };
    let young = seconds_between(first.at, now) < young_seconds;
    let above_all = rate.is_finite() && history.iter().all(|run| rate > run.rate);
    if young && above_all {
        vec![DemandSample { at: first.at, rate }]
    } else {
        history.to_vec()
    }
}

/// λ over the next seconds if the recent past (at most `window` long) repeats: `rate_at(t)`
/// for t seconds from now.
#[derive(Clone, Debug, PartialEq)]
pub struct Replay {
    /// (seconds after the replayed span's start, λ), ascending.
    steps: Vec<(f64, f64)>,
    span: f64,
}

impl Replay {
    pub fn new(
        history: &[DemandSample],
        now: Timestamp,
        window_seconds: f64,
        poll_seconds: f64,
    ) -> Self {
        let Some(first) = history.first() else {
            return Self {
                steps: Vec::new(),
                span: 0.0,
            };
        };
        let start = seconds_between(first.at, now).min(window_seconds).max(0.0);
        let steps: Vec<(f64, f64)> = history
            .iter()
            .map(|s| ((start - seconds_between(s.at, now)).max(0.0), s.rate))
            .collect();
        let span = start.max(poll_seconds).max(1.0);
        Self { steps, span }
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    pub fn rate_at(&self, t: f64) -> f64 {
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
        if self.steps.is_empty() {
            return 0.0;
        }
        let mut total = 0.0;
        for (i, (start, rate)) in self.steps.iter().enumerate() {
            let end = self
                .steps
                .get(i + 1)
                .map_or(self.span, |next| next.0)
                .min(self.span);
            total += rate * (end - start).max(0.0);
        }
        let covered = self.span - self.steps[0].0;
        if covered > 0.0 {
            total / covered
        } else {
            self.steps.last().map_or(0.0, |(_, rate)| *rate)
        }
    }

    /// The load's last period, when λ rose above `level` at least twice within the window
    /// (with a run at or below it in between): the replay of the time between the last two
    /// rises, which is what the next period is expected to look like. `None` for a rise seen
    /// once: a one-off peak is not expected back.
    pub fn recurring_above(&self, level: f64) -> Option<Replay> {
        let [previous, last] = self.last_two_rises_above(level)?;
        let period = self.steps[last].0 - self.steps[previous].0;
        if period <= 0.0 {
            return None;
        }
        // The replay starts one period ago: the rate in effect then, then what followed.
        let from = self.span - period;
        let mut steps = vec![(0.0, self.rate_at(from))];
        steps.extend(
            self.steps
                .iter()
                .filter(|(start, _)| *start > from)
                .map(|(start, rate)| (start - from, *rate)),
        );
        Some(Replay {
            steps,
            span: period,
        })
    }

    /// For a load that rose above `level` at least twice within the window: how long the
    /// previous stretch above it lasted, and how long λ has been above it since the last
    /// rise (zero when it is at or below `level` again). `None` for a rise seen once.
    pub fn recurring_stretches_above(&self, level: f64) -> Option<(f64, f64)> {
        let [previous, last] = self.last_two_rises_above(level)?;
        let stretch_from = |first: usize| {
            let end = self.steps[first..]
                .iter()
                .find(|(_, rate)| *rate <= level)
                .map_or(self.span, |(start, _)| *start);
            end - self.steps[first].0
        };
        let now_above = self.steps.last().is_some_and(|(_, rate)| *rate > level);
        let lasting = if now_above { stretch_from(last) } else { 0.0 };
        Some((stretch_from(previous), lasting))
    }

    /// λ was above `level` when the window began, fell to or below it, and rose above it
    /// again: the window saw one rise, but the load had been above the level before it, so
    /// that rise is at least its second. A window shorter than two periods of a load that
    /// alternates sees it so.
    pub fn rose_again_above(&self, level: f64) -> bool {
        self.steps.first().is_some_and(|(_, rate)| *rate > level)
            && self.last_two_rises_above(level).is_none()
            && (1..self.steps.len())
                .any(|i| self.steps[i].1 > level && self.steps[i - 1].1 <= level)
    }

    /// The indices of the last two steps at which λ rose above `level` from at or below it.
    fn last_two_rises_above(&self, level: f64) -> Option<[usize; 2]> {
        let mut rises = (1..self.steps.len())
            .rev()
            .filter(|&i| self.steps[i].1 > level && self.steps[i - 1].1 <= level);
        let last = rises.next()?;
        let previous = rises.next()?;
        Some([previous, last])
    }

    /// The stretch around the highest λ of the window during which λ stayed above `level`,
    /// as it was seen: λ from the stretch's start, and its length as the span. `None` when λ
    /// never rose above `level`.
    pub fn peak_above(&self, level: f64) -> Option<Replay> {
        let (top, _) = self
            .steps
            .iter()
            .enumerate()
            .filter(|(_, (_, rate))| *rate > level)
            .max_by(|a, b| a.1.1.total_cmp(&b.1.1))?;
        let first = (0..=top)
            .rev()
            .take_while(|&i| self.steps[i].1 > level)
            .last()
            .unwrap_or(top);
        let end = self.steps[top + 1..]
            .iter()
            .find(|(_, rate)| *rate <= level)
            .map_or(self.span, |(start, _)| *start);
        let from = self.steps[first].0;
        let steps = self.steps[first..]
            .iter()
            .take_while(|(start, _)| *start < end)
            .map(|(start, rate)| (start - from, *rate))
            .collect();
        Some(Replay {
            steps,
            span: (end - from).max(1.0),
        })
    }

    /// The shortest climb the window saw from at or below `from` to at or above `to`:
    /// from the end of the last step at or below `from` to the start of the next one at or
    /// above `to`. `None` where λ never climbed so within the window.
    pub fn fastest_rise(&self, from: f64, to: f64) -> Option<f64> {
        let mut last_low_end: Option<f64> = None;
        let mut fastest: Option<f64> = None;
        for (i, (start, rate)) in self.steps.iter().enumerate() {
            if *rate >= to
                && let Some(low_end) = last_low_end.take()
            {
                let rise = (start - low_end).max(0.0);
                fastest = Some(fastest.map_or(rise, |f: f64| f.min(rise)));
            }
            if *rate <= from {
                last_low_end = Some(self.steps.get(i + 1).map_or(self.span, |next| next.0));
            }
        }
        fastest
    }

    /// Seconds one repetition lasts.
    pub fn span(&self) -> f64 {
        self.span
    }

    pub fn peak(&self) -> f64 {
        self.steps.iter().map(|(_, r)| *r).fold(0.0, f64::max)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    /// The demand history of `steps` (second, rate), replayed from `now` seconds over all of it.
    pub(crate) fn replay_of(steps: &[(i64, f64)], now: i64) -> Replay {
        let history: Vec<DemandSample> = steps
            .iter()
            .map(|&(second, rate)| DemandSample {
                at: at(second),
                rate,
            })
            .collect();
        Replay::new(&history, at(now), now as f64, 15.0)
    }

    #[test]
    fn a_steady_rate_is_one_run_and_a_change_starts_another() {
        let mut history = Vec::new();
        for (second, rate) in [
            (0, 1000.0),
            (15, 1040.0),
            (30, 990.0),
            (45, 2000.0),
            (60, 500.0),
        ] {
            history = record(&history, rate, at(second), 360.0, 15.0);
        }
        let rates: Vec<f64> = history.iter().map(|s| s.rate).collect();
        // The first run's mean over its 45 s: 1000, 1040 and 990 for 15 s each.
        assert_eq!(rates, vec![1010.0, 2000.0, 500.0]);
        // A run that ended more than a window ago leaves.
        history = record(&history, 500.0, at(410), 360.0, 15.0);
        let rates: Vec<f64> = history.iter().map(|s| s.rate).collect();
        assert_eq!(rates, vec![2000.0, 500.0]);
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
        let replay = Replay::new(&history, at(360), 360.0, 15.0);
        assert_eq!(replay.rate_at(10.0), 2000.0);
        assert_eq!(replay.rate_at(200.0), 500.0);
        assert_eq!(replay.rate_at(370.0), 2000.0);
        assert!((replay.mean() - 1250.0).abs() < 1e-9);
        assert_eq!(replay.peak(), 2000.0);
        // An old first run is replayed only for the window's length.
        let replay = Replay::new(&history, at(900), 360.0, 15.0);
        assert_eq!(replay.rate_at(10.0), 500.0);
        assert!((replay.mean() - 500.0).abs() < 1e-9);
    }

    #[test]
    fn the_fastest_rise_is_the_shortest_climb_from_low_to_high() {
        // A climb from 1000 (ending at 60 s) to 2000 (from 240 s): 180 s.
        let climbed = replay_of(
            &[
                (0, 1000.0),
                (60, 1300.0),
                (120, 1600.0),
                (180, 1900.0),
                (240, 2000.0),
            ],
            600,
        );
        assert_eq!(climbed.fastest_rise(1000.0, 2000.0), Some(180.0));
        // Thresholds between steps: from at or below 1300, to at or above 1900.
        assert_eq!(climbed.fastest_rise(1300.0, 1900.0), Some(60.0));
        // A climb, then a jump from 1000 to 2000: the jump is the fastest.
        let jumped_later = replay_of(
            &[
                (0, 1000.0),
                (60, 1500.0),
                (240, 2000.0),
                (300, 1000.0),
                (360, 2000.0),
            ],
            600,
        );
        assert_eq!(jumped_later.fastest_rise(1000.0, 2000.0), Some(0.0));
        // A window that began high saw no climb.
        let fell = replay_of(&[(0, 2000.0), (60, 1000.0)], 600);
        assert_eq!(fell.fastest_rise(1000.0, 2000.0), None);
    }

    /// 2000/s for 2 minutes every 5 minutes over 500/s, `cycles` times from second 0.
    fn peaks_every_five_minutes(cycles: i64) -> Vec<DemandSample> {
        (0..cycles)
            .flat_map(|cycle| {
                [
                    DemandSample {
                        at: at(300 * cycle),
                        rate: 2000.0,
                    },
                    DemandSample {
                        at: at(300 * cycle + 120),
                        rate: 500.0,
                    },
                ]
            })
            .collect()
    }

    #[test]
    fn a_peak_that_returns_is_replayed_with_its_period() {
        // 2000/s for 2 minutes every 5 minutes over a base of 500/s, now 1 minute into a trough.
        let history = peaks_every_five_minutes(3);
        let now = at(300 * 2 + 180);
        let replay = Replay::new(&history, now, 1800.0, 15.0);
        let periodic = replay.recurring_above(1000.0).expect("the peak returned");
        // One period ago it was 1 minute into the previous trough: 2 more minutes of 500/s,
        // then the next peak.
        assert_eq!(periodic.rate_at(0.0), 500.0);
        assert_eq!(periodic.rate_at(110.0), 500.0);
        assert_eq!(periodic.rate_at(130.0), 2000.0);
        assert_eq!(periodic.rate_at(300.0 + 130.0), 2000.0);
        assert!(
            (periodic.mean() - 1100.0).abs() < 1e-9,
            "{}",
            periodic.mean()
        );
        // Nothing rose above 2500/s.
        assert_eq!(replay.recurring_above(2500.0), None);
    }

    #[test]
    fn a_recurring_peak_tells_how_long_the_last_one_lasted_and_this_one_lasts() {
        // 2000/s for 2 minutes every 5 minutes over 500/s; the third peak began 40 s ago.
        let mut history = peaks_every_five_minutes(2);
        history.push(DemandSample {
            at: at(600),
            rate: 2000.0,
        });
        history.insert(
            0,
            DemandSample {
                at: at(-60),
                rate: 500.0,
            },
        );
        let replay = Replay::new(&history, at(640), 1800.0, 15.0);
        assert_eq!(
            replay.recurring_stretches_above(1000.0),
            Some((120.0, 40.0))
        );
        // In the trough after it, nothing is above the level now.
        let replay = Replay::new(&history[..5], at(500), 1800.0, 15.0);
        assert_eq!(replay.recurring_stretches_above(1000.0), Some((120.0, 0.0)));
        // Seen rising once only, or never above the level: no recurrence.
        let replay = Replay::new(&history[..3], at(200), 1800.0, 15.0);
        assert_eq!(replay.recurring_stretches_above(1000.0), None);
        assert_eq!(replay.recurring_stretches_above(2500.0), None);
    }

    #[test]
    fn a_peak_is_replayed_from_where_it_rose_to_where_it_fell() {
        // 500/s, then 1500/s and 3000/s for a minute each, back to 500/s for two minutes.
        let history: Vec<DemandSample> = [(0, 500.0), (120, 1500.0), (180, 3000.0), (240, 500.0)]
            .iter()
            .map(|&(second, rate)| DemandSample {
                at: at(second),
                rate,
            })
            .collect();
        let replay = Replay::new(&history, at(360), 360.0, 15.0);
        let peak = replay.peak_above(1000.0).expect("λ rose above 1000/s");
        assert_eq!(peak.span(), 120.0);
        assert_eq!(peak.rate_at(30.0), 1500.0);
        assert_eq!(peak.rate_at(90.0), 3000.0);
        assert_eq!(peak.peak(), 3000.0);
        // Above 2000/s only the second minute counts.
        let top = replay.peak_above(2000.0).expect("λ rose above 2000/s");
        assert_eq!((top.span(), top.rate_at(0.0)), (60.0, 3000.0));
        assert_eq!(replay.peak_above(3000.0), None);
    }

    #[test]
    fn a_rise_while_the_series_is_young_replaces_the_lower_readings() {
        // A workload started with its budget: the rate over a young series climbs for a
        // window (here 10 s) while the load is 3000/s throughout.
        let mut history = Vec::new();
        for (second, rate) in [(0, 900.0), (3, 1800.0), (6, 2700.0)] {
            history = lifted_while_young(&history, rate, at(second), 12.0);
            history = record(&history, rate, at(second), 360.0, 15.0);
        }
        assert_eq!(
            history,
            vec![DemandSample {
                at: at(0),
                rate: 2700.0
            }]
        );
        // A fall is news, young or not.
        let fallen = lifted_while_young(&history, 1000.0, at(9), 12.0);
        assert_eq!(record(&fallen, 1000.0, at(9), 360.0, 15.0).len(), 2);
        // Once the history is older than the window, a rise is a new run.
        let old = lifted_while_young(&history, 5000.0, at(12), 12.0);
        assert_eq!(record(&old, 5000.0, at(12), 360.0, 15.0).len(), 2);
    }

    #[test]
    fn a_full_history_keeps_a_spike_about_as_long_as_it_was_seen() {
        // 20 minutes of a load that changes every minute fill the runs; then a 100 s spike
        // to 14400/s read through a 1-minute rate window at 15 s polls, then the base.
        let mut readings: Vec<f64> = (0..80)
            .map(|i| if (i / 4) % 2 == 0 { 1000.0 } else { 3000.0 })
            .collect();
        readings.extend([
            3200.0, 6000.0, 8800.0, 11600.0, 14400.0, 14400.0, 14400.0, 11600.0, 8800.0, 6000.0,
        ]);
        readings.extend([3200.0; 8]);
        let mut history = Vec::new();
        for (i, rate) in readings.iter().enumerate() {
            history = record(&history, *rate, at(15 * i as i64), 1530.0, 15.0);
        }
        assert_eq!(history.len(), MAX_RUNS);
        let now = at(15 * readings.len() as i64);
        let replay = Replay::new(&history, now, 1530.0, 15.0);
        // The spike's readings: at 14400/s for 3 polls, and 1.0M events above the base.
        let spike = replay.peak_above(3200.0).expect("λ rose above the base");
        let top = replay.peak_above(14_000.0).map(|peak| peak.span());
        assert!(top.is_some_and(|span| span <= 60.0), "{history:?}");
        let extra: f64 = (0..spike.span() as u32)
            .map(|t| spike.rate_at(f64::from(t)) - 3200.0)
            .sum();
        let read: f64 = readings[80..90]
            .iter()
            .map(|rate| (rate - 3200.0) * 15.0)
            .sum();
        assert!(
            extra <= 1.3 * read,
            "{extra} events above the base, read {read}"
        );
    }

    #[test]
    fn a_noisy_load_is_remembered_at_its_mean_and_a_peak_at_its_height() {
        // 20 minutes of readings that move up to 20 % from poll to poll around 1000/s.
        let noisy: Vec<f64> = (0..80)
            .map(|i| 1000.0 * (1.0 + 0.1 * [-1.0, 0.5, 1.0, -0.5, 0.0][i % 5]))
            .collect();
        let mut history = Vec::new();
        for (i, rate) in noisy.iter().enumerate() {
            history = record(&history, *rate, at(15 * i as i64), 1200.0, 15.0);
        }
        let now = at(15 * noisy.len() as i64);
        let replay = Replay::new(&history, now, 1200.0, 15.0);
        assert!((replay.mean() - 1000.0).abs() <= 50.0, "{history:?}");
        // A peak twice the load for two minutes keeps its height among the noise.
        for i in 80..88 {
            history = record(&history, 2000.0, at(15 * i), 1200.0, 15.0);
        }
        let replay = Replay::new(&history, at(15 * 88), 1200.0, 15.0);
        assert_eq!(replay.peak(), 2000.0);
    }

    #[test]
    fn a_window_that_began_above_a_level_saw_the_rise_within_it_before() {
        // Readings a minute apart; the replay is taken at the last one.
        let replay = |rates: &[f64], window: f64| {
            let mut history = Vec::new();
            for (i, rate) in rates.iter().enumerate() {
                history = record(&history, *rate, at(60 * i as i64), window, 60.0);
            }
            Replay::new(&history, at(60 * (rates.len() as i64 - 1)), window, 60.0)
        };
        // A 150 s window holds the tail of a peak, the trough, and the next peak.
        let peaks = [1000.0, 3000.0, 3000.0, 1000.0, 3000.0];
        assert!(replay(&peaks, 150.0).rose_again_above(2000.0));
        // The tail of a peak that has not come back.
        let once = [1000.0, 3000.0, 3000.0, 1000.0, 1000.0];
        assert!(!replay(&once, 150.0).rose_again_above(2000.0));
        // Two rises within a longer window are a recurring load already.
        assert!(!replay(&peaks, 600.0).rose_again_above(2000.0));
        assert!(replay(&peaks, 600.0).recurring_above(2000.0).is_some());
    }

    proptest! {
        #[test]
        fn a_history_stays_bounded_and_ordered(rates in proptest::collection::vec(0.0..1e5f64, 1..300)) {
            let mut history = Vec::new();
            for (i, rate) in rates.iter().enumerate() {
                history = record(&history, *rate, at(15 * i as i64), 720.0, 15.0);
                prop_assert!(history.len() <= MAX_RUNS);
                prop_assert!(history.windows(2).all(|w| w[0].at < w[1].at));
            }
            let replay = Replay::new(&history, at(15 * rates.len() as i64), 720.0, 15.0);
            prop_assert!(replay.mean() <= replay.peak() + 1e-9);
        }
    }
}
