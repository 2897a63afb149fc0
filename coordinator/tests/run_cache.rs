//! A coordinator keeps in memory the runs it works on, not every run it has read: a run nobody
//! has touched for `run_idle_ms` is dropped, and read back from the store, replayed and checked,
//! when it is touched again (an answer, a decision, a read). Dropping one must lose nothing.

#[path = "support/client.rs"]
mod client;
#[path = "support/fake_worker.rs"]
mod fake_worker;
#[path = "support/running.rs"]
mod running;

use std::sync::Arc;
use std::time::Duration;

use baton_coordinator::store::memory::MemoryStore;
use baton_coordinator::store::{Runs, Store};
use baton_coordinator::{Config, Coordinator};
use baton_core::Decision;
use fake_worker::{FakeWorker, json_bytes, payload};
use running::running;
use serde_json::json;

const IDLE: Duration = Duration::from_millis(100);

/// plan, then an approval, then code.
const WORKFLOW: &str = r#"{"id": "idle", "steps": [
    {"id": "plan", "type": "agent", "agent": "planner", "next": "approve"},
    {"id": "approve", "type": "approval", "message": "go?", "on_approve": "code"},
    {"id": "code", "type": "agent", "agent": "coder", "input": "plan"}
]}"#;

fn forgetful() -> Config {
    Config {
        run_idle_ms: IDLE.as_millis() as u64,
        sweep_interval_ms: 10,
        ..Config::default()
    }
}

/// Waits (10 s at most) until the coordinator holds `count` runs in memory.
async fn until_in_memory<S: Store>(coordinator: &Coordinator<S>, count: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while coordinator.runs_in_memory() != count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} runs in memory after 10 s, not {count}",
            coordinator.runs_in_memory()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn an_idle_run_is_dropped_from_memory_and_goes_on_from_the_store_when_touched() {
    let store = Arc::new(MemoryStore::new());
    let coordinator = running(Coordinator::new(store.clone(), forgetful()));
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["planner", "coder"]).await;
    let run_id = client::submit(&coordinator, WORKFLOW.as_bytes(), &json_bytes(&json!("go")))
        .await
        .unwrap();
    assert_eq!(coordinator.runs_in_memory(), 1);
    let metrics = coordinator.metrics_text();
    assert!(
        metrics.contains("baton_runs_in_memory 1"),
        "the gauge: {metrics}"
    );

    // The planner holds its task while the run sits untouched: the run leaves memory...
    let plan = worker.wait_task().await;
    until_in_memory(&coordinator, 0).await;
    assert!(
        coordinator
            .metrics_text()
            .contains("baton_runs_in_memory 0")
    );
    // ...and the planner's answer, from the worker that holds the task, is taken all the same.
    let data = json!({"files": ["a.ts"], "why": "x".repeat(100)});
    worker
        .complete(&coordinator, &plan, &data, None)
        .await
        .expect("the answer to a run read back from the store");
    assert_eq!(coordinator.runs_in_memory(), 1);

    // Waiting for its approval, it leaves memory again; the decision reads it back.
    until_in_memory(&coordinator, 0).await;
    coordinator
        .decide(&run_id, "approve", Decision::approve())
        .await
        .unwrap();
    let code = worker.wait_task().await;
    assert_eq!(
        payload(&code)["plan"],
        data,
        "the coder gets the plan, from a run replayed twice"
    );
    until_in_memory(&coordinator, 0).await;
    worker
        .complete(&coordinator, &code, &json!({"ok": true}), None)
        .await
        .unwrap();

    let record = coordinator.record(&run_id).await.unwrap();
    assert_eq!(record.status, baton_core::RunStatus::Succeeded);
    let verified = coordinator.verify(&run_id).await.unwrap();
    assert!(verified.ok, "the state chain holds: {verified:?}");
    let stored = store.load_run(&run_id).await.unwrap().unwrap();
    assert_eq!(
        stored.events.len(),
        4,
        "how the run started, then plan, approval and code, each once"
    );
}

#[tokio::test]
async fn a_run_in_use_stays_in_memory() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), forgetful()));
    let _worker = FakeWorker::connect(&coordinator, "w1", &["planner"]).await;
    let run_id = client::submit(&coordinator, WORKFLOW.as_bytes(), &json_bytes(&json!("go")))
        .await
        .unwrap();
    // Read every 20 ms for 5 idle periods: never untouched for one, so never dropped.
    for _ in 0..25 {
        coordinator.record(&run_id).await.unwrap();
        assert_eq!(coordinator.runs_in_memory(), 1);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Left alone, it goes.
    until_in_memory(&coordinator, 0).await;
}
