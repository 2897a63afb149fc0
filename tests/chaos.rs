//! The chaos test: 100 runs of the feature-development workflow with `command` agents, on two
//! coordinators and three workers, while the test kills a random worker every two seconds (and
//! starts a new one) and kills each coordinator once (and starts it again). Twice:
//! - [`chaos`]: on one Redis with an append-only file, restarted once;
//! - [`chaos_on_a_redis_cluster`]: on a Redis Cluster of 3 masters and 3 replicas with
//!   `--redis-wait-replicas 1`, where one master is killed (its replica takes over) and later
//!   comes back as a replica.
//!
//! Every run must succeed with the spec's final context, and each step's result must be recorded
//! exactly once per visit. Agents run at least once: the test prints how many executions were
//! repeated.

#[path = "support/executions.rs"]
mod executions;
#[path = "support/fleet.rs"]
mod fleet;
#[path = "support/cluster.rs"]
mod harness;
#[path = "support/spec.rs"]
mod spec;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_proto::Json;
use baton_proto::v1::{
    DecideApprovalRequest, GetRunRequest, RunRecord, SubmitRunRequest, VerifyRunRequest,
};
use fleet::{Fleet, Timing};
use harness::Records;
use harness::redis_cluster::RedisCluster;
use redis::AsyncCommands;
use serde_json::{Value, json};

const RUNS: usize = 100;
const WORKERS: usize = 3;
const CONCURRENCY: usize = 4;
/// The whole test must be over by then.
const BUDGET: Duration = Duration::from_secs(150);
const TIMING: Timing = Timing {
    lease_ms: 2_000,
    worker_silence_ms: 3_000,
};

/// What happens when, counted from the first submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blow {
    KillCoordinator(usize),
    StartCoordinator(usize),
    RestartRedis,
    /// SIGKILL the master that holds the first run: its replica takes over.
    KillMaster,
    /// Start the killed master again: it comes back as a replica of the one that took over.
    StartKilledMaster,
}

const SCHEDULE: [(Duration, Blow); 5] = [
    (Duration::from_secs(3), Blow::KillCoordinator(0)),
    (Duration::from_secs(4), Blow::StartCoordinator(0)),
    (Duration::from_secs(6), Blow::RestartRedis),
    (Duration::from_secs(9), Blow::KillCoordinator(1)),
    (Duration::from_secs(10), Blow::StartCoordinator(1)),
];

const CLUSTER_SCHEDULE: [(Duration, Blow); 6] = [
    (Duration::from_secs(3), Blow::KillCoordinator(0)),
    (Duration::from_secs(4), Blow::StartCoordinator(0)),
    (Duration::from_secs(5), Blow::KillMaster),
    (Duration::from_secs(8), Blow::StartKilledMaster),
    (Duration::from_secs(10), Blow::KillCoordinator(1)),
    (Duration::from_secs(11), Blow::StartCoordinator(1)),
];

fn agents(records: &Records, worker: &str) -> std::path::PathBuf {
    let agents = [
        "planner",
        "coder",
        "test-unit",
        "test-integration",
        "reviewer",
    ]
    .map(|agent| (agent, vec!["chaos-agent.sh", agent]));
    records.agents_file(worker, &agents)
}

/// Tries each coordinator, starting with `first`, until one answers `call`.
macro_rules! on_any {
    ($fleet:expr, $first:expr, |$client:ident| $call:expr) => {{
        let mut answer = None;
        for k in 0..2 {
            let n = ($first + k) % 2;
            if let Some(mut $client) = $fleet.client(n).await {
                match $call.await {
                    Ok(response) => {
                        answer = Some(response.into_inner());
                        break;
                    }
                    Err(status) => answer_error(&status),
                }
            }
        }
        answer
    }};
}

/// Errors a client sees while coordinators and Redis come and go; anything else is a failure.
fn answer_error(status: &tonic::Status) {
    use tonic::Code::*;
    match status.code() {
        Unavailable | Unknown | Cancelled | Aborted | DeadlineExceeded | FailedPrecondition => {}
        _ => panic!("unexpected error: {status:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos() {
    let fleet = Fleet::start(2, TIMING).await;
    chaos_on(fleet, &SCHEDULE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_on_a_redis_cluster() {
    let cluster = Arc::new(
        tokio::task::spawn_blocking(RedisCluster::start)
            .await
            .expect("start a Redis Cluster"),
    );
    let fleet = Fleet::start_on_cluster(cluster, 2, TIMING, &["--redis-wait-replicas", "1"]).await;
    chaos_on(fleet, &CLUSTER_SCHEDULE).await;
}

async fn chaos_on(mut fleet: Fleet, schedule: &[(Duration, Blow)]) {
    let started = Instant::now();
    let records = Records::new(fleet.dir().join("records"));
    let mut next_worker = 0;
    let mut start_worker = |fleet: &mut Fleet| {
        next_worker += 1;
        let id = format!("w{next_worker}");
        let file = agents(&records, &id);
        fleet.start_worker(&id, &file, CONCURRENCY);
    };
    for _ in 0..WORKERS {
        start_worker(&mut fleet);
    }
    fleet.wait_for_workers(WORKERS as u32).await;

    let workflow =
        std::fs::read(harness::root().join("examples/feature-development/workflow.json"))
            .expect("the feature-development example");
    let input = Json::new(serde_json::to_vec(&json!(spec::INPUT)).unwrap());
    let begun = Instant::now();
    let mut runs: Vec<String> = Vec::new();
    for n in 0..RUNS {
        let submitted = loop {
            // A retry with the same key gets the same run: nothing is started twice.
            let request = SubmitRunRequest {
                workflow: workflow.clone(),
                input: Some(input.clone()),
                idempotency_key: format!("chaos-{n}"),
            };
            if let Some(response) = on_any!(fleet, n, |client| client.submit_run(request.clone())) {
                break response.run_id;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        runs.push(submitted);
    }

    let all_blows = schedule;
    let mut schedule = schedule.iter().peekable();
    let mut killed_master: Option<u16> = None;
    let mut last_kill = Instant::now();
    let mut killed_workers = 0;
    let mut done: BTreeMap<String, RunRecord> = BTreeMap::new();
    let mut approved: BTreeSet<String> = BTreeSet::new();
    while done.len() < RUNS {
        if started.elapsed() >= BUDGET {
            // What each unfinished run waits for: its task entries (state, owner, due time).
            let mut redis = fleet.redis_connection().await;
            let mut stuck = String::new();
            for run_id in runs.iter().filter(|run_id| !done.contains_key(*run_id)) {
                let tasks: Vec<(String, String)> = redis
                    .hgetall(format!("baton:run:{{{run_id}}}:tasks"))
                    .await
                    .unwrap_or_default();
                stuck.push_str(&format!("{run_id}: {tasks:?}\n"));
            }
            panic!(
                "{} of {RUNS} runs finished within {BUDGET:?}; not:\n{stuck}{}",
                done.len(),
                fleet.logs()
            );
        }
        if let Some((at, blow)) = schedule.peek()
            && begun.elapsed() >= *at
        {
            println!("{:>5.1} s: {blow:?}", begun.elapsed().as_secs_f64());
            match blow {
                Blow::KillCoordinator(n) => fleet.kill_coordinator(*n),
                Blow::StartCoordinator(n) => fleet.start_coordinator(*n).await,
                Blow::RestartRedis => fleet.redis().restart(),
                Blow::KillMaster => {
                    let cluster = fleet.redis_cluster().clone();
                    let key = format!("baton:run:{{{}}}", runs[0]);
                    let port = cluster.master_of_key(&key);
                    cluster.kill_node(port);
                    killed_master = Some(port);
                }
                Blow::StartKilledMaster => {
                    let cluster = fleet.redis_cluster().clone();
                    let port = killed_master.expect("a master was killed before");
                    tokio::task::spawn_blocking(move || cluster.start_node_again(port))
                        .await
                        .expect("start the killed master again");
                }
            }
            schedule.next();
        }
        if last_kill.elapsed() >= Duration::from_secs(2) {
            last_kill = Instant::now();
            let live = fleet.live_workers();
            let victim = &live[fastrand::usize(..live.len())];
            println!(
                "{:>5.1} s: kill worker {victim}",
                begun.elapsed().as_secs_f64()
            );
            fleet.kill_worker(victim);
            killed_workers += 1;
            start_worker(&mut fleet);
        }
        // All at once: a run whose shard has no replica for a while (its transitions wait for
        // one) answers slowly, and must not hold up the schedule.
        let polls = runs
            .iter()
            .enumerate()
            .filter(|(_, run_id)| !done.contains_key(*run_id))
            .map(|(n, run_id)| {
                let fleet = &fleet;
                async move {
                    let request = GetRunRequest {
                        run_id: run_id.clone(),
                    };
                    let record = on_any!(fleet, n, |client| client.get_run(request.clone()));
                    (n, run_id, record)
                }
            });
        for (n, run_id, record) in futures::future::join_all(polls).await {
            let Some(record) = record else {
                continue;
            };
            if record.status != "running" {
                done.insert(run_id.clone(), record);
                continue;
            }
            let waits_for_approval = record
                .waiting
                .iter()
                .any(|w| w.kind == "approval" && w.step_id == "approve-plan");
            if waits_for_approval && !approved.contains(run_id) {
                let decision = DecideApprovalRequest {
                    run_id: run_id.clone(),
                    step_id: "approve-plan".into(),
                    approved: true,
                    comment: String::new(),
                    approver: String::new(),
                };
                if on_any!(fleet, n, |client| client.decide_approval(decision.clone())).is_some() {
                    approved.insert(run_id.clone());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        schedule.next(),
        None,
        "the runs finished before every planned failure happened"
    );
    let schedule_done: Vec<Blow> = all_blows.iter().map(|(_, blow)| *blow).collect();

    // Every run succeeded with the spec's final context.
    for (run_id, record) in &done {
        assert_eq!(record.status, "succeeded", "{run_id}: {}", record.error);
        let context: Value =
            serde_json::from_slice(&record.context.as_ref().unwrap().json).unwrap();
        assert_eq!(
            context,
            spec::final_context(&json!({"approved": true})),
            "{run_id}"
        );
    }

    // Each step's result was recorded exactly once per visit: the event log holds one answer per
    // step visit, the results one entry each, and the state chain verifies.
    let mut redis = fleet.redis_connection().await;
    for run_id in &runs {
        let events: Vec<Vec<u8>> = redis
            .lrange(format!("baton:run:{{{run_id}}}:events"), 0, -1)
            .await
            .unwrap();
        let mut answered: BTreeMap<(String, u64), usize> = BTreeMap::new();
        for event in &events {
            let event: Value = serde_json::from_slice(event).unwrap();
            if let Some(task) = event.get("task") {
                let key = (
                    task["step_id"].as_str().unwrap().to_owned(),
                    task["visit"].as_u64().unwrap(),
                );
                *answered.entry(key).or_default() += 1;
            }
        }
        let expected: BTreeMap<(String, u64), usize> =
            ["plan", "code", "unit", "integration", "review"]
                .into_iter()
                .map(|step| ((step.to_owned(), 1), 1))
                .collect();
        assert_eq!(answered, expected, "{run_id}: {events:?}");
        assert_eq!(
            events.len(),
            7,
            "how the run started, five answers and one approval: {run_id}"
        );
        let results: Vec<String> = redis
            .hkeys(format!("baton:run:{{{run_id}}}:results"))
            .await
            .unwrap();
        assert_eq!(results.len(), 5, "{run_id}: {results:?}");
        let request = VerifyRunRequest {
            run_id: run_id.clone(),
        };
        let verified = on_any!(fleet, 0, |client| client.verify_run(request.clone()))
            .expect("a coordinator verifies");
        assert!(verified.ok, "{run_id}: {verified:?}");
    }

    let ran = executions::read(records.root());
    let visits = executions::per_visit(&ran);
    assert_eq!(visits.len(), RUNS * 5, "every agent step ran");
    let duplicated = executions::duplicated(&ran);
    let mut stats = Vec::new();
    for n in 0..2 {
        stats.push(fleet.stats(n).await.unwrap());
    }
    println!(
        "chaos: {RUNS} runs succeeded in {:.1} s; {killed_workers} workers killed, each coordinator \
         killed once, and {:?}",
        begun.elapsed().as_secs_f64(),
        schedule_done
    );
    println!(
        "chaos: {} agent executions for {} step visits: {duplicated} duplicated by at-least-once \
         delivery",
        ran.len(),
        visits.len()
    );
    println!(
        "chaos: since their last start, the coordinators redelivered {} tasks and refused {} late \
         results",
        stats.iter().map(|s| s.redeliveries).sum::<u64>(),
        stats.iter().map(|s| s.fenced_results).sum::<u64>()
    );
}
