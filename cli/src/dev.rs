//! `baton dev`: a coordinator and a worker in this process, on the in-memory store.
//!
//! The same code paths as the cluster (gRPC on a loopback port, the same coordinator and worker
//! runtime), so what works here works there; only the store differs.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use baton_coordinator::store::memory::MemoryStore;
use baton_coordinator::web::record_json::record_to_json;
use baton_coordinator::{Config, Coordinator};
use baton_proto::Json;
use baton_proto::v1::{
    DecideApprovalRequest, SubmitRunRequest, VerifyRunRequest, WatchRunRequest, run_event,
};
use baton_worker::Worker;
use baton_worker::agents::AgentsFile;
use tokio::sync::oneshot;

use crate::progress::Progress;

#[derive(clap::Args)]
pub struct Args {
    /// The workflow file.
    workflow: PathBuf,
    /// The agents (TOML).
    #[arg(long)]
    agents: PathBuf,
    /// The run's input: JSON, or any other text as a string.
    #[arg(long, default_value = "null")]
    input: String,
    /// Approve every approval step without asking.
    #[arg(long)]
    auto_approve: bool,
    /// Print only the final run record, as JSON (the transcript goes to stderr).
    #[arg(long)]
    json: bool,
    /// Tasks the in-process worker runs at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    #[command(flatten)]
    jq: crate::jq_budget::JqArgs,
}

/// Where the transcript goes: stdout, or stderr with `--json` so stdout stays one JSON object.
fn transcript(json: bool) -> Box<dyn Write + Send> {
    if json {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    }
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    // With an OTLP endpoint set, a local run is traced like a cluster's.
    let telemetry = crate::telemetry::init("baton-dev", None)?;
    let ran = run_locally(args, telemetry.enabled()).await;
    telemetry.shutdown().await;
    ran
}

async fn run_locally(args: Args, traces: bool) -> anyhow::Result<ExitCode> {
    let workflow = std::fs::read(&args.workflow)
        .with_context(|| format!("cannot read {}", args.workflow.display()))?;
    let agents = AgentsFile::load(&args.agents)?;
    let input = crate::input::json(&args.input);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let config = args.jq.install(Config {
        traces,
        ..Config::default()
    })?;
    let coordinator = Coordinator::new(MemoryStore::new(), config);
    let (stop_server, server_stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(baton_coordinator::grpc::serve(
        listener,
        coordinator.clone(),
        async {
            let _ = server_stopped.await;
        },
    ));
    let (stop_running, running_stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        coordinator
            .run(async {
                let _ = running_stopped.await;
            })
            .await;
    });

    let out = Arc::new(Mutex::new(transcript(args.json)));
    // What each agent received and returned, printed with its step's line, so the transcript
    // reads in the order the run went rather than the order tasks happened to finish.
    let exchanges: Arc<Mutex<HashMap<(String, u32), String>>> = Arc::default();
    let observed = exchanges.clone();
    let worker = baton_worker::agents_into(
        Worker::builder()
            .id("dev-worker")
            .traces(traces)
            .coordinator(url.clone())
            .concurrency(args.concurrency),
        agents,
    )
    .observer(move |task, result| {
        // A map's items would be thousands of exchanges: its first item's stands for them.
        let item = match task.item {
            None => String::new(),
            Some(0) => ", item 0; the other items' exchanges are not shown".to_owned(),
            Some(_) => return,
        };
        let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
        let mut text = format!(
            "    ── {} (agent {}{item}) received:\n{}\n",
            task.step_id,
            task.agent,
            indent(&match task.payload.try_value() {
                Ok(value) => pretty(value),
                Err(error) => error,
            })
        );
        match result {
            Ok(output) => {
                text.push_str(&format!(
                    "    ── returned:\n{}\n",
                    indent(&pretty(&output.data))
                ));
                for (what, notes) in [
                    ("messages", &output.messages),
                    ("decisions", &output.decisions),
                ] {
                    if !notes.is_empty() {
                        let notes = serde_json::Value::Array(notes.clone());
                        text.push_str(&format!("    ── {what}:\n{}\n", indent(&pretty(&notes))));
                    }
                }
            }
            Err(error) => text.push_str(&format!("    ── failed: {error}\n")),
        }
        observed
            .lock()
            .expect("exchanges lock")
            .insert((task.step_id.clone(), task.visit), text);
    })
    .build();
    let (stop_worker, worker_stopped) = oneshot::channel::<()>();
    let worker = tokio::spawn(worker.run(async {
        let _ = worker_stopped.await;
    }));

    let mut client = crate::client::connect_local(&url).await?;
    let run_id = client
        .submit_run(SubmitRunRequest {
            workflow,
            input: Some(Json::new(input)),
            idempotency_key: String::new(),
        })
        .await
        .map_err(|status| anyhow::anyhow!("{}", status.message()))?
        .into_inner()
        .run_id;
    writeln!(out.lock().expect("transcript lock"), "run {run_id}")?;

    let mut events = client
        .watch_run(WatchRunRequest {
            run_id: run_id.clone(),
        })
        .await?
        .into_inner();
    let mut record = None;
    let mut progress = Progress::new(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    while let Some(event) = events.message().await? {
        {
            let mut out = out.lock().expect("transcript lock");
            if let Some(run_event::Event::StepFinished(done)) = &event.event {
                let key = (done.step_id.clone(), done.visit);
                if let Some(text) = exchanges.lock().expect("exchanges lock").remove(&key) {
                    progress.write_block(&mut *out, &text)?;
                }
            }
            progress.print(&mut *out, &run_id, &event)?;
        }
        match event.event {
            Some(run_event::Event::ApprovalRequested(approval)) => {
                // An automatic approval is the bare `{"approved": true}` the spec shows.
                let (approved, comment, approver) = if args.auto_approve {
                    (true, String::new(), String::new())
                } else {
                    let (approved, comment) = ask(&approval.message).await?;
                    let approver = std::env::var("USER").unwrap_or_else(|_| "baton dev".into());
                    (approved, comment, approver)
                };
                client
                    .decide_approval(DecideApprovalRequest {
                        run_id: run_id.clone(),
                        step_id: approval.step_id,
                        approved,
                        comment,
                        approver,
                    })
                    .await
                    .map_err(|status| anyhow::anyhow!("{}", status.message()))?;
            }
            Some(run_event::Event::RunFinished(finished)) => {
                record = finished.record;
                break;
            }
            _ => {}
        }
    }
    // The run's state chain, recomputed from the store as `baton runs verify` does.
    let verified = client
        .verify_run(VerifyRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .map_err(|status| anyhow::anyhow!("{}", status.message()))?
        .into_inner();
    {
        let mut out = out.lock().expect("transcript lock");
        if verified.ok {
            writeln!(
                out,
                "state chain verified: {} links, head {}",
                verified.links, verified.state_sha256
            )?;
        } else {
            writeln!(out, "state chain does NOT hold: {}", verified.problem)?;
        }
    }
    let _ = stop_worker.send(());
    let _ = stop_server.send(());
    let _ = worker.await;
    let _ = server.await;
    let _ = stop_running.send(());
    let _ = running.await;
    let record = record.context("the run ended without a final record")?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&record_to_json(&record))?
        );
    }
    Ok(if record.status == "succeeded" {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|line| format!("    {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Asks at the terminal (on stderr, so `--json` keeps stdout to the record): `y` approves, `n` rejects; text after a colon is the comment.
async fn ask(message: &str) -> anyhow::Result<(bool, String)> {
    let message = message.to_owned();
    tokio::task::spawn_blocking(move || {
        let stdin = std::io::stdin();
        loop {
            eprint!("{message} [y/n, optionally followed by ': comment'] ");
            std::io::stderr().flush()?;
            let mut line = String::new();
            if stdin.lock().read_line(&mut line)? == 0 {
                anyhow::bail!("an approval is needed but stdin is closed; pass --auto-approve");
            }
            let (answer, comment) = match line.trim().split_once(':') {
                Some((answer, comment)) => {
                    (answer.trim().to_lowercase(), comment.trim().to_owned())
                }
                None => (line.trim().to_lowercase(), String::new()),
            };
            match answer.as_str() {
                "y" | "yes" => return Ok((true, comment)),
                "n" | "no" => return Ok((false, comment)),
                _ => eprintln!("please answer y or n"),
            }
        }
    })
    .await?
}
