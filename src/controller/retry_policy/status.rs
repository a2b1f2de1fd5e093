//! The RetryPolicy's status as a pure function of its spec and the budgets that use it:
//! the normalized policy's hash, the worst case it allows, the budgets referencing it, and the
//! conditions `Ready` and `DeadlineConflict`.

use k8s_openapi::jiff::Timestamp;

use crate::api::conditions::{ConditionSpec, Truth, merge_conditions};
use crate::api::retry_policy::{RetryPolicySpec, RetryPolicyStatus};
use crate::consumer::{EffectivePolicy, format_go_duration, parse_go_duration};

pub const READY: &str = "Ready";
pub const DEADLINE_CONFLICT: &str = "DeadlineConflict";

/// A BacklogBudget that references the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetUse {
    pub name: String,
    /// Its `spec.completionDeadline`, as written.
    pub completion_deadline: String,
}

/// The status for `spec` used by `users`. Fields the operator cannot compute from an unusable
/// spec are left out rather than kept stale.
pub fn next_status(
    previous: &RetryPolicyStatus,
    spec: &RetryPolicySpec,
    users: &[BudgetUse],
    generation: Option<i64>,
    now: Timestamp,
) -> RetryPolicyStatus {
    let mut used_by: Vec<String> = users.iter().map(|u| u.name.clone()).collect();
    used_by.sort();
    used_by.dedup();
    let policy = match EffectivePolicy::from_spec(&spec.into()) {
        Ok(policy) => policy,
        Err(problem) => {
            let conditions = [
                ConditionSpec::new(
                    READY,
                    Truth::False,
                    "InvalidSpec",
                    format!(
                        "{problem}; consumers of the budgets using this policy keep the last policy published to them"
                    ),
                ),
                ConditionSpec::new(
                    DEADLINE_CONFLICT,
                    Truth::Unknown,
                    "PolicyInvalid",
                    "the worst case of an unusable policy is unknown",
                ),
            ];
            return RetryPolicyStatus {
                observed_generation: generation,
                policy_hash: None,
                worst_case_retry_delay: None,
                amplification: None,
                budgeted_amplification: None,
                used_by,
                conditions: merge_conditions(&previous.conditions, &conditions, generation, now),
            };
        }
    };
    let schedule = policy.schedule();
    let worst = schedule.worst_case_retry_delay;
    let worst_text = format_go_duration(worst);
    let ready = ConditionSpec::new(
        READY,
        Truth::True,
        "Valid",
        format!(
            "policyHash {}: up to {} executions per event, at most {worst_text} waiting between them",
            policy.policy_hash(),
            policy.max_attempts()
        ),
    );
    let conflicts: Vec<String> = users
        .iter()
        .filter_map(|user| {
            // An unparsable deadline is reported in the budget's own status.
            let deadline = parse_go_duration(&user.completion_deadline).ok()?;
            (deadline < worst).then(|| {
                format!(
                    "BacklogBudget {} has completionDeadline {}, {} shorter than the worst-case retry delay {worst_text}",
                    user.name,
                    user.completion_deadline,
                    format_go_duration(worst - deadline)
                )
            })
        })
        .collect();
    let deadline = if conflicts.is_empty() {
        let message = if used_by.is_empty() {
            "no BacklogBudget in this namespace uses this policy".to_owned()
        } else {
            format!(
                "every BacklogBudget using this policy has a completionDeadline of at least the worst-case retry delay {worst_text}"
            )
        };
        ConditionSpec::new(DEADLINE_CONFLICT, Truth::False, "DeadlinesFit", message)
    } else {
        ConditionSpec::new(
            DEADLINE_CONFLICT,
            Truth::True,
            "DeadlineShorterThanRetries",
            format!(
                "{}: an event that needs all {} attempts cannot finish in time; raise the completionDeadline to at least {worst_text}, or lower spec.maxAttempts or spec.backoff.cap",
                conflicts.join("; "),
                policy.max_attempts()
            ),
        )
    };
    RetryPolicyStatus {
        observed_generation: generation,
        policy_hash: Some(policy.policy_hash().to_owned()),
        worst_case_retry_delay: Some(worst_text),
        amplification: Some(i32::try_from(schedule.worst_case_amplification).unwrap_or(i32::MAX)),
        budgeted_amplification: Some(schedule.budgeted_amplification),
        used_by,
        conditions: merge_conditions(&previous.conditions, &[ready, deadline], generation, now),
    }
}

/// A condition whose status changed (or appeared), for an Event: (type, new status, reason,
/// message).
pub fn transitions(
    previous: &RetryPolicyStatus,
    next: &RetryPolicyStatus,
) -> Vec<(String, String, String, String)> {
    next.conditions
        .iter()
        .filter(|condition| {
            crate::api::conditions::find(&previous.conditions, &condition.type_)
                .is_none_or(|old| old.status != condition.status)
        })
        .map(|c| {
            (
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone(),
                c.message.clone(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conditions::find;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    fn spec(max_attempts: i32, cap: &str) -> RetryPolicySpec {
        serde_json::from_value(serde_json::json!({
            "maxAttempts": max_attempts,
            "backoff": {"base": "100ms", "cap": cap}
        }))
        .unwrap()
    }

    fn user(name: &str, deadline: &str) -> BudgetUse {
        BudgetUse {
            name: name.into(),
            completion_deadline: deadline.into(),
        }
    }

    #[test]
    fn publishes_the_worst_case_and_the_users() {
        let status = next_status(
            &RetryPolicyStatus::default(),
            &spec(5, "10s"),
            &[user("b", "10m"), user("a", "2s")],
            Some(3),
            at(0),
        );
        assert_eq!(status.worst_case_retry_delay.as_deref(), Some("1.5s"));
        assert_eq!(status.amplification, Some(5));
        assert_eq!(status.budgeted_amplification, Some(1.1));
        assert!(
            status
                .policy_hash
                .as_deref()
                .is_some_and(|h| h.starts_with("sha256:"))
        );
        assert_eq!(status.used_by, ["a", "b"]);
        assert_eq!(status.observed_generation, Some(3));
        let ready = find(&status.conditions, READY).unwrap();
        assert_eq!(ready.status, "True");
        let conflict = find(&status.conditions, DEADLINE_CONFLICT).unwrap();
        assert_eq!(conflict.status, "False");
        assert_eq!(conflict.reason, "DeadlinesFit");
    }

    #[test]
    fn a_short_deadline_conflicts_and_says_by_how_much_until_it_is_raised() {
        let first = next_status(
            &RetryPolicyStatus::default(),
            &spec(5, "10s"),
            &[user("orders", "1s"), user("fine", "1m")],
            Some(1),
            at(0),
        );
        let conflict = find(&first.conditions, DEADLINE_CONFLICT).unwrap();
        assert_eq!(conflict.status, "True");
        assert_eq!(
            conflict.message,
            "BacklogBudget orders has completionDeadline 1s, 500ms shorter than the worst-case retry delay 1.5s: an event that needs all 5 attempts cannot finish in time; raise the completionDeadline to at least 1.5s, or lower spec.maxAttempts or spec.backoff.cap"
        );
        let events = transitions(&RetryPolicyStatus::default(), &first);
        assert_eq!(events.len(), 2);

        let resolved = next_status(
            &first,
            &spec(5, "10s"),
            &[user("orders", "1500ms"), user("fine", "1m")],
            Some(1),
            at(10),
        );
        assert_eq!(
            find(&resolved.conditions, DEADLINE_CONFLICT)
                .unwrap()
                .status,
            "False"
        );
        let events = transitions(&first, &resolved);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].0, DEADLINE_CONFLICT);

        // Nothing new: nothing to announce, and the status is equal.
        let again = next_status(
            &resolved,
            &spec(5, "10s"),
            &[user("orders", "1500ms"), user("fine", "1m")],
            Some(1),
            at(20),
        );
        assert!(transitions(&resolved, &again).is_empty());
        assert_eq!(again, resolved);
    }

    #[test]
    fn an_unusable_spec_is_not_ready_and_names_the_field() {
        let ready = next_status(
            &RetryPolicyStatus::default(),
            &spec(5, "10s"),
            &[user("orders", "1s")],
            Some(1),
            at(0),
        );
        let broken = next_status(
            &ready,
            &spec(5, "10ms"),
            &[user("orders", "1s")],
            Some(2),
            at(5),
        );
        let condition = find(&broken.conditions, READY).unwrap();
        assert_eq!(condition.status, "False");
        assert_eq!(condition.reason, "InvalidSpec");
        assert!(
            condition.message.starts_with(
                "spec.backoff.cap \"10ms\" is shorter than spec.backoff.base \"100ms\": raise cap or lower base"
            ),
            "{}",
            condition.message
        );
        assert_eq!(broken.policy_hash, None);
        assert_eq!(broken.worst_case_retry_delay, None);
        assert_eq!(broken.used_by, ["orders"]);
        assert_eq!(
            find(&broken.conditions, DEADLINE_CONFLICT).unwrap().status,
            "Unknown"
        );
    }

    #[test]
    fn unparsable_deadlines_are_left_to_the_budget() {
        let status = next_status(
            &RetryPolicyStatus::default(),
            &spec(5, "10s"),
            &[user("odd", "soon")],
            None,
            at(0),
        );
        assert_eq!(
            find(&status.conditions, DEADLINE_CONFLICT).unwrap().status,
            "False"
        );
    }
}
