//! `baton submit`, `baton runs ...` and `baton approve`: a client of a coordinator.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use baton_coordinator::web::record_json::record_to_json;
use baton_proto::Json;
use baton_proto::connection::{ClientSecurity, Connection, with_sources};
use baton_proto::diagnose::diagnose;
use baton_proto::v1::run_service_client::RunServiceClient;
use baton_proto::v1::{
    CancelRunRequest, DecideApprovalRequest, GetRunRequest, ListRunsRequest, RetryRunRequest,
    RunRecord, SubmitRunRequest, VerifyRunRequest, WatchRunRequest, run_event,
};

use crate::progress::{Progress, print_summary};

/// Where the coordinator is; shared by every client command.
#[derive(clap::Args, Clone)]
pub struct Target {
    /// The coordinator's URL, or several separated by commas: the first that answers is used.
    #[arg(
        long,
        env = "BATON_COORDINATOR",
        default_value = "http://127.0.0.1:50051",
        global = true
    )]
    pub coordinator: String,
    #[command(flatten)]
    pub security: crate::security::ClientArgs,
}

/// A client of a coordinator's run service, sending its token (if any) with every call.
pub type Client = RunServiceClient<Connection>;

/// Connects to the first coordinator of the target's URLs that answers: any coordinator of a
/// cluster serves every run.
pub async fn connect(target: &Target) -> anyhow::Result<Client> {
    connect_with(&target.coordinator, &target.security.security()?).await
}

/// [`connect`] to `urls` (one URL, or several separated by commas) without TLS or a token:
/// for the coordinators this process started itself (`baton dev`, `baton bench`).
pub async fn connect_local(urls: &str) -> anyhow::Result<Client> {
    connect_with(urls, &ClientSecurity::default()).await
}

pub async fn connect_with(urls: &str, security: &ClientSecurity) -> anyhow::Result<Client> {
    let mut failures = Vec::new();
    for url in urls.split(',').map(str::trim).filter(|url| !url.is_empty()) {
        let endpoint = match security.endpoint(url) {
            Ok(endpoint) => endpoint,
            Err(error) => {
                failures.push(error.to_string());
                continue;
            }
        };
        match endpoint.connect().await {
            Ok(channel) => {
                crate::explain::connected(url, security);
                return Ok(RunServiceClient::new(security.authorize(channel)?)
                    .max_decoding_message_size(baton_coordinator::grpc::MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(baton_coordinator::grpc::MAX_MESSAGE_BYTES));
            }
            Err(error) => failures.push(match diagnose(url, security).await {
                Some(hint) => format!("{hint}\n    ({})", with_sources(&error)),
                None => format!("{url}: {}", with_sources(&error)),
            }),
        }
    }
    match failures.as_slice() {
        [] => anyhow::bail!("cannot reach the coordinator: no address given"),
        [failure] => anyhow::bail!("cannot reach the coordinator: {failure}"),
        failures => anyhow::bail!(
            "cannot reach any coordinator:\n  - {}",
            failures.join("\n  - ")
        ),
    }
}

/// A gRPC error as the user should read it.
pub fn failed(status: tonic::Status) -> anyhow::Error {
    crate::explain::CallFailed(status).into()
}

#[derive(clap::Args)]
pub struct SubmitArgs {
    /// The workflow file.
    workflow: PathBuf,
    /// The run's input: JSON, or any other text as a string.
    #[arg(long, default_value = "null")]
    input: String,
    /// Follow the run to its end with live per-step progress.
    #[arg(long)]
    watch: bool,
    /// Wait for the end and print the final run record as JSON.
    #[arg(long)]
    json: bool,
    /// Submitting again with the same key (a retry) gets the same run, not a second one.
    #[arg(long)]
    idempotency_key: Option<String>,
    #[command(flatten)]
    target: Target,
}

pub async fn submit(args: SubmitArgs) -> anyhow::Result<ExitCode> {
    let workflow = std::fs::read(&args.workflow)
        .with_context(|| format!("cannot read {}", args.workflow.display()))?;
    let input = crate::input::json(&args.input);
    let mut client = connect(&args.target).await?;
    let mut request = tonic::Request::new(SubmitRunRequest {
        workflow,
        input: Some(Json::new(input)),
        idempotency_key: args.idempotency_key.clone().unwrap_or_default(),
    });
    let span = crate::telemetry::ClientSpan::start("baton submit").await?;
    if let Some(traceparent) = span.traceparent()
        && let Ok(value) = traceparent.parse()
    {
        request.metadata_mut().insert("traceparent", value);
    }
    let submitted = client.submit_run(request).await;
    span.end(submitted.as_ref().err().map(|status| status.message()))
        .await;
    let run_id = submitted.map_err(failed)?.into_inner().run_id;
    if args.json {
        let record = follow(&mut client, &run_id, false).await?;
        println!(
            "{}",
            serde_json::to_string_pretty(&record_to_json(&record))?
        );
        return Ok(exit_code(&record));
    }
    if args.watch {
        println!("run {run_id}");
        let record = follow(&mut client, &run_id, true).await?;
        return Ok(exit_code(&record));
    }
    println!("{run_id}");
    Ok(ExitCode::SUCCESS)
}

/// Watches a run to its end, printing progress when asked; returns the final record.
pub async fn follow(client: &mut Client, run_id: &str, print: bool) -> anyhow::Result<RunRecord> {
    let mut stream = client
        .watch_run(WatchRunRequest {
            run_id: run_id.to_owned(),
        })
        .await
        .map_err(failed)?
        .into_inner();
    let mut stdout = std::io::stdout();
    let mut progress = Progress::new(std::io::IsTerminal::is_terminal(&stdout));
    while let Some(event) = stream.message().await.map_err(failed)? {
        if print {
            progress.print(&mut stdout, run_id, &event)?;
            stdout.flush()?;
        }
        if let Some(run_event::Event::RunFinished(finished)) = event.event {
            return finished.record.context("the final event carries no record");
        }
    }
    anyhow::bail!("the coordinator ended the watch of run {run_id} before it finished")
}

fn exit_code(record: &RunRecord) -> ExitCode {
    if record.status == "succeeded" {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[derive(clap::Args)]
pub struct RunsArgs {
    #[command(subcommand)]
    command: RunsCommand,
    #[command(flatten)]
    target: Target,
}

#[derive(clap::Subcommand)]
enum RunsCommand {
    /// The newest runs, a page at a time, under a header line (with --json, one JSON object):
    /// when more follow, stderr says how to get the next page.
    List {
        /// At most this many runs (the coordinator gives at most 1,000).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Only runs with this status. A page over runs that mostly have another may come back
        /// short: the next page goes on.
        #[arg(long, value_parser = run_statuses())]
        status: Option<String>,
        /// Only runs of this workflow id.
        #[arg(long)]
        workflow: Option<String>,
        /// Start after the page that printed this token (`next page: --page-token <token>`);
        /// give the same filters.
        #[arg(long, allow_hyphen_values = true)]
        page_token: Option<String>,
        /// Print the page as one JSON object: `runs` (each `run_id`, `status`, `workflow_id`,
        /// `created_ms`, `updated_ms`) and `next_page_token` (null on the last page).
        #[arg(long)]
        json: bool,
    },
    /// A run's record: status, steps, what it waits for.
    Get {
        run_id: String,
        /// Print the run record as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Follow a run to its end.
    Watch { run_id: String },
    /// Stop a run now.
    Cancel {
        run_id: String,
        #[arg(long, default_value = "cancelled from the command line")]
        reason: String,
    },
    /// Recompute a run's state chain from the store: exit 0 when it holds, 1 naming the first
    /// step whose stored data does not match.
    Verify { run_id: String },
    /// Resume a failed run from the step that failed: an agent step runs again; a map step
    /// runs again only its items that did not succeed, keeping the others' results.
    Retry {
        run_id: String,
        /// Follow the run to its end, as `runs watch` does.
        #[arg(long)]
        watch: bool,
    },
}

pub async fn runs(args: RunsArgs) -> anyhow::Result<ExitCode> {
    let mut client = connect(&args.target).await?;
    let mut stdout = std::io::stdout();
    match args.command {
        RunsCommand::List {
            limit,
            status,
            workflow,
            page_token,
            json,
        } => {
            let request = ListRunsRequest {
                limit,
                status: status.unwrap_or_default(),
                workflow_id: workflow.unwrap_or_default(),
                page_token: page_token.unwrap_or_default(),
            };
            list_runs(&mut client, request, json, &mut stdout).await?;
        }
        RunsCommand::Get { run_id, json } => {
            let record = client
                .get_run(GetRunRequest { run_id })
                .await
                .map_err(failed)?
                .into_inner();
            match json {
                true => writeln!(
                    stdout,
                    "{}",
                    serde_json::to_string_pretty(&record_to_json(&record))?
                )?,
                false => print_record(&mut stdout, &record)?,
            }
        }
        RunsCommand::Watch { run_id } => {
            let record = follow(&mut client, &run_id, true).await?;
            return Ok(exit_code(&record));
        }
        RunsCommand::Cancel { run_id, reason } => {
            let record = client
                .cancel_run(CancelRunRequest { run_id, reason })
                .await
                .map_err(failed)?
                .into_inner();
            print_summary(&mut stdout, &record)?;
        }
        RunsCommand::Retry { run_id, watch } => {
            let record = client
                .retry_run(RetryRunRequest {
                    run_id: run_id.clone(),
                })
                .await
                .map_err(failed)?
                .into_inner();
            writeln!(stdout, "run {run_id} retried: {}", record.status)?;
            if watch {
                let record = follow(&mut client, &run_id, true).await?;
                return Ok(exit_code(&record));
            }
        }
        RunsCommand::Verify { run_id } => return verify(&mut client, run_id, &mut stdout).await,
    }
    Ok(ExitCode::SUCCESS)
}

/// The values `runs list --status` takes: every run status.
fn run_statuses() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(baton_core::RunStatus::ALL.map(|s| s.as_str()))
}

/// `runs list`: a header, then a run per line on stdout, the next page's token on stderr; or,
/// with `json`, the page as one JSON object.
async fn list_runs(
    client: &mut Client,
    request: ListRunsRequest,
    json: bool,
    stdout: &mut impl Write,
) -> anyhow::Result<()> {
    let page = client
        .list_runs(request)
        .await
        .map_err(failed)?
        .into_inner();
    if json {
        let runs: Vec<serde_json::Value> = page
            .runs
            .iter()
            .map(|run| {
                serde_json::json!({
                    "run_id": run.run_id,
                    "status": run.status,
                    "workflow_id": run.workflow_id,
                    "created_ms": run.created_ms,
                    "updated_ms": run.updated_ms,
                })
            })
            .collect();
        let next = (!page.next_page_token.is_empty()).then_some(&page.next_page_token);
        let page = serde_json::json!({"runs": runs, "next_page_token": next});
        writeln!(stdout, "{page}")?;
        return Ok(());
    }
    // Run ids are UUIDs, 36 characters.
    writeln!(stdout, "{:<36}  {:<10} WORKFLOW", "RUN", "STATUS")?;
    for run in page.runs {
        writeln!(
            stdout,
            "{:<36}  {:<10} {}",
            run.run_id, run.status, run.workflow_id
        )?;
    }
    // On stderr, so that stdout stays the header and one run per line.
    if !page.next_page_token.is_empty() {
        eprintln!("next page: --page-token {}", page.next_page_token);
    }
    Ok(())
}

/// What `runs get` says of a run without a trace id: a run has one when the coordinator that
/// accepted it exported traces, or when its submitter sent a `traceparent` (baton's own with an
/// exporter configured, or `TRACEPARENT`).
const NO_TRACE: &str = "none recorded (the coordinator that accepted the run exported no traces, and its submitter sent no traceparent; runs submitted with OTEL_EXPORTER_OTLP_ENDPOINT set get one)";

/// `runs get`: the summary, a line per step, the tokens, the state and the trace.
fn print_record(stdout: &mut impl Write, record: &RunRecord) -> anyhow::Result<()> {
    print_summary(stdout, record)?;
    for step in &record.steps {
        let worker = if step.worker_id.is_empty() {
            String::new()
        } else {
            format!("  on {}", step.worker_id)
        };
        let items = step
            .items
            .as_ref()
            .map(|items| {
                format!(
                    "  items {}/{} done, {} failed, {} running",
                    items.succeeded + items.failed,
                    items.count,
                    items.failed,
                    items.running
                )
            })
            .unwrap_or_default();
        writeln!(
            stdout,
            "  {:<24} {:<10} visits {}{worker}{items}",
            step.step_id, step.status, step.visits
        )?;
    }
    for usage in &record.usage {
        writeln!(
            stdout,
            "  tokens {}: {} prompt, {} completion",
            usage.model, usage.prompt_tokens, usage.completion_tokens
        )?;
    }
    writeln!(stdout, "  state sha256 {}", record.state_sha256)?;
    if record.trace_id.is_empty() {
        writeln!(stdout, "  trace: {NO_TRACE}")?;
    } else {
        writeln!(stdout, "  trace: {}", record.trace_id)?;
    }
    Ok(())
}

/// `runs verify`: whether the state chain holds, and where it breaks if not (exit code 1).
async fn verify(
    client: &mut Client,
    run_id: String,
    stdout: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let verified = client
        .verify_run(VerifyRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .map_err(failed)?
        .into_inner();
    if verified.ok {
        writeln!(
            stdout,
            "run {run_id}: state chain holds ({} links, head {})",
            verified.links, verified.state_sha256
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    let step = if verified.step_id.is_empty() {
        String::new()
    } else {
        format!(
            " at step \"{}\" (visit {})",
            verified.step_id, verified.visit
        )
    };
    writeln!(
        stdout,
        "run {run_id}: state chain does NOT hold{step}: {}",
        verified.problem
    )?;
    Ok(ExitCode::FAILURE)
}

#[derive(clap::Args)]
pub struct ApproveArgs {
    run_id: String,
    step_id: String,
    /// Reject instead of approving.
    #[arg(long)]
    reject: bool,
    #[arg(long)]
    comment: Option<String>,
    /// Who decides (default: $USER).
    #[arg(long, env = "USER")]
    approver: Option<String>,
    #[command(flatten)]
    target: Target,
}

pub async fn approve(args: ApproveArgs) -> anyhow::Result<ExitCode> {
    let mut client = connect(&args.target).await?;
    let record = client
        .decide_approval(DecideApprovalRequest {
            run_id: args.run_id,
            step_id: args.step_id,
            approved: !args.reject,
            comment: args.comment.unwrap_or_default(),
            approver: args.approver.unwrap_or_default(),
        })
        .await
        .map_err(failed)?
        .into_inner();
    print_summary(&mut std::io::stdout(), &record)?;
    Ok(ExitCode::SUCCESS)
}
