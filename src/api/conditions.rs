//! Standard `metav1.Condition` handling shared by every kind.
//!
//! Conditions are computed by the pure core as [`ConditionSpec`]s (no time, no generation);
//! [`merge_conditions`] turns them into API conditions, keeping `lastTransitionTime` when a
//! condition's status did not change so that status is only rewritten when something happened.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

pub use crate::core::condition::{ConditionSpec, Truth};

/// Merges freshly decided conditions into the previous list.
///
/// A condition keeps its `lastTransitionTime` unless its status changed; conditions not named
/// in `decided` are kept as they were (another part of the controller owns them).
pub fn merge_conditions(
    previous: &[Condition],
    decided: &[ConditionSpec],
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let mut merged: Vec<Condition> = previous.to_vec();
    for spec in decided {
        let transition_time = previous
            .iter()
            .find(|c| c.type_ == spec.type_ && c.status == spec.status.as_str())
            .map(|c| c.last_transition_time.clone())
            .unwrap_or(Time(now));
        let condition = Condition {
            type_: spec.type_.to_owned(),
            status: spec.status.as_str().to_owned(),
            reason: spec.reason.clone(),
            message: spec.message.clone(),
            observed_generation: generation,
            last_transition_time: transition_time,
        };
        match merged.iter_mut().find(|c| c.type_ == spec.type_) {
            Some(existing) => *existing = condition,
            None => merged.push(condition),
        }
    }
    merged.sort_by(|a, b| a.type_.cmp(&b.type_));
    // Kept for as long as the object is (in the decision memory): without the slack a push
    // leaves (a budget's first status adds its conditions one by one).
    merged.shrink_to_fit();
    merged
}

/// The `status.conditions` of an object of one of the kinds.
pub trait StatusConditions {
    /// Empty while the object has no status.
    fn status_conditions(&self) -> &[Condition];
}

macro_rules! status_conditions {
    ($($kind:ty),*) => {$(
        impl StatusConditions for $kind {
            fn status_conditions(&self) -> &[Condition] {
                self.status
                    .as_ref()
                    .map_or(&[], |status| status.conditions.as_slice())
            }
        }
    )*};
}

status_conditions!(
    super::BacklogBudget,
    super::Compensation,
    super::ReplayJob,
    super::RetryPolicy
);

/// The condition of the given type, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of the given type is present and `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn keeps_transition_time_when_status_is_unchanged() {
        let first = merge_conditions(
            &[],
            &[ConditionSpec::new("Ready", Truth::True, "Valid", "ok")],
            Some(1),
            at(10),
        );
        let second = merge_conditions(
            &first,
            &[ConditionSpec::new(
                "Ready",
                Truth::True,
                "Valid",
                "still ok",
            )],
            Some(2),
            at(20),
        );
        assert_eq!(second[0].last_transition_time, Time(at(10)));
        assert_eq!(second[0].message, "still ok");
        assert_eq!(second[0].observed_generation, Some(2));
    }

    #[test]
    fn moves_transition_time_when_status_flips() {
        let first = merge_conditions(
            &[],
            &[ConditionSpec::new("Ready", Truth::True, "Valid", "ok")],
            Some(1),
            at(10),
        );
        let second = merge_conditions(
            &first,
            &[ConditionSpec::new("Ready", Truth::False, "Invalid", "bad")],
            Some(1),
            at(20),
        );
        assert_eq!(second[0].last_transition_time, Time(at(20)));
        assert_eq!(second[0].status, "False");
    }

    #[test]
    fn keeps_conditions_it_was_not_told_about_and_sorts_by_type() {
        let first = merge_conditions(
            &[],
            &[ConditionSpec::new("B", Truth::True, "R", "m")],
            None,
            at(1),
        );
        let second = merge_conditions(
            &first,
            &[ConditionSpec::new("A", Truth::False, "R", "m")],
            None,
            at(2),
        );
        let types: Vec<_> = second.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["A", "B"]);
    }
}
