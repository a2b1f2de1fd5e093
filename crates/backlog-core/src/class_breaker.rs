//! The event-class breaker: whether consumers process a class's events (Active), none of them
//! (Paused) or a deterministic sample of them (Probing).
//!
//! A class that keeps failing persistently would otherwise take capacity, connections and
//! downstream quota from the healthy classes (seed 000, section 1) and flood the quarantine.
//! This is a circuit breaker in the sense of seed 002 (section 3.4) — a window (the failure
//! ratio query's range), a minimum request rate, a failure threshold, an open duration and
//! half-open probes — applied per event class rather than per downstream:
//!
//! ```text
//!            ratio ≥ threshold for `for`             openDuration elapsed
//!   Active ───────────────────────────────▶ Paused ──────────────────────▶ Probing
//!     ▲                                        ▲                             │
//!     │      probes healthy for `for`          │   probes failing: open      │
//!     └────────────────────────────────────────┼── duration doubled (≤ max) ─┘
//!                                              └─────────────────────────────┘
//! ```
//!
//! Rules, each chosen so that the breaker fails static:
//! - Missing data never changes a class's state: a failed, empty, NaN, negative, multi-series
//!   or out-of-range result holds the class where it is, including a Paused class whose open
//!   duration has elapsed (probing needs someone to watch the probes). The condition timers
//!   restart, so every decision rests on `for` of continuously observed data.
//! - Below `minRate` executions per second the ratio is no evidence: no decision, timers
//!   restart. While Probing only `probeRatio` of the class executes, so the minimum is
//!   `minRate × probeRatio` then. A Paused class executes nothing, so its ratio is typically
//!   0/0 = NaN: with a usable execution rate below the minimum the ratio is not needed, and
//!   the time-based move to Probing still happens.
//! - `mode: Paused | Active` overrides the breaker whatever the data says (GitOps-friendly);
//!   back in `Auto`, the breaker continues from the state the override left.
//! - Every transition carries the ratio that caused it (for a time-based or manual transition,
//!   the last ratio seen), a reason and a message for people.
//!
//! The state lives in `status.eventClasses` (the breaker's memory across operator restarts).
//! The API keeps timestamps in whole seconds, so timers start at the next whole second: a
//! class is never paused before its ratio held for the full `for`.
//!
//! Pure: no I/O, no clock; the controller and the simulator pass the readings and the time.

use jiff::{Timestamp, ToSpan};
use thiserror::Error;

use super::duration::{DurationError, positive_seconds};
use super::event_class::{ClassDefinition, ClassMode, ClassState};
use super::format::si;
use super::metric_input::{Observation, single_value};
use super::stabilization::seconds_between;

/// A class's breaker parameters, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct BreakerSettings {
    pub mode: ClassMode,
    /// Failure ratio at or above which the class counts as failing, in (0, 1].
    pub threshold: f64,
    /// How long the ratio must stay at or above the threshold (or, while Probing, below it).
    pub for_seconds: f64,
    /// The first pause.
    pub open_seconds: f64,
    /// The longest pause after repeated failed probes.
    pub max_open_seconds: f64,
    /// Share of the class processed while Probing, in (0, 1].
    pub probe_ratio: f64,
    /// Fewest executions per second before any data-based decision.
    pub min_rate: f64,
}

/// A class whose parameters cannot drive a breaker. Messages name the field and the fix.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum ClassSpecError {
    #[error(transparent)]
    Duration(#[from] DurationError),
    #[error("spec.{field} ({value}) must be {range}")]
    OutOfRange {
        field: String,
        value: f64,
        range: &'static str,
    },
    #[error(
        "spec.eventClasses[{class}].pausePolicy.maxOpenDuration ({max}) must be at least openDuration ({open}); raise maxOpenDuration"
    )]
    MaxOpenBelowOpen {
        class: String,
        open: String,
        max: String,
    },
}

impl BreakerSettings {
    /// Checks a class of the spec (the API server refuses most of this already; this is the
    /// defense in depth for objects stored before a rule existed).
    pub fn from_spec(class: &ClassDefinition) -> Result<Self, ClassSpecError> {
        let field = |name: &str| format!("eventClasses[{}].{name}", class.name);
        let policy = &class.pause_policy;
        let threshold = policy.threshold;
        if !(threshold > 0.0 && threshold <= 1.0) {
            return Err(ClassSpecError::OutOfRange {
                field: field("pausePolicy.threshold"),
                value: threshold,
                range: "in (0, 1], such as 0.5",
            });
        }
        let probe_ratio = policy.probe_ratio;
        if !(probe_ratio > 0.0 && probe_ratio <= 1.0) {
            return Err(ClassSpecError::OutOfRange {
                field: field("pausePolicy.probeRatio"),
                value: probe_ratio,
                range: "in (0, 1], such as 0.1",
            });
        }
        if !(class.min_rate.is_finite() && class.min_rate >= 0.0) {
            return Err(ClassSpecError::OutOfRange {
                field: field("minRate"),
                value: class.min_rate,
                range: "a number of executions per second of at least 0, such as 1",
            });
        }
        let for_seconds = positive_seconds(&field("pausePolicy.for"), &policy.for_)?;
        let open_seconds =
            positive_seconds(&field("pausePolicy.openDuration"), &policy.open_duration)?;
        let max_open_seconds = positive_seconds(
            &field("pausePolicy.maxOpenDuration"),
            &policy.max_open_duration,
        )?;
        if max_open_seconds < open_seconds {
            return Err(ClassSpecError::MaxOpenBelowOpen {
                class: class.name.clone(),
                open: policy.open_duration.clone(),
                max: policy.max_open_duration.clone(),
            });
        }
        Ok(Self {
            mode: class.mode,
            threshold,
            for_seconds,
            open_seconds,
            max_open_seconds,
            probe_ratio,
            min_rate: class.min_rate,
        })
    }

    /// Executions per second needed for a data-based decision in `state`.
    pub fn minimum_rate(&self, state: ClassState) -> f64 {
        match state {
            // Only the probes execute while Probing.
            ClassState::Probing => self.min_rate * self.probe_ratio,
            ClassState::Active | ClassState::Paused => self.min_rate,
        }
    }

    /// A pause length within [openDuration, maxOpenDuration] (the spec may have changed since
    /// the pause began).
    fn clamp_open(&self, seconds: f64) -> f64 {
        if seconds.is_finite() {
            seconds.clamp(self.open_seconds, self.max_open_seconds)
        } else {
            self.open_seconds
        }
    }
}

/// What the breaker remembers about one class between polls (kept in status).
#[derive(Clone, Debug, PartialEq)]
pub struct ClassMemory {
    pub state: ClassState,
    /// When the class entered `state`.
    pub since: Timestamp,
    /// Since when the ratio has been at or above the threshold (Active) or below it (Probing).
    pub condition_since: Option<Timestamp>,
    /// The current pause length while Paused or Probing.
    pub open_seconds: Option<f64>,
    /// The last ratio measured with enough executions.
    pub failure_ratio: Option<f64>,
    /// The ratio behind the last transition.
    pub transition_ratio: Option<f64>,
    /// Why the class is in its state.
    pub message: String,
}

impl ClassMemory {
    /// A class seen for the first time: Active, nothing measured yet.
    pub fn initial(now: Timestamp) -> Self {
        Self {
            state: ClassState::Active,
            since: timer_start(now),
            condition_since: None,
            open_seconds: None,
            failure_ratio: None,
            transition_ratio: None,
            message: "active: no failure ratio at or above the threshold seen yet".to_owned(),
        }
    }
}

/// One poll's data about a class, interpreted.
#[derive(Clone, Debug, PartialEq)]
pub enum Reading {
    /// Enough executions and a usable ratio.
    Measured {
        failure_ratio: f64,
        execution_rate: f64,
    },
    /// A usable execution rate below the minimum: no data-based decision.
    Quiet { execution_rate: f64, minimum: f64 },
    /// Something unusable: no change at all. Names the query and the problem.
    Missing(String),
}

/// Interprets a class's two query results for a class currently in `state`.
pub fn read(
    settings: &BreakerSettings,
    class: &str,
    state: ClassState,
    failure_ratio: &Observation,
    execution_rate: &Observation,
) -> Reading {
    let execution_rate = match single_value(execution_rate) {
        Ok(rate) => rate,
        Err(problem) => {
            return Reading::Missing(format!(
                "spec.eventClasses[{class}].executionRate {problem}"
            ));
        }
    };
    let minimum = settings.minimum_rate(state);
    if execution_rate < minimum {
        // A paused class executes nothing, and 0/0 is NaN: the ratio is not needed here.
        return Reading::Quiet {
            execution_rate,
            minimum,
        };
    }
    match single_value(failure_ratio) {
        Ok(ratio) if ratio <= 1.0 => Reading::Measured {
            failure_ratio: ratio,
            execution_rate,
        },
        Ok(ratio) => Reading::Missing(format!(
            "spec.eventClasses[{class}].failureRatio returned {ratio}; a failure ratio must be within [0, 1] (divide failed executions by all executions)"
        )),
        Err(problem) => {
            Reading::Missing(format!("spec.eventClasses[{class}].failureRatio {problem}"))
        }
    }
}

/// Why a class changed state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransitionReason {
    /// Active → Paused: the ratio stayed at or above the threshold for `for`.
    FailureRatioHigh,
    /// Paused → Probing: the open duration elapsed.
    OpenDurationElapsed,
    /// Probing → Active: the probes stayed healthy for `for`.
    ProbesHealthy,
    /// Probing → Paused: the probes failed.
    ProbesFailing,
    /// `mode: Paused`.
    PausedBySpec,
    /// `mode: Active`.
    ActivatedBySpec,
}

impl TransitionReason {
    /// CamelCase, for Events and conditions.
    pub fn as_str(self) -> &'static str {
        match self {
            TransitionReason::FailureRatioHigh => "FailureRatioHigh",
            TransitionReason::OpenDurationElapsed => "OpenDurationElapsed",
            TransitionReason::ProbesHealthy => "ProbesHealthy",
            TransitionReason::ProbesFailing => "ProbesFailing",
            TransitionReason::PausedBySpec => "PausedBySpec",
            TransitionReason::ActivatedBySpec => "ActivatedBySpec",
        }
    }
}

/// A change of state.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    pub from: ClassState,
    pub to: ClassState,
    pub reason: TransitionReason,
    /// The ratio that caused it; for time-based and manual transitions the last ratio seen.
    pub failure_ratio: Option<f64>,
    /// The execution rate at the transition, when measured.
    pub execution_rate: Option<f64>,
    pub message: String,
}

/// The outcome of one poll for one class.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub memory: ClassMemory,
    pub transition: Option<Transition>,
}

/// Status keeps whole seconds: timers start at the next whole second so that the time
/// measured from the stored value never exceeds the time that really passed.
fn timer_start(now: Timestamp) -> Timestamp {
    let whole = Timestamp::from_second(now.as_second()).unwrap_or(now);
    if whole == now {
        now
    } else {
        whole.checked_add(1.second()).unwrap_or(now)
    }
}

fn duration_text(seconds: f64) -> String {
    crate::go_duration::format_go_duration(std::time::Duration::from_secs_f64(seconds.max(0.0)))
}

fn ratio_text(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| "unknown".to_owned(), |r| format!("{}", round3(r)))
}

/// Ratios as status shows them: three decimals, so noise in the fourth does not rewrite status.
pub fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// Whether a class's backlog is taken out of the scaling input: a Paused class's events wait
/// by design, and so do the events a Probing class's consumers skip (all but `probeRatio` of
/// them); more replicas cannot drain either. Counting a probing class's held backlog would
/// scale to the cap at every probe (the class experiment in `sim::classes` shows it). The
/// controller and the simulator both ask this, so they cannot disagree.
pub fn holds_backlog(state: ClassState) -> bool {
    state != ClassState::Active
}

/// Decides one poll for one class. `memory` is `None` for a class seen for the first time.
pub fn step(
    settings: &BreakerSettings,
    memory: Option<&ClassMemory>,
    reading: &Reading,
    now: Timestamp,
) -> Step {
    let previous = memory.cloned().unwrap_or_else(|| ClassMemory::initial(now));
    let mut next = previous.clone();
    if let Reading::Measured { failure_ratio, .. } = reading {
        next.failure_ratio = Some(round3(*failure_ratio));
    }
    match settings.mode {
        ClassMode::Paused => return manual(settings, next, ClassState::Paused, reading, now),
        ClassMode::Active => return manual(settings, next, ClassState::Active, reading, now),
        ClassMode::Auto => {}
    }
    match reading {
        Reading::Missing(_) => {
            next.condition_since = None;
            Step {
                memory: next,
                transition: None,
            }
        }
        Reading::Quiet { .. } => {
            next.condition_since = None;
            if previous.state == ClassState::Paused {
                return maybe_probe(settings, next, now);
            }
            Step {
                memory: next,
                transition: None,
            }
        }
        Reading::Measured {
            failure_ratio,
            execution_rate,
        } => match previous.state {
            ClassState::Active => active(settings, next, *failure_ratio, *execution_rate, now),
            ClassState::Paused => {
                next.condition_since = None;
                maybe_probe(settings, next, now)
            }
            ClassState::Probing => probing(settings, next, *failure_ratio, *execution_rate, now),
        },
    }
}

fn enter(
    mut memory: ClassMemory,
    to: ClassState,
    reason: TransitionReason,
    ratio: Option<f64>,
    execution_rate: Option<f64>,
    message: String,
    now: Timestamp,
) -> Step {
    let from = memory.state;
    memory.state = to;
    memory.since = timer_start(now);
    memory.condition_since = None;
    memory.transition_ratio = ratio.map(round3);
    memory.message = message.clone();
    Step {
        memory,
        transition: Some(Transition {
            from,
            to,
            reason,
            failure_ratio: ratio.map(round3),
            execution_rate,
            message,
        }),
    }
}

fn unchanged(memory: ClassMemory) -> Step {
    Step {
        memory,
        transition: None,
    }
}

fn active(
    settings: &BreakerSettings,
    mut next: ClassMemory,
    ratio: f64,
    execution_rate: f64,
    now: Timestamp,
) -> Step {
    if ratio < settings.threshold {
        next.condition_since = None;
        return unchanged(next);
    }
    let since = *next.condition_since.get_or_insert_with(|| timer_start(now));
    if seconds_between(since, now) < settings.for_seconds {
        return unchanged(next);
    }
    let open = settings.open_seconds;
    next.open_seconds = Some(open);
    let message = format!(
        "failure ratio {} ≥ threshold {} for {} at {} executions/s: paused for {}, then probing {}% of events",
        ratio_text(Some(ratio)),
        settings.threshold,
        duration_text(settings.for_seconds),
        si(execution_rate),
        duration_text(open),
        round3(settings.probe_ratio * 100.0),
    );
    enter(
        next,
        ClassState::Paused,
        TransitionReason::FailureRatioHigh,
        Some(ratio),
        Some(execution_rate),
        message,
        now,
    )
}

fn maybe_probe(settings: &BreakerSettings, mut next: ClassMemory, now: Timestamp) -> Step {
    let open = settings.clamp_open(next.open_seconds.unwrap_or(settings.open_seconds));
    next.open_seconds = Some(open);
    if seconds_between(next.since, now) < open {
        return unchanged(next);
    }
    let message = format!(
        "paused for {}: probing {}% of events; last failure ratio {}",
        duration_text(open),
        round3(settings.probe_ratio * 100.0),
        ratio_text(next.failure_ratio),
    );
    let ratio = next.failure_ratio;
    enter(
        next,
        ClassState::Probing,
        TransitionReason::OpenDurationElapsed,
        ratio,
        None,
        message,
        now,
    )
}

fn probing(
    settings: &BreakerSettings,
    mut next: ClassMemory,
    ratio: f64,
    execution_rate: f64,
    now: Timestamp,
) -> Step {
    let open = settings.clamp_open(next.open_seconds.unwrap_or(settings.open_seconds));
    if ratio >= settings.threshold {
        let doubled = settings.clamp_open(open * 2.0);
        next.open_seconds = Some(doubled);
        let message = format!(
            "probes failing: failure ratio {} ≥ threshold {} at {} executions/s; paused again for {} (doubled, at most {})",
            ratio_text(Some(ratio)),
            settings.threshold,
            si(execution_rate),
            duration_text(doubled),
            duration_text(settings.max_open_seconds),
        );
        return enter(
            next,
            ClassState::Paused,
            TransitionReason::ProbesFailing,
            Some(ratio),
            Some(execution_rate),
            message,
            now,
        );
    }
    next.open_seconds = Some(open);
    let since = *next.condition_since.get_or_insert_with(|| timer_start(now));
    if seconds_between(since, now) < settings.for_seconds {
        return unchanged(next);
    }
    next.open_seconds = None;
    let message = format!(
        "probes healthy for {}: failure ratio {} < threshold {} at {} executions/s",
        duration_text(settings.for_seconds),
        ratio_text(Some(ratio)),
        settings.threshold,
        si(execution_rate),
    );
    enter(
        next,
        ClassState::Active,
        TransitionReason::ProbesHealthy,
        Some(ratio),
        Some(execution_rate),
        message,
        now,
    )
}

fn manual(
    settings: &BreakerSettings,
    mut next: ClassMemory,
    to: ClassState,
    reading: &Reading,
    now: Timestamp,
) -> Step {
    next.condition_since = None;
    if next.state == to {
        return unchanged(next);
    }
    let execution_rate = match reading {
        Reading::Measured { execution_rate, .. } | Reading::Quiet { execution_rate, .. } => {
            Some(*execution_rate)
        }
        Reading::Missing(_) => None,
    };
    let (reason, message) = match to {
        ClassState::Paused => {
            // A manual pause keeps the length the breaker would use, for when mode returns
            // to Auto.
            next.open_seconds = Some(settings.open_seconds);
            (
                TransitionReason::PausedBySpec,
                "paused by spec (mode: Paused); set mode: Auto to let the breaker decide"
                    .to_owned(),
            )
        }
        ClassState::Active | ClassState::Probing => {
            next.open_seconds = None;
            (
                TransitionReason::ActivatedBySpec,
                "active by spec (mode: Active); set mode: Auto to let the breaker decide"
                    .to_owned(),
            )
        }
    };
    let ratio = next.failure_ratio;
    enter(next, to, reason, ratio, execution_rate, message, now)
}

#[cfg(test)]
mod tests;
