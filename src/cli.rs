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
    },
    /// Run the controllers against the cluster in the current kubeconfig (or in-cluster).
    Run(RunArgs),
    /// Print the version.
    Version,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Prometheus for budgets that do not name one (spec.prometheus.address).
    #[arg(long, env = "PROMETHEUS_URL", value_name = "URL")]
    pub prometheus_url: Option<String>,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub namespace: Option<String>,
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
}

fn parse_duration(value: &str) -> Result<std::time::Duration, String> {
    crate::consumer::parse_go_duration(value).map_err(|e| e.to_string())
}
