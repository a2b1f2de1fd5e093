//! Command line of the `backlog-operator` binary.

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "backlog-operator", version, about = "Declarative retry policies, backlog budgets and approved replays for asynchronous consumers")]
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
    /// Print the version.
    Version,
}
