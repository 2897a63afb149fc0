//! Stored results changed behind the coordinator's back, with raw Redis commands: a coordinator
//! that reads the run back (after a restart, so its memory does not hold the good copy) detects
//! the change, names the step, and loses nothing else.
//!
//! Each test runs a `Coordinator` on a `RedisStore` backed by its own throwaway `redis-server`
//! (`support/redis_server.rs`), with workers played by channels, then edits the run's keys
//! directly (layout: `coordinator/src/store/redis/mod.rs`).

#[path = "support/client.rs"]
mod client;
#[path = "support/fake_worker.rs"]
mod fake_worker;
#[path = "support/redis_server.rs"]
#[allow(dead_code)] // shared harness: not every helper is used here
mod redis_server;
#[path = "support/running.rs"]
mod running;

use std::collections::BTreeMap;

use ::redis::AsyncCommands;
use ::redis::aio::MultiplexedConnection;
use baton_coordinator::record::WaitingFor;
use baton_coordinator::store::redis::RedisStore;
use baton_coordinator::store::{Listing, Store};
use baton_coordinator::{Config, Coordinator, Error};
use baton_core::Decision;
use baton_proto::Json;
use baton_proto::v1::Task;
use fake_worker::{FakeWorker, json_bytes, payload};
use redis_server::RedisServer;
use running::{Running, running};
use serde_json::{Value, json};

/// plan (agent) -> approve (approval) -> code (agent).
const WITH_APPROVAL: &str = r#"{
  "id": "integrity-approval",
  "steps": [
    { "id": "plan", "type": "agent", "agent": "planner", "next": "approve" },
    { "id": "approve", "type": "approval", "message": "Go ahead?", "on_approve": "code" },
    { "id": "code", "type": "agent", "agent": "coder" }
  ]
}"#;

/// plan (agent) -> code (agent).
const PLAN_THEN_CODE: &str = r#"{
  "id": "integrity-plain",
  "steps": [
    { "id": "plan", "type": "agent", "agent": "planner", "next": "code" },
    { "id": "code", "type": "agent", "agent": "coder" }
  ]
}"#;

/// plan (agent) -> shape (transform) -> code (agent, reading the transform's output).
const WITH_TRANSFORM: &str = r#"{
  "id": "integrity-transform",
  "steps": [
    { "id": "plan", "type": "agent", "agent": "planner", "next": "shape" },
    { "id": "shape", "type": "transform", "transform": "context.plan.files", "output": "files", "next": "code" },
    { "id": "code", "type": "agent", "agent": "coder", "input": "files" }
  ]
}"#;

const AGENTS: &[&str] = &["planner", "coder"];

fn input(value: Value) -> Json {
    json_bytes(&value)
}

impl FakeWorker {
    /// Answers `task` with `data`, and `notes` if given.
    async fn answer<S: Store>(
        &self,
        coordinator: &Coordinator<S>,
        task: &Task,
        data: Value,
        notes: Option<Value>,
    ) {
        self.complete(coordinator, task, &data, notes.as_ref())
            .await
            .unwrap();
    }
}

/// The plan agent's answer: a number whose digit the tests change, and a decision, so the run
/// has a decisions hash too.
fn plan_data() -> Value {
    json!({"files": ["a.ts", "b.ts"], "estimate": 12})
}

fn plan_notes() -> Option<Value> {
    Some(json!({"decisions": [{"summary": "split the parser", "rationale": "it is too long"}]}))
}

// ---------------------------------------------------------------------------------------------
// Redis, raw

/// A coordinator's view of the test server, and a raw connection for editing it.
struct Redis {
    server: RedisServer,
    raw: MultiplexedConnection,
}

impl Redis {
    async fn start() -> Redis {
        let server = RedisServer::start();
        let raw = ::redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        Redis { server, raw }
    }

    /// A coordinator with its own connection: a restarted process shares nothing but Redis.
    async fn coordinator(&self) -> Running<RedisStore> {
        let store = RedisStore::connect(&self.server.url()).await.unwrap();
        // Short leases: a task the previous coordinator held is delivered again quickly.
        let config = Config {
            lease_ms: 300,
            sweep_interval_ms: 20,
            ..Config::default()
        };
        running(Coordinator::new(store, config))
    }

    fn con(&self) -> MultiplexedConnection {
        self.raw.clone()
    }

    async fn result(&self, run_id: &str, key: &str) -> Vec<u8> {
        let bytes: Option<Vec<u8>> = self
            .con()
            .hget(format!("baton:run:{{{run_id}}}:results"), key)
            .await
            .unwrap();
        bytes.unwrap_or_else(|| panic!("no stored result {key}"))
    }

    async fn set_result(&self, run_id: &str, key: &str, bytes: &[u8]) {
        let _: i64 = self
            .con()
            .hset(format!("baton:run:{{{run_id}}}:results"), key, bytes)
            .await
            .unwrap();
    }

    async fn header_field(&self, run_id: &str, field: &str) -> Option<String> {
        self.con()
            .hget(format!("baton:run:{{{run_id}}}"), field)
            .await
            .unwrap()
    }

    /// Every key of the run, with all it holds.
    async fn dump(&self, run_id: &str) -> BTreeMap<String, Dumped> {
        let mut con = self.con();
        let keys: Vec<String> = con.keys(format!("baton:run:{{{run_id}}}*")).await.unwrap();
        assert!(!keys.is_empty(), "run {run_id} has no keys");
        let mut dump = BTreeMap::new();
        for key in keys {
            let kind: String = ::redis::cmd("TYPE")
                .arg(&key)
                .query_async(&mut con)
                .await
                .unwrap();
            let value = match kind.as_str() {
                "hash" => Dumped::Hash(con.hgetall(&key).await.unwrap()),
                "list" => Dumped::List(con.lrange(&key, 0, -1).await.unwrap()),
                other => panic!("{key} is a {other}"),
            };
            dump.insert(key, value);
        }
        dump
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Dumped {
    Hash(BTreeMap<String, Vec<u8>>),
    List(Vec<Vec<u8>>),
}

impl Dumped {
    fn hash(&self) -> &BTreeMap<String, Vec<u8>> {
        match self {
            Dumped::Hash(fields) => fields,
            Dumped::List(_) => panic!("not a hash: {self:?}"),
        }
    }

    fn hash_mut(&mut self) -> &mut BTreeMap<String, Vec<u8>> {
        match self {
            Dumped::Hash(fields) => fields,
            Dumped::List(_) => panic!("not a hash"),
        }
    }
}

/// `bytes` with the one occurrence of `from` replaced by `to` (same length).
fn replace_once(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let found: Vec<usize> = bytes
        .windows(from.len())
        .enumerate()
        .filter(|(_, w)| *w == from)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{:?} should hold {:?} once",
        String::from_utf8_lossy(bytes),
        String::from_utf8_lossy(from)
    );
    let mut changed = bytes.to_vec();
    changed[found[0]..found[0] + from.len()].copy_from_slice(to);
    changed
}

/// Changes one byte of a JSON value so that it is still JSON, of a different value.
fn flip_one_byte(good: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let bad = replace_once(good, from, to);
    let differing = good.iter().zip(&bad).filter(|(a, b)| a != b).count();
    assert_eq!(differing, 1, "exactly one byte changes");
    let good_value: Value = serde_json::from_slice(good).unwrap();
    let bad_value: Value = serde_json::from_slice(&bad).expect("still valid JSON");
    assert_ne!(good_value, bad_value, "a different value");
    bad
}

fn failed_precondition(error: Error) -> bool {
    tonic::Status::from(error).code() == tonic::Code::FailedPrecondition
}

// ---------------------------------------------------------------------------------------------
// Runs

/// Submits `workflow` and answers plan; returns the run id. The worker is left connected.
async fn run_past_plan(coordinator: &Coordinator<RedisStore>, workflow: &str) -> String {
    let run_id = client::submit(coordinator, workflow.as_bytes(), &input(json!("dark mode")))
        .await
        .unwrap();
    let mut worker = FakeWorker::connect(coordinator, "w1", AGENTS).await;
    let plan = worker.next_task();
    assert_eq!(plan.step_id, "plan");
    worker
        .answer(coordinator, &plan, plan_data(), plan_notes())
        .await;
    run_id
}

/// A run of [`WITH_APPROVAL`] waiting at its approval, on a coordinator that is then dropped.
async fn run_waiting_at_approval(redis: &Redis) -> String {
    let first = redis.coordinator().await;
    let run_id = run_past_plan(&first, WITH_APPROVAL).await;
    let record = first.record(&run_id).await.unwrap();
    assert_eq!(record.status.as_str(), "running");
    assert_eq!(record.waiting.len(), 1);
    assert!(matches!(record.waiting[0], WaitingFor::Approval { .. }));
    run_id
}

/// A finished run of `workflow` (answering every agent), on a coordinator that is then dropped.
async fn finished_run(redis: &Redis, workflow: &str) -> String {
    finished_run_with(redis, workflow, json!({"written": ["a.ts"], "lines": 345})).await
}

/// [`finished_run`] with the coder answering `code_data`.
async fn finished_run_with(redis: &Redis, workflow: &str, code_data: Value) -> String {
    let first = redis.coordinator().await;
    let run_id = client::submit(&first, workflow.as_bytes(), &input(json!("dark mode")))
        .await
        .unwrap();
    let mut worker = FakeWorker::connect(&first, "w1", AGENTS).await;
    let plan = worker.next_task();
    worker
        .answer(&first, &plan, plan_data(), plan_notes())
        .await;
    if workflow == WITH_APPROVAL {
        first
            .decide(&run_id, "approve", Decision::approve())
            .await
            .unwrap();
    }
    let code = worker.next_task();
    assert_eq!(code.step_id, "code");
    worker.answer(&first, &code, code_data, None).await;
    assert_eq!(
        first.record(&run_id).await.unwrap().status.as_str(),
        "succeeded"
    );
    run_id
}

/// A running run whose `plan#1` is changed by `corrupt`: a restarted coordinator stops it with
/// an integrity error naming plan, verify says the same with `problem_says`, and the only
/// changes to the run's keys are the corrupted result and the header's status.
async fn running_run_with_corrupt_plan(corrupt: impl Fn(&[u8]) -> Vec<u8>, problem_says: &str) {
    let redis = Redis::start().await;
    let run_id = run_waiting_at_approval(&redis).await;
    let before = redis.dump(&run_id).await;
    assert!(
        before.contains_key(&format!("baton:run:{{{run_id}}}:decisions")),
        "the plan's decision is stored, so its keeping is checked too: {before:?}"
    );

    let good = redis.result(&run_id, "plan#1").await;
    let bad = corrupt(&good);
    redis.set_result(&run_id, "plan#1", &bad).await;

    // A restart: the new coordinator knows the run from Redis alone.
    let second = redis.coordinator().await;
    let record = second.record(&run_id).await.unwrap();
    assert_eq!(record.status.as_str(), "failed", "{record:?}");
    assert!(
        record.error.contains("integrity") && record.error.contains("step \"plan\""),
        "{}",
        record.error
    );

    let verified = second.verify(&run_id).await.unwrap();
    assert!(!verified.ok, "{verified:?}");
    assert_eq!(
        (verified.step_id.as_str(), verified.visit),
        ("plan", 1),
        "{verified:?}"
    );
    assert!(
        verified.problem.contains(problem_says),
        "{}",
        verified.problem
    );
    assert_eq!(verified.links, 0, "no link holds before plan's");

    // Counted once: the run was read back once (verify reads the store but counts nothing).
    assert_eq!(second.stats().integrity_failures, 1);

    let refused = second
        .decide(&run_id, "approve", Decision::approve())
        .await
        .unwrap_err();
    // Reading the stopped run back again (decide did) does not count it again.
    second.record(&run_id).await.unwrap();
    assert_eq!(second.stats().integrity_failures, 1);
    assert!(
        matches!(refused, Error::RunFinished { .. }),
        "the run is over: {refused}"
    );
    assert!(failed_precondition(refused));

    // Nothing runs for it any more.
    let mut worker = FakeWorker::connect(&second, "w2", AGENTS).await;
    assert!(worker.has_nothing(), "no task of a stopped run is sent");
    assert!(
        !second
            .store()
            .active_runs()
            .await
            .unwrap()
            .contains(&run_id),
        "a stopped run is not active"
    );

    // Stored: the changed byte(s), the header's status, error, updated_ms and version (with the
    // ids of the last writes, which move with it), and no tasks; the rest byte for byte as it
    // was.
    let after = redis.dump(&run_id).await;
    let header_key = format!("baton:run:{{{run_id}}}");
    let header_before = before[&header_key].hash();
    let header_after = after[&header_key].hash();
    assert_eq!(header_after["status"], b"failed");
    assert_eq!(header_after["error"], record.error.as_bytes());
    assert!(!header_before.contains_key("error"));
    let version = |h: &BTreeMap<String, Vec<u8>>| -> u64 {
        String::from_utf8_lossy(&h["version"]).parse().unwrap()
    };
    assert_eq!(version(header_after), version(header_before) + 1);
    let mut expected = before.clone();
    expected
        .get_mut(&format!("baton:run:{{{run_id}}}:results"))
        .unwrap()
        .hash_mut()
        .insert("plan#1".into(), bad);
    expected.remove(&format!("baton:run:{{{run_id}}}:tasks"));
    let mut after_rest = after.clone();
    for dump in [&mut expected, &mut after_rest] {
        let header = dump.get_mut(&header_key).unwrap().hash_mut();
        for field in ["status", "error", "updated_ms", "version", "writes"] {
            header.remove(field);
        }
    }
    assert_eq!(after_rest, expected);
}

// ---------------------------------------------------------------------------------------------
// Tests

#[tokio::test]
async fn a_changed_byte_in_a_running_runs_result_stops_it_naming_the_step_and_loses_nothing_else() {
    running_run_with_corrupt_plan(
        |good| flip_one_byte(good, b"12", b"13"),
        "its stored data hashes to",
    )
    .await;
}

#[tokio::test]
async fn a_stored_result_that_is_no_longer_json_stops_the_run_naming_the_step() {
    running_run_with_corrupt_plan(
        |good| {
            let truncated = good[..good.len() - 3].to_vec();
            assert!(serde_json::from_slice::<Value>(&truncated).is_err());
            truncated
        },
        "cannot be read",
    )
    .await;
}

#[tokio::test]
async fn a_changed_result_of_a_finished_run_is_reported_and_nothing_stored_changes() {
    let redis = Redis::start().await;
    let run_id = finished_run(&redis, PLAN_THEN_CODE).await;
    let before = redis.dump(&run_id).await;
    let good = redis.result(&run_id, "code#1").await;
    let bad = flip_one_byte(&good, b"345", b"346");
    redis.set_result(&run_id, "code#1", &bad).await;

    let second = redis.coordinator().await;
    let verified = second.verify(&run_id).await.unwrap();
    assert!(!verified.ok, "{verified:?}");
    assert_eq!((verified.step_id.as_str(), verified.visit), ("code", 1));
    assert!(
        verified.problem.contains("its stored data hashes to"),
        "{}",
        verified.problem
    );
    assert_eq!(verified.links, 1, "plan's link still holds");

    let record = second.record(&run_id).await.unwrap();
    assert!(
        record.error.contains("integrity") && record.error.contains("step \"code\""),
        "{}",
        record.error
    );
    // The record keeps the status the store holds (nothing stored changes), with the error.
    assert_eq!(record.status.as_str(), "succeeded");
    // Every GetRun reads a finished run back; the same mismatch is counted once.
    second.record(&run_id).await.unwrap();
    assert_eq!(second.stats().integrity_failures, 1);

    // A finished run is reported, not rewritten.
    assert_eq!(
        redis.header_field(&run_id, "status").await.as_deref(),
        Some("succeeded")
    );
    let mut expected = before;
    expected
        .get_mut(&format!("baton:run:{{{run_id}}}:results"))
        .unwrap()
        .hash_mut()
        .insert("code#1".into(), bad);
    assert_eq!(redis.dump(&run_id).await, expected);
}

#[tokio::test]
async fn a_changed_transform_copy_is_recomputed_counted_and_reported_without_stopping_the_run() {
    let redis = Redis::start().await;
    let first = redis.coordinator().await;
    let run_id = run_past_plan(&first, WITH_TRANSFORM).await;
    drop(first);
    let good = redis.result(&run_id, "shape#1").await;
    let bad = flip_one_byte(&good, b"a.ts", b"c.ts");
    redis.set_result(&run_id, "shape#1", &bad).await;

    let second = redis.coordinator().await;
    let record = second.record(&run_id).await.unwrap();
    assert_eq!(second.stats().integrity_failures, 1, "counted");
    assert_eq!(
        (record.status.as_str(), record.error.as_str()),
        ("running", ""),
        "not stopped"
    );

    // The replay recomputed the transform: code gets the good value, not the stored copy.
    let mut worker = FakeWorker::connect(&second, "w2", AGENTS).await;
    let code = worker.wait_task().await;
    assert_eq!(code.step_id, "code");
    assert_eq!(payload(&code)["files"], json!(["a.ts", "b.ts"]));
    worker
        .answer(&second, &code, json!({"written": ["a.ts"]}), None)
        .await;
    assert_eq!(
        redis.header_field(&run_id, "status").await.as_deref(),
        Some("succeeded")
    );
    assert_eq!(second.stats().integrity_failures, 1);

    let verified = second.verify(&run_id).await.unwrap();
    assert!(!verified.ok, "{verified:?}");
    assert_eq!((verified.step_id.as_str(), verified.visit), ("shape", 1));
    assert!(
        verified.problem.contains("stored copy"),
        "{}",
        verified.problem
    );
    assert_eq!(verified.links, 3, "every link holds: plan, shape, code");
}

#[tokio::test]
async fn an_intact_run_verifies_after_a_restart() {
    let redis = Redis::start().await;
    let run_id = run_waiting_at_approval(&redis).await;

    let second = redis.coordinator().await;
    let verified = second.verify(&run_id).await.unwrap();
    let record = second.record(&run_id).await.unwrap();
    assert!(verified.ok, "{verified:?}");
    assert_eq!(
        (
            verified.problem.as_str(),
            verified.step_id.as_str(),
            verified.visit
        ),
        ("", "", 0)
    );
    assert_eq!(verified.links, 1, "plan settled; the approval waits");
    assert_eq!(verified.state_sha256, record.state_sha256);
    assert_eq!(record.status.as_str(), "running");

    // Carried on to the end by the restarted coordinator, it still verifies.
    let mut worker = FakeWorker::connect(&second, "w2", AGENTS).await;
    second
        .decide(&run_id, "approve", Decision::approve())
        .await
        .unwrap();
    let code = worker.next_task();
    worker
        .answer(&second, &code, json!({"written": ["a.ts"]}), None)
        .await;
    let third = redis.coordinator().await;
    let verified = third.verify(&run_id).await.unwrap();
    let record = third.record(&run_id).await.unwrap();
    assert!(verified.ok, "{verified:?}");
    assert_eq!(record.status.as_str(), "succeeded");
    let settled_visits: u32 = record.steps.iter().map(|s| s.visits).sum();
    assert_eq!(settled_visits, 3);
    assert_eq!(verified.links, settled_visits);
    let chain_length: u32 = redis
        .con()
        .llen(format!("baton:run:{{{run_id}}}:chain"))
        .await
        .unwrap();
    assert_eq!(chain_length, settled_visits);
    assert_eq!(verified.state_sha256, record.state_sha256);
    assert_eq!(third.stats().integrity_failures, 0);
    assert_eq!(second.stats().integrity_failures, 0);
}

#[tokio::test]
async fn a_changed_chain_link_is_named_by_its_step() {
    let redis = Redis::start().await;
    let run_id = finished_run(&redis, WITH_APPROVAL).await;
    let chain_key = format!("baton:run:{{{run_id}}}:chain");
    let mut con = redis.con();
    let links: Vec<Vec<u8>> = con.lrange(&chain_key, 0, -1).await.unwrap();
    assert_eq!(links.len(), 3);
    let mut link: Value = serde_json::from_slice(&links[1]).unwrap();
    assert_eq!(link["step_id"], "approve");
    let state = link["state_sha256"].as_str().unwrap().to_owned();
    let other = format!(
        "{}{}",
        &state[..63],
        if state.ends_with('0') { "1" } else { "0" }
    );
    link["state_sha256"] = json!(other);
    let _: () = con
        .lset(&chain_key, 1, serde_json::to_vec(&link).unwrap())
        .await
        .unwrap();

    let second = redis.coordinator().await;
    let verified = second.verify(&run_id).await.unwrap();
    assert!(!verified.ok, "{verified:?}");
    assert_eq!((verified.step_id.as_str(), verified.visit), ("approve", 1));
    assert!(verified.problem.contains("link 1"), "{}", verified.problem);
    assert_eq!(verified.links, 1, "plan's link still holds");

    let record = second.record(&run_id).await.unwrap();
    assert!(
        record.error.contains("integrity") && record.error.contains("step \"approve\""),
        "{}",
        record.error
    );
    assert_eq!(
        redis.header_field(&run_id, "status").await.as_deref(),
        Some("succeeded")
    );
}

/// A 64-bit id is beyond what an IEEE-754 double holds exactly; a changed digit is still caught.
#[tokio::test]
async fn a_changed_digit_of_a_large_integer_is_caught() {
    let redis = Redis::start().await;
    let run_id =
        finished_run_with(&redis, PLAN_THEN_CODE, json!({"id": 12345678901234567u64})).await;
    let good = redis.result(&run_id, "code#1").await;
    let bad = flip_one_byte(&good, b"12345678901234567", b"12345678901234568");
    redis.set_result(&run_id, "code#1", &bad).await;
    let verified = redis.coordinator().await.verify(&run_id).await.unwrap();
    assert!(!verified.ok, "{verified:?}");
    assert_eq!((verified.step_id.as_str(), verified.visit), ("code", 1));
}

/// Decisions and handoffs are stamped with the time their event was applied at: a changed time
/// in the event log is a changed outcome.
#[tokio::test]
async fn a_changed_event_time_is_caught_and_names_its_step() {
    let redis = Redis::start().await;
    let run_id = finished_run(&redis, PLAN_THEN_CODE).await;
    let events_key = format!("baton:run:{{{run_id}}}:events");
    let mut con = redis.con();
    // The log begins with how the run started; the planner's answer is next.
    let first: Vec<u8> = con.lindex(&events_key, 1).await.unwrap();
    let mut event: Value = serde_json::from_slice(&first).unwrap();
    assert_eq!(event["task"]["step_id"], "plan");
    event["at_ms"] = json!(event["at_ms"].as_i64().unwrap() + 1);
    let _: () = con
        .lset(&events_key, 1, serde_json::to_vec(&event).unwrap())
        .await
        .unwrap();
    let verified = redis.coordinator().await.verify(&run_id).await.unwrap();
    assert!(!verified.ok, "{verified:?}");
    assert_eq!((verified.step_id.as_str(), verified.visit), ("plan", 1));
}

/// An event that no longer reads stops the run like a changed result: failed, named, counted.
#[tokio::test]
async fn an_unreadable_event_stops_the_run_and_is_counted() {
    let redis = Redis::start().await;
    let run_id = run_waiting_at_approval(&redis).await;
    let events_key = format!("baton:run:{{{run_id}}}:events");
    let _: () = redis
        .con()
        .lset(&events_key, 0, b"{\"event\": \"agent_succ".to_vec())
        .await
        .unwrap();
    let second = redis.coordinator().await;
    let record = second.record(&run_id).await.unwrap();
    assert_eq!(record.status.as_str(), "failed");
    assert!(
        record
            .error
            .contains("integrity error: event 0 cannot be read"),
        "{}",
        record.error
    );
    assert_eq!(second.stats().integrity_failures, 1);
    assert_eq!(
        redis.header_field(&run_id, "status").await.as_deref(),
        Some("failed")
    );
    assert!(!second.verify(&run_id).await.unwrap().ok);
}

/// The decision index serves searches; verify checks it against the decisions the chain holds.
#[tokio::test]
async fn a_changed_decision_in_the_index_is_reported_by_verify() {
    let redis = Redis::start().await;
    let run_id = finished_run(&redis, PLAN_THEN_CODE).await;
    let key = format!("baton:run:{{{run_id}}}:decisions");
    let mut con = redis.con();
    let stored: Vec<u8> = con.hget(&key, "plan#1/0").await.unwrap();
    let mut decision: Value = serde_json::from_slice(&stored).unwrap();
    decision["summary"] = json!("keep the parser whole");
    let _: () = con
        .hset(&key, "plan#1/0", serde_json::to_vec(&decision).unwrap())
        .await
        .unwrap();
    let verified = redis.coordinator().await.verify(&run_id).await.unwrap();
    assert!(!verified.ok, "{verified:?}");
    assert_eq!((verified.step_id.as_str(), verified.visit), ("plan", 1));
    assert!(
        verified.problem.contains("decision plan#1/0"),
        "{}",
        verified.problem
    );
}
