//! The workload simulator served to a real cluster: its replica count read from the API
//! server, and the BacklogBudget that governs it.

use kube::api::DynamicObject;
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client};

use crate::api::BacklogBudget;
use crate::api::backlog_budget::{
    Alerts, BacklogBudgetSpec, Capacity, MetricQueries, ScaleTargetRef, Scaling,
};
use crate::sim::scenario::Model;
use crate::sim::server::{ConsumerCount, ServeError, ServeOptions, WorkloadServer, wall_duration};

/// Serves `model`, following the spec.replicas or the Ready pods (`options.consumers`) of the
/// target `options` names.
pub async fn serve(
    model: Model,
    options: ServeOptions,
    client: Client,
) -> Result<WorkloadServer, ServeError> {
    let resource =
        ApiResource::from_gvk(&GroupVersionKind::gvk("apps", "v1", &options.target_kind));
    let api: Api<DynamicObject> = Api::namespaced_with(client, &options.namespace, &resource);
    let name = options.target_name.clone();
    let consumers = options.consumers;
    let read_replicas = move || {
        let (api, name) = (api.clone(), name.clone());
        async move { consumer_count(&api, &name, consumers).await }
    };
    WorkloadServer::start(model, options, read_replicas).await
}

/// The target's spec.replicas or status.readyReplicas; `None` when it cannot be read (the
/// server keeps its count).
async fn consumer_count(
    api: &Api<DynamicObject>,
    name: &str,
    consumers: ConsumerCount,
) -> Option<u32> {
    let object = api.get_opt(name).await.ok()??;
    let (section, field) = match consumers {
        ConsumerCount::SpecReplicas => ("spec", "replicas"),
        ConsumerCount::ReadyPods => ("status", "readyReplicas"),
    };
    match object.data.get(section).map(|s| s.get(field)) {
        Some(Some(value)) => value.as_u64().and_then(|v| u32::try_from(v).ok()),
        // A Deployment without ready pods omits status.readyReplicas.
        Some(None) if consumers == ConsumerCount::ReadyPods => Some(0),
        _ => None,
    }
}

/// The BacklogBudget for a served workload named `name`, in wall-clock terms: the model's
/// deadline and windows divided by `speed`, its per-replica rate multiplied by it; the queries
/// read the series `sim::server::render` serves (kafka_exporter's names plus the consumer's
/// own).
pub fn budget_for(model: &Model, name: &str, speed: f64) -> BacklogBudget {
    let definition = &model.budget_definition;
    let b = &model.budget;
    let rate_window = "5s";
    let spec = BacklogBudgetSpec {
        scale_target_ref: ScaleTargetRef {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: name.to_owned(),
        },
        min_replicas: definition.min_replicas,
        max_replicas: definition.max_replicas,
        workload: None,
        completion_deadline: wall_duration(b.deadline_seconds, speed),
        retry_policy_ref: None,
        prometheus: None,
        metrics: MetricQueries {
            backlog: format!("sum(kafka_consumergroup_lag_sum{{consumergroup=\"{name}\"}})"),
            oldest_unfinished_age: Some(format!(
                "max(consumer_oldest_unfinished_event_age_seconds{{consumer=\"{name}\"}})"
            )),
            produce_rate: Some(format!(
                "sum(rate(kafka_topic_partition_current_offset{{topic=\"{name}\"}}[{rate_window}]))"
            )),
            completion_rate: Some(format!(
                "sum(rate(consumer_events_completed_total{{consumer=\"{name}\"}}[{rate_window}]))"
            )),
            partitions: Some(format!("max(kafka_topic_partitions{{topic=\"{name}\"}})")),
            ..MetricQueries::default()
        },
        partition_count: None,
        poll_interval: "1s".to_owned(),
        capacity: Some(Capacity {
            per_replica_rate: Some(b.per_replica_rate.unwrap_or(model.per_replica_rate) * speed),
            reserved_retry_share: Some(b.reserved_retry_share),
        }),
        scaling: Scaling {
            target_drain_time: wall_duration(b.target_drain_seconds, speed),
            scale_up_stabilization: wall_duration(b.scale_up_stabilization_seconds, speed),
            scale_down_stabilization: wall_duration(b.scale_down_stabilization_seconds, speed),
            max_step: definition.scaling.max_step,
            rebalance_cost: wall_duration(b.rebalance_cost_seconds, speed),
            // Left at its wall-clock default: the real-loop tests' expectations were set
            // with it. In workload time it is `speed` times longer than the simulator assumes.
            pod_start_time: crate::core::budget_config::default_pod_start_time(),
            // The cap counts per wall-clock hour, which holds `speed` workload hours.
            max_changes_per_hour: definition
                .scaling
                .max_changes_per_hour
                .map(|count| (f64::from(count) * speed).round().clamp(1.0, 120.0) as i32),
            economy_dwell: wall_duration(b.economy_dwell_seconds, speed),
        },
        alerts: Alerts {
            warning_at: definition.alerts.warning_at,
            critical_at: definition.alerts.critical_at,
            owner: None,
            runbook: None,
        },
        event_classes: vec![],
    };
    BacklogBudget::new(name, spec)
}
