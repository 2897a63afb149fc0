//! Leases, fencing, retries, timeouts and several coordinators, in process: coordinators share
//! one in-memory store, and workers are played by channels. Time is Tokio's, paused: leases of
//! 300 ms and sweeps every 20 ms run in virtual time, so waits are exact and cost nothing, and
//! nothing depends on how busy the machine is.

#[path = "support/client.rs"]
mod client;
#[path = "support/fake_worker.rs"]
mod fake_worker;
#[path = "support/running.rs"]
mod running;

use std::sync::Arc;
use std::time::Duration;

use baton_coordinator::clock::{Clock, Instant};
use baton_coordinator::store::memory::MemoryStore;
use baton_coordinator::store::{Runs, Store, Tasks};
use baton_coordinator::{Config, Coordinator, Error};
use baton_proto::v1::{CoordinatorMessage, Task, coordinator_message};
use fake_worker::{FakeWorker, json_bytes};
use running::running;
use serde_json::{Value, json};

fn quick(id: &str) -> Config {
    Config {
        coordinator_id: id.into(),
        lease_ms: 300,
        sweep_interval_ms: 20,
        worker_silence_ms: 400,
        clock: Clock::following_tokio(),
        ..Config::default()
    }
}

/// One agent step, `work`, with the given extra fields, then the end.
fn one_step(extra: Value) -> String {
    let mut step = json!({"id": "work", "type": "agent", "agent": "worker"});
    step.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    json!({"id": "reliability", "steps": [step]}).to_string()
}

async fn submit<S: Store>(coordinator: &Coordinator<S>, workflow: &str) -> String {
    client::submit(coordinator, workflow.as_bytes(), &json_bytes(&json!("go")))
        .await
        .unwrap()
}

async fn status<S: Store>(coordinator: &Coordinator<S>, run_id: &str) -> (String, String) {
    let record = coordinator.record(run_id).await.unwrap();
    (record.status.to_string(), record.error)
}

/// Waits (up to 10 s) until the run has finished, and returns its status and error.
async fn finished<S: Store>(coordinator: &Coordinator<S>, run_id: &str) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, error) = status(coordinator, run_id).await;
        if status != "running" || Instant::now() > deadline {
            return (status, error);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn cancel_of(message: CoordinatorMessage) -> baton_proto::v1::CancelTask {
    match message.message {
        Some(coordinator_message::Message::Cancel(cancel)) => cancel,
        other => panic!("expected a CancelTask, got {other:?}"),
    }
}

/// How many times the run's event log records an answer for `key`.
async fn answers(store: &MemoryStore, run_id: &str, key: &str) -> usize {
    let stored = store.load_run(run_id).await.unwrap().unwrap();
    stored
        .events
        .iter()
        .map(|e| String::from_utf8_lossy(e).into_owned())
        .filter(|e| e.contains("\"agent_") && e.contains(&format!("\"visit\":{}", 1)))
        .filter(|e| e.contains(key))
        .count()
}

/// Waits (up to 10 s) until the store's entry of the task says `worker_id` runs it: what a
/// lease renewal writes down.
async fn written_down(store: &MemoryStore, run_id: &str, key: &str, worker_id: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stored = store.task(run_id, key).await.unwrap();
        let entry: Option<Value> = stored.map(|bytes| serde_json::from_slice(&bytes).unwrap());
        if entry.as_ref().and_then(|e| e["worker_id"].as_str()) == Some(worker_id) {
            return;
        }
        assert!(Instant::now() < deadline, "never written down: {entry:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_silent_worker_loses_its_lease_and_its_late_answer_is_refused() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), quick("c1")));
    let mut silent = FakeWorker::connect(&coordinator, "silent", &["worker"]).await;
    let run_id = submit(&coordinator, &one_step(json!({}))).await;
    let first = silent.next_task();
    assert_eq!(first.attempt, 1);
    let mut healthy = FakeWorker::connect(&coordinator, "healthy", &["worker"]).await;
    // The healthy worker heartbeats; the silent one says nothing and is cut off.
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = loop {
        assert!(Instant::now() < deadline, "the task never came back");
        coordinator.hub().seen("healthy");
        if let Ok(message) = healthy.try_recv() {
            match message.message {
                Some(coordinator_message::Message::Task(task)) => break task,
                other => panic!("{other:?}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((again.step_id.as_str(), again.attempt), ("work", 2));
    let late = silent
        .complete(&coordinator, &first, &json!({"late": true}), None)
        .await;
    assert!(matches!(late, Err(Error::TaskNotHeld { .. })), "{late:?}");
    assert_eq!(coordinator.stats().fenced_results, 1, "counted");
    assert_eq!(coordinator.stats().redeliveries, 1);
    healthy
        .complete(&coordinator, &again, &json!({"done": true}), None)
        .await
        .unwrap();
    assert_eq!(finished(&coordinator, &run_id).await.0, "succeeded");
    let record = coordinator.record(&run_id).await.unwrap();
    let context: Value = serde_json::from_slice(&record.context).unwrap();
    assert_eq!(context["work"], json!({"done": true}));
}

#[tokio::test(start_paused = true)]
async fn a_dead_coordinators_tasks_are_claimed_as_new_attempts_and_old_answers_fenced() {
    let store = Arc::new(MemoryStore::new());
    let dying = running(Coordinator::new(store.clone(), quick("dying")));
    let mut w1 = FakeWorker::connect(&dying, "w1", &["worker"]).await;
    let run_id = submit(&dying, &one_step(json!({}))).await;
    let first = w1.next_task();
    // kill -9: no goodbye, its lease just stops being renewed.
    drop(dying);

    let survivor = running(Coordinator::new(store.clone(), quick("survivor")));
    let mut w2 = FakeWorker::connect(&survivor, "w2", &["worker"]).await;
    let claimed = w2.wait_task().await;
    assert_eq!(claimed.attempt, first.attempt + 1);

    // w1 reconnects to the survivor still running attempt 1: not taken over, told to stop.
    let mut w1 =
        FakeWorker::reconnect(&survivor, "w1", &["worker"], vec![first.task_id.clone()]).await;
    let cancel = cancel_of(w1.wait_message().await);
    assert_eq!(cancel.task_id, first.task_id);
    assert!(cancel.reason.contains("superseded"), "{}", cancel.reason);
    let late = w1
        .complete(&survivor, &first, &json!({"late": true}), None)
        .await;
    assert!(late.is_err(), "the superseded attempt's answer is refused");

    w2.complete(&survivor, &claimed, &json!({"n": 2}), None)
        .await
        .unwrap();
    assert_eq!(finished(&survivor, &run_id).await.0, "succeeded");
    assert_eq!(answers(&store, &run_id, "work").await, 1, "recorded once");
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_moves_to_another_coordinator_keeps_its_task() {
    let store = Arc::new(MemoryStore::new());
    let leaving = running(Coordinator::new(store.clone(), quick("leaving")));
    let staying = running(Coordinator::new(store.clone(), quick("staying")));
    let mut w1 = FakeWorker::connect(&leaving, "w1", &["worker"]).await;
    let mut w2 = FakeWorker::connect(&staying, "w2", &["worker"]).await;
    let run_id = submit(&leaving, &one_step(json!({}))).await;
    let task = w1.next_task();

    // SIGTERM on the coordinator: its workers are sent elsewhere.
    leaving.shutdown().await;
    match w1.try_recv().unwrap().message {
        Some(coordinator_message::Message::Goodbye(_)) => {}
        other => panic!("expected a goodbye, got {other:?}"),
    }
    drop(leaving);
    let w1 = FakeWorker::reconnect(&staying, "w1", &["worker"], vec![task.task_id.clone()]).await;
    w1.complete(&staying, &task, &json!({"kept": true}), None)
        .await
        .unwrap();
    assert_eq!(finished(&staying, &run_id).await.0, "succeeded");
    // Nothing was delivered twice: the lease moved with the worker.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(w2.has_nothing());
    assert_eq!(staying.stats().redeliveries, 0);
}

#[tokio::test(start_paused = true)]
async fn a_failed_attempt_is_retried_after_a_backoff_until_it_succeeds() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), quick("c1")));
    let mut worker = FakeWorker::connect(&coordinator, "w", &["worker"]).await;
    let retry = json!({"retry": {"max_attempts": 3, "initial_interval_ms": 100}});
    let run_id = submit(&coordinator, &one_step(retry)).await;
    let mut failed_at = Vec::new();
    let mut delivered_at = Vec::new();
    let mut task: Task = worker.next_task();
    for _ in 0..2 {
        worker
            .fail(&coordinator, &task, "flaky dependency", false)
            .await
            .unwrap();
        failed_at.push(Instant::now());
        let record = coordinator.record(&run_id).await.unwrap();
        let step = &record.steps[0];
        assert_eq!(step.status.as_str(), "retrying");
        assert_eq!(step.error.as_deref(), Some("flaky dependency"));
        let next = worker.wait_task().await;
        delivered_at.push(Instant::now());
        assert_eq!(next.attempt, task.attempt + 1);
        task = next;
    }
    // Exponential: 100 ms, then 200 ms, each moved by at most 20 %.
    let waits: Vec<Duration> = failed_at
        .iter()
        .zip(&delivered_at)
        .map(|(failed, delivered)| *delivered - *failed)
        .collect();
    // Delivered by the first sweep (every 20 ms) after the backoff is over.
    let sweep = Duration::from_millis(20);
    assert!(waits[0] >= Duration::from_millis(80), "{waits:?}");
    assert!(waits[0] <= Duration::from_millis(120) + sweep, "{waits:?}");
    assert!(waits[1] >= Duration::from_millis(160), "{waits:?}");
    assert!(waits[1] <= Duration::from_millis(240) + sweep, "{waits:?}");
    worker
        .complete(&coordinator, &task, &json!({"ok": true}), None)
        .await
        .unwrap();
    assert_eq!(finished(&coordinator, &run_id).await.0, "succeeded");
    assert_eq!(coordinator.stats().retries, 2);
}

#[tokio::test(start_paused = true)]
async fn retries_run_out_and_the_step_fails_naming_the_count() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), quick("c1")));
    let mut worker = FakeWorker::connect(&coordinator, "w", &["worker"]).await;
    let retry = json!({"retry": {"max_attempts": 2, "initial_interval_ms": 10}});
    let run_id = submit(&coordinator, &one_step(retry)).await;
    let task = worker.next_task();
    worker
        .fail(&coordinator, &task, "boom", false)
        .await
        .unwrap();
    let task = worker.wait_task().await;
    worker
        .fail(&coordinator, &task, "boom", false)
        .await
        .unwrap();
    let (status, error) = finished(&coordinator, &run_id).await;
    assert_eq!(status, "failed");
    assert!(error.contains("boom (failed 2 of 2 attempts)"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn an_error_marked_not_retryable_fails_at_once_whatever_the_policy() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), quick("c1")));
    let mut worker = FakeWorker::connect(&coordinator, "w", &["worker"]).await;
    let retry = json!({"retry": {"max_attempts": 5, "initial_interval_ms": 10}});
    let run_id = submit(&coordinator, &one_step(retry)).await;
    let task = worker.next_task();
    worker
        .fail(&coordinator, &task, "the input names no file", true)
        .await
        .unwrap();
    let (status, error) = status(&coordinator, &run_id).await;
    assert_eq!(status, "failed");
    assert!(error.contains("not retryable"), "{error}");
    assert_eq!(coordinator.stats().retries, 0);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(worker.has_nothing(), "not delivered again");
}

#[tokio::test(start_paused = true)]
async fn a_step_without_retry_fails_on_its_first_error() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), quick("c1")));
    let mut worker = FakeWorker::connect(&coordinator, "w", &["worker"]).await;
    let run_id = submit(&coordinator, &one_step(json!({}))).await;
    let task = worker.next_task();
    worker
        .fail(&coordinator, &task, "boom", false)
        .await
        .unwrap();
    assert_eq!(
        status(&coordinator, &run_id).await,
        ("failed".to_owned(), "step \"work\" failed: boom".to_owned())
    );
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_attempt_is_stopped_on_its_worker_and_retried() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), quick("c1")));
    let mut worker = FakeWorker::connect(&coordinator, "w", &["worker"]).await;
    let extra = json!({
        "timeout_ms": 100,
        "retry": {"max_attempts": 2, "initial_interval_ms": 10}
    });
    let run_id = submit(&coordinator, &one_step(extra)).await;
    let task = worker.next_task();
    // The worker never answers: the coordinator stops it and tries again.
    let cancel = cancel_of(worker.wait_message().await);
    assert_eq!(cancel.task_id, task.task_id);
    assert!(
        cancel.reason.contains("timed out after 100 ms"),
        "{}",
        cancel.reason
    );
    let second = worker.wait_task().await;
    assert_eq!(second.attempt, task.attempt + 1);
    let cancel = cancel_of(worker.wait_message().await);
    assert_eq!(cancel.task_id, second.task_id);
    let (status, error) = finished(&coordinator, &run_id).await;
    assert_eq!(status, "failed");
    assert!(
        error.contains("timed out after 100 ms (failed 2 of 2 attempts)"),
        "{error}"
    );
    assert_eq!(coordinator.stats().timeouts, 2);
    // The first attempt's answer, arriving after its timeout, is refused.
    assert!(
        worker
            .complete(&coordinator, &task, &json!({}), None)
            .await
            .is_err()
    );
}

#[tokio::test(start_paused = true)]
async fn any_coordinator_moves_any_run_on_and_no_transition_is_applied_twice() {
    let store = Arc::new(MemoryStore::new());
    let a = running(Coordinator::new(store.clone(), quick("a")));
    let b = running(Coordinator::new(store.clone(), quick("b")));
    let workflow = json!({"steps": [
        {"id": "plan", "type": "agent", "agent": "planner", "next": "approve"},
        {"id": "approve", "type": "approval", "message": "ok?", "on_approve": "code"},
        {"id": "code", "type": "agent", "agent": "coder"}
    ]})
    .to_string();
    let mut planner = FakeWorker::connect(&a, "planner", &["planner"]).await;
    let mut coder = FakeWorker::connect(&a, "coder", &["coder"]).await;
    let run_id = submit(&a, &workflow).await;
    let plan = planner.next_task();
    planner
        .complete(&a, &plan, &json!({"files": 1}), None)
        .await
        .unwrap();
    // Approved through b, which has no worker for the coder: the task is left due, and a
    // (whose worker serves it) claims it.
    b.decide(&run_id, "approve", baton_core::Decision::approve())
        .await
        .unwrap();
    let code = coder.wait_task().await;
    assert_eq!(code.step_id, "code");
    // a's copy of the run was behind b's write: it reloads, and records the answer once.
    coder
        .complete(&a, &code, &json!({"written": 1}), None)
        .await
        .unwrap();
    assert_eq!(finished(&b, &run_id).await.0, "succeeded");
    let stored = store.load_run(&run_id).await.unwrap().unwrap();
    assert_eq!(
        stored.events.len(),
        4,
        "how the run started, then plan, approval, code: each once"
    );
    assert_eq!(stored.links.len(), 3);
    assert!(stored.tasks.is_empty());
}

#[tokio::test(start_paused = true)]
async fn two_coordinators_sweeping_the_same_due_tasks_deliver_each_once() {
    let store = Arc::new(MemoryStore::new());
    let a = running(Coordinator::new(store.clone(), quick("a")));
    let b = running(Coordinator::new(store.clone(), quick("b")));
    let workflow = one_step(json!({}));
    let mut runs = Vec::new();
    for _ in 0..20 {
        // No worker anywhere yet: every task is due at once, for whoever serves the agent.
        runs.push(submit(&a, &workflow).await);
    }
    let mut on_a = FakeWorker::connect(&a, "on-a", &["worker"]).await;
    let mut on_b = FakeWorker::connect(&b, "on-b", &["worker"]).await;
    let mut delivered = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while delivered.len() < 20 && Instant::now() < deadline {
        for (worker, coordinator) in [(&mut on_a, &a), (&mut on_b, &b)] {
            coordinator.hub().seen(&worker.id);
            while let Ok(message) = worker.try_recv() {
                if let Some(coordinator_message::Message::Task(task)) = message.message {
                    worker
                        .complete(coordinator, &task, &json!({"by": worker.id}), None)
                        .await
                        .unwrap();
                    delivered.push(task.run_id);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    delivered.sort();
    runs.sort();
    assert_eq!(delivered, runs, "every run's task delivered exactly once");
    for run_id in &runs {
        assert_eq!(finished(&a, run_id).await.0, "succeeded");
    }
}

#[tokio::test(start_paused = true)]
async fn an_approval_nobody_decides_within_its_timeout_fails_its_step() {
    let store = Arc::new(MemoryStore::new());
    let coordinator = running(Coordinator::new(store.clone(), quick("c1")));
    let workflow = json!({"steps": [
        {"id": "sign-off", "type": "approval", "message": "Ship?", "timeout_ms": 100}
    ]})
    .to_string();
    let run_id = submit(&coordinator, &workflow).await;
    // The timer is in the store, in the approvals' timer set.
    let stored = store.load_run(&run_id).await.unwrap().unwrap();
    assert_eq!(stored.tasks.keys().collect::<Vec<_>>(), ["sign-off#1"]);
    let (status, error) = finished(&coordinator, &run_id).await;
    assert_eq!(status, "failed");
    assert_eq!(
        error,
        "step \"sign-off\" failed: approval timed out after 100 ms"
    );
    let stored = store.load_run(&run_id).await.unwrap().unwrap();
    assert!(stored.tasks.is_empty(), "the timer went with the step");
    assert!(
        String::from_utf8_lossy(stored.events.last().unwrap()).contains("approval_timed_out"),
        "the timeout is an event of the log, replayed like the others"
    );
    let verified = coordinator.verify(&run_id).await.unwrap();
    assert!(verified.ok, "{verified:?}");
}

#[tokio::test(start_paused = true)]
async fn an_approval_decided_in_time_drops_its_timer() {
    let store = Arc::new(MemoryStore::new());
    let coordinator = running(Coordinator::new(store.clone(), quick("c1")));
    let workflow = json!({"steps": [
        {"id": "sign-off", "type": "approval", "message": "Ship?", "timeout_ms": 300}
    ]})
    .to_string();
    let run_id = submit(&coordinator, &workflow).await;
    let record = coordinator
        .decide(&run_id, "sign-off", baton_core::Decision::approve())
        .await
        .unwrap();
    assert_eq!(record.status.as_str(), "succeeded");
    let stored = store.load_run(&run_id).await.unwrap().unwrap();
    assert!(stored.tasks.is_empty());
    assert!(
        store.due_tasks("", i64::MAX, 10).await.unwrap().is_empty(),
        "no timer left behind"
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_run_leaves_no_timer_behind() {
    let store = Arc::new(MemoryStore::new());
    let coordinator = running(Coordinator::new(store.clone(), quick("c1")));
    let workflow = json!({"steps": [
        {"id": "sign-off", "type": "approval", "timeout_ms": 60000}
    ]})
    .to_string();
    let run_id = submit(&coordinator, &workflow).await;
    coordinator.cancel(&run_id, "no", None).await.unwrap();
    assert!(store.due_tasks("", i64::MAX, 10).await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_task_swept_up_when_workers_connect_keeps_its_retry_policy() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), quick("c1")));
    let retry = json!({"retry": {"max_attempts": 3, "initial_interval_ms": 10}});
    // No worker yet: the task is due at once, and both connections below sweep for it; one
    // claim wins, the other finds it taken.
    let run_id = submit(&coordinator, &one_step(retry)).await;
    let (mut a, mut b) = tokio::join!(
        FakeWorker::connect(&coordinator, "a", &["worker"]),
        FakeWorker::connect(&coordinator, "b", &["worker"]),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let (worker, task) = loop {
        assert!(Instant::now() < deadline, "no worker got the task");
        if let Ok(CoordinatorMessage {
            message: Some(coordinator_message::Message::Task(task)),
        }) = a.try_recv()
        {
            break (&a, task);
        }
        if let Ok(CoordinatorMessage {
            message: Some(coordinator_message::Message::Task(task)),
        }) = b.try_recv()
        {
            break (&b, task);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    worker
        .fail(&coordinator, &task, "flaky", false)
        .await
        .unwrap();
    let record = coordinator.record(&run_id).await.unwrap();
    assert_eq!(
        (record.status.as_str(), record.steps[0].status.as_str()),
        ("running", "retrying"),
        "the retry policy still applies: {record:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_reconnecting_worker_gets_no_more_tasks_than_it_has_slots() {
    let store = Arc::new(MemoryStore::new());
    let dying = running(Coordinator::new(store.clone(), quick("dying")));
    let mut w1 = FakeWorker::connect(&dying, "w1", &["worker"]).await;
    let first = submit(&dying, &one_step(json!({}))).await;
    let running = w1.next_task();
    // A renewal writes down that w1 runs it: only then may w1 take it elsewhere.
    written_down(&store, &first, "work#1", "w1").await;
    drop(dying);
    let survivor = running::running(Coordinator::new(store.clone(), quick("survivor")));
    // Another run's task waits, due at once.
    submit(&survivor, &one_step(json!({}))).await;
    // w1 comes back with one slot, busy with the task it still runs.
    let held = vec![running.task_id.clone()];
    let mut w1 = FakeWorker::hello(&survivor, "w1", &["worker"], 1, held)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        w1.has_nothing(),
        "the slot is taken by the task it still runs"
    );
}

#[tokio::test(start_paused = true)]
async fn a_coordinator_shutting_down_takes_no_new_worker() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), quick("c1")));
    coordinator.shutdown().await;
    let refused = FakeWorker::hello(&coordinator, "w", &["worker"], 1, Vec::new())
        .await
        .err()
        .expect("refused");
    assert_eq!(
        tonic::Status::from(refused).code(),
        tonic::Code::Unavailable
    );
}
