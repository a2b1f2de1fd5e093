use std::process::ExitCode;

use backlog_operator::{api, cli};
use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Crd { output_dir } => crd(output_dir.as_deref()),
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
