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
        /// Add a real node (kubelet, containerd, controller-manager, scheduler, kube-proxy)
        /// in a network namespace of its own; needs root.
        #[arg(long)]
        node: bool,
        /// With --node: load every OCI archive (*.tar) of this directory into the node.
        #[arg(long, default_value = "target/images")]
        images: PathBuf,
    },
    /// Write a reproducible OCI image archive of one binary (its shared libraries from
    /// Debian, CA certificates, a non-root user).
    Image(ImageArgs),
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

#[derive(clap::Args)]
struct ImageArgs {
    /// The binary to package (its libraries are found with ldd).
    #[arg(long)]
    binary: PathBuf,
    /// Its name inside the image: /usr/local/bin/NAME, the entrypoint.
    #[arg(long)]
    command: String,
    /// The image reference, REPOSITORY:TAG.
    #[arg(long)]
    name: String,
    /// The archive to write.
    #[arg(long)]
    out: PathBuf,
    /// Seconds since the epoch for `created` and every file's time (e.g. the commit's time);
    /// defaults to $SOURCE_DATE_EPOCH, else none.
    #[arg(long, env = "SOURCE_DATE_EPOCH")]
    created: Option<i64>,
    /// A port the image listens on, e.g. 8080 (repeatable).
    #[arg(long = "port")]
    ports: Vec<u16>,
    /// An org.opencontainers.image.* or other label, NAME=VALUE (repeatable).
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
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
            node,
            images,
        } => {
            let images = if node {
                image_archives(&images)?
            } else {
                Vec::new()
            };
            up(
                &dir.dir,
                !no_prometheus,
                Duration::from_secs(timeout),
                node.then_some(images),
            )
        }
        Cmd::Image(args) => image(args),
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

/// The `*.tar` files of `dir`, sorted; none is an error (nothing to run on the node).
fn image_archives(dir: &Path) -> Result<Vec<PathBuf>, local_cluster::Error> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "tar"))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    if found.is_empty() {
        return Err(local_cluster::Error::InvalidArgument(format!(
            "no image archives in {}: run `make image` first",
            dir.display()
        )));
    }
    Ok(found)
}

fn image(args: ImageArgs) -> Result<ExitCode, local_cluster::Error> {
    use local_cluster::image::{ImageSpec, write_archive};
    let mut spec = ImageSpec {
        name: args.name,
        created: args.created,
        exposed_ports: args.ports.iter().map(|p| format!("{p}/tcp")).collect(),
        ..ImageSpec::default()
    };
    let packages = local_cluster::rootfs::add_binary(&mut spec, &args.binary, &args.command)?;
    if let Some(created) = args.created {
        spec.labels.insert(
            "org.opencontainers.image.created".into(),
            local_cluster::image::rfc3339(created),
        );
    }
    spec.labels.insert(
        "dev.backlog.image.debian-packages".into(),
        packages.join(" "),
    );
    spec.labels.extend(args.labels);
    let built = write_archive(&spec, &args.out)?;
    say!(
        "{}  {}  {:.1} MB  {}",
        built.name,
        built.manifest_digest,
        built.archive_size as f64 / 1e6,
        args.out.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn up(
    dir: &Path,
    prometheus: bool,
    timeout: Duration,
    node: Option<Vec<PathBuf>>,
) -> Result<ExitCode, local_cluster::Error> {
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
    let mut options = Options {
        start_timeout: timeout,
        ..Options::default()
    }
    .state_dir(dir)
    .prometheus(prometheus);
    if let Some(images) = node {
        options = options.node(images);
    }
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
    if let Some(node) = &info.node {
        say!(
            "  node            {} at {} (network namespace {})",
            node.name,
            node.address,
            node.netns
        );
        if let Some(url) = &node.prometheus_url {
            say!("  prometheus      {url}  (from pods)");
        }
        say!("  images          {}", node.images.join(", "));
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
