//! Scaling policies the simulator compares: ours (`budget`), KEDA's Kafka lag-threshold
//! behaviour under an HPA (`lag-threshold`), always-the-cap (`max`), and the reference a
//! budget must beat, the cheapest constant count that keeps the deadline (`static`), and the
//! hindsight-optimal schedule no policy can beat (`oracle`).

use std::collections::VecDeque;

use jiff::Timestamp;

use super::scenario::Model;
use super::scrapes::ScrapeHistory;
use backlog_core::metric_input::Observation;
use backlog_core::partition_skew::PartitionSample;
use backlog_core::scaling::{ScalingInputs, ScalingMemory, decide};

/// Which policy to simulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    Budget,
    LagThreshold,
    Max,
    /// The smallest constant replica count (at least minReplicas) with zero breach, found by
    /// search over whole runs; the cap when none has zero breach.
    Static,
    /// The cheapest schedule with zero breach, planned knowing the whole workload in advance
    /// and verified by a run; the static count when no plan verifies.
    Oracle,
}

impl PolicyKind {
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Budget => "budget",
            PolicyKind::LagThreshold => "lag-threshold",
            PolicyKind::Max => "max",
            PolicyKind::Static => "static",
            PolicyKind::Oracle => "oracle",
        }
    }
}

/// What a policy sees at a decision.
pub struct View<'a> {
    pub now: f64,
    pub scrapes: &'a ScrapeHistory,
    /// The true backlog right now: KEDA's Kafka scaler reads lag from the brokers directly,
    /// without Prometheus' scrape delay, so the baseline gets the fresher number.
    pub live_backlog: f64,
    pub replicas: u32,
}

/// One decision.
pub struct Outcome {
    pub replicas: u32,
    /// Phase or state label for the timeline.
    pub label: String,
    /// The drain time the policy predicts (what the budget writes to status), if it has one.
    pub predicted_drain_seconds: Option<f64>,
    /// Why, in the policy's words (the budget's explanation), where the label does not say.
    pub explanation: Option<String>,
}

pub trait Policy {
    /// Seconds between decisions.
    fn interval(&self) -> f64;
    fn decide(&mut self, view: &View<'_>) -> Outcome;
}

/// The policy of `kind`. Static and the oracle are schedules chosen before the run (see
/// `run::simulate`); built here they hold the model's starting count, which is how the static
/// search probes one count.
pub fn build(kind: PolicyKind, model: &Model) -> Box<dyn Policy + '_> {
    match kind {
        PolicyKind::Budget => Box::new(BudgetPolicy {
            model,
            memory: ScalingMemory::default(),
        }),
        PolicyKind::LagThreshold => Box::new(LagThresholdPolicy::new(model, model.lag_threshold)),
        PolicyKind::Max => Box::new(MaxPolicy { model }),
        PolicyKind::Static | PolicyKind::Oracle => Box::new(ConstantPolicy {
            model,
            replicas: model.initial_replicas,
        }),
    }
}

/// The same count at every decision (the run starts with it ready).
struct ConstantPolicy<'m> {
    model: &'m Model,
    replicas: u32,
}

impl Policy for ConstantPolicy<'_> {
    fn interval(&self) -> f64 {
        self.model.budget.poll_interval_seconds
    }

    fn decide(&mut self, _: &View<'_>) -> Outcome {
        Outcome {
            replicas: self.replicas,
            label: format!("Static {}", self.replicas),
            predicted_drain_seconds: None,
            explanation: None,
        }
    }
}

/// The operator's own decision, fed the way the controller feeds it.
struct BudgetPolicy<'m> {
    model: &'m Model,
    memory: ScalingMemory,
}

fn sample(value: Option<f64>) -> Observation {
    Observation::Samples(value.into_iter().collect())
}

impl Policy for BudgetPolicy<'_> {
    fn interval(&self) -> f64 {
        self.model.budget.poll_interval_seconds
    }

    fn decide(&mut self, view: &View<'_>) -> Outcome {
        let latest = view.scrapes.latest();
        let inputs = ScalingInputs {
            backlog: sample(latest.map(|s| s.backlog)),
            oldest_age: Some(sample(latest.map(|s| s.oldest_age))),
            produce_rate: Some(sample(view.scrapes.rate(|s| s.produced_total))),
            completion_rate: Some(sample(view.scrapes.rate(|s| s.completed_total))),
            retry_rate: None,
            quarantine_rate: None,
            partitions: None,
            paused_class_backlogs: vec![],
            current_replicas: view.replicas,
            ready_replicas: latest.map(|s| s.ready_replicas),
            conflict: None,
            // The simulator measures everything, metrics.partitionBacklog included.
            partition_backlogs: latest.map(|s| PartitionSample::numbered(&s.partition_backlogs)),
        };
        let now = Timestamp::from_millisecond((view.now * 1000.0) as i64)
            .unwrap_or(Timestamp::UNIX_EPOCH);
        let decision = decide(&self.model.budget, &inputs, &self.memory, now);
        self.memory = decision.memory;
        Outcome {
            replicas: decision.desired,
            label: format!("{:?}", decision.phase),
            predicted_drain_seconds: decision.drain_time_seconds,
            explanation: Some(decision.explanation),
        }
    }
}

/// KEDA's Apache Kafka scaler under the HPA's default behaviour: desired =
/// ceil(total lag / lagThreshold), the lag clipped at partitions × lagThreshold (no idle
/// consumers), a 10 % tolerance, scale-up by at most max(100 %, 4 pods) per 15 s sync, and
/// scale-down to the highest recommendation of the last 300 s.
struct LagThresholdPolicy<'m> {
    model: &'m Model,
    threshold: f64,
    recommendations: VecDeque<(f64, u32)>,
}

const HPA_SYNC_SECONDS: f64 = 15.0;
const HPA_TOLERANCE: f64 = 0.1;
const HPA_SCALE_DOWN_STABILIZATION_SECONDS: f64 = 300.0;

impl<'m> LagThresholdPolicy<'m> {
    fn new(model: &'m Model, threshold: f64) -> Self {
        Self {
            model,
            threshold,
            recommendations: VecDeque::new(),
        }
    }
}

impl Policy for LagThresholdPolicy<'_> {
    fn interval(&self) -> f64 {
        HPA_SYNC_SECONDS
    }

    fn decide(&mut self, view: &View<'_>) -> Outcome {
        let budget = &self.model.budget;
        let current = view.replicas.max(1);
        let lag = view
            .live_backlog
            .min(f64::from(self.model.partitions) * self.threshold);
        let ratio = lag / (self.threshold * f64::from(current));
        let raw = if (ratio - 1.0).abs() <= HPA_TOLERANCE {
            current
        } else {
            (lag / self.threshold).ceil() as u32
        };
        let recommendation = raw.clamp(budget.min_replicas, budget.max_replicas);
        self.recommendations.push_back((view.now, recommendation));
        while self
            .recommendations
            .front()
            .is_some_and(|(at, _)| view.now - at > HPA_SCALE_DOWN_STABILIZATION_SECONDS)
        {
            self.recommendations.pop_front();
        }
        let replicas = if recommendation > current {
            recommendation.min((current * 2).max(current + 4))
        } else {
            let stabilized = self
                .recommendations
                .iter()
                .map(|(_, r)| *r)
                .max()
                .unwrap_or(recommendation);
            stabilized.min(current)
        };
        Outcome {
            replicas,
            label: format!("lag {:.0} / {:.0}", lag, self.threshold),
            predicted_drain_seconds: None,
            explanation: None,
        }
    }
}

/// Always the cap: the best breach time any policy can reach, at the highest cost.
struct MaxPolicy<'m> {
    model: &'m Model,
}

impl Policy for MaxPolicy<'_> {
    fn interval(&self) -> f64 {
        self.model.budget.poll_interval_seconds
    }

    fn decide(&mut self, _: &View<'_>) -> Outcome {
        Outcome {
            replicas: self.model.budget.max_replicas.min(self.model.partitions),
            label: "Max".to_owned(),
            predicted_drain_seconds: None,
            explanation: None,
        }
    }
}
