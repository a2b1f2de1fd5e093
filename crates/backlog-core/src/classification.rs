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

/// A code that a later rule lists under another class than the first rule listing it: the
/// first match wins, so that listing never takes effect. Almost always a mistake worth
/// telling the policy's owner (a code moved between classes, left behind in its old rule).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IgnoredListing {
    pub code: String,
    /// Index in `classification` of the rule whose listing is ignored, and its class.
    pub rule: usize,
    pub class: FailureClass,
    /// Index of the first rule listing the code, and the class the code gets.
    pub first_rule: usize,
    pub first_class: FailureClass,
}

/// Every listing of a code under a class other than the one [`classify`] gives it, in rule
/// order. A code listed again under the same class is redundant, not ignored.
pub fn ignored_listings(rules: &[ClassificationRule]) -> Vec<IgnoredListing> {
    let mut first: std::collections::HashMap<&str, (usize, FailureClass)> =
        std::collections::HashMap::new();
    let mut ignored = Vec::new();
    for (index, rule) in rules.iter().enumerate() {
        for code in &rule.error_codes {
            match first.get(code.as_str()) {
                Some(&(first_rule, first_class)) if first_class != rule.class => {
                    ignored.push(IgnoredListing {
                        code: code.clone(),
                        rule: index,
                        class: rule.class,
                        first_rule,
                        first_class,
                    });
                }
                Some(_) => {}
                None => {
                    first.insert(code, (index, rule.class));
                }
            }
        }
    }
    ignored
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

    #[test]
    fn a_code_listed_again_under_another_class_is_ignored_there() {
        let rules = [
            rule(&["HTTP_503", "HTTP_429"], FailureClass::Transient),
            rule(&["HTTP_403"], FailureClass::Persistent),
            rule(
                &["HTTP_503", "HTTP_403", "HTTP_429"],
                FailureClass::Persistent,
            ),
        ];
        let ignored = ignored_listings(&rules);
        let codes: Vec<(&str, usize, usize)> = ignored
            .iter()
            .map(|i| (i.code.as_str(), i.rule, i.first_rule))
            .collect();
        // HTTP_403 is listed twice under Persistent: redundant, not ignored.
        assert_eq!(codes, [("HTTP_503", 2, 0), ("HTTP_429", 2, 0)]);
        assert_eq!(ignored[0].first_class, FailureClass::Transient);
        assert_eq!(ignored[0].class, FailureClass::Persistent);
    }

    proptest! {
        #[test]
        fn an_ignored_listing_is_exactly_one_classify_overrules(rules in any_rules(), default in any_class()) {
            let ignored = ignored_listings(&rules);
            for listing in &ignored {
                prop_assert_eq!(classify(&rules, default, &listing.code), listing.first_class);
                prop_assert_ne!(listing.class, listing.first_class);
            }
            // Every listing not reported classifies as written.
            for (index, rule) in rules.iter().enumerate() {
                for code in &rule.error_codes {
                    let reported = ignored.iter().any(|i| i.rule == index && &i.code == code);
                    prop_assert_eq!(!reported, classify(&rules, default, code) == rule.class);
                }
            }
        }

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
