//! One poll's queries for a budget, evaluated concurrently through the shared query cache, and
//! the scaling inputs made of them (pure).

use std::time::Duration;

use crate::api::backlog_budget::{BacklogBudget, EventClassStatus};
use crate::core::class_breaker::holds_backlog;
use crate::core::metric_input::Observation;
use crate::core::partition_skew::PartitionSample;
use crate::core::scaling::ScalingInputs;
use crate::metrics_source::{Asking, MetricsSource};

use super::classes::ClassObservations;
use super::grouping::Groupings;
use super::target::Workload;

/// The Prometheus a budget reads from, or `None` when neither the budget nor the operator
/// names one.
pub fn prometheus_address(budget: &BacklogBudget, default: Option<&str>) -> Option<String> {
    budget
        .spec
        .prometheus
        .as_ref()
        .map(|p| p.address.clone())
        .or_else(|| default.map(str::to_owned))
}

/// What the scaling queries returned. Queries the spec does not configure stay `None`.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricObservations {
    pub backlog: Observation,
    pub oldest_age: Option<Observation>,
    pub produce_rate: Option<Observation>,
    pub completion_rate: Option<Observation>,
    pub retry_rate: Option<Observation>,
    pub quarantine_rate: Option<Observation>,
    pub partitions: Option<Observation>,
    /// `metrics.partitionBacklog`: (partition label, value) per series.
    pub partition_backlogs: Option<Result<Vec<(String, f64)>, String>>,
    /// The highest produce rate of the last 24 hours, for the capacity plan check.
    pub peak_produce_rate: Option<Observation>,
    /// The `backlog` query of every class that has one, in spec order. Only the classes held
    /// after this poll's breaker step are taken out of the scaling input; the others are
    /// asked anyway so that one gathering serves whatever the step decides.
    pub class_backlogs: Vec<(String, Observation)>,
}

/// How long the 24-hour peak is reused: it moves slowly, and its subquery is the dearest.
pub const PEAK_REFRESH: Duration = Duration::from_secs(300);

/// The budget's 24-hour peak of `metrics.produceRate`: its highest value over the last 24
/// hours, sampled once per poll, the resolution the budget reads at. Without a resolution a
/// subquery steps at the server's evaluation interval, which the operator does not choose: at
/// one second that is 86,400 steps per series, seconds of the server's CPU for one grouped
/// query of thousands of budgets, which their first polls wait for. `None` without a produce
/// rate or with a poll interval that does not parse (such a spec is never queried).
pub fn peak_query(budget: &BacklogBudget) -> Option<String> {
    let expression = budget.spec.metrics.produce_rate.as_deref()?;
    let poll = crate::consumer::parse_go_duration(&budget.spec.poll_interval).ok()?;
    // The expression ends its own line: a `#` comment in it would swallow the rest.
    Some(format!(
        "max_over_time(({expression}\n)[24h:{}])",
        promql_duration(poll)
    ))
}

/// `duration` as PromQL writes one: whole seconds, or whole milliseconds (at least one).
fn promql_duration(duration: Duration) -> String {
    let millis = duration.as_millis().max(1);
    if millis.is_multiple_of(1000) {
        format!("{}s", millis / 1000)
    } else {
        format!("{millis}ms")
    }
}

/// Evaluates the budget's scaling queries; without a Prometheus each fails with the reason.
pub async fn observe_metrics(
    budget: &BacklogBudget,
    address: Option<&str>,
    queries: &MetricsSource,
    groupings: &Groupings,
    poll: Duration,
) -> MetricObservations {
    let metrics = &budget.spec.metrics;
    let asker = super::wakes::asker(budget);
    let asking = Asking {
        asker: &asker,
        every: poll,
    };
    let ask = |expression: Option<String>| async move {
        match expression {
            None => None,
            Some(expression) => Some(groupings.query(queries, address, &expression, asking).await),
        }
    };
    let class_queries: Vec<(String, String)> = budget
        .spec
        .event_classes
        .iter()
        .filter_map(|class| Some((class.name.clone(), class.backlog.clone()?)))
        .collect();
    let class_backlogs = futures::future::join_all(class_queries.into_iter().map(
        |(class, expression)| async move {
            let observation = groupings.query(queries, address, &expression, asking).await;
            (class, observation)
        },
    ));
    let peak = async {
        match peak_query(budget) {
            None => None,
            Some(expression) => Some(
                groupings
                    .query(
                        queries,
                        address,
                        &expression,
                        Asking {
                            every: PEAK_REFRESH.max(poll),
                            ..asking
                        },
                    )
                    .await,
            ),
        }
    };
    let partition_backlogs = async {
        match &metrics.partition_backlog {
            None => None,
            Some(expression) => Some(
                queries
                    .query_by_label(address, expression, PARTITION_LABEL, poll)
                    .await,
            ),
        }
    };
    let (
        backlog,
        oldest_age,
        produce_rate,
        completion_rate,
        retry_rate,
        quarantine_rate,
        partitions,
        peak_produce_rate,
        class_backlogs,
        partition_backlogs,
    ) = tokio::join!(
        ask(Some(metrics.backlog.clone())),
        ask(metrics.oldest_unfinished_age.clone()),
        ask(metrics.produce_rate.clone()),
        ask(metrics.completion_rate.clone()),
        ask(metrics.retry_rate.clone()),
        ask(metrics.quarantine_rate.clone()),
        ask(metrics.partitions.clone()),
        peak,
        class_backlogs,
        partition_backlogs,
    );
    MetricObservations {
        backlog: backlog.unwrap_or_else(|| Observation::Samples(vec![])),
        oldest_age,
        produce_rate,
        completion_rate,
        retry_rate,
        quarantine_rate,
        partitions,
        partition_backlogs,
        peak_produce_rate,
        class_backlogs,
    }
}

/// The label that names a series of `metrics.partitionBacklog`.
pub const PARTITION_LABEL: &str = "partition";

/// Evaluates each class's `failureRatio` and `executionRate`, in spec order.
pub async fn observe_classes(
    budget: &BacklogBudget,
    address: Option<&str>,
    queries: &MetricsSource,
    groupings: &Groupings,
    poll: Duration,
) -> Vec<ClassObservations> {
    let asker = super::wakes::asker(budget);
    let asking = Asking {
        asker: &asker,
        every: poll,
    };
    futures::future::join_all(budget.spec.event_classes.iter().map(|class| async move {
        let (failure_ratio, execution_rate) = tokio::join!(
            groupings.query(queries, address, &class.failure_ratio, asking),
            groupings.query(queries, address, &class.execution_rate, asking),
        );
        ClassObservations {
            failure_ratio,
            execution_rate,
        }
    }))
    .await
}

/// The scaling inputs of one poll (pure). `classes` are this poll's class states (the breaker
/// has just stepped), so a class paused now is out of this decision's input.
pub fn scaling_inputs(
    observed: &MetricObservations,
    classes: &[EventClassStatus],
    workload: Workload,
) -> ScalingInputs {
    let held = |name: &str| {
        classes
            .iter()
            .any(|status| status.name == name && holds_backlog(status.state))
    };
    ScalingInputs {
        backlog: observed.backlog.clone(),
        oldest_age: observed.oldest_age.clone(),
        produce_rate: observed.produce_rate.clone(),
        completion_rate: observed.completion_rate.clone(),
        retry_rate: observed.retry_rate.clone(),
        quarantine_rate: observed.quarantine_rate.clone(),
        partitions: observed.partitions.clone(),
        paused_class_backlogs: observed
            .class_backlogs
            .iter()
            .filter(|(class, _)| held(class))
            .cloned()
            .collect(),
        current_replicas: workload.replicas,
        ready_replicas: workload.ready,
        conflict: None,
        // Informational: a failed or empty per-partition query only turns the skew check off.
        partition_backlogs: match &observed.partition_backlogs {
            Some(Ok(series)) if !series.is_empty() => Some(
                series
                    .iter()
                    .map(|(partition, backlog)| PartitionSample {
                        partition: partition.clone(),
                        backlog: *backlog,
                    })
                    .collect(),
            ),
            _ => None,
        },
    }
}

/// The inputs when another autoscaler owns the target: no queries, no scaling.
pub fn conflict_inputs(owner: &str, workload: Workload) -> ScalingInputs {
    ScalingInputs {
        backlog: Observation::Samples(vec![]),
        oldest_age: None,
        produce_rate: None,
        completion_rate: None,
        retry_rate: None,
        quarantine_rate: None,
        partitions: None,
        paused_class_backlogs: vec![],
        current_replicas: workload.replicas,
        ready_replicas: workload.ready,
        conflict: Some(owner.to_owned()),
        partition_backlogs: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::backlog_budget::ClassState;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;

    fn class(name: &str, state: ClassState) -> EventClassStatus {
        EventClassStatus {
            name: name.into(),
            state,
            since: MicroTime(Timestamp::UNIX_EPOCH),
            failure_ratio: None,
            transition_ratio: None,
            condition_since: None,
            open_duration: None,
            probe_ratio: None,
            message: String::new(),
        }
    }

    #[test]
    fn the_peak_is_sampled_at_the_budgets_poll_whatever_the_servers_evaluation_interval() {
        let mut budget: BacklogBudget =
            serde_yaml::from_str(include_str!("../../../examples/backlog-budget.yaml"))
                .expect("the example BacklogBudget");
        budget.spec.metrics.produce_rate = Some("sum(rate(p[1m]))".into());
        for (poll, resolution) in [
            ("15s", "15s"),
            ("2m", "120s"),
            ("1m30s", "90s"),
            ("1.5s", "1500ms"),
        ] {
            budget.spec.poll_interval = poll.into();
            assert_eq!(
                peak_query(&budget).as_deref(),
                Some(format!("max_over_time((sum(rate(p[1m]))\n)[24h:{resolution}])").as_str()),
                "poll {poll}"
            );
        }
        budget.spec.poll_interval = "soon".into();
        assert_eq!(
            peak_query(&budget),
            None,
            "an unusable poll is never queried"
        );
        budget.spec.poll_interval = "15s".into();
        budget.spec.metrics.produce_rate = None;
        assert_eq!(peak_query(&budget), None);
    }

    #[test]
    fn only_held_classes_leave_the_scaling_backlog() {
        let v = |x: f64| Observation::Samples(vec![x]);
        let observed = MetricObservations {
            backlog: v(100.0),
            oldest_age: None,
            produce_rate: Some(v(5.0)),
            completion_rate: None,
            retry_rate: None,
            quarantine_rate: None,
            partitions: None,
            peak_produce_rate: None,
            partition_backlogs: None,
            class_backlogs: vec![
                ("refund".into(), v(40.0)),
                ("order".into(), v(10.0)),
                ("probe".into(), v(5.0)),
            ],
        };
        let inputs = scaling_inputs(
            &observed,
            &[
                class("refund", ClassState::Paused),
                class("order", ClassState::Active),
                class("probe", ClassState::Probing),
            ],
            Workload {
                replicas: 3,
                ready: Some(2),
            },
        );
        assert_eq!(
            inputs.paused_class_backlogs,
            vec![("refund".into(), v(40.0)), ("probe".into(), v(5.0))]
        );
        assert_eq!(inputs.current_replicas, 3);
        assert_eq!(inputs.ready_replicas, Some(2));
        assert_eq!(inputs.conflict, None);
    }
}
