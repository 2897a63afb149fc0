//! `baton`: the command line of the Baton workflow engine.

mod validate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "baton",
    version,
    about = "Distributed workflow engine for multi-agent pipelines"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check workflow files: print every problem with its JSON path and step, exit 1 on errors.
    Validate(validate::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Validate(args) => validate::run(args),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("baton: {error:#}");
            ExitCode::from(2)
        }
    }
}
