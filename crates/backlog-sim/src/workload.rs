//! The discrete-time workload: per-partition FIFO queues of timestamped events, consumer pods
//! that take time to start, and a rebalance pause on every membership change.

use std::collections::VecDeque;

use super::scenario::Model;

/// Events created at the same instant in one partition.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    created: f64,
    count: f64,
}

/// Completion latencies in one-second buckets (for percentiles).
#[derive(Clone, Debug, Default)]
pub struct LatencyHistogram {
    buckets: Vec<f64>,
    total: f64,
}

impl LatencyHistogram {
    pub fn record(&mut self, latency_seconds: f64, count: f64) {
        let bucket = latency_seconds.max(0.0).floor() as usize;
        if bucket >= self.buckets.len() {
            self.buckets.resize(bucket + 1, 0.0);
        }
        self.buckets[bucket] += count;
        self.total += count;
    }

    /// The latency (seconds, bucket upper bound) below which `quantile` of events completed.
    pub fn quantile(&self, quantile: f64) -> Option<f64> {
        if self.total <= 0.0 {
            return None;
        }
        let wanted = quantile.clamp(0.0, 1.0) * self.total;
        let mut seen = 0.0;
        for (second, count) in self.buckets.iter().enumerate() {
            seen += count;
            if seen >= wanted && *count > 0.0 {
                return Some(second as f64 + 1.0);
            }
        }
        Some(self.buckets.len() as f64)
    }

    pub fn total(&self) -> f64 {
        self.total
    }
}

/// The workload's true state.
pub struct Workload<'m> {
    model: &'m Model,
    pub now: f64,
    queues: Vec<VecDeque<Chunk>>,
    /// Each partition's share of production; `None` for an even split.
    uneven_shares: Option<Vec<f64>>,
    /// When each requested pod becomes ready; `len()` is the target's spec.replicas.
    pods: Vec<f64>,
    /// Consumers in the current group assignment.
    members: usize,
    rebalance_until: f64,
    pub produced_total: f64,
    pub completed_total: f64,
    pub latencies: LatencyHistogram,
    pub rebalances: u32,
}

/// The model's partition shares unless they are all equal (or do not match the partition
/// count): an even split keeps dividing by the partition count, exactly as before weights.
fn uneven_shares(model: &Model) -> Option<Vec<f64>> {
    let shares = &model.partition_shares;
    let matches = shares.len() == model.partitions as usize;
    let even = shares.windows(2).all(|pair| pair[0] == pair[1]);
    (matches && !even).then(|| shares.clone())
}

impl<'m> Workload<'m> {
    pub fn new(model: &'m Model) -> Self {
        let replicas = model.initial_replicas as usize;
        Self {
            model,
            now: 0.0,
            queues: vec![VecDeque::new(); model.partitions as usize],
            uneven_shares: uneven_shares(model),
            pods: vec![0.0; replicas],
            members: replicas,
            rebalance_until: 0.0,
            produced_total: 0.0,
            completed_total: 0.0,
            latencies: LatencyHistogram::default(),
            rebalances: 0,
        }
    }

    /// The target's spec.replicas.
    pub fn replicas(&self) -> u32 {
        self.pods.len() as u32
    }

    pub fn ready_replicas(&self) -> u32 {
        self.pods.iter().filter(|ready| **ready <= self.now).count() as u32
    }

    /// Sets spec.replicas: new pods start after the pod start delay; removed pods stop at once.
    pub fn scale_to(&mut self, replicas: u32) {
        let replicas = replicas as usize;
        if replicas > self.pods.len() {
            let ready_at = self.now + self.model.pod_start_delay;
            self.pods.resize(replicas, ready_at);
        } else {
            // The newest pods go first, as a ReplicaSet prefers not-ready and younger pods.
            self.pods
                .sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
            self.pods.truncate(replicas);
        }
    }

    /// Unfinished events per partition.
    pub fn partition_backlogs(&self) -> Vec<f64> {
        self.queues
            .iter()
            .map(|q| q.iter().map(|c| c.count).sum())
            .collect()
    }

    pub fn backlog(&self) -> f64 {
        self.queues.iter().flatten().map(|c| c.count).sum()
    }

    /// Age of the oldest unfinished event (0 when there is none).
    pub fn oldest_age(&self) -> f64 {
        self.queues
            .iter()
            .filter_map(|q| q.front())
            .map(|c| self.now - c.created)
            .fold(0.0, f64::max)
    }

    /// Events per second the ready consumers can complete right now (0 while rebalancing).
    pub fn capacity(&self) -> f64 {
        if self.now < self.rebalance_until {
            return 0.0;
        }
        let active = self.members.min(self.queues.len());
        active as f64 * self.model.replica_rate(self.now)
    }

    pub fn rebalancing(&self) -> bool {
        self.now < self.rebalance_until
    }

    /// Advances the model by one step.
    pub fn step(&mut self) {
        let dt = self.model.step;
        let t = self.now;
        self.produce(t, dt);

        let ready = self.ready_replicas() as usize;
        if ready != self.members {
            self.members = ready;
            self.rebalance_until = t + self.model.rebalance_pause;
            self.rebalances += 1;
        }
        if t >= self.rebalance_until {
            self.consume(t, dt);
        }
        self.now = t + dt;
    }

    fn produce(&mut self, t: f64, dt: f64) {
        let events = self.model.production_rate(t) * dt;
        if events <= 0.0 {
            return;
        }
        let even = events / self.queues.len() as f64;
        for (partition, queue) in self.queues.iter_mut().enumerate() {
            let count = match &self.uneven_shares {
                Some(shares) => shares.get(partition).map_or(even, |share| events * share),
                None => even,
            };
            queue.push_back(Chunk { created: t, count });
        }
        self.produced_total += events;
    }

    /// Each active consumer owns partitions p with p mod active == its index, and spends its
    /// step's capacity on the oldest heads among them.
    fn consume(&mut self, t: f64, dt: f64) {
        let active = self.members.min(self.queues.len());
        if active == 0 {
            return;
        }
        let per_consumer = self.model.replica_rate(t) * dt;
        let done_at = t + dt;
        for consumer in 0..active {
            let mut budget = per_consumer;
            while budget > 1e-9 {
                let oldest = (consumer..self.queues.len())
                    .step_by(active)
                    .filter_map(|p| self.queues[p].front().map(|c| (p, c.created)))
                    .min_by(|a, b| a.1.partial_cmp(&b.1).unwrap_or(std::cmp::Ordering::Equal));
                let Some((partition, _)) = oldest else { break };
                let queue = &mut self.queues[partition];
                let Some(head) = queue.front_mut() else { break };
                let taken = head.count.min(budget);
                head.count -= taken;
                budget -= taken;
                self.completed_total += taken;
                self.latencies.record(done_at - head.created, taken);
                if head.count <= 1e-9 {
                    queue.pop_front();
                }
            }
        }
    }
}
