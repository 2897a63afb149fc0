//! `baton bench`: the seven workloads of the benchmark on a real cluster of separate processes.
//!
//! - this file: the arguments, the order of a benchmark, and the built-in agents it runs.
//! - `cluster`: the processes it runs against: Redis, a coordinator, workers.
//! - `redis_server`: that Redis's memory use, and emptying it between repetitions.
//! - `workloads`: the workloads, how each is timed, and the line printed for it.
//! - `streaming`: W5, live output from a worker on one coordinator to a watcher on another.
//! - `model_server`: W5's stand-in OpenAI-compatible model, streaming tokens.
//! - `runs`: submitting a run, watching it, checking it succeeded; the sizes `--scale` shrinks.
//!
//! Starts its own `redis-server` on a free loopback port (unless `--redis` is given; that server
//! may be flushed), one `baton coordinator` and N `baton worker` processes of this same binary,
//! runs an untimed warm-up, then each workload `--reps` times, and prints one JSON line per
//! workload. The clock runs from the client's SubmitRun until the client holds the final run
//! record. Agents are built in and do nothing (`{"ok": true, "i": n}`), so what is measured is
//! Baton itself.
//!
//! - W1 chain: one run of 200 sequential agent steps.
//! - W2 fan-out: a parallel step of 500 agent branches, then one agent step that gets them all.
//! - W3 throughput: 200 concurrent runs of a 3-step chain.
//! - W4 accumulation: W1 where each step returns 64 KiB and receives every earlier result.
//! - W5 streaming: an `llm` agent streams a stand-in model's 20,000 tokens as live output; a
//!   watcher on a second coordinator reads them (tokens per second, latency per token,
//!   coordinators' CPU).
//! - W6 jq: one run of 200 `jq:` transforms in a row, each in the coordinator's budgeted
//!   sandbox (`BATON_JQ_UNBUDGETED=true` in the bench's environment runs them unbudgeted).
//! - W7 map: one `map` step of 10,000 `noop` items from the run's input, at most 256 in flight
//!   (the map workload issue 17 calls W5); its line adds `items`, `items_succeeded` and
//!   `items_per_s`.

mod cluster;
mod model_server;
mod redis_server;
mod runs;
mod secure;
mod streaming;
mod workloads;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use baton_worker::WorkerBuilder;
use serde_json::json;

pub use workloads::Workload;

#[derive(clap::Args)]
pub struct Args {
    /// Use this Redis instead of starting one (it may be flushed).
    #[arg(long)]
    redis: Option<String>,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Timed repetitions of each workload.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Which workloads, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "W1,W2,W3,W4,W5,W6,W7")]
    workloads: Vec<Workload>,
    /// Multiplies every size (steps, branches, runs, items, blob size); CI runs 0.02 so the bench
    /// cannot rot without taking minutes.
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Tasks each worker runs at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Run the cluster secured: TLS on the coordinators' port and a token on every call
    /// (certificates and tokens made for the run).
    #[arg(long)]
    secure: bool,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    // W5's model, and the agents file of the llm agent that asks it.
    let streaming = args.workloads.contains(&Workload::W5);
    let model = if streaming {
        Some(model_server::ModelServer::start().await?)
    } else {
        None
    };
    let agents_dir = tempfile::tempdir()?;
    let agents_file = match &model {
        Some(model) => {
            let path = agents_dir.path().join("agents.toml");
            std::fs::write(&path, model_server::agents_toml(&model.base_url))?;
            Some(path)
        }
        None => None,
    };
    let cluster = cluster::Cluster::start(
        args.redis.as_deref(),
        args.workers,
        args.concurrency,
        runs::scaled(64 * 1024, args.scale),
        agents_file.as_deref(),
        streaming,
        args.secure,
    )
    .await?;
    eprintln!(
        "bench: redis {}, coordinator {}, {} workers",
        baton_coordinator::store::redis::redacted(&cluster.redis_url),
        cluster.coordinator_url,
        args.workers
    );
    let mut client = cluster.client().await?;
    workloads::warm_up(&mut client, &cluster).await?;
    for workload in &args.workloads {
        let line = workloads::measure(*workload, &cluster, args.reps.max(1), args.scale).await?;
        println!("{line}");
    }
    drop(cluster);
    Ok(ExitCode::SUCCESS)
}

/// The built-in agents: `noop` returns `{"ok": true, "i": n}` without reading its payload;
/// `blob64k` adds a string of `blob_bytes` (64 KiB unless scaled down) and takes its payload's
/// bytes first, as a `command` agent would to write them to its stdin. (W5's `stream` agent is
/// an `llm` agent of an agents file: see [`model_server`].)
pub fn agents(builder: WorkerBuilder, blob_bytes: usize) -> WorkerBuilder {
    let counter = Arc::new(AtomicU64::new(0));
    let noop_counter = counter.clone();
    builder
        .agent("noop", move |_task| {
            let i = noop_counter.fetch_add(1, Ordering::Relaxed);
            async move { Ok(json!({"ok": true, "i": i})) }
        })
        .agent("blob64k", move |task| {
            let i = counter.fetch_add(1, Ordering::Relaxed);
            let received = task.payload.bytes().len();
            async move {
                if received == 0 {
                    return Err("an empty payload".into());
                }
                Ok(json!({"ok": true, "i": i, "blob": "x".repeat(blob_bytes)}))
            }
        })
}
