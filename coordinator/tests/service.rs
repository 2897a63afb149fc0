//! The coordinator's logic on the in-memory store, with workers played by channels.

#[path = "support/client.rs"]
mod client;
#[path = "support/fake_worker.rs"]
mod fake_worker;
#[path = "support/running.rs"]
mod running;

use std::sync::Arc;

use baton_coordinator::grpc::worker_service;
use baton_coordinator::record::WaitingFor;
use baton_coordinator::store::memory::MemoryStore;
use baton_coordinator::store::{Coordination, Listing, LiveOutput, RunQuery, Runs, Store, Tasks};
use baton_coordinator::{Config, Coordinator, Error};
use baton_core::Decision;
use baton_proto::Json;
use baton_proto::v1::{
    CoordinatorMessage, SubmitRunResponse, Task, TaskResult, coordinator_message, task_result,
};
use fake_worker::{FakeWorker, json_bytes, payload};
use running::running;
use serde_json::{Value, json};

const FEATURE: &str = include_str!("../../examples/feature-development/workflow.json");

fn input(value: Value) -> Json {
    json_bytes(&value)
}

/// Answers `task` with `data`.
impl FakeWorker {
    async fn answer<S: Store>(&self, coordinator: &Coordinator<S>, task: &Task, data: Value) {
        self.complete(coordinator, task, &data, None).await.unwrap();
    }
}

/// Short leases, so that a coordinator that goes away hands its tasks on quickly.
fn quick() -> Config {
    Config {
        lease_ms: 300,
        sweep_interval_ms: 20,
        ..Config::default()
    }
}

/// Submits the spec's feature-development workflow with a string input and an idempotency key.
async fn submit_keyed<S: Store>(
    coordinator: &Coordinator<S>,
    text: &str,
    key: &str,
) -> Result<SubmitRunResponse, Error> {
    client::submit_once(
        coordinator,
        FEATURE.as_bytes(),
        &input(json!(text)),
        Some(key),
    )
    .await
}

/// Starts the spec's feature-development workflow with a string input.
async fn start<S: Store>(coordinator: &Coordinator<S>, text: &str) -> String {
    client::submit(coordinator, FEATURE.as_bytes(), &input(json!(text)))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_run_survives_a_coordinator_restart_from_the_store_alone() {
    let store = Arc::new(MemoryStore::new());
    let first = running(Coordinator::new(store.clone(), quick()));
    let run_id = start(&first, "toggle").await;
    let mut worker = FakeWorker::connect(
        &first,
        "w1",
        &[
            "planner",
            "coder",
            "test-unit",
            "test-integration",
            "reviewer",
        ],
    )
    .await;
    let plan = worker.next_task();
    worker
        .answer(&first, &plan, json!({"files": ["a.ts"]}))
        .await;
    first
        .decide(&run_id, "approve-plan", Decision::approve())
        .await
        .unwrap();
    let code = worker.next_task();
    assert_eq!(payload(&code)["plan"], json!({"files": ["a.ts"]}));
    let before = first.record(&run_id).await.unwrap();
    drop(first);

    // A new coordinator on the same store: nothing but the store carries the run over. The
    // first one's lease on the coder's task runs out, and the task is delivered again.
    let second = running(Coordinator::new(store.clone(), quick()));
    let after = second.record(&run_id).await.unwrap();
    assert_eq!(after.context, before.context);
    assert_eq!(after.state_sha256, before.state_sha256);
    let mut worker = FakeWorker::connect(
        &second,
        "w2",
        &[
            "planner",
            "coder",
            "test-unit",
            "test-integration",
            "reviewer",
        ],
    )
    .await;
    let code_again = worker.wait_task().await;
    assert_eq!(
        (code_again.step_id.as_str(), code_again.visit),
        (code.step_id.as_str(), code.visit),
        "the same task, sent again"
    );
    assert_eq!(
        (code.attempt, code_again.attempt),
        (1, 2),
        "as a new attempt"
    );
    // The first delivery's answer, should it still come, is refused.
    let late = worker
        .complete(&second, &code, &json!({"late": true}), None)
        .await;
    assert!(matches!(late, Err(Error::TaskNotHeld { .. })), "{late:?}");
    assert_eq!(
        payload(&code_again),
        payload(&code),
        "with the same payload"
    );
    worker
        .answer(&second, &code_again, json!({"filesCreated": ["a.ts"]}))
        .await;
    let unit = worker.next_task();
    let integration = worker.next_task();
    worker.answer(&second, &unit, json!({"passed": 1})).await;
    worker
        .answer(&second, &integration, json!({"passed": 2}))
        .await;
    let review = worker.next_task();
    assert_eq!(payload(&review)["code"], json!({"filesCreated": ["a.ts"]}));
    worker
        .answer(&second, &review, json!({"approved": true}))
        .await;
    let record = second.record(&run_id).await.unwrap();
    assert_eq!(record.status.as_str(), "succeeded");
    let steps: Vec<(&str, &str, u32)> = record
        .steps
        .iter()
        .map(|s| (s.step_id.as_str(), s.status.as_str(), s.visits))
        .collect();
    assert!(steps.contains(&("unit", "succeeded", 1)));
    assert!(steps.contains(&("check-tests", "succeeded", 1)));
    let unit_step = record.steps.iter().find(|s| s.step_id == "unit").unwrap();
    assert_eq!(
        (unit_step.worker_id.as_deref(), unit_step.parent.as_str()),
        (Some("w2"), "parallel-tests")
    );
    assert_eq!(unit_step.attempts, 1, "one delivery");
    assert!(store.active_runs().await.unwrap().is_empty());
}

#[tokio::test]
async fn bad_input_is_refused_with_what_is_wrong_and_nothing_is_stored() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let invalid = client::submit(
        &coordinator,
        br#"{"steps": [{"id": "plan", "type": "agnet"}]}"#,
        &input(json!(null)),
    )
    .await
    .unwrap_err();
    assert!(matches!(invalid, Error::InvalidWorkflow(_)));
    let status = tonic::Status::from(invalid);
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("$.steps[0].type (step \"plan\")"),
        "{}",
        status.message()
    );

    let malformed = client::submit(&coordinator, b"{\"steps\": [", &input(json!(null)))
        .await
        .unwrap_err();
    assert!(
        tonic::Status::from(malformed)
            .message()
            .contains("not valid JSON")
    );

    let big = Json::new(serde_json::to_vec(&"x".repeat(5 << 20)).unwrap());
    let too_large = client::submit(&coordinator, FEATURE.as_bytes(), &big)
        .await
        .unwrap_err();
    let status = tonic::Status::from(too_large);
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("the input is"),
        "{}",
        status.message()
    );

    let mut tampered = input(json!("toggle"));
    tampered.flip(1, tampered.json[1] ^ b'T');
    let digest = client::submit(&coordinator, FEATURE.as_bytes(), &tampered)
        .await
        .unwrap_err();
    assert_eq!(
        tonic::Status::from(digest).code(),
        tonic::Code::InvalidArgument
    );

    assert!(
        coordinator
            .list(RunQuery::newest(10))
            .await
            .unwrap()
            .runs
            .is_empty(),
        "nothing was stored"
    );
}

#[tokio::test]
async fn refusals_change_nothing() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let run_id = start(&coordinator, "toggle").await;
    let before = coordinator.record(&run_id).await.unwrap();

    let not_waiting = coordinator
        .decide(&run_id, "approve-plan", Decision::approve())
        .await
        .unwrap_err();
    assert_eq!(
        tonic::Status::from(not_waiting).code(),
        tonic::Code::FailedPrecondition
    );

    let mut worker = FakeWorker::connect(&coordinator, "w1", &["planner"]).await;
    let plan = worker.next_task();
    let stranger = FakeWorker::connect(&coordinator, "w2", &["planner"]).await;
    let not_held = worker_service::answer(
        &coordinator,
        &stranger.id,
        TaskResult {
            task_id: plan.task_id.clone(),
            outcome: Some(task_result::Outcome::Data(input(json!(1)))),
            notes: None,
            non_retryable: false,
            usage: Vec::new(),
        },
    )
    .await
    .unwrap_err();
    assert_eq!(
        tonic::Status::from(not_held).code(),
        tonic::Code::PermissionDenied
    );

    let unknown = coordinator.record("no-such-run").await.unwrap_err();
    assert_eq!(tonic::Status::from(unknown).code(), tonic::Code::NotFound);

    let after = coordinator.record(&run_id).await.unwrap();
    assert_eq!(after.state_sha256, before.state_sha256);
    assert_eq!(after.context, before.context);
    // The real holder can still answer.
    worker
        .answer(&coordinator, &plan, json!({"files": []}))
        .await;
    assert!(matches!(
        coordinator.record(&run_id).await.unwrap().waiting[0],
        WaitingFor::Approval { .. }
    ));
}

#[tokio::test]
async fn a_corrupted_result_fails_its_step_instead_of_stalling_the_run() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let run_id = start(&coordinator, "toggle").await;
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["planner"]).await;
    let plan = worker.next_task();
    let mut corrupted = input(json!({"files": []}));
    corrupted.flip(2, corrupted.json[2] ^ b'F');
    let refused = worker_service::answer(
        &coordinator,
        &worker.id,
        TaskResult {
            task_id: plan.task_id.clone(),
            outcome: Some(task_result::Outcome::Data(corrupted)),
            notes: None,
            non_retryable: false,
            usage: Vec::new(),
        },
    )
    .await
    .unwrap_err();
    assert!(
        matches!(refused, Error::Digest(_)),
        "the worker is told why"
    );
    let record = coordinator.record(&run_id).await.unwrap();
    assert_eq!(record.status.as_str(), "failed");
    assert!(
        record
            .error
            .contains("step \"plan\" failed: the agent's result was refused"),
        "{}",
        record.error
    );
    assert_eq!(
        coordinator.hub().workers(),
        [("w1".into(), 8)],
        "the slot is free again"
    );
}

#[tokio::test]
async fn an_unserved_agent_is_named_in_the_record_and_served_once_a_worker_comes() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let run_id = start(&coordinator, "toggle").await;
    let record = coordinator.record(&run_id).await.unwrap();
    assert_eq!(record.status.as_str(), "running");
    assert_eq!(record.waiting.len(), 1);
    assert_eq!(
        record.waiting[0],
        WaitingFor::Agent {
            step_id: "plan".into(),
            agent: "planner".into(),
            served: false
        }
    );
    let plan_step = record.steps.iter().find(|s| s.step_id == "plan").unwrap();
    assert_eq!(plan_step.status.as_str(), "queued");
    let mut worker = FakeWorker::connect(&coordinator, "late", &["planner"]).await;
    let task = worker.next_task();
    assert_eq!(task.step_id, "plan");
    let record = coordinator.record(&run_id).await.unwrap();
    let plan_step = record.steps.iter().find(|s| s.step_id == "plan").unwrap();
    assert_eq!(
        (plan_step.status.as_str(), plan_step.worker_id.as_deref()),
        ("running", Some("late"))
    );
}

#[tokio::test]
async fn a_worker_that_leaves_hands_its_task_to_another() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let run_id = start(&coordinator, "toggle").await;
    let mut first = FakeWorker::connect(&coordinator, "first", &["planner"]).await;
    let task = first.next_task();
    coordinator
        .disconnect_worker("first", first.connection)
        .await;
    let mut second = FakeWorker::connect(&coordinator, "second", &["planner"]).await;
    let again = second.next_task();
    assert_eq!((again.step_id.as_str(), again.visit), ("plan", task.visit));
    assert_eq!(again.attempt, task.attempt + 1, "a new attempt");
    second
        .answer(&coordinator, &again, json!({"files": []}))
        .await;
    let record = coordinator.record(&run_id).await.unwrap();
    let plan = record.steps.iter().find(|s| s.step_id == "plan").unwrap();
    assert_eq!(
        (
            plan.status.as_str(),
            plan.worker_id.as_deref(),
            plan.attempts
        ),
        ("succeeded", Some("second"), again.attempt)
    );
}

#[tokio::test]
async fn cancel_drops_queued_tasks_and_ends_the_run() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let run_id = start(&coordinator, "toggle").await;
    let record = coordinator
        .cancel(&run_id, "changed my mind", None)
        .await
        .unwrap();
    assert_eq!(
        (record.status.as_str(), record.error.as_str()),
        ("cancelled", "changed my mind")
    );
    let mut worker = FakeWorker::connect(&coordinator, "w", &["planner"]).await;
    assert!(
        worker.try_recv().is_err(),
        "the cancelled run's task is not sent"
    );
    let again = coordinator
        .cancel(&run_id, "twice", None)
        .await
        .unwrap_err();
    assert_eq!(
        tonic::Status::from(again).code(),
        tonic::Code::FailedPrecondition
    );
}

#[tokio::test]
async fn watches_past_the_limit_are_refused_until_one_ends() {
    let coordinator = running(Coordinator::new(
        MemoryStore::new(),
        Config {
            max_watchers: 2,
            ..Config::default()
        },
    ));
    let run_id = start(&coordinator, "toggle").await;
    let first = coordinator.watch(&run_id).await.unwrap();
    let _second = coordinator.watch(&run_id).await.unwrap();
    let refused = match coordinator.watch(&run_id).await {
        Ok(_) => panic!("a third watch was served past max_watchers 2"),
        Err(error) => tonic::Status::from(error),
    };
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(
        refused.message().contains("2 watches at once"),
        "{}",
        refused.message()
    );
    drop(first);
    let _third = coordinator
        .watch(&run_id)
        .await
        .expect("a watch is served once another ended");
}

#[tokio::test]
async fn cancelling_frees_the_slot_for_a_task_of_another_run() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let first = start(&coordinator, "one").await;
    let mut stream = FakeWorker::hello(&coordinator, "solo", &["planner"], 1, Vec::new())
        .await
        .unwrap();
    let second = start(&coordinator, "two").await;
    let first_task = match stream.try_recv().unwrap().message {
        Some(coordinator_message::Message::Task(task)) => task,
        other => panic!("{other:?}"),
    };
    assert_eq!(first_task.run_id, first);
    assert!(stream.try_recv().is_err(), "one slot: the second run waits");
    coordinator
        .cancel(&first, "no longer needed", None)
        .await
        .unwrap();
    // The worker is told to stop the cancelled run's task, then gets the waiting one.
    match stream.try_recv().unwrap().message {
        Some(coordinator_message::Message::Cancel(cancel)) => {
            assert_eq!(cancel.task_id, first_task.task_id)
        }
        other => panic!("expected a CancelTask, got {other:?}"),
    }
    let next = match stream.try_recv().unwrap().message {
        Some(coordinator_message::Message::Task(task)) => task,
        other => panic!("{other:?}"),
    };
    assert_eq!(next.run_id, second, "the freed slot took the waiting task");
}

#[tokio::test]
async fn one_unreadable_run_does_not_stop_the_others_being_picked_up() {
    use baton_coordinator::store::{RunHeader, TransitionWrite};
    let store = Arc::new(MemoryStore::new());
    let coordinator = running(Coordinator::new(store.clone(), quick()));
    // Submitted with no worker anywhere: its task is due at once, for whoever serves planners.
    let good = start(&coordinator, "toggle").await;
    let due_task = br#"{"agent":"planner","state":"queued","attempt":1,"due_ms":0}"#.to_vec();
    store
        .create_run(
            RunHeader {
                run_id: "broken".into(),
                workflow_id: "x".into(),
                workflow: "{ this is not a workflow".into(),
                input: b"null".to_vec(),
                created_ms: 0,
                traceparent: String::new(),
                submitted_by: String::new(),
            },
            TransitionWrite {
                status: baton_core::RunStatus::Running,
                tasks_set: vec![("plan#1".into(), due_task)],
                ..TransitionWrite::default()
            },
        )
        .await
        .unwrap();
    drop(coordinator);
    let restarted = running(Coordinator::new(store.clone(), quick()));
    let mut worker = FakeWorker::connect(&restarted, "w", &["planner"]).await;
    assert_eq!(worker.wait_task().await.run_id, good);
    // The broken run's task was claimed but stays in the store, untouched otherwise.
    let broken = store.load_run("broken").await.unwrap().unwrap();
    assert!(broken.tasks.contains_key("plan#1"));
    assert_eq!(broken.version, 1);
}

/// A store whose next transition write fails, as when Redis blips.
#[derive(Default)]
struct FlakyStore {
    inner: MemoryStore,
    fail_next: std::sync::atomic::AtomicBool,
}

impl Runs for FlakyStore {
    async fn create_run(
        &self,
        header: baton_coordinator::store::RunHeader,
        first: baton_coordinator::store::TransitionWrite,
    ) -> Result<(), baton_coordinator::store::Error> {
        self.inner.create_run(header, first).await
    }

    async fn add_principal_run(
        &self,
        principal: &str,
        run_id: &str,
    ) -> Result<(), baton_coordinator::store::Error> {
        self.inner.add_principal_run(principal, run_id).await
    }

    async fn running_runs_of(
        &self,
        principal: &str,
    ) -> Result<usize, baton_coordinator::store::Error> {
        self.inner.running_runs_of(principal).await
    }

    async fn apply_transition(
        &self,
        run_id: &str,
        expected_version: u64,
        write: baton_coordinator::store::TransitionWrite,
    ) -> Result<u64, baton_coordinator::store::Error> {
        if self
            .fail_next
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return Err(baton_coordinator::store::Error::Unavailable(
                "connection reset".into(),
            ));
        }
        self.inner
            .apply_transition(run_id, expected_version, write)
            .await
    }

    async fn settle_create(
        &self,
        header: &baton_coordinator::store::RunHeader,
    ) -> Result<baton_coordinator::store::Settled, baton_coordinator::store::Error> {
        self.inner.settle_create(header).await
    }

    async fn settle_transition(
        &self,
        run_id: &str,
        expected_version: u64,
        write_id: &str,
    ) -> Result<baton_coordinator::store::Settled, baton_coordinator::store::Error> {
        self.inner
            .settle_transition(run_id, expected_version, write_id)
            .await
    }

    async fn load_run(
        &self,
        run_id: &str,
    ) -> Result<Option<baton_coordinator::store::StoredRun>, baton_coordinator::store::Error> {
        self.inner.load_run(run_id).await
    }

    async fn version(&self, run_id: &str) -> Result<Option<u64>, baton_coordinator::store::Error> {
        self.inner.version(run_id).await
    }
}

impl Tasks for FlakyStore {
    async fn swap_tasks(
        &self,
        swaps: Vec<baton_coordinator::store::TaskSwap>,
    ) -> Result<Vec<bool>, baton_coordinator::store::Error> {
        self.inner.swap_tasks(swaps).await
    }

    async fn due_tasks(
        &self,
        agent: &str,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<baton_coordinator::store::DueTask>, baton_coordinator::store::Error> {
        self.inner.due_tasks(agent, now_ms, limit).await
    }

    async fn task(
        &self,
        run_id: &str,
        task_key: &str,
    ) -> Result<Option<Vec<u8>>, baton_coordinator::store::Error> {
        self.inner.task(run_id, task_key).await
    }

    async fn tasks(
        &self,
        run_id: &str,
    ) -> Result<std::collections::BTreeMap<String, Vec<u8>>, baton_coordinator::store::Error> {
        self.inner.tasks(run_id).await
    }
}

impl LiveOutput for FlakyStore {
    async fn append_output(
        &self,
        pieces: Vec<(baton_core::RunId, baton_coordinator::store::OutputPiece)>,
    ) -> Result<(), baton_coordinator::store::Error> {
        self.inner.append_output(pieces).await
    }

    async fn read_output(
        &self,
        run_id: &str,
        after: Option<baton_coordinator::store::OutputOffset>,
    ) -> Result<
        Vec<(
            baton_coordinator::store::OutputOffset,
            baton_coordinator::store::OutputPiece,
        )>,
        baton_coordinator::store::Error,
    > {
        self.inner.read_output(run_id, after).await
    }

    async fn wait_output(
        &self,
        after: Vec<(String, baton_coordinator::store::OutputOffset)>,
        block: std::time::Duration,
    ) -> Result<
        Vec<(
            String,
            baton_coordinator::store::OutputOffset,
            baton_coordinator::store::OutputPiece,
        )>,
        baton_coordinator::store::Error,
    > {
        self.inner.wait_output(after, block).await
    }
}

impl Listing for FlakyStore {
    async fn list_runs(
        &self,
        query: baton_coordinator::store::RunQuery,
    ) -> Result<baton_coordinator::store::RunPage, baton_coordinator::store::Error> {
        self.inner.list_runs(query).await
    }

    async fn active_runs(&self) -> Result<Vec<String>, baton_coordinator::store::Error> {
        self.inner.active_runs().await
    }

    async fn decisions(
        &self,
        run_id: &str,
    ) -> Result<std::collections::BTreeMap<String, Vec<u8>>, baton_coordinator::store::Error> {
        self.inner.decisions(run_id).await
    }

    async fn runs_of_workflow(
        &self,
        workflow_id: &str,
        limit: usize,
    ) -> Result<Vec<String>, baton_coordinator::store::Error> {
        self.inner.runs_of_workflow(workflow_id, limit).await
    }
}

impl Coordination for FlakyStore {
    async fn ping(&self) -> Result<(), baton_coordinator::store::Error> {
        self.inner.ping().await
    }

    async fn advertise_slots(
        &self,
        coordinator: &str,
        free: std::collections::BTreeMap<String, usize>,
        expires_ms: i64,
    ) -> Result<(), baton_coordinator::store::Error> {
        self.inner
            .advertise_slots(coordinator, free, expires_ms)
            .await
    }

    async fn slots_elsewhere(
        &self,
        me: &str,
        now_ms: i64,
    ) -> Result<std::collections::BTreeMap<String, usize>, baton_coordinator::store::Error> {
        self.inner.slots_elsewhere(me, now_ms).await
    }

    async fn claim_idempotency_key(
        &self,
        key: &str,
        run_id: &str,
        request_sha256: &str,
        ttl_s: u64,
    ) -> Result<baton_coordinator::store::Claim, baton_coordinator::store::Error> {
        self.inner
            .claim_idempotency_key(key, run_id, request_sha256, ttl_s)
            .await
    }

    async fn reclaim_idempotency_key(
        &self,
        key: &str,
        voided_run_id: &str,
        run_id: &str,
        request_sha256: &str,
        ttl_s: u64,
    ) -> Result<baton_coordinator::store::Claim, baton_coordinator::store::Error> {
        self.inner
            .reclaim_idempotency_key(key, voided_run_id, run_id, request_sha256, ttl_s)
            .await
    }
}

#[tokio::test]
async fn a_result_waits_out_a_store_blip_and_is_recorded_once() {
    let store = Arc::new(FlakyStore::default());
    let coordinator = running(Coordinator::new(store.clone(), Config::default()));
    let run_id = start(&coordinator, "toggle").await;
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["planner"]).await;
    let plan = worker.next_task();
    store
        .fail_next
        .store(true, std::sync::atomic::Ordering::SeqCst);
    worker
        .answer(&coordinator, &plan, json!({"files": []}))
        .await;
    assert!(
        !store.fail_next.load(std::sync::atomic::Ordering::SeqCst),
        "the first write failed"
    );
    assert!(worker.has_nothing(), "the task was not sent again");
    let record = coordinator.record(&run_id).await.unwrap();
    assert!(matches!(record.waiting[0], WaitingFor::Approval { .. }));
    let stored = store.inner.load_run(&run_id).await.unwrap().unwrap();
    let answers = stored
        .events
        .iter()
        .filter(|e| String::from_utf8_lossy(e).contains("agent_succeeded"))
        .count();
    assert_eq!(answers, 1, "recorded once");
}

#[tokio::test]
async fn a_payload_that_does_not_arrive_intact_is_sent_again_whole_then_fails_its_step() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let mut worker = FakeWorker::connect(&coordinator, "w", &["planner"]).await;
    let run_id = start(&coordinator, "dark mode").await;
    let plan = worker.next_task();
    let resend = |task: &Task| baton_proto::v1::ResendTask {
        task_id: task.task_id.clone(),
        reason: "a payload part is corrupt".into(),
    };
    for _ in 0..baton_coordinator::hub::MAX_RESENDS {
        worker_service::resend(&coordinator, "w", resend(&plan))
            .await
            .unwrap();
        match worker.try_recv() {
            Ok(CoordinatorMessage {
                message: Some(coordinator_message::Message::ResetPartCache(_)),
            }) => {}
            other => panic!("expected a cache reset first, got {other:?}"),
        }
        let again = worker.next_task();
        assert_eq!(again.task_id, plan.task_id);
        assert_eq!(payload(&again), payload(&plan), "the same payload, whole");
    }
    // Another worker cannot ask for a task it does not hold.
    assert!(matches!(
        worker_service::resend(&coordinator, "someone-else", resend(&plan)).await,
        Err(Error::TaskNotHeld { .. })
    ));
    // One resend too many: the step fails, naming why, and the run with it.
    worker_service::resend(&coordinator, "w", resend(&plan))
        .await
        .unwrap();
    let record = coordinator.record(&run_id).await.unwrap();
    let step = record.steps.iter().find(|s| s.step_id == "plan").unwrap();
    assert_eq!(step.status.as_str(), "failed");
    let error = step.error.as_deref().unwrap_or_default();
    assert!(
        error.contains("never arrived intact") && error.contains("corrupt"),
        "{error}"
    );
    assert_eq!(record.status.as_str(), "failed");
}

/// `[[[...1...]]]`, `depth` levels deep.
fn nested(depth: usize) -> Value {
    (1..depth).fold(json!(1), |inner, _| json!([inner]))
}

#[tokio::test]
async fn data_nested_deeper_than_agents_can_parse_is_refused_by_name() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let error = client::submit(&coordinator, FEATURE.as_bytes(), &input(nested(101)))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::InvalidInput(m) if m.contains("the input nests 101 levels deep; the limit is 100")),
        "{error}"
    );

    let mut worker = FakeWorker::connect(&coordinator, "w", &["planner"]).await;
    let run_id = start(&coordinator, "dark mode").await;
    let plan = worker.next_task();
    worker_service::answer(
        &coordinator,
        "w",
        TaskResult {
            task_id: plan.task_id.clone(),
            outcome: Some(task_result::Outcome::Data(input(nested(101)))),
            notes: None,
            non_retryable: false,
            usage: Vec::new(),
        },
    )
    .await
    .unwrap_err();
    let record = coordinator.record(&run_id).await.unwrap();
    let step = record.steps.iter().find(|s| s.step_id == "plan").unwrap();
    assert_eq!(step.status.as_str(), "failed");
    let error = step.error.as_deref().unwrap_or_default();
    assert!(
        error.contains("the result nests 101 levels deep"),
        "{error}"
    );
}

/// A client that retries SubmitRun with its idempotency key gets its first run back.
#[tokio::test]
async fn the_same_idempotency_key_and_request_give_the_same_run() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["planner"]).await;
    let first = submit_keyed(&coordinator, "toggle", "order-42")
        .await
        .unwrap();
    assert!(!first.existing);
    let again = submit_keyed(&coordinator, "toggle", "order-42")
        .await
        .unwrap();
    assert_eq!(again.run_id, first.run_id);
    assert!(again.existing);
    assert_eq!(
        coordinator
            .list(RunQuery::newest(10))
            .await
            .unwrap()
            .runs
            .len(),
        1,
        "one run"
    );
    worker.next_task();
    assert!(
        worker.try_recv().is_err(),
        "the planner was dispatched once"
    );

    // Without a key, or with another one, a new run starts.
    let other = submit_keyed(&coordinator, "toggle", "order-43")
        .await
        .unwrap();
    assert_ne!(other.run_id, first.run_id);
    assert_eq!(
        coordinator
            .list(RunQuery::newest(10))
            .await
            .unwrap()
            .runs
            .len(),
        2
    );
}

#[tokio::test]
async fn an_idempotency_key_reused_for_another_request_is_refused_naming_its_run() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let first = submit_keyed(&coordinator, "toggle", "k").await.unwrap();
    let error = submit_keyed(&coordinator, "another", "k")
        .await
        .unwrap_err();
    let status = tonic::Status::from(error);
    assert_eq!(status.code(), tonic::Code::AlreadyExists);
    assert!(
        status.message().contains(&first.run_id) && status.message().contains("\"k\""),
        "{}",
        status.message()
    );
    assert_eq!(
        coordinator
            .list(RunQuery::newest(10))
            .await
            .unwrap()
            .runs
            .len(),
        1,
        "nothing started"
    );

    let too_long = "x".repeat(257);
    let status = tonic::Status::from(
        submit_keyed(&coordinator, "toggle", &too_long)
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("idempotency_key"),
        "{}",
        status.message()
    );
}

/// A submitter that died between claiming the key and creating the run: the retry creates the
/// run under the id the key names.
#[tokio::test]
async fn a_claimed_key_whose_run_was_never_created_gets_its_run_on_retry() {
    let store = Arc::new(MemoryStore::new());
    let coordinator = running(Coordinator::new(store.clone(), Config::default()));
    // The claim the dead submitter made, with the digest of the very same request.
    let mut request = FEATURE.as_bytes().to_vec();
    request.push(0);
    request.extend_from_slice(&serde_json::to_vec(&json!("toggle")).unwrap());
    let digest = baton_proto::sha256_hex(&request);
    store
        .claim_idempotency_key("k", "01900000-0000-7000-8000-00000000000a", &digest, 60)
        .await
        .unwrap();
    let submitted = submit_keyed(&coordinator, "toggle", "k").await.unwrap();
    assert_eq!(submitted.run_id, "01900000-0000-7000-8000-00000000000a");
    assert!(!submitted.existing, "this submission started it");
    assert_eq!(
        coordinator.record(&submitted.run_id).await.unwrap().status,
        baton_core::RunStatus::Running
    );
}

#[tokio::test]
async fn a_coordinator_is_ready_until_it_drains() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    assert_eq!(coordinator.readiness().await, Ok(()));
    coordinator.shutdown().await;
    let not_ready = coordinator.readiness().await.unwrap_err();
    assert_eq!(not_ready, baton_coordinator::NotReady::Draining);
    assert!(not_ready.to_string().contains("draining"), "{not_ready}");
}
