//! Command line of the `backlog-operator` binary.

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "backlog-operator",
    version,
    about = "Declarative retry policies, backlog budgets and approved replays for asynchronous consumers"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print every CustomResourceDefinition as multi-document YAML (what `crds/` holds).
    Crd {
        /// Write one file per CRD into this directory instead of printing.
        #[arg(long, value_name = "DIR")]
        output_dir: Option<std::path::PathBuf>,
    },
    /// Run a scenario offline through the same decision code the controller uses, next to
    /// the policies users come from, and print a timeline and a summary.
    Simulate {
        /// Scenario file (see examples/scenarios/).
        #[arg(long, value_name = "FILE")]
        scenario: std::path::PathBuf,
        /// `budget` is this operator; `lag-threshold` is KEDA's Kafka scaler under an HPA;
        /// `max` always runs the partition cap.
        #[arg(long, value_enum, default_value = "budget")]
        policy: crate::sim::policy::PolicyKind,
        #[arg(long, value_enum, default_value = "table")]
        output: crate::sim::output::Format,
        /// KEDA lagThreshold for `lag-threshold` (default: perReplicaRate × targetDrainTime).
        #[arg(long, value_name = "EVENTS")]
        lag_threshold: Option<f64>,
        /// Serve the workload's metrics on this address instead of simulating offline: the model
        /// runs with the wall clock (× --speed) and takes its consumers from the target's
        /// spec.replicas in the cluster of the current kubeconfig.
        #[arg(long, value_name = "ADDR", requires = "target")]
        serve: Option<std::net::SocketAddr>,
        /// Print the BacklogBudget for the served workload (wall-clock terms) and exit.
        #[arg(long, requires = "target", conflicts_with = "serve")]
        emit_budget: bool,
        /// Namespace of the target Deployment (serve mode).
        #[arg(long, default_value = "default")]
        namespace: String,
        /// Name of the target Deployment; also the topic and consumer group label.
        #[arg(long)]
        target: Option<String>,
        /// How many times faster than the wall clock the served workload runs.
        #[arg(long, default_value_t = 1.0)]
        speed: f64,
        /// What the served workload counts as its consumers: the target's spec.replicas, or
        /// its Ready pods (on a cluster with a node).
        #[arg(long, value_enum, default_value = "spec-replicas")]
        consumers: crate::sim::server::ConsumerCount,
    },
    /// Follow a BacklogBudget's status as a timeline, then summarize.
    Watch {
        name: String,
        #[arg(long, short = 'n', default_value = "default")]
        namespace: String,
        /// How long to watch.
        #[arg(long = "for", default_value = "5m", value_parser = parse_duration)]
        duration: std::time::Duration,
    },
    /// Print the retry schedule a RetryPolicy commits its consumers to: per attempt the
    /// longest wait and the worst case so far, executions per event, the retry budget.
    Explain {
        /// RetryPolicy YAML (an object of kind RetryPolicy, or just its spec).
        #[arg(value_name = "FILE")]
        file: std::path::PathBuf,
        /// A completion deadline such as 10m: says whether the worst-case retry delay fits it,
        /// and by how much. The exit status is 2 when it does not fit.
        #[arg(long, value_name = "DURATION")]
        deadline: Option<String>,
        #[arg(long, value_enum, default_value = "table")]
        output: crate::explain::Format,
    },
    /// Size a topic and its consumer group: partitions, the useful consumer range, storage,
    /// batch limits and hot keys, and a BacklogBudget that fits them.
    Plan {
        /// Plan file (see examples/plans/orders.yaml).
        #[arg(value_name = "FILE")]
        file: std::path::PathBuf,
        #[arg(long, short = 'o', value_enum, default_value = "table")]
        output: crate::plan::Format,
    },
    /// Run the controllers against the cluster in the current kubeconfig (or in-cluster).
    Run(Box<RunArgs>),
    /// Print the version.
    Version,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Prometheus for budgets that do not name one (spec.prometheus.address).
    #[arg(long, env = "PROMETHEUS_URL", value_name = "URL")]
    pub prometheus_url: Option<String>,
    /// Another Prometheus that spec.prometheus.address may name (repeat it, or separate with
    /// commas). Only these and --prometheus-url are ever queried; `*` allows any address.
    #[arg(
        long = "allowed-prometheus-url",
        value_name = "URL",
        value_delimiter = ','
    )]
    pub allowed_prometheus_urls: Vec<String>,
    /// Watch only these namespaces (repeat it, or separate with commas; default: all).
    #[arg(long, env = "WATCH_NAMESPACE", value_delimiter = ',')]
    pub namespace: Vec<String>,
    /// A ServiceAccount replay workers may run as (repeat it, or separate with commas;
    /// default: replay-worker).
    #[arg(
        long = "replay-worker-service-account",
        value_name = "NAME",
        value_delimiter = ',',
        default_value = "replay-worker"
    )]
    pub replay_worker_service_accounts: Vec<String>,
    /// Run replay workers only from images pinned by digest (name@sha256:...).
    #[arg(long)]
    pub replay_require_image_digest: bool,
    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: std::net::SocketAddr,
    /// Timeout of one PromQL query.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub query_timeout: std::time::Duration,
    /// PromQL queries in flight at once.
    #[arg(long, default_value_t = 8)]
    pub query_concurrency: usize,
    /// Log JSON lines (for log collectors) instead of text.
    #[arg(long, env = "LOG_JSON")]
    pub log_json: bool,
    /// This replica's name: the holder identity in the Lease and part of the User-Agent the
    /// API server's audit log records. Must be unique per replica (the chart passes the pod's
    /// name); leader election refuses to start without one.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Only the holder of a Lease reconciles and writes: run several replicas for availability.
    #[arg(long, env = "LEADER_ELECT")]
    pub leader_elect: bool,
    /// Namespace of the Lease (default: the pod's namespace, from POD_NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    #[arg(long, default_value = "backlog-operator")]
    pub lease_name: String,
    /// A standby takes the Lease over once it has not seen it change for this long (whole
    /// seconds).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: std::time::Duration,
    /// The leader stops writing if it could not renew the Lease for this long; shorter than
    /// --lease-duration, so it stops before a standby can take over.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub lease_renew_deadline: std::time::Duration,
    /// How often the leader renews and a standby looks at the Lease.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub lease_retry_period: std::time::Duration,
    /// Deadline of every API request but watches.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub api_timeout: std::time::Duration,
    /// How long an object's reconciles may fail for a transient reason (the API server
    /// unreachable, a timeout, a 5xx) before its `Synced` condition says so. Permanent failures
    /// (a missing permission) are said at once.
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub report_failures_after: std::time::Duration,
    /// Deadline for establishing a connection to the API server.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub api_connect_timeout: std::time::Duration,
    /// API requests per second the controllers send on average (a client-side limit; its
    /// waits are counted in /metrics). 0 sends without a limit. The Lease is never held back.
    #[arg(long, default_value_t = crate::api_client::DEFAULT_QPS, value_parser = parse_qps)]
    pub api_qps: f64,
    /// API requests the controllers may send at once above --api-qps.
    #[arg(long, default_value_t = crate::api_client::DEFAULT_BURST, value_parser = clap::value_parser!(u32).range(1..))]
    pub api_burst: u32,
}

fn parse_qps(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(qps) if qps.is_finite() && qps >= 0.0 => Ok(qps),
        _ => Err(format!(
            "{text:?} is not a rate: give requests per second, such as 200 (0 for no limit)"
        )),
    }
}

fn parse_duration(value: &str) -> Result<std::time::Duration, String> {
    crate::consumer::parse_go_duration(value).map_err(|e| e.to_string())
}
