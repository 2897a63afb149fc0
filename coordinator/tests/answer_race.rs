//! A worker that answers the moment it is sent a task, while clients read the run as fast as
//! they can: no answer may be refused as "not held", and no step may need a second attempt.
//!
//! A read of a run (GetRun, a watch catching up) reloads the coordinator's copy when the store
//! has moved on. It once evicted the copy after letting go of its lock: a transition going on
//! in the evicted slot dispatched the next step, whose answer then met a copy loaded before that
//! transition, was refused as a task the worker did not hold, and waited a lease renewal (3 s)
//! for its redelivery (issue 20: a W1 repetition of 3.47 s instead of 0.14).

#[path = "support/client.rs"]
mod client;
#[path = "support/fake_worker.rs"]
mod fake_worker;
#[path = "support/running.rs"]
mod running;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use baton_coordinator::store::memory::MemoryStore;
use baton_coordinator::{Config, Coordinator};
use fake_worker::{FakeWorker, json_bytes};
use running::running;
use serde_json::json;

const STEPS: usize = 300;
const READERS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn answers_sent_at_once_are_taken_while_clients_read_the_run() {
    let store = Arc::new(MemoryStore::new());
    let coordinator = running(Coordinator::new(store, Config::default()));
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["noop"]).await;
    let steps: Vec<_> = (0..STEPS)
        .map(|i| json!({"id": format!("s{i}"), "type": "agent", "agent": "noop"}))
        .collect();
    let workflow = json!({"id": "chain", "max_visits": 1, "steps": steps}).to_string();
    let run_id = client::submit(&coordinator, workflow.as_bytes(), &json_bytes(&json!({})))
        .await
        .unwrap();

    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let (coordinator, run_id, done) = (coordinator.clone(), run_id.clone(), done.clone());
            tokio::spawn(async move {
                let (mut reads, mut failed) = (0u64, Vec::new());
                while !done.load(Ordering::Relaxed) {
                    if let Err(error) = coordinator.record(&run_id).await {
                        failed.push(error.to_string());
                    }
                    reads += 1;
                    tokio::task::yield_now().await;
                }
                (reads, failed)
            })
        })
        .collect();

    let mut refused = Vec::new();
    for n in 0..STEPS {
        let task = worker.wait_task().await;
        if let Err(error) = worker
            .complete(&coordinator, &task, &json!({"i": n}), None)
            .await
        {
            refused.push(format!("{}: {error}", task.task_id));
        }
        // A refused answer's step comes back only as a redelivery: nothing more to answer.
        if !refused.is_empty() {
            break;
        }
    }
    done.store(true, Ordering::Relaxed);
    let (mut reads, mut failed_reads) = (0, Vec::new());
    for reader in readers {
        let (read, failed) = reader.await.unwrap();
        reads += read;
        failed_reads.extend(failed);
    }
    assert!(refused.is_empty(), "answers refused: {refused:?}");
    assert!(
        failed_reads.is_empty(),
        "reads of the run that failed: {failed_reads:?}"
    );
    let record = coordinator.record(&run_id).await.unwrap();
    assert_eq!(
        record.status,
        baton_core::RunStatus::Succeeded,
        "{}",
        record.error
    );
    let retried: Vec<_> = record
        .steps
        .iter()
        .filter(|step| step.attempts != 1)
        .map(|step| (&step.step_id, step.attempts))
        .collect();
    assert!(
        retried.is_empty(),
        "steps that needed another attempt: {retried:?}"
    );
    assert!(
        reads > STEPS as u64,
        "the readers read the run {reads} times"
    );
}
