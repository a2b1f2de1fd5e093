//! The RetryPolicy's status as a pure function of its spec and the budgets that use it:
//! the normalized policy's hash, the worst case it allows, the budgets referencing it, and the
//! conditions `Ready` and `DeadlineConflict`.

use k8s_openapi::jiff::Timestamp;

use crate::api::conditions::{ConditionSpec, Truth, merge_conditions};
use crate::api::retry_policy::{RetryPolicySpec, RetryPolicyStatus};
use crate::consumer::{EffectivePolicy, format_go_duration, parse_go_duration};
use crate::core::classification::{IgnoredListing, ignored_listings};
use crate::core::retry_policy::RetryPolicyDefinition;

pub const READY: &str = "Ready";
/// Ready's reason for a usable policy.
const VALID: &str = "Valid";
/// Ready's reason for a usable policy in which a code is listed under two classes.
pub const CODE_IN_TWO_CLASSES: &str = "CodeInTwoClasses";
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
    let definition: RetryPolicyDefinition = spec.into();
    let policy = match EffectivePolicy::from_spec(&definition) {
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
    let summary = format!(
        "policyHash {}: up to {} executions per event, at most {worst_text} waiting between them",
        policy.policy_hash(),
        policy.max_attempts()
    );
    let ignored = ignored_listings(&definition.classification);
    let ready = if ignored.is_empty() {
        ConditionSpec::new(READY, Truth::True, VALID, summary)
    } else {
        ConditionSpec::new(
            READY,
            Truth::True,
            CODE_IN_TWO_CLASSES,
            format!("{summary}; {}", ignored_wording(&ignored)),
        )
    };
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

/// What the ignored listings mean and how to mend them. The rules hold at most 64 × 256
/// codes, so only the first few are named: the message stays readable in `kubectl describe`.
fn ignored_wording(ignored: &[IgnoredListing]) -> String {
    const NAMED: usize = 3;
    let named: Vec<String> = ignored
        .iter()
        .take(NAMED)
        .map(|listing| {
            format!(
                "spec.classification[{}] lists {} as {}, but spec.classification[{}] already classes it {}",
                listing.rule,
                listing.code,
                listing.class.as_str(),
                listing.first_rule,
                listing.first_class.as_str()
            )
        })
        .collect();
    let more = match ignored.len().saturating_sub(NAMED) {
        0 => String::new(),
        rest => format!(" (and {rest} more)"),
    };
    format!(
        "{}{more}: the first matching rule wins, so those listings never take effect; remove each code from the rule whose class it should not get",
        named.join("; ")
    )
}

/// A condition whose status or reason changed (or that appeared), for an Event: (type, new
/// status, reason, message).
pub fn transitions(
    previous: &RetryPolicyStatus,
    next: &RetryPolicyStatus,
) -> Vec<(String, String, String, String)> {
    next.conditions
        .iter()
        .filter(|condition| {
            crate::api::conditions::find(&previous.conditions, &condition.type_)
                .is_none_or(|old| old.status != condition.status || old.reason != condition.reason)
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
    fn a_code_in_two_classes_is_named_with_the_fix_until_mended() {
        let mut two_classes = spec(5, "10s");
        two_classes.classification = serde_json::from_value(serde_json::json!([
            {"errorCodes": ["HTTP_503", "HTTP_429"], "class": "Transient"},
            {"errorCodes": ["HTTP_403", "HTTP_503"], "class": "Persistent"}
        ]))
        .unwrap();
        let first = next_status(
            &RetryPolicyStatus::default(),
            &two_classes,
            &[],
            Some(1),
            at(0),
        );
        let ready = find(&first.conditions, READY).unwrap();
        // Usable as written: the first rule classifies the code, as consumers do.
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", CODE_IN_TWO_CLASSES)
        );
        assert!(
            ready.message.ends_with(
                "spec.classification[1] lists HTTP_503 as Persistent, but spec.classification[0] already classes it Transient: the first matching rule wins, so those listings never take effect; remove each code from the rule whose class it should not get"
            ),
            "{}",
            ready.message
        );
        let mut mended = two_classes.clone();
        mended.classification[1].error_codes = vec!["HTTP_403".into()];
        let after = next_status(&first, &mended, &[], Some(2), at(10));
        let ready = find(&after.conditions, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", VALID)
        );
        // The reason changed while Ready stayed True: that is news too.
        let events = transitions(&first, &after);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].2, VALID);
    }

    #[test]
    fn many_ignored_listings_name_the_first_three() {
        let mut crowded = spec(5, "10s");
        let codes: Vec<String> = (0..10).map(|i| format!("E{i}")).collect();
        crowded.classification = serde_json::from_value(serde_json::json!([
            {"errorCodes": codes, "class": "Transient"},
            {"errorCodes": codes, "class": "Business"}
        ]))
        .unwrap();
        let status = next_status(&RetryPolicyStatus::default(), &crowded, &[], None, at(0));
        let ready = find(&status.conditions, READY).unwrap();
        assert!(
            ready.message.contains("lists E2 as Business"),
            "{}",
            ready.message
        );
        assert!(!ready.message.contains("lists E3"), "{}", ready.message);
        assert!(
            ready.message.contains(" (and 7 more): "),
            "{}",
            ready.message
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
