//! `baton bench`: the seven workloads of the benchmark on a real cluster of separate processes.
//!
//! - this file: the arguments, the order of a benchmark, and the built-in agents it runs.
//! - `cluster`: the processes it runs against: Redis, the coordinators, workers.
//! - `redis_server`: the bench's own single Redis (and its replicas), which nodes are masters,
//!   what they did (commands, bytes, CPU), their memory use, and emptying them between
//!   repetitions.
//! - `redis_cluster`: `--redis-cluster`, a local Redis Cluster of 3 masters and their replicas.
//! - `workloads`: the workloads, how each is timed, and the line printed for it.
//! - `streaming`: W5, live output from a worker on one coordinator to a watcher on another.
//! - `model_server`: W5's stand-in OpenAI-compatible model, streaming tokens.
//! - `runs`: submitting a run, watching it, checking it succeeded; the sizes `--scale` shrinks.
//! - `runs_list`: W8, the web UI's list of runs with 10,000 runs in the store.
//!
//! Starts its own `redis-server` on a free loopback port (with `--redis-wait-replicas` replicas),
//! or with `--redis-cluster` its own Redis Cluster (3 masters, one replica each), unless
//! `--redis` names one (which is flushed: every master of a cluster), then `--coordinators`
//! `baton coordinator` and `--workers` `baton worker` processes of this same binary (with glibc
//! malloc's thresholds as the image sets them, unless the environment sets them), runs an
//! untimed warm-up, then each workload `--reps` times, and prints one JSON line per workload.
//! Each line says what it ran on (`redis`: `single` or `cluster`, `redis_masters`,
//! `redis_replicas`, `redis_wait_replicas`, `coordinators`, `workers`) and what a step cost:
//! the coordinators' and workers' CPU, and the Redis masters' commands, client bytes and CPU,
//! summed over the masters; replication apart (`redis_replication_bytes_per_step`,
//! `redis_replica_cpu_ms_per_step`). The clock runs from the client's SubmitRun until the
//! client holds the final run record. Agents are built in and do nothing (`{"ok": true, "i":
//! n}`), so what is measured is Baton itself.
//!
//! - W1 chain: one run of 200 sequential agent steps.
//! - W2 fan-out: a parallel step of 500 agent branches, then one agent step that gets them all.
//! - W3 throughput: 200 concurrent runs of a 3-step chain, submitted to the coordinators in
//!   turn, each watched on the coordinator it was submitted to.
//! - W4 accumulation: W1 where each step returns 64 KiB and receives every earlier result.
//! - W5 streaming: an `llm` agent streams a stand-in model's 20,000 tokens as live output; a
//!   watcher on a second coordinator reads them (tokens per second, latency per token,
//!   coordinators' CPU).
//! - W6 jq: one run of 200 `jq:` transforms in a row, each in the coordinator's budgeted
//!   sandbox (`BATON_JQ_UNBUDGETED=true` in the bench's environment runs them unbudgeted).
//! - W7 map: one `map` step of 10,000 `noop` items from the run's input, at most 256 in flight
//!   (the map workload issue 17 calls W5); its line adds `items`, `items_succeeded` and
//!   `items_per_s`.
//! - W8 runs list (only when named in `--workloads`): 10,000 runs, a third of them waiting,
//!   then the web UI's `GET /api/runs` pages timed on a coordinator that ran none of them.

mod cluster;
mod model_server;
mod ports;
mod redis_cluster;
mod redis_server;
mod runs;
mod runs_list;
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
    /// Use this Redis instead of starting one (it is flushed): one URL, or the nodes of a Redis
    /// Cluster separated by commas (or any one of them; every master is flushed).
    #[arg(long)]
    redis: Option<String>,
    /// Start a local Redis Cluster (3 masters, each with one replica, or
    /// --redis-wait-replicas if more) instead of one redis-server.
    #[arg(long, conflicts_with = "redis")]
    redis_cluster: bool,
    /// Coordinator processes on the same Redis. The workers are spread over them; W3 submits
    /// its runs to them in turn (the other workloads use the first); the coordinators' CPU per
    /// step is summed over all of them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    coordinators: u16,
    /// Every coordinator's --redis-wait-replicas: after each transition, WAIT until this many
    /// replicas have it. The bench's own single Redis gets this many replicas.
    #[arg(long, default_value_t = 0)]
    redis_wait_replicas: u32,
    /// Every coordinator's --redis-wait-timeout-ms.
    #[arg(long, default_value_t = 1_000)]
    redis_wait_timeout_ms: u64,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Timed repetitions of each workload.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Which workloads, comma-separated (W8, the runs list, only when named).
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
    if usize::from(args.coordinators) > args.workers {
        // Legal, but then W3's runs on those coordinators wait for another's sweep.
        eprintln!(
            "bench: {} coordinators but {} workers: a coordinator with no worker leaves its \
             tasks in Redis for the others' sweeps",
            args.coordinators, args.workers
        );
    }
    let cluster = cluster::Cluster::start(cluster::Options {
        redis: args.redis.as_deref(),
        redis_cluster: args.redis_cluster,
        wait_replicas: args.redis_wait_replicas,
        wait_timeout_ms: args.redis_wait_timeout_ms,
        coordinators: usize::from(args.coordinators),
        workers: args.workers,
        concurrency: args.concurrency,
        blob_bytes: runs::scaled(64 * 1024, args.scale),
        agents_file: agents_file.as_deref(),
        second_coordinator: streaming,
        secure: args.secure,
    })
    .await?;
    let topology = &cluster.topology;
    eprintln!(
        "bench: redis {} ({}, {} masters, {} replicas), coordinators {}, {} workers",
        baton_coordinator::store::redis::redacted(&cluster.redis_url),
        topology.kind(),
        topology.masters.len(),
        topology.replicas.len(),
        cluster
            .coordinators
            .iter()
            .map(|(url, _)| url.as_str())
            .collect::<Vec<_>>()
            .join(","),
        args.workers
    );
    // What every line was measured on, so that lines of several runs can be told apart.
    let backend = json!({
        "redis": topology.kind(),
        "redis_masters": topology.masters.len(),
        "redis_replicas": topology.replicas.len(),
        "redis_wait_replicas": args.redis_wait_replicas,
        "coordinators": cluster.coordinators.len(),
        "workers": args.workers,
    });
    let mut client = cluster.client().await?;
    workloads::warm_up(&mut client, &cluster).await?;
    for workload in &args.workloads {
        let mut line =
            workloads::measure(*workload, &cluster, args.reps.max(1), args.scale).await?;
        if let (Some(line), Some(backend)) = (line.as_object_mut(), backend.as_object()) {
            line.extend(backend.clone());
        }
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
