//! `baton validate FILE...`

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use baton_core::diagnostics::Severity;
use baton_core::{Diagnostic, parse_workflow};

#[derive(clap::Args)]
pub struct Args {
    /// Workflow files (JSON; `//` comments and trailing commas are allowed).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Print one JSON object per file instead of text.
    #[arg(long)]
    json: bool,
}

/// Exit 0 when every file is valid (warnings allowed), 1 when any has an error.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut stdout = std::io::stdout().lock();
    let mut invalid = 0usize;
    for file in &args.files {
        let diagnostics = match std::fs::read_to_string(file) {
            Ok(text) => match parse_workflow(&text) {
                Ok(parsed) => parsed.warnings,
                Err(error) => error.diagnostics.0,
            },
            Err(error) => vec![Diagnostic::error(
                "$",
                None,
                format!("cannot read the file: {error}"),
            )],
        };
        let has_errors = diagnostics.iter().any(Diagnostic::is_error);
        invalid += usize::from(has_errors);
        if args.json {
            let problems: Vec<serde_json::Value> = diagnostics
                .iter()
                .map(|d| {
                    serde_json::json!({
                        "severity": if d.severity == Severity::Error { "error" } else { "warning" },
                        "path": d.path,
                        "step_id": d.step_id,
                        "message": d.message,
                    })
                })
                .collect();
            let line = serde_json::json!({
                "file": file.display().to_string(),
                "valid": !has_errors,
                "problems": problems,
            });
            writeln!(stdout, "{line}")?;
            continue;
        }
        for diagnostic in &diagnostics {
            writeln!(stdout, "{}: {diagnostic}", file.display())?;
        }
        if !has_errors {
            writeln!(stdout, "{}: ok", file.display())?;
        }
    }
    if !args.json && args.files.len() > 1 {
        writeln!(
            stdout,
            "{} of {} files valid",
            args.files.len() - invalid,
            args.files.len()
        )?;
    }
    Ok(if invalid == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
