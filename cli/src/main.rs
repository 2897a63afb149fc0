//! `baton`: the command line of the Baton workflow engine.
//!
//! - this file: the subcommands, the runtime they run on, and logging.
//! - `validate`: `baton validate`, check workflow files and agents files.
//! - `security`: TLS, mTLS and token flags, for the coordinator and for its clients.
//! - `certs`, `pki`: `baton certs`, a CA and the certificates a secured cluster needs.
//! - `tokens`: `baton tokens`, principals and their tokens in a principals file.
//! - `server`: `baton coordinator` and `baton worker`, the cluster's processes.
//! - `client`: `baton submit`, `runs` and `approve`, a client of a coordinator.
//! - `decisions`: `baton decisions`, the decisions agents took, searched by meaning.
//! - `dev`: `baton dev`, coordinator and workers in one process, on an in-memory store.
//! - `bench`: `baton bench`, the benchmark: its own Redis, coordinator and worker processes.
//! - `jq_budget`: the budget on `jq:` transforms, and the sandbox process that runs them.
//! - `port_in_use`: a port that cannot be bound, naming its flag and the process holding it.
//! - `probe`: `baton probe URL`, a health check for images with no shell.
//! - `explain`: a failed call to a coordinator said as what to do (a TLS mismatch found by a
//!   probe).
//! - `input`: `--input`, JSON or else a plain string.
//! - `progress`: a run's events printed as they come.
//! - `telemetry`: OTLP export of spans and metrics.
//! - `http_endpoint`: the HTTP port the coordinator and worker processes serve: `/metrics`,
//!   `/healthz`, `/readyz`.

mod bench;
mod certs;
mod client;
mod decisions;
mod dev;
mod explain;
mod http_endpoint;
mod input;
mod jq_budget;
mod pki;
mod port_in_use;
mod probe;
mod progress;
mod security;
mod server;
mod telemetry;
mod tokens;
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
    /// Check workflow files (every problem with its JSON path and step) and agents files
    /// (`--agents`: the first problem with its line, agent or table, and field); exit 1 on errors.
    Validate(validate::Args),
    /// Run a coordinator: the gRPC server that schedules steps and keeps run state in Redis.
    Coordinator(server::CoordinatorArgs),
    /// Run a worker: pull agent tasks from a coordinator and run the agents of an agents file.
    Worker(server::WorkerArgs),
    /// Submit a workflow run; print its id, or follow it with --watch, or its record with --json.
    Submit(client::SubmitArgs),
    /// List, inspect, follow and cancel runs.
    Runs(client::RunsArgs),
    /// Approve (or --reject) a step that waits for a decision.
    Approve(client::ApproveArgs),
    /// Search the decisions a run's agents took (or a workflow's, with --workflow) by meaning.
    Decisions(decisions::Args),
    /// Run a workflow locally: coordinator and workers in this process, nothing to install.
    Dev(dev::Args),
    /// Measure per-step overhead, fan-out, throughput and context size on a real cluster.
    Bench(bench::Args),
    /// Make a CA and the TLS certificates of a secured cluster (servers, and clients for mTLS).
    Certs(certs::Args),
    /// Add principals with new tokens to a principals file, rotate or remove them.
    Tokens(tokens::Args),
    /// GET a URL and exit 0 on 2xx: a health check for images with no shell or curl.
    Probe(probe::Args),
    /// Run `jq:` transforms for a coordinator, under its budget (started by the coordinator).
    #[command(hide = true)]
    JqSandbox(jq_budget::SandboxArgs),
}

fn main() -> ExitCode {
    // Every TLS client and server of the process (Redis, gRPC, HTTP) uses ring, the one rustls
    // provider built in; installed before anything can ask rustls for the process's provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Validate(args) => validate::run(args),
        Command::Certs(args) => certs::run(args),
        Command::Tokens(args) => tokens::run(args),
        // Before any runtime: a sandbox is one thread running programs and one watching them.
        Command::JqSandbox(args) => return jq_budget::sandbox(args),
        command => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|runtime| {
                runtime.block_on(async move {
                    let result = match command {
                        Command::Coordinator(args) => server::coordinator(args).await,
                        Command::Worker(args) => server::worker(args).await,
                        Command::Submit(args) => client::submit(args).await,
                        Command::Runs(args) => client::runs(args).await,
                        Command::Approve(args) => client::approve(args).await,
                        Command::Decisions(args) => decisions::run(args).await,
                        Command::Dev(args) => dev::run(args).await,
                        Command::Bench(args) => bench::run(args).await,
                        Command::Probe(args) => probe::run(args).await,
                        Command::Validate(_)
                        | Command::Certs(_)
                        | Command::Tokens(_)
                        | Command::JqSandbox(_) => {
                            unreachable!("handled above")
                        }
                    };
                    explain::explained(result).await
                })
            }),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("baton: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// Logs to stderr; `RUST_LOG` filters (default `info`). `BATON_LOG_FORMAT=json` writes one
/// JSON object per line (`timestamp`, `level`, `target`, `fields`, and the spans it happened
/// in), for log collectors. Coloured only for a person: on a terminal, without `NO_COLOR`.
pub(crate) fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let json = std::env::var("BATON_LOG_FORMAT").is_ok_and(|format| format == "json");
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colours(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
        ))
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().with_current_span(true).try_init()
    } else {
        builder.try_init()
    };
}

/// Whether output to a terminal (`terminal`) or elsewhere may be coloured: only a terminal, and
/// only while `NO_COLOR` is unset or empty (<https://no-color.org>). A file, a pipe or a log
/// collector never gets escape codes.
pub(crate) fn colours(terminal: bool) -> bool {
    terminal && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty())
}
