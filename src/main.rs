use std::process::ExitCode;

use backlog_operator::sim::{output::Format, policy::PolicyKind, run, scenario::Scenario, svg};
use backlog_operator::{api, cli};
use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Crd { output_dir } => crd(output_dir.as_deref()),
        cli::Command::Simulate {
            scenario,
            policy,
            output,
            lag_threshold,
        } => simulate(&scenario, policy, output, lag_threshold),
        cli::Command::Run(args) => run(args),
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

fn run(args: cli::RunArgs) -> Result<(), Box<dyn std::error::Error>> {
    backlog_operator::telemetry::init_logging(args.log_json);
    // kube and reqwest share rustls; exactly one crypto provider is compiled in.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let options = backlog_operator::controller::RunOptions {
        prometheus_url: args.prometheus_url,
        scope: match args.namespace {
            Some(namespace) => backlog_operator::controller::Scope::Namespace(namespace),
            None => backlog_operator::controller::Scope::All,
        },
        listen: args.listen,
        query_timeout: args.query_timeout,
        query_concurrency: args.query_concurrency,
    };
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(backlog_operator::controller::run(options))?;
    Ok(())
}
