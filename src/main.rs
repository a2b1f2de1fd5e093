use std::process::ExitCode;

use backlog_operator::sim::{output::Format, policy::PolicyKind, run, scenario::Scenario, svg};
use backlog_operator::{api, cli};
use clap::Parser;

/// jemalloc (`--features jemalloc`, the default). At 10,000 budgets the decision memory and
/// the watch caches are long-lived objects among each poll's short-lived ones; the allocator
/// that keeps least around them is the one that decides the operator's memory.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read before `main`: a background thread gives pages freed for a
/// second back to the system (`muzzy_decay_ms:0`: at once with `MADV_DONTNEED`, not lazily
/// with `MADV_FREE`, which leaves them counted as resident until the kernel wants them), and
/// one arena: the default of four per core spreads the same objects over partly used pages
/// of several arenas (at 3,000 budgets one arena held 0.9 MiB less for the same CPU), and no
/// thread caches (`tcache:false`): a busy thread keeps up to megabytes of freed objects of
/// each size for itself, in pages no other thread can reuse or the background thread return.
/// At 10,000 budgets they held 10.7 MiB of the operator's 51 MiB of anonymous memory (40.4
/// MiB without them), for 50 % more CPU (0.98 s per 100 budgets in five minutes, not 0.64 s).
/// `_RJEM_MALLOC_CONF` in the environment overrides them.
#[cfg(feature = "jemalloc")]
#[allow(non_upper_case_globals)]
#[unsafe(export_name = "_rjem_malloc_conf")]
static malloc_conf: Option<&std::ffi::c_char> =
    // SAFETY: a C string literal is NUL-terminated and lives as long as the program.
    Some(unsafe {
        &*c"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0,narenas:1,tcache:false"
            .as_ptr()
    });

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Crd { output_dir } => crd(output_dir.as_deref()),
        cli::Command::Simulate {
            scenario,
            policy,
            output,
            lag_threshold,
            serve,
            emit_budget,
            namespace,
            target,
            speed,
            consumers,
        } => match (serve, emit_budget, target) {
            (Some(address), _, Some(target)) => {
                serve_workload(&scenario, address, namespace, target, speed, consumers)
            }
            (None, true, Some(target)) => emit_served_budget(&scenario, &target, speed),
            _ => simulate(&scenario, policy, output, lag_threshold),
        },
        cli::Command::Watch {
            name,
            namespace,
            duration,
        } => watch(&name, &namespace, duration),
        cli::Command::Explain {
            file,
            deadline,
            output,
        } => match explain(&file, deadline.as_deref(), output) {
            // The worst case does not fit the deadline: the table says why.
            Ok(false) => return ExitCode::from(2),
            Ok(true) => Ok(()),
            Err(error) => Err(error),
        },
        cli::Command::Plan { file, output } => plan(&file, output),
        cli::Command::Run(args) => run(*args),
        cli::Command::Version => {
            println!("backlog-operator {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn plan(
    path: &std::path::Path,
    output: backlog_operator::plan::Format,
) -> Result<(), Box<dyn std::error::Error>> {
    use backlog_operator::plan::{self, Format};
    let report = plan::plan_file(path)?;
    let text = match output {
        Format::Table => plan::table(&report)?,
        Format::Json => plan::json(&report)?,
        Format::Yaml => plan::yaml(&report)?,
    };
    print!("{text}");
    if !text.ends_with('\n') {
        println!();
    }
    Ok(())
}

fn crd(output_dir: Option<&std::path::Path>) -> Result<(), Box<dyn std::error::Error>> {
    for crd in api::all_crds() {
        let yaml = api::crd_yaml(&crd)?;
        match output_dir {
            Some(dir) => std::fs::write(dir.join(api::crd_file_name(&crd)), yaml)?,
            None => print!("---\n{yaml}"),
        }
    }
    Ok(())
}

fn simulate(
    path: &std::path::Path,
    policy: PolicyKind,
    format: Format,
    lag_threshold: Option<f64>,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut scenario = Scenario::load(path)?;
    if lag_threshold.is_some() {
        scenario.lag_threshold = lag_threshold;
    }
    let model = scenario.model()?;
    let result = run::simulate(&model, policy);
    let text = match format {
        Format::Table => backlog_operator::sim::output::table(&result),
        Format::Json => backlog_operator::sim::output::json(&result)?,
        Format::Csv => backlog_operator::sim::output::csv(&result),
        Format::Svg => svg::render(&result, model.partitions),
    };
    print!("{text}");
    Ok(())
}

/// Prints the explanation; `Ok(false)` when the worst case does not fit the deadline.
fn explain(
    path: &std::path::Path,
    deadline: Option<&str>,
    format: backlog_operator::explain::Format,
) -> Result<bool, Box<dyn std::error::Error>> {
    use backlog_operator::explain;
    let explanation = explain::explain_file(path, deadline)?;
    let text = match format {
        explain::Format::Table => explain::table(&explanation),
        explain::Format::Json => explain::json(&explanation)?,
    };
    print!("{text}");
    Ok(explanation.fits())
}

fn run(args: cli::RunArgs) -> Result<(), Box<dyn std::error::Error>> {
    backlog_operator::telemetry::init_logging(args.log_json);
    // kube and reqwest share rustls; exactly one crypto provider is compiled in.
    let _ = rustls::crypto::ring::default_provider().install_default();
    use backlog_operator::controller::{Scope, WorkerPolicy};
    let namespaces: Vec<String> = args
        .namespace
        .into_iter()
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .collect();
    let leader_election = if args.leader_elect {
        use backlog_operator::core::leadership::{Identity, Timing};
        Some(backlog_operator::controller::leader::LeaseSettings {
            namespace: args.lease_namespace,
            name: args.lease_name,
            identity: Identity::new(args.identity.as_deref())?,
            timing: Timing::new(
                args.lease_duration,
                args.lease_renew_deadline,
                args.lease_retry_period,
            )?,
        })
    } else {
        None
    };
    let options = backlog_operator::controller::RunOptions {
        prometheus_url: args.prometheus_url,
        allowed_prometheus_urls: args.allowed_prometheus_urls,
        scopes: if namespaces.is_empty() {
            vec![Scope::All]
        } else {
            namespaces.into_iter().map(Scope::Namespace).collect()
        },
        listen: args.listen,
        query_timeout: args.query_timeout,
        query_concurrency: args.query_concurrency,
        worker_policy: WorkerPolicy {
            service_accounts: args.replay_worker_service_accounts,
            require_image_digest: args.replay_require_image_digest,
        },
        client: backlog_operator::api_client::ClientSettings {
            connect_timeout: args.api_connect_timeout,
            request_timeout: args.api_timeout,
            identity: args.identity,
            qps: args.api_qps,
            burst: args.api_burst,
            ..backlog_operator::api_client::ClientSettings::default()
        },
        leader_election,
        report_failures_after: args.report_failures_after,
    };
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(backlog_operator::controller::run(options))?;
    Ok(())
}

fn serve_workload(
    path: &std::path::Path,
    listen: std::net::SocketAddr,
    namespace: String,
    target: String,
    speed: f64,
    consumers: backlog_operator::sim::server::ConsumerCount,
) -> Result<(), Box<dyn std::error::Error>> {
    use backlog_operator::sim::server::ServeOptions;
    backlog_operator::telemetry::init_logging(false);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let model = Scenario::load(path)?.model()?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let client = kube::Client::try_default().await?;
        let duration = std::time::Duration::from_secs_f64(model.duration / speed);
        let server = backlog_operator::served_workload::serve(
            model,
            ServeOptions {
                listen,
                namespace,
                target_kind: "Deployment".to_owned(),
                topic: target.clone(),
                target_name: target,
                speed,
                consumers,
            },
            client,
        )
        .await?;
        eprintln!(
            "serving the workload's metrics on http://{}/metrics for {:.0}s",
            server.address,
            duration.as_secs_f64()
        );
        tokio::select! {
            () = tokio::time::sleep(duration) => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}

fn emit_served_budget(
    path: &std::path::Path,
    target: &str,
    speed: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let model = Scenario::load(path)?.model()?;
    let budget = backlog_operator::served_workload::budget_for(&model, target, speed);
    print!("{}", serde_yaml::to_string(&budget)?);
    Ok(())
}

fn watch(
    name: &str,
    namespace: &str,
    duration: std::time::Duration,
) -> Result<(), Box<dyn std::error::Error>> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let client = kube::Client::try_default().await?;
        backlog_operator::watch::watch(client, namespace, name, duration).await?;
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}
