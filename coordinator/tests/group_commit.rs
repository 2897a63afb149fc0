//! Answers to one run that arrive together settle in one transition (issue 20, W2): the
//! branches of a parallel step answered at once are written in fewer store calls than there are
//! answers, each answer still gets its own outcome, and the run and its state chain are what
//! answering them one by one gives.
//!
//! On a real `redis-server`: the answers that queue up are the ones that arrive while a write is
//! on its way to the store and back. The test runs on one thread, so every answer sent at once
//! is queued before the first write's reply is read: the first answer is written alone, the
//! others together.

#[path = "support/client.rs"]
mod client;
#[path = "support/fake_worker.rs"]
mod fake_worker;
#[path = "support/redis_server.rs"]
#[allow(dead_code)] // shared harness: not every helper is used here
mod redis_server;
#[path = "support/running.rs"]
mod running;

use baton_coordinator::service::RunEvent;
use baton_coordinator::store::redis::RedisStore;
use baton_coordinator::store::{Runs, TaskSwap, Tasks};
use baton_coordinator::{Config, Coordinator, Error};
use baton_proto::v1::Task;
use fake_worker::{FakeWorker, json_bytes};
use futures::StreamExt;
use futures::future::join_all;
use running::{Running, running};
use serde_json::{Value, json};

/// A coordinator on its own `redis-server`, which lives as long as the first value.
async fn coordinator() -> (redis_server::RedisServer, Running<RedisStore>) {
    let server = redis_server::RedisServer::start();
    let store = RedisStore::connect_with_prefix(&server.url(), "group-commit")
        .await
        .expect("connect to the test redis-server");
    (server, running(Coordinator::new(store, Config::default())))
}

/// A parallel step of `branches` agent branches, `b0`, `b1`...
fn fan_out(branches: usize) -> String {
    let steps: Vec<Value> = (0..branches)
        .map(|i| json!({"id": format!("b{i}"), "type": "agent", "agent": "noop"}))
        .collect();
    json!({"id": "fan-out", "steps": [{"id": "fan", "type": "parallel", "steps": steps}]})
        .to_string()
}

/// Connects a worker with a slot for every branch and starts the run: its tasks, by step id.
async fn started(
    coordinator: &Coordinator<RedisStore>,
    branches: usize,
) -> (FakeWorker, String, Vec<Task>) {
    let hello = FakeWorker::hello(coordinator, "w1", &["noop"], branches as u32, Vec::new());
    let mut worker = hello.await.unwrap();
    let run_id = client::submit(
        coordinator,
        fan_out(branches).as_bytes(),
        &json_bytes(&json!({})),
    )
    .await
    .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..branches {
        tasks.push(worker.wait_task().await);
    }
    tasks.sort_by_key(|task| task.step_id[1..].parse::<usize>().unwrap());
    (worker, run_id, tasks)
}

/// Every task answered at once, each with its own index: each answer's outcome.
async fn answer_all(
    coordinator: &Coordinator<RedisStore>,
    worker: &FakeWorker,
    tasks: &[Task],
) -> Vec<Result<(), Error>> {
    join_all(tasks.iter().enumerate().map(|(i, task)| {
        let data = json!({"branch": i});
        async move { worker.complete(coordinator, task, &data, None).await }
    }))
    .await
}

#[tokio::test]
async fn branches_answered_together_settle_in_fewer_transitions_than_answers() {
    const BRANCHES: usize = 40;
    let (_redis, coordinator) = coordinator().await;
    let (worker, run_id, tasks) = started(&coordinator, BRANCHES).await;
    let before = coordinator.stats().transitions;

    let outcomes = answer_all(&coordinator, &worker, &tasks).await;
    for (task, outcome) in tasks.iter().zip(&outcomes) {
        assert!(outcome.is_ok(), "{}: {outcome:?}", task.task_id);
    }

    let transitions = coordinator.stats().transitions - before;
    assert!(
        transitions < BRANCHES as u64 / 2,
        "{BRANCHES} answers arriving together took {transitions} transitions"
    );
    let record = coordinator.record(&run_id).await.unwrap();
    assert_eq!(
        record.status,
        baton_core::RunStatus::Succeeded,
        "{}",
        record.error
    );
    // Every branch's result is stored, and every answer is in the event log, once and in the
    // order they were applied; the state chain recomputed from the store holds.
    let stored = coordinator
        .store()
        .load_run(&run_id)
        .await
        .unwrap()
        .unwrap();
    for i in 0..BRANCHES {
        let result = &stored.results[&format!("b{i}#1")];
        let result: Value = serde_json::from_slice(result).unwrap();
        assert_eq!(result, json!({"branch": i}));
    }
    let answered: Vec<String> = stored
        .events
        .iter()
        .map(|event| serde_json::from_slice::<Value>(event).unwrap())
        .filter(|event| event["event"] == "agent_succeeded")
        .map(|event| event["task"]["step_id"].as_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = (0..BRANCHES).map(|i| format!("b{i}")).collect();
    assert_eq!(answered, expected);
    let verified = coordinator.verify(&run_id).await.unwrap();
    assert!(verified.ok, "{}", verified.problem);
}

#[tokio::test]
async fn a_late_answer_among_others_is_refused_alone() {
    const BRANCHES: usize = 10;
    let (_redis, coordinator) = coordinator().await;
    let (worker, run_id, tasks) = started(&coordinator, BRANCHES).await;
    // Another coordinator took b1 over and sent it again, as after a lost lease: the store's
    // task is at attempt 2, while this worker still answers attempt 1.
    let store = coordinator.store();
    let key = "b1#1";
    let held = store
        .task(&run_id, key)
        .await
        .unwrap()
        .expect("b1 is a task");
    let mut entry: Value = serde_json::from_slice(&held).unwrap();
    entry["attempt"] = json!(entry["attempt"].as_u64().unwrap() + 1);
    let swapped = store
        .swap_tasks(vec![TaskSwap {
            run_id: run_id.clone(),
            task_key: key.into(),
            expected: held,
            new: Some(serde_json::to_vec(&entry).unwrap()),
        }])
        .await
        .unwrap();
    assert_eq!(swapped, vec![true]);

    let before = coordinator.stats().transitions;
    let outcomes = answer_all(&coordinator, &worker, &tasks).await;
    for (i, outcome) in outcomes.iter().enumerate() {
        if i == 1 {
            assert!(
                matches!(outcome, Err(Error::Superseded { attempt: 1, current, .. }) if current == "2"),
                "{outcome:?}"
            );
        } else {
            assert!(outcome.is_ok(), "b{i}: {outcome:?}");
        }
    }
    assert_eq!(coordinator.stats().fenced_results, 1);
    // The late answer was refused alone: the others were still written together.
    let transitions = coordinator.stats().transitions - before;
    assert!(
        transitions < BRANCHES as u64 - 1,
        "{} answers written in {transitions} transitions",
        BRANCHES - 1
    );

    let record = coordinator.record(&run_id).await.unwrap();
    assert_eq!(record.status, baton_core::RunStatus::Running);
    for step in record.steps.iter().filter(|s| s.parent == "fan") {
        let expected = if step.step_id == "b1" {
            "queued"
        } else {
            "succeeded"
        };
        assert_eq!(step.status.as_str(), expected, "{}", step.step_id);
    }
    let verified = coordinator.verify(&run_id).await.unwrap();
    assert!(verified.ok, "{}", verified.problem);
}

/// A batch of answers tells a run's watchers as many events at once, more than the watch keeps
/// for a watcher that is behind (64): such a watcher reads what it missed from the store, and
/// is told every step once and the run's end, with no error.
#[tokio::test]
async fn a_watcher_left_behind_by_a_batch_is_told_every_step_once() {
    const BRANCHES: usize = 200;
    let (_redis, coordinator) = coordinator().await;
    let (worker, run_id, tasks) = started(&coordinator, BRANCHES).await;
    let mut events = coordinator.watch(&run_id).await.unwrap();
    // The watch is not read while the answers settle.
    let outcomes = answer_all(&coordinator, &worker, &tasks).await;
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");

    let mut finished = Vec::new();
    let mut ended = false;
    loop {
        let next = tokio::time::timeout(std::time::Duration::from_secs(10), events.next());
        let Some(event) = next.await.expect("the watch ends within 10 s") else {
            break;
        };
        match event.expect("no error: a watcher behind catches up") {
            RunEvent::StepFinished { step_id, .. } => finished.push(step_id),
            RunEvent::RunFinished(record) => {
                assert_eq!(record.status, baton_core::RunStatus::Succeeded);
                ended = true;
            }
            _ => {}
        }
    }
    assert!(ended, "told the run's end");
    finished.sort();
    let mut expected: Vec<String> = (0..BRANCHES).map(|i| format!("b{i}")).collect();
    expected.push("fan".into());
    expected.sort();
    assert_eq!(finished, expected, "every step once");
}
