//! What GitOps tools make of the three kinds, on status objects the operator really wrote: the
//! Argo CD health checks shipped in `gitops/argocd/` (run by a real Lua interpreter, as Argo
//! CD runs them) and kstatus (`sigs.k8s.io/cli-utils`, what Flux's health checks use, built
//! from its Go module by `tests/cluster/build-kstatus.sh`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use backlog_operator::api::backlog_budget::BudgetPhase;
use backlog_operator::api::compensation::CompensationPhase;
use backlog_operator::api::replay_job::ReplayPhase;
use backlog_operator::api::{BacklogBudget, Compensation, ReplayJob, RetryPolicy};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::support::exporter::Exporter;
use crate::support::operator::Operator;
use crate::support::{TestEnv, image, wait_until};

const STEP: Duration = Duration::from_secs(120);

fn health_check(kind: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("gitops/argocd")
        .join(format!("{}-health.lua", kind.to_ascii_lowercase()))
}

/// A JSON value as a Lua table constructor.
fn lua_literal(value: &Value) -> String {
    match value {
        Value::Null => "nil".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        // Rust's escapes (\", \\, \n, \u{…}) are Lua 5.4's too.
        Value::String(s) => format!("{s:?}"),
        Value::Array(items) => format!(
            "{{{}}}",
            items.iter().map(lua_literal).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("[{k:?}] = {}", lua_literal(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `(status, message)` of Argo CD's health check for `object`, run by lua5.4 with `obj` set,
/// as Argo CD does.
fn argo_health(object: &Value) -> (String, String) {
    let kind = object["kind"].as_str().expect("a kind");
    let script = health_check(kind);
    let chunk = format!(
        "obj = {}\nlocal hs = dofile({:?})\nio.write(hs.status, \"\\t\", hs.message or \"\")",
        lua_literal(object),
        script.display().to_string()
    );
    let output = Command::new("lua5.4")
        .arg("-e")
        .arg(&chunk)
        .output()
        .expect("lua5.4 (tests/cluster/install-node-packages.sh installs it)");
    assert!(
        output.status.success(),
        "{} failed: {}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (status, message) = text.split_once('\t').unwrap_or((&text, ""));
    (status.to_owned(), message.to_owned())
}

/// kstatus of each object: `(status, message)`.
fn kstatus(objects: &[Value]) -> Vec<(String, String)> {
    let binary = local_cluster::kstatus().unwrap_or_else(|e| panic!("kstatus: {e}"));
    let mut child = Command::new(binary)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the kstatus checker");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&serde_json::to_vec(objects).expect("json"))
        .expect("writing to kstatus");
    let output = child.wait_with_output().expect("kstatus ends");
    assert!(
        output.status.success(),
        "kstatus: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| {
            let (s, m) = l.split_once('\t').unwrap_or((l, ""));
            (s.to_owned(), m.to_owned())
        })
        .collect()
}

async fn create<K>(env: &TestEnv, namespace: &str, body: Value) -> K
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let object: K = serde_json::from_value(body).expect("an object");
    Api::<K>::namespaced(env.admin(), namespace)
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("creating {object:?}: {e}"))
}

/// The object as the API server has it, once `ready` holds for it.
async fn wait_for<K>(
    env: &TestEnv,
    namespace: &str,
    name: &str,
    what: &str,
    ready: impl Fn(&K) -> bool,
) -> Value
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api = Api::<K>::namespaced(env.admin(), namespace);
    let object = wait_until(STEP, what, || async {
        let object = api.get(name).await.map_err(|e| e.to_string())?;
        if ready(&object) {
            Ok(object)
        } else {
            Err(format!("{object:?}"))
        }
    })
    .await;
    let mut value = serde_json::to_value(object).expect("json");
    // Server-side apply bookkeeping is not part of what tools read.
    if let Some(meta) = value["metadata"].as_object_mut() {
        meta.remove("managedFields");
    }
    value
}

fn budget(name: &str, metric: &str) -> Value {
    json!({
        "apiVersion": "backlog.dev/v1alpha1",
        "kind": "BacklogBudget",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": 1,
            "maxReplicas": 6,
            "completionDeadline": "10m",
            "partitionCount": 6,
            "pollInterval": "1s",
            "metrics": {
                "backlog": format!("sum({metric}{{group=\"{name}\"}})"),
                "oldestUnfinishedAge": format!("max({metric}_age{{group=\"{name}\"}})"),
                "produceRate": format!("sum({metric}_rate{{group=\"{name}\"}})"),
            },
            "capacity": {"perReplicaRate": 200, "reservedRetryShare": 0},
        }
    })
}

fn target(name: &str) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "c", "image": image("backlog-demo-consumer")}]}},
        },
    })
}

/// A compensation by the reference worker; `current` is the state the worker finds.
fn compensation(name: &str, current: Option<&str>) -> Value {
    let env = match current {
        Some(state) => json!([{"name": "COMPENSATION_WORKER_CURRENT", "value": state}]),
        None => json!([]),
    };
    json!({
        "apiVersion": "backlog.dev/v1alpha1",
        "kind": "Compensation",
        "metadata": {"name": name},
        "spec": {
            "compensationId": name,
            "sourceEventId": "evt-1",
            "businessKey": "order/o-1",
            "reasonCode": "DuplicateEffect",
            "requestedBy": "alice",
            "expectedCurrentStateAndVersion": {"resource": "payments/o-1", "state": "CAPTURED_TWICE", "version": "7"},
            "proposedAction": {"description": "refund the second capture", "subActions": ["refund"]},
            "affectedResources": ["payments/o-1"],
            "dryRunEvidence": "GitOps health of a compensation",
            "template": {"spec": {"containers": [{
                "name": "worker",
                "image": crate::support::image("backlog-compensation-worker"),
                "env": env,
            }]}},
        }
    })
}

fn replay(name: &str, ids: &[&str], reject: Option<&str>) -> Value {
    let mut container = json!({"name": "replay", "image": image("backlog-replay-worker")});
    if let Some(id) = reject {
        container["env"] = json!([{"name": "REPLAY_WORKER_REJECT", "value": id}]);
    }
    json!({
        "apiVersion": "backlog.dev/v1alpha1",
        "kind": "ReplayJob",
        "metadata": {"name": name},
        "spec": {
            "source": {"queue": format!("{name}.dlq")},
            "scope": {"eventIds": ids},
            "reason": "GitOps health of a replay",
            "requestedBy": "alice",
            "batches": {"size": 1, "canary": 1, "ratePerSecond": 50},
            "template": {"spec": {"containers": [container]}},
        }
    })
}

pub fn argo_and_kstatus_read_the_operators_statuses(env: &TestEnv) {
    let namespace = env.fresh_namespace("gitops");
    let exporter = Exporter::start();
    env.add_scrape_target(&namespace, &exporter.target(), &[]);
    let _operator = Operator::start(env, &namespace, Some(env.prometheus_url()));
    let objects = env.block_on(async {
        // The ServiceAccount the operator gives replay workers.
        crate::support::identity::ensure_service_account(env, &namespace, "replay-worker").await;
        // A budget with its metrics (Healthy), one whose queries find nothing
        // (MetricsUnavailable), and one whose target another autoscaler owns (Conflict).
        for (name, metric) in [
            ("healthy", "gitops_lag"),
            ("blind", "gitops_missing"),
            ("fought", "gitops_lag"),
        ] {
            create::<Deployment>(env, &namespace, target(name)).await;
            exporter.set(metric, &[("group", name)], 1000.0);
            exporter.set(&format!("{metric}_age"), &[("group", name)], 5.0);
            exporter.set(&format!("{metric}_rate"), &[("group", name)], 100.0);
        }
        exporter.remove("gitops_missing", &[("group", "blind")]);
        create::<HorizontalPodAutoscaler>(
            env,
            &namespace,
            json!({"metadata": {"name": "fought"}, "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "fought"},
                "minReplicas": 1, "maxReplicas": 3,
            }}),
        )
        .await;
        for name in ["healthy", "fought"] {
            create::<BacklogBudget>(env, &namespace, budget(name, "gitops_lag")).await;
        }
        create::<BacklogBudget>(env, &namespace, budget("blind", "gitops_missing")).await;
        create::<RetryPolicy>(
            env,
            &namespace,
            json!({"apiVersion": "backlog.dev/v1alpha1", "kind": "RetryPolicy",
                   "metadata": {"name": "orders-retry"},
                   "spec": {"maxAttempts": 3, "backoff": {"base": "100ms", "cap": "1s"}}}),
        )
        .await;
        // Replays: one waiting for approval, one that succeeds, one whose canary fails.
        create::<ReplayJob>(env, &namespace, replay("waiting", &["w-1"], None)).await;
        create::<ReplayJob>(env, &namespace, replay("done", &["d-1", "d-2"], None)).await;
        create::<ReplayJob>(
            env,
            &namespace,
            replay("broken", &["b-1", "b-2"], Some("b-1")),
        )
        .await;
        // Compensations: one waiting for approval, one that succeeds, one whose precondition
        // moved on.
        for (name, current) in [
            ("comp-waiting", None),
            ("comp-done", None),
            ("comp-moved", Some("REFUNDED@8")),
        ] {
            create::<Compensation>(env, &namespace, compensation(name, current)).await;
        }
        for name in ["comp-done", "comp-moved"] {
            let compensations = Api::<Compensation>::namespaced(env.admin(), &namespace);
            // An approval names the frozen request and the spec it covers.
            let approval =
                crate::support::four_eyes::review_compensation(&env.admin(), &namespace, name)
                    .await
                    .approval("bob");
            compensations
                .patch(name, &PatchParams::default(), &Patch::Merge(&approval))
                .await
                .expect("approve");
        }
        for name in ["done", "broken"] {
            let replays = Api::<ReplayJob>::namespaced(env.admin(), &namespace);
            // An approval names the frozen list and the spec it covers.
            let approval = crate::support::four_eyes::review_replay(&env.admin(), &namespace, name)
                .await
                .approval("bob", "CAB-1");
            replays
                .patch(name, &PatchParams::default(), &Patch::Merge(&approval))
                .await
                .expect("approve");
        }

        let budget_in = |want: BudgetPhase| {
            move |b: &BacklogBudget| b.status.as_ref().and_then(|s| s.phase) == Some(want)
        };
        let replay_in = |want: ReplayPhase| {
            move |r: &ReplayJob| r.status.as_ref().and_then(|s| s.phase) == Some(want)
        };
        let compensation_in = |want: CompensationPhase| {
            move |c: &Compensation| c.status.as_ref().and_then(|s| s.phase) == Some(want)
        };
        vec![
            (
                wait_for::<BacklogBudget>(
                    env,
                    &namespace,
                    "healthy",
                    "a Healthy budget",
                    budget_in(BudgetPhase::Healthy),
                )
                .await,
                "Healthy",
                "Current",
            ),
            (
                wait_for::<BacklogBudget>(
                    env,
                    &namespace,
                    "blind",
                    "a budget without metrics",
                    budget_in(BudgetPhase::MetricsUnavailable),
                )
                .await,
                "Degraded",
                "InProgress",
            ),
            (
                wait_for::<BacklogBudget>(
                    env,
                    &namespace,
                    "fought",
                    "a budget in conflict",
                    budget_in(BudgetPhase::Conflict),
                )
                .await,
                "Degraded",
                "Failed",
            ),
            (
                wait_for::<RetryPolicy>(
                    env,
                    &namespace,
                    "orders-retry",
                    "a Ready policy",
                    |p: &RetryPolicy| {
                        p.status.as_ref().is_some_and(|s| {
                            s.conditions
                                .iter()
                                .any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                    },
                )
                .await,
                "Healthy",
                "Current",
            ),
            (
                wait_for::<ReplayJob>(
                    env,
                    &namespace,
                    "waiting",
                    "a replay awaiting approval",
                    replay_in(ReplayPhase::AwaitingApproval),
                )
                .await,
                "Suspended",
                "InProgress",
            ),
            (
                wait_for::<ReplayJob>(
                    env,
                    &namespace,
                    "done",
                    "a replay that succeeded",
                    replay_in(ReplayPhase::Succeeded),
                )
                .await,
                "Healthy",
                "Current",
            ),
            (
                wait_for::<ReplayJob>(
                    env,
                    &namespace,
                    "broken",
                    "a replay that halted",
                    replay_in(ReplayPhase::Halted),
                )
                .await,
                "Degraded",
                "Failed",
            ),
            (
                wait_for::<Compensation>(
                    env,
                    &namespace,
                    "comp-waiting",
                    "a compensation awaiting approval",
                    compensation_in(CompensationPhase::AwaitingApproval),
                )
                .await,
                "Suspended",
                "InProgress",
            ),
            (
                wait_for::<Compensation>(
                    env,
                    &namespace,
                    "comp-done",
                    "a compensation that succeeded",
                    compensation_in(CompensationPhase::Succeeded),
                )
                .await,
                "Healthy",
                "Current",
            ),
            (
                wait_for::<Compensation>(
                    env,
                    &namespace,
                    "comp-moved",
                    "a compensation whose precondition moved on",
                    compensation_in(CompensationPhase::PreconditionFailed),
                )
                .await,
                "Degraded",
                "Failed",
            ),
        ]
    });
    env.remove_scrape_target(&namespace);

    let values: Vec<Value> = objects.iter().map(|(o, _, _)| o.clone()).collect();
    let flux = kstatus(&values);
    let mut wrong = Vec::new();
    for ((object, argo_want, flux_want), (flux_got, flux_message)) in objects.iter().zip(&flux) {
        let name = format!(
            "{} {} ({})",
            object["kind"].as_str().unwrap_or_default(),
            object["metadata"]["name"].as_str().unwrap_or_default(),
            object["status"]["phase"].as_str().unwrap_or("no phase")
        );
        let (argo_got, argo_message) = argo_health(object);
        if argo_got != *argo_want {
            wrong.push(format!(
                "Argo CD: {name} is {argo_got} ({argo_message}), want {argo_want}"
            ));
        }
        if flux_got != flux_want {
            wrong.push(format!(
                "kstatus: {name} is {flux_got} ({flux_message}), want {flux_want}"
            ));
        }
        if *argo_want != "Healthy" && argo_message.trim().is_empty() {
            wrong.push(format!("Argo CD: {name} is {argo_got} without a message"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    drop(exporter);
}

#[test]
fn lua_literals_of_json() {
    let value = json!({"a": [1, "x\"y"], "b": null, "c": true});
    assert_eq!(
        lua_literal(&value),
        r#"{["a"] = {1, "x\"y"}, ["b"] = nil, ["c"] = true}"#
    );
}
