//! Shared harness of the integration tests: each test binary (`harness =
//! false`, `mod support;`) runs its tests against ONE real local control plane
//! (etcd + kube-apiserver, optionally Prometheus) that is started before the
//! first test runs and stopped after the last, also when tests panic.
//!
//! ```ignore
//! mod support;
//! use support::{Test, TestEnv};
//!
//! fn main() -> std::process::ExitCode {
//!     support::run(support::tests![creates_a_thing, rejects_bad_input], false)
//! }
//!
//! fn creates_a_thing(env: &TestEnv) {
//!     let client = env.admin();
//!     env.block_on(async { /* ... */ });
//! }
//! ```
//!
//! Test functions take `&TestEnv` and fail by panicking (`assert!`,
//! `expect`); libtest-mimic reports each panic as that test's failure. They
//! run in parallel threads, so each test should work in its own namespace
//! (`env.fresh_namespace("...")`).
#![allow(dead_code)] // every test binary uses a different part of this module

pub mod exporter;
pub mod four_eyes;
pub mod helm;
pub mod identity;
pub mod operator;
pub mod process;
pub mod refusal;
pub mod workload;

use std::collections::BTreeMap;
use std::collections::hash_map::RandomState;
use std::fmt::Debug;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use libtest_mimic::{Arguments, Failed, Trial};
use local_cluster::{LocalCluster, Options};

/// How often `wait_until` re-checks its condition.
const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// One integration test: a name and a body that panics on failure.
pub struct Test {
    name: String,
    ignored: bool,
    body: Box<dyn FnOnce(&TestEnv) + Send + 'static>,
}

impl Test {
    pub fn new(name: impl Into<String>, body: impl FnOnce(&TestEnv) + Send + 'static) -> Self {
        Test {
            name: name.into(),
            ignored: false,
            body: Box::new(body),
        }
    }

    /// Marks the test `#[ignore]`d (run it with `-- --ignored`).
    pub fn ignored(mut self) -> Self {
        self.ignored = true;
        self
    }
}

/// `tests![a, b, c]` turns test functions `fn(&TestEnv)` into a
/// `Vec<Test>` named after the functions.
macro_rules! tests {
    ($($test:path),* $(,)?) => {
        vec![$($crate::support::Test::new(stringify!($test), $test)),*]
    };
}
pub(crate) use tests;

/// Runs `tests` against one control plane and returns the exit code for
/// `main`. Takes the usual test-binary arguments (filters, `--list`,
/// `--test-threads`, ...). The cluster starts when the first selected test
/// begins, so `--list` and filters that select nothing start no cluster; it
/// is stopped after the last test, before this returns.
pub fn run(tests: Vec<Test>, needs_prometheus: bool) -> ExitCode {
    run_with(tests, needs_prometheus, false, false)
}

/// Like [`run`], with the API server's audit log of writes
/// ([`TestEnv::audit_events`]), for tests that count who wrote what.
pub fn run_audited(tests: Vec<Test>, needs_prometheus: bool) -> ExitCode {
    run_with(tests, needs_prometheus, false, true)
}

/// Like [`run`], on a cluster with a real node (kubelet, containerd, controller-manager,
/// scheduler, kube-proxy in a network namespace of its own) that runs the images `make image`
/// wrote. If the node cannot start, every test fails with the reason.
pub fn run_on_node(tests: Vec<Test>, needs_prometheus: bool) -> ExitCode {
    run_with(tests, needs_prometheus, true, false)
}

fn run_with(tests: Vec<Test>, needs_prometheus: bool, node: bool, audit: bool) -> ExitCode {
    let mut args = Arguments::from_args();
    // The tests mostly wait on the API server, not on the CPU; more threads
    // than cores keeps a 2-core machine busy.
    if args.test_threads.is_none() {
        args.test_threads = Some(4);
    }
    let shared = Arc::new(Shared {
        env: OnceLock::new(),
        needs_prometheus,
        node,
        audit,
    });
    let trials = tests
        .into_iter()
        .map(|test| {
            let shared = Arc::clone(&shared);
            let Test {
                name,
                ignored,
                body,
            } = test;
            Trial::test(name, move || {
                let env = shared.env().map_err(Failed::from)?;
                body(env);
                Ok(())
            })
            .with_ignored_flag(ignored)
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    // The trials, and their references to `shared`, are gone: this drops the
    // environment, which stops the cluster before the process exits.
    drop(shared);
    conclusion.exit_code()
}

struct Shared {
    env: OnceLock<Result<TestEnv, String>>,
    needs_prometheus: bool,
    node: bool,
    audit: bool,
}

impl Shared {
    fn env(&self) -> Result<&TestEnv, String> {
        self.env
            .get_or_init(|| TestEnv::start(self.needs_prometheus, self.node, self.audit))
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// What every test gets: the cluster, clients per user and a tokio runtime.
pub struct TestEnv {
    // Declared first so it is dropped first: client tasks end before the
    // cluster goes away.
    runtime: tokio::runtime::Runtime,
    configs: BTreeMap<String, Config>,
    namespaces: AtomicU64,
    cluster: LocalCluster,
}

impl TestEnv {
    fn start(needs_prometheus: bool, node: bool, audit: bool) -> Result<TestEnv, String> {
        let started = Instant::now();
        // kube, ureq and reqwest share rustls; install its one provider
        // explicitly. An error only means one is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut options = Options::default()
            .prometheus(needs_prometheus)
            .audit_log(audit);
        if node {
            options = options.node(image_archives()?);
        }
        let cluster = LocalCluster::start(options).map_err(|e| {
            if node {
                format!("the local cluster with a node did not start: {e}")
            } else {
                format!("the local control plane did not start: {e}")
            }
        })?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        let kubeconfig = Kubeconfig::read_from(cluster.kubeconfig_path())
            .map_err(|e| format!("reading the kubeconfig: {e}"))?;
        let mut configs = BTreeMap::new();
        for user in local_cluster::USERS {
            let options = KubeConfigOptions {
                context: Some(user.to_string()),
                ..KubeConfigOptions::default()
            };
            let config = runtime
                .block_on(Config::from_custom_kubeconfig(kubeconfig.clone(), &options))
                .map_err(|e| format!("kubeconfig context {user}: {e}"))?;
            configs.insert(user.to_string(), config);
        }
        eprintln!(
            "local {} v{} ready at {} in {:.1}s (state: {})",
            if node {
                "cluster with a node"
            } else {
                "control plane"
            },
            local_cluster::kubernetes_version(),
            cluster.apiserver_url(),
            started.elapsed().as_secs_f64(),
            cluster.state_dir().display()
        );
        Ok(TestEnv {
            runtime,
            configs,
            namespaces: AtomicU64::new(0),
            cluster,
        })
    }

    /// A client authenticated as `user` (`admin`, `alice`, `bob`, `carol` or `mallory`).
    /// Usable inside and outside `block_on`.
    pub fn client(&self, user: &str) -> Client {
        let config = self
            .configs
            .get(user)
            .unwrap_or_else(|| panic!("no user {user:?}; users: {:?}", local_cluster::USERS))
            .clone();
        // The client spawns its connection task on the current runtime.
        let _guard = self.runtime.enter();
        Client::try_from(config).unwrap_or_else(|e| panic!("client for {user}: {e}"))
    }

    /// A client for `admin` (group `system:masters`).
    pub fn admin(&self) -> Client {
        self.client("admin")
    }

    /// The kube config of `user`, e.g. to build a client with other options.
    pub fn config(&self, user: &str) -> Config {
        self.configs
            .get(user)
            .unwrap_or_else(|| panic!("no user {user:?}"))
            .clone()
    }

    pub fn cluster(&self) -> &LocalCluster {
        &self.cluster
    }

    /// Every write the API server logged so far (binaries started with [`run_audited`]).
    pub fn audit_events(&self) -> Vec<local_cluster::AuditEvent> {
        self.cluster
            .audit_events()
            .unwrap_or_else(|e| panic!("reading the audit log: {e}"))
    }

    pub fn kubeconfig_path(&self) -> &Path {
        self.cluster.kubeconfig_path()
    }

    /// The helm CLI: `$HELM_BIN`, else the one `tests/cluster/build-helm.sh` built from its
    /// Go module (on first use; then from its cache).
    pub fn helm_path(&self) -> PathBuf {
        local_cluster::helm().unwrap_or_else(|e| panic!("helm: {e}"))
    }

    pub fn token(&self, user: &str) -> &str {
        self.cluster
            .token(user)
            .unwrap_or_else(|| panic!("no user {user:?}"))
    }

    /// `http://127.0.0.1:PORT`. Panics if the binary did not ask for
    /// Prometheus in `support::run`.
    pub fn prometheus_url(&self) -> &str {
        self.cluster
            .prometheus_url()
            .expect("Prometheus was not started: pass needs_prometheus = true to support::run")
    }

    /// Prometheus as pods on the node reach it (`http://10.250.0.1:PORT`).
    pub fn prometheus_url_from_pods(&self) -> &str {
        self.cluster
            .node()
            .and_then(|n| n.prometheus_url.as_deref())
            .expect("no node with Prometheus: use support::run_on_node(tests, true)")
    }

    /// Lets Prometheus scrape `target` (`127.0.0.1:PORT`) as job `job_name`.
    pub fn add_scrape_target(&self, job_name: &str, target: &str, labels: &[(&str, &str)]) {
        self.cluster
            .add_scrape_target(job_name, target, labels)
            .unwrap_or_else(|e| panic!("adding scrape target {job_name}: {e}"));
    }

    pub fn remove_scrape_target(&self, job_name: &str) {
        self.cluster
            .remove_scrape_target(job_name)
            .unwrap_or_else(|e| panic!("removing scrape target {job_name}: {e}"));
    }

    /// Runs async test code to completion. Do not nest calls.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    pub fn runtime(&self) -> &tokio::runtime::Runtime {
        &self.runtime
    }

    /// Creates a namespace named `<prefix>-<n>-<random>` as admin and
    /// returns its name. For async code use [`create_namespace`](Self::create_namespace).
    pub fn fresh_namespace(&self, prefix: &str) -> String {
        self.block_on(self.create_namespace(prefix))
    }

    /// Like [`fresh_namespace`](Self::fresh_namespace), labelled so that the API server admits
    /// only pods that meet the restricted Pod Security Standard.
    pub fn fresh_restricted_namespace(&self, prefix: &str) -> String {
        let name = self.fresh_namespace(prefix);
        self.block_on(async {
            Api::<Namespace>::all(self.admin())
                .patch(
                    &name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(serde_json::json!({"metadata": {"labels": {
                        "pod-security.kubernetes.io/enforce": "restricted",
                        "pod-security.kubernetes.io/enforce-version": "latest",
                    }}})),
                )
                .await
                .unwrap_or_else(|e| panic!("labelling {name}: {e}"));
        });
        name
    }

    /// The async form of [`fresh_namespace`](Self::fresh_namespace).
    pub async fn create_namespace(&self, prefix: &str) -> String {
        let n = self.namespaces.fetch_add(1, Ordering::Relaxed);
        let random = RandomState::new().build_hasher().finish() & 0xffff;
        // A DNS label: lowercase alphanumerics and '-', at most 63 characters.
        let mut prefix: String = prefix
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        prefix.truncate(40);
        let prefix = prefix.trim_matches('-');
        let prefix = if prefix.is_empty() { "test" } else { prefix };
        let name = format!("{prefix}-{n}-{random:04x}");
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(self.admin())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        name
    }
}

/// The directory `make image` writes its archives to: `$BACKLOG_IMAGES_DIR`, else
/// `target/images` of this repository.
pub fn images_dir() -> PathBuf {
    std::env::var_os("BACKLOG_IMAGES_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/images"))
}

/// The image archives of [`images_dir`]; an error says how to build them.
pub fn image_archives() -> Result<Vec<PathBuf>, String> {
    let dir = images_dir();
    let mut archives = Vec::new();
    for name in IMAGES {
        let path = dir.join(format!("{name}.tar"));
        if !path.is_file() {
            return Err(format!(
                "{} is missing: run `make image` (the node runs the project's images)",
                path.display()
            ));
        }
        archives.push(path);
    }
    Ok(archives)
}

/// The images `make image` builds.
pub const IMAGES: [&str; 4] = [
    "backlog-operator",
    "backlog-replay-worker",
    "backlog-compensation-worker",
    "backlog-demo-consumer",
];

/// The reference of one of [`IMAGES`] as the node knows it.
pub fn image(name: &str) -> String {
    format!("localhost/{name}:{}", env!("CARGO_PKG_VERSION"))
}

/// What a `wait_until` condition returns: `true`, `Some(value)` or
/// `Ok(value)` when it holds; otherwise the observation is remembered for
/// the timeout message.
pub trait Condition {
    type Output;
    fn check(self) -> Result<Self::Output, String>;
}

impl Condition for bool {
    type Output = ();
    fn check(self) -> Result<(), String> {
        if self { Ok(()) } else { Err("false".into()) }
    }
}

impl<T> Condition for Option<T> {
    type Output = T;
    fn check(self) -> Result<T, String> {
        self.ok_or_else(|| "None".into())
    }
}

impl<T, E: Debug> Condition for Result<T, E> {
    type Output = T;
    fn check(self) -> Result<T, String> {
        self.map_err(|e| format!("{e:?}"))
    }
}

/// Polls `condition` every 200 ms until it holds and returns its value.
/// Panics with `description` and the last observation once `timeout` has
/// passed (a check still running then is abandoned). Needs a tokio runtime:
/// call it inside `env.block_on`.
pub async fn wait_until<C, Fut, F>(
    timeout: Duration,
    description: &str,
    mut condition: F,
) -> C::Output
where
    F: FnMut() -> Fut,
    Fut: Future<Output = C>,
    C: Condition,
{
    let started = tokio::time::Instant::now();
    let deadline = started + timeout;
    let mut last = "never checked".to_string();
    loop {
        match tokio::time::timeout_at(deadline, condition()).await {
            Ok(result) => match result.check() {
                Ok(value) => return value,
                Err(observed) => last = observed,
            },
            Err(_) => last = format!("a check was still running at the deadline (before: {last})"),
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            panic!(
                "timed out after {:.1}s waiting until {description}; last observed: {last}",
                (now - started).as_secs_f64()
            );
        }
        tokio::time::sleep_until((now + POLL_INTERVAL).min(deadline)).await;
    }
}
