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

/// Rule for a duration field that must not exceed `maximum` (a CEL duration literal); a
/// malformed value is reported by the field's own rule.
pub fn duration_at_most(field: &str, maximum: &str, why: &str) -> Rule {
    rule(
        format!(
            "!{} || duration(self) <= duration('{maximum}')",
            is_duration("self")
        ),
        format!("{field} must be at most {maximum}: {why}"),
    )
}

/// Rule for a duration field that must be at least `minimum` (a CEL duration literal); a
/// malformed value is reported by the field's own rule.
pub fn duration_not_below(field: &str, minimum: &str, why: &str) -> Rule {
    rule(
        format!(
            "!{} || duration(self) >= duration('{minimum}')",
            is_duration("self")
        ),
        format!("{field} must be at least {minimum}: {why}"),
    )
}

/// Rule on an object: when both durations are set and parse, `shorter < longer` (or `<=` with
/// `equal_allowed`). Each path
/// is a list of field names from `self`, so optional parents are tested with `has` first;
/// `field_path` (such as `.completionDeadline`) is the field the refusal names.
pub fn duration_shorter(
    shorter: &[&str],
    longer: &[&str],
    equal_allowed: bool,
    message: &str,
    field_path: &str,
) -> Rule {
    let present = |path: &[&str]| {
        (1..=path.len())
            .map(|n| format!("has(self.{})", path[..n].join(".")))
            .collect::<Vec<_>>()
            .join(" && ")
    };
    let (s, l) = (
        format!("self.{}", shorter.join(".")),
        format!("self.{}", longer.join(".")),
    );
    rule(
        format!(
            "!({} && {} && {} && {}) || duration({s}) {} duration({l})",
            present(shorter),
            present(longer),
            is_duration(&s),
            is_duration(&l),
            if equal_allowed { "<=" } else { "<" }
        ),
        message.to_owned(),
    )
    .field_path(field_path.to_owned())
}

/// A character that does not show: whitespace, a Unicode separator (a no-break or ideographic
/// space), a control or format character (a zero-width space). RE2's `\s` and `\S` know only
/// ASCII whitespace.
pub const INVISIBLE_CHARACTER: &str = r"[\\s\\pZ\\pC]";

/// A character that shows: the complement of [`INVISIBLE_CHARACTER`].
pub const VISIBLE_CHARACTER: &str = r"[^\\s\\pZ\\pC]";

/// A DNS subdomain (RFC 1123), the form of most object names; unanchored.
pub const DNS_SUBDOMAIN: &str = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";

/// The CEL expression "`expr` neither begins nor ends with an invisible character" (and is
/// not blank).
pub fn is_trimmed(expr: &str) -> String {
    format!("{expr}.matches('^{VISIBLE_CHARACTER}(.*{VISIBLE_CHARACTER})?$')")
}

/// Rule for a value compared or looked up exactly (an id, a key, a version): it must not
/// begin or end with whitespace or an invisible character, which a reader trims or cannot see
/// and a comparison does not ignore.
pub fn no_edge_space(field: &str, why: &str) -> Rule {
    rule(
        is_trimmed("self"),
        format!("{field} must not begin or end with a space or an invisible character: {why}"),
    )
}

/// Rule for a text field that must hold more than whitespace: a blank reason, query or
/// reference passes `minLength` and says nothing.
pub fn not_blank(field: &str, what: &str) -> Rule {
    rule(
        format!("self.matches('{VISIBLE_CHARACTER}')"),
        format!("{field} must not be blank: {what}"),
    )
}

/// Schema transform for an approval's `specSha256`: absent, it decodes as empty (an approval
/// stored before the field existed must not stop the operator from reading the whole list of
/// its kind), yet the API server requires it. Drops the default serde's `default` puts in the
/// schema (an empty digest is no valid default) and lists the field as required.
pub fn require_spec_sha256(schema: &mut schemars::Schema) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    if let Some(field) = object
        .get_mut("properties")
        .and_then(|properties| properties.get_mut("specSha256"))
        .and_then(|field| field.as_object_mut())
    {
        field.remove("default");
    }
    match object
        .get_mut("required")
        .and_then(|required| required.as_array_mut())
    {
        Some(required) => required.push("specSha256".into()),
        None => {
            object.insert("required".into(), serde_json::json!(["specSha256"]));
        }
    }
}
