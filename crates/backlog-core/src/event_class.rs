//! An event class as written, before validation: the shape of a BacklogBudget's
//! `eventClasses[]` entry without the API server's schema rules, shared by the API types and
//! the simulator's scenarios.

use serde::{Deserialize, Serialize};

/// Who decides a class's state.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ClassMode {
    #[default]
    Auto,
    Paused,
    Active,
}

/// Per-class breaker state.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClassState {
    Active,
    Paused,
    Probing,
}

/// The fields of an event class the breaker reads (its queries stay with the API type).
#[derive(Clone, Debug, PartialEq)]
pub struct ClassDefinition {
    /// Class name as consumers report it.
    pub name: String,
    /// Fewest executions per second before the breaker decides anything.
    pub min_rate: f64,
    /// Auto lets the breaker decide; Paused and Active are manual overrides.
    pub mode: ClassMode,
    /// When the breaker opens and how it probes.
    pub pause_policy: PauseDefinition,
}

/// Class breaker parameters as a spec writes them (durations in Go syntax), with the same JSON
/// shape and defaults as `pausePolicy`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PauseDefinition {
    /// Persistent-failure ratio at or above which the class counts as failing; default 0.5.
    #[serde(default = "default_threshold")]
    pub threshold: f64,
    /// How long the ratio must stay at or above the threshold; default 2m.
    #[serde(default = "default_for", rename = "for")]
    pub for_: String,
    /// How long a paused class stays paused before probing; default 5m.
    #[serde(default = "default_open_duration")]
    pub open_duration: String,
    /// Longest pause after repeated failed probes; default 1h.
    #[serde(default = "default_max_open_duration")]
    pub max_open_duration: String,
    /// Share of the class's events consumers process while probing; default 0.1.
    #[serde(default = "default_probe_ratio")]
    pub probe_ratio: f64,
}

impl Default for PauseDefinition {
    fn default() -> Self {
        Self {
            threshold: default_threshold(),
            for_: default_for(),
            open_duration: default_open_duration(),
            max_open_duration: default_max_open_duration(),
            probe_ratio: default_probe_ratio(),
        }
    }
}

fn default_threshold() -> f64 {
    0.5
}
fn default_for() -> String {
    "2m".to_owned()
}
fn default_open_duration() -> String {
    "5m".to_owned()
}
fn default_max_open_duration() -> String {
    "1h".to_owned()
}
fn default_probe_ratio() -> f64 {
    0.1
}
