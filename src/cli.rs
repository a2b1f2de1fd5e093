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
    /// Print the version.
    Version,
}
