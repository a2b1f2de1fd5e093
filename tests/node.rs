//! On a real node: the chart installs the image `make image` built and the operator runs as a
//! pod with in-cluster config, Ready through `/readyz`, admitted by a namespace that enforces
//! the restricted Pod Security Standard; `helm upgrade` rolls it and `helm uninstall` leaves
//! only the CRDs. A budget scales a Deployment whose pods really start and mount the control
//! document, and deleting the budget lets the garbage collector delete that document.
//!
//! One cluster with a node for the whole binary (started by the first test, stopped after the
//! last); every test works in namespaces of its own.

#[path = "node/gitops.rs"]
mod gitops;
mod support;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;

use backlog_operator::api::{BacklogBudget, RetryPolicy};
use backlog_operator::controller::budget::control_document::configmap_name;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, LogParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::helm::Helm;
use support::operator::Operator;
use support::workload::{apply_budget, budget, model};
use support::{TestEnv, image, wait_until};

fn main() -> ExitCode {
    support::run_on_node(
        support::tests![
            the_chart_runs_the_operator_as_a_restricted_pod_and_uninstalls_cleanly,
            a_budget_scales_a_deployment_whose_pods_really_start,
            deleting_a_budget_garbage_collects_its_control_document,
            gitops::argo_and_kstatus_read_the_operators_statuses,
        ],
        true,
    )
}

/// How long one step may take: a pod start, a rollout, a reconcile.
const STEP: Duration = Duration::from_secs(90);

/// One chart release at a time: the chart's ClusterRole and admission policy are cluster-wide.
static RELEASE: Mutex<()> = Mutex::new(());

fn chart_dir() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/charts/backlog-operator").to_owned()
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The Ready pods matching `selector`, once there are exactly `count` pods and all are Ready.
async fn ready_pods(env: &TestEnv, namespace: &str, selector: &str, count: usize) -> Vec<Pod> {
    let pods = Api::<Pod>::namespaced(env.admin(), namespace);
    wait_until(
        STEP,
        &format!("{count} Ready pods {selector} in {namespace}"),
        || async {
            let list = pods
                .list(&ListParams::default().labels(selector))
                .await
                .map_err(|e| e.to_string())?;
            let live: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            let states: Vec<String> = live
                .iter()
                .map(|p| {
                    format!(
                        "{} {:?} ready={}",
                        p.name_any(),
                        p.status.as_ref().and_then(|s| s.phase.clone()),
                        pod_ready(p)
                    )
                })
                .collect();
            if live.len() == count && live.iter().all(pod_ready) {
                Ok(live)
            } else {
                Err(states.join(", "))
            }
        },
    )
    .await
}

// ---------------------------------------------------------------------------------------------
// The chart

fn the_chart_runs_the_operator_as_a_restricted_pod_and_uninstalls_cleanly(env: &TestEnv) {
    let _one_release = RELEASE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let namespace = env.fresh_restricted_namespace("operator");
    let home = env.cluster().state_dir().join("node-helm-home");
    let helm = Helm::new(env, home, env.kubeconfig_path());
    let chart = chart_dir();
    let prometheus = format!("prometheusUrl={}", env.prometheus_url_from_pods());
    let release = "backlog";
    let selector = format!("app.kubernetes.io/instance={release}");

    // As the README says: the chart's defaults name the image `make image` built. The release
    // watches one namespace of its own (Roles there, its admission policies bound there): this
    // binary's other tests run operators of their own in this process, and a second operator
    // in their namespaces would write their statuses too and find their Jobs Foreign.
    let watched = env.fresh_namespace("operator-watched");
    let watch = format!("watchNamespaces={{{watched}}}");
    helm.ok(&[
        "install",
        release,
        &chart,
        "--namespace",
        &namespace,
        "--skip-crds",
        "--set",
        &prometheus,
        "--set",
        &watch,
        "--wait",
        "--timeout",
        "120s",
    ]);
    env.block_on(async {
        let pods = ready_pods(env, &namespace, &selector, 1).await;
        let pod = &pods[0];
        let spec = pod.spec.clone().expect("pod spec");
        let container = &spec.containers[0];
        assert_eq!(
            container.image.as_deref(),
            Some(image("backlog-operator").as_str())
        );
        let probe = container
            .readiness_probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("an HTTP readiness probe");
        assert_eq!(probe.path.as_deref(), Some("/readyz"));
        // Ready means kubelet's probe of /readyz passed: the operator reached the API server
        // from inside the pod (in-cluster config, the kubernetes Service) and leads.
        let lease = wait_until(STEP, "the operator pod holds the Lease", || async {
            let lease = Api::<Lease>::namespaced(env.admin(), &namespace)
                .get("backlog-operator")
                .await
                .ok()?;
            let holder = lease.spec.as_ref()?.holder_identity.clone()?;
            (holder == pod.name_any()).then_some(lease)
        })
        .await;
        assert!(
            lease.labels().contains_key("helm.sh/chart"),
            "the chart owns the Lease"
        );
        // Namespaced mode: its permissions are a Role in the watched namespace, and its
        // admission policies are bound to that namespace only.
        let roles = Api::<Role>::namespaced(env.admin(), &watched)
            .list(&ListParams::default().labels(&selector))
            .await
            .expect("the release's Roles");
        assert_eq!(roles.items.len(), 1, "one Role in {watched}");
        let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(env.admin())
            .list(&ListParams::default().labels(&selector))
            .await
            .expect("the release's policy bindings");
        let policies = std::fs::read_dir(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("charts/backlog-operator/policies"),
        )
        .expect("the chart's policies")
        .count();
        assert_eq!(
            bindings.items.len(),
            policies,
            "one binding per policy file of the chart"
        );
        for binding in &bindings.items {
            let namespaces = binding
                .spec
                .as_ref()
                .and_then(|s| s.match_resources.as_ref())
                .and_then(|m| m.namespace_selector.as_ref())
                .and_then(|n| n.match_expressions.as_ref())
                .into_iter()
                .flatten()
                .flat_map(|e| e.values.clone().unwrap_or_default())
                .collect::<Vec<_>>();
            assert_eq!(
                namespaces,
                std::slice::from_ref(&watched),
                "{}",
                binding.name_any()
            );
        }
        let logs = Api::<Pod>::namespaced(env.admin(), &namespace)
            .logs(&pod.name_any(), &LogParams::default())
            .await
            .expect("the operator's logs through the kubelet");
        assert!(!logs.trim().is_empty(), "the operator logs");

        // The namespace enforces "restricted": the same image without the chart's security
        // context is refused.
        let bare: Pod = serde_json::from_value(json!({
            "metadata": {"name": "unrestricted"},
            "spec": {"containers": [{"name": "x", "image": image("backlog-operator")}]},
        }))
        .expect("a pod");
        let refused = Api::<Pod>::namespaced(env.admin(), &namespace)
            .create(&PostParams::default(), &bare)
            .await;
        match refused {
            Err(kube::Error::Api(status)) => assert!(
                status
                    .message
                    .contains("violates PodSecurity \"restricted:latest\""),
                "{}",
                status.message
            ),
            other => panic!("an unrestricted pod was not refused: {other:?}"),
        }
    });

    // An upgrade rolls the pod; the new one becomes Ready with the new setting.
    helm.ok(&[
        "upgrade",
        release,
        &chart,
        "--namespace",
        &namespace,
        "--skip-crds",
        "--set",
        &prometheus,
        "--set",
        &watch,
        "--set",
        "logLevel=debug",
        "--wait",
        "--timeout",
        "120s",
    ]);
    env.block_on(async {
        let pods = ready_pods(env, &namespace, &selector, 1).await;
        let env_vars: BTreeMap<String, String> = pods[0]
            .spec
            .as_ref()
            .map(|s| &s.containers[0])
            .and_then(|c| c.env.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|e| (e.name, e.value.unwrap_or_default()))
            .collect();
        assert_eq!(env_vars.get("RUST_LOG").map(String::as_str), Some("debug"));
    });

    helm.ok(&[
        "uninstall",
        release,
        "--namespace",
        &namespace,
        "--wait",
        "--timeout",
        "120s",
    ]);
    env.block_on(assert_only_crds_remain(env, &namespace, release));
    env.block_on(assert_only_crds_remain(env, &watched, release));
}

/// `Kind name` of each cluster-wide object `selector` finds.
async fn cluster_wide<K>(
    client: &kube::Client,
    selector: &ListParams,
) -> Result<Vec<String>, String>
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    Ok(Api::<K>::all(client.clone())
        .list(selector)
        .await
        .map_err(|e| e.to_string())?
        .items
        .into_iter()
        .map(|o| format!("{kind} {}", o.name_any()))
        .collect())
}

/// After `helm uninstall`: nothing of the release in its namespace or cluster-wide, except
/// what Kubernetes itself keeps in every namespace; the CRDs stay (Helm never deletes them).
async fn assert_only_crds_remain(env: &TestEnv, namespace: &str, release: &str) {
    let admin = env.admin();
    let instance = format!("app.kubernetes.io/instance={release}");
    wait_until(STEP, "nothing of the release is left", || async {
        let mut left = Vec::new();
        let names = |kind: &str, items: Vec<String>| -> Vec<String> {
            items.into_iter().map(|n| format!("{kind} {n}")).collect()
        };
        let all = ListParams::default();
        macro_rules! namespaced {
            ($kind:ty, $label:literal, $keep:expr) => {
                let items = Api::<$kind>::namespaced(admin.clone(), namespace)
                    .list(&all)
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .into_iter()
                    .map(|o| o.name_any())
                    .filter(|n| !$keep.contains(&n.as_str()))
                    .collect();
                left.extend(names($label, items));
            };
        }
        namespaced!(Deployment, "Deployment", [""; 0]);
        namespaced!(ReplicaSet, "ReplicaSet", [""; 0]);
        namespaced!(Pod, "Pod", [""; 0]);
        namespaced!(Service, "Service", [""; 0]);
        namespaced!(ServiceAccount, "ServiceAccount", ["default"]);
        namespaced!(ConfigMap, "ConfigMap", ["kube-root-ca.crt"]);
        namespaced!(Role, "Role", [""; 0]);
        namespaced!(RoleBinding, "RoleBinding", [""; 0]);
        namespaced!(Lease, "Lease", [""; 0]);
        let labelled = ListParams::default().labels(&instance);
        left.extend(cluster_wide::<ClusterRole>(&admin, &labelled).await?);
        left.extend(cluster_wide::<ClusterRoleBinding>(&admin, &labelled).await?);
        left.extend(cluster_wide::<ValidatingAdmissionPolicy>(&admin, &labelled).await?);
        left.extend(cluster_wide::<ValidatingAdmissionPolicyBinding>(&admin, &labelled).await?);
        if left.is_empty() {
            Ok(())
        } else {
            Err(left.join(", "))
        }
    })
    .await;
    let crds = Api::<CustomResourceDefinition>::all(admin)
        .list(&ListParams::default())
        .await
        .expect("CRDs");
    let backlog: Vec<String> = crds
        .items
        .iter()
        .map(|c| c.name_any())
        .filter(|n| n.ends_with(".backlog.dev"))
        .collect();
    assert_eq!(
        backlog.len(),
        backlog_operator::api::all_crds().len(),
        "the CRDs stay: {backlog:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Budgets and real pods

/// 6 partitions of 200 events/s per consumer, 900/s from the start: more consumers than the
/// one the Deployment starts with, at most 6.
const BUSY: &str = r#"
name: node-busy
duration: 20m
partitions: 6
initialReplicas: 1
production:
  - {from: 0s, rate: 900}
consumer: {perReplicaRate: 200}
budget:
  minReplicas: 1
  maxReplicas: 10
  completionDeadline: 10m
  capacity: {perReplicaRate: 200, reservedRetryShare: 0}
  scaling: {targetDrainTime: 2m, scaleDownStabilization: 3m, rebalanceCost: 5s}
"#;
const SPEED: f64 = 30.0;

/// The demo consumer as a Deployment: restricted, its budget's control document mounted.
async fn consumer_deployment(env: &TestEnv, namespace: &str, name: &str, budget: &str) {
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "consumer",
                        "image": image("backlog-demo-consumer"),
                        "imagePullPolicy": "IfNotPresent",
                        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "readOnlyRootFilesystem": true,
                            "capabilities": {"drop": ["ALL"]},
                        },
                        "volumeMounts": [{"name": "control", "mountPath": "/etc/backlog", "readOnly": true}],
                    }],
                    "volumes": [{"name": "control", "configMap": {"name": configmap_name(budget), "optional": true}}],
                },
            },
        },
    }))
    .expect("a Deployment");
    Api::<Deployment>::namespaced(env.admin(), namespace)
        .create(&PostParams::default(), &deployment)
        .await
        .expect("create the consumer Deployment");
}

fn a_budget_scales_a_deployment_whose_pods_really_start(env: &TestEnv) {
    let namespace = env.fresh_restricted_namespace("real-pods");
    let name = "orders";
    env.block_on(async {
        let model = model(BUSY);
        consumer_deployment(env, &namespace, name, name).await;
        ready_pods(env, &namespace, "app=orders", 1).await;
        let server = backlog_operator::served_workload::serve(
            model.clone(),
            backlog_operator::sim::server::ServeOptions {
                listen: "127.0.0.1:0".parse().expect("address"),
                namespace: namespace.clone(),
                target_kind: "Deployment".to_owned(),
                target_name: name.to_owned(),
                speed: SPEED,
                topic: name.to_owned(),
                consumers: backlog_operator::sim::server::ConsumerCount::ReadyPods,
            },
            env.admin(),
        )
        .await
        .expect("the workload");
        env.add_scrape_target(&namespace, &server.address.to_string(), &[]);
        let _operator = Operator::start(env, &namespace, Some(env.prometheus_url()));
        apply_budget(env, &namespace, &budget(name, &model, SPEED, json!({}))).await;

        // The operator scales up; the Deployment's new pods start on the node and become
        // Ready, and the workload counts them only then.
        let deployments = Api::<Deployment>::namespaced(env.admin(), &namespace);
        let ready = wait_until(STEP, "at least 4 consumer pods are Ready", || async {
            let deployment = deployments.get(name).await.map_err(|e| e.to_string())?;
            let status = deployment.status.clone().unwrap_or_default();
            let ready = status.ready_replicas.unwrap_or(0);
            let wanted = deployment.spec.and_then(|s| s.replicas).unwrap_or(0);
            if ready >= 4 {
                Ok(ready)
            } else {
                Err(format!("spec.replicas {wanted}, Ready {ready}"))
            }
        })
        .await;
        assert!(ready <= 6, "never more consumers than partitions: {ready}");
        wait_until(STEP, "the workload counts the Ready pods", || async {
            let seen = server.snapshot().replicas;
            (seen >= 4).then_some(()).ok_or(seen)
        })
        .await;

        // Each pod mounts the control document and acts on it.
        let pods = Api::<Pod>::namespaced(env.admin(), &namespace);
        let pod = pods
            .list(&ListParams::default().labels("app=orders"))
            .await
            .expect("pods")
            .items
            .into_iter()
            .find(pod_ready)
            .expect("a Ready consumer pod");
        wait_until(
            STEP,
            "a consumer pod acts on the control document",
            || async {
                let logs = pods
                    .logs(&pod.name_any(), &LogParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                if logs.contains("acting on control document revision") {
                    Ok(())
                } else {
                    Err(logs)
                }
            },
        )
        .await;
        env.remove_scrape_target(&namespace);
        drop(server);
    });
}

fn deleting_a_budget_garbage_collects_its_control_document(env: &TestEnv) {
    let namespace = env.fresh_namespace("gc");
    let name = "orders";
    env.block_on(async {
        let model = model(BUSY);
        let deployment: Deployment = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                             "spec": {"containers": [{"name": "c", "image": image("backlog-demo-consumer")}]}},
            },
        }))
        .expect("a Deployment");
        Api::<Deployment>::namespaced(env.admin(), &namespace)
            .create(&PostParams::default(), &deployment)
            .await
            .expect("the target");
        let policy: RetryPolicy = serde_json::from_value(json!({
            "apiVersion": "backlog.dev/v1alpha1", "kind": "RetryPolicy",
            "metadata": {"name": "orders-retry"},
            "spec": {"maxAttempts": 3, "backoff": {"base": "100ms", "cap": "1s"}},
        }))
        .expect("a RetryPolicy");
        Api::<RetryPolicy>::namespaced(env.admin(), &namespace)
            .create(&PostParams::default(), &policy)
            .await
            .expect("the policy");
        let _operator = Operator::start(env, &namespace, Some(env.prometheus_url()));
        let mut budget = budget(name, &model, SPEED, json!({}));
        budget.spec.retry_policy_ref = serde_json::from_value(json!({"name": "orders-retry"}))
            .expect("a policy reference");
        apply_budget(env, &namespace, &budget).await;

        let configmaps = Api::<ConfigMap>::namespaced(env.admin(), &namespace);
        let document = configmap_name(name);
        let published = wait_until(STEP, "the control document is published", || async {
            configmaps.get_opt(&document).await.ok().flatten()
        })
        .await;
        let budgets = Api::<BacklogBudget>::namespaced(env.admin(), &namespace);
        let uid = budgets.get(name).await.expect("the budget").uid();
        let owner = published.owner_references().first().cloned().expect("an owner");
        assert_eq!((owner.kind.as_str(), Some(owner.uid)), ("BacklogBudget", uid));

        // Deleted in the background, as kubectl does: the garbage collector removes the
        // document after the budget is gone.
        budgets
            .delete(name, &DeleteParams::background())
            .await
            .expect("delete the budget");
        wait_until(STEP, "the garbage collector deletes the control document", || async {
            match configmaps.get_opt(&document).await {
                Ok(None) => Ok(()),
                other => Err(format!("{:?}", other.map(|c| c.map(|c| c.name_any())))),
            }
        })
        .await;
    });
}
