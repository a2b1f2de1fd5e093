//! The real loop's moving parts: a Deployment as the scale target (no kubelet runs, so only
//! its spec.replicas matters), the workload simulator serving a sped-up model's metrics to the
//! real Prometheus, and a BacklogBudget written in wall-clock terms for that speed.

use backlog_operator::api::BacklogBudget;
use backlog_operator::served_workload;
use backlog_operator::sim::scenario::{Model, Scenario};
use backlog_operator::sim::server::{ServeOptions, WorkloadServer};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

use super::TestEnv;

/// A scenario from YAML, checked.
pub fn model(yaml: &str) -> Model {
    let scenario: Scenario = serde_yaml::from_str(yaml).expect("scenario YAML");
    scenario.model().expect("valid scenario")
}

/// Creates a Deployment with `replicas`.
pub async fn deployment(env: &TestEnv, namespace: &str, name: &str, replicas: u32) {
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "consumer", "image": "registry.example.com/consumer:1"}]}
            }
        }
    }))
    .expect("deployment");
    Api::<Deployment>::namespaced(env.admin(), namespace)
        .create(&PostParams::default(), &deployment)
        .await
        .expect("create the target deployment");
}

/// The Deployment's spec.replicas.
pub async fn replicas(env: &TestEnv, namespace: &str, name: &str) -> u32 {
    Api::<Deployment>::namespaced(env.admin(), namespace)
        .get(name)
        .await
        .ok()
        .and_then(|d| d.spec?.replicas)
        .and_then(|r| u32::try_from(r).ok())
        .unwrap_or(0)
}

/// Starts the workload simulator for `model` against Deployment `name` and lets Prometheus
/// scrape it as job `job`.
pub async fn serve(
    env: &TestEnv,
    model: Model,
    namespace: &str,
    name: &str,
    speed: f64,
    job: &str,
) -> WorkloadServer {
    let server = served_workload::serve(
        model,
        ServeOptions {
            listen: "127.0.0.1:0".parse().expect("address"),
            namespace: namespace.to_owned(),
            target_kind: "Deployment".to_owned(),
            target_name: name.to_owned(),
            speed,
            topic: name.to_owned(),
            consumers: backlog_operator::sim::server::ConsumerCount::SpecReplicas,
        },
        env.admin(),
    )
    .await
    .expect("start the workload simulator");
    env.add_scrape_target(job, &server.address.to_string(), &[]);
    server
}

/// The budget for the served workload (see `served_workload::budget_for`), with `extra_scaling`
/// merged into spec.scaling.
pub fn budget(
    name: &str,
    model: &Model,
    speed: f64,
    extra_scaling: serde_json::Value,
) -> BacklogBudget {
    let mut budget = backlog_operator::served_workload::budget_for(model, name, speed);
    if extra_scaling.as_object().is_some_and(|e| !e.is_empty()) {
        let mut scaling = serde_json::to_value(&budget.spec.scaling).expect("scaling");
        if let (Some(scaling), Some(extra)) = (scaling.as_object_mut(), extra_scaling.as_object()) {
            scaling.extend(extra.clone());
        }
        budget.spec.scaling = serde_json::from_value(scaling).expect("scaling");
    }
    budget
}

/// Creates or updates the budget with server-side apply.
pub async fn apply_budget(env: &TestEnv, namespace: &str, budget: &BacklogBudget) {
    let name = budget.metadata.name.clone().expect("budget name");
    Api::<BacklogBudget>::namespaced(env.admin(), namespace)
        .patch(
            &name,
            &PatchParams::apply("backlog-tests").force(),
            &Patch::Apply(budget),
        )
        .await
        .expect("apply the budget");
}

/// The budget as the server has it.
pub async fn budget_status(env: &TestEnv, namespace: &str, name: &str) -> Option<BacklogBudget> {
    Api::<BacklogBudget>::namespaced(env.admin(), namespace)
        .get(name)
        .await
        .ok()
}
