//! A real, local Kubernetes control plane for tests and demos: etcd and
//! kube-apiserver (built by `build-control-plane.sh` at the versions pinned in
//! `versions.env`) and optionally Prometheus, all on loopback, started the way
//! controller-runtime's envtest starts them. There is no controller-manager,
//! scheduler or kubelet: no garbage collection, no Pods from Deployments or
//! Jobs.
//!
//! Two ways to use it:
//! - [`LocalCluster::start`] for tests: the processes belong to the returned
//!   value, are stopped when it is dropped, and die with the test process even
//!   if that is killed (`PR_SET_PDEATHSIG`).
//! - [`LocalCluster::start_detached`], [`status`] and [`down`] for
//!   `local-cluster up|status|down`: the processes outlive the command and are
//!   found again through pid files in the state directory.
//!
//! With [`Options::node`] the cluster gets a real node: kube-controller-manager,
//! kube-scheduler, containerd + runc, kubelet and kube-proxy join etcd and the
//! API server inside a network namespace of their own (see [`node`]), and the
//! images given are loaded into the node's containerd. Pods, Jobs, garbage
//! collection and admission are then the real ones.
//!
//! Users come from a static token file with a random token per user and
//! cluster: `admin` (group `system:masters`), `alice` and `bob` (group
//! [`APPROVERS_GROUP`]), `carol` and `mallory` (no group). RBAC is the authorizer.

mod audit;
mod crds;
mod http;
pub mod image;
pub mod node;
mod pki;
mod process;
mod prometheus;
mod proxy;
mod restart;
pub mod rootfs;

pub use audit::{AuditEvent, read as read_audit_log};
pub use proxy::{ConnectionTimes, PausableProxy};
pub use restart::Restartable;

use std::collections::BTreeMap;
use std::env;
use std::ffi::OsStr;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::http::Http;
use crate::process::{Process, Spawner};

/// The users of every cluster, `admin` first.
pub const USERS: [&str; 5] = ["admin", "alice", "bob", "carol", "mallory"];

/// The group of `alice` and `bob`.
pub const APPROVERS_GROUP: &str = "backlog-approvers";

/// Groups of each user in the token file (`system:authenticated` is added by
/// the API server to everyone).
const USER_GROUPS: [(&str, &[&str]); 5] = [
    ("admin", &["system:masters"]),
    ("alice", &[APPROVERS_GROUP]),
    ("bob", &[APPROVERS_GROUP]),
    ("carol", &[]),
    // The hostile tenant of the security tests: no group; what she may do is what a test
    // grants her (typically a namespace's edit rights).
    ("mallory", &[]),
];

/// The kubeconfig's cluster entry.
const CLUSTER_NAME: &str = "local-cluster";

/// Marks a directory as ours, so `down` and a restart only ever delete
/// directories this crate created.
const MARKER: &str = ".local-cluster";
const INFO_FILE: &str = "cluster.json";
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(100);
/// Start attempts per process when a just-picked free port was taken by
/// someone else before the process bound it.
const START_ATTEMPTS: usize = 3;

/// The Kubernetes version the control plane is built at (from
/// `versions.env`), without a leading `v`, e.g. `1.36.3`.
pub fn kubernetes_version() -> &'static str {
    pinned_version("KUBERNETES_VERSION")
}

/// The etcd version the control plane is built at, e.g. `3.6.16`.
pub fn etcd_version() -> &'static str {
    pinned_version("ETCD_VERSION")
}

/// The helm version `build-helm.sh` builds, e.g. `3.22.0`.
pub fn helm_version() -> &'static str {
    pinned_version("HELM_VERSION")
}

/// The helm CLI for the chart tests: `$HELM_BIN` if set, else whatever
/// `build-helm.sh` prints (it builds on first use, then answers from its
/// cache). Blocking.
pub fn helm() -> Result<PathBuf, Error> {
    if let Some(path) = env::var_os("HELM_BIN").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(Error::Binaries(format!(
                "HELM_BIN={} is not a file",
                path.display()
            )))
        };
    }
    let path = run_build_script("build-helm.sh", &[])?;
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Binaries(format!(
            "build-helm.sh printed {}, which is not a file",
            path.display()
        )))
    }
}

/// The kstatus checker (what Flux's health checks make of an object) for the GitOps tests:
/// `$KSTATUS_BIN` if set, else whatever `build-kstatus.sh` prints (built on first use, then
/// from its cache). Blocking.
pub fn kstatus() -> Result<PathBuf, Error> {
    if let Some(path) = env::var_os("KSTATUS_BIN").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let path = run_build_script("build-kstatus.sh", &[])?;
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Binaries(format!(
            "build-kstatus.sh printed {}, which is not a file",
            path.display()
        )))
    }
}

fn pinned_version(key: &str) -> &'static str {
    include_str!("../versions.env")
        .lines()
        .filter_map(|line| line.trim().split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.trim())
        .unwrap_or("unknown")
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("control-plane binaries: {0}")]
    Binaries(String),
    #[error("key material: {0}")]
    Pki(String),
    #[error("{component} exited during start-up ({status}); last lines of {}:\n{tail}", log.display())]
    Exited {
        component: &'static str,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("{component} not ready within {timeout:?} (last probe: {last}); last lines of {}:\n{tail}", log.display())]
    NotReady {
        component: &'static str,
        timeout: Duration,
        last: String,
        log: PathBuf,
        tail: String,
    },
    #[error("installing CRDs from {}: {message}", file.display())]
    Crd { file: PathBuf, message: String },
    #[error("state directory {}: {message}", dir.display())]
    StateDir { dir: PathBuf, message: String },
    #[error("{0}")]
    InvalidArgument(String),
    #[error("image: {0}")]
    Image(String),
    #[error("node: {0}")]
    Node(String),
}

pub(crate) fn io_error(context: impl Into<String>, source: std::io::Error) -> Error {
    Error::Io {
        context: context.into(),
        source,
    }
}

fn state_error(dir: &Path, message: impl Into<String>) -> Error {
    Error::StateDir {
        dir: dir.to_path_buf(),
        message: message.into(),
    }
}

/// How to start a cluster. `Options::default()` starts etcd, kube-apiserver
/// and Prometheus in a fresh temporary directory and applies this
/// repository's `crds/`.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where state, logs, pid files and the kubeconfig go. `None`: a fresh
    /// temporary directory, removed when the cluster is dropped. A given
    /// directory is created if needed and kept (with the logs) after a stop.
    pub state_dir: Option<PathBuf>,
    /// Whether to start Prometheus too.
    pub prometheus: bool,
    /// The repository whose `crds/*.yaml` are applied. `None`: the
    /// repository this crate lives in.
    pub repo_root: Option<PathBuf>,
    /// Directory holding `etcd`, `kube-apiserver` and `kubectl`. `None`:
    /// `$BACKLOG_CONTROL_PLANE_BIN`, else whatever `build-control-plane.sh`
    /// prints (it builds on first use, then answers from its cache).
    pub binaries_dir: Option<PathBuf>,
    /// The Prometheus binary. `None`: `$PROMETHEUS_BIN`, else
    /// `/usr/bin/prometheus`.
    pub prometheus_bin: Option<PathBuf>,
    /// Deadline for each process to become ready, and for the CRDs.
    pub start_timeout: Duration,
    /// Whether to add a real node (needs root; see the [`node`] module).
    pub node: bool,
    /// OCI image archives to load into the node's containerd (`make image` writes them to
    /// `target/images/`).
    pub images: Vec<PathBuf>,
    /// Whether the API server writes an audit log of every write (see [`AuditEvent`]).
    pub audit_log: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            state_dir: None,
            prometheus: true,
            repo_root: None,
            binaries_dir: None,
            prometheus_bin: None,
            start_timeout: Duration::from_secs(60),
            node: false,
            images: Vec::new(),
            audit_log: false,
        }
    }
}

impl Options {
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    pub fn prometheus(mut self, enabled: bool) -> Self {
        self.prometheus = enabled;
        self
    }

    pub fn repo_root(mut self, dir: impl Into<PathBuf>) -> Self {
        self.repo_root = Some(dir.into());
        self
    }

    /// An audit log of every write the API server takes, for tests that count writes by user
    /// and User-Agent ([`LocalCluster::audit_events`]).
    pub fn audit_log(mut self, enabled: bool) -> Self {
        self.audit_log = enabled;
        self
    }

    /// A real node, with `images` loaded into its containerd.
    pub fn node(mut self, images: Vec<PathBuf>) -> Self {
        self.node = true;
        self.images = images;
        self
    }
}

/// Where a running cluster is reached; also stored as `cluster.json` in the
/// state directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClusterInfo {
    pub state_dir: PathBuf,
    /// `https://127.0.0.1:PORT`
    pub apiserver_url: String,
    /// `http://127.0.0.1:PORT`
    pub etcd_url: String,
    /// `http://127.0.0.1:PORT`, if Prometheus runs.
    pub prometheus_url: Option<String>,
    /// Contexts `admin` (current), `alice`, `bob`, `carol` and `mallory`.
    pub kubeconfig: PathBuf,
    /// The CA that signed the API server's certificate.
    pub ca_file: PathBuf,
    /// A kubectl of the server's version, if the binary directory has one.
    pub kubectl: Option<PathBuf>,
    /// Bearer token of each user in [`USERS`].
    pub tokens: BTreeMap<String, String>,
    /// The node, if the cluster has one.
    #[serde(default)]
    pub node: Option<node::NodeInfo>,
    /// The API server's audit log of writes, if it keeps one.
    #[serde(default)]
    pub audit_log: Option<PathBuf>,
}

/// A running control plane whose processes belong to this value.
pub struct LocalCluster {
    info: ClusterInfo,
    ca_pem: String,
    /// In start order; stopped in reverse.
    processes: Vec<Process>,
    /// `None` in detached mode.
    spawner: Option<Spawner>,
    /// The node's names on this machine, once its namespace exists.
    node: Option<node::Instance>,
    /// Holds (and finally removes) a temporary state directory.
    _temp_dir: Option<tempfile::TempDir>,
    /// Program and arguments of each component as first started, to start it again.
    launched: BTreeMap<&'static str, (PathBuf, Vec<String>)>,
    /// Components started again after a kill (see [`restart`]); stopped first.
    restarted: std::sync::Mutex<Vec<Process>>,
}

struct Binaries {
    etcd: PathBuf,
    kube_apiserver: PathBuf,
    kubectl: Option<PathBuf>,
    prometheus: Option<PathBuf>,
    node: Option<NodeBinaries>,
}

struct NodeBinaries {
    kube_controller_manager: PathBuf,
    kube_scheduler: PathBuf,
    kubelet: PathBuf,
    kube_proxy: PathBuf,
    pause: PathBuf,
}

impl LocalCluster {
    /// Starts etcd, kube-apiserver and (if asked) Prometheus, applies the
    /// CRDs and returns once everything is ready. Blocking; call it outside
    /// async code. Any thread may call it: the processes are forked from a
    /// helper thread that lives as long as the returned value.
    pub fn start(options: Options) -> Result<LocalCluster, Error> {
        launch(options, false)
    }

    /// Like [`start`](Self::start), but the processes run in a session of
    /// their own and keep running after this process exits; stop them with
    /// [`down`]. Needs `options.state_dir`.
    pub fn start_detached(options: Options) -> Result<ClusterInfo, Error> {
        if options.state_dir.is_none() {
            return Err(Error::InvalidArgument(
                "a detached cluster needs a state directory".into(),
            ));
        }
        let mut cluster = launch(options, true)?;
        for process in cluster.processes.drain(..) {
            process.release();
        }
        // The node outlives this value too; `down` tears it down.
        cluster.node.take();
        Ok(cluster.info.clone())
    }

    pub fn info(&self) -> &ClusterInfo {
        &self.info
    }

    pub fn state_dir(&self) -> &Path {
        &self.info.state_dir
    }

    pub fn kubeconfig_path(&self) -> &Path {
        &self.info.kubeconfig
    }

    /// `https://127.0.0.1:PORT`
    pub fn apiserver_url(&self) -> &str {
        &self.info.apiserver_url
    }

    pub fn etcd_url(&self) -> &str {
        &self.info.etcd_url
    }

    /// The PEM of the CA that signed the API server's serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The bearer token of `user` (one of [`USERS`]).
    pub fn token(&self, user: &str) -> Option<&str> {
        self.info.tokens.get(user).map(String::as_str)
    }

    pub fn tokens(&self) -> &BTreeMap<String, String> {
        &self.info.tokens
    }

    /// `http://127.0.0.1:PORT`, if Prometheus was started.
    pub fn prometheus_url(&self) -> Option<&str> {
        self.info.prometheus_url.as_deref()
    }

    pub fn kubectl_path(&self) -> Option<&Path> {
        self.info.kubectl.as_deref()
    }

    /// The node, if the cluster has one.
    pub fn node(&self) -> Option<&node::NodeInfo> {
        self.info.node.as_ref()
    }

    /// Every write the API server has logged so far, oldest first (needs
    /// [`Options::audit_log`]).
    pub fn audit_events(&self) -> Result<Vec<AuditEvent>, Error> {
        match &self.info.audit_log {
            Some(path) => audit::read(path),
            None => Err(Error::InvalidArgument(
                "the API server keeps no audit log: start the cluster with Options::audit_log(true)"
                    .into(),
            )),
        }
    }

    /// `(name, pid)` of each process started with the cluster (a component killed by
    /// [`kill`](Self::kill) keeps its entry).
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        self.processes.iter().map(|p| (p.name, p.pid)).collect()
    }

    /// Probes etcd, the API server and Prometheus once; `Err` lists what is
    /// unhealthy.
    pub fn check_health(&self) -> Result<(), String> {
        let problems = health_problems(&self.info).map_err(|e| e.to_string())?;
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    /// Lets Prometheus scrape `target` (`127.0.0.1:PORT`) as job `job_name`
    /// with the given extra target labels; replaces an earlier target of that
    /// job. Prometheus notices within about a second.
    pub fn add_scrape_target(
        &self,
        job_name: &str,
        target: &str,
        labels: &[(&str, &str)],
    ) -> Result<(), Error> {
        add_scrape_target(self.state_dir(), job_name, target, labels)
    }

    pub fn remove_scrape_target(&self, job_name: &str) -> Result<(), Error> {
        remove_scrape_target(self.state_dir(), job_name)
    }

    /// Stops every process (SIGTERM, then SIGKILL after a deadline), API
    /// server first. Idempotent; [`Drop`] calls it too.
    pub fn stop(&mut self) {
        self.stop_restarted();
        // A node's namespace and cgroups may exist before any process does.
        if let Some(instance) = self.node.take() {
            self.stop_node(&instance);
        }
        if self.processes.is_empty() {
            // Nothing of ours runs (already stopped, or detached processes
            // that must outlive this value together with their record).
            self.spawner.take();
            return;
        }
        while let Some(mut process) = self.processes.pop() {
            process.stop(STOP_TIMEOUT);
        }
        let _ = fs::remove_file(self.info.state_dir.join(INFO_FILE));
        // Ends the spawner thread once nothing it forked is left.
        self.spawner.take();
    }

    fn process(&mut self, name: &str) -> Option<&mut Process> {
        self.processes.iter_mut().find(|p| p.name == name)
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop();
        // `_temp_dir`, if any, is removed after this by its own Drop.
    }
}

/// Lets the Prometheus of the cluster in `state_dir` scrape `target` as job
/// `job_name`; see [`LocalCluster::add_scrape_target`].
pub fn add_scrape_target(
    state_dir: &Path,
    job_name: &str,
    target: &str,
    labels: &[(&str, &str)],
) -> Result<(), Error> {
    if !state_dir.join(prometheus::TARGETS_DIR).is_dir() {
        return Err(Error::InvalidArgument(format!(
            "no Prometheus was started for {}",
            state_dir.display()
        )));
    }
    prometheus::add_target(state_dir, job_name, target, labels)
}

/// Removes the scrape target of `job_name`; a missing one is not an error.
pub fn remove_scrape_target(state_dir: &Path, job_name: &str) -> Result<(), Error> {
    prometheus::remove_target(state_dir, job_name)
}

/// What `status` found in a state directory.
#[derive(Debug)]
pub enum Status {
    /// No cluster state there.
    Absent,
    /// Every recorded process runs and answers its health check.
    Running(Box<ClusterInfo>),
    /// Leftovers of a cluster that is not (fully) running.
    Broken(String),
}

/// Checks the cluster recorded in `state_dir` (by `local-cluster up`).
pub fn status(state_dir: &Path) -> Result<Status, Error> {
    let Ok(dir) = state_dir.canonicalize() else {
        return Ok(Status::Absent);
    };
    if !dir.join(MARKER).exists() {
        return Ok(Status::Absent);
    }
    let recorded = recorded_processes(&dir);
    let info_path = dir.join(INFO_FILE);
    let info: ClusterInfo = match fs::read(&info_path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| state_error(&dir, format!("unreadable {INFO_FILE}: {e}")))?,
        Err(_) if recorded.is_empty() => return Ok(Status::Absent),
        Err(_) => {
            return Ok(Status::Broken(
                "an earlier start did not finish (no cluster.json)".into(),
            ));
        }
    };
    let mut problems = Vec::new();
    for (name, pid) in &recorded {
        if !process::is_alive(*pid) || !process::belongs_to(*pid, &dir) {
            problems.push(format!("{name} (pid {pid}) is not running"));
        }
    }
    for name in expected_processes(&info) {
        if !recorded.iter().any(|(n, _)| n == name) {
            problems.push(format!("{name} has no pid file"));
        }
    }
    if problems.is_empty() {
        problems.extend(health_problems(&info)?);
    }
    if problems.is_empty() {
        Ok(Status::Running(Box::new(info)))
    } else {
        Ok(Status::Broken(problems.join("; ")))
    }
}

/// Stops the processes recorded in `state_dir` and removes the directory.
/// Returns whether there was one; a directory not created by this crate is
/// refused.
pub fn down(state_dir: &Path) -> Result<bool, Error> {
    let Ok(dir) = state_dir.canonicalize() else {
        return Ok(false);
    };
    if !dir.join(MARKER).exists() {
        return Err(state_error(
            &dir,
            "not a local-cluster state directory; refusing to delete it",
        ));
    }
    stop_recorded(&dir);
    fs::remove_dir_all(&dir).map_err(|e| io_error(format!("removing {}", dir.display()), e))?;
    Ok(true)
}

fn stop_recorded(dir: &Path) {
    let mut recorded = recorded_processes(dir);
    if recorded.iter().any(|(name, _)| name == "kubelet") {
        node::stop_recorded(dir, recorded);
        return;
    }
    // The API server first: it talks to etcd while shutting down.
    recorded.sort_by_key(|(name, _)| match name.as_str() {
        "kube-apiserver" => 0,
        "etcd" => 2,
        _ => 1,
    });
    for (_, pid) in recorded {
        if process::belongs_to(pid, dir) {
            process::terminate_pid(pid, STOP_TIMEOUT);
        }
    }
}

/// `(name, pid)` of each pid file in `dir`.
fn recorded_processes(dir: &Path) -> Vec<(String, u32)> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(String, u32)> = entries
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            if path.extension() != Some(OsStr::new("pid")) {
                return None;
            }
            let name = path.file_stem()?.to_str()?.to_string();
            Some((name, process::read_pid(&path)?))
        })
        .collect();
    found.sort();
    found
}

fn expected_processes(info: &ClusterInfo) -> Vec<&'static str> {
    if info.node.is_some() {
        return node::expected_processes(info.prometheus_url.is_some());
    }
    let mut names = vec!["etcd", "kube-apiserver"];
    if info.prometheus_url.is_some() {
        names.push("prometheus");
    }
    names
}

fn health_problems(info: &ClusterInfo) -> Result<Vec<String>, Error> {
    let ca_pem = fs::read_to_string(&info.ca_file)
        .map_err(|e| io_error(format!("reading {}", info.ca_file.display()), e))?;
    let http = Http::new(Some(&ca_pem))?;
    let admin = info.tokens.get("admin").map(String::as_str);
    let mut problems = Vec::new();
    let mut check = |name: &str, result: Result<(), String>| {
        if let Err(e) = result {
            problems.push(format!("{name}: {e}"));
        }
    };
    // A node's etcd listens inside its namespace; the API server's readiness covers it.
    if info.node.is_none() {
        check("etcd", etcd_probe(&http, &info.etcd_url));
    }
    check(
        "kube-apiserver",
        apiserver_probe(&http, &info.apiserver_url, admin),
    );
    if let Some(url) = &info.prometheus_url {
        check("prometheus", prometheus_probe(&http, url));
    }
    Ok(problems)
}

fn etcd_probe(http: &Http, url: &str) -> Result<(), String> {
    let answer = http.get(&format!("{url}/health"), None)?;
    if answer.is_success() && answer.body.contains(r#""health":"true""#) {
        Ok(())
    } else {
        Err(format!("HTTP {}: {}", answer.status, answer.body.trim()))
    }
}

fn apiserver_probe(http: &Http, url: &str, admin_token: Option<&str>) -> Result<(), String> {
    let answer = http.get(&format!("{url}/readyz"), admin_token)?;
    if answer.is_success() {
        Ok(())
    } else {
        Err(format!("HTTP {}: {}", answer.status, answer.body.trim()))
    }
}

fn prometheus_probe(http: &Http, url: &str) -> Result<(), String> {
    let answer = http.get(&format!("{url}/-/ready"), None)?;
    if answer.is_success() {
        Ok(())
    } else {
        Err(format!("HTTP {}: {}", answer.status, answer.body.trim()))
    }
}

/// A port that was free a moment ago. Another process may take it before
/// ours binds it; starts are retried for that case.
fn free_port() -> Result<u16, Error> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| io_error("finding a free port", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| io_error("finding a free port", e))?
        .port();
    Ok(port)
}

fn write_private(path: &Path, contents: &str) -> Result<(), Error> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| io_error(format!("creating {}", path.display()), e))?;
    file.write_all(contents.as_bytes())
        .map_err(|e| io_error(format!("writing {}", path.display()), e))
}

fn write_file(path: &Path, contents: &str) -> Result<(), Error> {
    fs::write(path, contents).map_err(|e| io_error(format!("writing {}", path.display()), e))
}

fn create_dir(path: &Path) -> Result<(), Error> {
    fs::create_dir_all(path).map_err(|e| io_error(format!("creating {}", path.display()), e))
}

/// Creates (or recycles) a state directory and returns its absolute path,
/// which every process gets in its command line (see `process::belongs_to`).
fn prepare_state_dir(dir: &Path) -> Result<PathBuf, Error> {
    create_dir(dir)?;
    let dir = dir
        .canonicalize()
        .map_err(|e| io_error(format!("resolving {}", dir.display()), e))?;
    let mut entries =
        fs::read_dir(&dir).map_err(|e| io_error(format!("reading {}", dir.display()), e))?;
    if entries.next().is_some() {
        if !dir.join(MARKER).exists() {
            return Err(state_error(
                &dir,
                "not empty and not a local-cluster state directory",
            ));
        }
        if let Some((name, pid)) = recorded_processes(&dir)
            .into_iter()
            .find(|(_, pid)| process::is_alive(*pid) && process::belongs_to(*pid, &dir))
        {
            return Err(state_error(
                &dir,
                format!(
                    "{name} (pid {pid}) of an earlier cluster still runs there; stop it first (local-cluster down)"
                ),
            ));
        }
        // Leftovers of a stopped cluster: start afresh.
        fs::remove_dir_all(&dir).map_err(|e| io_error(format!("clearing {}", dir.display()), e))?;
        create_dir(&dir)?;
    }
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))
        .map_err(|e| io_error(format!("restricting {}", dir.display()), e))?;
    write_file(
        &dir.join(MARKER),
        "state of `local-cluster`; removed by `local-cluster down`\n",
    )?;
    Ok(dir)
}

fn locate_binaries(options: &Options) -> Result<Binaries, Error> {
    let dir = match (
        &options.binaries_dir,
        env::var_os("BACKLOG_CONTROL_PLANE_BIN"),
    ) {
        (Some(dir), _) => dir.clone(),
        (None, Some(dir)) if !dir.is_empty() => PathBuf::from(dir),
        _ => build_control_plane(options.node)?,
    };
    let required = |name: &str| {
        let path = dir.join(name);
        if path.is_file() {
            Ok(path)
        } else {
            Err(Error::Binaries(format!(
                "{} is missing (run `make tools` or tests/cluster/build-control-plane.sh)",
                path.display()
            )))
        }
    };
    let etcd = required("etcd")?;
    let kube_apiserver = required("kube-apiserver")?;
    let node = if options.node {
        Some(NodeBinaries {
            kube_controller_manager: required("kube-controller-manager")?,
            kube_scheduler: required("kube-scheduler")?,
            kubelet: required("kubelet")?,
            kube_proxy: required("kube-proxy")?,
            pause: required("pause")?,
        })
    } else {
        None
    };
    let kubectl = Some(dir.join("kubectl")).filter(|p| p.is_file());
    let prometheus = if options.prometheus {
        let path = options
            .prometheus_bin
            .clone()
            .or_else(|| {
                env::var_os("PROMETHEUS_BIN")
                    .filter(|p| !p.is_empty())
                    .map(PathBuf::from)
            })
            .unwrap_or_else(|| PathBuf::from("/usr/bin/prometheus"));
        if !path.is_file() {
            return Err(Error::Binaries(format!(
                "{} is missing (run `make tools`, or set PROMETHEUS_BIN)",
                path.display()
            )));
        }
        Some(path)
    } else {
        None
    };
    Ok(Binaries {
        etcd,
        kube_apiserver,
        kubectl,
        prometheus,
        node,
    })
}

/// Runs `build-control-plane.sh` (instant when its cache is warm; a long
/// build on a fresh machine) and returns the directory it prints.
fn build_control_plane(node: bool) -> Result<PathBuf, Error> {
    run_build_script(
        "build-control-plane.sh",
        if node { &["--node"] } else { &[] },
    )
}

/// Runs one of this crate's build scripts and returns the path it prints last.
fn run_build_script(name: &str, args: &[&str]) -> Result<PathBuf, Error> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    let output = Command::new("bash")
        .arg(&script)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| io_error(format!("running {}", script.display()), e))?;
    if !output.status.success() {
        return Err(Error::Binaries(format!(
            "{} failed ({})",
            script.display(),
            output.status
        )));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .map(str::trim)
        .rfind(|line| !line.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| Error::Binaries(format!("{} printed no path", script.display())))
}

fn default_repo_root() -> PathBuf {
    // This crate lives in <repo>/tests/cluster.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Everything a start needs besides the cluster value itself.
struct Launch {
    binaries: Binaries,
    http: Http,
    timeout: Duration,
    pki_dir: PathBuf,
    /// Image archives for a node.
    images: Vec<PathBuf>,
    /// Tokens of a node's components (kubelet, kube-proxy, ...).
    component_tokens: Vec<(&'static str, String)>,
    audit_log: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Component {
    Etcd,
    ApiServer,
    Prometheus,
}

impl Component {
    fn name(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::ApiServer => "kube-apiserver",
            Component::Prometheus => "prometheus",
        }
    }
}

fn launch(options: Options, detached: bool) -> Result<LocalCluster, Error> {
    let (state_dir, temp_dir) = match &options.state_dir {
        Some(dir) => (prepare_state_dir(dir)?, None),
        None => {
            let temp = tempfile::Builder::new()
                .prefix("local-cluster-")
                .tempdir()
                .map_err(|e| io_error("creating a temporary state directory", e))?;
            let dir = prepare_state_dir(temp.path())?;
            (dir, Some(temp))
        }
    };
    let binaries = locate_binaries(&options)?;
    let instance = if options.node {
        node::images_exist(&options.images)?;
        node::host::preflight()?;
        Some(node::Instance::of(&state_dir))
    } else {
        None
    };

    let pki = if options.node {
        pki::generate(&node::SERVING_IPS, &node::SERVING_NAMES, true)?
    } else {
        pki::generate(&[], &[], false)?
    };
    let pki_dir = state_dir.join("pki");
    create_dir(&pki_dir)?;
    let ca_file = pki_dir.join("ca.crt");
    write_file(&ca_file, &pki.ca_pem)?;
    write_file(&pki_dir.join("apiserver.crt"), &pki.serving_cert_pem)?;
    write_private(&pki_dir.join("apiserver.key"), &pki.serving_key_pem)?;
    write_private(
        &pki_dir.join("service-account.key"),
        &pki.service_account_key_pem,
    )?;
    write_file(
        &pki_dir.join("service-account.pub"),
        &pki.service_account_public_pem,
    )?;
    if let Some((cert, key)) = &pki.kubelet_client {
        write_file(&pki_dir.join("apiserver-kubelet-client.crt"), cert)?;
        write_private(&pki_dir.join("apiserver-kubelet-client.key"), key)?;
    }

    let mut tokens = BTreeMap::new();
    let mut token_file = String::new();
    for (user, groups) in USER_GROUPS {
        let token = pki::token()?;
        // token,user,uid[,"group1,group2"]
        token_file.push_str(&format!("{token},{user},{user}"));
        if !groups.is_empty() {
            token_file.push_str(&format!(",\"{}\"", groups.join(",")));
        }
        token_file.push('\n');
        tokens.insert(user.to_string(), token);
    }
    let component_tokens = if options.node {
        node::component_tokens()?
    } else {
        Vec::new()
    };
    token_file.push_str(&node::config::component_users(&component_tokens));
    write_private(&pki_dir.join("tokens.csv"), &token_file)?;

    let launch = Launch {
        http: Http::new(Some(&pki.ca_pem))?,
        timeout: options.start_timeout,
        pki_dir,
        binaries,
        images: options.images.clone(),
        component_tokens,
        audit_log: options.audit_log,
    };
    let mut cluster = LocalCluster {
        info: ClusterInfo {
            kubeconfig: state_dir.join("kubeconfig"),
            ca_file,
            kubectl: launch.binaries.kubectl.clone(),
            state_dir,
            apiserver_url: String::new(),
            etcd_url: String::new(),
            prometheus_url: None,
            tokens,
            node: None,
            audit_log: None,
        },
        ca_pem: pki.ca_pem,
        processes: Vec::new(),
        spawner: if detached {
            None
        } else {
            Some(Spawner::new()?)
        },
        node: None,
        _temp_dir: temp_dir,
        launched: BTreeMap::new(),
        restarted: std::sync::Mutex::new(Vec::new()),
    };
    // From here on, an error drops `cluster`, which stops what was started
    // (and removes what a node changed on the machine).

    if let Some(instance) = instance {
        cluster.node = Some(instance.clone());
        node::host::set_up(&instance, node::NODE_IP, node::SERVICE_CIDR)?;
        if launch.binaries.prometheus.is_some() {
            cluster.spawn_component(&launch, Component::Prometheus)?;
        }
        cluster.launch_node(&launch)?;
    } else {
        // Prometheus starts alongside etcd and the API server; it is independent.
        cluster.spawn_component(&launch, Component::Etcd)?;
        if launch.binaries.prometheus.is_some() {
            cluster.spawn_component(&launch, Component::Prometheus)?;
        }
        cluster.await_component(&launch, Component::Etcd)?;
        cluster.spawn_component(&launch, Component::ApiServer)?;
        cluster.await_component(&launch, Component::ApiServer)?;
    }
    cluster.write_kubeconfig()?;

    let repo_root = options.repo_root.clone().unwrap_or_else(default_repo_root);
    let crds = crds::load(&repo_root.join("crds"))?;
    let admin_token = cluster.info.tokens["admin"].clone();
    crds::install(
        &launch.http,
        &cluster.info.apiserver_url,
        &admin_token,
        &crds,
        launch.timeout,
    )?;

    if launch.binaries.prometheus.is_some() {
        cluster.await_component(&launch, Component::Prometheus)?;
        if let Some(url) = &cluster.info.prometheus_url {
            write_file(
                &cluster.info.state_dir.join("prometheus-url"),
                &format!("{url}\n"),
            )?;
        }
        cluster.relay_prometheus_into_node()?;
    }

    // Written last: its presence means the start completed.
    let info = serde_json::to_string_pretty(&cluster.info)
        .map_err(|e| state_error(&cluster.info.state_dir, e.to_string()))?;
    write_private(&cluster.info.state_dir.join(INFO_FILE), &info)?;
    Ok(cluster)
}

impl LocalCluster {
    /// Picks ports, writes the configuration and forks one component.
    fn spawn_component(&mut self, launch: &Launch, component: Component) -> Result<(), Error> {
        let state_dir = self.info.state_dir.clone();
        let (program, args) = match component {
            Component::Etcd => {
                let client = format!("http://127.0.0.1:{}", free_port()?);
                let peer = format!("http://127.0.0.1:{}", free_port()?);
                let data_dir = state_dir.join("etcd");
                // A retried start must not find the data of a failed one.
                let _ = fs::remove_dir_all(&data_dir);
                let args = vec![
                    "--name=local-cluster".to_string(),
                    format!("--data-dir={}", data_dir.display()),
                    format!("--listen-client-urls={client}"),
                    format!("--advertise-client-urls={client}"),
                    format!("--listen-peer-urls={peer}"),
                    format!("--initial-advertise-peer-urls={peer}"),
                    format!("--initial-cluster=local-cluster={peer}"),
                    // Test data need not survive a power cut; this makes
                    // etcd (and so every API write) much faster.
                    "--unsafe-no-fsync=true".to_string(),
                ];
                self.info.etcd_url = client;
                (launch.binaries.etcd.clone(), args)
            }
            Component::ApiServer => {
                let port = free_port()?;
                let url = format!("https://127.0.0.1:{port}");
                let pki = &launch.pki_dir;
                let sa_key = pki.join("service-account.key");
                let sa_public = pki.join("service-account.pub");
                let args = vec![
                    format!("--etcd-servers={}", self.info.etcd_url),
                    "--bind-address=127.0.0.1".to_string(),
                    // Without it the server looks for a default route.
                    "--advertise-address=127.0.0.1".to_string(),
                    format!("--secure-port={port}"),
                    format!("--cert-dir={}", pki.display()),
                    format!("--tls-cert-file={}", pki.join("apiserver.crt").display()),
                    format!(
                        "--tls-private-key-file={}",
                        pki.join("apiserver.key").display()
                    ),
                    format!("--token-auth-file={}", pki.join("tokens.csv").display()),
                    "--authorization-mode=RBAC".to_string(),
                    format!("--service-account-issuer={url}/"),
                    format!("--service-account-key-file={}", sa_public.display()),
                    format!("--service-account-signing-key-file={}", sa_key.display()),
                    "--service-cluster-ip-range=10.0.0.0/24".to_string(),
                    // No controller-manager creates default service accounts.
                    "--disable-admission-plugins=ServiceAccount".to_string(),
                    "--allow-privileged=true".to_string(),
                    // The `kubernetes` Service's endpoints would point at
                    // 127.0.0.1, which Endpoints reject; skip that loop.
                    "--endpoint-reconciler-type=none".to_string(),
                ];
                let mut args = args;
                if launch.audit_log {
                    audit::write_policy(&state_dir)?;
                    args.extend(audit::flags(&state_dir));
                    self.info.audit_log = Some(state_dir.join(audit::LOG_FILE));
                }
                self.info.apiserver_url = url;
                (launch.binaries.kube_apiserver.clone(), args)
            }
            Component::Prometheus => {
                let Some(program) = launch.binaries.prometheus.clone() else {
                    return Ok(());
                };
                let port = free_port()?;
                create_dir(&state_dir.join(prometheus::TARGETS_DIR))?;
                let config = state_dir.join("prometheus.yml");
                write_file(&config, &prometheus::config(&state_dir))?;
                let data_dir = state_dir.join("prometheus");
                let _ = fs::remove_dir_all(&data_dir);
                let args = vec![
                    format!("--config.file={}", config.display()),
                    format!("--storage.tsdb.path={}", data_dir.display()),
                    format!("--web.listen-address=127.0.0.1:{port}"),
                    // Lets callers reload or quit it over HTTP.
                    "--web.enable-lifecycle".to_string(),
                ];
                self.info.prometheus_url = Some(format!("http://127.0.0.1:{port}"));
                (program, args)
            }
        };
        let process = process::spawn(
            self.spawner.as_ref(),
            component.name(),
            &program,
            &args,
            &state_dir,
            None,
        )?;
        self.processes.push(process);
        self.launched.insert(component.name(), (program, args));
        Ok(())
    }

    /// Polls the component's readiness endpoint until it answers, it exits,
    /// or the deadline passes. Restarts it on fresh ports if the port picked
    /// for it was taken in the meantime.
    fn await_component(&mut self, launch: &Launch, component: Component) -> Result<(), Error> {
        let name = component.name();
        let mut attempt = 1;
        loop {
            match self.poll_ready(launch, component) {
                Ok(()) => return Ok(()),
                Err(error) => {
                    let port_taken = match &error {
                        Error::Exited { tail, .. } | Error::NotReady { tail, .. } => {
                            tail.contains("address already in use")
                        }
                        _ => false,
                    };
                    if !port_taken || attempt >= START_ATTEMPTS {
                        return Err(error);
                    }
                    attempt += 1;
                    if let Some(index) = self.processes.iter().position(|p| p.name == name) {
                        let mut process = self.processes.remove(index);
                        process.stop(STOP_TIMEOUT);
                    }
                    self.spawn_component(launch, component)?;
                }
            }
        }
    }

    fn poll_ready(&mut self, launch: &Launch, component: Component) -> Result<(), Error> {
        let name = component.name();
        let info = &self.info;
        let (url, admin) = match component {
            Component::Etcd => (info.etcd_url.clone(), None),
            Component::ApiServer => (
                info.apiserver_url.clone(),
                info.tokens.get("admin").cloned(),
            ),
            Component::Prometheus => (info.prometheus_url.clone().unwrap_or_default(), None),
        };
        let probe = || match component {
            Component::Etcd => etcd_probe(&launch.http, &url),
            Component::ApiServer => apiserver_probe(&launch.http, &url, admin.as_deref()),
            Component::Prometheus => prometheus_probe(&launch.http, &url),
        };
        let deadline = Instant::now() + launch.timeout;
        loop {
            let last = match probe() {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            let Some(process) = self.process(name) else {
                return Ok(()); // not started (Prometheus disabled)
            };
            if let Some(status) = process.exit_status() {
                return Err(Error::Exited {
                    component: name,
                    status,
                    tail: process::log_tail(&process.log, 40),
                    log: process.log.clone(),
                });
            }
            if Instant::now() >= deadline {
                return Err(Error::NotReady {
                    component: name,
                    timeout: launch.timeout,
                    last,
                    tail: process::log_tail(&process.log, 40),
                    log: process.log.clone(),
                });
            }
            thread::sleep(POLL);
        }
    }

    /// One context per user, `admin` current, the CA embedded.
    fn write_kubeconfig(&self) -> Result<(), Error> {
        let ca_data = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        let users: Vec<_> = self
            .info
            .tokens
            .iter()
            .map(|(user, token)| json!({ "name": user, "user": { "token": token } }))
            .collect();
        let contexts: Vec<_> = USERS
            .iter()
            .map(|user| {
                json!({
                    "name": user,
                    "context": { "cluster": CLUSTER_NAME, "user": user, "namespace": "default" },
                })
            })
            .collect();
        let kubeconfig = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{
                "name": CLUSTER_NAME,
                "cluster": {
                    "server": self.info.apiserver_url,
                    "certificate-authority-data": ca_data,
                },
            }],
            "users": users,
            "contexts": contexts,
            "current-context": "admin",
            "preferences": {},
        });
        let yaml = serde_yaml::to_string(&kubeconfig)
            .map_err(|e| state_error(&self.info.state_dir, format!("kubeconfig: {e}")))?;
        write_private(&self.info.kubeconfig, &yaml)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_versions_come_from_versions_env() {
        assert!(
            kubernetes_version().starts_with("1."),
            "{}",
            kubernetes_version()
        );
        assert!(etcd_version().starts_with("3."), "{}", etcd_version());
        assert!(helm_version().starts_with("3."), "{}", helm_version());
    }

    #[test]
    fn a_foreign_non_empty_directory_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        fs::write(dir.path().join("precious"), "keep me").expect("write");
        assert!(matches!(
            prepare_state_dir(dir.path()),
            Err(Error::StateDir { .. })
        ));
        assert!(matches!(down(dir.path()), Err(Error::StateDir { .. })));
        assert!(dir.path().join("precious").exists());
    }

    #[test]
    fn stale_state_of_our_own_is_recycled() {
        let dir = tempfile::tempdir().expect("temp dir");
        let state = prepare_state_dir(dir.path()).expect("fresh");
        fs::write(state.join("etcd.log"), "old").expect("write");
        let again = prepare_state_dir(dir.path()).expect("recycled");
        assert_eq!(state, again);
        assert!(!again.join("etcd.log").exists());
        assert!(again.join(MARKER).exists());
        assert!(matches!(status(&again), Ok(Status::Absent)));
    }

    #[test]
    fn scrape_targets_need_a_prometheus() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert!(matches!(
            add_scrape_target(dir.path(), "job", "127.0.0.1:1", &[]),
            Err(Error::InvalidArgument(_))
        ));
    }
}
