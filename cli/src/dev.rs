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
    self, DecideApprovalRequest, SubmitRunRequest, VerifyRunRequest, WatchRunRequest, run_event,
};
use baton_worker::agents::AgentsFile;
use baton_worker::{AgentResult, Task, Worker};
use tokio::sync::oneshot;

use crate::client::Client;
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
    pub(crate) jq: crate::jq_budget::JqArgs,
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
    let out: Transcript = Arc::new(Mutex::new(transcript(args.json)));
    let exchanges = Exchanges::default();
    let local = InProcess::start(&args, traces, agents, exchanges.clone()).await?;
    let mut client = crate::client::connect_local(&local.url).await?;
    let run_id = submit(&mut client, workflow, input, &out).await?;
    let record = follow(&mut client, &run_id, &args, &out, &exchanges).await?;
    print_verification(&mut client, &run_id, &out).await?;
    local.stop().await;
    finish(record, args.json)
}

/// Where the transcript is written, shared with nothing but kept whole line by line.
type Transcript = Arc<Mutex<Box<dyn Write + Send>>>;

/// What each agent received and returned, by step and visit, printed with its step's line, so
/// the transcript reads in the order the run went rather than the order tasks happened to
/// finish.
#[derive(Clone, Default)]
struct Exchanges(Arc<Mutex<HashMap<(String, u32), String>>>);

impl Exchanges {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u32), String>> {
        self.0.lock().expect("exchanges lock")
    }
}

/// The coordinator (its background work and its gRPC server) and the worker this process
/// runs, each on a task of its own until told to stop.
struct InProcess {
    url: String,
    coordinator: Stoppable<()>,
    server: Stoppable<Result<(), tonic::transport::Error>>,
    worker: Stoppable<Result<(), baton_worker::Denied>>,
}

impl InProcess {
    async fn start(
        args: &Args,
        traces: bool,
        agents: AgentsFile,
        exchanges: Exchanges,
    ) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let config = args.jq.install(Config {
            traces,
            ..Config::default()
        })?;
        let coordinator = Coordinator::new(MemoryStore::new(), config);
        let server = Stoppable::spawn(|stopped| {
            baton_coordinator::grpc::serve(listener, coordinator.clone(), stopped)
        });
        let coordinator = Stoppable::spawn(|stopped| async move { coordinator.run(stopped).await });
        let worker = baton_worker::agents_into(
            Worker::builder()
                .id("dev-worker")
                .traces(traces)
                .coordinator(url.clone())
                .concurrency(args.concurrency),
            agents,
        )
        .observer(move |task, result| {
            if let Some(text) = exchange_text(task, result) {
                exchanges
                    .lock()
                    .insert((task.step_id.clone(), task.visit), text);
            }
        })
        .build();
        let worker = Stoppable::spawn(|stopped| worker.run(stopped));
        Ok(Self {
            url,
            coordinator,
            server,
            worker,
        })
    }

    /// The worker and the server, then the coordinator's background work.
    async fn stop(self) {
        let (worker, server) = (self.worker.stop(), self.server.stop());
        let _ = worker.await;
        let _ = server.await;
        let _ = self.coordinator.stop().await;
    }
}

/// A task that runs until told to stop.
struct Stoppable<T> {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<T>,
}

impl<T: Send + 'static> Stoppable<T> {
    /// Spawns what `start` makes of the future that completes when this is told to stop.
    fn spawn<F>(start: impl FnOnce(Stopped) -> F) -> Self
    where
        F: Future<Output = T> + Send + 'static,
    {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(start(Box::pin(async {
            let _ = stopped.await;
        })));
        Self { stop, task }
    }

    /// Tells it to stop; what this returns completes once it has.
    fn stop(self) -> tokio::task::JoinHandle<T> {
        let _ = self.stop.send(());
        self.task
    }
}

/// Completes when a [`Stoppable`] is told to stop.
type Stopped = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a task received and what its agent returned, as the transcript shows it; `None` for
/// the map items past the first, whose thousands of exchanges the first one stands for.
fn exchange_text(task: &Task, result: &AgentResult) -> Option<String> {
    let item = match task.item {
        None => String::new(),
        Some(0) => ", item 0; the other items' exchanges are not shown".to_owned(),
        Some(_) => return None,
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
    Some(text)
}

/// Submits the run; its id, printed.
async fn submit(
    client: &mut Client,
    workflow: Vec<u8>,
    input: Vec<u8>,
    out: &Transcript,
) -> anyhow::Result<String> {
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
    Ok(run_id)
}

/// Watches the run to its end, printing its progress (each step's exchange with its line) and
/// deciding its approvals; the final record, if the run ended with one.
async fn follow(
    client: &mut Client,
    run_id: &str,
    args: &Args,
    out: &Transcript,
    exchanges: &Exchanges,
) -> anyhow::Result<Option<v1::RunRecord>> {
    let mut events = client
        .watch_run(WatchRunRequest {
            run_id: run_id.to_owned(),
        })
        .await?
        .into_inner();
    let mut progress = Progress::new(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    while let Some(event) = events.message().await? {
        {
            let mut out = out.lock().expect("transcript lock");
            if let Some(run_event::Event::StepFinished(done)) = &event.event {
                let key = (done.step_id.clone(), done.visit);
                if let Some(text) = exchanges.lock().remove(&key) {
                    progress.write_block(&mut *out, &text)?;
                }
            }
            progress.print(&mut *out, run_id, &event)?;
        }
        match event.event {
            Some(run_event::Event::ApprovalRequested(approval)) => {
                decide(client, run_id, approval, args.auto_approve).await?;
            }
            Some(run_event::Event::RunFinished(finished)) => return Ok(finished.record),
            _ => {}
        }
    }
    Ok(None)
}

/// Decides an approval: at once with `--auto-approve`, else as the person at the terminal says.
async fn decide(
    client: &mut Client,
    run_id: &str,
    approval: v1::ApprovalRequested,
    auto_approve: bool,
) -> anyhow::Result<()> {
    // An automatic approval is the bare `{"approved": true}` the spec shows.
    let (approved, comment, approver) = if auto_approve {
        (true, String::new(), String::new())
    } else {
        let (approved, comment) = ask(&approval.message).await?;
        let approver = std::env::var("USER").unwrap_or_else(|_| "baton dev".into());
        (approved, comment, approver)
    };
    client
        .decide_approval(DecideApprovalRequest {
            run_id: run_id.to_owned(),
            step_id: approval.step_id,
            approved,
            comment,
            approver,
        })
        .await
        .map_err(|status| anyhow::anyhow!("{}", status.message()))?;
    Ok(())
}

/// The run's state chain, recomputed from the store as `baton runs verify` does, printed.
async fn print_verification(
    client: &mut Client,
    run_id: &str,
    out: &Transcript,
) -> anyhow::Result<()> {
    let verified = client
        .verify_run(VerifyRunRequest {
            run_id: run_id.to_owned(),
        })
        .await
        .map_err(|status| anyhow::anyhow!("{}", status.message()))?
        .into_inner();
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
    Ok(())
}

/// The final record (printed as JSON with `--json`), and success only if the run succeeded.
fn finish(record: Option<v1::RunRecord>, json: bool) -> anyhow::Result<ExitCode> {
    let record = record.context("the run ended without a final record")?;
    if json {
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
