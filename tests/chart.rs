//! The Helm chart against the real API server: `helm lint` and `helm package`, what `helm
//! template` renders for both RBAC modes, and `helm install` for real — then the operator's
//! controllers run in this process with a token of the chart's ServiceAccount (TokenRequest
//! API), so a permission the chart forgot fails a test, and that same token is refused what
//! the ServiceAccount must never do (a Job in kube-system, the admission policies' parameters,
//! ConfigMaps of a namespace whose admin did not opt in), by the API server itself. The `run` arguments the chart renders are given to the real
//! binary, which must accept them and win the leader-election Lease with the chart's Role. A
//! second, bare control plane (no CRDs) proves that installing the packaged chart installs the
//! CRDs.
//!
//! No kubelet runs here: the objects are what is tested (tests/node.rs runs the chart on a real
//! node, where the operator pod starts).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};
use std::time::Duration;

use backlog_operator::api::replay_job::ReplayPhase;
use backlog_operator::api::{BacklogBudget, ReplayJob, RetryPolicy};
use backlog_operator::controller::Scope;
use backlog_operator::controller::budget::control_document::configmap_name;
use backlog_operator::controller::replay::LABEL_REPLAY;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Config};
use local_cluster::{LocalCluster, Options};
use serde_json::{Value, json};
use support::exporter::Exporter;
use support::helm::Helm;
use support::identity::{client_with_token, service_account_token};
use support::operator::Operator;
use support::{TestEnv, wait_until};

fn main() -> ExitCode {
    support::run(
        support::tests![
            the_chart_lints_and_packages_the_crds_it_links,
            helm_template_renders_rbac_for_both_modes,
            the_operator_runs_cluster_wide_with_the_charts_service_account,
            a_namespaced_install_is_enough_for_its_namespace,
            the_binary_accepts_the_charts_arguments_and_leads_with_its_lease_role,
            installing_the_packaged_chart_installs_the_crds,
        ],
        true,
    )
}

/// How long the operator (or the API server) may take for one step.
const STEP: Duration = Duration::from_secs(60);
const IMAGE_TAG: &str = "chart-test";

/// One in-process operator at a time: the cluster-wide one would also reconcile the budgets of
/// the namespaced test, and the warnings captured while one runs are its own.
static OPERATOR: Mutex<()> = Mutex::new(());

/// Warnings logged in this process (the controllers' and kube's: a watch refused with 403, a
/// failed reconcile, an Event that could not be written).
static WARNINGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        WARNINGS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Prints the warnings captured so far when the test fails while it is alive: a step that
/// times out is explained by what the operator logged meanwhile (a refused write, a failed
/// reconcile and its backoff).
struct ShowWarningsOnFailure;

impl Drop for ShowWarningsOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("warnings logged while the test ran:\n{}", take_warnings());
        }
    }
}

/// Starts capturing warnings (once per process) and forgets those captured so far; the guard
/// prints them if the test fails before it is dropped.
#[must_use = "the guard prints the warnings only while it is alive"]
fn capture_warnings() -> ShowWarningsOnFailure {
    static START: Once = Once::new();
    START.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(|| Capture)
            .try_init();
    });
    take_warnings();
    ShowWarningsOnFailure
}

fn take_warnings() -> String {
    let mut captured = WARNINGS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    String::from_utf8_lossy(&std::mem::take(&mut *captured)).into_owned()
}

/// Fails on any captured warning about a refused request: a permission the chart lacks.
fn assert_nothing_forbidden(who: &str) {
    let warnings = take_warnings();
    let refused: Vec<&str> = warnings
        .lines()
        .filter(|l| l.contains("403") || l.to_ascii_lowercase().contains("forbidden"))
        .collect();
    assert!(
        refused.is_empty(),
        "{who} was refused requests (a permission missing from the chart):\n{}",
        refused.join("\n")
    );
}

/// A fresh directory under the cluster's state directory (removed with it).
fn scratch_dir(env: &TestEnv, what: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = env.cluster().state_dir().join(format!(
        "chart-{what}-{}",
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {dir:?}: {e}"));
    dir
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn chart_dir() -> PathBuf {
    repo().join("charts/backlog-operator")
}

// ---------------------------------------------------------------------------------------------
// helm

/// Helm against `kubeconfig`, with a home of its own under the cluster's state directory.
fn helm(env: &TestEnv, kubeconfig: &Path) -> Helm {
    Helm::new(env, scratch_dir(env, "helm-home"), kubeconfig)
}

/// `helm template` of the chart directory with `--set` values; the rendered objects.
fn template(helm: &Helm, sets: &[&str]) -> Vec<Value> {
    let chart = chart_dir();
    let mut args = vec![
        "template",
        "rendered",
        chart.to_str().expect("utf-8 path"),
        "--namespace",
        "ops",
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    documents(&helm.ok(&args))
}

fn documents(yaml: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(yaml)
        .map(|document| Value::deserialize(document).expect("helm renders YAML"))
        .filter(|value| !value.is_null())
        .collect()
}

fn kinds(objects: &[Value]) -> Vec<(String, String, Option<String>)> {
    objects
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or_default().to_owned(),
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                o["metadata"]["namespace"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn container_args(deployment: &Value) -> Vec<String> {
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("container args")
        .iter()
        .map(|a| a.as_str().expect("a string argument").to_owned())
        .collect()
}

/// `helm install` of the chart directory into `namespace` with `sets`; the CRDs are the
/// harness's already.
fn install(helm: &Helm, release: &str, namespace: &str, sets: &[&str]) {
    let chart = chart_dir();
    let image = format!("image.tag={IMAGE_TAG}");
    let mut args = vec![
        "install",
        release,
        chart.to_str().expect("utf-8 path"),
        "--namespace",
        namespace,
        "--skip-crds",
        "--set",
        &image,
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    helm.ok(&args);
}

// ---------------------------------------------------------------------------------------------
// The chart's ServiceAccount as a client

/// Whether the client's user may do `verb` on `group/resource[/subresource]` (in `namespace`,
/// or cluster-wide), per a SelfSubjectAccessReview.
async fn can(client: &Client, verb: &str, resource: &str, namespace: Option<&str>) -> bool {
    let (group, resource) = resource.split_once(':').unwrap_or(("", resource));
    let (resource, subresource) = match resource.split_once('/') {
        Some((resource, sub)) => (resource, Some(sub.to_owned())),
        None => (resource, None),
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                subresource,
                verb: Some(verb.to_owned()),
                namespace: namespace.map(str::to_owned),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("a SelfSubjectAccessReview")
        .status
        .is_some_and(|s| s.allowed)
}

/// Asserts each `(verb, group:resource[/sub], namespace)` is allowed (`true`) or denied.
async fn assert_access(
    client: &Client,
    who: &str,
    expectations: &[(&str, &str, Option<&str>, bool)],
) {
    let mut wrong = Vec::new();
    for (verb, resource, namespace, allowed) in expectations {
        if can(client, verb, resource, *namespace).await != *allowed {
            wrong.push(format!(
                "{verb} {resource} in {}: expected {}",
                namespace.unwrap_or("all namespaces"),
                if *allowed { "allowed" } else { "denied" }
            ));
        }
    }
    assert!(wrong.is_empty(), "{who}:\n  {}", wrong.join("\n  "));
}

// ---------------------------------------------------------------------------------------------
// Workload objects

async fn apply_as_admin<K>(env: &TestEnv, namespace: &str, body: Value)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let name = body["metadata"]["name"]
        .as_str()
        .expect("a name")
        .to_owned();
    let object: K = serde_json::from_value(body).expect("a valid object");
    Api::<K>::namespaced(env.admin(), namespace)
        .patch(
            &name,
            &PatchParams::apply("chart-test").force(),
            &Patch::Apply(&object),
        )
        .await
        .unwrap_or_else(|e| panic!("applying {name}: {e}"));
}

/// A budget on Deployment `name` whose load (3000/s against 6 partitions of 200/s) asks for the
/// partition cap, 6 replicas; `serve_load` serves its metrics.
fn budget_body(name: &str, policy: Option<&str>) -> Value {
    let mut body = json!({
        "apiVersion": "backlog.dev/v1alpha1",
        "kind": "BacklogBudget",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": 1,
            "maxReplicas": 20,
            "completionDeadline": "10m",
            "partitionCount": 6,
            "pollInterval": "1s",
            "metrics": {
                "backlog": format!("sum(chart_lag{{group=\"{name}\"}})"),
                "oldestUnfinishedAge": format!("max(chart_oldest_age_seconds{{group=\"{name}\"}})"),
                "produceRate": format!("sum(chart_produce_rate{{group=\"{name}\"}})"),
            },
            "capacity": {"perReplicaRate": 200, "reservedRetryShare": 0},
        }
    });
    if let Some(policy) = policy {
        body["spec"]["retryPolicyRef"] = json!({ "name": policy });
    }
    body
}

fn serve_load(env: &TestEnv, job: &str, name: &str) -> Exporter {
    let exporter = Exporter::start();
    env.add_scrape_target(job, &exporter.target(), &[]);
    exporter.set("chart_lag", &[("group", name)], 50_000.0);
    exporter.set("chart_oldest_age_seconds", &[("group", name)], 5.0);
    exporter.set("chart_produce_rate", &[("group", name)], 3000.0);
    exporter
}

/// Waits until the budget's Deployment runs 6 replicas and its status shows the decision; then
/// checks the control document and the Events the operator wrote.
async fn assert_budget_scaled(env: &TestEnv, namespace: &str, name: &str) {
    let deployments = Api::<Deployment>::namespaced(env.admin(), namespace);
    wait_until(
        STEP,
        "the operator scales the Deployment to 6 replicas",
        || async {
            let replicas = deployments
                .get(name)
                .await
                .ok()
                .and_then(|d| d.spec?.replicas);
            (replicas == Some(6)).then_some(()).ok_or(replicas)
        },
    )
    .await;
    let budgets = Api::<BacklogBudget>::namespaced(env.admin(), namespace);
    wait_until(STEP, "the budget's status records the decision", || async {
        let status = budgets.get(name).await.ok()?.status?;
        (status.desired_replicas == Some(6) && status.phase.is_some()).then_some(())
    })
    .await;
    let configmaps = Api::<ConfigMap>::namespaced(env.admin(), namespace);
    let document = configmap_name(name);
    wait_until(
        STEP,
        "the control document ConfigMap is published",
        || async { configmaps.get_opt(&document).await.ok().flatten() },
    )
    .await;
    let events = Api::<Event>::namespaced(env.admin(), namespace);
    wait_until(STEP, "a ScaledUp Event about the budget", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("ScaledUp")
                    && e.reporting_controller.as_deref() == Some("backlog-operator")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            })
            .then_some(())
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Tests

fn the_chart_lints_and_packages_the_crds_it_links(env: &TestEnv) {
    let helm = helm(env, env.kubeconfig_path());
    let chart = chart_dir();
    let chart = chart.to_str().expect("utf-8 path");
    helm.ok(&["lint", "--strict", chart]);
    helm.ok(&[
        "lint",
        "--strict",
        chart,
        "--set",
        "watchNamespaces={team-a,team-b}",
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "replicas=3",
        "--set",
        "rbac.extraScaleTargets[0].apiGroup=argoproj.io",
        "--set",
        "rbac.extraScaleTargets[0].resources[0]=rollouts",
    ]);

    // crds/ is a link to the generated top-level crds/: the package carries their content.
    let out = scratch_dir(env, "package");
    let out_dir = out.to_str().expect("utf-8 path");
    helm.ok(&["package", chart, "--destination", out_dir]);
    let package = out.join("backlog-operator-0.1.0.tgz");
    let unpacked = Command::new("tar")
        .arg("-xzf")
        .arg(&package)
        .arg("-C")
        .arg(&out)
        .output()
        .expect("tar");
    assert!(
        unpacked.status.success(),
        "unpacking {package:?}: {unpacked:?}"
    );
    let mut packaged: Vec<String> = std::fs::read_dir(out.join("backlog-operator/crds"))
        .expect("the package has crds/")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    packaged.sort();
    let mut generated: Vec<String> = std::fs::read_dir(repo().join("crds"))
        .expect("crds/")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    generated.sort();
    assert_eq!(
        packaged, generated,
        "the package's crds/ and the repository's crds/"
    );
    for file in &generated {
        let inside = std::fs::read(out.join("backlog-operator/crds").join(file)).expect("read");
        let outside = std::fs::read(repo().join("crds").join(file)).expect("read");
        assert!(inside == outside, "crds/{file} differs in the package");
    }
    // The admission policy files travel too, unchanged (templates read them with .Files).
    for policy in [
        "policies/compensation.yaml",
        "policies/job-pods.yaml",
        "policies/no-orphaning.yaml",
        "policies/replayjob.yaml",
        "policies/status-owner.yaml",
        "policies/worker-pod.yaml",
    ] {
        assert!(
            std::fs::read(out.join("backlog-operator").join(policy)).expect("packaged policy")
                == std::fs::read(chart_dir().join(policy)).expect("policy"),
            "{policy} differs in the package"
        );
    }
}

/// The verbs a set of rules grants on `group`/`resource`.
fn verbs(rules: &Value, group: &str, resource: &str) -> Vec<String> {
    rules
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| {
            r["apiGroups"]
                .as_array()
                .is_some_and(|g| g.iter().any(|g| g == group))
                && r["resources"]
                    .as_array()
                    .is_some_and(|x| x.iter().any(|x| x == resource))
        })
        .flat_map(|r| r["verbs"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

fn helm_template_renders_rbac_for_both_modes(env: &TestEnv) {
    let helm = helm(env, env.kubeconfig_path());

    // All namespaces: a ClusterRole that writes no Job and no ConfigMap, and the aggregated
    // ClusterRole a namespace admin binds for those; the Lease Role in the release namespace.
    let cluster = template(&helm, &["prometheusUrl=http://prometheus.monitoring:9090"]);
    let names = kinds(&cluster);
    let cluster_roles = of_kind(&cluster, "ClusterRole");
    let role_named = |name: &str| {
        cluster_roles
            .iter()
            .find(|r| r["metadata"]["name"] == name)
            .copied()
            .unwrap_or_else(|| panic!("ClusterRole {name} in {names:?}"))
    };
    let main = role_named("rendered-backlog-operator");
    assert!(verbs(&main["rules"], "", "configmaps").is_empty(), "{main}");
    assert_eq!(
        verbs(&main["rules"], "batch", "jobs"),
        ["get", "list", "watch"]
    );
    let namespace = role_named("rendered-backlog-operator-namespace");
    assert_eq!(
        namespace["aggregationRule"]["clusterRoleSelectors"][0]["matchLabels"]["backlog.dev/aggregate-to-namespace"],
        "rendered-backlog-operator"
    );
    assert_eq!(
        verbs(&namespace["rules"], "batch", "jobs"),
        ["create", "patch"]
    );
    for piece in [
        "rendered-backlog-operator-namespace-replays",
        "rendered-backlog-operator-namespace-budgets",
    ] {
        assert_eq!(
            role_named(piece)["metadata"]["labels"]["backlog.dev/aggregate-to-namespace"],
            "rendered-backlog-operator"
        );
    }
    assert_eq!(
        of_kind(&cluster, "ClusterRoleBinding").len(),
        1,
        "{names:?}"
    );
    let roles = of_kind(&cluster, "Role");
    assert_eq!(roles.len(), 1, "only the leader-election Role: {names:?}");
    assert_eq!(roles[0]["metadata"]["namespace"], "ops");
    assert_eq!(roles[0]["rules"][0]["resources"][0], "leases");
    assert!(
        of_kind(&cluster, "RoleBinding")
            .iter()
            .all(|b| b["metadata"]["namespace"] == "ops")
    );
    let deployment = of_kind(&cluster, "Deployment")[0];
    let args = container_args(deployment);
    assert!(
        args.iter().all(|a| !a.starts_with("--namespace")),
        "{args:?}"
    );
    assert!(
        args.contains(&"--prometheus-url=http://prometheus.monitoring:9090".to_owned()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--replay-worker-service-account=replay-worker".to_owned()),
        "{args:?}"
    );
    assert!(args.contains(&"--log-json".to_owned()), "{args:?}");
    assert!(args.contains(&"--leader-elect".to_owned()), "{args:?}");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["image"], "localhost/backlog-operator:0.1.0",
        "appVersion is the default tag"
    );
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(
        container["securityContext"]["allowPrivilegeEscalation"],
        false
    );
    assert_eq!(
        container["securityContext"]["capabilities"]["drop"],
        json!(["ALL"])
    );
    assert_eq!(
        deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"],
        true
    );
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["env"][0]["name"], "POD_NAME");
    assert_eq!(
        container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    let policies = of_kind(&cluster, "ValidatingAdmissionPolicy");
    let mut policy_names: Vec<&str> = policies
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    policy_names.sort_unstable();
    assert_eq!(
        policy_names,
        [
            "rendered-backlog-operator.compensation.backlog.dev",
            "rendered-backlog-operator.job-pods.backlog.dev",
            "rendered-backlog-operator.no-orphaning.backlog.dev",
            "rendered-backlog-operator.replayjob.backlog.dev",
            "rendered-backlog-operator.status-owner.backlog.dev",
            "rendered-backlog-operator.worker-pod.backlog.dev"
        ]
    );
    for binding in of_kind(&cluster, "ValidatingAdmissionPolicyBinding") {
        assert!(
            binding["spec"]["matchResources"].is_null(),
            "every namespace"
        );
        assert!(binding["spec"]["paramRef"].is_null(), "no parameter object");
    }
    assert_eq!(
        of_kind(&cluster, "ServiceMonitor").len(),
        0,
        "off by default"
    );

    // Some namespaces: a Role and RoleBinding in each, nothing cluster-wide but the policies,
    // bound to those namespaces only.
    let namespaced = template(
        &helm,
        &[
            "watchNamespaces={team-a,team-b}",
            "leaderElection.enabled=false",
            "allowedPrometheusUrls={http://thanos.monitoring:9090}",
            "replay.requireImageDigest=true",
        ],
    );
    let names = kinds(&namespaced);
    assert!(of_kind(&namespaced, "ClusterRole").is_empty(), "{names:?}");
    assert!(
        of_kind(&namespaced, "ClusterRoleBinding").is_empty(),
        "{names:?}"
    );
    let roles = of_kind(&namespaced, "Role");
    let bindings = of_kind(&namespaced, "RoleBinding");
    assert_eq!((roles.len(), bindings.len()), (2, 2), "{names:?}");
    for (role, namespace) in roles.iter().zip(["team-a", "team-b"]) {
        assert_eq!(role["metadata"]["namespace"], namespace);
        assert_eq!(
            verbs(&role["rules"], "batch", "jobs"),
            ["get", "list", "watch", "create", "patch"]
        );
    }
    for binding in &bindings {
        assert_eq!(
            binding["subjects"][0]["namespace"], "ops",
            "the ServiceAccount stays in the release namespace"
        );
    }
    for binding in of_kind(&namespaced, "ValidatingAdmissionPolicyBinding") {
        assert_eq!(
            binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0],
            json!({"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]})
        );
    }
    let args = container_args(of_kind(&namespaced, "Deployment")[0]);
    for arg in [
        "--namespace=team-a",
        "--namespace=team-b",
        "--allowed-prometheus-url=http://thanos.monitoring:9090",
        "--replay-require-image-digest",
    ] {
        assert!(args.contains(&arg.to_owned()), "{arg} in {args:?}");
    }
    assert!(!args.contains(&"--leader-elect".to_owned()), "{args:?}");

    // The policies' parameters: literals in the cluster-scoped policies, from the values.
    let policy = template(
        &helm,
        &[
            "replay.approversGroup=payments-approvers",
            "replay.workerServiceAccounts={orders-replay,refunds-replay}",
        ],
    );
    let parameters: Vec<(String, String)> = of_kind(&policy, "ValidatingAdmissionPolicy")
        .iter()
        .flat_map(|p| {
            p["spec"]["variables"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|v| {
            Some((
                v["name"].as_str()?.to_owned(),
                v["expression"].as_str()?.to_owned(),
            ))
        })
        .filter(|(name, _)| {
            [
                "approversGroup",
                "operatorAccount",
                "workerAccounts",
                "requireDigest",
            ]
            .contains(&name.as_str())
        })
        .collect();
    for expected in [
        ("approversGroup", r#""payments-approvers""#),
        (
            "operatorAccount",
            r#""system:serviceaccount:ops:rendered-backlog-operator""#,
        ),
        ("workerAccounts", r#"["orders-replay","refunds-replay"]"#),
        ("requireDigest", "false"),
    ] {
        assert!(
            parameters.contains(&(expected.0.to_owned(), expected.1.to_owned())),
            "{expected:?} in {parameters:?}"
        );
    }
    assert!(
        of_kind(&policy, "ConfigMap").is_empty(),
        "no parameter ConfigMap"
    );

    let chart = chart_dir();
    let refused = |sets: &[&str]| {
        let mut args = vec![
            "template",
            "rendered",
            chart.to_str().expect("utf-8 path"),
            "--namespace",
            "ops",
        ];
        for set in sets {
            args.extend(["--set", set]);
        }
        helm.run(&args).expect_err("refused")
    };
    // More than one replica needs leader election.
    let message = refused(&["replicas=2", "leaderElection.enabled=false"]);
    assert!(message.contains("leaderElection.enabled"), "{message}");
    // The operator never gets ConfigMap writes where the policies' parameters live.
    let message = refused(&["watchNamespaces={team-a,ops}"]);
    assert!(
        message.contains("watchNamespaces contains the release namespace ops"),
        "{message}"
    );
    let message = refused(&["replay.workerServiceAccounts=null"]);
    assert!(
        message.contains("replay.workerServiceAccounts is empty"),
        "{message}"
    );
    let message = refused(&["rbac.namespaceBindings={ops}"]);
    assert!(
        message.contains("rbac.namespaceBindings contains the release namespace ops"),
        "{message}"
    );
}

fn the_operator_runs_cluster_wide_with_the_charts_service_account(env: &TestEnv) {
    // Held for the whole test (outside async code): one in-process operator, and one release's
    // cluster-wide admission policies, at a time.
    let _one_at_a_time = OPERATOR
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let release_namespace = env.fresh_namespace("chart-ops");
    let apps = env.fresh_namespace("chart-apps");
    let helm = helm(env, env.kubeconfig_path());
    install(
        &helm,
        "ops",
        &release_namespace,
        &["prometheusUrl=http://prometheus.example:9090"],
    );
    let name = "payments";
    env.block_on(async {
        // What helm installed.
        let admin = env.admin();
        let deployment = Api::<Deployment>::namespaced(admin.clone(), &release_namespace)
            .get("ops-backlog-operator")
            .await
            .expect("the operator's Deployment");
        let pod = deployment.spec.expect("spec").template.spec.expect("pod spec");
        assert_eq!(pod.service_account_name.as_deref(), Some("ops-backlog-operator"));
        assert_eq!(
            pod.containers[0].image.as_deref(),
            Some(format!("localhost/backlog-operator:{IMAGE_TAG}").as_str())
        );
        use k8s_openapi::api::admissionregistration::v1::{
            ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
        };
        use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
        let cluster_role = |name: &'static str| {
            let api = Api::<ClusterRole>::all(admin.clone());
            async move { api.get_opt(name).await.map(|o| o.is_some()) }
        };
        for (kind, found) in [
            ("ServiceAccount", Api::<ServiceAccount>::namespaced(admin.clone(), &release_namespace).get_opt("ops-backlog-operator").await.map(|o| o.is_some())),
            ("Service", Api::<k8s_openapi::api::core::v1::Service>::namespaced(admin.clone(), &release_namespace).get_opt("ops-backlog-operator-metrics").await.map(|o| o.is_some())),
            ("ClusterRole", cluster_role("ops-backlog-operator").await),
            ("ClusterRole -namespace", cluster_role("ops-backlog-operator-namespace").await),
            ("ClusterRoleBinding", Api::<ClusterRoleBinding>::all(admin.clone()).get_opt("ops-backlog-operator").await.map(|o| o.is_some())),
            ("Role (leader election)", Api::<Role>::namespaced(admin.clone(), &release_namespace).get_opt("ops-backlog-operator-leader-election").await.map(|o| o.is_some())),
            ("ValidatingAdmissionPolicy", Api::<ValidatingAdmissionPolicy>::all(admin.clone()).get_opt("ops-backlog-operator.status-owner.backlog.dev").await.map(|o| o.is_some())),
            ("ValidatingAdmissionPolicyBinding", Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone()).get_opt("ops-backlog-operator.replayjob.backlog.dev").await.map(|o| o.is_some())),
        ] {
            assert_eq!(found.ok(), Some(true), "{kind}");
        }

        // carol, the admin of namespace apps, opts it in: she binds the ClusterRole that lets the
        // operator create Jobs and write ConfigMaps there. She may: it grants nothing she lacks.
        make_namespace_admin(env, &apps, "carol").await;
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": "backlog-operator"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ops-backlog-operator-namespace"},
            "subjects": [{"kind": "ServiceAccount", "name": "ops-backlog-operator", "namespace": release_namespace}],
        }))
        .expect("a RoleBinding");
        Api::<RoleBinding>::namespaced(env.client("carol"), &apps)
            .create(&PostParams::default(), &binding)
            .await
            .expect("a namespace admin binds the operator's namespace ClusterRole");

        // The operator, cluster-wide, as the chart's ServiceAccount.
        let token = service_account_token(env, &release_namespace, "ops-backlog-operator").await;
        let operator_client = client_with_token(env, &token);
        let _show_warnings = capture_warnings();
        let _exporter = serve_load(env, &apps, name);
        support::workload::deployment(env, &apps, name, 2).await;
        apply_as_admin::<RetryPolicy>(
            env,
            &apps,
            json!({
                "apiVersion": "backlog.dev/v1alpha1",
                "kind": "RetryPolicy",
                "metadata": {"name": "payments-retry"},
                "spec": {"maxAttempts": 4, "backoff": {"base": "100ms", "cap": "5s", "jitter": "Full"}},
            }),
        )
        .await;
        apply_as_admin::<BacklogBudget>(env, &apps, budget_body(name, Some("payments-retry"))).await;
        let operator = Operator::with_client(env, operator_client.clone(), Scope::All, Some(env.prometheus_url()));

        assert_budget_scaled(env, &apps, name).await;
        let policies = Api::<RetryPolicy>::namespaced(admin.clone(), &apps);
        wait_until(STEP, "the RetryPolicy's status has its hash", || async {
            policies.get("payments-retry").await.ok()?.status?.policy_hash
        })
        .await;

        // A replay: alice asks, bob approves the frozen scope (the chart's admission policies
        // are in force), the operator creates the canary Job.
        grant_replay_users(env, &apps).await;
        run_a_replay(env, &apps).await;

        drop(operator);
        assert_nothing_forbidden("the cluster-wide operator");

        // What it may not do, asked of the API server with its own token.
        let other = env.create_namespace("chart-other").await;
        assert_access(
            &operator_client,
            "the chart's ServiceAccount",
            &[
                ("patch", "apps:deployments/scale", Some(&apps), true),
                ("list", "apps:deployments", None, true),
                ("list", "autoscaling:horizontalpodautoscalers", None, true),
                ("create", "events.k8s.io:events", Some(&other), true),
                ("create", "batch:jobs", Some(&apps), true),
                ("create", "configmaps", Some(&apps), true),
                ("create", "batch:jobs", Some(&other), false),
                ("create", "configmaps", Some(&other), false),
                ("get", "configmaps", Some(&other), false),
                ("create", "batch:jobs", Some("kube-system"), false),
                ("patch", "configmaps", Some(&release_namespace), false),
                ("delete", "apps:deployments", Some(&apps), false),
                ("update", "apps:deployments", Some(&apps), false),
                ("patch", "apps:deployments", Some(&apps), false),
                ("get", "secrets", Some(&apps), false),
                ("list", "secrets", None, false),
                ("create", "pods", Some(&apps), false),
                ("list", "pods", Some(&apps), true),
                ("list", "pods", Some(&other), false),
                ("get", "pods", Some(&apps), false),
                ("patch", "backlog.dev:compensations/status", Some(&apps), true),
                ("update", "backlog.dev:compensations", Some(&apps), false),
                ("delete", "configmaps", Some(&apps), false),
                ("list", "configmaps", None, false),
                // Control documents come from a watch where the namespace opted in.
                ("watch", "configmaps", Some(&apps), true),
                ("watch", "configmaps", Some(&other), false),
                ("delete", "batch:jobs", Some(&apps), false),
                ("update", "backlog.dev:replayjobs", Some(&apps), false),
                ("patch", "backlog.dev:backlogbudgets", Some(&apps), false),
                ("delete", "backlog.dev:backlogbudgets", Some(&apps), false),
                ("create", "rbac.authorization.k8s.io:rolebindings", Some(&apps), false),
                ("patch", "admissionregistration.k8s.io:validatingadmissionpolicies", None, false),
                ("delete", "admissionregistration.k8s.io:validatingadmissionpolicybindings", None, false),
                ("update", "autoscaling:horizontalpodautoscalers", Some(&apps), false),
                ("create", "coordination.k8s.io:leases", Some(&apps), false),
                ("create", "coordination.k8s.io:leases", Some(&release_namespace), true),
                ("delete", "coordination.k8s.io:leases", Some(&release_namespace), false),
                ("impersonate", "users", None, false),
                ("impersonate", "serviceaccounts", None, false),
            ],
        )
        .await;
        // And the requests themselves are refused (dry runs: nothing would be changed).
        assert_refused_requests(&operator_client, "ops-backlog-operator", &release_namespace, &other).await;
    });
    // The cluster-wide policies go with the release, so the next release's are the only ones.
    helm.ok(&[
        "uninstall",
        "ops",
        "--namespace",
        &release_namespace,
        "--wait",
    ]);
    env.block_on(wait_policies_gone(env, "ops-backlog-operator"));
}

/// alice asks for a replay, bob approves its frozen scope, the canary Job appears.
async fn run_a_replay(env: &TestEnv, namespace: &str) {
    let replays_as = |user: &str| Api::<ReplayJob>::namespaced(env.client(user), namespace);
    let on_behalf: ReplayJob =
        serde_json::from_value(replay_body("probe", "bob")).expect("a ReplayJob");
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    wait_until(
        STEP,
        "the chart's policy refuses a create on behalf of bob",
        || async {
            match replays_as("alice").create(&dry_run, &on_behalf).await {
                Err(kube::Error::Api(status))
                    if status.message.contains("spec.requestedBy must be the user") =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let replay: ReplayJob =
        serde_json::from_value(replay_body("refunds", "alice")).expect("a ReplayJob");
    replays_as("alice")
        .create(&PostParams::default(), &replay)
        .await
        .expect("alice asks for a replay in her own name");
    let replays = Api::<ReplayJob>::namespaced(env.admin(), namespace);
    let review = support::four_eyes::review_replay(&env.admin(), namespace, "refunds").await;
    let approve = |user: &str| review.approval(user, "CAB-1");
    let refused = replays_as("alice")
        .patch(
            "refunds",
            &PatchParams::default(),
            &Patch::Merge(approve("alice")),
        )
        .await;
    match refused {
        Err(kube::Error::Api(status)) if status.message.contains("approvedBy") => {}
        other => panic!("alice approving her own replay must be refused: {other:?}"),
    }
    replays_as("bob")
        .patch(
            "refunds",
            &PatchParams::default(),
            &Patch::Merge(approve("bob")),
        )
        .await
        .expect("bob approves");
    wait_until(STEP, "the replay runs its canary", || async {
        let phase = replays
            .get("refunds")
            .await
            .ok()
            .and_then(|r| r.status?.phase);
        (phase == Some(ReplayPhase::Canary))
            .then_some(())
            .ok_or(phase)
    })
    .await;
    let jobs = Api::<Job>::namespaced(env.admin(), namespace);
    let canary = wait_until(STEP, "the canary Job exists", || async {
        let list = jobs
            .list(&ListParams::default().labels(&format!("{LABEL_REPLAY}=refunds")))
            .await
            .ok()?;
        list.items.into_iter().next()
    })
    .await;
    assert_eq!(
        canary.spec.and_then(|s| s.completion_mode).as_deref(),
        Some("Indexed")
    );
}

/// Lets `user` administer `namespace` the way the built-in admin role would for what matters
/// here (the built-in role's rules are aggregated by a controller-manager, which this cluster
/// does not run): Jobs, ConfigMaps, and RoleBindings.
async fn make_namespace_admin(env: &TestEnv, namespace: &str, user: &str) {
    apply_as_admin::<Role>(
        env,
        namespace,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "namespace-admin"},
            "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
                {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings"], "verbs": ["get", "list", "create", "update", "patch", "delete"]},
            ],
        }),
    )
    .await;
    apply_as_admin::<RoleBinding>(
        env,
        namespace,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "namespace-admin"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "namespace-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }),
    )
    .await;
}

/// The requests the operator's ServiceAccount must never get through, sent with its token:
/// a Job in kube-system, a change of the admission policies (their parameters: switching four
/// eyes off, or letting anyone write status), a ConfigMap next to its own credentials or in a
/// namespace nobody opted in. Dry runs, refused by authorization before anything would be
/// stored.
async fn assert_refused_requests(
    operator: &Client,
    release: &str,
    release_namespace: &str,
    unbound: &str,
) {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "escalate"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}},
    }))
    .expect("a Job");
    let forbidden = |result: Result<_, kube::Error>, what: &str| match result {
        Err(kube::Error::Api(status)) if status.code == 403 => {}
        other => panic!("{what}: expected 403 Forbidden, got {other:?}"),
    };
    forbidden(
        Api::<Job>::namespaced(operator.clone(), "kube-system")
            .create(&dry, &job)
            .await
            .map(|_| ()),
        "creating a Job in kube-system",
    );
    let dry_patch = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let four_eyes_off = json!({"spec": {"variables": [
        {"name": "approversGroup", "expression": "\"system:authenticated\""},
    ]}});
    forbidden(
        Api::<ValidatingAdmissionPolicy>::all(operator.clone())
            .patch(
                &format!("{release}.replayjob.backlog.dev"),
                &dry_patch,
                &Patch::Merge(four_eyes_off),
            )
            .await
            .map(|_| ()),
        "patching the four-eyes policy's parameters",
    );
    forbidden(
        Api::<ValidatingAdmissionPolicyBinding>::all(operator.clone())
            .delete(
                &format!("{release}.status-owner.backlog.dev"),
                &kube::api::DeleteParams {
                    dry_run: true,
                    ..kube::api::DeleteParams::default()
                },
            )
            .await
            .map(|_| ()),
        "deleting the status policy's binding",
    );
    let config_map: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "x"}, "data": {"a": "b"}}))
            .expect("a ConfigMap");
    forbidden(
        Api::<ConfigMap>::namespaced(operator.clone(), release_namespace)
            .create(&dry, &config_map)
            .await
            .map(|_| ()),
        "creating a ConfigMap in its own namespace",
    );
    forbidden(
        Api::<ConfigMap>::namespaced(operator.clone(), unbound)
            .create(&dry, &config_map)
            .await
            .map(|_| ()),
        "creating a ConfigMap in a namespace that did not opt in",
    );
    forbidden(
        Api::<Job>::namespaced(operator.clone(), unbound)
            .create(&dry, &job)
            .await
            .map(|_| ()),
        "creating a Job in a namespace that did not opt in",
    );
}

/// Waits until the admission policies of `release` no longer exist and no longer refuse: a
/// status write by admin in a namespace of no other release goes through (a dry run).
async fn wait_policies_gone(env: &TestEnv, release: &str) {
    use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(env.admin());
    let name = format!("{release}.status-owner.backlog.dev");
    wait_until(
        STEP,
        "the release's policy bindings are deleted",
        || async { bindings.get_opt(&name).await.ok()?.is_none().then_some(()) },
    )
    .await;
    let scratch = env.create_namespace("chart-probe").await;
    apply_as_admin::<RetryPolicy>(
        env,
        &scratch,
        json!({
            "apiVersion": "backlog.dev/v1alpha1",
            "kind": "RetryPolicy",
            "metadata": {"name": "probe"},
            "spec": {"maxAttempts": 1, "backoff": {"base": "1s", "cap": "1s", "jitter": "None"}},
        }),
    )
    .await;
    let policies = Api::<RetryPolicy>::namespaced(env.admin(), &scratch);
    wait_until(
        STEP,
        "no policy refuses an admin's status write any more",
        || async {
            policies
                .patch_status(
                    "probe",
                    &PatchParams {
                        dry_run: true,
                        ..PatchParams::default()
                    },
                    &Patch::Merge(json!({"status": {"policyHash": "probe"}})),
                )
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
    )
    .await;
}

fn a_namespaced_install_is_enough_for_its_namespace(env: &TestEnv) {
    // Held for the whole test (outside async code): one in-process operator, and one release's
    // admission policies, at a time.
    let _one_at_a_time = OPERATOR
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let release_namespace = env.fresh_namespace("chart-team");
    let watched = env.fresh_namespace("chart-team-apps");
    let helm = helm(env, env.kubeconfig_path());
    let watch = format!("watchNamespaces={{{watched}}}");
    install(&helm, "team", &release_namespace, &[&watch]);
    let name = "invoices";
    env.block_on(async {
        let admin = env.admin();
        assert!(
            Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(admin.clone())
                .get_opt("team-backlog-operator")
                .await
                .expect("reading ClusterRoles")
                .is_none(),
            "no ClusterRole for a namespaced install"
        );
        Api::<Role>::namespaced(admin.clone(), &watched)
            .get("team-backlog-operator")
            .await
            .expect("the Role in the watched namespace");

        let token = service_account_token(env, &release_namespace, "team-backlog-operator").await;
        let operator_client = client_with_token(env, &token);
        let _show_warnings = capture_warnings();
        let _exporter = serve_load(env, &watched, name);
        support::workload::deployment(env, &watched, name, 2).await;
        apply_as_admin::<BacklogBudget>(env, &watched, budget_body(name, None)).await;
        let operator = Operator::with_client(
            env,
            operator_client.clone(),
            Scope::Namespace(watched.clone()),
            Some(env.prometheus_url()),
        );
        assert_budget_scaled(env, &watched, name).await;
        // The release's policies hold in its namespace: a replay runs under them.
        grant_replay_users(env, &watched).await;
        run_a_replay(env, &watched).await;
        drop(operator);
        assert_nothing_forbidden("the namespaced operator");

        let other = env.create_namespace("chart-team-other").await;
        assert_access(
            &operator_client,
            "the namespaced install's ServiceAccount",
            &[
                ("patch", "apps:deployments/scale", Some(&watched), true),
                ("list", "apps:deployments", Some(&watched), true),
                ("create", "batch:jobs", Some(&watched), true),
                ("patch", "apps:deployments/scale", Some(&other), false),
                ("list", "apps:deployments", None, false),
                ("list", "backlog.dev:backlogbudgets", None, false),
                ("get", "configmaps", Some(&other), false),
                ("create", "events.k8s.io:events", Some(&other), false),
                ("get", "secrets", Some(&watched), false),
                ("create", "batch:jobs", Some("kube-system"), false),
                ("patch", "configmaps", Some(&release_namespace), false),
            ],
        )
        .await;
        assert_refused_requests(
            &operator_client,
            "team-backlog-operator",
            &release_namespace,
            &other,
        )
        .await;
    });
    helm.ok(&[
        "uninstall",
        "team",
        "--namespace",
        &release_namespace,
        "--wait",
    ]);
    env.block_on(wait_policies_gone(env, "team-backlog-operator"));
}

/// Stops the child process when the test ends, also when it panics.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn the_binary_accepts_the_charts_arguments_and_leads_with_its_lease_role(env: &TestEnv) {
    let release_namespace = env.fresh_namespace("chart-lease");
    let quiet = env.fresh_namespace("chart-lease-apps");
    let helm = helm(env, env.kubeconfig_path());
    install(
        &helm,
        "lease",
        &release_namespace,
        &[
            // Cluster-wide policies of this release would hold in the other tests' namespaces.
            "admission.enabled=false",
            "leaderElection.leaseDuration=3s",
            "leaderElection.renewDeadline=2s",
            "leaderElection.retryPeriod=500ms",
            "prometheusUrl=http://127.0.0.1:9",
        ],
    );
    env.block_on(async {
        let deployment = Api::<Deployment>::namespaced(env.admin(), &release_namespace)
            .get("lease-backlog-operator")
            .await
            .expect("the operator's Deployment");
        let container = deployment
            .spec
            .and_then(|s| s.template.spec)
            .and_then(|s| s.containers.into_iter().next())
            .expect("the operator container");
        // The chart's arguments, on loopback, and one namespace with nothing in it, so this
        // binary does not reconcile what the other tests create.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let mut args: Vec<String> = container
            .args
            .expect("args")
            .into_iter()
            .map(|a| {
                if a.starts_with("--listen=") {
                    format!("--listen=127.0.0.1:{port}")
                } else {
                    a
                }
            })
            .collect();
        args.push(format!("--namespace={quiet}"));
        assert_eq!(args[0], "run", "{args:?}");

        let token = service_account_token(env, &release_namespace, "lease-backlog-operator").await;
        let kubeconfig = write_kubeconfig(env, &release_namespace, &token);
        let pod_name = "lease-backlog-operator-7d9f-abcde";
        let _binary = Running(
            Command::new(env!("CARGO_BIN_EXE_backlog-operator"))
                .args(&args)
                .env("KUBECONFIG", &kubeconfig)
                .env("POD_NAME", pod_name)
                .env("POD_NAMESPACE", &release_namespace)
                .env_remove("PROMETHEUS_URL")
                .env_remove("WATCH_NAMESPACE")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start backlog-operator with the chart's arguments"),
        );
        let leases = Api::<Lease>::namespaced(env.admin(), &release_namespace);
        let first = wait_until(STEP, "the binary holds the chart's Lease", || async {
            let spec = leases.get_opt("backlog-operator").await.ok()??.spec?;
            (spec.holder_identity.as_deref() == Some(pod_name)).then_some(spec.renew_time?)
        })
        .await;
        wait_until(STEP, "the binary renews the Lease (update)", || async {
            let spec = leases.get_opt("backlog-operator").await.ok()??.spec?;
            let renewed = spec.renew_time?;
            (spec.holder_identity.as_deref() == Some(pod_name) && renewed.0 > first.0).then_some(())
        })
        .await;
        wait_until(STEP, "/readyz answers 200", || async {
            let response = reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
                .await
                .ok()?;
            (response.status().as_u16() == 200).then_some(())
        })
        .await;
    });
}

/// A kubeconfig for the ServiceAccount's token, as in-cluster config would give the Pod.
fn write_kubeconfig(env: &TestEnv, namespace: &str, token: &str) -> PathBuf {
    let info = env.cluster().info();
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {
            "server": info.apiserver_url,
            "certificate-authority": info.ca_file,
        }}],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "test", "user": "operator", "namespace": namespace}}],
        "current-context": "operator",
    });
    let path = info
        .state_dir
        .join(format!("kubeconfig-{namespace}-operator"));
    std::fs::write(&path, serde_yaml::to_string(&kubeconfig).expect("YAML"))
        .expect("write the kubeconfig");
    path
}

fn installing_the_packaged_chart_installs_the_crds(env: &TestEnv) {
    // A control plane of its own without CRDs (its repository root has no crds/).
    let empty = scratch_dir(env, "bare-repo");
    let bare = LocalCluster::start(Options::default().prometheus(false).repo_root(&empty))
        .expect("a bare control plane");
    let helm = helm(env, bare.kubeconfig_path());
    let out = scratch_dir(env, "bare-package");
    let chart = chart_dir();
    helm.ok(&[
        "package",
        chart.to_str().expect("utf-8 path"),
        "--destination",
        out.to_str().expect("utf-8 path"),
    ]);
    let package = out.join("backlog-operator-0.1.0.tgz");
    let package = package.to_str().expect("utf-8 path");
    let image = format!("image.tag={IMAGE_TAG}");
    helm.ok(&[
        "install",
        "backlog",
        package,
        "--namespace",
        "backlog-operator",
        "--create-namespace",
        "--set",
        &image,
    ]);
    let crd_names: Vec<String> = std::fs::read_dir(repo().join("crds"))
        .expect("crds/")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .trim_end_matches(".yaml")
                .to_owned()
        })
        .collect();
    assert_eq!(
        crd_names.len(),
        backlog_operator::api::all_crds().len(),
        "{crd_names:?}"
    );
    env.block_on(async {
        let kubeconfig =
            kube::config::Kubeconfig::read_from(bare.kubeconfig_path()).expect("kubeconfig");
        let config =
            Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                .await
                .expect("config");
        let client = Client::try_from(config).expect("a client of the bare cluster");
        let crds = Api::<CustomResourceDefinition>::all(client.clone());
        for name in &crd_names {
            wait_until(STEP, &format!("CRD {name} is established"), || async {
                let crd = crds.get_opt(name).await.ok()??;
                crd.status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(())
            })
            .await;
        }
        // The kinds are served next to the chart's objects.
        let budgets = Api::<BacklogBudget>::namespaced(client.clone(), "backlog-operator");
        wait_until(STEP, "BacklogBudgets are served", || async {
            budgets.list(&ListParams::default()).await.ok()
        })
        .await;
        Api::<Deployment>::namespaced(client.clone(), "backlog-operator")
            .get("backlog-backlog-operator")
            .await
            .expect("the operator's Deployment");

        // helm uninstall removes the release's objects and keeps the CRDs (and so every
        // custom resource in the cluster).
        helm.ok(&["uninstall", "backlog", "--namespace", "backlog-operator"]);
        let roles = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(client.clone());
        assert!(
            roles
                .get_opt("backlog-backlog-operator")
                .await
                .expect("ClusterRoles")
                .is_none(),
            "the ClusterRole is gone"
        );
        for name in &crd_names {
            assert!(
                crds.get_opt(name).await.expect("CRDs").is_some(),
                "{name} survives uninstall"
            );
        }
    });
    drop(bare);
}

// ---------------------------------------------------------------------------------------------
// Replays

fn replay_body(name: &str, requested_by: &str) -> Value {
    json!({
        "apiVersion": "backlog.dev/v1alpha1",
        "kind": "ReplayJob",
        "metadata": {"name": name},
        "spec": {
            "source": {"queue": "chart.refunds.dlq"},
            "scope": {"eventType": "refund.requested", "eventIds": ["r-1", "r-2", "r-3"]},
            "reason": "refund.requested events failed before the fix",
            "requestedBy": requested_by,
            "batches": {"size": 2, "canary": 1, "ratePerSecond": 5},
            "template": {"spec": {"containers": [{
                "name": "replay",
                "image": "registry.example.com/refunds/replay-tool:1",
            }]}},
        }
    })
}

/// Lets alice and bob ask for and approve replays in `namespace` (the admission policy decides
/// who may do which).
async fn grant_replay_users(env: &TestEnv, namespace: &str) {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    apply_as_admin::<Role>(
        env,
        namespace,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "replay-users"},
            "rules": [{"apiGroups": ["backlog.dev"], "resources": ["replayjobs"], "verbs": ["get", "create", "patch"]}],
        }),
    )
    .await;
    apply_as_admin::<RoleBinding>(
        env,
        namespace,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "replay-users"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "replay-users"},
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"},
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"},
            ],
        }),
    )
    .await;
}
