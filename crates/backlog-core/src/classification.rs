//! Mapping a consumer's error code to a failure class.
//!
//! The class, not the error, decides what happens next (seed 000, section 1): a timeout may be
//! a transient blip or a side effect whose acknowledgement was lost, so the policy names codes
//! explicitly and everything it does not name falls into `defaultClass` (by default `Unknown`,
//! which is reconciled, never retried blind).

use crate::retry_policy::{ClassificationRule, FailureClass};

/// The failure class of `error_code` under `rules`: the class of the first rule that lists the
/// code, or `default_class` when no rule does.
///
/// Matching is exact and case-sensitive, and the code is not trimmed: codes are identifiers the
/// consumer reports (`HTTP_503`, `PG_40001`), not free text. A linear scan is enough, since a
/// policy holds at most 64 rules and consumers classify once per failure, not per event.
///
/// ```
/// use backlog_core::retry_policy::{ClassificationRule, FailureClass};
/// use backlog_core::classification::classify;
///
/// let rules = vec![
///     ClassificationRule { error_codes: vec!["HTTP_503".into()], class: FailureClass::Transient },
///     ClassificationRule { error_codes: vec!["HTTP_503".into(), "HTTP_403".into()], class: FailureClass::Persistent },
/// ];
/// assert_eq!(classify(&rules, FailureClass::Unknown, "HTTP_503"), FailureClass::Transient);
/// assert_eq!(classify(&rules, FailureClass::Unknown, "HTTP_403"), FailureClass::Persistent);
/// assert_eq!(classify(&rules, FailureClass::Unknown, "HTTP_500"), FailureClass::Unknown);
/// ```
pub fn classify(
    rules: &[ClassificationRule],
    default_class: FailureClass,
    error_code: &str,
) -> FailureClass {
    rules
        .iter()
        .find(|rule| rule.error_codes.iter().any(|code| code == error_code))
        .map_or(default_class, |rule| rule.class)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rule(codes: &[&str], class: FailureClass) -> ClassificationRule {
        ClassificationRule {
            error_codes: codes.iter().map(|code| (*code).to_owned()).collect(),
            class,
        }
    }

    fn any_class() -> impl Strategy<Value = FailureClass> {
        prop_oneof![
            Just(FailureClass::Transient),
            Just(FailureClass::Persistent),
            Just(FailureClass::Business),
            Just(FailureClass::Unknown),
        ]
    }

    fn any_rules() -> impl Strategy<Value = Vec<ClassificationRule>> {
        prop::collection::vec(
            (prop::collection::vec("[A-E]{1,2}", 0..4), any_class())
                .prop_map(|(error_codes, class)| ClassificationRule { error_codes, class }),
            0..6,
        )
    }

    #[test]
    fn match_is_exact() {
        let rules = [rule(&["HTTP_503"], FailureClass::Transient)];
        assert_eq!(
            classify(&rules, FailureClass::Business, "HTTP_503"),
            FailureClass::Transient
        );
        for near_miss in ["http_503", "HTTP_503 ", "HTTP_5030", ""] {
            assert_eq!(
                classify(&rules, FailureClass::Business, near_miss),
                FailureClass::Business
            );
        }
    }

    #[test]
    fn no_rules_means_default() {
        assert_eq!(
            classify(&[], FailureClass::Unknown, "anything"),
            FailureClass::Unknown
        );
    }

    proptest! {
        #[test]
        fn first_listing_rule_wins(rules in any_rules(), default in any_class(), code in "[A-E]{1,2}") {
            let expected = rules
                .iter()
                .position(|rule| rule.error_codes.contains(&code))
                .map(|index| rules[index].class);
            let class = classify(&rules, default, &code);
            match expected {
                Some(first) => prop_assert_eq!(class, first),
                None => prop_assert_eq!(class, default),
            }
        }

        #[test]
        fn codes_no_rule_names_get_the_default(rules in any_rules(), default in any_class(), code in "[F-Z]{1,3}") {
            prop_assert_eq!(classify(&rules, default, &code), default);
        }

        #[test]
        fn later_rules_never_override_earlier_ones(rules in any_rules(), default in any_class(), code in "[A-E]{1,2}", class in any_class()) {
            let mut extended = rules.clone();
            extended.push(rule(&[code.as_str()], class));
            if rules.iter().any(|rule| rule.error_codes.contains(&code)) {
                prop_assert_eq!(classify(&extended, default, &code), classify(&rules, default, &code));
            } else {
                prop_assert_eq!(classify(&extended, default, &code), class);
            }
        }
    }
}
