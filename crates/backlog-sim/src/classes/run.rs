//! The event-level simulation of a class experiment: every event, every execution, every
//! retry, with the operator's scaling decision and (optionally) its class breaker in the loop.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::convert::Infallible;
use std::time::Duration;

use jiff::Timestamp;
use rand::RngExt;
use serde::Serialize;

use super::ExperimentModel;
use crate::workload::LatencyHistogram;
use backlog_consumer::{
    QuarantineReason, RetryBudgetTracker, RetryDecision, RetryPlanner, is_probe,
};
use backlog_core::class_breaker::{ClassMemory, holds_backlog, read, step};
use backlog_core::event_class::ClassState;
use backlog_core::metric_input::Observation;
use backlog_core::scaling::{ScalingInputs, ScalingMemory, decide};

/// SplitMix64: a small, fast, seedable generator, so a run is a function of its seed.
#[derive(Clone, Debug)]
pub struct SimRng(u64);

impl SimRng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
}

impl rand::TryRng for SimRng {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok((self.try_next_u64()? >> 32) as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Ok(z ^ (z >> 31))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            let bytes = self.try_next_u64()?.to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        Ok(())
    }
}

/// One event.
#[derive(Clone, Copy, Debug)]
struct Event {
    seq: u64,
    class: usize,
    partition: usize,
    created: f64,
    /// When it may run: its creation, or the end of its retry delay.
    ready_at: f64,
    /// Executions so far.
    executions: u32,
    /// Whether an execution of it failed.
    failed: bool,
}

impl Event {
    fn id(&self) -> String {
        format!("evt-{}", self.seq)
    }
}

/// A scheduled retry, ordered by due time (then by event, for determinism).
struct Scheduled(Event);

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap and the earliest due retry must come first.
        other
            .0
            .ready_at
            .total_cmp(&self.0.ready_at)
            .then(other.0.seq.cmp(&self.0.seq))
    }
}

/// One class's counters.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClassSummary {
    pub name: String,
    /// Whether the scenario makes this class fail at some point.
    pub failing: bool,
    pub produced: u64,
    pub executions: u64,
    pub failed_executions: u64,
    pub succeeded: u64,
    pub quarantined_persistent: u64,
    pub quarantined_attempts_exhausted: u64,
    pub quarantined_budget_exhausted: u64,
    pub rejected: u64,
    pub reconciling: u64,
    /// Not finished at the end (held by the breaker, waiting for a retry, or queued).
    pub pending_at_end: u64,
    /// Events with at least one failed execution that left the hot path, by executions:
    /// index n holds the events executed n times.
    pub failing_events_by_executions: Vec<u64>,
    /// The most executions any event with a failure got (finished or not).
    pub max_executions_failing_event: u32,
    /// Seconds from the first failing spell's start to the first pause.
    pub paused_after_seconds: Option<f64>,
    /// Seconds the class spent Paused.
    pub paused_seconds: f64,
    /// Seconds the class spent Probing.
    pub probing_seconds: f64,
    /// (time, from, to).
    pub transitions: Vec<(f64, ClassState, ClassState)>,
    pub latency_p95_seconds: Option<f64>,
    pub latency_p99_seconds: Option<f64>,
}

impl ClassSummary {
    /// Mean executions of the failing events that left the hot path.
    pub fn mean_executions_failing_event(&self) -> Option<f64> {
        let events: u64 = self.failing_events_by_executions.iter().sum();
        let executions: u64 = self
            .failing_events_by_executions
            .iter()
            .enumerate()
            .map(|(n, count)| n as u64 * count)
            .sum();
        (events > 0).then(|| executions as f64 / events as f64)
    }

    pub fn quarantined(&self) -> u64 {
        self.quarantined_persistent
            + self.quarantined_attempts_exhausted
            + self.quarantined_budget_exhausted
    }
}

/// What one run achieved.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExperimentSummary {
    pub scenario: String,
    pub breaker: bool,
    pub max_attempts: u32,
    pub deadline_seconds: f64,
    /// Successful completions of the classes that never fail, and their latency.
    pub healthy_completed: u64,
    pub healthy_p50_seconds: Option<f64>,
    pub healthy_p95_seconds: Option<f64>,
    pub healthy_p99_seconds: Option<f64>,
    /// Healthy events that completed after the deadline.
    pub healthy_late: u64,
    /// Healthy events quarantined (their transient failures found the retry budget spent).
    pub healthy_quarantined: u64,
    /// Seconds (at scrape resolution) during which a healthy event older than the deadline
    /// was unfinished.
    pub healthy_breach_seconds: f64,
    pub replica_seconds: f64,
    pub mean_replicas: f64,
    pub peak_replicas: u32,
    pub executions: u64,
    pub classes: Vec<ClassSummary>,
}

impl ExperimentSummary {
    /// The classes the scenario makes fail.
    pub fn failing(&self) -> impl Iterator<Item = &ClassSummary> {
        self.classes.iter().filter(|c| c.failing)
    }
}

/// One row per poll, for plots and debugging.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExperimentRow {
    pub t: f64,
    pub replicas: u32,
    pub backlog: u64,
    pub states: Vec<ClassState>,
    pub phase: String,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ExperimentRun {
    pub summary: ExperimentSummary,
    pub timeline: Vec<ExperimentRow>,
}

/// Counters scraped at one instant.
#[derive(Clone, Debug)]
struct Scrape {
    at: f64,
    produced: u64,
    finished: u64,
    executions: Vec<u64>,
    failures: Vec<u64>,
    pending: Vec<u64>,
    /// Age of each class's oldest event the consumers are working on.
    oldest_age: Vec<f64>,
    ready_replicas: u32,
}

struct World<'e> {
    experiment: &'e ExperimentModel,
    breaker: bool,
    rng: SimRng,
    planner: RetryPlanner,
    budget: RetryBudgetTracker,
    now: f64,
    next_seq: u64,
    produce_carry: f64,
    /// [class][partition]
    queues: Vec<Vec<VecDeque<Event>>>,
    /// Events a held class left untouched, [class][partition]; back in the queue when Active.
    held: Vec<Vec<VecDeque<Event>>>,
    retries: BinaryHeap<Scheduled>,
    /// Due retries, [partition].
    due: Vec<VecDeque<Event>>,
    pods: Vec<f64>,
    members: usize,
    rebalance_until: f64,
    capacity_carry: Vec<f64>,
    /// Each consumer's round-robin position among its queues.
    cursors: Vec<usize>,
    states: Vec<ClassState>,
    memories: Vec<Option<ClassMemory>>,
    pending: Vec<u64>,
    produced_total: u64,
    finished_total: u64,
    classes: Vec<ClassSummary>,
    latencies: Vec<LatencyHistogram>,
    /// The classes that never fail, together.
    healthy: LatencyHistogram,
    healthy_late: u64,
}

impl<'e> World<'e> {
    fn new(experiment: &'e ExperimentModel, breaker: bool) -> Self {
        let model = &experiment.model;
        let partitions = model.partitions as usize;
        let count = experiment.classes.len();
        let replicas = model.initial_replicas as usize;
        Self {
            experiment,
            breaker,
            rng: SimRng::new(experiment.seed),
            planner: experiment.policy.planner(),
            budget: RetryBudgetTracker::for_policy(&experiment.policy),
            now: 0.0,
            next_seq: 0,
            produce_carry: 0.0,
            queues: vec![vec![VecDeque::new(); partitions]; count],
            held: vec![vec![VecDeque::new(); partitions]; count],
            retries: BinaryHeap::new(),
            due: vec![VecDeque::new(); partitions],
            pods: vec![0.0; replicas],
            members: replicas,
            rebalance_until: 0.0,
            capacity_carry: vec![0.0; partitions],
            cursors: vec![0; partitions],
            states: vec![ClassState::Active; count],
            memories: vec![None; count],
            pending: vec![0; count],
            produced_total: 0,
            finished_total: 0,
            classes: experiment
                .classes
                .iter()
                .map(|class| ClassSummary {
                    name: class.name.clone(),
                    failing: class.fails(),
                    failing_events_by_executions: vec![
                        0;
                        experiment.policy.max_attempts() as usize + 1
                    ],
                    ..ClassSummary::default()
                })
                .collect(),
            latencies: vec![LatencyHistogram::default(); count],
            healthy: LatencyHistogram::default(),
            healthy_late: 0,
        }
    }

    fn replicas(&self) -> u32 {
        self.pods.len() as u32
    }

    fn ready_replicas(&self) -> u32 {
        self.pods.iter().filter(|ready| **ready <= self.now).count() as u32
    }

    fn scale_to(&mut self, replicas: u32) {
        let replicas = replicas as usize;
        if replicas > self.pods.len() {
            let ready_at = self.now + self.experiment.model.pod_start_delay;
            self.pods.resize(replicas, ready_at);
        } else {
            self.pods.sort_by(f64::total_cmp);
            self.pods.truncate(replicas);
        }
    }

    fn time(&self) -> Duration {
        Duration::from_secs_f64(self.now.max(0.0))
    }

    fn produce(&mut self, dt: f64) {
        let model = &self.experiment.model;
        let exact = model.production_rate(self.now) * dt + self.produce_carry;
        let count = exact.floor().max(0.0) as u64;
        self.produce_carry = exact - count as f64;
        let partitions = self.queues.first().map_or(1, Vec::len).max(1);
        for i in 0..count {
            let draw: f64 = self.rng.random();
            let mut class = self.experiment.classes.len() - 1;
            let mut cumulative = 0.0;
            for (index, model) in self.experiment.classes.iter().enumerate() {
                cumulative += model.share;
                if draw < cumulative {
                    class = index;
                    break;
                }
            }
            let created = self.now + dt * i as f64 / count as f64;
            let seq = self.next_seq;
            self.next_seq += 1;
            let partition = (seq % partitions as u64) as usize;
            self.queues[class][partition].push_back(Event {
                seq,
                class,
                partition,
                created,
                ready_at: created,
                executions: 0,
                failed: false,
            });
            self.pending[class] += 1;
            self.classes[class].produced += 1;
            self.produced_total += 1;
        }
    }

    fn release_due_retries(&mut self) {
        while self
            .retries
            .peek()
            .is_some_and(|next| next.0.ready_at <= self.now)
        {
            if let Some(Scheduled(event)) = self.retries.pop() {
                self.due[event.partition].push_back(event);
            }
        }
    }

    /// Whether consumers execute this event now, by the control document.
    fn may_run(&self, event: &Event) -> bool {
        match self.states[event.class] {
            ClassState::Active => true,
            ClassState::Paused => false,
            ClassState::Probing => is_probe(
                &event.id(),
                self.experiment.classes[event.class].breaker.probe_ratio,
            ),
        }
    }

    /// The next event consumer `consumer` runs, taken off its queue. A consumer fetches from
    /// all its partitions in turn, as Kafka consumers do: each of its queues (a class's stream
    /// on a partition, or the partition's due retries) in round robin, so a class with a deep
    /// backlog gets its share of the capacity but not all of it.
    fn next_event(&mut self, consumer: usize, active: usize) -> Option<Event> {
        let partitions = self.due.len();
        let sources = self.queues.len() + 1;
        let owned = (partitions - consumer).div_ceil(active);
        let slots = owned * sources;
        let mut empty_in_a_row = 0;
        while empty_in_a_row < slots {
            let slot = self.cursors[consumer] % slots;
            self.cursors[consumer] = (slot + 1) % slots;
            let partition = consumer + (slot / sources) * active;
            let source = slot % sources;
            let event = if source == self.queues.len() {
                self.due[partition].pop_front()
            } else if self.states[source] == ClassState::Paused {
                None
            } else {
                self.queues[source][partition].pop_front()
            };
            let Some(event) = event else {
                empty_in_a_row += 1;
                continue;
            };
            if self.may_run(&event) {
                return Some(event);
            }
            // Skipped, not dropped: it waits for the class to be Active again.
            self.held[event.class][event.partition].push_back(event);
            empty_in_a_row = 0;
        }
        None
    }

    fn consume(&mut self, dt: f64) {
        if self.now < self.rebalance_until {
            return;
        }
        let active = self.members.min(self.due.len());
        if active == 0 {
            return;
        }
        let per_consumer = self.experiment.model.replica_rate(self.now) * dt;
        for consumer in 0..active {
            self.capacity_carry[consumer] += per_consumer;
            while self.capacity_carry[consumer] >= 1.0 {
                let Some(event) = self.next_event(consumer, active) else {
                    // Idle capacity is not saved up for later.
                    self.capacity_carry[consumer] = 0.0;
                    break;
                };
                self.execute(event, dt);
                self.capacity_carry[consumer] -= 1.0;
            }
        }
    }

    fn execute(&mut self, mut event: Event, dt: f64) {
        let now = self.time();
        let class = event.class;
        event.executions += 1;
        if event.executions == 1 {
            self.budget.record_primary(now);
        }
        self.classes[class].executions += 1;
        let spell = self.experiment.classes[class].spell_at(self.now);
        let fails = spell.is_some_and(|s| self.rng.random::<f64>() < s.probability);
        let done_at = self.now + dt;
        if !fails {
            self.classes[class].succeeded += 1;
            let latency = done_at - event.created;
            self.latencies[class].record(latency, 1.0);
            if !self.experiment.classes[class].fails() {
                self.healthy.record(latency, 1.0);
                if latency > self.experiment.model.budget.deadline_seconds {
                    self.healthy_late += 1;
                }
            }
            self.finish(&event);
            return;
        }
        event.failed = true;
        let summary = &mut self.classes[class];
        summary.failed_executions += 1;
        summary.max_executions_failing_event =
            summary.max_executions_failing_event.max(event.executions);
        let code = spell.map_or("", |s| s.error_code.as_str());
        let failure_class = self.experiment.policy.classify(code);
        match self.planner.decide(
            failure_class,
            event.executions,
            &mut self.budget,
            now,
            &mut self.rng,
        ) {
            RetryDecision::Retry { delay, .. } => {
                event.ready_at = done_at + delay.as_secs_f64();
                self.retries.push(Scheduled(event));
                return;
            }
            RetryDecision::Quarantine { reason } => {
                let summary = &mut self.classes[class];
                match reason {
                    QuarantineReason::PersistentFailure => summary.quarantined_persistent += 1,
                    QuarantineReason::AttemptsExhausted => {
                        summary.quarantined_attempts_exhausted += 1;
                    }
                    QuarantineReason::RetryBudgetExhausted => {
                        summary.quarantined_budget_exhausted += 1;
                    }
                }
            }
            RetryDecision::Reject => self.classes[class].rejected += 1,
            RetryDecision::Reconcile => self.classes[class].reconciling += 1,
        }
        self.finish(&event);
    }

    fn finish(&mut self, event: &Event) {
        self.pending[event.class] = self.pending[event.class].saturating_sub(1);
        self.finished_total += 1;
        if event.failed {
            let histogram = &mut self.classes[event.class].failing_events_by_executions;
            let index = event.executions as usize;
            if index >= histogram.len() {
                histogram.resize(index + 1, 0);
            }
            histogram[index] += 1;
        }
    }

    fn step(&mut self) {
        let dt = self.experiment.model.step;
        self.produce(dt);
        self.release_due_retries();
        let ready = self.ready_replicas() as usize;
        if ready != self.members {
            self.members = ready;
            self.rebalance_until = self.now + self.experiment.model.rebalance_pause;
        }
        self.consume(dt);
        for (class, state) in self.states.iter().enumerate() {
            match state {
                ClassState::Paused => self.classes[class].paused_seconds += dt,
                ClassState::Probing => self.classes[class].probing_seconds += dt,
                ClassState::Active => {}
            }
        }
        self.now += dt;
    }

    /// The oldest unfinished event of each class the consumers are working on (held events
    /// excluded), and the oldest of all, held included.
    fn oldest_created(&self) -> (Vec<Option<f64>>, Vec<Option<f64>>) {
        let count = self.queues.len();
        let mut working: Vec<Option<f64>> = vec![None; count];
        let mut all: Vec<Option<f64>> = vec![None; count];
        let see = |slot: &mut Option<f64>, created: f64| {
            *slot = Some(slot.map_or(created, |c: f64| c.min(created)));
        };
        for class in 0..count {
            for queue in &self.queues[class] {
                if let Some(event) = queue.front() {
                    if self.states[class] != ClassState::Paused {
                        see(&mut working[class], event.created);
                    }
                    see(&mut all[class], event.created);
                }
            }
            for queue in &self.held[class] {
                for event in queue {
                    see(&mut all[class], event.created);
                }
            }
        }
        let retries = self
            .retries
            .iter()
            .map(|s| &s.0)
            .chain(self.due.iter().flatten());
        for event in retries {
            if self.states[event.class] != ClassState::Paused {
                see(&mut working[event.class], event.created);
            }
            see(&mut all[event.class], event.created);
        }
        (working, all)
    }

    fn scrape(&self) -> Scrape {
        let (working, _) = self.oldest_created();
        Scrape {
            at: self.now,
            produced: self.produced_total,
            finished: self.finished_total,
            executions: self.classes.iter().map(|c| c.executions).collect(),
            failures: self.classes.iter().map(|c| c.failed_executions).collect(),
            pending: self.pending.clone(),
            oldest_age: working
                .iter()
                .map(|created| created.map_or(0.0, |c| (self.now - c).max(0.0)))
                .collect(),
            ready_replicas: self.ready_replicas(),
        }
    }

    /// A class is Active again: what it left untouched goes back to the front of its queues.
    fn release_held(&mut self, class: usize) {
        for partition in 0..self.held[class].len() {
            let mut held = std::mem::take(&mut self.held[class][partition]);
            held.make_contiguous()
                .sort_by(|a, b| a.ready_at.total_cmp(&b.ready_at));
            while let Some(event) = held.pop_back() {
                self.queues[class][partition].push_front(event);
            }
        }
    }
}

/// `rate()` over `window` of a counter in the scrapes.
fn rate(scrapes: &VecDeque<Scrape>, window: f64, counter: impl Fn(&Scrape) -> f64) -> Option<f64> {
    let last = scrapes.back()?;
    let first = scrapes.iter().find(|s| last.at - s.at <= window)?;
    let elapsed = last.at - first.at;
    (elapsed > 0.0).then(|| ((counter(last) - counter(first)) / elapsed).max(0.0))
}

fn sample(value: Option<f64>) -> Observation {
    Observation::Samples(value.into_iter().collect())
}

fn timestamp(seconds: f64) -> Timestamp {
    Timestamp::from_millisecond((seconds * 1000.0) as i64).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// Runs the experiment, with or without the event-class breaker.
pub fn simulate(experiment: &ExperimentModel, breaker: bool) -> ExperimentRun {
    let model = &experiment.model;
    let mut world = World::new(experiment, breaker);
    let mut scrapes: VecDeque<Scrape> = VecDeque::new();
    let mut memory = ScalingMemory::default();
    let mut timeline = Vec::new();
    let (mut next_scrape, mut next_poll) = (0.0, 0.0);
    let mut replica_seconds = 0.0;
    let mut peak_replicas = world.replicas();
    let mut healthy_breach_seconds = 0.0;
    let keep = model.rate_window.max(experiment.ratio_window) * 2.0;
    let deadline = model.budget.deadline_seconds;

    while world.now < model.duration {
        if world.now >= next_scrape {
            let scrape = world.scrape();
            scrapes.push_back(scrape);
            while scrapes.front().is_some_and(|s| world.now - s.at > keep) {
                scrapes.pop_front();
            }
            let (_, all) = world.oldest_created();
            let healthy_oldest = experiment
                .classes
                .iter()
                .zip(&all)
                .filter(|(class, _)| !class.fails())
                .filter_map(|(_, created)| *created)
                .fold(f64::INFINITY, f64::min);
            if world.now - healthy_oldest > deadline {
                healthy_breach_seconds += model.scrape_interval;
            }
            next_scrape += model.scrape_interval;
        }
        if world.now >= next_poll {
            let now = timestamp(world.now);
            if world.breaker {
                poll_breaker(&mut world, &scrapes, now);
            }
            let decision = poll_scaling(&world, &scrapes, &memory, now);
            memory = decision.memory.clone();
            if decision.desired != world.replicas() {
                world.scale_to(decision.desired);
            }
            timeline.push(ExperimentRow {
                t: world.now,
                replicas: world.replicas(),
                backlog: world.pending.iter().sum(),
                states: world.states.clone(),
                phase: format!("{:?}", decision.phase),
            });
            next_poll += model.budget.poll_interval_seconds;
        }
        world.step();
        replica_seconds += f64::from(world.replicas()) * model.step;
        peak_replicas = peak_replicas.max(world.replicas());
    }
    summarize(
        world,
        replica_seconds,
        peak_replicas,
        healthy_breach_seconds,
        timeline,
    )
}

fn poll_breaker(world: &mut World<'_>, scrapes: &VecDeque<Scrape>, now: Timestamp) {
    let window = world.experiment.ratio_window;
    for (index, class) in world.experiment.classes.iter().enumerate() {
        let executed = rate(scrapes, window, |s| s.executions[index] as f64);
        let failed = rate(scrapes, window, |s| s.failures[index] as f64);
        // failed / executed as PromQL computes it: 0/0 is NaN.
        let ratio = executed.zip(failed).map(|(e, f)| f / e);
        let reading = read(
            &class.breaker,
            &class.name,
            world.states[index],
            &sample(ratio),
            &sample(executed),
        );
        let stepped = step(
            &class.breaker,
            world.memories[index].as_ref(),
            &reading,
            now,
        );
        if let Some(transition) = &stepped.transition {
            let t = world.now;
            let summary = &mut world.classes[index];
            summary
                .transitions
                .push((t, transition.from, transition.to));
            if transition.to == ClassState::Paused && summary.paused_after_seconds.is_none() {
                let start = class.spells.first().map_or(0.0, |s| s.from);
                summary.paused_after_seconds = Some(t - start);
            }
            world.states[index] = transition.to;
            if transition.to == ClassState::Active {
                world.release_held(index);
            }
        }
        world.memories[index] = Some(stepped.memory);
    }
}

fn poll_scaling(
    world: &World<'_>,
    scrapes: &VecDeque<Scrape>,
    memory: &ScalingMemory,
    now: Timestamp,
) -> backlog_core::scaling::ScalingDecision {
    let model = &world.experiment.model;
    let latest = scrapes.back();
    let held = |index: usize| holds_backlog(world.states[index]);
    let inputs = ScalingInputs {
        backlog: sample(latest.map(|s| s.pending.iter().sum::<u64>() as f64)),
        oldest_age: Some(sample(latest.map(|s| {
            s.oldest_age
                .iter()
                .enumerate()
                .filter(|(index, _)| !held(*index))
                .map(|(_, age)| *age)
                .fold(0.0, f64::max)
        }))),
        produce_rate: Some(sample(rate(scrapes, model.rate_window, |s| {
            s.produced as f64
        }))),
        completion_rate: Some(sample(rate(scrapes, model.rate_window, |s| {
            s.finished as f64
        }))),
        retry_rate: None,
        quarantine_rate: None,
        partitions: None,
        paused_class_backlogs: world
            .experiment
            .classes
            .iter()
            .enumerate()
            .filter(|(index, _)| held(*index))
            .map(|(index, class)| {
                (
                    class.name.clone(),
                    sample(latest.map(|s| s.pending[index] as f64)),
                )
            })
            .collect(),
        current_replicas: world.replicas(),
        ready_replicas: latest.map(|s| s.ready_replicas),
        conflict: None,
        partition_backlogs: None,
    };
    decide(&model.budget, &inputs, memory, now)
}

fn summarize(
    mut world: World<'_>,
    replica_seconds: f64,
    peak_replicas: u32,
    healthy_breach_seconds: f64,
    timeline: Vec<ExperimentRow>,
) -> ExperimentRun {
    let experiment = world.experiment;
    let healthy = std::mem::take(&mut world.healthy);
    let mut healthy_quarantined = 0;
    for (index, class) in experiment.classes.iter().enumerate() {
        let summary = &mut world.classes[index];
        summary.pending_at_end = world.pending[index];
        summary.latency_p95_seconds = world.latencies[index].quantile(0.95);
        summary.latency_p99_seconds = world.latencies[index].quantile(0.99);
        if !class.fails() {
            healthy_quarantined += summary.quarantined();
        }
    }
    let duration = experiment.model.duration.max(f64::EPSILON);
    ExperimentRun {
        summary: ExperimentSummary {
            scenario: experiment.model.name.clone(),
            breaker: world.breaker,
            max_attempts: experiment.policy.max_attempts(),
            deadline_seconds: experiment.model.budget.deadline_seconds,
            healthy_completed: healthy.total() as u64,
            healthy_p50_seconds: healthy.quantile(0.5),
            healthy_p95_seconds: healthy.quantile(0.95),
            healthy_p99_seconds: healthy.quantile(0.99),
            healthy_late: world.healthy_late,
            healthy_quarantined,
            healthy_breach_seconds,
            replica_seconds,
            mean_replicas: replica_seconds / duration,
            peak_replicas,
            executions: world.classes.iter().map(|c| c.executions).sum(),
            classes: world.classes,
        },
        timeline,
    }
}
