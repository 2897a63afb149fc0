//! The Rust SDK against a real coordinator (in-memory store, gRPC on loopback).

use std::time::Duration;

use baton_coordinator::store::memory::MemoryStore;
use baton_coordinator::{Config, Coordinator};
use baton_proto::Json;
use baton_worker::Worker;
use serde_json::json;

async fn coordinator() -> (Coordinator<MemoryStore>, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let coordinator = Coordinator::new(MemoryStore::new(), Config::default());
    tokio::spawn(baton_coordinator::grpc::serve(
        listener,
        coordinator.clone(),
        std::future::pending(),
    ));
    (coordinator, url)
}

/// Submits a one-step workflow and waits (bounded) for the run to end; returns its record.
async fn run_one_step(
    coordinator: &Coordinator<MemoryStore>,
    step: serde_json::Value,
) -> baton_proto::v1::RunRecord {
    let workflow = json!({"steps": [step]}).to_string();
    let run_id = coordinator
        .submit(workflow.as_bytes(), &Json::new(b"\"x\"".to_vec()))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let record = coordinator.record(&run_id).await.unwrap();
        if record.status != "running" {
            return record;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "run {run_id} did not end"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_gets_the_payload_and_its_answer_is_the_steps_data() {
    let (coordinator, url) = coordinator().await;
    let worker = Worker::builder()
        .coordinator(url)
        .id("sdk")
        .agent("echo", |task| async move {
            Ok(json!({"saw": task.payload["input"], "step": task.step_id}))
        })
        .build();
    tokio::spawn(worker.run(std::future::pending()));
    let record = run_one_step(
        &coordinator,
        json!({"id": "e", "type": "agent", "agent": "echo"}),
    )
    .await;
    assert_eq!(record.status, "succeeded");
    let context: serde_json::Value = serde_json::from_slice(&record.context.unwrap().json).unwrap();
    assert_eq!(context, json!({"e": {"saw": "x", "step": "e"}}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_fails_its_step_instead_of_leaving_it_unanswered() {
    let (coordinator, url) = coordinator().await;
    let worker = Worker::builder()
        .coordinator(url)
        .agent("boom", |_task| async move {
            if true {
                panic!("handler bug");
            }
            Ok(json!(null))
        })
        .build();
    tokio::spawn(worker.run(std::future::pending()));
    let record = run_one_step(
        &coordinator,
        json!({"id": "b", "type": "agent", "agent": "boom"}),
    )
    .await;
    assert_eq!(record.status, "failed");
    assert!(
        record.error.contains("agent \"boom\" panicked"),
        "{}",
        record.error
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steps_timeout_stops_a_handler_that_hangs() {
    let (coordinator, url) = coordinator().await;
    let worker = Worker::builder()
        .coordinator(url)
        .agent("hang", |_task| async move {
            tokio::time::sleep(Duration::from_secs(3_600)).await;
            Ok(json!(null))
        })
        .build();
    tokio::spawn(worker.run(std::future::pending()));
    let step = json!({"id": "h", "type": "agent", "agent": "hang", "timeout_ms": 200});
    let record = run_one_step(&coordinator, step).await;
    assert_eq!(record.status, "failed");
    assert!(
        record.error.contains("timed out after 200 ms"),
        "{}",
        record.error
    );
}
