//! One poll's queries for a budget, evaluated concurrently through the shared query cache.

use std::time::Duration;

use crate::api::backlog_budget::{BacklogBudget, EventClassStatus};
use crate::core::class_breaker::holds_backlog;
use crate::core::metric_input::Observation;
use crate::core::scaling::ScalingInputs;
use crate::metrics_source::MetricsSource;

use super::target::Workload;

/// The Prometheus a budget reads from, or why there is none.
pub fn prometheus_address(budget: &BacklogBudget, default: Option<&str>) -> Option<String> {
    budget
        .spec
        .prometheus
        .as_ref()
        .map(|p| p.address.clone())
        .or_else(|| default.map(str::to_owned))
}

/// Evaluates the budget's queries. Missing queries stay `None`; without a Prometheus every
/// query fails with the reason. `classes` are this poll's class states (the breaker has just
/// stepped), so a class paused now is out of this decision's input.
pub async fn gather(
    budget: &BacklogBudget,
    classes: &[EventClassStatus],
    address: Option<&str>,
    queries: &MetricsSource,
    workload: Workload,
    poll: Duration,
) -> ScalingInputs {
    let metrics = &budget.spec.metrics;
    // Another budget asking the same within half a poll gets the same evaluation.
    let max_age = poll / 2;
    let ask = |expression: Option<String>| async move {
        match (expression, address) {
            (None, _) => None,
            (Some(_), None) => Some(Observation::Failed(
                "no Prometheus: set spec.prometheus.address or start the operator with --prometheus-url"
                    .to_owned(),
            )),
            (Some(expression), Some(address)) => {
                Some(queries.query(address, &expression, max_age).await)
            }
        }
    };
    let paused: Vec<(String, String)> = budget
        .spec
        .event_classes
        .iter()
        .filter(|class| {
            classes
                .iter()
                .any(|s| s.name == class.name && holds_backlog(s.state))
        })
        .filter_map(|class| Some((class.name.clone(), class.backlog.clone()?)))
        .collect();
    let (
        backlog,
        oldest_age,
        produce_rate,
        completion_rate,
        retry_rate,
        quarantine_rate,
        partitions,
    ) = tokio::join!(
        ask(Some(metrics.backlog.clone())),
        ask(metrics.oldest_unfinished_age.clone()),
        ask(metrics.produce_rate.clone()),
        ask(metrics.completion_rate.clone()),
        ask(metrics.retry_rate.clone()),
        ask(metrics.quarantine_rate.clone()),
        ask(metrics.partitions.clone()),
    );
    let mut paused_class_backlogs = Vec::with_capacity(paused.len());
    for (class, expression) in paused {
        if let Some(observation) = ask(Some(expression)).await {
            paused_class_backlogs.push((class, observation));
        }
    }
    ScalingInputs {
        backlog: backlog.unwrap_or_else(|| Observation::Samples(vec![])),
        oldest_age,
        produce_rate,
        completion_rate,
        retry_rate,
        quarantine_rate,
        partitions,
        paused_class_backlogs,
        current_replicas: workload.replicas,
        ready_replicas: workload.ready,
        conflict: None,
    }
}
