//! Writes whose answer was lost, through the service, on a real `redis-server`: what a client is
//! told and what the store holds agree (issue 28, Deliver 4).
//!
//! The attack: a store call times out (a busy Redis, here paused with `CLIENT PAUSE`, as a long
//! script or a flood of big submits would hold it). The client was told `UNAVAILABLE: timed out`
//! while Redis ran the write a moment later: a submit told failed ran, was never listed, and a
//! plain retry started it twice; a cancel told failed cancelled. Now:
//! - told done: it was done (and a new run is listed, once);
//! - told not done: it was not, and never will be (its create voided, its version fenced);
//! - told it may have been done: the error names the run and how to look at it, and the run is
//!   listed if it exists.
//!
//! Each case pauses Redis from a connection of its own. A write "lost on its way" is one whose
//! connection is killed while Redis holds it, paused: Redis drops what it had not run.

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

use baton_coordinator::store::redis::RedisStore;
use baton_coordinator::store::{
    Claim, Coordination, Error as StoreError, RunHeader, RunQuery, Runs, Settled, TransitionWrite,
};
use baton_coordinator::{Config, Coordinator, Error};
use baton_core::Decision;
use fake_worker::{FakeWorker, json_bytes};
use redis::aio::MultiplexedConnection;
use redis_server::RedisServer;
use running::{Running, running};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

const ONE_STEP: &str = r#"{"steps": [{"id": "plan", "type": "agent", "agent": "planner"}]}"#;

const APPROVAL: &str = r#"{"steps": [
    {"id": "approve", "type": "approval", "message": "Go ahead?", "on_approve": "plan"},
    {"id": "plan", "type": "agent", "agent": "planner"}
]}"#;

/// Longer than the coordinator settles a lost write for (5 s), plus its store timeout.
const LONGER_THAN_SETTLING: u64 = 7_000;

/// A coordinator on a fresh Redis with a worker for `planner`, and a connection of the test's
/// own. One run is submitted and finished first, so that Redis has loaded the scripts of a
/// create and a transition: a write held by a paused Redis then waits in its script, not in
/// `SCRIPT LOAD`.
async fn start(
    lease_ms: u64,
) -> (
    RedisServer,
    Running<RedisStore>,
    FakeWorker,
    MultiplexedConnection,
) {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let config = Config {
        lease_ms,
        sweep_interval_ms: 20,
        // The test's worker says nothing while Redis is paused, longer than the 5 s after
        // which a silent worker is cut off.
        worker_silence_ms: 60_000,
        ..Config::default()
    };
    let coordinator = running(Coordinator::new(store, config));
    let mut worker = FakeWorker::connect(&coordinator, "w", &["planner"]).await;
    submit(&coordinator).await.expect("the first submit");
    let task = worker.wait_task().await;
    worker
        .complete(&coordinator, &task, &json!({"warm": true}), None)
        .await
        .unwrap();
    let con = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    (server, coordinator, worker, con)
}

async fn submit(coordinator: &Coordinator<RedisStore>) -> Result<String, Error> {
    client::submit(coordinator, ONE_STEP.as_bytes(), &json_bytes(&json!("x"))).await
}

/// Every client of Redis but `con` waits `ms` before its next command runs (`mode`: `ALL`, or
/// `WRITE`: only what may write, scripts included).
async fn pause(con: &mut MultiplexedConnection, ms: u64, mode: &str) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg(mode)
        .query_async(con)
        .await
        .unwrap();
}

/// Kills the coordinator's connections once one of them waits, paused, with a write (`CLIENT
/// LIST`: `flags=b`): Redis drops what it held of them, unrun, and the coordinator reconnects.
async fn lose_the_waiting_write(con: &mut MultiplexedConnection) {
    until(con, "a write waits in Redis", async |con| {
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(con)
            .await
            .unwrap();
        clients.lines().any(|client| client.contains(" flags=b "))
    })
    .await;
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(con)
        .await
        .unwrap();
}

/// Waits until `check` holds, for at most 20 s.
async fn until<T, F>(on: &mut T, what: &str, check: F)
where
    F: AsyncFn(&mut T) -> bool,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check(on).await {
        assert!(Instant::now() < deadline, "not within 20 s: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every run listed, newest first.
async fn listed(coordinator: &Coordinator<RedisStore>) -> Vec<String> {
    coordinator
        .list(RunQuery::newest(100))
        .await
        .unwrap()
        .runs
        .into_iter()
        .map(|run| run.run_id)
        .collect()
}

/// A header of [`ONE_STEP`] for `run_id`, as a store call takes it.
fn header(run_id: &str) -> RunHeader {
    RunHeader {
        run_id: run_id.to_owned(),
        workflow_id: String::new(),
        workflow: ONE_STEP.to_owned(),
        input: b"\"x\"".to_vec(),
        created_ms: 0,
        traceparent: String::new(),
        submitted_by: String::new(),
    }
}

/// The run id an error names (a UUID).
fn run_named(message: &str) -> String {
    message
        .split(|c: char| !(c.is_ascii_hexdigit() || c == '-'))
        .find(|word| word.len() == 36 && word.matches('-').count() == 4)
        .unwrap_or_else(|| panic!("no run id in {message:?}"))
        .to_owned()
}

fn unavailable(error: &Error) -> &str {
    match error {
        Error::Store(StoreError::Unavailable(why)) => why,
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

// -------------------------------------------------------------------------------------------------
// Submits, without an idempotency key.

/// Attack: a submit's create times out on a busy Redis, which runs it a moment later. The client
/// used to be told it failed while the run ran, unlisted. Now it is told the run was created, and
/// the run is listed, once, and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_redis_is_too_busy_to_answer_is_told_created_and_is_listed_once() {
    let (_server, coordinator, mut worker, mut con) = start(30_000).await;
    let before = listed(&coordinator).await;

    pause(&mut con, 1_500, "ALL").await;
    let run_id = submit(&coordinator).await.expect("told created");

    let runs = listed(&coordinator).await;
    assert_eq!(runs.len(), before.len() + 1, "{runs:?}");
    assert_eq!(runs[0], run_id);
    let task = worker.wait_task().await;
    assert!(task.task_id.starts_with(&run_id), "{}", task.task_id);
    worker
        .complete(&coordinator, &task, &json!({"done": true}), None)
        .await
        .unwrap();
    assert_eq!(
        coordinator.record(&run_id).await.unwrap().status,
        baton_core::RunStatus::Succeeded
    );
    assert!(worker.has_nothing(), "the run ran once");
}

/// Attack: a submit's create is lost on its way (its connection dies while Redis is busy). The
/// client is told the run was not created and never will be, and indeed it never exists: a
/// create that still came would be refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_whose_create_is_lost_is_told_not_created_and_the_run_never_exists() {
    let (_server, coordinator, mut worker, mut con) = start(30_000).await;
    let before = listed(&coordinator).await;

    pause(&mut con, 2_000, "WRITE").await;
    let submitting = tokio::spawn({
        let coordinator = coordinator.clone();
        async move { submit(&coordinator).await }
    });
    lose_the_waiting_write(&mut con).await;
    let error = submitting.await.unwrap().expect_err("told not created");
    let why = unavailable(&error);
    assert!(
        why.contains("was not created, and never will be") && why.contains("safe"),
        "{why}"
    );

    let run_id = run_named(why);
    assert_eq!(listed(&coordinator).await, before);
    assert!(matches!(
        coordinator.record(&run_id).await,
        Err(Error::RunNotFound(_))
    ));
    let late = coordinator
        .store()
        .create_run(
            header(&run_id),
            TransitionWrite {
                status: baton_core::RunStatus::Running,
                ..TransitionWrite::default()
            },
        )
        .await;
    assert!(matches!(late, Err(StoreError::Voided(_))), "{late:?}");
    assert!(worker.has_nothing(), "no task of a run that does not exist");

    // Submitting again is what the error says to do, and starts one run.
    let again = submit(&coordinator).await.unwrap();
    assert_eq!(listed(&coordinator).await.len(), before.len() + 1);
    assert!(worker.wait_task().await.task_id.starts_with(&again));
}

/// The same with an idempotency key: a submit that claimed its key for a run, then was told the
/// run was not created (its create voided), left the key naming a run that can never exist. The
/// same request sent again gets a new run under the key (not an error for good, nor the voided
/// id), once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_submit_told_not_created_gets_one_new_run_when_sent_again() {
    let (_server, coordinator, mut worker, _con) = start(30_000).await;
    let before = listed(&coordinator).await;
    let input = json_bytes(&json!("x"));
    let keyed = || client::submit_once(&coordinator, ONE_STEP.as_bytes(), &input, Some("order-42"));

    // What the first submit left: its claim of the key, and its run id voided by the settle.
    let voided = "01a22025-0000-7000-8000-000000000042";
    let request = hex::encode(
        Sha256::new()
            .chain_update(ONE_STEP.as_bytes())
            .chain_update([0])
            .chain_update(&input.json)
            .finalize(),
    );
    let store = coordinator.store();
    assert_eq!(
        store
            .claim_idempotency_key("order-42", voided, &request, 60)
            .await
            .unwrap(),
        Claim::Claimed
    );
    assert_eq!(
        store.settle_create(&header(voided)).await.unwrap(),
        Settled::NotDone
    );

    let first = keyed().await.expect("sent again");
    assert_ne!(first.run_id, voided);
    let second = keyed().await.expect("and again");
    assert_eq!(second.run_id, first.run_id, "the key names the new run now");
    let runs = listed(&coordinator).await;
    assert_eq!(runs.len(), before.len() + 1, "{runs:?}");
    assert_eq!(runs[0], first.run_id);
    assert!(worker.wait_task().await.task_id.starts_with(&first.run_id));
    assert!(worker.has_nothing(), "one run, one task");
}

/// Attack: Redis stays busy longer than the coordinator settles a lost create for. The client is
/// told the run may exist, with its id and how to look; once Redis runs the create, the run is
/// listed, once, and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_that_cannot_be_settled_names_the_run_that_may_exist_and_it_is_listed() {
    // A short lease: the coordinator did not start the run it could not confirm, so its task
    // goes out when its lease runs out, as after a coordinator's crash.
    let (_server, coordinator, mut worker, mut con) = start(1_000).await;
    let before = listed(&coordinator).await;

    pause(&mut con, LONGER_THAN_SETTLING, "ALL").await;
    let error = submit(&coordinator)
        .await
        .expect_err("not confirmed in time");
    let why = unavailable(&error);
    let run_id = run_named(why);
    assert!(
        why.contains("may exist") && why.contains(&format!("baton runs get {run_id}")),
        "{why}"
    );

    until(&mut (), "the run exists", async |_| {
        coordinator.record(&run_id).await.is_ok()
    })
    .await;
    let runs = listed(&coordinator).await;
    assert_eq!(runs.len(), before.len() + 1, "{runs:?}");
    assert_eq!(runs[0], run_id);
    let task = worker.wait_task().await;
    assert!(task.task_id.starts_with(&run_id), "{}", task.task_id);
    worker
        .complete(&coordinator, &task, &json!({"done": true}), None)
        .await
        .unwrap();
    assert_eq!(
        coordinator.record(&run_id).await.unwrap().status,
        baton_core::RunStatus::Succeeded
    );
}

// -------------------------------------------------------------------------------------------------
// Changes: cancel, approve, retry.

/// A run of [`APPROVAL`] waiting for its approval.
async fn waiting_for_approval(coordinator: &Coordinator<RedisStore>) -> String {
    client::submit(coordinator, APPROVAL.as_bytes(), &json_bytes(&json!("x")))
        .await
        .unwrap()
}

/// Attack: a cancel times out on a busy Redis, which runs it a moment later. The client used to
/// be told it failed; now it is told the run is cancelled, which it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_redis_is_too_busy_to_answer_is_told_done_and_the_run_is_cancelled() {
    let (_server, coordinator, _worker, mut con) = start(30_000).await;
    let run_id = waiting_for_approval(&coordinator).await;

    pause(&mut con, 1_500, "ALL").await;
    let record = coordinator
        .cancel(&run_id, "no longer needed", None)
        .await
        .expect("told cancelled");
    assert_eq!(record.status, baton_core::RunStatus::Cancelled);

    let stored = coordinator
        .store()
        .load_run(&run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.status, baton_core::RunStatus::Cancelled);
    assert!(matches!(
        coordinator.cancel(&run_id, "again", None).await,
        Err(Error::RunFinished { .. })
    ));
}

/// Attack: an approval is lost on its way (its connection dies while Redis is busy). The
/// approver is told it was not made and never will be, and indeed the run still waits for it;
/// approving again moves the run on, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_lost_on_its_way_is_told_not_made_and_never_lands() {
    let (_server, coordinator, mut worker, mut con) = start(30_000).await;
    let run_id = waiting_for_approval(&coordinator).await;
    let version = coordinator.store().version(&run_id).await.unwrap().unwrap();

    pause(&mut con, 2_000, "WRITE").await;
    let deciding = tokio::spawn({
        let coordinator = coordinator.clone();
        let run_id = run_id.clone();
        async move {
            coordinator
                .decide(&run_id, "approve", Decision::approve())
                .await
        }
    });
    lose_the_waiting_write(&mut con).await;
    let error = deciding.await.unwrap().expect_err("told not made");
    let why = unavailable(&error);
    assert!(
        why.contains(&format!(
            "the change to run {run_id} was not made, and never will be"
        )),
        "{why}"
    );

    // Still waiting: the approval's write was fenced (the version moved on), nothing else.
    let stored = coordinator
        .store()
        .load_run(&run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.version, version + 1);
    assert_eq!(stored.status, baton_core::RunStatus::Running);
    assert!(
        stored
            .events
            .iter()
            .all(|event| !String::from_utf8_lossy(event).contains("approval_decided"))
    );
    assert!(worker.has_nothing(), "nothing after the approval ran");

    coordinator
        .decide(&run_id, "approve", Decision::approve())
        .await
        .expect("approved again");
    let task = worker.wait_task().await;
    assert!(task.task_id.starts_with(&run_id), "{}", task.task_id);
    worker
        .complete(&coordinator, &task, &json!({"done": true}), None)
        .await
        .unwrap();
    assert_eq!(
        coordinator.record(&run_id).await.unwrap().status,
        baton_core::RunStatus::Succeeded
    );
}

/// Attack: Redis stays busy longer than the coordinator settles a lost retry for. The client is
/// told the retry may have been made, with the run and how to look; once Redis runs it, the run
/// runs again, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_that_cannot_be_settled_says_it_may_have_been_made_and_it_was() {
    let (_server, coordinator, mut worker, mut con) = start(1_000).await;
    let run_id = submit(&coordinator).await.unwrap();
    let task = worker.wait_task().await;
    worker
        .fail(&coordinator, &task, "broken", true)
        .await
        .unwrap();
    assert_eq!(
        coordinator.record(&run_id).await.unwrap().status,
        baton_core::RunStatus::Failed
    );

    // Writes only: the failed run is read back first (a finished run is not kept in memory),
    // and that read must get through for the retry's write to be sent.
    pause(&mut con, LONGER_THAN_SETTLING, "WRITE").await;
    let error = coordinator
        .retry(&run_id, None)
        .await
        .expect_err("not confirmed in time");
    let why = unavailable(&error);
    assert!(
        why.contains(&format!("the change to run {run_id}"))
            && why.contains("may have been")
            && why.contains(&format!("baton runs get {run_id}")),
        "{why}"
    );

    // It was made once Redis got to it: the run runs again, and its step is sent once more.
    let again = worker.wait_task().await;
    assert!(again.task_id.starts_with(&run_id), "{}", again.task_id);
    assert_eq!(
        coordinator.record(&run_id).await.unwrap().status,
        baton_core::RunStatus::Running
    );
    worker
        .complete(&coordinator, &again, &json!({"done": true}), None)
        .await
        .unwrap();
    assert_eq!(
        coordinator.record(&run_id).await.unwrap().status,
        baton_core::RunStatus::Succeeded
    );
}
