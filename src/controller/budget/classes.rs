//! The event-class breaker between the API and the core (pure): one step of
//! [`crate::core::class_breaker`] per class with the memory kept in `status.eventClasses`, and
//! the outcome as status entries, conditions and Events. The queries are asked in
//! [`super::inputs::observe_classes`].
//!
//! The status is the breaker's only memory: an operator restart resumes every class where it
//! was, timers included. The entries are written with the rest of the budget's status, in the
//! same apply, so one field manager owns the whole status.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

use crate::api::backlog_budget::{BacklogBudgetStatus, ClassState, EventClass, EventClassStatus};
use crate::api::conditions::{ConditionSpec, Truth, merge_conditions};
use crate::consumer::{format_go_duration, parse_go_duration};
use crate::controller::plan::PlannedEvent;
use crate::core::class_breaker::{
    BreakerSettings, ClassMemory, Reading, Transition, TransitionReason, read, round3, step,
};
use crate::core::metric_input::Observation;

/// True while any class is Paused or Probing.
pub const CLASSES_PAUSED: &str = "ClassesPaused";
/// False while a class's queries return nothing usable (its state is then held).
pub const CLASS_METRICS_AVAILABLE: &str = "ClassMetricsAvailable";

/// The two query results of one class.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassObservations {
    pub failure_ratio: Observation,
    pub execution_rate: Observation,
}

/// One poll's outcome for every class of a budget.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClassOutcome {
    /// One entry per class of the spec, in spec order.
    pub statuses: Vec<EventClassStatus>,
    /// The transitions of this poll, with the class name.
    pub transitions: Vec<(String, Transition)>,
    /// `ClassesPaused` and `ClassMetricsAvailable`; empty when the budget has no classes.
    pub conditions: Vec<ConditionSpec>,
}

/// The breaker's memory as status keeps it. An unreadable pause length (edited by hand) is
/// left out, and the breaker uses the spec's openDuration instead.
pub fn memory_of(status: &EventClassStatus) -> ClassMemory {
    ClassMemory {
        state: status.state,
        since: status.since.0,
        condition_since: status.condition_since.as_ref().map(|time| time.0),
        open_seconds: status
            .open_duration
            .as_deref()
            .and_then(|text| parse_go_duration(text).ok())
            .map(|duration| duration.as_secs_f64()),
        failure_ratio: status.failure_ratio,
        transition_ratio: status.transition_ratio,
        message: status.message.clone(),
    }
}

/// The status entry of a class's memory.
pub fn status_of(name: &str, memory: &ClassMemory, probe_ratio: Option<f64>) -> EventClassStatus {
    EventClassStatus {
        name: name.to_owned(),
        state: memory.state,
        since: MicroTime(memory.since),
        failure_ratio: memory.failure_ratio,
        transition_ratio: memory.transition_ratio,
        condition_since: memory.condition_since.map(MicroTime),
        open_duration: memory
            .open_seconds
            .map(|seconds| format_go_duration(Duration::from_secs_f64(seconds.max(0.0)))),
        probe_ratio: (memory.state == ClassState::Probing)
            .then_some(probe_ratio)
            .flatten(),
        message: memory.message.clone(),
    }
}

/// Steps every class of the spec (pure). `observations` is in spec order.
pub fn decide(
    classes: &[EventClass],
    previous: &[EventClassStatus],
    observations: &[ClassObservations],
    now: Timestamp,
) -> ClassOutcome {
    let mut outcome = ClassOutcome::default();
    let mut problems = Vec::new();
    let mut invalid = false;
    let mut failed_queries = true;
    for (class, observed) in classes.iter().zip(observations) {
        let earlier = previous.iter().find(|status| status.name == class.name);
        let memory = earlier.map(memory_of);
        let settings = match BreakerSettings::from_spec(&class.into()) {
            Ok(settings) => settings,
            Err(problem) => {
                // Nothing to decide with: hold the class where it is.
                invalid = true;
                problems.push(format!("{problem}"));
                let memory = memory.unwrap_or_else(|| ClassMemory::initial(now));
                outcome.statuses.push(status_of(
                    &class.name,
                    &memory,
                    earlier.and_then(|status| status.probe_ratio),
                ));
                continue;
            }
        };
        let state = memory.as_ref().map_or(ClassState::Active, |m| m.state);
        let reading = read(
            &settings,
            &class.name,
            state,
            &observed.failure_ratio,
            &observed.execution_rate,
        );
        if let Reading::Missing(problem) = &reading {
            failed_queries &= [&observed.failure_ratio, &observed.execution_rate]
                .iter()
                .any(|o| matches!(o, Observation::Failed(_)));
            problems.push(problem.clone());
        }
        let stepped = step(&settings, memory.as_ref(), &reading, now);
        outcome.statuses.push(status_of(
            &class.name,
            &stepped.memory,
            Some(settings.probe_ratio),
        ));
        if let Some(transition) = stepped.transition {
            outcome.transitions.push((class.name.clone(), transition));
        }
    }
    outcome.conditions = conditions(&outcome.statuses, &problems, invalid, failed_queries);
    outcome
}

fn conditions(
    statuses: &[EventClassStatus],
    problems: &[String],
    invalid: bool,
    failed_queries: bool,
) -> Vec<ConditionSpec> {
    if statuses.is_empty() {
        return Vec::new();
    }
    let held: Vec<String> = statuses
        .iter()
        .filter(|status| status.state != ClassState::Active)
        .map(|status| match status.probe_ratio {
            Some(ratio) if status.state == ClassState::Probing => {
                format!(
                    "{} Probing {}%: {}",
                    status.name,
                    round3(ratio * 100.0),
                    status.message
                )
            }
            _ => format!("{} {:?}: {}", status.name, status.state, status.message),
        })
        .collect();
    let paused = if held.is_empty() {
        ConditionSpec::new(
            CLASSES_PAUSED,
            Truth::False,
            "AllActive",
            format!("all {} event classes are active", statuses.len()),
        )
    } else {
        let reason = if statuses.iter().any(|s| s.state == ClassState::Paused) {
            "Paused"
        } else {
            "Probing"
        };
        ConditionSpec::new(CLASSES_PAUSED, Truth::True, reason, held.join("; "))
    };
    let metrics = if problems.is_empty() {
        ConditionSpec::new(
            CLASS_METRICS_AVAILABLE,
            Truth::True,
            "QueriesUsable",
            "every class's failureRatio and executionRate returned usable data",
        )
    } else {
        let reason = if invalid {
            "InvalidSpec"
        } else if failed_queries {
            "QueryFailed"
        } else {
            "NoUsableData"
        };
        ConditionSpec::new(
            CLASS_METRICS_AVAILABLE,
            Truth::False,
            reason,
            format!(
                "{}; the breaker holds these classes in their current state until this is fixed",
                problems.join("; ")
            ),
        )
    };
    vec![paused, metrics]
}

impl ClassOutcome {
    /// The status with this poll's class entries, `pausedClasses` and conditions.
    pub fn record(
        &self,
        mut status: BacklogBudgetStatus,
        generation: Option<i64>,
        now: Timestamp,
    ) -> BacklogBudgetStatus {
        status.paused_classes = self
            .statuses
            .iter()
            .filter(|class| class.state == ClassState::Paused)
            .map(|class| class.name.clone())
            .collect();
        status.event_classes = self.statuses.clone();
        if self.conditions.is_empty() {
            // No classes (any more): no class conditions either.
            status
                .conditions
                .retain(|c| c.type_ != CLASSES_PAUSED && c.type_ != CLASS_METRICS_AVAILABLE);
        } else {
            status.conditions =
                merge_conditions(&status.conditions, &self.conditions, generation, now);
        }
        status
    }

    /// One Event per transition. They follow the status write that records the transitions
    /// (a failed write is retried, and the transition with it, so nothing is announced twice)
    /// and come before the control document write, so a failed document write loses none.
    pub fn events(&self) -> Vec<PlannedEvent> {
        self.transitions
            .iter()
            .map(|(class, transition)| {
                let note = format!(
                    "class {class}: {:?} → {:?} ({}): {}",
                    transition.from,
                    transition.to,
                    transition.reason.as_str(),
                    transition.message
                );
                // The action names the class and the cause, so two classes pausing, or a pause
                // for another cause, stay separate Events (see Context::publish).
                let action = format!("{}/{class}", transition.reason.as_str());
                // A class the breaker pauses is news someone should look at; the rest is
                // routine.
                let warning = matches!(
                    transition.reason,
                    TransitionReason::FailureRatioHigh | TransitionReason::ProbesFailing
                );
                PlannedEvent::new(warning, event_reason(transition.to), action, note)
            })
            .collect()
    }
}

/// The Event reason for entering a state.
pub fn event_reason(state: ClassState) -> &'static str {
    match state {
        ClassState::Active => "ClassActive",
        ClassState::Paused => "ClassPaused",
        ClassState::Probing => "ClassProbing",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::backlog_budget::{ClassMode, PausePolicy};

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    fn class(name: &str) -> EventClass {
        EventClass {
            name: name.to_owned(),
            failure_ratio: format!("ratio_{name}"),
            execution_rate: format!("rate_{name}"),
            min_rate: 1.0,
            backlog: None,
            mode: ClassMode::Auto,
            pause_policy: PausePolicy {
                for_: "2s".into(),
                open_duration: "3s".into(),
                max_open_duration: "10s".into(),
                ..PausePolicy::default()
            },
        }
    }

    fn seen(ratio: f64, rate: f64) -> ClassObservations {
        ClassObservations {
            failure_ratio: Observation::Samples(vec![ratio]),
            execution_rate: Observation::Samples(vec![rate]),
        }
    }

    fn down() -> ClassObservations {
        ClassObservations {
            failure_ratio: Observation::Failed("connection refused".into()),
            execution_rate: Observation::Failed("connection refused".into()),
        }
    }

    /// Polls once a second with the same observations, carrying the status forward.
    fn poll(
        classes: &[EventClass],
        mut statuses: Vec<EventClassStatus>,
        observations: &[ClassObservations],
        from: i64,
        to: i64,
    ) -> (
        Vec<EventClassStatus>,
        Vec<(i64, String, Transition)>,
        ClassOutcome,
    ) {
        let mut transitions = Vec::new();
        let mut last = ClassOutcome::default();
        for t in from..=to {
            last = decide(classes, &statuses, observations, at(t));
            for (name, transition) in &last.transitions {
                transitions.push((t, name.clone(), transition.clone()));
            }
            // Through JSON, as the API server keeps it.
            statuses =
                serde_json::from_value(serde_json::to_value(&last.statuses).unwrap()).unwrap();
        }
        (statuses, transitions, last)
    }

    #[test]
    fn a_failing_class_pauses_and_a_healthy_one_stays_active() {
        let classes = [class("refund"), class("order")];
        let (statuses, transitions, last) =
            poll(&classes, vec![], &[seen(0.9, 10.0), seen(0.0, 10.0)], 0, 4);
        assert_eq!(transitions.len(), 1, "{transitions:?}");
        assert_eq!(transitions[0].0, 2);
        assert_eq!(transitions[0].1, "refund");
        assert_eq!(statuses[0].state, ClassState::Paused);
        assert_eq!(statuses[0].transition_ratio, Some(0.9));
        assert_eq!(statuses[0].open_duration.as_deref(), Some("3s"));
        assert_eq!(statuses[1].state, ClassState::Active);
        let status = last.record(BacklogBudgetStatus::default(), Some(1), at(4));
        assert_eq!(status.paused_classes, ["refund"]);
        let paused = crate::api::conditions::find(&status.conditions, CLASSES_PAUSED).unwrap();
        assert_eq!(paused.status, "True");
        assert!(
            paused
                .message
                .starts_with("refund Paused: failure ratio 0.9"),
            "{}",
            paused.message
        );
    }

    #[test]
    fn status_round_trips_keep_probing_going() {
        let classes = [class("refund")];
        let (statuses, _, _) = poll(&classes, vec![], &[seen(0.9, 10.0)], 0, 2);
        // Paused at 2s; nothing executes while paused (rate 0, ratio NaN).
        let quiet = ClassObservations {
            failure_ratio: Observation::Samples(vec![f64::NAN]),
            execution_rate: Observation::Samples(vec![0.0]),
        };
        let (statuses, transitions, last) = poll(&classes, statuses, &[quiet], 3, 5);
        assert_eq!(transitions.len(), 1);
        assert_eq!(statuses[0].state, ClassState::Probing);
        assert_eq!(statuses[0].probe_ratio, Some(0.1));
        let metrics = crate::api::conditions::find(
            &last.record(Default::default(), None, at(5)).conditions,
            CLASS_METRICS_AVAILABLE,
        )
        .cloned()
        .unwrap();
        assert_eq!(
            metrics.status, "True",
            "a quiet paused class is not missing data"
        );
        // Healthy probes for 2s: Active.
        let (statuses, transitions, _) = poll(&classes, statuses, &[seen(0.0, 1.0)], 6, 8);
        assert_eq!(transitions.len(), 1);
        assert_eq!(statuses[0].state, ClassState::Active);
        assert_eq!(statuses[0].probe_ratio, None);
    }

    #[test]
    fn prometheus_down_holds_every_class_and_says_so() {
        let classes = [class("refund"), class("order")];
        let (statuses, _, _) = poll(&classes, vec![], &[seen(0.9, 10.0), seen(0.0, 10.0)], 0, 2);
        let (held, transitions, last) = poll(&classes, statuses.clone(), &[down(), down()], 3, 60);
        assert!(transitions.is_empty());
        assert_eq!(
            held.iter().map(|s| s.state).collect::<Vec<_>>(),
            statuses.iter().map(|s| s.state).collect::<Vec<_>>()
        );
        let condition = last
            .conditions
            .iter()
            .find(|c| c.type_ == CLASS_METRICS_AVAILABLE)
            .unwrap();
        assert_eq!(condition.status, Truth::False);
        assert_eq!(condition.reason, "QueryFailed");
        assert!(
            condition
                .message
                .starts_with("spec.eventClasses[refund].executionRate failed: connection refused"),
            "{}",
            condition.message
        );
    }

    #[test]
    fn an_unusable_spec_holds_the_class_and_names_the_field() {
        let mut broken = class("refund");
        broken.pause_policy.for_ = "soon".into();
        let outcome = decide(&[broken], &[], &[seen(1.0, 10.0)], at(0));
        assert_eq!(outcome.statuses[0].state, ClassState::Active);
        let condition = &outcome.conditions[1];
        assert_eq!(condition.reason, "InvalidSpec");
        assert!(
            condition
                .message
                .starts_with("spec.eventClasses[refund].pausePolicy.for \"soon\""),
            "{}",
            condition.message
        );
    }

    #[test]
    fn removed_classes_leave_status_and_their_conditions_go() {
        let (statuses, _, last) = poll(&[class("refund")], vec![], &[seen(0.9, 10.0)], 0, 3);
        let status = last.record(BacklogBudgetStatus::default(), None, at(3));
        assert_eq!(status.event_classes.len(), 1);
        let none = decide(&[], &statuses, &[], at(4));
        let status = none.record(status, None, at(4));
        assert!(status.event_classes.is_empty());
        assert!(status.paused_classes.is_empty());
        assert!(crate::api::conditions::find(&status.conditions, CLASSES_PAUSED).is_none());
    }

    #[test]
    fn an_edited_open_duration_falls_back_to_the_spec() {
        let (mut statuses, _, _) = poll(&[class("refund")], vec![], &[seen(0.9, 10.0)], 0, 2);
        statuses[0].open_duration = Some("whenever".into());
        assert_eq!(memory_of(&statuses[0]).open_seconds, None);
        let quiet = ClassObservations {
            failure_ratio: Observation::Samples(vec![]),
            execution_rate: Observation::Samples(vec![0.0]),
        };
        let (statuses, transitions, _) = poll(&[class("refund")], statuses, &[quiet], 3, 5);
        assert_eq!(transitions.len(), 1, "probing after the spec's 3s");
        assert_eq!(statuses[0].open_duration.as_deref(), Some("3s"));
    }
}
