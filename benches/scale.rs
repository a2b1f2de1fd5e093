//! `make bench-scale N=1000`: one operator process (release) and N BacklogBudgets on the local
//! control plane and Prometheus, each on a Deployment of its own, with metrics that do not
//! move. Over a steady window after settling it reports the operator's RSS (median, max) and
//! CPU seconds, the API requests by verb and resource from the API server's own
//! `apiserver_request_total`, the queries Prometheus answered, the time from creating the
//! budgets to every one having a status, and, after the window, the time from one consumer's
//! backlog rising in Prometheus to the scale write on its Deployment.
//!
//! Settings (environment): `N` budgets (100), `SETTLE` and `WINDOW` seconds (180 and 300),
//! `POLL` seconds (15), `GROUP_BY=1` to give every budget `metrics.groupBy: group` (their
//! queries differ only in that label's value), `OPERATOR_ARGS` for more operator flags
//! (`OPERATOR_ARGS=--api-qps=0`), `OPERATOR_LOG` for a path to keep the operator's log at (it
//! is in the throwaway cluster's directory otherwise), `OPERATOR_WRAPPER` for a command to run
//! it under (`OPERATOR_WRAPPER="heaptrack -o /tmp/profile"`; a heap profile needs the system
//! allocator, `cargo bench --bench scale --no-default-features`; RSS and CPU are then the
//! wrapper's).

// Shared with the integration tests, which use all of it.
#[allow(dead_code)]
#[path = "../tests/support/exporter.rs"]
mod exporter;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use local_cluster::{LocalCluster, Options};
use serde_json::{Value, json};

use backlog_operator::api::backlog_budget::BacklogBudget;
use exporter::Exporter;

const NAMESPACE: &str = "scale";
const JOB: &str = "scale";

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn budget_name(i: u64) -> String {
    format!("c{i:05}")
}

fn main() {
    let n = setting("N", 100);
    // Three minutes from creation, as the comparison with KEDA was measured.
    let settle = Duration::from_secs(setting("SETTLE", 180));
    let window = Duration::from_secs(setting("WINDOW", 300));
    let poll = setting("POLL", 15);
    let group_by = setting("GROUP_BY", 0) == 1;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cluster = LocalCluster::start(Options::default().prometheus(true))
        .unwrap_or_else(|e| panic!("the local control plane and Prometheus did not start: {e}"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let prometheus = cluster
        .prometheus_url()
        .expect("Prometheus runs")
        .to_owned();
    let client = runtime.block_on(admin_client(&cluster));

    // Every consumer's series, constant: 500 events/s against 200/s per replica is 3 replicas.
    let exporter = Exporter::start();
    for i in 0..n {
        let group = budget_name(i);
        let labels = [("group", group.as_str())];
        exporter.set("scale_lag", &labels, 1000.0);
        exporter.set("scale_produce_rate", &labels, 500.0);
        exporter.set("scale_oldest_age_seconds", &labels, 2.0);
    }
    cluster
        .add_scrape_target(JOB, &exporter.target(), &[])
        .expect("a scrape target");
    runtime.block_on(wait_for_series(&prometheus, n));

    let created = runtime.block_on(create_objects(&client, n, poll, group_by));
    let api_at_start = runtime.block_on(apiserver_requests(&client));
    let operator = Operator(start_operator(&cluster, &prometheus));
    let pid = operator.0.id();
    let to_status = runtime.block_on(wait_all_have_status(&client, n, created));
    eprintln!("statuses: {to_status}");
    let api_at_statuses = runtime.block_on(apiserver_requests(&client));
    let to_document = runtime.block_on(wait_all_have_documents(&client, n, created));
    eprintln!("control documents: {to_document}");

    std::thread::sleep(settle.saturating_sub(created.elapsed()));
    // The steady window.
    let api_before = runtime.block_on(apiserver_requests(&client));
    let queries_before = runtime.block_on(prometheus_queries(&prometheus));
    let cpu_before = cpu_seconds(pid);
    let started = Instant::now();
    let (mut rss, mut rss_anonymous, mut rss_file) = (Vec::new(), Vec::new(), Vec::new());
    while started.elapsed() < window {
        rss.extend(rss_mib(pid, "VmRSS:"));
        rss_anonymous.extend(rss_mib(pid, "RssAnon:"));
        rss_file.extend(rss_mib(pid, "RssFile:"));
        std::thread::sleep(Duration::from_secs(5));
    }
    let cpu = cpu_seconds(pid) - cpu_before;
    let queries = runtime.block_on(prometheus_queries(&prometheus)) - queries_before;
    let api_after = runtime.block_on(apiserver_requests(&client));
    for samples in [&mut rss, &mut rss_anonymous, &mut rss_file] {
        samples.sort_by(f64::total_cmp);
    }

    // One consumer's backlog rises; the others stay.
    let reaction = runtime.block_on(reaction_time(&client, &exporter, &prometheus, poll));

    println!(
        "## Scale: {n} budgets{}, poll {poll}s, steady window {}s after {}s",
        if group_by { " with groupBy" } else { "" },
        window.as_secs(),
        settle.as_secs()
    );
    println!();
    println!("| measure | value |");
    println!("|---|---:|");
    println!("| create → every budget has a status | {to_status} |");
    println!("| create → every budget has its control document | {to_document} |");
    if let (Some(median), Some(max)) = (rss.get(rss.len() / 2), rss.last()) {
        println!("| RSS median / max | {median:.1} / {max:.1} MiB |");
    }
    // What the heap holds against what the binary's mapped pages hold.
    if let (Some(anonymous), Some(file)) = (
        rss_anonymous.get(rss_anonymous.len() / 2),
        rss_file.get(rss_file.len() / 2),
    ) {
        println!("| of it, anonymous / file-backed (median) | {anonymous:.1} / {file:.1} MiB |");
    }
    println!("| CPU seconds in the window | {cpu:.1} s |");
    println!(
        "| CPU seconds per 100 budgets per 5 min | {:.2} s |",
        cpu * 100.0 / n as f64 * 300.0 / window.as_secs_f64()
    );
    println!("| Prometheus queries in the window | {queries:.0} |");
    println!(
        "| queries per budget per poll | {:.2} |",
        queries / n as f64 / (window.as_secs_f64() / poll as f64)
    );
    match reaction {
        Ok(seconds) => println!("| backlog visible in Prometheus → scale write | {seconds:.1} s |"),
        Err(why) => println!("| backlog visible in Prometheus → scale write | not seen: {why} |"),
    }
    println!();
    println!("API requests in the window (apiserver_request_total), by verb and resource:");
    println!();
    print_requests(&api_before, &api_after);
    println!();
    println!("API requests from the operator's start until every budget had a status:");
    println!();
    print_requests(&api_at_start, &api_at_statuses);

    drop(operator);
    drop(exporter);
    drop(cluster);
}

/// The requests counted between two readings of `apiserver_request_total`, as a table.
fn print_requests(
    before: &BTreeMap<(String, String), f64>,
    after: &BTreeMap<(String, String), f64>,
) {
    println!("| verb | resource | requests |");
    println!("|---|---|---:|");
    let mut total = 0.0;
    for (key, count) in after {
        let delta = count - before.get(key).copied().unwrap_or(0.0);
        if delta >= 1.0 {
            println!("| {} | {} | {delta:.0} |", key.0, key.1);
            total += delta;
        }
    }
    println!("| all | | {total:.0} |");
}

async fn admin_client(cluster: &LocalCluster) -> Client {
    let kubeconfig = Kubeconfig::read_from(cluster.kubeconfig_path()).expect("the kubeconfig");
    let options = KubeConfigOptions {
        context: Some("admin".to_owned()),
        ..KubeConfigOptions::default()
    };
    let config = Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .expect("the admin context");
    Client::try_from(config).expect("a client")
}

/// Waits until Prometheus has scraped every consumer's backlog.
async fn wait_for_series(prometheus: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if let Some(found) = query(prometheus, "count(scale_lag)").await
            && found >= n as f64
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("Prometheus did not scrape {n} series within 120 s");
}

async fn query(prometheus: &str, expression: &str) -> Option<f64> {
    let text = reqwest::Client::new()
        .get(format!("{prometheus}/api/v1/query"))
        .query(&[("query", expression)])
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let response: Value = serde_json::from_str(&text).ok()?;
    response["data"]["result"][0]["value"][1]
        .as_str()?
        .parse()
        .ok()
}

fn budget_body(name: &str, poll: u64, group_by: bool) -> Value {
    let series = |metric: &str| format!("{metric}{{group=\"{name}\", job=\"{JOB}\"}}");
    let mut metrics = json!({
        "backlog": format!("sum({})", series("scale_lag")),
        "oldestUnfinishedAge": format!("max({})", series("scale_oldest_age_seconds")),
        "produceRate": format!("sum({})", series("scale_produce_rate")),
    });
    if group_by {
        metrics["groupBy"] = json!("group");
    }
    json!({
        "apiVersion": "backlog.dev/v1alpha1",
        "kind": "BacklogBudget",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": 1,
            "maxReplicas": 12,
            "completionDeadline": "10m",
            "partitionCount": 12,
            "pollInterval": format!("{poll}s"),
            "metrics": metrics,
            "capacity": {"perReplicaRate": 200, "reservedRetryShare": 0},
        }
    })
}

fn deployment_body(name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "consumer", "image": "localhost/consumer:none"}]},
            },
        }
    })
}

/// Creates the namespace, the Deployments and the budgets; returns when the last budget was
/// created.
async fn create_objects(client: &Client, n: u64, poll: u64, group_by: bool) -> Instant {
    let apply = PatchParams::apply("bench-scale").force();
    Api::<Namespace>::all(client.clone())
        .patch(
            NAMESPACE,
            &apply,
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
            ),
        )
        .await
        .expect("the namespace");
    let deployments = Api::<Deployment>::namespaced(client.clone(), NAMESPACE);
    apply_all(&deployments, n, deployment_body).await;
    let budgets = Api::<BacklogBudget>::namespaced(client.clone(), NAMESPACE);
    apply_all(&budgets, n, |name| budget_body(name, poll, group_by)).await;
    Instant::now()
}

/// The operator process, stopped when dropped, also when the bench fails half-way: asked to
/// stop (SIGTERM, so it exits as in a rollout and an allocator's exit statistics, with
/// `_RJEM_MALLOC_CONF=stats_print:true`, reach its log), killed if it has not after ten seconds. The
/// signals go to its process group, which holds a profiler wrapping it too.
struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let Ok(group) = libc::pid_t::try_from(self.0.id()) else {
            let _ = self.0.kill();
            let _ = self.0.wait();
            return;
        };
        // SAFETY: kill has no memory preconditions; the group is our child's own.
        unsafe { libc::kill(-group, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // SAFETY: as above; whatever is left of the group goes.
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// Applies `body(name)` for the first `n` names, 16 at a time.
async fn apply_all<K>(api: &Api<K>, n: u64, body: impl Fn(&str) -> Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let apply = PatchParams::apply("bench-scale").force();
    futures::stream::iter(0..n)
        .map(|i| {
            let name = budget_name(i);
            let body = body(&name);
            let apply = &apply;
            async move {
                api.patch(&name, apply, &Patch::Apply(body))
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("applying {name}: {e}"))
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// `OPERATOR_ARGS`: more flags for the operator, split at whitespace (`--api-qps=0`).
fn operator_args() -> Vec<String> {
    std::env::var("OPERATOR_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn start_operator(cluster: &LocalCluster, prometheus: &str) -> Child {
    let path = std::env::var_os("OPERATOR_LOG").map_or_else(
        || cluster.state_dir().join("operator-scale.log"),
        Into::into,
    );
    let log = std::fs::File::create(path).expect("the operator's log");
    // A profiler may wrap the operator: `OPERATOR_WRAPPER="heaptrack -o /tmp/profile"`.
    let wrapper = std::env::var("OPERATOR_WRAPPER").unwrap_or_default();
    let mut words = wrapper.split_whitespace();
    let mut command = match words.next() {
        Some(program) => {
            let mut command = Command::new(program);
            command
                .args(words)
                .arg(env!("CARGO_BIN_EXE_backlog-operator"));
            command
        }
        None => Command::new(env!("CARGO_BIN_EXE_backlog-operator")),
    };
    command
        .process_group(0)
        .args([
            "run",
            "--listen=127.0.0.1:0",
            &format!("--namespace={NAMESPACE}"),
            &format!("--prometheus-url={prometheus}"),
            "--identity=bench-scale",
        ])
        .args(operator_args())
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("the log"))
        .stderr(log)
        .spawn()
        .expect("start backlog-operator")
}

/// How long after creation every budget had a status, or how many had one after 10 minutes.
/// Watched, not listed in a loop: a LIST of 10,000 budgets every half second would load the
/// API server the operator is measured against.
async fn wait_all_have_status(client: &Client, n: u64, created: Instant) -> String {
    let budgets = Api::<BacklogBudget>::namespaced(client.clone(), NAMESPACE);
    wait_for_all(budgets, n, created, |budget| {
        budget.status.as_ref().is_some_and(|s| s.phase.is_some())
    })
    .await
}

/// How long after creation every budget's control document existed.
async fn wait_all_have_documents(client: &Client, n: u64, created: Instant) -> String {
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE);
    wait_for_all(configmaps, n, created, |configmap| {
        configmap
            .metadata
            .name
            .as_deref()
            .is_some_and(|name| name.ends_with("-control"))
    })
    .await
}

/// How long after `created` `n` objects of `api` were `done`, or how many were after 10 minutes.
async fn wait_for_all<K>(api: Api<K>, n: u64, created: Instant, done: impl Fn(&K) -> bool) -> String
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use kube::runtime::{WatchStreamExt, watcher};
    let mut finished = std::collections::HashSet::new();
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    loop {
        match tokio::time::timeout_at(deadline, events.next()).await {
            Ok(Some(Ok(object))) => {
                if done(&object) {
                    finished.insert(object.meta().name.clone().unwrap_or_default());
                }
                if finished.len() as u64 >= n {
                    return format!("{:.1} s", created.elapsed().as_secs_f64());
                }
            }
            // The watcher retries after a backoff.
            Ok(Some(Err(_))) => {}
            Ok(None) | Err(_) => {
                return format!(
                    "only {} of {n} after {:.0} s",
                    finished.len(),
                    created.elapsed().as_secs_f64()
                );
            }
        }
    }
}

/// `apiserver_request_total` summed by (verb, resource/subresource).
async fn apiserver_requests(client: &Client) -> BTreeMap<(String, String), f64> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a request");
    let text = client
        .request_text(request)
        .await
        .expect("the API server's /metrics");
    let mut counts = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(&format!("{name}=\""))
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or("")
                .to_owned()
        };
        let resource = match label("subresource").as_str() {
            "" => label("resource"),
            sub => format!("{}/{sub}", label("resource")),
        };
        *counts.entry((label("verb"), resource)).or_insert(0.0) += value.parse().unwrap_or(0.0);
    }
    counts
}

/// Instant queries Prometheus has answered.
async fn prometheus_queries(prometheus: &str) -> f64 {
    let text = reqwest::get(format!("{prometheus}/metrics"))
        .await
        .expect("Prometheus' /metrics")
        .text()
        .await
        .expect("its text");
    text.lines()
        .filter(|l| {
            l.starts_with("prometheus_http_requests_total{")
                && l.contains("handler=\"/api/v1/query\"")
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name in parentheses: utime and stime are fields 14 and 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) / per_second
}

/// One of the resident-memory lines of `/proc/<pid>/status` (`VmRSS:`, `RssAnon:`, `RssFile:`).
fn rss_mib(pid: u32, line: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(line))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// Raises the first consumer's backlog; the seconds from Prometheus showing it to the
/// Deployment's replicas changing.
async fn reaction_time(
    client: &Client,
    exporter: &Exporter,
    prometheus: &str,
    poll: u64,
) -> Result<f64, String> {
    let name = budget_name(0);
    let labels = [("group", name.as_str())];
    // Its oldest event is past the warning fraction of the deadline (5 of 10 minutes) and
    // arrivals outrun the replicas: a scale-up is due at once.
    exporter.set("scale_lag", &labels, 400_000.0);
    exporter.set("scale_produce_rate", &labels, 2000.0);
    exporter.set("scale_oldest_age_seconds", &labels, 400.0);
    let deployments = Api::<Deployment>::namespaced(client.clone(), NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(60 + 4 * poll);
    let mut visible = None;
    while Instant::now() < deadline {
        if visible.is_none()
            && query(
                prometheus,
                &format!("max(scale_oldest_age_seconds{{group=\"{name}\"}})"),
            )
            .await
                == Some(400.0)
        {
            visible = Some(Instant::now());
        }
        let replicas = deployments
            .get(&name)
            .await
            .ok()
            .and_then(|d| d.spec?.replicas);
        if let (Some(seen), Some(r)) = (visible, replicas)
            && r != 3
        {
            return Ok(seen.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "no scale within {}s (visible in Prometheus: {})",
        60 + 4 * poll,
        visible.is_some()
    ))
}
