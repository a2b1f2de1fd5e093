//! `local-cluster up|down|status`: a local control plane that outlives the
//! command, for the demo and for poking at by hand.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use local_cluster::{ClusterInfo, LocalCluster, Options, Status};

#[derive(Parser)]
#[command(
    about = "A local Kubernetes control plane (etcd + kube-apiserver) and Prometheus on loopback"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(clap::Args)]
struct DirArg {
    /// State directory (kubeconfig, logs, pid files, data).
    #[arg(long, default_value = "target/local-cluster")]
    dir: PathBuf,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start everything in the background and return once it is ready.
    /// Harmless when the cluster already runs.
    Up {
        #[command(flatten)]
        dir: DirArg,
        /// Do not start Prometheus.
        #[arg(long)]
        no_prometheus: bool,
        /// Seconds each process may take to become ready.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Stop the recorded processes and remove the state directory.
    Down {
        #[command(flatten)]
        dir: DirArg,
    },
    /// Tell whether the recorded cluster runs and is healthy (exit 0 if so).
    Status {
        #[command(flatten)]
        dir: DirArg,
    },
    /// Add or remove a Prometheus scrape target.
    Scrape {
        #[command(subcommand)]
        action: ScrapeCmd,
    },
}

#[derive(Subcommand)]
enum ScrapeCmd {
    /// Scrape TARGET (host:port) as job JOB.
    Add {
        job: String,
        target: String,
        /// Extra target label, NAME=VALUE (repeatable).
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        #[command(flatten)]
        dir: DirArg,
    },
    /// Stop scraping job JOB.
    Remove {
        job: String,
        #[command(flatten)]
        dir: DirArg,
    },
}

/// Prints a line; a closed stdout (`| head`) is not worth a panic, the
/// cluster has been handled by then.
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected NAME=VALUE, got {s:?}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("local-cluster: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Cmd) -> Result<ExitCode, local_cluster::Error> {
    match command {
        Cmd::Up {
            dir,
            no_prometheus,
            timeout,
        } => up(&dir.dir, !no_prometheus, Duration::from_secs(timeout)),
        Cmd::Down { dir } => {
            let started = Instant::now();
            if local_cluster::down(&dir.dir)? {
                say!(
                    "local-cluster: stopped and removed {} in {:.1}s",
                    dir.dir.display(),
                    started.elapsed().as_secs_f64()
                );
            } else {
                say!("local-cluster: nothing in {}", dir.dir.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Status { dir } => match local_cluster::status(&dir.dir)? {
            Status::Running(info) => {
                say!("local-cluster: running");
                describe(&info);
                Ok(ExitCode::SUCCESS)
            }
            Status::Broken(reason) => {
                say!("local-cluster: not healthy: {reason}");
                Ok(ExitCode::FAILURE)
            }
            Status::Absent => {
                say!("local-cluster: no cluster in {}", dir.dir.display());
                Ok(ExitCode::FAILURE)
            }
        },
        Cmd::Scrape { action } => {
            match action {
                ScrapeCmd::Add {
                    job,
                    target,
                    labels,
                    dir,
                } => {
                    let labels: Vec<(&str, &str)> = labels
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    local_cluster::add_scrape_target(&dir.dir, &job, &target, &labels)?;
                }
                ScrapeCmd::Remove { job, dir } => {
                    local_cluster::remove_scrape_target(&dir.dir, &job)?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn up(dir: &Path, prometheus: bool, timeout: Duration) -> Result<ExitCode, local_cluster::Error> {
    match local_cluster::status(dir)? {
        Status::Running(info) => {
            say!("local-cluster: already running");
            describe(&info);
            return Ok(ExitCode::SUCCESS);
        }
        Status::Broken(reason) => {
            say!("local-cluster: cleaning up a stale cluster ({reason})");
            local_cluster::down(dir)?;
        }
        Status::Absent => {}
    }
    let started = Instant::now();
    let options = Options {
        start_timeout: timeout,
        ..Options::default()
    }
    .state_dir(dir)
    .prometheus(prometheus);
    let info = LocalCluster::start_detached(options)?;
    say!(
        "local-cluster: ready in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    describe(&info);
    Ok(ExitCode::SUCCESS)
}

fn describe(info: &ClusterInfo) {
    say!(
        "  kube-apiserver  {}  (Kubernetes v{})",
        info.apiserver_url,
        local_cluster::kubernetes_version()
    );
    if let Some(url) = &info.prometheus_url {
        say!("  prometheus      {url}");
    }
    say!("  state           {}", info.state_dir.display());
    say!(
        "  kubeconfig      {}  (contexts: {})",
        info.kubeconfig.display(),
        local_cluster::USERS.join(", ")
    );
    if let Some(kubectl) = &info.kubectl {
        say!("  kubectl         {}", kubectl.display());
    }
    // `make cluster-up` builds helm first (`make tools`); then this is instant.
    if let Ok(helm) = local_cluster::helm() {
        say!("  helm            {}", helm.display());
    }
    say!("  export KUBECONFIG={}", info.kubeconfig.display());
}
