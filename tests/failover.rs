//! Coordinators and workers going away, end to end: two `baton coordinator` processes on one
//! durable Redis, `baton worker` processes that know both addresses, and command agents that log
//! every execution (`tests/agents/logged-agent.sh`).

#[path = "support/executions.rs"]
mod executions;
#[path = "support/fleet.rs"]
mod fleet;
#[path = "support/cluster.rs"]
mod harness;
#[path = "support/spec.rs"]
mod spec;

use std::time::{Duration, Instant};

use baton_proto::v1::{GetRunRequest, RunRecord};
use fleet::{Fleet, Timing};
use harness::Records;
use serde_json::{Value, json};

const TIMING: Timing = Timing {
    lease_ms: 2_000,
    worker_silence_ms: 3_000,
};

/// Two agent steps of the `slow` agent.
fn two_steps() -> Vec<u8> {
    json!({"id": "failover", "steps": [
        {"id": "first", "type": "agent", "agent": "slow", "next": "second"},
        {"id": "second", "type": "agent", "agent": "slow"}
    ]})
    .to_string()
    .into_bytes()
}

async fn submit(fleet: &Fleet, coordinator: usize) -> String {
    let mut client = fleet.client(coordinator).await.expect("a coordinator");
    harness::submit(&mut client, two_steps(), &json!("go")).await
}

/// Waits until `records` logged an execution of `step_id`.
async fn started(records: &Records, step_id: &str) -> executions::Execution {
    let deadline = Instant::now() + harness::DEADLINE;
    loop {
        if let Some(e) = executions::read(records.root())
            .into_iter()
            .find(|e| e.step_id == step_id)
        {
            return e;
        }
        assert!(Instant::now() < deadline, "{step_id} never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls coordinator `n` until the run has finished.
async fn finished(fleet: &Fleet, n: usize, run_id: &str) -> RunRecord {
    let deadline = Instant::now() + harness::DEADLINE;
    loop {
        if let Some(mut client) = fleet.client(n).await
            && let Ok(record) = client
                .get_run(GetRunRequest {
                    run_id: run_id.to_owned(),
                })
                .await
        {
            let record = record.into_inner();
            if record.status != "running" {
                return record;
            }
        }
        assert!(
            Instant::now() < deadline,
            "run {run_id} did not finish\n{}",
            fleet.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the store's entry of the run's task `key` names `worker` as running it: what a
/// lease renewal (every third of the lease) writes down. Only a task written down is taken over
/// by another coordinator: before that, nobody can tell who runs it.
async fn written_down(fleet: &Fleet, run_id: &str, key: &str, worker: &str) {
    let mut redis = fleet.redis_connection().await;
    let deadline = Instant::now() + harness::DEADLINE;
    loop {
        let entry: Option<String> = redis::cmd("HGET")
            .arg(format!("baton:run:{{{run_id}}}:tasks"))
            .arg(key)
            .query_async(&mut redis)
            .await
            .expect("HGET");
        let named = entry
            .as_deref()
            .and_then(|e| serde_json::from_str::<Value>(e).ok())
            .is_some_and(|e| e["worker_id"] == worker);
        if named {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{key} was never written down as {worker}'s: {entry:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn context(record: &RunRecord) -> Value {
    serde_json::from_slice(&record.context.as_ref().unwrap().json).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_coordinators_run_is_carried_on_by_the_other_without_running_anything_twice() {
    let mut fleet = Fleet::start(2, TIMING).await;
    let records = Records::new(fleet.dir().join("records"));
    // Its first address is coordinator-0. Its agent takes long enough for a renewal to write
    // down who runs the first step before the coordinator is killed.
    fleet.start_logged_worker(&records, "w1", "2", 2);
    fleet.wait_for_workers(1).await;
    let run_id = submit(&fleet, 0).await;
    let first = started(&records, "first").await;
    written_down(&fleet, &run_id, "first#1", "w1").await;

    // kill -9 while the agent runs. The worker reconnects to coordinator-1, still running the
    // task, and coordinator-1 takes its lease over (the store says w1 runs it): the answer is
    // accepted there.
    fleet.kill_coordinator(0);
    let record = finished(&fleet, 1, &run_id).await;
    assert_eq!(record.status, "succeeded", "{}", record.error);
    assert_eq!(context(&record), json!({"first": "done", "second": "done"}));
    let ran = executions::read(records.root());
    assert_eq!(executions::duplicated(&ran), 0, "{ran:#?}");
    assert_eq!(ran[0], first);
    // The killed coordinator comes back and serves the run too.
    fleet.start_coordinator(0).await;
    assert_eq!(finished(&fleet, 0, &run_id).await.status, "succeeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_on_a_coordinator_sends_its_workers_to_another_and_loses_nothing() {
    let mut fleet = Fleet::start(2, TIMING).await;
    let records = Records::new(fleet.dir().join("records"));
    fleet.start_logged_worker(&records, "w1", "1", 2);
    fleet.wait_for_workers(1).await;
    let run_id = submit(&fleet, 0).await;
    started(&records, "first").await;

    let stopped_at = Instant::now();
    let status = fleet.terminate_coordinator(0).await;
    assert!(status.success(), "{status}");
    // It does not wait for the agent: the worker took the task to coordinator-1.
    assert!(stopped_at.elapsed() < Duration::from_secs(5));
    let record = finished(&fleet, 1, &run_id).await;
    assert_eq!(record.status, "succeeded", "{}", record.error);
    let ran = executions::read(records.root());
    assert_eq!(ran.len(), 2, "each step once: {ran:#?}");
    assert!(ran.iter().all(|e| e.attempt == 1), "{ran:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_task_goes_to_another_worker_as_a_new_attempt() {
    let mut fleet = Fleet::start(1, TIMING).await;
    let records = Records::new(fleet.dir().join("records"));
    fleet.start_logged_worker(&records, "doomed", "1", 1);
    fleet.wait_for_workers(1).await;
    let run_id = submit(&fleet, 0).await;
    let first = started(&records, "first").await;
    assert_eq!(first.worker, "doomed");
    fleet.start_logged_worker(&records, "survivor", "0", 1);
    fleet.wait_for_workers(2).await;

    fleet.kill_worker("doomed");
    let record = finished(&fleet, 0, &run_id).await;
    assert_eq!(record.status, "succeeded", "{}", record.error);
    let ran = executions::read(records.root());
    let again: Vec<_> = ran.iter().filter(|e| e.step_id == "first").collect();
    assert_eq!(again.len(), 2, "{ran:#?}");
    assert_eq!(
        (again[1].worker.as_str(), again[1].attempt),
        ("survivor", first.attempt + 1)
    );
    let stats = fleet.stats(0).await.unwrap();
    assert_eq!(stats.redeliveries, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stream_that_falls_silent_is_closed_so_the_worker_reconnects() {
    use baton_proto::v1::worker_service_client::WorkerServiceClient;
    use baton_proto::v1::{Hello, WorkerMessage, worker_message};
    let fleet = Fleet::start(
        1,
        Timing {
            lease_ms: 2_000,
            worker_silence_ms: 500,
        },
    )
    .await;
    // A worker that says hello and then nothing, with its stream still open (a proxy that
    // swallows everything looks like this from the coordinator).
    let (outbound, receiver) = tokio::sync::mpsc::channel(4);
    outbound
        .send(WorkerMessage {
            message: Some(worker_message::Message::Hello(Hello {
                worker_id: "mute".into(),
                agents: vec!["slow".into()],
                capacity: 1,
                protocol: baton_proto::WORKER_PROTOCOL,
                ..Hello::default()
            })),
        })
        .await
        .unwrap();
    let mut client = WorkerServiceClient::connect(fleet.url(0)).await.unwrap();
    let mut inbound = client
        .task_stream(tokio_stream::wrappers::ReceiverStream::new(receiver))
        .await
        .expect("TaskStream")
        .into_inner();
    let ended = tokio::time::timeout(harness::DEADLINE, inbound.message()).await;
    assert!(
        matches!(ended, Ok(Ok(None)) | Ok(Err(_))),
        "the coordinator ended the stream: {ended:?}"
    );
    assert_eq!(fleet.stats(0).await.unwrap().workers, 0);
    drop(outbound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_one_coordinator_follows_a_run_another_moves_on() {
    use baton_proto::v1::{WatchRunRequest, run_event};
    let mut fleet = Fleet::start(2, TIMING).await;
    let records = Records::new(fleet.dir().join("records"));
    // The worker is on coordinator-0 only: coordinator-1 never applies a step of the run.
    fleet.start_logged_worker(&records, "w1", "0", 2);
    fleet.wait_for_workers(1).await;
    let run_id = submit(&fleet, 0).await;
    let mut watcher = fleet.client(1).await.unwrap();
    let mut events = watcher
        .watch_run(WatchRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .expect("WatchRun")
        .into_inner();
    let mut finished_steps = Vec::new();
    let record = loop {
        let event = tokio::time::timeout(harness::DEADLINE, events.message())
            .await
            .expect("an event within the deadline")
            .expect("the stream")
            .expect("the run finishes before the stream ends");
        match event.event {
            Some(run_event::Event::StepFinished(step)) => finished_steps.push(step.step_id),
            Some(run_event::Event::RunFinished(finished)) => break finished.record.unwrap(),
            _ => {}
        }
    };
    assert_eq!(record.status, "succeeded", "{}", record.error);
    assert_eq!(finished_steps, ["first", "second"], "each once, in order");
    assert!(
        tokio::time::timeout(harness::DEADLINE, events.message())
            .await
            .expect("the stream ends")
            .expect("cleanly")
            .is_none()
    );
}

/// A task waits at the coordinator that dispatched it; when that coordinator's workers are busy
/// and another coordinator's are idle, it goes there instead of waiting (and an autoscaler's new
/// workers help whichever coordinator they land on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_waiting_at_a_busy_coordinator_runs_on_another_coordinator_s_idle_worker() {
    let mut fleet = Fleet::start(2, TIMING).await;
    let records = Records::new(fleet.dir().join("records"));
    let agents = records.agents_file("busy", &[("slow", vec!["logged-agent.sh", "6"])]);
    fleet.start_worker_on("busy", &agents, 1, 0);
    fleet.start_worker_on("idle", &agents, 1, 1);
    fleet.wait_for_workers(2).await;
    let one_step = json!({"steps": [{"id": "work", "type": "agent", "agent": "slow"}]})
        .to_string()
        .into_bytes();
    let mut client = fleet.client(0).await.unwrap();
    let first = harness::submit(&mut client, one_step.clone(), &json!(1)).await;
    started(&records, "work").await;
    // Dispatched by coordinator-0, whose only worker is busy for six seconds: far longer than
    // the second task waits before it moves (a second, and a sweep).
    let second = harness::submit(&mut client, one_step, &json!(2)).await;

    let mut workers = Vec::new();
    for run_id in [&first, &second] {
        let record = finished(&fleet, 0, run_id).await;
        assert_eq!(record.status, "succeeded", "{}", record.error);
        workers.push(harness::step(&record, "work").worker_id.clone());
    }
    assert_eq!(
        workers,
        ["busy", "idle"],
        "the second task waited for the busy worker\n{}",
        fleet.logs()
    );
    assert!(
        fleet
            .log_of("coordinator-0")
            .contains("moved to coordinators whose workers have room"),
        "{}",
        fleet.log_of("coordinator-0")
    );
    // Each ran once.
    let runs: Vec<_> = executions::read(records.root())
        .into_iter()
        .map(|e| e.run_id)
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
}
