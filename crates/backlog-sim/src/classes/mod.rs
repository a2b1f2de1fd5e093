//! Seed 000's second recovery experiment: one event class fails persistently while the others
//! stay healthy. Each failing execution goes through the consumer library's retry planner (the
//! RetryPolicy's classification, jittered backoff, `maxAttempts`, retry budget) and ends
//! quarantined; the run is compared with and without the event-class breaker.
//!
//! The experiment is an opt-in part of a scenario: a scenario file (see
//! `examples/scenarios/classes/`) with an `eventClasses` section next to the usual workload
//! and budget. The usual simulator is fluid (fractions of events); this one follows every
//! event and every execution, because attempts per event are what it measures.
//!
//! What the model assumes (each the simplest choice that keeps the comparison fair):
//! - Every execution, first or retry, failing or not, costs one unit of a replica's capacity.
//! - A class is a stream of its own on the same partitions (a topic per event type); a replica
//!   takes the oldest eligible event among its partitions: a due retry or a class's head.
//! - Consumers honor the control document at once: a Paused class's events (and its due
//!   retries) stay where they are; while Probing, events the probe function does not select
//!   are skipped and stay pending. Nothing is dropped: pending events run when the class is
//!   Active again.
//! - The retry budget is one tracker for the whole fleet (the sum of the consumers' own).
//! - Consumers export the age of the oldest event they are working on, so a class the
//!   breaker holds back is not in `oldestUnfinishedAge` (consumers know which classes are held
//!   from the control document); its backlog is counted as the operator counts it.
//! - The breaker reads `failed / executed` and `executed / s` of each class over the ratio
//!   window, from scrapes, the way the operator reads them from Prometheus.

pub mod report;
pub mod run;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::scenario::{Model, Scenario, ScenarioError};
use backlog_consumer::{EffectivePolicy, PolicyError};
use backlog_core::class_breaker::{BreakerSettings, ClassSpecError};
use backlog_core::duration::{non_negative_seconds, positive_seconds};
use backlog_core::event_class::{ClassDefinition, ClassMode, PauseDefinition};
use backlog_core::retry_policy::RetryPolicyDefinition;

/// The `eventClasses` section of a scenario.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClassExperiment {
    /// Seed of every random draw (an event's class, whether an execution fails, jitter), so a
    /// run is reproducible.
    #[serde(default)]
    pub seed: u64,
    /// The RetryPolicy the consumers run (its spec).
    pub retry_policy: RetryPolicyDefinition,
    /// Range of the failure-ratio and execution-rate queries; default 1m.
    #[serde(default = "default_ratio_window")]
    pub ratio_window: String,
    pub classes: Vec<SimClass>,
}

fn default_ratio_window() -> String {
    "1m".into()
}

/// One event class.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SimClass {
    pub name: String,
    /// Share of produced events in this class (shares are normalized to sum to 1).
    pub share: f64,
    /// The fault under study: when and how its executions fail. A class with failures is
    /// the failing class of the report; the others are the healthy ones.
    #[serde(default)]
    pub failures: Vec<FailureSpell>,
    /// Background failures that are part of normal operation (a class with only these is
    /// healthy), e.g. 2 % of executions hitting a busy dependency.
    #[serde(default)]
    pub transient_errors: Option<Noise>,
    /// As in a BacklogBudget's eventClasses[].
    #[serde(default = "default_min_rate")]
    pub min_rate: f64,
    #[serde(default)]
    pub pause_policy: PauseDefinition,
}

fn default_min_rate() -> f64 {
    1.0
}

/// From `from` until `to` (or the end), each execution fails with `probability`, reporting
/// `errorCode`, which the RetryPolicy classifies.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FailureSpell {
    pub from: String,
    #[serde(default)]
    pub to: Option<String>,
    pub probability: f64,
    pub error_code: String,
}

/// Failures present all the time at a low rate.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Noise {
    pub probability: f64,
    pub error_code: String,
}

/// A class scenario that cannot be run.
#[derive(Debug, Error)]
pub enum ClassScenarioError {
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    #[error("scenario {path} has no eventClasses section: it is not a class experiment")]
    NotAClassScenario { path: String },
    #[error("scenario {path}: eventClasses is not valid: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("scenario eventClasses.retryPolicy: {0}")]
    Policy(#[from] PolicyError),
    #[error("scenario eventClasses: {0}")]
    Class(#[from] ClassSpecError),
    #[error("scenario field eventClasses.{field}: {problem}")]
    Invalid { field: String, problem: String },
}

/// A checked failure spell, in seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Spell {
    pub from: f64,
    pub to: f64,
    pub probability: f64,
    pub error_code: String,
}

/// A checked class.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassModel {
    pub name: String,
    /// Normalized share of production.
    pub share: f64,
    pub spells: Vec<Spell>,
    pub noise: Option<Spell>,
    pub breaker: BreakerSettings,
}

impl ClassModel {
    /// The failure in force at `t`, if any: a spell of the fault, or else the background.
    pub fn spell_at(&self, t: f64) -> Option<&Spell> {
        self.spells
            .iter()
            .find(|s| s.from <= t && t < s.to)
            .or(self.noise.as_ref())
    }

    /// Whether the class ever fails.
    pub fn fails(&self) -> bool {
        !self.spells.is_empty()
    }
}

/// A scenario with classes, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct ExperimentModel {
    pub model: Model,
    pub seed: u64,
    pub policy: EffectivePolicy,
    pub ratio_window: f64,
    pub classes: Vec<ClassModel>,
}

/// Reads a class scenario: the usual scenario fields plus `eventClasses`.
pub fn load(path: &std::path::Path) -> Result<ExperimentModel, ClassScenarioError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
        path: shown.clone(),
        source,
    })?;
    parse(&shown, &text)
}

/// Parses a class scenario; `path` only names it in errors.
pub fn parse(path: &str, text: &str) -> Result<ExperimentModel, ClassScenarioError> {
    let parse_error = |source| ScenarioError::Parse {
        path: path.to_owned(),
        source,
    };
    let mut value: serde_yaml::Value = serde_yaml::from_str(text).map_err(parse_error)?;
    // The scenario types refuse unknown fields, so the section is taken out before they read
    // the rest: the fluid simulator's files and types stay exactly as they are.
    let section = value
        .as_mapping_mut()
        .and_then(|mapping| mapping.remove("eventClasses"))
        .ok_or_else(|| ClassScenarioError::NotAClassScenario {
            path: path.to_owned(),
        })?;
    let scenario: Scenario = serde_yaml::from_value(value).map_err(parse_error)?;
    let experiment: ClassExperiment =
        serde_yaml::from_value(section).map_err(|source| ClassScenarioError::Parse {
            path: path.to_owned(),
            source,
        })?;
    experiment.model(scenario.model()?)
}

fn invalid(field: impl Into<String>, problem: &str) -> ClassScenarioError {
    ClassScenarioError::Invalid {
        field: field.into(),
        problem: problem.to_owned(),
    }
}

impl ClassExperiment {
    /// Checks the section against the scenario's workload.
    pub fn model(&self, model: Model) -> Result<ExperimentModel, ClassScenarioError> {
        if self.classes.is_empty() {
            return Err(invalid("classes", "needs at least one class"));
        }
        let total: f64 = self.classes.iter().map(|c| c.share).sum();
        if self
            .classes
            .iter()
            .any(|c| !(c.share.is_finite() && c.share >= 0.0))
            || total.is_nan()
            || total <= 0.0
        {
            return Err(invalid(
                "classes[].share",
                "shares must be non-negative numbers with a positive sum",
            ));
        }
        let mut classes = Vec::with_capacity(self.classes.len());
        for class in &self.classes {
            let field = |name: &str| format!("classes[{}].{name}", class.name);
            let mut spells = Vec::new();
            for spell in &class.failures {
                let from = non_negative_seconds(&field("failures[].from"), &spell.from)
                    .map_err(ScenarioError::from)?;
                let to = match &spell.to {
                    Some(to) => positive_seconds(&field("failures[].to"), to)
                        .map_err(ScenarioError::from)?,
                    None => f64::INFINITY,
                };
                if to <= from || !(0.0..=1.0).contains(&spell.probability) {
                    return Err(invalid(
                        field("failures[]"),
                        "needs from < to and a probability in [0, 1]",
                    ));
                }
                spells.push(Spell {
                    from,
                    to,
                    probability: spell.probability,
                    error_code: spell.error_code.clone(),
                });
            }
            let noise = match &class.transient_errors {
                Some(noise) if (0.0..=1.0).contains(&noise.probability) => Some(Spell {
                    from: 0.0,
                    to: f64::INFINITY,
                    probability: noise.probability,
                    error_code: noise.error_code.clone(),
                }),
                Some(_) => {
                    return Err(invalid(
                        field("transientErrors.probability"),
                        "must be in [0, 1]",
                    ));
                }
                None => None,
            };
            let breaker = BreakerSettings::from_spec(&ClassDefinition {
                name: class.name.clone(),
                min_rate: class.min_rate,
                mode: ClassMode::Auto,
                pause_policy: class.pause_policy.clone(),
            })?;
            classes.push(ClassModel {
                name: class.name.clone(),
                share: class.share / total,
                spells,
                noise,
                breaker,
            });
        }
        let ratio_window = positive_seconds("eventClasses.ratioWindow", &self.ratio_window)
            .map_err(ScenarioError::from)?;
        Ok(ExperimentModel {
            model,
            seed: self.seed,
            policy: EffectivePolicy::from_spec(&self.retry_policy)?,
            ratio_window,
            classes,
        })
    }
}
