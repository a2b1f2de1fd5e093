//! One RetryPolicy decision (pure): the status for its spec and the budgets that use it, and
//! an Event for each condition that changed — published after the status that records it.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::api::retry_policy::{RetryPolicySpec, RetryPolicyStatus};
use crate::controller::plan::{OnFailure, PlannedEvent, Step};

use super::status::{
    BudgetUse, CODE_IN_TWO_CLASSES, DEADLINE_CONFLICT, READY, next_status, transitions,
};

/// Budgets and policies are watched, so this is only a safety net.
pub const RESYNC: Duration = Duration::from_secs(600);

/// One step of a policy's plan.
#[derive(Clone, Debug, PartialEq)]
pub enum PolicyStep {
    WriteStatus(Box<RetryPolicyStatus>),
    Publish(PlannedEvent),
}

impl Step for PolicyStep {
    fn on_failure(&self) -> OnFailure {
        match self {
            // The Events announce what the status records: none without it.
            PolicyStep::WriteStatus(_) => OnFailure::Stop,
            PolicyStep::Publish(_) => OnFailure::Ignore,
        }
    }
}

/// What one reconcile of a policy does.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyPlan {
    pub steps: Vec<PolicyStep>,
    pub status: RetryPolicyStatus,
    pub requeue: Duration,
}

/// Decides a policy's status and Events (pure).
pub fn decide(
    spec: &RetryPolicySpec,
    users: &[BudgetUse],
    previous: &RetryPolicyStatus,
    generation: Option<i64>,
    now: Timestamp,
) -> PolicyPlan {
    let next = next_status(previous, spec, users, generation, now);
    let mut steps = Vec::new();
    if next != *previous {
        steps.push(PolicyStep::WriteStatus(Box::new(next.clone())));
        for (type_, status, reason, message) in transitions(previous, &next) {
            let warning = (type_ == READY && (status != "True" || reason == CODE_IN_TWO_CLASSES))
                || (type_ == DEADLINE_CONFLICT && status == "True");
            steps.push(PolicyStep::Publish(PlannedEvent::new(
                warning,
                reason,
                "Reconcile",
                message,
            )));
        }
    }
    PolicyPlan {
        steps,
        status: next,
        requeue: RESYNC,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::plan::execute;
    use crate::controller::plan::testing::Recorder;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    fn spec(max_attempts: i32) -> RetryPolicySpec {
        serde_json::from_value(serde_json::json!({
            "maxAttempts": max_attempts,
            "backoff": {"base": "100ms", "cap": "10s"}
        }))
        .unwrap()
    }

    fn user(deadline: &str) -> BudgetUse {
        BudgetUse {
            name: "orders".into(),
            completion_deadline: deadline.into(),
        }
    }

    #[test]
    fn a_new_policy_writes_its_status_then_announces_each_condition() {
        let plan = decide(
            &spec(5),
            &[user("1s")],
            &RetryPolicyStatus::default(),
            Some(1),
            at(0),
        );
        assert!(matches!(plan.steps[0], PolicyStep::WriteStatus(_)));
        let events: Vec<(&str, bool)> = plan.steps[1..]
            .iter()
            .map(|step| match step {
                PolicyStep::Publish(event) => (
                    event.reason.as_str(),
                    event.type_ == kube::runtime::events::EventType::Warning,
                ),
                other => panic!("only Events follow the status: {other:?}"),
            })
            .collect();
        assert_eq!(
            events,
            [("DeadlineShorterThanRetries", true), ("Valid", false)]
        );
    }

    #[test]
    fn a_code_in_two_classes_is_announced_as_a_warning() {
        let mut two_classes = spec(5);
        two_classes.classification = serde_json::from_value(serde_json::json!([
            {"errorCodes": ["HTTP_503"], "class": "Transient"},
            {"errorCodes": ["HTTP_503"], "class": "Business"}
        ]))
        .unwrap();
        let plan = decide(
            &two_classes,
            &[],
            &RetryPolicyStatus::default(),
            Some(1),
            at(0),
        );
        let ready = plan.steps.iter().find_map(|step| match step {
            PolicyStep::Publish(event) if event.reason == CODE_IN_TWO_CLASSES => Some(event),
            _ => None,
        });
        assert!(
            ready.is_some_and(|event| event.type_ == kube::runtime::events::EventType::Warning),
            "{:?}",
            plan.steps
        );
    }

    #[test]
    fn nothing_new_is_no_step() {
        let first = decide(
            &spec(5),
            &[user("1m")],
            &RetryPolicyStatus::default(),
            Some(1),
            at(0),
        );
        let again = decide(&spec(5), &[user("1m")], &first.status, Some(1), at(60));
        assert!(again.steps.is_empty());
        assert_eq!(again.status, first.status);
    }

    #[test]
    fn a_failed_status_write_announces_nothing() {
        let plan = decide(
            &spec(5),
            &[user("1s")],
            &RetryPolicyStatus::default(),
            Some(1),
            at(0),
        );
        let recorder = Recorder::failing([0]);
        let executed = futures::executor::block_on(execute(&plan.steps, &recorder));
        assert!(recorder.performed().is_empty());
        assert!(executed.into_result().is_err());
    }
}
