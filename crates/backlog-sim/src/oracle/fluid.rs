//! The oracle's fluid picture of a scenario: cumulative arrivals and consumer work at the
//! model's step, cut into decision buckets and short substeps, and how fast a group of k
//! consumers clears the stream given which partitions each one owns.

use super::super::scenario::Model;

/// Substep length: ages are checked at every substep's end, so a plan can miss a breach of
/// at most this long (the verifying run catches it).
const SUBSTEP_SECONDS: f64 = 5.0;

/// What happens to consumption from a bucket's start when the plan keeps, raises or lowers
/// the count there.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Change {
    Keep,
    /// New pods start, then the group rebalances.
    Up,
    /// Removed pods stop at once and the group rebalances.
    Down,
}

/// One substep of an edge: arrivals, the consumer work of one replica while the old and the
/// new assignment consume, and the arrivals of the last age-limit seconds at its end (the
/// most backlog whose head is still young enough).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Substep {
    pub arrivals: f64,
    pub old_work: f64,
    pub new_work: f64,
    pub window: f64,
}

/// A change at a bucket's start and its effect until the count may change again.
pub(super) struct Edge {
    pub substeps: Vec<Substep>,
    /// The bucket where the next decision may change the count.
    pub landing: usize,
    /// Seconds the new count is paid for along the edge.
    pub seconds: f64,
}

pub(super) struct Fluid<'m> {
    model: &'m Model,
    pub bucket_seconds: f64,
    pub buckets: usize,
    /// The run's end (a whole number of model steps).
    pub end: f64,
    /// Cumulative arrivals and one replica's cumulative work at every step boundary.
    arrived: Vec<f64>,
    worked: Vec<f64>,
    /// Substep boundaries; bucket `b` covers substeps `first_substep[b]..first_substep[b+1]`.
    boundaries: Vec<f64>,
    first_substep: Vec<usize>,
    /// Arrivals of the last `limit` seconds at each substep's end and at each bucket's start.
    windows: Vec<f64>,
    bucket_windows: Vec<f64>,
}

impl<'m> Fluid<'m> {
    /// `limit`: the oldest age a plan may reach, in seconds.
    pub fn new(model: &'m Model, bucket_seconds: f64, limit: f64) -> Self {
        let (mut arrived, mut worked) = (vec![0.0], vec![0.0]);
        // The same clock as the run loop, so the plan covers exactly the steps the run takes.
        let mut t = 0.0;
        while t < model.duration {
            let last = arrived.len() - 1;
            arrived.push(arrived[last] + model.production_rate(t) * model.step);
            worked.push(worked[last] + model.replica_rate(t) * model.step);
            t += model.step;
        }
        let end = t;
        let buckets = ((end / bucket_seconds) - 1e-9).ceil().max(1.0) as usize;
        let (mut boundaries, mut first_substep) = (vec![0.0], Vec::new());
        for bucket in 0..buckets {
            first_substep.push(boundaries.len() - 1);
            let start = bucket as f64 * bucket_seconds;
            let length = (end - start).min(bucket_seconds);
            let parts = (length / SUBSTEP_SECONDS).ceil().max(1.0) as usize;
            for part in 1..=parts {
                boundaries.push(start + length * part as f64 / parts as f64);
            }
        }
        first_substep.push(boundaries.len() - 1);
        let mut fluid = Self {
            model,
            bucket_seconds,
            buckets,
            end,
            arrived,
            worked,
            boundaries,
            first_substep,
            windows: Vec::new(),
            bucket_windows: Vec::new(),
        };
        fluid.windows = fluid.boundaries[1..]
            .iter()
            .map(|&at| fluid.window(at, limit))
            .collect();
        fluid.bucket_windows = (0..=buckets)
            .map(|bucket| fluid.window(fluid.bucket_start(bucket), limit))
            .collect();
        fluid
    }

    pub fn bucket_start(&self, bucket: usize) -> f64 {
        (bucket as f64 * self.bucket_seconds).min(self.end)
    }

    /// The most backlog at a bucket's start whose head is young enough.
    pub fn bucket_window(&self, bucket: usize) -> f64 {
        self.bucket_windows[bucket.min(self.buckets)]
    }

    /// A cumulative curve at `t`, linear within a step.
    fn at(&self, curve: &[f64], t: f64) -> f64 {
        let position = (t / self.model.step).max(0.0);
        let index = (position.floor() as usize).min(curve.len() - 1);
        let next = (index + 1).min(curve.len() - 1);
        let within = (position - index as f64).clamp(0.0, 1.0);
        curve[index] + (curve[next] - curve[index]) * within
    }

    fn window(&self, t: f64, limit: f64) -> f64 {
        self.at(&self.arrived, t) - self.at(&self.arrived, t - limit)
    }

    fn work(&self, from: f64, to: f64) -> f64 {
        if to <= from {
            return 0.0;
        }
        self.at(&self.worked, to) - self.at(&self.worked, from)
    }

    /// The edge of `change` at the start of `bucket`.
    pub fn edge(&self, bucket: usize, change: Change) -> Edge {
        let start = self.bucket_start(bucket);
        let (delay, pause) = (self.model.pod_start_delay, self.model.rebalance_pause);
        // When the old assignment stops consuming and the new one starts.
        let (old_until, new_from, busy) = match change {
            Change::Keep => (f64::INFINITY, f64::INFINITY, 0.0),
            Change::Up => (start + delay, start + delay + pause, delay + pause),
            Change::Down => (start, start + pause, pause),
        };
        let spans = ((busy / self.bucket_seconds) - 1e-9).ceil().max(1.0) as usize;
        let landing = (bucket + spans).min(self.buckets);
        let substeps = (self.first_substep[bucket]..self.first_substep[landing])
            .map(|index| {
                let (from, to) = (self.boundaries[index], self.boundaries[index + 1]);
                Substep {
                    arrivals: self.at(&self.arrived, to) - self.at(&self.arrived, from),
                    old_work: self.work(from, to.min(old_until)),
                    new_work: self.work(from.max(new_from), to),
                    window: self.windows[index],
                }
            })
            .collect();
        Edge {
            substeps,
            landing,
            seconds: self.bucket_start(landing) - start,
        }
    }
}

/// How many replicas' worth of the stream `consumers` clear: consumer i owns the partitions
/// p with p mod consumers == i, so the one with the largest share of production sets the
/// pace of the oldest event (1 / that share).
pub(super) fn group_speed(shares: &[f64], consumers: u32) -> f64 {
    let consumers = (consumers as usize).clamp(1, shares.len().max(1));
    let mut owned = vec![0.0; consumers];
    for (partition, share) in shares.iter().enumerate() {
        owned[partition % consumers] += share;
    }
    let busiest = owned.iter().copied().fold(0.0, f64::max);
    if busiest > 0.0 { 1.0 / busiest } else { 0.0 }
}

/// The backlog after an edge for a group that clears `old_speed` replicas' worth of the
/// stream before the change and `new_speed` after it; `None` when the oldest event would get
/// older than the limit on the way.
pub(super) fn advance(
    edge: &[Substep],
    mut backlog: f64,
    old_speed: f64,
    new_speed: f64,
) -> Option<f64> {
    for substep in edge {
        backlog = (backlog + substep.arrivals
            - substep.old_work * old_speed
            - substep.new_work * new_speed)
            .max(0.0);
        if backlog > substep.window * (1.0 + 1e-9) + 1e-9 {
            return None;
        }
    }
    Some(backlog)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_consumer_sets_the_group_speed() {
        let even = vec![1.0 / 16.0; 16];
        assert!((group_speed(&even, 8) - 8.0).abs() < 1e-9);
        // 16 partitions over 5 consumers: one owns 4 of them.
        assert!((group_speed(&even, 5) - 4.0).abs() < 1e-9);
        // A partition with half the production caps the group at two replicas' worth.
        let hot = [0.5, 0.125, 0.125, 0.125, 0.125];
        assert!((group_speed(&hot, 5) - 2.0).abs() < 1e-9);
        assert!((group_speed(&hot, 2) - 1.0 / 0.75).abs() < 1e-9);
    }

    #[test]
    fn a_backlog_older_than_the_window_fails_the_edge() {
        let substep = Substep {
            arrivals: 100.0,
            old_work: 10.0,
            new_work: 0.0,
            window: 150.0,
        };
        assert_eq!(advance(&[substep], 0.0, 5.0, 0.0), Some(50.0));
        assert_eq!(advance(&[substep, substep], 0.0, 5.0, 0.0), Some(100.0));
        assert_eq!(advance(&[substep; 4], 0.0, 5.0, 0.0), None);
        assert_eq!(advance(&[substep], 0.0, 20.0, 0.0), Some(0.0));
    }
}
