//! Condition `QueriesGrouped` (pure): with `metrics.groupBy`, whether every query the label
//! applies to shares a grouped evaluation, and which one is evaluated alone and why. A user who
//! opts in learns from it that the saving happens, or what to change; without the field the
//! condition is absent.

use k8s_openapi::jiff::Timestamp;

use crate::api::backlog_budget::{BacklogBudget, BacklogBudgetStatus};
use crate::api::conditions::{ConditionSpec, Truth, merge_conditions};
use crate::core::metric_input::Observation;
use crate::metrics_source::{Asking, Grouping, MetricsSource};

use super::inputs::peak_query;

pub const QUERIES_GROUPED: &str = "QueriesGrouped";

/// What `metrics.groupBy` made of a budget's queries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupingReport {
    pub label: String,
    /// The value of the label this budget's grouped queries read, first found.
    pub value: Option<String>,
    pub grouped: usize,
    /// (field, why) of each query evaluated alone.
    pub alone: Vec<(String, String)>,
}

/// Each query `metrics.groupBy` applies to, named by its field: the scaling queries (and the
/// 24-hour peak made of `produceRate`) and the event classes' queries. `partitionBacklog` is
/// grouped by partition already.
pub fn grouped_queries(budget: &BacklogBudget) -> Vec<(String, String)> {
    let metrics = &budget.spec.metrics;
    let mut queries = vec![("spec.metrics.backlog".to_owned(), metrics.backlog.clone())];
    for (field, expression) in [
        ("oldestUnfinishedAge", &metrics.oldest_unfinished_age),
        ("produceRate", &metrics.produce_rate),
        ("completionRate", &metrics.completion_rate),
        ("retryRate", &metrics.retry_rate),
        ("quarantineRate", &metrics.quarantine_rate),
        ("partitions", &metrics.partitions),
    ] {
        if let Some(expression) = expression {
            queries.push((format!("spec.metrics.{field}"), expression.clone()));
        }
    }
    if let Some(peak) = peak_query(budget) {
        // Grouped or not together with produceRate; named by it.
        queries.push((
            "spec.metrics.produceRate (its 24-hour peak)".to_owned(),
            peak,
        ));
    }
    for class in &budget.spec.event_classes {
        let field = |query: &str| format!("spec.eventClasses[{}].{query}", class.name);
        queries.push((field("failureRatio"), class.failure_ratio.clone()));
        queries.push((field("executionRate"), class.execution_rate.clone()));
        if let Some(backlog) = &class.backlog {
            queries.push((field("backlog"), backlog.clone()));
        }
    }
    queries
}

/// A budget's grouped forms of one poll: each is worked out once, and both the queries and
/// the report read it (the query cache does not remember them per expression).
#[derive(Debug, Default)]
pub struct Groupings {
    label: Option<String>,
    forms: Vec<(String, Grouping)>,
}

impl Groupings {
    /// The grouped form of each of the budget's grouped queries; none without `metrics.groupBy`.
    pub fn of(budget: &BacklogBudget, queries: &MetricsSource) -> Groupings {
        let Some(label) = budget.spec.metrics.group_by.clone() else {
            return Groupings::default();
        };
        let mut forms: Vec<(String, Grouping)> = Vec::new();
        for (_, expression) in grouped_queries(budget) {
            if !forms.iter().any(|(known, _)| *known == expression) {
                let form = queries.grouping(&expression, &label);
                forms.push((expression, form));
            }
        }
        Groupings {
            label: Some(label),
            forms,
        }
    }

    /// The result of `expression` for the budget ([`MetricsSource::query_for`]), from the
    /// form worked out for it.
    pub async fn query(
        &self,
        queries: &MetricsSource,
        address: Option<&str>,
        expression: &str,
        asking: Asking<'_>,
    ) -> Observation {
        queries
            .query_grouped(
                address,
                expression,
                self.form_of(expression, queries),
                asking,
            )
            .await
    }

    /// `expression`'s grouped form by the budget's label, for
    /// [`MetricsSource::query_grouped`]; `None` without `metrics.groupBy`.
    fn form_of<'a>(
        &'a self,
        expression: &str,
        queries: &MetricsSource,
    ) -> Option<(&'a str, Grouping)> {
        let label = self.label.as_deref()?;
        Some((label, self.form(expression, label, queries)))
    }

    /// The form worked out for `expression`, or, for one that is not among the budget's
    /// grouped queries, worked out now.
    fn form(&self, expression: &str, label: &str, queries: &MetricsSource) -> Grouping {
        match self.forms.iter().find(|(known, _)| known == expression) {
            Some((_, form)) => form.clone(),
            None => queries.grouping(expression, label),
        }
    }

    /// The report of the budget these are of.
    pub fn report(
        &self,
        budget: &BacklogBudget,
        queries: &MetricsSource,
    ) -> Option<GroupingReport> {
        report(budget, |expression, label| {
            self.form(expression, label, queries)
        })
    }
}

/// The report of a budget with `metrics.groupBy`, from each query's grouped form.
pub fn report<G>(budget: &BacklogBudget, grouping: G) -> Option<GroupingReport>
where
    G: Fn(&str, &str) -> Grouping,
{
    let label = budget.spec.metrics.group_by.clone()?;
    let mut report = GroupingReport {
        label,
        value: None,
        grouped: 0,
        alone: Vec::new(),
    };
    for (field, expression) in grouped_queries(budget) {
        match grouping(&expression, &report.label) {
            Ok(grouped) => {
                report.grouped += 1;
                report.value.get_or_insert_with(|| grouped.value.into());
            }
            Err(why) => report.alone.push((field, why.to_string())),
        }
    }
    Some(report)
}

/// The condition a report makes.
pub fn condition(report: &GroupingReport) -> ConditionSpec {
    let label = &report.label;
    if report.alone.is_empty() {
        let value = report.value.as_deref().unwrap_or_default();
        return ConditionSpec::new(
            QUERIES_GROUPED,
            Truth::True,
            "Grouped",
            format!(
                "all {} queries are answered from evaluations grouped by {label}, shared with every budget on the same Prometheus (this budget reads {label}=\"{value}\")",
                report.grouped
            ),
        );
    }
    let alone: Vec<String> = report
        .alone
        .iter()
        .map(|(field, why)| format!("{field}: {why}"))
        .collect();
    ConditionSpec::new(
        QUERIES_GROUPED,
        Truth::False,
        "NotGroupable",
        format!(
            "{} of {} queries are evaluated alone, once per budget: {}. To share a grouped evaluation, match {label}=\"…\" with = in every selector of the query, keep {label} in its aggregations and vector matches, and avoid functions that invent labels (absent, vector, scalar, label_replace, label_join)",
            report.alone.len(),
            report.alone.len() + report.grouped,
            alone.join("; ")
        ),
    )
}

/// The status with the condition of `report`, or without the condition when the budget does
/// not group its queries (any more).
pub fn record(
    mut status: BacklogBudgetStatus,
    report: Option<&GroupingReport>,
    generation: Option<i64>,
    now: Timestamp,
) -> BacklogBudgetStatus {
    match report {
        Some(report) => {
            status.conditions =
                merge_conditions(&status.conditions, &[condition(report)], generation, now);
        }
        None => status.conditions.retain(|c| c.type_ != QUERIES_GROUPED),
    }
    status
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::api::backlog_budget::BacklogBudgetSpec;

    fn budget(group_by: Option<&str>, completion_rate: &str) -> BacklogBudget {
        let mut spec: BacklogBudgetSpec = serde_json::from_value(serde_json::json!({
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "orders"},
            "minReplicas": 1,
            "maxReplicas": 4,
            "completionDeadline": "10m",
            "partitionCount": 4,
            "metrics": {
                "backlog": "sum(lag{consumergroup=\"orders\"})",
                "produceRate": "sum(rate(produced_total{consumergroup=\"orders\"}[1m]))",
                "completionRate": completion_rate,
            },
        }))
        .expect("a spec");
        spec.metrics.group_by = group_by.map(str::to_owned);
        BacklogBudget::new("orders", spec)
    }

    fn grouping(expression: &str, label: &str) -> Grouping {
        crate::metrics_source::grouping::group(expression, label).map_err(Arc::new)
    }

    /// A query cache whose server is never asked: grouped forms are worked out without one.
    fn never_asked() -> MetricsSource {
        struct Unreachable;
        impl crate::metrics_source::QueryBackend for Unreachable {
            fn instant(
                &self,
                _: &str,
                _: &str,
                _: std::time::Duration,
            ) -> crate::metrics_source::QueryFuture {
                Box::pin(async { panic!("no query is sent") })
            }
        }
        MetricsSource::new(Arc::new(Unreachable), 1, std::time::Duration::from_secs(1))
    }

    #[test]
    fn a_poll_works_each_form_out_once_and_reads_the_same_as_the_pure_rewrite() {
        let queries = never_asked();
        for completion_rate in [
            "sum(rate(done_total{consumergroup=\"orders\"}[1m]))",
            "sum(rate(done_total[1m])) or vector(0)",
            // The same expression as another query: one form for both.
            "sum(lag{consumergroup=\"orders\"})",
        ] {
            let budget = budget(Some("consumergroup"), completion_rate);
            let groupings = Groupings::of(&budget, &queries);
            let distinct: std::collections::HashSet<String> = grouped_queries(&budget)
                .into_iter()
                .map(|(_, e)| e)
                .collect();
            assert_eq!(groupings.forms.len(), distinct.len());
            assert_eq!(
                groupings.report(&budget, &queries),
                report(&budget, grouping)
            );
            for expression in distinct
                .iter()
                .chain([&"max(age{consumergroup=\"x\"})".to_owned()])
            {
                let (label, form) = groupings
                    .form_of(expression, &queries)
                    .expect("groupBy is set");
                assert_eq!(label, "consumergroup");
                assert_eq!(form, grouping(expression, label), "{expression}");
            }
        }
        let without = budget(None, "sum(rate(done_total[1m]))");
        let groupings = Groupings::of(&without, &queries);
        assert!(groupings.forms.is_empty());
        assert!(groupings.form_of("sum(lag)", &queries).is_none());
        assert_eq!(groupings.report(&without, &queries), None);
    }

    #[test]
    fn every_groupable_query_is_grouped_and_the_condition_says_so() {
        let budget = budget(
            Some("consumergroup"),
            "sum(rate(done_total{consumergroup=\"orders\"}[1m]))",
        );
        let report = report(&budget, grouping).expect("groupBy is set");
        // backlog, produceRate, its peak and completionRate.
        assert_eq!(report.grouped, 4);
        assert_eq!(report.value.as_deref(), Some("orders"));
        let condition = condition(&report);
        assert_eq!(condition.status, Truth::True);
        assert!(condition.message.contains("consumergroup=\"orders\""));
    }

    #[test]
    fn a_query_evaluated_alone_is_named_with_the_reason_and_the_fix() {
        let budget = budget(
            Some("consumergroup"),
            "sum(rate(done_total[1m])) or vector(0)",
        );
        let report = report(&budget, grouping).expect("groupBy is set");
        assert_eq!(report.grouped, 3);
        let condition = condition(&report);
        assert_eq!(condition.status, Truth::False);
        assert_eq!(condition.reason, "NotGroupable");
        assert!(
            condition.message.starts_with(
                "1 of 4 queries are evaluated alone, once per budget: spec.metrics.completionRate:"
            ),
            "{}",
            condition.message
        );
    }

    #[test]
    fn without_group_by_there_is_no_report_and_the_condition_goes() {
        let grouped = budget(Some("consumergroup"), "sum(done{consumergroup=\"orders\"})");
        let status = record(
            BacklogBudgetStatus::default(),
            report(&grouped, grouping).as_ref(),
            Some(1),
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(status.conditions.len(), 1);
        let plain = budget(None, "sum(done{consumergroup=\"orders\"})");
        assert_eq!(report(&plain, grouping), None);
        let status = record(status, None, Some(2), Timestamp::UNIX_EPOCH);
        assert!(status.conditions.is_empty());
    }
}
