//! Simulator scenarios: a workload model (partitions, production, consumer speed, pod start
//! delay, rebalance cost, scrape and rate() lag) and the budget that governs it.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use backlog_core::budget_config::{
    AlertsDefinition, BudgetConfig, BudgetDefinition, BudgetSpecError, CapacityDefinition,
    ScalingDefinition,
};
use backlog_core::duration::{DurationError, non_negative_seconds, positive_seconds};

mod partition_weights;
pub use partition_weights::PartitionWeight;

/// A scenario file.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Simulated time, e.g. 2h.
    pub duration: String,
    /// Model step; default 1s.
    #[serde(default = "default_step")]
    pub step: String,
    pub partitions: u32,
    /// Partitions that receive more (or less) than an even share of production; unlisted
    /// partitions weigh 1.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partition_weights: Vec<PartitionWeight>,
    /// Replicas at the start (default: the budget's minReplicas).
    #[serde(default)]
    pub initial_replicas: Option<u32>,
    /// Events per second over time.
    pub production: Vec<ProductionSegment>,
    /// Noise on production: real arrivals are never the flat segments written above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub production_noise: Option<ProductionNoise>,
    pub consumer: ConsumerModel,
    /// How long a new pod takes to start consuming; default 20s.
    #[serde(default = "default_pod_start_delay")]
    pub pod_start_delay: String,
    /// How long consumption stops on every membership change; default 10s.
    #[serde(default = "default_rebalance_pause")]
    pub rebalance_pause: String,
    /// Prometheus scrape interval; default 15s.
    #[serde(default = "default_scrape_interval")]
    pub scrape_interval: String,
    /// rate() window for the produce and completion rates; default 1m.
    #[serde(default = "default_rate_window")]
    pub rate_window: String,
    /// The BacklogBudget governing the consumer (only the fields that matter offline).
    pub budget: SimBudget,
    /// KEDA lagThreshold for the lag-threshold policy; default perReplicaRate × targetDrainTime.
    #[serde(default)]
    pub lag_threshold: Option<f64>,
}

fn default_step() -> String {
    "1s".into()
}
fn default_pod_start_delay() -> String {
    "20s".into()
}
fn default_rebalance_pause() -> String {
    "10s".into()
}
fn default_scrape_interval() -> String {
    "15s".into()
}
fn default_rate_window() -> String {
    "1m".into()
}

/// Production from `from` on: `rate` events/s, ramping linearly to `rampTo` by the next
/// segment's start when given.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProductionSegment {
    pub from: String,
    pub rate: f64,
    #[serde(default)]
    pub ramp_to: Option<f64>,
}

/// Production multiplied, over each `every`-long slot, by a factor drawn evenly from
/// `1 ± share`; the draws come from `seed` and the slot's number, so a scenario runs the same
/// on every machine and under every policy.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProductionNoise {
    pub share: f64,
    #[serde(default = "default_noise_every")]
    pub every: String,
    #[serde(default)]
    pub seed: u64,
}

fn default_noise_every() -> String {
    "15s".into()
}

/// [`ProductionNoise`] in model units.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Noise {
    pub share: f64,
    pub every: f64,
    pub seed: u64,
}

impl Noise {
    /// The factor production is multiplied by at time `t`.
    pub fn factor(&self, t: f64) -> f64 {
        let slot = (t / self.every).floor().max(0.0) as u64;
        1.0 + self.share * (2.0 * unit_draw(self.seed, slot) - 1.0)
    }
}

/// A number in [0, 1) from a seed and an index (splitmix64): the same on every machine.
fn unit_draw(seed: u64, index: u64) -> f64 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(index.wrapping_add(1).wrapping_mul(0xBF58_476D_1CE4_E5B9));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The consumer's true speed (what the policies can only observe through metrics).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConsumerModel {
    /// Events per second one replica completes.
    pub per_replica_rate: f64,
    /// Periods when every replica is slower (e.g. a slow downstream).
    #[serde(default)]
    pub slowdowns: Vec<Slowdown>,
}

/// Every replica runs at `factor` × its rate between `from` and `to`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Slowdown {
    pub from: String,
    pub to: String,
    pub factor: f64,
}

/// The budget fields the decision uses; the rest of a BacklogBudget (target, queries) does
/// not exist offline.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SimBudget {
    pub min_replicas: i32,
    pub max_replicas: i32,
    pub completion_deadline: String,
    #[serde(default = "backlog_core::budget_config::default_poll_interval")]
    pub poll_interval: String,
    #[serde(default)]
    pub capacity: Option<CapacityDefinition>,
    #[serde(default)]
    pub scaling: ScalingDefinition,
    #[serde(default)]
    pub alerts: AlertsDefinition,
}

/// A scenario that cannot be run.
#[derive(Debug, Error)]
pub enum ScenarioError {
    #[error("cannot read scenario {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("scenario {path} is not valid YAML for a scenario: {source}")]
    Parse {
        path: String,
        source: serde_yaml::Error,
    },
    #[error("scenario field {0}")]
    Duration(#[from] DurationError),
    #[error("scenario budget: {0}")]
    Budget(#[from] BudgetSpecError),
    #[error("scenario field {field}: {problem}")]
    Invalid {
        field: &'static str,
        problem: String,
    },
}

/// A scenario with every duration in seconds, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    pub name: String,
    pub duration: f64,
    pub step: f64,
    pub partitions: u32,
    /// Each partition's share of production (index = partition number), summing to 1.
    pub partition_shares: Vec<f64>,
    pub initial_replicas: u32,
    pub production: Vec<(f64, f64, Option<f64>)>,
    pub noise: Option<Noise>,
    pub per_replica_rate: f64,
    pub slowdowns: Vec<(f64, f64, f64)>,
    pub pod_start_delay: f64,
    pub rebalance_pause: f64,
    pub scrape_interval: f64,
    pub rate_window: f64,
    pub budget: BudgetConfig,
    /// The budget as the scenario wrote it, with the partitions fixed and every query present.
    pub budget_definition: BudgetDefinition,
    pub lag_threshold: f64,
}

impl SimBudget {
    /// The BacklogBudget this stands for: a fixed partition count and every query present
    /// (the simulator measures everything), its rates read through `rate(…[rate_window])`.
    pub fn to_definition(&self, partitions: u32, rate_window_seconds: f64) -> BudgetDefinition {
        BudgetDefinition {
            min_replicas: self.min_replicas,
            max_replicas: self.max_replicas,
            completion_deadline: self.completion_deadline.clone(),
            poll_interval: self.poll_interval.clone(),
            partition_count: Some(i32::try_from(partitions).unwrap_or(i32::MAX)),
            partitions_queried: false,
            oldest_age_queried: true,
            produce_rate_queried: true,
            completion_rate_queried: true,
            rate_window: None,
            rate_queries_range_seconds: Some(rate_window_seconds),
            capacity: self.capacity.clone(),
            scaling: self.scaling.clone(),
            alerts: self.alerts.clone(),
        }
    }
}

impl Scenario {
    pub fn load(path: &std::path::Path) -> Result<Self, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.display().to_string(),
            source,
        })?;
        serde_yaml::from_str(&text).map_err(|source| ScenarioError::Parse {
            path: path.display().to_string(),
            source,
        })
    }

    /// Checks the scenario and converts it into model units (seconds).
    pub fn model(&self) -> Result<Model, ScenarioError> {
        let invalid = |field, problem: &str| ScenarioError::Invalid {
            field,
            problem: problem.to_owned(),
        };
        if self.partitions == 0 {
            return Err(invalid("partitions", "must be at least 1"));
        }
        if !(self.consumer.per_replica_rate.is_finite() && self.consumer.per_replica_rate > 0.0) {
            return Err(invalid("consumer.perReplicaRate", "must be greater than 0"));
        }
        if self.production.is_empty() {
            return Err(invalid("production", "needs at least one segment"));
        }
        let partition_shares =
            partition_weights::partition_shares(self.partitions, &self.partition_weights)?;
        let mut production = Vec::new();
        for segment in &self.production {
            let from = non_negative_seconds("production[].from", &segment.from)?;
            let rates = [Some(segment.rate), segment.ramp_to];
            if rates.iter().flatten().any(|r| !r.is_finite() || *r < 0.0) {
                return Err(invalid(
                    "production[].rate",
                    "must be a non-negative number",
                ));
            }
            production.push((from, segment.rate, segment.ramp_to));
        }
        if production.windows(2).any(|w| w[1].0 <= w[0].0) || production[0].0 != 0.0 {
            return Err(invalid(
                "production",
                "segments must start at 0s and be in increasing order of from",
            ));
        }
        let noise = match &self.production_noise {
            None => None,
            Some(noise) => {
                if !(noise.share.is_finite() && (0.0..=1.0).contains(&noise.share)) {
                    return Err(invalid(
                        "productionNoise.share",
                        "must be between 0 and 1 (0.2 is ±20 %)",
                    ));
                }
                Some(Noise {
                    share: noise.share,
                    every: positive_seconds("productionNoise.every", &noise.every)?,
                    seed: noise.seed,
                })
            }
        };
        let mut slowdowns = Vec::new();
        for slowdown in &self.consumer.slowdowns {
            let from = non_negative_seconds("consumer.slowdowns[].from", &slowdown.from)?;
            let to = positive_seconds("consumer.slowdowns[].to", &slowdown.to)?;
            if !(slowdown.factor.is_finite() && slowdown.factor >= 0.0) || to <= from {
                return Err(invalid(
                    "consumer.slowdowns[]",
                    "needs from < to and a factor >= 0",
                ));
            }
            slowdowns.push((from, to, slowdown.factor));
        }
        let rate_window = positive_seconds("rateWindow", &self.rate_window)?;
        let budget_definition = self.budget.to_definition(self.partitions, rate_window);
        let budget = BudgetConfig::from_spec(&budget_definition)?;
        let step = positive_seconds("step", &self.step)?;
        let initial_replicas = self.initial_replicas.unwrap_or(budget.min_replicas);
        let lag_threshold = match self.lag_threshold {
            Some(threshold) if threshold.is_finite() && threshold > 0.0 => threshold,
            Some(_) => return Err(invalid("lagThreshold", "must be greater than 0")),
            None => {
                budget
                    .per_replica_rate
                    .unwrap_or(self.consumer.per_replica_rate)
                    * budget.target_drain_seconds
            }
        };
        Ok(Model {
            name: self.name.clone(),
            duration: positive_seconds("duration", &self.duration)?,
            step,
            partitions: self.partitions,
            partition_shares,
            initial_replicas,
            production,
            noise,
            per_replica_rate: self.consumer.per_replica_rate,
            slowdowns,
            pod_start_delay: non_negative_seconds("podStartDelay", &self.pod_start_delay)?,
            rebalance_pause: non_negative_seconds("rebalancePause", &self.rebalance_pause)?,
            scrape_interval: positive_seconds("scrapeInterval", &self.scrape_interval)?,
            rate_window,
            budget,
            budget_definition,
            lag_threshold,
        })
    }
}

impl Model {
    /// Events produced per second at time `t`.
    pub fn production_rate(&self, t: f64) -> f64 {
        let base = self.segment_rate(t);
        self.noise.map_or(base, |noise| base * noise.factor(t))
    }

    /// Events per second the segments give at time `t`, before any noise.
    pub fn segment_rate(&self, t: f64) -> f64 {
        let index = self
            .production
            .iter()
            .rposition(|(from, _, _)| *from <= t)
            .unwrap_or(0);
        let (from, rate, ramp_to) = self.production[index];
        match ramp_to {
            None => rate,
            Some(target) => {
                let end = self
                    .production
                    .get(index + 1)
                    .map_or(self.duration, |next| next.0);
                let span = (end - from).max(f64::EPSILON);
                rate + (target - rate) * ((t - from) / span).clamp(0.0, 1.0)
            }
        }
    }

    /// Events per second one replica completes at time `t`.
    pub fn replica_rate(&self, t: f64) -> f64 {
        self.slowdowns
            .iter()
            .filter(|(from, to, _)| *from <= t && t < *to)
            .fold(self.per_replica_rate, |rate, (_, _, factor)| rate * factor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noisy(noise: &str) -> Result<Model, ScenarioError> {
        let yaml = format!(
            "name: noisy\nduration: 1h\npartitions: 4\nproduction:\n  - {{from: 0s, rate: 1000}}\n\
             productionNoise: {noise}\nconsumer: {{perReplicaRate: 500}}\n\
             budget: {{minReplicas: 1, maxReplicas: 4, completionDeadline: 10m}}\n"
        );
        serde_yaml::from_str::<Scenario>(&yaml)
            .map_err(|source| ScenarioError::Parse {
                path: "noisy".into(),
                source,
            })?
            .model()
    }

    #[test]
    fn noise_moves_production_within_its_share_the_same_on_every_run() {
        let model = noisy("{share: 0.2, every: 15s, seed: 7}").unwrap();
        let rates: Vec<f64> = (0..240)
            .map(|slot| model.production_rate(15.0 * f64::from(slot)))
            .collect();
        assert!(
            rates.iter().all(|rate| (800.0..=1200.0).contains(rate)),
            "{rates:?}"
        );
        // One factor per slot, and slots differ.
        assert_eq!(model.production_rate(15.0), model.production_rate(29.9));
        assert!(rates.windows(2).any(|pair| pair[0] != pair[1]));
        let mean = rates.iter().sum::<f64>() / rates.len() as f64;
        assert!((mean - 1000.0).abs() < 40.0, "{mean}");
        assert_eq!(rates, {
            let again = noisy("{share: 0.2, every: 15s, seed: 7}").unwrap();
            (0..240)
                .map(|slot| again.production_rate(15.0 * f64::from(slot)))
                .collect::<Vec<_>>()
        });
        // Another seed, other draws; the segments themselves are untouched.
        let other = noisy("{share: 0.2, every: 15s, seed: 8}").unwrap();
        assert_ne!(other.production_rate(0.0), model.production_rate(0.0));
        assert_eq!(model.segment_rate(100.0), 1000.0);
    }

    #[test]
    fn noise_beyond_the_rate_itself_is_refused() {
        for share in ["1.5", "-0.1", ".nan"] {
            let error = noisy(&format!("{{share: {share}}}"))
                .unwrap_err()
                .to_string();
            assert!(error.contains("productionNoise.share"), "{error}");
        }
    }
}
