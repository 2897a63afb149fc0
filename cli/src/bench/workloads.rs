//! The workloads, how each is timed, and the line printed for it (W5's are in `streaming`).

use std::str::FromStr;
use std::time::{Duration, Instant};

use baton_proto::v1::{GetStatsRequest, run_event};
use serde_json::{Value, json};

use super::cluster::Cluster;
use super::redis_server;
use super::runs::{scaled, submit, succeeded, watch};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    W1,
    W2,
    W3,
    W4,
    W5,
    W6,
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
            other => Err(format!(
                "unknown workload {other:?}; expected W1, W2, W3, W4, W5 or W6"
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
/// transform (the whole chain settles within the submit).
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
            let runs = scaled(200, scale);
            let workflow = chain(3, "noop");
            let start = Instant::now();
            let handles: Vec<_> = (0..runs)
                .map(|_| {
                    let (mut client, workflow) = (client.clone(), workflow.clone());
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
        Workload::W5 => unreachable!("W5 is measured by streaming::measure"),
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
    let mut client = cluster.client().await?;
    let mut times = Vec::new();
    let mut gaps = Vec::new();
    let mut memory_growth = Vec::new();
    let mut bytes = Vec::new();
    let mut steps = 0;
    let stats_before = client.get_stats(GetStatsRequest {}).await?.into_inner();
    for _ in 0..reps {
        redis_server::flush(&cluster.redis_url).await?;
        let memory_before = redis_server::used_memory(&cluster.redis_url).await?;
        let bytes_before = client
            .get_stats(GetStatsRequest {})
            .await?
            .into_inner()
            .bytes_to_workers;
        let (time, run_gaps, run_steps) = once(workload, cluster, scale).await?;
        let memory_after = redis_server::used_memory(&cluster.redis_url).await?;
        let bytes_after = client
            .get_stats(GetStatsRequest {})
            .await?
            .into_inner()
            .bytes_to_workers;
        times.push(time.as_secs_f64());
        gaps.extend(run_gaps);
        memory_growth.push(memory_after.saturating_sub(memory_before) as f64 / 1e6);
        bytes.push(bytes_after - bytes_before);
        steps = run_steps;
    }
    let stats_after = client.get_stats(GetStatsRequest {}).await?.into_inner();
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
    Ok(json!({
        "workload": format!("{workload:?}"),
        "median_s": round(median, 4),
        "min_s": round(times[0], 4),
        "max_s": round(times[times.len() - 1], 4),
        "steps_per_s": round(steps as f64 / median, 1),
        "per_step_ms": round(median * 1e3 / steps as f64, 3),
        "p50_step_ms": round(percentile(0.50), 3),
        "p99_step_ms": round(percentile(0.99), 3),
        "redis_used_memory_mb": round(memory_growth.iter().cloned().fold(0.0, f64::max), 2),
        "bytes_to_workers": bytes.iter().max().copied().unwrap_or(0),
    }))
}

/// Where the coordinator's time went during a workload, per transition, and what is left of
/// the wall time for everything else (gRPC, workers, the client, Redis's own CPU).
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
