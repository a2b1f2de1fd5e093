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
