//! A Redis restart, on a real `redis-server` with an append-only file fsynced at every write:
//! what was acknowledged before the restart is there after it, and the coordinator's connection
//! and scripts come back by themselves.

#[path = "support/client.rs"]
mod client;
#[path = "support/fake_worker.rs"]
mod fake_worker;
#[path = "support/redis_server.rs"]
#[allow(dead_code)]
mod redis_server;
#[path = "support/running.rs"]
mod running;

use std::time::Duration;

use baton_coordinator::store::Runs;
use baton_coordinator::store::redis::RedisStore;
use baton_coordinator::{Config, Coordinator};
use fake_worker::{FakeWorker, json_bytes};
use redis_server::RedisServer;
use running::running;
use serde_json::{Value, json};

const TWO_STEPS: &str = r#"{"steps": [
    {"id": "plan", "type": "agent", "agent": "planner", "next": "code"},
    {"id": "code", "type": "agent", "agent": "coder"}
]}"#;

fn config() -> Config {
    Config {
        lease_ms: 1_000,
        sweep_interval_ms: 20,
        ..Config::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_transitions_survive_a_redis_restart_and_the_run_goes_on() {
    let mut redis = RedisServer::start_durable();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    // Every answer here comes from the test: a lease that ran out on a loaded machine would
    // only add a takeover (and its CancelTask) that this test is not about.
    let coordinator = running(Coordinator::new(
        store.clone(),
        Config {
            lease_ms: 30_000,
            ..config()
        },
    ));
    let mut worker = FakeWorker::connect(&coordinator, "w", &["planner", "coder"]).await;
    let runs: Vec<String> = {
        let mut runs = Vec::new();
        for n in 0..5 {
            let run_id = client::submit(&coordinator, TWO_STEPS.as_bytes(), &json_bytes(&json!(n)))
                .await
                .unwrap();
            runs.push(run_id);
        }
        runs
    };
    let mut plans = Vec::new();
    for _ in 0..5 {
        plans.push(worker.wait_task().await);
    }
    // Three plans answered (acknowledged), two still out when Redis goes down.
    for plan in &plans[..3] {
        worker
            .complete(&coordinator, plan, &json!({"plan": plan.run_id}), None)
            .await
            .unwrap();
    }
    let before: Vec<u64> = {
        let mut versions = Vec::new();
        for run_id in &runs {
            versions.push(store.version(run_id).await.unwrap().unwrap());
        }
        versions
    };

    redis.restart();

    // Everything acknowledged is still there.
    for (run_id, version) in runs.iter().zip(&before) {
        assert_eq!(
            store.version(run_id).await.unwrap(),
            Some(*version),
            "{run_id}"
        );
    }
    // The answers still out are recorded after the restart, on the same connection and
    // scripts (reloaded by the client), and every run finishes.
    for plan in &plans[3..] {
        worker
            .complete(&coordinator, plan, &json!({"plan": plan.run_id}), None)
            .await
            .unwrap();
    }
    for _ in 0..5 {
        let code = worker.wait_task().await;
        worker
            .complete(&coordinator, &code, &json!({"code": code.run_id}), None)
            .await
            .unwrap();
    }
    for run_id in &runs {
        let record = coordinator.record(run_id).await.unwrap();
        assert_eq!(
            record.status.as_str(),
            "succeeded",
            "{run_id}: {}",
            record.error
        );
        let context: Value = serde_json::from_slice(&record.context).unwrap();
        assert_eq!(context["plan"], json!({"plan": run_id}));
        assert_eq!(context["code"], json!({"code": run_id}));
    }
    assert!(worker.has_nothing());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_arrives_while_redis_is_down_waits_for_it() {
    let mut redis = RedisServer::start_durable();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let coordinator = running(Coordinator::new(store, config()));
    let mut worker = FakeWorker::connect(&coordinator, "w", &["planner", "coder"]).await;
    let run_id = client::submit(&coordinator, TWO_STEPS.as_bytes(), &json_bytes(&json!("x")))
        .await
        .unwrap();
    let plan = worker.wait_task().await;

    // Redis is down while the answer comes in; it comes back a moment later.
    redis.stop();
    let back = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        redis.start_again();
        redis
    });
    worker
        .complete(&coordinator, &plan, &json!({"files": 1}), None)
        .await
        .unwrap();
    let _redis = back.join().unwrap();
    let code = worker.wait_task().await;
    assert_eq!(
        (code.run_id.as_str(), code.step_id.as_str()),
        (run_id.as_str(), "code")
    );
}
