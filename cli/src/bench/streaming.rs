//! W5, streaming: an `llm` agent asks the bench's stand-in model (`model_server`), which
//! streams tokens; they go through the worker, the coordinator it is
//! connected to and Redis, to a watcher connected to a second coordinator. Each token carries
//! the time the model sent it, so the watcher measures what a token costs on the way (the
//! model, the worker, both coordinators and the client share one machine and one clock).
//! Reported: tokens ("pieces") per second the watcher receives when the model streams as fast
//! as it can, with the CPU both coordinators spent per thousand tokens; the latency of a token
//! (p50, p99) when the model streams at a steady pace; and what the watcher missed.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use baton_proto::v1::run_event;
use serde_json::{Value, json};

use super::cluster::{Cluster, cpu_time};
use super::model_server::now_ns;
use super::runs::{scaled, submit, succeeded, watch};

/// How fast the paced runs' model streams: a fast model, well under what the path carries,
/// so that the latency measured is the path's and not a queue's.
const PACED_PER_S: u64 = 1_000;

/// What one run saw.
struct Seen {
    /// Tokens received, each with its latency.
    latencies: Vec<Duration>,
    /// From the first token sent to the last received.
    span: Duration,
    missed: u64,
}

/// One run of the `stream` agent: the model streams `pieces` tokens, `per_s` a second (0: as
/// fast as it can); the watcher on the second coordinator times each.
async fn once(cluster: &Cluster, pieces: usize, per_s: u64) -> anyhow::Result<Seen> {
    let (watch_url, _) = cluster
        .second_coordinator
        .as_ref()
        .context("W5 needs the second coordinator")?;
    let mut submitter = cluster.client().await?;
    let mut watcher = cluster.client_of(watch_url).await?;
    let workflow = json!({"id": "bench-stream", "steps": [
        {"id": "talk", "type": "agent", "agent": "stream"}
    ]});
    let input = json!({"pieces": pieces, "per_s": per_s});
    let run_id = submit(&mut submitter, serde_json::to_vec(&workflow)?, &input).await?;
    let mut events = watch(&mut watcher, &run_id).await?;
    let mut latencies = Vec::with_capacity(pieces);
    let mut first_sent = None;
    let mut last_received = Instant::now();
    let mut missed = 0;
    // A token the worker cut in two, joining output into messages, waits for its end.
    let mut partial = String::new();
    while let Some(event) = events.message().await? {
        match event.event {
            Some(run_event::Event::StepOutput(output)) => {
                let received = now_ns();
                last_received = Instant::now();
                partial.push_str(&output.text);
                let Some(complete) = partial.rfind(';') else {
                    continue;
                };
                for stamp in partial[..complete].split(';') {
                    let sent: u128 = stamp.parse().context("a token's time")?;
                    let ahead = Duration::from_nanos(received.saturating_sub(sent) as u64);
                    first_sent.get_or_insert_with(|| Instant::now() - ahead);
                    latencies.push(ahead);
                }
                partial.drain(..=complete);
            }
            Some(run_event::Event::OutputMissed(gap)) => {
                missed += gap.pieces;
                partial.clear();
            }
            Some(run_event::Event::RunFinished(finished)) => {
                succeeded(&run_id, finished)?;
                anyhow::ensure!(
                    !latencies.is_empty(),
                    "the watcher saw none of the {pieces} tokens"
                );
                break;
            }
            _ => {}
        }
    }
    let span = first_sent.map_or(Duration::ZERO, |first| last_received - first);
    Ok(Seen {
        latencies,
        span,
        missed,
    })
}

/// Runs W5 and returns its JSON line: `reps` runs of 20,000 tokens as fast as the model can
/// (tokens per second, CPU per thousand), then `reps` runs of 2,000 tokens at
/// [`PACED_PER_S`] (latency per token). Latency under saturation would measure the queue.
pub async fn measure(cluster: &Cluster, reps: usize, scale: f64) -> anyhow::Result<Value> {
    let pieces = scaled(20_000, scale);
    let paced = scaled(2_000, scale);
    let second_pid = cluster
        .second_coordinator
        .as_ref()
        .and_then(|(_, pid)| *pid);
    let first_pid = cluster.coordinators[0].1;
    let cpu_before = (cpu_time(first_pid), cpu_time(second_pid));
    let mut rates = Vec::new();
    let mut received = 0usize;
    let mut missed = 0u64;
    for _ in 0..reps {
        let seen = once(cluster, pieces, 0).await?;
        received += seen.latencies.len();
        missed += seen.missed;
        if !seen.span.is_zero() {
            rates.push(seen.latencies.len() as f64 / seen.span.as_secs_f64());
        }
    }
    let cpu_after = (cpu_time(first_pid), cpu_time(second_pid));
    let per_thousand = |before: Option<Duration>, after: Option<Duration>| {
        let spent = after?.checked_sub(before?)?;
        Some((spent.as_secs_f64() * 1e3 / (received.max(1) as f64 / 1e3) * 100.0).round() / 100.0)
    };
    let cpu_per_thousand = (
        per_thousand(cpu_before.0, cpu_after.0),
        per_thousand(cpu_before.1, cpu_after.1),
    );
    let mut latencies = Vec::new();
    for _ in 0..reps {
        let seen = once(cluster, paced, PACED_PER_S).await?;
        received += seen.latencies.len();
        missed += seen.missed;
        latencies.extend(seen.latencies);
    }
    latencies.sort();
    rates.sort_by(f64::total_cmp);
    let percentile = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let index = ((latencies.len() as f64 - 1.0) * p).round() as usize;
        (latencies[index].as_secs_f64() * 1e3 * 1000.0).round() / 1000.0
    };
    let median_rate = rates.get(rates.len() / 2).copied().unwrap_or(0.0);
    Ok(json!({
        "workload": "W5",
        "pieces_streamed": (pieces + paced) * reps,
        "pieces_received": received,
        "pieces_missed": missed,
        "pieces_per_s": median_rate.round(),
        "p50_piece_latency_ms": percentile(0.50),
        "p99_piece_latency_ms": percentile(0.99),
        "worker_coordinator_cpu_ms_per_1000_pieces": cpu_per_thousand.0,
        "watcher_coordinator_cpu_ms_per_1000_pieces": cpu_per_thousand.1,
    }))
}
