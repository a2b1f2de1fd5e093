//! Which expressions can share one grouped evaluation (pure).
//!
//! A thousand budgets that each ask `sum(kafka_consumergroup_lag{consumergroup="orders"})` with
//! their own group differ only in one label's value. With `metrics.groupBy: consumergroup` the
//! operator rewrites each expression into the one they have in common,
//! `sum by (consumergroup) (kafka_consumergroup_lag{consumergroup!=""})`, evaluates that once
//! per poll, and gives every budget the series of its own value.
//!
//! The rewrite is made on the parsed expression and only where it is provably the same answer
//! per value: every selector matches the label with `=` once and all to the same value, every
//! aggregation keeps the label (it is added to `by`; `without` must not name it), vector
//! matching does not ignore it, and no function invents or renames labels (`absent`, `vector`,
//! `scalar`, `label_replace`, …). Anything else is evaluated alone, and says why.

use std::sync::Arc;

use promql_parser::label::{Labels, MatchOp, Matcher};
use promql_parser::parser::{self, Expr, LabelModifier};
use thiserror::Error;

/// An expression as one value of a shared, grouped evaluation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grouped {
    /// The expression every value has in common, grouped by the label: one text for all the
    /// expressions that share it ([`super::MetricsSource::grouping`] interns it).
    pub shared: Arc<str>,
    /// This expression's value of the label.
    pub value: Box<str>,
}

/// Why an expression is evaluated alone.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum NotGroupable {
    #[error("it does not parse as PromQL ({0})")]
    Unparsable(String),
    #[error("no selector matches {label}=\"…\"")]
    NoMatcher { label: String },
    #[error("selector {selector} does not match {label} with = exactly once")]
    SelectorWithout { selector: String, label: String },
    #[error("its selectors match different values of {label} ({first:?} and {second:?})")]
    ValuesDiffer {
        label: String,
        first: String,
        second: String,
    },
    #[error("selector {0} has `or` alternatives")]
    Alternatives(String),
    #[error("{0}() invents or renames labels")]
    Function(String),
    #[error("an aggregation drops {0} (without)")]
    Dropped(String),
    #[error("a vector match ignores {0}")]
    Ignored(String),
    #[error("the parameter of {0} reads series")]
    SeriesParameter(String),
    #[error("it holds an expression the operator does not know")]
    Unknown,
    #[error("its grouped form does not read back the same")]
    NotFaithful,
}

/// Functions whose result is not the per-value answer when evaluated over every value at once:
/// they make labels up from matchers or arguments, or turn vectors into scalars.
const LABEL_CHANGING: &[&str] = &[
    "absent",
    "absent_over_time",
    "scalar",
    "vector",
    "label_replace",
    "label_join",
    "info",
];

/// The grouped form of `expression` by `label`, or why there is none.
pub fn group(expression: &str, label: &str) -> Result<Grouped, NotGroupable> {
    let (shared, value) = rewritten(expression, label)?;
    if !reads_back_the_same(&shared) {
        return Err(NotGroupable::NotFaithful);
    }
    Ok(Grouped {
        shared: shared.into(),
        value,
    })
}

/// The printed grouped form of `expression` by `label` and its value of the label, before
/// the check that the printed form reads back the same ([`reads_back_the_same`]): a check
/// that depends on the shared form alone, so it is made once per shared form, not per
/// expression.
pub fn rewritten(expression: &str, label: &str) -> Result<(String, Box<str>), NotGroupable> {
    let mut expr = parser::parse(expression).map_err(NotGroupable::Unparsable)?;
    let mut value = None;
    rewrite(&mut expr, label, &mut value)?;
    let value = value.ok_or_else(|| NotGroupable::NoMatcher {
        label: label.to_owned(),
    })?;
    Ok((expr.to_string(), value.into_boxed_str()))
}

/// Whether a printed grouped form parses back to what prints the same: what is sent is the
/// printed form.
pub fn reads_back_the_same(shared: &str) -> bool {
    matches!(parser::parse(shared), Ok(back) if back.to_string() == shared)
}

fn rewrite(expr: &mut Expr, label: &str, value: &mut Option<String>) -> Result<(), NotGroupable> {
    match expr {
        Expr::VectorSelector(selector) => select_all(selector, label, value),
        Expr::MatrixSelector(matrix) => select_all(&mut matrix.vs, label, value),
        Expr::Aggregate(aggregate) => {
            if let Some(param) = &aggregate.param
                && reads_series(param)
            {
                return Err(NotGroupable::SeriesParameter(aggregate.op.to_string()));
            }
            aggregate.modifier = Some(keeping(aggregate.modifier.take(), label)?);
            rewrite(&mut aggregate.expr, label, value)
        }
        Expr::Call(call) => {
            if LABEL_CHANGING.contains(&call.func.name) {
                return Err(NotGroupable::Function(call.func.name.to_owned()));
            }
            call.args
                .args
                .iter_mut()
                .try_for_each(|arg| rewrite(arg, label, value))
        }
        Expr::Binary(binary) => {
            if let Some(matching) = binary
                .modifier
                .as_mut()
                .and_then(|modifier| modifier.matching.as_mut())
            {
                match matching {
                    LabelModifier::Include(on) => add(on, label),
                    LabelModifier::Exclude(ignoring) if has(ignoring, label) => {
                        return Err(NotGroupable::Ignored(label.to_owned()));
                    }
                    LabelModifier::Exclude(_) => {}
                }
            }
            rewrite(&mut binary.lhs, label, value)?;
            rewrite(&mut binary.rhs, label, value)
        }
        Expr::Paren(paren) => rewrite(&mut paren.expr, label, value),
        Expr::Unary(unary) => rewrite(&mut unary.expr, label, value),
        Expr::Subquery(subquery) => rewrite(&mut subquery.expr, label, value),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) => Ok(()),
        Expr::Extension(_) => Err(NotGroupable::Unknown),
    }
}

/// Replaces the selector's `label="v"` by `label!=""` (every value), noting `v`.
fn select_all(
    selector: &mut parser::VectorSelector,
    label: &str,
    value: &mut Option<String>,
) -> Result<(), NotGroupable> {
    if !selector.matchers.or_matchers.is_empty() {
        return Err(NotGroupable::Alternatives(selector.to_string()));
    }
    let on_label: Vec<usize> = selector
        .matchers
        .matchers
        .iter()
        .enumerate()
        .filter(|(_, matcher)| matcher.name == label)
        .map(|(i, _)| i)
        .collect();
    let index = match on_label.as_slice() {
        [index] if selector.matchers.matchers[*index].op == MatchOp::Equal => *index,
        _ => {
            return Err(NotGroupable::SelectorWithout {
                selector: selector.to_string(),
                label: label.to_owned(),
            });
        }
    };
    let mine = std::mem::replace(
        &mut selector.matchers.matchers[index],
        Matcher::new(MatchOp::NotEqual, label, ""),
    )
    .value;
    match value {
        Some(first) if *first != mine => Err(NotGroupable::ValuesDiffer {
            label: label.to_owned(),
            first: first.clone(),
            second: mine,
        }),
        Some(_) => Ok(()),
        None => {
            *value = Some(mine);
            Ok(())
        }
    }
}

/// An aggregation's modifier that keeps `label` in its result.
fn keeping(modifier: Option<LabelModifier>, label: &str) -> Result<LabelModifier, NotGroupable> {
    match modifier {
        None => Ok(LabelModifier::Include(Labels::new(vec![label]))),
        Some(LabelModifier::Include(mut by)) => {
            add(&mut by, label);
            Ok(LabelModifier::Include(by))
        }
        Some(LabelModifier::Exclude(without)) if has(&without, label) => {
            Err(NotGroupable::Dropped(label.to_owned()))
        }
        Some(without) => Ok(without),
    }
}

fn has(labels: &Labels, label: &str) -> bool {
    labels.labels.iter().any(|l| l == label)
}

fn add(labels: &mut Labels, label: &str) {
    if !has(labels, label) {
        labels.labels.push(label.to_owned());
    }
}

/// Whether evaluating `expr` reads any series.
fn reads_series(expr: &Expr) -> bool {
    match expr {
        Expr::VectorSelector(_) | Expr::MatrixSelector(_) | Expr::Extension(_) => true,
        Expr::Aggregate(aggregate) => {
            reads_series(&aggregate.expr) || aggregate.param.as_deref().is_some_and(reads_series)
        }
        Expr::Call(call) => call.args.args.iter().any(|arg| reads_series(arg)),
        Expr::Binary(binary) => reads_series(&binary.lhs) || reads_series(&binary.rhs),
        Expr::Paren(paren) => reads_series(&paren.expr),
        Expr::Unary(unary) => reads_series(&unary.expr),
        Expr::Subquery(subquery) => reads_series(&subquery.expr),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LABEL: &str = "consumergroup";

    fn shared(expression: &str) -> String {
        match group(expression, LABEL) {
            Ok(grouped) => grouped.shared.to_string(),
            Err(reason) => panic!("{expression} is groupable: {reason}"),
        }
    }

    #[test]
    fn budgets_that_differ_in_the_label_value_share_one_expression() {
        let orders = group(
            r#"sum(kafka_consumergroup_lag{consumergroup="orders", topic="t"})"#,
            LABEL,
        )
        .expect("groupable");
        let billing = group(
            r#"sum( kafka_consumergroup_lag{topic="t",consumergroup="billing"} )"#,
            LABEL,
        )
        .expect("groupable");
        assert_eq!(&*orders.value, "orders");
        assert_eq!(&*billing.value, "billing");
        assert_eq!(orders.shared, billing.shared);
        assert_eq!(
            parser::parse(&orders.shared).expect("parses"),
            parser::parse(
                r#"sum by (consumergroup) (kafka_consumergroup_lag{consumergroup!="", topic="t"})"#
            )
            .expect("parses")
        );
    }

    #[test]
    fn every_aggregation_and_match_keeps_the_label() {
        for (expression, expected) in [
            (
                r#"max(time() - oldest_unfinished_timestamp{consumergroup="a"})"#,
                r#"max by (consumergroup) (time() - oldest_unfinished_timestamp{consumergroup!=""})"#,
            ),
            (
                r#"sum by (topic) (rate(done_total{consumergroup="a"}[1m]))"#,
                r#"sum by (topic, consumergroup) (rate(done_total{consumergroup!=""}[1m]))"#,
            ),
            (
                r#"sum without (instance) (lag{consumergroup="a"})"#,
                r#"sum without (instance) (lag{consumergroup!=""})"#,
            ),
            (
                r#"sum(rate(a{consumergroup="a"}[5m])) / on (topic) sum(rate(b{consumergroup="a"}[5m]))"#,
                r#"sum by (consumergroup) (rate(a{consumergroup!=""}[5m])) / on (topic, consumergroup) sum by (consumergroup) (rate(b{consumergroup!=""}[5m]))"#,
            ),
            (
                r#"max_over_time((sum(rate(p{consumergroup="a"}[1m])))[24h:])"#,
                r#"max_over_time((sum by (consumergroup) (rate(p{consumergroup!=""}[1m])))[24h:])"#,
            ),
            (
                r#"max_over_time((sum(rate(p{consumergroup="a"}[1m])))[24h:15s])"#,
                r#"max_over_time((sum by (consumergroup) (rate(p{consumergroup!=""}[1m])))[24h:15s])"#,
            ),
            (
                r#"histogram_quantile(0.99, sum by (le) (rate(d_bucket{consumergroup="a"}[5m])))"#,
                r#"histogram_quantile(0.99, sum by (le, consumergroup) (rate(d_bucket{consumergroup!=""}[5m])))"#,
            ),
            (
                r#"topk(1, lag{consumergroup="a"}) * 2"#,
                r#"topk by (consumergroup) (1, lag{consumergroup!=""}) * 2"#,
            ),
        ] {
            assert_eq!(
                parser::parse(&shared(expression)).expect("parses"),
                parser::parse(expected).expect("parses"),
                "{expression}"
            );
        }
    }

    #[test]
    fn expressions_that_would_answer_differently_are_evaluated_alone() {
        for (expression, why) in [
            (r#"sum(lag{topic="t"})"#, "does not match consumergroup"),
            ("time() - 5", "no selector matches"),
            (
                r#"sum(lag{consumergroup="a"}) + sum(other)"#,
                "does not match consumergroup",
            ),
            (
                r#"sum(lag{consumergroup=~"a|b"})"#,
                "does not match consumergroup",
            ),
            (
                r#"sum(lag{consumergroup="a"}) / sum(done{consumergroup="b"})"#,
                "different values",
            ),
            (r#"sum(lag{consumergroup="a"}) or vector(0)"#, "vector()"),
            (r#"absent(lag{consumergroup="a"})"#, "absent()"),
            (
                r#"label_replace(lag{consumergroup="a"}, "consumergroup", "x", "", "")"#,
                "label_replace()",
            ),
            (
                r#"sum without (consumergroup) (lag{consumergroup="a"})"#,
                "drops consumergroup",
            ),
            (
                r#"lag{consumergroup="a"} / ignoring (consumergroup) done{consumergroup="a"}"#,
                "ignores consumergroup",
            ),
            (
                r#"topk(scalar(n{consumergroup="a"}), lag{consumergroup="a"})"#,
                "reads series",
            ),
            ("sum(lag{", "does not parse"),
        ] {
            let reason = group(expression, LABEL).expect_err(expression).to_string();
            assert!(reason.contains(why), "{expression}: {reason}");
        }
    }

    proptest::proptest! {
        /// Whatever the value, it is what the budget reads, and the shared expression does not
        /// depend on it.
        #[test]
        fn any_label_value_is_read_back_and_shares_the_expression(value in "\\PC{1,24}") {
            let template = |v: &str| format!(
                "sum(rate(done_total{{consumergroup=\"{}\", topic=\"t\"}}[1m]))",
                v.replace('\\', "\\\\").replace('"', "\\\"")
            );
            let mine = group(&template(&value), LABEL).expect("groupable");
            let other = group(&template("other"), LABEL).expect("groupable");
            proptest::prop_assert_eq!(&*mine.value, value.as_str());
            proptest::prop_assert_eq!(mine.shared, other.shared);
        }
    }

    #[test]
    fn label_values_with_quotes_and_escapes_are_kept_exactly() {
        let grouped =
            group(r#"sum(lag{consumergroup="a\"b\\c", x="y\"z"})"#, LABEL).expect("groupable");
        assert_eq!(&*grouped.value, "a\"b\\c");
        assert!(grouped.shared.contains(r#"x="y\"z""#), "{}", grouped.shared);
    }
}
