//! `baton decisions`: the decisions agents took, searched by meaning.

use std::io::Write;
use std::process::ExitCode;

use baton_proto::v1::{DecisionMatch, QueryDecisionsRequest};
use serde_json::json;

use crate::client::{Target, connect, failed};

#[derive(clap::Args)]
pub struct Args {
    /// The run whose decisions to search (or, with --workflow, a workflow id: every run of it).
    run_id: String,
    /// What to look for, in words.
    text: String,
    /// Only this agent's decisions.
    #[arg(long)]
    agent: Option<String>,
    /// How many matches, best first.
    #[arg(short, default_value_t = 5)]
    k: u32,
    /// Search every run of the workflow with this id instead of one run.
    #[arg(long)]
    workflow: bool,
    /// Print the matches as a JSON array, each with its score.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    target: Target,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut client = connect(&args.target).await?;
    let (run_id, workflow_id) = if args.workflow {
        (String::new(), args.run_id)
    } else {
        (args.run_id, String::new())
    };
    let response = client
        .query_decisions(QueryDecisionsRequest {
            run_id,
            workflow_id,
            text: args.text,
            agent: args.agent.unwrap_or_default(),
            k: args.k,
        })
        .await
        .map_err(failed)?
        .into_inner();
    let mut stdout = std::io::stdout();
    if args.json {
        let matches: Vec<_> = response.matches.iter().map(to_json).collect();
        writeln!(stdout, "{}", serde_json::to_string_pretty(&matches)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    if response.matches.is_empty() {
        writeln!(stdout, "no decisions")?;
    }
    for m in &response.matches {
        writeln!(
            stdout,
            "{:.3}  {} ({} at {} #{}, {}): {}",
            m.score, m.summary, m.agent, m.step_id, m.visit, m.timestamp, m.rationale
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

fn to_json(m: &DecisionMatch) -> serde_json::Value {
    json!({
        "score": m.score,
        "run_id": m.run_id,
        "key": m.key,
        "agent": m.agent,
        "step_id": m.step_id,
        "visit": m.visit,
        "summary": m.summary,
        "rationale": m.rationale,
        "timestamp": m.timestamp,
        "related_artifacts": m.related_artifacts,
    })
}
