//! W8, the web UI's list of runs with many runs in the store (issue 19): 10,000 runs, every
//! third one left running (half of those waiting on the approval of a 64 KiB plan, half on an
//! agent no worker serves), the rest finished, and then `GET /api/runs?limit=50` on a coordinator that ran none
//! of them, as the list page asks for it: the first page, a page from the middle of the list
//! (by cursor), the running runs, one workflow's runs, the succeeded runs.
//!
//! Each query is asked `20 x --reps` times in a row. Its line gives the first answer's time (the
//! first time the coordinator shows the page, it loads the page's running runs from the store),
//! the median and the 90th percentile of all, and the coordinator's CPU per answer. Not in the
//! default set: the runs are made once, not per repetition, and making them takes a while.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use baton_proto::v1::{GetRunRequest, ListRunsRequest};
use serde_json::{Value, json};

use super::cluster::{Cluster, WebCoordinator, cpu_time};
use super::redis_server::{self, Topology};
use super::runs::{scaled, submit};

/// Runs of each workflow: finished, waiting on an approval, waiting on an unserved agent.
const DONE: &str = r#"{"id": "bench-list-done", "steps": [
    {"id": "work", "type": "agent", "agent": "noop"}]}"#;
/// A plan of 64 KiB (`blob64k`, scaled), then its approval.
const APPROVAL: &str = r#"{"id": "bench-list-approval", "steps": [
    {"id": "plan", "type": "agent", "agent": "blob64k", "next": "approve-plan"},
    {"id": "approve-plan", "type": "approval", "message": "Approve the plan?"}]}"#;
const UNSERVED: &str = r#"{"id": "bench-list-unserved", "steps": [
    {"id": "work", "type": "agent", "agent": "nobody-serves-this"}]}"#;

/// Submits in flight at once while the runs are made.
const SUBMITTERS: usize = 32;
/// Answers timed per query and repetition.
const SAMPLES_PER_REP: usize = 20;
/// How long the finished runs may take to finish.
const SETTLE_DEADLINE: Duration = Duration::from_secs(300);

pub async fn measure(cluster: &Cluster, reps: usize, scale: f64) -> anyhow::Result<Value> {
    let redis = Topology::discover(&cluster.redis_url).await?;
    redis_server::flush(&redis).await?;
    let runs = scaled(10_000, scale);
    let started = Instant::now();
    let running = make_runs(cluster, runs).await?;
    eprintln!(
        "W8: {runs} runs made, {running} running, in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let web = cluster.start_web_coordinator().await?;
    let page = Page::new(&web, cluster.security.token.clone());
    let middle = cursor_after(cluster, runs / 2).await?;
    let queries = [
        ("first", "/api/runs?limit=50".to_owned()),
        ("deep", format!("/api/runs?limit=50&cursor={middle}")),
        ("running", "/api/runs?limit=50&status=running".to_owned()),
        (
            "workflow",
            "/api/runs?limit=50&workflow=bench-list-approval".to_owned(),
        ),
        (
            "succeeded",
            "/api/runs?limit=50&status=succeeded".to_owned(),
        ),
    ];
    let samples = SAMPLES_PER_REP * reps.max(1);
    let mut pages = serde_json::Map::new();
    for (name, path) in queries {
        pages.insert(name.to_owned(), page.time(&path, samples, web.pid).await?);
    }
    Ok(json!({
        "workload": "W8",
        "runs": runs,
        "running": running,
        "samples": samples,
        "pages": pages,
    }))
}

/// Submits `runs` runs, every third one of a workflow that waits, and waits until the others
/// have finished and every approval is asked for; how many wait.
async fn make_runs(cluster: &Cluster, runs: usize) -> anyhow::Result<usize> {
    // What a feature request with some context weighs: the runs' records are not empty.
    let input = json!({"feature": "dark mode", "notes": "lorem ipsum ".repeat(340)});
    let next = Arc::new(AtomicUsize::new(0));
    let mut submitters = tokio::task::JoinSet::new();
    for _ in 0..SUBMITTERS {
        let (mut client, next, input) = (cluster.client().await?, next.clone(), input.clone());
        submitters.spawn(async move {
            let mut approvals = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= runs {
                    return anyhow::Ok(approvals);
                }
                let workflow = match (n % 3, (n / 3) % 2) {
                    (2, 0) => APPROVAL,
                    (2, _) => UNSERVED,
                    _ => DONE,
                };
                let run_id = submit(&mut client, workflow.as_bytes().to_vec(), &input).await?;
                if workflow == APPROVAL {
                    approvals.push(run_id);
                }
            }
        });
    }
    let mut approvals = Vec::new();
    while let Some(submitted) = submitters.join_next().await {
        approvals.extend(submitted??);
    }
    let waiting = runs / 3;
    let deadline = Instant::now() + SETTLE_DEADLINE;
    loop {
        let running = count_running(cluster).await?;
        if running == waiting {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{running} runs still running after {SETTLE_DEADLINE:?}; {waiting} should be"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut client = cluster.client().await?;
    for run_id in approvals {
        loop {
            let record = client
                .get_run(GetRunRequest {
                    run_id: run_id.clone(),
                })
                .await?
                .into_inner();
            if record.waiting.iter().any(|wait| wait.kind == "approval") {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "run {run_id} does not wait for its approval after {SETTLE_DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(waiting)
}

/// How many runs are running, by the gRPC list (which reads no run records).
async fn count_running(cluster: &Cluster) -> anyhow::Result<usize> {
    let mut client = cluster.client().await?;
    let (mut count, mut page_token) = (0, String::new());
    loop {
        let page = client
            .list_runs(ListRunsRequest {
                limit: 1_000,
                status: "running".into(),
                workflow_id: String::new(),
                page_token,
            })
            .await?
            .into_inner();
        count += page.runs.len();
        if page.next_page_token.is_empty() {
            return Ok(count);
        }
        page_token = page.next_page_token;
    }
}

/// The page token after the newest `skip` runs, by the gRPC list (so that the web coordinator
/// has not shown those runs before it is timed).
async fn cursor_after(cluster: &Cluster, skip: usize) -> anyhow::Result<String> {
    let mut client = cluster.client().await?;
    let (mut left, mut page_token) = (skip, String::new());
    while left > 0 {
        let page = client
            .list_runs(ListRunsRequest {
                limit: left.min(1_000) as u32,
                status: String::new(),
                workflow_id: String::new(),
                page_token,
            })
            .await?
            .into_inner();
        left -= page.runs.len();
        anyhow::ensure!(!page.next_page_token.is_empty(), "the list ended early");
        page_token = page.next_page_token;
    }
    Ok(page_token)
}

/// `GET`s on the web coordinator's API, as the list page sends them.
struct Page {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Page {
    fn new(web: &WebCoordinator, token: Option<String>) -> Page {
        Page {
            http: reqwest::Client::new(),
            base: web.http_url.clone(),
            token,
        }
    }

    async fn get(&self, path: &str) -> anyhow::Result<axum::body::Bytes> {
        let mut request = self.http.get(format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await?;
        let status = response.status();
        let body = response.bytes().await?;
        anyhow::ensure!(
            status.is_success(),
            "GET {path}: {status}: {}",
            String::from_utf8_lossy(&body)
        );
        Ok(body)
    }

    /// Asks for `path` `samples` times; its figures.
    async fn time(&self, path: &str, samples: usize, pid: Option<u32>) -> anyhow::Result<Value> {
        let cpu_before = cpu_time(pid);
        let mut times = Vec::with_capacity(samples);
        let mut first_answer = None;
        for _ in 0..samples {
            let start = Instant::now();
            let body = self.get(path).await?;
            times.push(start.elapsed());
            first_answer.get_or_insert(body);
        }
        let cpu = cpu_time(pid)
            .zip(cpu_before)
            .map_or(Duration::ZERO, |(after, before)| after - before);
        let answer: Value = serde_json::from_slice(&first_answer.unwrap_or_default())
            .with_context(|| format!("GET {path}: not JSON"))?;
        let rows = answer["runs"].as_array().map_or(0, Vec::len);
        // What the list shows of a running run is what it waits for: a page without it
        // measured less than the page does.
        let running = answer["runs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|row| row["status"] == "running");
        for row in running {
            anyhow::ensure!(
                row["waiting"]
                    .as_array()
                    .is_some_and(|waits| !waits.is_empty()),
                "GET {path}: a running run without what it waits for: {row}"
            );
        }
        let first = times[0];
        times.sort();
        let ms = |time: Duration| (time.as_secs_f64() * 1e5).round() / 1e2;
        let at = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize];
        Ok(json!({
            "rows": rows,
            "first_ms": ms(first),
            "median_ms": ms(at(0.5)),
            "p90_ms": ms(at(0.9)),
            "cpu_ms": ms(cpu / samples as u32),
        }))
    }
}
