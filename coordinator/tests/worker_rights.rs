//! A worker acts only on what it holds (issue 28): a task named in a hello is taken over only by
//! the worker, and the principal, the coordinator's record says runs it; a resend, a result, a
//! piece of live output or a decision query about a task the worker does not hold is refused,
//! counted, and answered with nothing of the task (a task the worker was told to stop, its
//! run cancelled, included); a worker id is not shared between principals; what a worker sends
//! is bounded, and a worker that goes leaves nothing on `/metrics`.
//!
//! In process: coordinators on one in-memory store, workers played by channels through the
//! gRPC edge's conversions, the principal each authenticated as given as the edge gives it.
//! Time is Tokio's, paused: leases of 300 ms renewed every 100 ms run in virtual time.

#[path = "support/client.rs"]
mod client;
#[path = "support/fake_worker.rs"]
mod fake_worker;
#[path = "support/running.rs"]
mod running;

use std::sync::Arc;
use std::time::Duration;

use baton_coordinator::clock::{Clock, Instant};
use baton_coordinator::grpc::worker_service;
use baton_coordinator::store::memory::MemoryStore;
use baton_coordinator::store::{Runs, Store, Tasks};
use baton_coordinator::{Config, Coordinator, Error};
use baton_proto::v1::{
    self, CoordinatorMessage, Task, WorkerQueryDecisionsRequest, coordinator_message,
};
use fake_worker::{FakeWorker, json_bytes};
use prost::Message;
use running::running;
use serde_json::{Value, json};

fn quick(id: &str) -> Config {
    Config {
        coordinator_id: id.into(),
        lease_ms: 300,
        sweep_interval_ms: 20,
        worker_silence_ms: 60_000,
        clock: Clock::following_tokio(),
        ..Config::default()
    }
}

/// One step of the `coder` agent, and `retry` if given.
fn one_step(retry: Option<Value>) -> String {
    let mut step = json!({"id": "code", "type": "agent", "agent": "coder"});
    if let Some(retry) = retry {
        step["retry"] = retry;
    }
    json!({"id": "rights", "steps": [step]}).to_string()
}

async fn submit<S: Store>(coordinator: &Coordinator<S>, retry: Option<Value>) -> String {
    let workflow = one_step(retry);
    client::submit(coordinator, workflow.as_bytes(), &json_bytes(&json!("go")))
        .await
        .unwrap()
}

/// Waits (up to 10 s of virtual time) until the run has finished; its record.
async fn finished<S: Store>(
    coordinator: &Coordinator<S>,
    run_id: &str,
) -> baton_coordinator::record::RunRecord {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let record = coordinator.record(run_id).await.unwrap();
        if record.status != baton_core::RunStatus::Running {
            return record;
        }
        assert!(Instant::now() < deadline, "run {run_id} never finished");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the store's entry of `code#1` names `worker_id`: what a renewal writes down.
async fn written_down(store: &MemoryStore, run_id: &str, worker_id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stored = store.task(run_id, "code#1").await.unwrap();
        let entry: Value = stored.map_or(Value::Null, |b| serde_json::from_slice(&b).unwrap());
        if entry["worker_id"] == json!(worker_id) {
            return entry;
        }
        assert!(Instant::now() < deadline, "never written down: {entry}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `baton_worker_messages_refused_total{message="<message>"}` on the coordinator's `/metrics`.
fn refusals<S: Store>(coordinator: &Coordinator<S>, message: &str) -> u64 {
    let series = format!("baton_worker_messages_refused_total{{message=\"{message}\"}} ");
    coordinator
        .metrics_text()
        .lines()
        .find_map(|line| line.strip_prefix(&series))
        .map_or(0, |count| count.parse().unwrap())
}

fn cancel_of(message: CoordinatorMessage) -> v1::CancelTask {
    match message.message {
        Some(coordinator_message::Message::Cancel(cancel)) => cancel,
        other => panic!("expected a CancelTask, got {other:?}"),
    }
}

/// Every message the worker was sent, none of which may be a task.
fn no_task(worker: &mut FakeWorker) -> Vec<CoordinatorMessage> {
    let mut messages = Vec::new();
    while let Ok(message) = worker.try_recv() {
        assert!(
            !matches!(message.message, Some(coordinator_message::Message::Task(_))),
            "{} was sent a task (a payload): {message:?}",
            worker.id
        );
        messages.push(message);
    }
    messages
}

fn data_of(record: &baton_coordinator::record::RunRecord) -> Value {
    serde_json::from_slice::<Value>(&record.context).unwrap()["code"].clone()
}

/// The attack of issue 28: after the coordinator running a coder task died, a worker whose
/// principal serves only the planner names that task in its hello, first under its own id,
/// then under the real worker's id. Neither takes it over (both are told to stop it, and sent
/// nothing of it); while the squatter holds the id, the real worker cannot connect; once it has
/// gone, the real worker takes its task over and its answer is the one recorded.
#[tokio::test(start_paused = true)]
async fn a_task_named_in_a_hello_goes_only_to_the_worker_and_principal_that_run_it() {
    let store = Arc::new(MemoryStore::new());
    let dying = running(Coordinator::new(store.clone(), quick("dying")));
    let mut real = FakeWorker::hello_as(&dying, "real", "coders", &["coder"], Vec::new())
        .await
        .unwrap();
    let run_id = submit(&dying, None).await;
    let task = real.next_task();
    let entry = written_down(&store, &run_id, "real").await;
    assert_eq!(
        entry["principal"], "coders",
        "the principal is written down too"
    );
    drop(dying);

    let survivor = running(Coordinator::new(store.clone(), quick("survivor")));
    let held = vec![task.task_id.clone()];
    let mut hostile =
        FakeWorker::hello_as(&survivor, "hostile", "planners", &["planner"], held.clone())
            .await
            .unwrap();
    let cancel = cancel_of(hostile.wait_message().await);
    assert_eq!(cancel.task_id, task.task_id);
    assert!(
        cancel.reason.contains("names another worker"),
        "{}",
        cancel.reason
    );
    no_task(&mut hostile);
    survivor
        .disconnect_worker("hostile", hostile.connection)
        .await;

    // The same, under the real worker's id.
    let mut squatter =
        FakeWorker::hello_as(&survivor, "real", "planners", &["planner"], held.clone())
            .await
            .unwrap();
    let cancel = cancel_of(squatter.wait_message().await);
    assert!(
        cancel.reason.contains("names another worker"),
        "{}",
        cancel.reason
    );
    no_task(&mut squatter);
    assert_eq!(refusals(&survivor, "held"), 2);
    // While it holds the id, the real worker is refused (and may try again), not mistaken.
    let refused = FakeWorker::hello_as(&survivor, "real", "coders", &["coder"], held.clone())
        .await
        .err()
        .expect("the id is taken");
    assert!(
        refused.to_string().contains("another principal"),
        "{refused}"
    );
    assert_eq!(
        tonic::Status::from(refused).code(),
        tonic::Code::AlreadyExists
    );
    assert_eq!(refusals(&survivor, "hello"), 1);
    survivor
        .disconnect_worker("real", squatter.connection)
        .await;

    let real = FakeWorker::hello_as(&survivor, "real", "coders", &["coder"], held)
        .await
        .unwrap();
    real.complete(&survivor, &task, &json!({"by": "real"}), None)
        .await
        .unwrap();
    let record = finished(&survivor, &run_id).await;
    assert_eq!(
        record.status,
        baton_core::RunStatus::Succeeded,
        "{}",
        record.error
    );
    assert_eq!(data_of(&record), json!({"by": "real"}));
    assert_eq!(
        survivor.stats().redeliveries,
        0,
        "taken over, not run again"
    );
}

/// A coordinator that dies before its first renewal has written down no worker: nobody can
/// take the task over (not even the worker that runs it, which cannot be told from another),
/// and it is delivered again when its lease runs out.
#[tokio::test(start_paused = true)]
async fn a_task_no_renewal_wrote_down_is_delivered_again_not_taken_over() {
    let store = Arc::new(MemoryStore::new());
    let dying = running(Coordinator::new(store.clone(), quick("dying")));
    let mut w1 = FakeWorker::hello_as(&dying, "w1", "coders", &["coder"], Vec::new())
        .await
        .unwrap();
    let run_id = submit(&dying, None).await;
    let first = w1.next_task();
    drop(dying);

    let survivor = running(Coordinator::new(store.clone(), quick("survivor")));
    let mut w1 = FakeWorker::hello_as(
        &survivor,
        "w1",
        "coders",
        &["coder"],
        vec![first.task_id.clone()],
    )
    .await
    .unwrap();
    let cancel = cancel_of(w1.wait_message().await);
    assert!(
        cancel.reason.contains("no worker is recorded"),
        "{}",
        cancel.reason
    );
    let again = w1.wait_task().await;
    assert_eq!(again.attempt, first.attempt + 1, "delivered again");
    w1.complete(&survivor, &again, &json!({"n": 2}), None)
        .await
        .unwrap();
    assert_eq!(
        finished(&survivor, &run_id).await.status,
        baton_core::RunStatus::Succeeded
    );
}

/// A worker of the coordinator that holds the task, or of another principal, names the task a
/// real worker runs in a `ResendTask`, a forged `TaskResult` and a `TaskOutput`: each is refused
/// and counted, it is sent nothing of the task, and the run takes the real worker's answer.
#[tokio::test(start_paused = true)]
async fn messages_about_a_task_another_worker_holds_are_refused_and_counted() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), quick("c1")));
    let mut real = FakeWorker::hello_as(&coordinator, "real", "coders", &["coder"], Vec::new())
        .await
        .unwrap();
    let mut hostile = FakeWorker::hello_as(
        &coordinator,
        "hostile",
        "planners",
        &["planner"],
        Vec::new(),
    )
    .await
    .unwrap();
    let run_id = submit(&coordinator, None).await;
    let task = real.next_task();

    let resent = hostile
        .resend(&coordinator, &task.task_id, "send it to me")
        .await;
    assert!(
        matches!(resent, Err(Error::TaskNotHeld { .. })),
        "{resent:?}"
    );
    let forged = hostile
        .complete(&coordinator, &task, &json!({"by": "hostile"}), None)
        .await;
    assert!(
        matches!(forged, Err(Error::TaskNotHeld { .. })),
        "{forged:?}"
    );
    let streamed = hostile.stream(&coordinator, &task, "forged output", false);
    assert!(
        matches!(streamed, Err(Error::TaskNotHeld { .. })),
        "{streamed:?}"
    );
    assert!(no_task(&mut hostile).is_empty(), "nothing at all");
    for message in ["resend", "result", "output"] {
        assert_eq!(refusals(&coordinator, message), 1, "{message}");
    }
    // The real worker was not disturbed: no cancel, no resend.
    assert!(real.has_nothing());

    real.complete(&coordinator, &task, &json!({"by": "real"}), None)
        .await
        .unwrap();
    let record = finished(&coordinator, &run_id).await;
    assert_eq!(data_of(&record), json!({"by": "real"}));
    assert_eq!(record.steps[0].worker_id.as_deref(), Some("real"));
}

/// A worker's messages are Hello, TaskResult, Heartbeat, ResendTask, Drain and TaskOutput:
/// none acknowledges a `CancelTask`, so there is no acknowledgement to forge. A worker told to
/// stop a task (its run was cancelled) holds it no longer: a result it sends anyway (its agent
/// finished before it heard), a piece of output or a resend is about a task it does not hold,
/// refused and counted like any other, and the cancelled run keeps nothing of it.
#[tokio::test(start_paused = true)]
async fn a_result_sent_after_its_cancel_task_is_refused_and_counted() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), quick("c1")));
    let mut worker = FakeWorker::hello_as(&coordinator, "w1", "coders", &["coder"], Vec::new())
        .await
        .unwrap();
    let run_id = submit(&coordinator, None).await;
    let task = worker.next_task();
    let cancelled = coordinator.cancel(&run_id, "enough", None).await.unwrap();
    assert_eq!(cancelled.status, baton_core::RunStatus::Cancelled);
    let cancel = cancel_of(worker.wait_message().await);
    assert_eq!(cancel.task_id, task.task_id);

    let late = worker
        .complete(&coordinator, &task, &json!({"late": true}), None)
        .await;
    assert!(matches!(late, Err(Error::TaskNotHeld { .. })), "{late:?}");
    let streamed = worker.stream(&coordinator, &task, "late output", false);
    assert!(
        matches!(streamed, Err(Error::TaskNotHeld { .. })),
        "{streamed:?}"
    );
    let resent = worker.resend(&coordinator, &task.task_id, "again").await;
    assert!(
        matches!(resent, Err(Error::TaskNotHeld { .. })),
        "{resent:?}"
    );
    for message in ["result", "output", "resend"] {
        assert_eq!(refusals(&coordinator, message), 1, "{message}");
    }
    assert!(no_task(&mut worker).is_empty(), "nothing of the task again");
    let record = coordinator.record(&run_id).await.unwrap();
    assert_eq!(record.status, baton_core::RunStatus::Cancelled);
    assert_eq!(data_of(&record), Value::Null, "no data of the late result");
    assert_ne!(
        record.steps[0].status,
        baton_coordinator::record::StepStatus::Succeeded
    );
}

/// A resend names an attempt: the worker holding attempt 2 asking for attempt 1 gets nothing.
#[tokio::test(start_paused = true)]
async fn a_resend_of_an_attempt_the_worker_does_not_hold_sends_nothing() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), quick("c1")));
    let mut w1 = FakeWorker::hello_as(&coordinator, "w1", "coders", &["coder"], Vec::new())
        .await
        .unwrap();
    submit(&coordinator, None).await;
    let task = w1.next_task();
    let other_attempt = task.task_id.replace("@1", "@7");
    let resent = w1.resend(&coordinator, &other_attempt, "again").await;
    assert!(
        matches!(resent, Err(Error::TaskNotHeld { .. })),
        "{resent:?}"
    );
    assert!(w1.has_nothing());
    // Its own attempt is sent again, whole.
    w1.resend(&coordinator, &task.task_id, "a part was corrupt")
        .await
        .unwrap();
    assert!(matches!(
        w1.try_recv().unwrap().message,
        Some(coordinator_message::Message::ResetPartCache(_))
    ));
    assert_eq!(w1.next_task().task_id, task.task_id);
}

/// `WorkerService.QueryDecisions` names its worker in a field: it counts only for the caller's
/// principal's worker holding the task.
#[tokio::test(start_paused = true)]
async fn a_decision_query_must_name_a_worker_of_the_caller_s_principal() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), quick("c1")));
    let mut real = FakeWorker::hello_as(&coordinator, "real", "coders", &["coder"], Vec::new())
        .await
        .unwrap();
    submit(&coordinator, None).await;
    let task: Task = real.next_task();
    let ask = || WorkerQueryDecisionsRequest {
        worker_id: "real".into(),
        task_id: task.task_id.clone(),
        text: "the plan".into(),
        ..WorkerQueryDecisionsRequest::default()
    };
    let refused = worker_service::query_decisions(&coordinator, "planners", ask())
        .await
        .unwrap_err();
    assert_eq!(
        tonic::Status::from(refused).code(),
        tonic::Code::PermissionDenied
    );
    assert_eq!(refusals(&coordinator, "query"), 1);
    let found = worker_service::query_decisions(&coordinator, "coders", ask())
        .await
        .expect("the real worker's own principal may ask");
    assert!(found.matches.is_empty());
}

/// The attack of issue 28: an agent's 60 MiB error was stored on the step and on the run, and
/// the record (125 MB) could never be read again. It is cut, with a marker, on every attempt.
#[tokio::test(start_paused = true)]
async fn a_60_mib_error_is_cut_and_the_record_stays_small() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), quick("c1")));
    let mut w1 = FakeWorker::hello_as(&coordinator, "w1", "coders", &["coder"], Vec::new())
        .await
        .unwrap();
    let retry = json!({"max_attempts": 3, "initial_interval_ms": 10});
    let run_id = submit(&coordinator, Some(retry)).await;
    let huge = format!("agent \"coder\" failed: {}", "x".repeat(60 << 20));
    for _ in 0..3 {
        let task = w1.wait_task().await;
        w1.fail(&coordinator, &task, &huge, false).await.unwrap();
    }
    let record = finished(&coordinator, &run_id).await;
    assert_eq!(record.status, baton_core::RunStatus::Failed);
    let limit = Config::default().max_error_bytes;
    let step_error = record.steps[0].error.as_deref().unwrap_or_default();
    assert!(
        step_error.starts_with("agent \"coder\" failed: xxx"),
        "{step_error:.100}"
    );
    assert!(
        step_error.contains(&format!(
            "cut: {} bytes in all, past the limit of {limit}",
            huge.len()
        )),
        "the marker names the length and the limit"
    );
    assert!(
        step_error.ends_with("(failed 3 of 3 attempts)"),
        "{}",
        &step_error[step_error.len() - 60..]
    );
    let size = v1::RunRecord::from(record).encoded_len();
    assert!(size < 64 << 10, "the record is {size} bytes");
}

/// The attack of issue 28: a worker that named 200,000 agents left /metrics at 50 MB. A hello
/// names at most 256, and once the worker has gone its agents leave /metrics with it.
#[tokio::test(start_paused = true)]
async fn a_gone_worker_leaves_nothing_on_metrics() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), quick("c1")));
    assert!(!coordinator.metrics_text().contains("agent-"));
    let agents: Vec<String> = (0..256).map(|n| format!("agent-{n}")).collect();
    let agents: Vec<&str> = agents.iter().map(String::as_str).collect();
    let many = FakeWorker::hello_as(&coordinator, "many", "pool", &agents, Vec::new())
        .await
        .unwrap();
    assert!(
        coordinator
            .metrics_text()
            .contains("worker_free_slots{agent=\"agent-255\"}")
    );
    coordinator.disconnect_worker("many", many.connection).await;
    let after = coordinator.metrics_text();
    assert!(!after.contains("agent-"), "{after}");

    let too_many: Vec<String> = (0..200_000).map(|n| format!("agent-{n}")).collect();
    let too_many: Vec<&str> = too_many.iter().map(String::as_str).collect();
    let refused = FakeWorker::hello_as(&coordinator, "more", "pool", &too_many, Vec::new())
        .await
        .err()
        .expect("refused");
    assert_eq!(
        refused.to_string(),
        "hello.agents: 200000 agents; the limit is 256"
    );
}

/// Issue 28: a run record stays readable whatever workers sent. Each result is bounded, but not
/// their sum: two large results made a record past the gRPC message limit, which no client could
/// read again. Past `max_record_bytes`, the largest context entries are shown by their size and
/// digest; the results themselves are stored whole, and agents still receive them.
#[tokio::test(start_paused = true)]
async fn results_too_large_together_for_a_record_are_shown_by_size_and_digest() {
    let config = Config {
        max_record_bytes: 4_096,
        ..quick("c1")
    };
    let store = Arc::new(MemoryStore::new());
    let coordinator = running(Coordinator::new(store.clone(), config));
    let mut w1 = FakeWorker::connect(&coordinator, "w1", &["coder"]).await;
    let workflow = json!({"id": "big", "steps": [
        {"id": "first", "type": "agent", "agent": "coder"},
        {"id": "second", "type": "agent", "agent": "coder"}
    ]});
    let run_id = client::submit(
        &coordinator,
        workflow.to_string().as_bytes(),
        &json_bytes(&json!("go")),
    )
    .await
    .unwrap();
    for (fill, n) in [("a", 3_000), ("b", 2_000)] {
        let task = w1.wait_task().await;
        w1.complete(&coordinator, &task, &json!(fill.repeat(n)), None)
            .await
            .unwrap();
    }
    let record = finished(&coordinator, &run_id).await;
    assert_eq!(record.status, baton_core::RunStatus::Succeeded);
    assert!(
        record.context.len() + record.memory.len() <= 4_096,
        "{} bytes",
        record.context.len() + record.memory.len()
    );
    let context: Value = serde_json::from_slice(&record.context).unwrap();
    assert_eq!(context["first"]["$omitted"]["bytes"], json!(3_002));
    assert_eq!(
        context["second"],
        json!("b".repeat(2_000)),
        "what fits is shown"
    );
    let stored = store.load_run(&run_id).await.unwrap().unwrap();
    assert_eq!(stored.results["first#1"].len(), 3_002, "stored whole");
}
