//! The workloads, how each is timed, and the line printed for it (W5's are in `streaming`).
//!
//! W7 is the map workload issue 17 asks for under the name W5 (taken by streaming by then):
//! one `map` step of 10,000 items run by `noop`, at most 256 in flight. Its line carries `items`
//! and `items_per_s` besides the usual fields, with `steps` = items; `items_succeeded` counts
//! the items the final record's map data says were fulfilled (the run fails otherwise). A map
//! tells watchers `MapProgress` (about 200 events per map), not one event per item, so W7's
//! `p50_step_ms`/`p99_step_ms` are over items: each stretch between progress events (the first
//! from the submit, the last to the map's StepFinished) divided by the items it settled, once
//! per item. With 256 items in flight that is the spread of the map's pace over its course, not
//! one item's latency. Items settled before the watch opens arrive as one catch-up event: one
//! stretch.

use std::str::FromStr;
use std::time::{Duration, Instant};

use baton_proto::v1::run_event;
use serde_json::{Value, json};

use super::cluster::{Cluster, cpu_time};
use super::redis_server::{self, Topology};
use super::runs::{scaled, submit, succeeded, watch};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    W1,
    W2,
    W3,
    W4,
    W5,
    W6,
    /// The map workload (issue 17's "W5").
    W7,
    /// The web UI's list of runs with 10,000 runs (issue 19); not in the default set.
    W8,
}

impl FromStr for Workload {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        match name.trim().to_ascii_uppercase().as_str() {
            "W1" => Ok(Workload::W1),
            "W2" => Ok(Workload::W2),
            "W3" => Ok(Workload::W3),
            "W4" => Ok(Workload::W4),
            "W5" => Ok(Workload::W5),
            "W6" => Ok(Workload::W6),
            "W7" => Ok(Workload::W7),
            "W8" => Ok(Workload::W8),
            other => Err(format!(
                "unknown workload {other:?}; expected W1, W2, W3, W4, W5, W6, W7 or W8"
            )),
        }
    }
}

fn chain(steps: usize, agent: &str) -> String {
    let steps: Vec<Value> = (0..steps)
        .map(|i| json!({"id": format!("s{i}"), "type": "agent", "agent": agent}))
        .collect();
    json!({"id": "bench-chain", "max_visits": 1, "steps": steps}).to_string()
}

/// `steps` `jq:` transforms in a row, each reshaping the one before: what a budget costs per
/// transform (the chain settles in turns of the run's computation, each going on while it has
/// used under 20 ms of CPU).
fn jq_chain(steps: usize) -> String {
    let steps: Vec<Value> = (0..steps)
        .map(|i| {
            let previous = if i == 0 { "input".to_owned() } else { format!("context.s{}", i - 1) };
            json!({"id": format!("s{i}"), "type": "transform",
                   "transform": format!("jq: {{n: ((.{previous}.n // 0) + 1), files: [range(8) | \"f\\(.).rs\"]}}")})
        })
        .collect();
    json!({"id": "bench-jq-chain", "max_visits": 1, "steps": steps}).to_string()
}

fn fan_out(branches: usize) -> String {
    let branches: Vec<Value> = (0..branches)
        .map(|i| json!({"id": format!("b{i}"), "type": "agent", "agent": "noop"}))
        .collect();
    json!({"id": "bench-fan-out", "steps": [
        {"id": "fan", "type": "parallel", "steps": branches},
        {"id": "gather", "type": "agent", "agent": "noop", "input": "fan"}
    ]})
    .to_string()
}

/// One map step of `items` `noop` items from the run's input, at most 256 in flight (never
/// more than there are items); `tolerated_failures: 0`, so one failed item fails the run.
fn map(items: usize) -> String {
    json!({"id": "bench-map", "steps": [
        {"id": "each", "type": "map", "items": "input.items", "agent": "noop",
         "max_concurrency": items.min(256), "tolerated_failures": 0}
    ]})
    .to_string()
}

/// One run of [`map`]: submit, watch to the end. Returns its duration, the time per item of
/// each stretch between `MapProgress` events (the stretch's time over the items it settled,
/// once per item) and how many items the final record's map data says were fulfilled (all of
/// them, or this fails).
async fn one_map_run(
    client: &mut crate::client::Client,
    items: usize,
) -> anyhow::Result<(Duration, Vec<Duration>, usize)> {
    let input = json!({"items": (0..items).collect::<Vec<_>>()});
    let start = Instant::now();
    let run_id = submit(client, map(items).into_bytes(), &input).await?;
    let mut events = watch(client, &run_id).await?;
    let mut gaps = Vec::with_capacity(items);
    // When the last stretch began, and how many items had settled by then.
    let (mut last, mut settled) = (start, 0u64);
    let mut per_item = |now: Instant, upto: u64, gaps: &mut Vec<Duration>| {
        if upto > settled {
            let delta = upto - settled;
            let each = (now - last) / delta as u32;
            gaps.extend(std::iter::repeat_n(each, delta as usize));
            settled = upto;
        }
        last = now;
    };
    while let Some(event) = events.message().await? {
        match event.event {
            Some(run_event::Event::MapProgress(progress)) => {
                per_item(
                    Instant::now(),
                    progress.succeeded + progress.failed,
                    &mut gaps,
                );
            }
            Some(run_event::Event::StepFinished(_)) => {
                per_item(Instant::now(), items as u64, &mut gaps);
            }
            Some(run_event::Event::RunFinished(finished)) => {
                let elapsed = start.elapsed();
                let context = finished
                    .record
                    .as_ref()
                    .and_then(|record| record.context.as_ref())
                    .map(|context| {
                        anyhow::Ok(serde_json::from_slice::<Value>(context.verified()?)?)
                    })
                    .transpose()?
                    .unwrap_or(Value::Null);
                succeeded(&run_id, finished)?;
                let data = context["each"]["data"].as_array().map(Vec::as_slice);
                let ok = data
                    .unwrap_or_default()
                    .iter()
                    .filter(|item| item["status"] == "fulfilled")
                    .count();
                anyhow::ensure!(
                    context["each"]["success"] == true && ok == items,
                    "run {run_id}: {ok} of {items} items fulfilled"
                );
                return Ok((elapsed, gaps, ok));
            }
            _ => {}
        }
    }
    anyhow::bail!("the watch of run {run_id} ended early")
}

/// One run: submit, watch to the end. Returns its duration, the gaps between its steps' results
/// as the client saw them, and the number of agent steps.
async fn one_run(
    client: &mut crate::client::Client,
    workflow: &str,
    input: &Value,
) -> anyhow::Result<(Duration, Vec<Duration>)> {
    let start = Instant::now();
    let run_id = submit(client, workflow.as_bytes().to_vec(), input).await?;
    let mut events = watch(client, &run_id).await?;
    let mut gaps = Vec::new();
    let mut last = start;
    while let Some(event) = events.message().await? {
        match event.event {
            Some(run_event::Event::StepFinished(_)) => {
                let now = Instant::now();
                gaps.push(now - last);
                last = now;
            }
            Some(run_event::Event::RunFinished(finished)) => {
                let elapsed = start.elapsed();
                succeeded(&run_id, finished)?;
                return Ok((elapsed, gaps));
            }
            _ => {}
        }
    }
    anyhow::bail!("the watch of run {run_id} ended early")
}

/// Runs the workload once; returns wall time, step gaps and how many agent steps ran.
async fn once(
    workload: Workload,
    cluster: &Cluster,
    scale: f64,
) -> anyhow::Result<(Duration, Vec<Duration>, usize)> {
    let mut client = cluster.client().await?;
    match workload {
        Workload::W1 => {
            let steps = scaled(200, scale);
            let (time, gaps) = one_run(&mut client, &chain(steps, "noop"), &json!("W1")).await?;
            Ok((time, gaps, steps))
        }
        Workload::W2 => {
            let branches = scaled(500, scale);
            let (time, gaps) = one_run(&mut client, &fan_out(branches), &json!("W2")).await?;
            Ok((time, gaps, branches + 1))
        }
        Workload::W3 => {
            // Submitted round-robin to the coordinators, each run watched where it was
            // submitted.
            let clients = cluster.clients().await?;
            let runs = scaled(200, scale);
            let workflow = chain(3, "noop");
            let start = Instant::now();
            let handles: Vec<_> = (0..runs)
                .map(|n| {
                    let (mut client, workflow) =
                        (clients[n % clients.len()].clone(), workflow.clone());
                    tokio::spawn(async move { one_run(&mut client, &workflow, &json!("W3")).await })
                })
                .collect();
            let mut gaps = Vec::new();
            for handle in handles {
                gaps.extend(handle.await??.1);
            }
            Ok((start.elapsed(), gaps, runs * 3))
        }
        Workload::W4 => {
            let steps = scaled(200, scale);
            let input = json!({"workload": "W4"});
            let (time, gaps) = one_run(&mut client, &chain(steps, "blob64k"), &input).await?;
            Ok((time, gaps, steps))
        }
        Workload::W6 => {
            let steps = scaled(200, scale);
            let (time, gaps) = one_run(&mut client, &jq_chain(steps), &json!({"n": 0})).await?;
            Ok((time, gaps, steps))
        }
        Workload::W7 => {
            let items = scaled(10_000, scale);
            let (time, gaps, ok) = one_map_run(&mut client, items).await?;
            Ok((time, gaps, ok))
        }
        Workload::W5 => unreachable!("W5 is measured by streaming::measure"),
        Workload::W8 => unreachable!("W8 is measured by runs_list::measure"),
    }
}

pub async fn warm_up(client: &mut crate::client::Client, cluster: &Cluster) -> anyhow::Result<()> {
    let _ = client;
    once(Workload::W1, cluster, 0.1).await?;
    once(Workload::W3, cluster, 0.1).await?;
    Ok(())
}

/// Runs a workload `reps` times and returns its JSON line.
pub async fn measure(
    workload: Workload,
    cluster: &Cluster,
    reps: usize,
    scale: f64,
) -> anyhow::Result<Value> {
    if workload == Workload::W5 {
        return super::streaming::measure(cluster, reps, scale).await;
    }
    if workload == Workload::W8 {
        return super::runs_list::measure(cluster, reps, scale).await;
    }
    let mut times = Vec::new();
    let mut gaps = Vec::new();
    let mut memory_growth = Vec::new();
    let mut bytes = Vec::new();
    let mut steps = 0;
    // What each rep cost per step: the coordinators' and the workers' CPU, and Redis's work.
    let mut capacity = Capacity::default();
    let stats_before = cluster.stats().await?;
    for rep in 1..=reps {
        // Asked again each rep: an existing cluster's masters may have changed.
        let redis = Topology::discover(&cluster.redis_url).await?;
        if redis.cluster {
            // Idle, each coordinator sweeps a few dozen commands a second.
            let idle = 200 * cluster.coordinators.len() as u64;
            redis_server::wait_quiet(&redis, idle, Duration::from_secs(30)).await?;
        }
        redis_server::flush(&redis).await?;
        let memory_before = redis_server::used_memory(&redis).await?;
        let bytes_before = cluster.stats().await?.bytes_to_workers;
        let cpu_before = Cpu::of(cluster);
        let redis_before = redis_server::work(&redis).await?;
        let (time, run_gaps, run_steps) = once(workload, cluster, scale).await?;
        let redis_after = redis_server::work(&redis).await?;
        capacity.add(
            Cpu::of(cluster).since(cpu_before),
            redis_after.since(redis_before),
            run_steps,
        );
        let memory_after = redis_server::used_memory(&redis).await?;
        let bytes_after = cluster.stats().await?.bytes_to_workers;
        eprintln!("{workload:?} repetition {rep}: {:.4} s", time.as_secs_f64());
        times.push(time.as_secs_f64());
        gaps.extend(run_gaps);
        memory_growth.push(memory_after.saturating_sub(memory_before) as f64 / 1e6);
        bytes.push(bytes_after - bytes_before);
        steps = run_steps;
    }
    let stats_after = cluster.stats().await?;
    let total_s: f64 = times.iter().sum();
    eprintln!(
        "{}",
        profile(workload, &stats_before, &stats_after, total_s)
    );
    times.sort_by(f64::total_cmp);
    gaps.sort();
    let median = times[times.len() / 2];
    let percentile = |p: f64| -> f64 {
        if gaps.is_empty() {
            return 0.0;
        }
        let index = ((gaps.len() as f64 - 1.0) * p).round() as usize;
        gaps[index].as_secs_f64() * 1e3
    };
    let round = |x: f64, digits: i32| (x * 10f64.powi(digits)).round() / 10f64.powi(digits);
    let mut line = json!({
        "workload": format!("{workload:?}"),
        "median_s": round(median, 4),
        "min_s": round(times[0], 4),
        "max_s": round(times[times.len() - 1], 4),
        // The spread between repetitions: the slowest against the median (a stall shows here).
        "max_over_median": round(times[times.len() - 1] / median, 3),
        "steps_per_s": round(steps as f64 / median, 1),
        "per_step_ms": round(median * 1e3 / steps as f64, 3),
        "p50_step_ms": round(percentile(0.50), 3),
        "p99_step_ms": round(percentile(0.99), 3),
        "redis_used_memory_mb": round(memory_growth.iter().cloned().fold(0.0, f64::max), 2),
        "bytes_to_workers": bytes.iter().max().copied().unwrap_or(0),
    });
    capacity.describe(&mut line);
    if workload == Workload::W7 {
        // `steps` is the items that succeeded, in every rep (`one_map_run` fails otherwise).
        line["items"] = json!(scaled(10_000, scale));
        line["items_succeeded"] = json!(steps);
        line["items_per_s"] = json!(round(steps as f64 / median, 1));
    }
    Ok(line)
}

/// CPU time the bench's processes have used so far, in seconds (0 where `/proc` is not).
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    coordinator_s: f64,
    workers_s: f64,
}

impl Cpu {
    /// The coordinators' CPU is summed over every coordinator the workers are connected to
    /// (`--coordinators`), not W5's watcher's.
    fn of(cluster: &Cluster) -> Cpu {
        let seconds = |pid: Option<u32>| cpu_time(pid).map_or(0.0, |cpu| cpu.as_secs_f64());
        Cpu {
            coordinator_s: cluster
                .coordinators
                .iter()
                .map(|&(_, pid)| seconds(pid))
                .sum(),
            workers_s: cluster
                .worker_pids
                .iter()
                .map(|&pid| seconds(Some(pid)))
                .sum(),
        }
    }

    fn since(self, before: Cpu) -> Cpu {
        Cpu {
            coordinator_s: (self.coordinator_s - before.coordinator_s).max(0.0),
            workers_s: (self.workers_s - before.workers_s).max(0.0),
        }
    }
}

/// What a workload's steps cost, summed over its reps: the capacity model's inputs (issue 18).
/// `redis` is the masters' work, summed over them, with the replicas' apart.
#[derive(Debug, Default)]
struct Capacity {
    cpu: Cpu,
    redis: redis_server::Work,
    steps: usize,
}

impl Capacity {
    fn add(&mut self, cpu: Cpu, redis: redis_server::Work, steps: usize) {
        self.cpu.coordinator_s += cpu.coordinator_s;
        self.cpu.workers_s += cpu.workers_s;
        self.redis.add(redis);
        self.steps += steps;
    }

    /// Adds the per-step figures to a workload's line. `/proc` counts CPU in hundredths of a
    /// second, so a short workload's CPU figures are coarse.
    fn describe(&self, line: &mut Value) {
        let steps = self.steps.max(1) as f64;
        let round = |x: f64| (x * 1e3).round() / 1e3;
        line["coordinator_cpu_ms_per_step"] = json!(round(self.cpu.coordinator_s * 1e3 / steps));
        line["workers_cpu_ms_per_step"] = json!(round(self.cpu.workers_s * 1e3 / steps));
        line["redis_cpu_ms_per_step"] = json!(round(self.redis.cpu_s * 1e3 / steps));
        line["redis_commands_per_step"] = json!(round(self.redis.commands as f64 / steps));
        line["redis_bytes_per_step"] = json!(round(self.redis.net_bytes as f64 / steps));
        // Not part of the masters' figures above: what replication costs on top.
        line["redis_replication_bytes_per_step"] =
            json!(round(self.redis.replication_bytes as f64 / steps));
        line["redis_replica_cpu_ms_per_step"] =
            json!(round(self.redis.replica_cpu_s * 1e3 / steps));
    }
}

/// Where the coordinators' time went during a workload, per transition (their counters summed
/// over the coordinators), and what is left of the wall time for everything else (gRPC,
/// workers, the client, Redis's own CPU).
fn profile(
    workload: Workload,
    before: &baton_proto::v1::Stats,
    after: &baton_proto::v1::Stats,
    total_s: f64,
) -> String {
    let transitions = (after.transitions - before.transitions).max(1);
    let per = |a: u64, b: u64| (a - b) as f64 / transitions as f64;
    let (engine, plan, store, act) = (
        per(after.engine_us, before.engine_us),
        per(after.plan_us, before.plan_us),
        per(after.store_us, before.store_us),
        per(after.act_us, before.act_us),
    );
    let wall = total_s * 1e6 / transitions as f64;
    format!(
        "profile {workload:?}: {transitions} transitions; per transition: engine {engine:.1} us, \
         store write planning {plan:.1} us, store round trip {store:.1} us, dispatch and \
         payloads {act:.1} us; wall time per transition {wall:.1} us (the rest is gRPC, \
         workers, the client and contention)"
    )
}
