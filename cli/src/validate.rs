//! `baton validate FILE... [--agents AGENTS]...`

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use baton_core::diagnostics::Severity;
use baton_core::{Diagnostic, parse_workflow};
use baton_worker::agents::AgentsFile;

#[derive(clap::Args)]
pub struct Args {
    /// Workflow files (JSON; `//` comments and trailing commas are allowed).
    #[arg(required_unless_present = "agents")]
    files: Vec<PathBuf>,
    /// An agents file to check as a worker loads it (every field, its `[defaults.llm]` and the
    /// BATON_LLM_* variables over it, its prompts and schemas, its keys' variables set).
    #[arg(long, value_name = "AGENTS")]
    agents: Vec<PathBuf>,
    /// Print one JSON object per file instead of text.
    #[arg(long)]
    json: bool,
}

/// Exit 0 when every file is valid (warnings allowed), 1 when any has an error.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut stdout = std::io::stdout().lock();
    let mut invalid = 0usize;
    for file in &args.agents {
        let error = AgentsFile::load(file).err();
        invalid += usize::from(error.is_some());
        if args.json {
            let problems: Vec<serde_json::Value> = error
                .iter()
                .map(|e| serde_json::json!({"severity": "error", "message": e.to_string()}))
                .collect();
            let line = serde_json::json!({
                "file": file.display().to_string(),
                "valid": error.is_none(),
                "problems": problems,
            });
            writeln!(stdout, "{line}")?;
        } else {
            match error {
                // The message starts with the file (and line).
                Some(error) => writeln!(stdout, "{error}")?,
                None => writeln!(stdout, "{}: ok", file.display())?,
            }
        }
    }
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
    let checked = args.files.len() + args.agents.len();
    if !args.json && checked > 1 {
        writeln!(stdout, "{} of {checked} files valid", checked - invalid)?;
    }
    Ok(if invalid == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
