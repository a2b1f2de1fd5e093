//! The `Synced` condition: whether the operator can currently reconcile an object, for the
//! failures no decision turns into a condition of its own (the API server unreachable, a
//! missing RBAC rule, a reconcile that hangs).
//!
//! A transient failure changes nothing a user sees until it has lasted [`DEFAULT_REPORT_AFTER`]
//! (one API server restart must not flap every object); a permanent one is said at once, with
//! the fix. The first success afterwards sets it back to `True`. It is written under a field
//! manager of its own, [`SYNCED_MANAGER`], so the controllers' whole-status writes (which
//! leave it out) never remove or resurrect it. Pure, but for nothing: the caller passes the
//! streak and the time.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::error::{Error, Persistence};
use crate::api::conditions::{ConditionSpec, Truth, find};
use crate::core::format::seconds;

/// The condition type.
pub const SYNCED: &str = "Synced";

/// The field manager of the `Synced` condition, and of nothing else.
pub const SYNCED_MANAGER: &str = "backlog-operator-synced";

/// How long transient failures last before they are reported (`--report-failures-after`).
pub const DEFAULT_REPORT_AFTER: Duration = Duration::from_secs(60);

/// Condition messages are read by people; an error chain longer than this says nothing more.
const MESSAGE_LIMIT: usize = 1024;

/// Consecutive failed reconciles of one object.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Streak {
    /// Failures so far, this one included.
    pub failures: u32,
    /// Since the first of them.
    pub failing_for: Duration,
}

/// The `Synced=False` condition to write after a failed reconcile, or `None` while the failure
/// is transient and younger than `report_after`, or already reported with the same reason in
/// `conditions` (each write of it is a watch event that reconciles again: rewriting it on
/// every failure would be a loop of failures and writes that skips the backoff).
pub fn after_failure(
    error: &Error,
    streak: Streak,
    report_after: Duration,
    conditions: &[Condition],
) -> Option<ConditionSpec> {
    let persistence = error.persistence();
    if persistence == Persistence::Transient && streak.failing_for < report_after {
        return None;
    }
    let reason = reason(error.kind());
    if find(conditions, SYNCED)
        .is_some_and(|c| c.status == Truth::False.as_str() && c.reason == reason)
    {
        return None;
    }
    let attempts = match streak.failures {
        1 => "1 attempt".to_owned(),
        n => format!("{n} attempts"),
    };
    let message = match persistence {
        Persistence::Transient => format!(
            "{}; failing for {} ({attempts}), retried with backoff; until it passes the operator changes nothing and the last decision stands",
            error.summary(),
            seconds(streak.failing_for.as_secs_f64())
        ),
        Persistence::Permanent => format!("{}; {} ({attempts})", error.summary(), fix(error)),
    };
    Some(ConditionSpec::new(
        SYNCED,
        Truth::False,
        reason,
        bounded(message),
    ))
}

/// The `Synced=True` condition to write after a successful reconcile, when `conditions` (the
/// object as the reconcile saw it) still say `False`.
pub fn after_success(conditions: &[Condition]) -> Option<ConditionSpec> {
    let reported = find(conditions, SYNCED)?;
    (reported.status != Truth::True.as_str()).then(|| {
        ConditionSpec::new(
            SYNCED,
            Truth::True,
            "Reconciled",
            "the operator reconciles this object again",
        )
    })
}

/// What a person does about a permanent failure.
fn fix(error: &Error) -> &'static str {
    match error.kind() {
        "api_forbidden" => {
            "grant the operator's ServiceAccount this verb on this resource: the chart's ClusterRole and Roles list what it needs"
        }
        "api_not_found" => {
            "the object or its kind is not served: create it, or correct the reference to it"
        }
        "api_invalid" => {
            "the API server refuses what the operator sends (an admission policy or webhook may forbid it): the message says which field"
        }
        "api_unauthorized" => {
            "the operator's credentials are refused: check its ServiceAccount token"
        }
        _ => {
            "the operator cannot go on with this object until this is fixed: its log has the details"
        }
    }
}

/// `api_server_error` → `ApiServerError`.
fn reason(kind: &str) -> String {
    kind.split('_')
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect()
}

fn bounded(message: String) -> String {
    if message.len() <= MESSAGE_LIMIT {
        return message;
    }
    let mut end = MESSAGE_LIMIT;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::error::{ApiCall, Verb};
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use proptest::prelude::*;

    fn api_error(code: u16, message: &str) -> Error {
        Error::api(
            ApiCall::on::<Deployment>(Verb::Apply, "shop", "orders").subresource("scale"),
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                message: message.to_owned(),
                ..kube::core::Status::default()
            })),
        )
    }

    fn streak(failures: u32, seconds: u64) -> Streak {
        Streak {
            failures,
            failing_for: Duration::from_secs(seconds),
        }
    }

    fn condition(status: &str) -> Condition {
        Condition {
            type_: SYNCED.to_owned(),
            status: status.to_owned(),
            reason: "x".into(),
            message: "x".into(),
            observed_generation: None,
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn a_transient_failure_is_quiet_until_it_lasts() {
        let unavailable = api_error(503, "etcdserver: leader changed");
        assert_eq!(
            after_failure(&unavailable, streak(5, 59), DEFAULT_REPORT_AFTER, &[]),
            None
        );
        let reported = after_failure(&unavailable, streak(6, 61), DEFAULT_REPORT_AFTER, &[])
            .expect("reported after a minute");
        assert_eq!(reported.status, Truth::False);
        assert_eq!(reported.reason, "ApiServerError");
        assert!(
            reported
                .message
                .contains("applying the scale of Deployment shop/orders"),
            "{}",
            reported.message
        );
        assert!(
            reported.message.contains("6 attempts"),
            "{}",
            reported.message
        );
        // Said once: the same reason already reported is not written again.
        let mut said = condition("False");
        said.reason = reported.reason.clone();
        assert_eq!(
            after_failure(
                &unavailable,
                streak(7, 70),
                DEFAULT_REPORT_AFTER,
                &[said.clone()]
            ),
            None
        );
        // Another reason is news.
        let forbidden = api_error(403, "forbidden");
        assert!(after_failure(&forbidden, streak(8, 80), DEFAULT_REPORT_AFTER, &[said]).is_some());
    }

    #[test]
    fn a_permanent_failure_is_said_at_once_with_the_fix() {
        let forbidden = api_error(403, "deployments.apps \"orders\" is forbidden");
        let reported =
            after_failure(&forbidden, streak(1, 0), DEFAULT_REPORT_AFTER, &[]).expect("at once");
        assert_eq!(reported.reason, "ApiForbidden");
        assert!(
            reported.message.contains("ServiceAccount"),
            "{}",
            reported.message
        );
        assert!(
            reported.message.contains("1 attempt)"),
            "{}",
            reported.message
        );
    }

    #[test]
    fn success_clears_only_a_reported_failure() {
        assert_eq!(after_success(&[]), None);
        assert_eq!(after_success(&[condition("True")]), None);
        let cleared = after_success(&[condition("False")]).expect("cleared");
        assert_eq!(cleared.status, Truth::True);
    }

    proptest! {
        /// Nothing transient is said before the threshold, everything is after it, and a
        /// permanent failure is always said; messages stay bounded.
        #[test]
        fn reports_follow_the_threshold(
            code in prop_oneof![Just(403u16), Just(404), Just(409), Just(429), Just(500), Just(503)],
            failures in 1u32..1000,
            lasted in 0u64..600,
            after in 0u64..600,
            long in 0usize..5000,
        ) {
            let error = api_error(code, &"x".repeat(long));
            let reported = after_failure(&error, streak(failures, lasted), Duration::from_secs(after), &[]);
            match error.persistence() {
                Persistence::Permanent => prop_assert!(reported.is_some()),
                Persistence::Transient => prop_assert_eq!(reported.is_some(), lasted >= after),
            }
            if let Some(condition) = reported {
                prop_assert!(condition.message.len() <= MESSAGE_LIMIT + '…'.len_utf8());
                prop_assert!(condition.reason.starts_with("Api"));
            }
        }
    }
}
