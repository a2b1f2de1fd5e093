//! CEL rules shared by the CRD schemas.
//!
//! The API server evaluates these, so a bad object is refused at `kubectl apply` with a
//! message that names the field and the fix, instead of being discovered by the operator.

use kube::core::{Message, Rule};

/// Go duration syntax without a sign (`250ms`, `30s`, `1h30m`). Checked before `duration()`
/// so a malformed string yields our message rather than a CEL evaluation error. At most five
/// digits per number keep any string the length limit allows far below Go's ~292-year
/// maximum, where `duration()` would fail instead of answering.
const GO_DURATION_PATTERN: &str = r"^([0-9]{1,5}(\\.[0-9]{1,9})?(ns|us|ms|s|m|h))+$";

/// The CEL expression "`expr` is a well-formed duration string".
pub fn is_duration(expr: &str) -> String {
    format!("{expr}.matches('{GO_DURATION_PATTERN}')")
}

fn rule(expression: String, message: String) -> Rule {
    Rule::new(expression).message(Message::Message(message))
}

/// Rule for a field that must hold a positive Go duration.
pub fn positive_duration(field: &str) -> Rule {
    rule(
        format!("{} && duration(self) > duration('0s')", is_duration("self")),
        format!(
            "{field} must be a positive duration such as 250ms, 30s or 5m (at most 5 digits per number)"
        ),
    )
}

/// Rule for a field that must hold a duration, zero allowed.
pub fn non_negative_duration(field: &str) -> Rule {
    rule(
        is_duration("self"),
        format!("{field} must be a duration such as 0s, 30s or 5m (at most 5 digits per number)"),
    )
}

/// Rule for a field that must hold a duration of at least `minimum` (a CEL duration literal).
pub fn duration_at_least_literal(field: &str, minimum: &str, example: &str) -> Rule {
    rule(
        format!(
            "{} && duration(self) >= duration('{minimum}')",
            is_duration("self")
        ),
        format!("{field} must be a duration of at least {minimum}, such as {example}"),
    )
}

/// Rule on an object: when both durations parse, `larger >= smaller`.
/// Unparsable values are reported by their own field rule, so this one stays quiet about them.
pub fn duration_at_least(larger: &str, smaller: &str, message: &str) -> Rule {
    let (l, s) = (format!("self.{larger}"), format!("self.{smaller}"));
    rule(
        format!(
            "!(has({l}) && has({s}) && {} && {}) || duration({l}) >= duration({s})",
            is_duration(&l),
            is_duration(&s)
        ),
        message.to_owned(),
    )
    .field_path(format!(".{larger}"))
}
