//! One conformance suite for every [`Store`]: each case is written once, generic over the store,
//! and `conformance!` runs it against a `MemoryStore`, against a `RedisStore` on its own
//! throwaway `redis-server` (see `support/redis_server.rs`), and against a `RedisStore` on a real
//! Redis Cluster of 3 masters and 3 replicas (`support/redis_cluster.rs`; one cluster for the
//! whole binary, each case under its own key prefix). The Redis cases are never skipped.
//! The cases follow the contract on the store's traits. A few Redis-only cases at the end check
//! the key layout.

#[path = "support/redis_cluster.rs"]
#[allow(dead_code)] // shared harness: not every helper is used here
mod redis_cluster;
#[path = "support/redis_server.rs"]
#[allow(dead_code)] // shared harness: not every helper is used here
mod redis_server;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use baton_coordinator::store::memory::MemoryStore;
use baton_coordinator::store::redis::RedisStore;
use baton_coordinator::store::{
    Claim, Coordination, DueTask, Error, Listing, LiveOutput, MIN_SCAN_BUDGET, OUTPUT_MAX_BYTES,
    OutputOffset, OutputPiece, RunCursor, RunHeader, RunQuery, RunSummary, Runs, Settled, Store,
    StoredRun, TaskSwap, Tasks, TransitionWrite, WRITES_KEPT, new_write_id, scan_budget,
};
use baton_core::RunStatus;
use redis_server::RedisServer;

/// Runs each case against both stores. Attributes before a case (``) go on
/// both of its tests.
macro_rules! conformance {
    ($($(#[$attr:meta])* $case:ident),+ $(,)?) => {
        mod memory_store {
            use super::*;
            $(
                $(#[$attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    super::$case(Arc::new(MemoryStore::new())).await;
                }
            )+
        }

        mod redis_store {
            use super::*;
            $(
                $(#[$attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let server = RedisServer::start();
                    let store = RedisStore::connect_with_prefix(&server.url(), "conformance")
                        .await
                        .expect("connect to the test redis-server");
                    super::$case(Arc::new(store)).await;
                    drop(server);
                }
            )+
        }

        mod redis_cluster_store {
            use super::*;
            $(
                $(#[$attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let cluster = tokio::task::spawn_blocking(redis_cluster::RedisCluster::shared)
                        .await
                        .expect("start the shared Redis Cluster");
                    // Every node's URL, as `--redis` takes them for a cluster.
                    let store = RedisStore::connect_with_prefix(
                        &cluster.comma_urls(),
                        concat!("conformance-", stringify!($case)),
                    )
                    .await
                    .expect("connect to the test Redis Cluster");
                    assert!(store.is_cluster(), "several node URLs make a cluster store");
                    super::$case(Arc::new(store)).await;
                }
            )+
        }
    };
}

conformance! {
    create_then_load,
    a_principal_s_running_runs_are_counted_until_they_end,
    create_twice_is_already_exists,
    apply_at_the_right_version,
    apply_at_a_stale_version_is_conflict,
    apply_to_a_missing_run_is_not_found,
    rewriting_a_result,
    swap_tasks_only_replace_existing_tasks,
    swap_tasks_compares_exact_bytes_and_moves_timers,
    due_tasks_are_earliest_first_limited_and_per_agent,
    transitions_move_timers_with_tasks,
    fenced_transitions_apply_only_at_the_current_attempt,
    transitions_written_together_apply_in_order,
    task_and_version_read_one_task_and_the_version,

    due_tasks_take_any_limit,

    only_an_integer_due_ms_makes_a_timer,

    a_fenced_first_transition_creates_nothing,
    a_settled_create_is_found_or_voided_for_good,
    a_settled_transition_is_found_or_fenced_for_good,
    a_settle_remembers_only_the_last_writes,
    a_voided_run_s_idempotency_key_is_reclaimed,
    list_runs_newest_first_and_limited,
    list_runs_pages_walk_every_run_once_in_order,
    list_runs_pages_through_runs_crowded_in_one_index_shard,
    list_runs_filter_by_status_and_workflow,
    a_status_filter_over_many_other_runs_gives_a_short_page_that_goes_on,
    an_unknown_cursor_or_workflow_gives_an_empty_page,
    active_runs_follow_status,
    concurrent_appliers_one_wins,
    chain_links_append_and_decisions_keep_their_first_write,
    runs_of_workflow_newest_first_and_limited,
    idempotency_keys_are_claimed_once_until_they_expire,
    free_slots_are_summed_over_the_other_coordinators_until_they_expire,
    a_ping_answers_while_the_store_is_there,
    output_appends_in_order_only_while_the_run_runs,
    output_keeps_the_newest_bytes,
    wait_output_returns_what_comes_and_waits_for_it,
}

// ---------------------------------------------------------------------------------------------
// Fixtures

/// Every byte value, protocol-looking bytes, and invalid UTF-8.
fn binary() -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..=255u8).collect();
    bytes.extend_from_slice(b"\r\n*1\r\n$4\r\nPING\r\n\0{x}\xff\xfe");
    bytes
}

fn json(text: &str) -> Vec<u8> {
    text.as_bytes().to_vec()
}

/// A transition's results, as the store takes them (shared bytes).
fn result_bytes(pairs: Vec<(String, Vec<u8>)>) -> Vec<(String, bytes::Bytes)> {
    pairs
        .into_iter()
        .map(|(key, value)| (key, value.into()))
        .collect()
}

fn header(run_id: &str, created_ms: i64) -> RunHeader {
    RunHeader {
        run_id: run_id.to_owned(),
        workflow_id: format!("wf-{run_id}"),
        workflow: "name: review\nsteps:\n  - id: plan # résumé ✓ {braces}\n".to_owned(),
        input: binary(),
        created_ms,
        traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        submitted_by: "ci".to_owned(),
    }
}

/// A first transition: one queued step and its task, running.
fn start(created_ms: i64) -> TransitionWrite {
    TransitionWrite {
        events: vec![],
        results: Vec::new(),
        steps: vec![("plan".to_owned(), json(r#"{"state":"queued"}"#))],
        tasks_set: vec![("plan#1".to_owned(), json(r#"{"worker":null}"#))],
        tasks_removed: Vec::new(),
        links: Vec::new(),
        decisions: Vec::new(),
        status: "running".to_owned(),
        error: None,
        state_sha256: "0".repeat(64),
        updated_ms: created_ms,
        fences: Vec::new(),
        write_id: String::new(),
    }
}

/// A transition that only changes status (and appends `event`).
fn status_write(status: &str, event: &str, updated_ms: i64) -> TransitionWrite {
    TransitionWrite {
        events: vec![json(event)],
        status: status.to_owned(),
        state_sha256: format!("{updated_ms:064}"),
        updated_ms,
        ..TransitionWrite::default()
    }
}

async fn load<S: Store>(store: &S, run_id: &str) -> StoredRun {
    store
        .load_run(run_id)
        .await
        .expect("load_run")
        .unwrap_or_else(|| panic!("run {run_id} should exist"))
}

async fn create<S: Store>(store: &S, run_id: &str, created_ms: i64, first: TransitionWrite) {
    store
        .create_run(header(run_id, created_ms), first)
        .await
        .unwrap_or_else(|err| panic!("create {run_id}: {err}"));
}

/// The newest `limit` runs, unfiltered: the first page of `list_runs`.
async fn newest<S: Store>(store: &S, limit: usize) -> Vec<RunSummary> {
    store
        .list_runs(RunQuery::newest(limit))
        .await
        .expect("list_runs")
        .runs
}

/// Every page of `query`, from its `after` on, following `next` until it is `None`; checks
/// each page's length and that its `next` is not before its last run.
async fn every_page<S: Store>(store: &S, mut query: RunQuery) -> Vec<RunSummary> {
    let mut listed = Vec::new();
    for _ in 0..10_000 {
        let page = store.list_runs(query.clone()).await.expect("list_runs");
        assert!(page.runs.len() <= query.limit, "{query:?}: {page:?}");
        // Each run strictly after the one before it, the first after the cursor.
        let mut before = query.after.clone();
        for run in &page.runs {
            let at = RunCursor::of(run);
            assert!(
                before.is_none_or(|before| at < before),
                "{query:?}: {page:?}"
            );
            before = Some(at);
        }
        if let (Some(next), Some(last)) = (&page.next, page.runs.last()) {
            assert!(*next <= RunCursor::of(last), "{query:?}: {page:?}");
        }
        listed.extend(page.runs);
        match page.next {
            Some(next) => query.after = Some(next),
            None => return listed,
        }
    }
    panic!("{query:?}: the pages do not end");
}

/// A run as a test expects to list it: id, workflow id, status, creation time.
type Listed = (String, String, String, i64);

fn listed(runs: &[RunSummary]) -> Vec<Listed> {
    runs.iter()
        .map(|run| {
            (
                run.run_id.clone(),
                run.workflow_id.clone(),
                run.status.clone(),
                run.created_ms,
            )
        })
        .collect()
}

/// `runs` that match `status` and `workflow_id`, newest first (ties by descending run id).
fn expected(runs: &[Listed], status: Option<RunStatus>, workflow_id: Option<&str>) -> Vec<Listed> {
    let mut matching: Vec<Listed> = runs
        .iter()
        .filter(|(_, workflow, run_status, _)| {
            status.is_none_or(|status| run_status == status.as_str())
                && workflow_id.is_none_or(|workflow_id| workflow == workflow_id)
        })
        .cloned()
        .collect();
    matching.sort_by(|a, b| (b.3, &b.0).cmp(&(a.3, &a.0)));
    matching
}

/// Creates a run of `workflow_id` with `status` from its first transition on.
async fn create_in<S: Store>(
    store: &S,
    run_id: &str,
    created_ms: i64,
    workflow_id: &str,
    status: &str,
) {
    let header = RunHeader {
        workflow_id: workflow_id.to_owned(),
        ..header(run_id, created_ms)
    };
    let first = TransitionWrite {
        status: status.to_owned(),
        ..start(created_ms)
    };
    store
        .create_run(header, first)
        .await
        .unwrap_or_else(|err| panic!("create {run_id}: {err}"));
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

fn strings(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|id| id.to_string()).collect()
}

/// A time in milliseconds like the coordinator's, to check that timers keep every digit.
const T: i64 = 1_700_000_000_000;

/// A task with a timer: `agent`'s task at `attempt`, due at `due_ms`.
fn timed(agent: &str, attempt: u32, due_ms: i64) -> Vec<u8> {
    json(&format!(
        r#"{{"agent":"{agent}","attempt":{attempt},"due_ms":{due_ms},"worker":"w1"}}"#
    ))
}

fn swap(run_id: &str, task_key: &str, expected: Vec<u8>, new: Option<Vec<u8>>) -> TaskSwap {
    TaskSwap {
        run_id: run_id.to_owned(),
        task_key: task_key.to_owned(),
        expected,
        new,
    }
}

fn due_task(run_id: &str, task_key: &str, task: Vec<u8>) -> DueTask {
    DueTask {
        run_id: run_id.to_owned(),
        task_key: task_key.to_owned(),
        task,
    }
}

/// The keys of `agent`'s due tasks, `"<run id>/<task key>"`, in the order `due_tasks` gives them.
async fn due_keys<S: Store>(store: &S, agent: &str, now_ms: i64) -> Vec<String> {
    store
        .due_tasks(agent, now_ms, 100)
        .await
        .expect("due_tasks")
        .into_iter()
        .map(|due| format!("{}/{}", due.run_id, due.task_key))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Cases

async fn create_then_load<S: Store>(store: Arc<S>) {
    assert!(store.load_run("run-1").await.unwrap().is_none());

    // A start transition with no event and no error.
    let first = TransitionWrite {
        events: vec![],
        results: result_bytes(vec![("seed#1".to_owned(), binary())]),
        steps: vec![
            ("plan".to_owned(), json(r#"{"state":"queued"}"#)),
            ("review".to_owned(), json(r#"{"state":"waiting"}"#)),
        ],
        tasks_set: vec![("plan#1".to_owned(), json(r#"{"worker":null}"#))],
        tasks_removed: Vec::new(),
        links: vec![json(r#"{"link":0}"#), binary()],
        decisions: vec![("plan#1/0".to_owned(), binary())],
        status: "running".to_owned(),
        error: None,
        state_sha256: "a".repeat(64),
        updated_ms: 1_700_000_000_005,
        fences: Vec::new(),
        write_id: String::new(),
    };
    store
        .create_run(header("run-1", 1_700_000_000_000), first)
        .await
        .unwrap();
    assert_eq!(
        load(&*store, "run-1").await,
        StoredRun {
            header: header("run-1", 1_700_000_000_000),
            version: 1,
            status: "running".to_owned(),
            error: None,
            state_sha256: "a".repeat(64),
            updated_ms: 1_700_000_000_005,
            events: Vec::new(),
            results: HashMap::from([("seed#1".to_owned(), binary())]),
            steps: BTreeMap::from([
                ("plan".to_owned(), json(r#"{"state":"queued"}"#)),
                ("review".to_owned(), json(r#"{"state":"waiting"}"#)),
            ]),
            tasks: BTreeMap::from([("plan#1".to_owned(), json(r#"{"worker":null}"#))]),
            links: vec![json(r#"{"link":0}"#), binary()],
        }
    );
    assert_eq!(
        store.decisions("run-1").await.unwrap(),
        BTreeMap::from([("plan#1/0".to_owned(), binary())])
    );

    // Empty values, a binary event and an error in the first transition.
    let empty_header = RunHeader {
        run_id: "run-2".to_owned(),
        workflow_id: String::new(),
        workflow: String::new(),
        input: Vec::new(),
        created_ms: -5,
        traceparent: String::new(),
        submitted_by: String::new(),
    };
    let first = TransitionWrite {
        events: vec![binary()],
        results: result_bytes(vec![("empty#1".to_owned(), Vec::new())]),
        steps: vec![("plan".to_owned(), Vec::new())],
        tasks_set: Vec::new(),
        tasks_removed: Vec::new(),
        links: Vec::new(),
        decisions: Vec::new(),
        status: "failed".to_owned(),
        error: Some("boom\r\nsecond line ✗".to_owned()),
        state_sha256: String::new(),
        updated_ms: 0,
        fences: Vec::new(),
        write_id: String::new(),
    };
    store.create_run(empty_header.clone(), first).await.unwrap();
    assert_eq!(
        load(&*store, "run-2").await,
        StoredRun {
            header: empty_header,
            version: 1,
            status: "failed".to_owned(),
            error: Some("boom\r\nsecond line ✗".to_owned()),
            state_sha256: String::new(),
            updated_ms: 0,
            events: vec![binary()],
            results: HashMap::from([("empty#1".to_owned(), Vec::new())]),
            steps: BTreeMap::from([("plan".to_owned(), Vec::new())]),
            tasks: BTreeMap::new(),
            links: Vec::new(),
        }
    );

    // An empty error is still an error: `Some("")` is not `None`.
    let first = TransitionWrite {
        error: Some(String::new()),
        ..start(7)
    };
    store.create_run(header("run-3", 7), first).await.unwrap();
    assert_eq!(load(&*store, "run-3").await.error, Some(String::new()));

    assert!(store.load_run("run-4").await.unwrap().is_none());
}

async fn create_twice_is_already_exists<S: Store>(store: Arc<S>) {
    create(&*store, "run-1", 100, start(100)).await;
    let before = load(&*store, "run-1").await;

    let other_header = RunHeader {
        workflow_id: "another".to_owned(),
        input: json("{}"),
        ..header("run-1", 999)
    };
    let other_first = TransitionWrite {
        events: vec![json(r#"{"type":"started"}"#)],
        results: result_bytes(vec![("x#1".to_owned(), json("1"))]),
        status: "failed".to_owned(),
        error: Some("no".to_owned()),
        ..start(999)
    };
    match store.create_run(other_header, other_first).await {
        Err(Error::AlreadyExists(run_id)) => assert_eq!(run_id, "run-1"),
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    assert_eq!(load(&*store, "run-1").await, before);
    let listed = newest(&*store, 10).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].workflow_id, "wf-run-1");
    assert_eq!(listed[0].created_ms, 100);
    assert_eq!(store.active_runs().await.unwrap(), strings(&["run-1"]));
}

async fn apply_at_the_right_version<S: Store>(store: Arc<S>) {
    let first = TransitionWrite {
        steps: vec![("plan".to_owned(), json(r#"{"state":"queued"}"#))],
        tasks_set: vec![
            ("plan#1".to_owned(), json(r#"{"worker":null}"#)),
            ("audit#1".to_owned(), json(r#"{"worker":"w2"}"#)),
        ],
        ..start(100)
    };
    create(&*store, "run-1", 100, first).await;

    // Finish `plan`, queue `review`.
    let write = TransitionWrite {
        events: vec![json(r#"{"type":"step_done","step":"plan"}"#)],
        results: result_bytes(vec![("plan#1".to_owned(), binary())]),
        steps: vec![
            ("plan".to_owned(), json(r#"{"state":"done"}"#)),
            ("review".to_owned(), json(r#"{"state":"queued"}"#)),
        ],
        tasks_set: vec![("review#1".to_owned(), json(r#"{"worker":null}"#))],
        tasks_removed: vec!["plan#1".to_owned()],
        links: Vec::new(),
        decisions: Vec::new(),
        status: "running".to_owned(),
        error: None,
        state_sha256: "b".repeat(64),
        updated_ms: 200,
        fences: Vec::new(),
        write_id: String::new(),
    };
    assert_eq!(store.apply_transition("run-1", 1, write).await.unwrap(), 2);
    assert_eq!(
        load(&*store, "run-1").await,
        StoredRun {
            header: header("run-1", 100),
            version: 2,
            status: "running".to_owned(),
            error: None,
            state_sha256: "b".repeat(64),
            updated_ms: 200,
            events: vec![json(r#"{"type":"step_done","step":"plan"}"#)],
            results: HashMap::from([("plan#1".to_owned(), binary())]),
            steps: BTreeMap::from([
                ("plan".to_owned(), json(r#"{"state":"done"}"#)),
                ("review".to_owned(), json(r#"{"state":"queued"}"#)),
            ]),
            tasks: BTreeMap::from([
                ("audit#1".to_owned(), json(r#"{"worker":"w2"}"#)),
                ("review#1".to_owned(), json(r#"{"worker":null}"#)),
            ]),
            links: Vec::new(),
        }
    );

    // `review` fails the run: results merge, the error is set, the last tasks go.
    let write = TransitionWrite {
        events: vec![json(r#"{"type":"step_failed","step":"review"}"#)],
        results: result_bytes(vec![("review#1".to_owned(), json(r#"{"ok":false}"#))]),
        steps: vec![("review".to_owned(), json(r#"{"state":"failed"}"#))],
        tasks_set: Vec::new(),
        tasks_removed: vec!["review#1".to_owned(), "audit#1".to_owned()],
        links: Vec::new(),
        decisions: Vec::new(),
        status: "failed".to_owned(),
        error: Some("review failed".to_owned()),
        state_sha256: "c".repeat(64),
        updated_ms: 300,
        fences: Vec::new(),
        write_id: String::new(),
    };
    assert_eq!(store.apply_transition("run-1", 2, write).await.unwrap(), 3);
    let run = load(&*store, "run-1").await;
    assert_eq!(run.version, 3);
    assert_eq!(run.status, "failed");
    assert_eq!(run.error.as_deref(), Some("review failed"));
    assert_eq!(run.state_sha256, "c".repeat(64));
    assert_eq!(run.updated_ms, 300);
    assert_eq!(run.events.len(), 2);
    assert_eq!(
        run.events[1],
        json(r#"{"type":"step_failed","step":"review"}"#)
    );
    assert_eq!(
        run.results,
        HashMap::from([
            ("plan#1".to_owned(), binary()),
            ("review#1".to_owned(), json(r#"{"ok":false}"#)),
        ])
    );
    assert_eq!(run.steps.len(), 2);
    assert_eq!(run.steps["review"], json(r#"{"state":"failed"}"#));
    assert!(run.tasks.is_empty());
    assert_eq!(run.header, header("run-1", 100));

    // A transition without an event appends none; `None` clears the error.
    let write = TransitionWrite {
        events: vec![],
        status: "failed".to_owned(),
        state_sha256: "d".repeat(64),
        updated_ms: 400,
        ..TransitionWrite::default()
    };
    assert_eq!(store.apply_transition("run-1", 3, write).await.unwrap(), 4);
    let after = load(&*store, "run-1").await;
    assert_eq!(after.version, 4);
    assert_eq!(after.error, None);
    assert_eq!(after.events, run.events);
    assert_eq!(after.results, run.results);
    assert_eq!(after.steps, run.steps);
    assert_eq!(after.updated_ms, 400);
    assert_eq!(after.state_sha256, "d".repeat(64));

    let listed = newest(&*store, 1).await;
    assert_eq!(
        listed,
        vec![RunSummary {
            run_id: "run-1".to_owned(),
            workflow_id: "wf-run-1".to_owned(),
            status: "failed".to_owned(),
            created_ms: 100,
            updated_ms: 400,
        }]
    );
}

async fn apply_at_a_stale_version_is_conflict<S: Store>(store: Arc<S>) {
    create(&*store, "run-1", 100, start(100)).await;
    store
        .apply_transition("run-1", 1, status_write("running", "e1", 200))
        .await
        .unwrap();
    let before = load(&*store, "run-1").await;

    for expected in [1, 0, 3, 7] {
        let write = TransitionWrite {
            results: result_bytes(vec![("late#1".to_owned(), json("1"))]),
            steps: vec![("late".to_owned(), json("{}"))],
            tasks_set: vec![("late#1".to_owned(), json("{}"))],
            tasks_removed: vec!["plan#1".to_owned()],
            links: Vec::new(),
            decisions: Vec::new(),
            error: Some("late".to_owned()),
            ..status_write("failed", "late", 999)
        };
        match store.apply_transition("run-1", expected, write).await {
            Err(Error::Conflict {
                run_id,
                expected: got_expected,
                actual,
            }) => {
                assert_eq!(run_id, "run-1");
                assert_eq!(got_expected, expected);
                assert_eq!(actual, 2);
            }
            other => panic!("expected Conflict at version {expected}, got {other:?}"),
        }
        assert_eq!(load(&*store, "run-1").await, before);
    }
    assert_eq!(store.active_runs().await.unwrap(), strings(&["run-1"]));
    assert_eq!(newest(&*store, 10).await[0].status, "running");
}

async fn apply_to_a_missing_run_is_not_found<S: Store>(store: Arc<S>) {
    let write = TransitionWrite {
        results: result_bytes(vec![("plan#1".to_owned(), json("1"))]),
        tasks_set: vec![("plan#1".to_owned(), json("{}"))],
        ..status_write("running", "e", 1)
    };
    for expected in [0, 1] {
        match store
            .apply_transition("ghost", expected, write.clone())
            .await
        {
            Err(Error::NotFound(run_id)) => assert_eq!(run_id, "ghost"),
            other => panic!("expected NotFound, got {other:?}"),
        }
    }
    assert!(store.load_run("ghost").await.unwrap().is_none());
    assert!(newest(&*store, 10).await.is_empty());
    assert!(store.active_runs().await.unwrap().is_empty());
}

async fn rewriting_a_result<S: Store>(store: Arc<S>) {
    create(&*store, "run-1", 100, start(100)).await;
    let plan_done = TransitionWrite {
        results: result_bytes(vec![("plan#1".to_owned(), json(r#"{"answer":1}"#))]),
        ..status_write("running", "plan done", 200)
    };
    assert_eq!(
        store.apply_transition("run-1", 1, plan_done).await.unwrap(),
        2
    );
    let before = load(&*store, "run-1").await;

    // A different result for plan#1, next to a new one and other changes: all refused.
    let rewrite = TransitionWrite {
        events: vec![json("rewrite")],
        results: result_bytes(vec![
            ("review#1".to_owned(), json(r#"{"ok":true}"#)),
            ("plan#1".to_owned(), json(r#"{"answer":2}"#)),
        ]),
        steps: vec![("review".to_owned(), json(r#"{"state":"done"}"#))],
        tasks_set: vec![("review#1".to_owned(), json("{}"))],
        tasks_removed: vec!["plan#1".to_owned()],
        links: Vec::new(),
        decisions: Vec::new(),
        status: "succeeded".to_owned(),
        error: Some("should not be written".to_owned()),
        state_sha256: "f".repeat(64),
        updated_ms: 300,
        fences: Vec::new(),
        write_id: String::new(),
    };
    match store.apply_transition("run-1", 2, rewrite).await {
        Err(Error::Corrupt(message)) => assert!(message.contains("plan#1"), "{message}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(load(&*store, "run-1").await, before);
    assert_eq!(store.active_runs().await.unwrap(), strings(&["run-1"]));

    // The same bytes again (a retried write) are accepted, with the new result.
    let retry = TransitionWrite {
        results: result_bytes(vec![
            ("plan#1".to_owned(), json(r#"{"answer":1}"#)),
            ("review#1".to_owned(), json(r#"{"ok":true}"#)),
        ]),
        ..status_write("succeeded", "review done", 300)
    };
    assert_eq!(store.apply_transition("run-1", 2, retry).await.unwrap(), 3);
    let run = load(&*store, "run-1").await;
    assert_eq!(
        run.results,
        HashMap::from([
            ("plan#1".to_owned(), json(r#"{"answer":1}"#)),
            ("review#1".to_owned(), json(r#"{"ok":true}"#)),
        ])
    );
    assert_eq!(run.status, "succeeded");
    assert_eq!(run.events.len(), 2);
}

async fn swap_tasks_only_replace_existing_tasks<S: Store>(store: Arc<S>) {
    let first = TransitionWrite {
        tasks_set: vec![
            ("plan#1".to_owned(), json(r#"{"worker":null}"#)),
            ("lint#1".to_owned(), json(r#"{"worker":null}"#)),
        ],
        ..start(100)
    };
    create(&*store, "run-1", 100, first).await;
    let before = load(&*store, "run-1").await;

    // Any bytes go in and are compared exactly on the way out, even ones that are not JSON.
    let leased = binary();
    assert_eq!(
        store
            .swap_tasks(vec![swap(
                "run-1",
                "plan#1",
                json(r#"{"worker":null}"#),
                Some(leased.clone()),
            )])
            .await
            .unwrap(),
        vec![true]
    );
    let after = load(&*store, "run-1").await;
    assert_eq!(after.version, 1);
    assert_eq!(after.tasks["plan#1"], leased);
    let mut expected = before.clone();
    expected.tasks.insert("plan#1".to_owned(), leased.clone());
    assert_eq!(after, expected);
    assert_eq!(
        store
            .swap_tasks(vec![swap(
                "run-1",
                "plan#1",
                leased.clone(),
                Some(json(r#"{"worker":"w1"}"#)),
            )])
            .await
            .unwrap(),
        vec![true]
    );

    // The transition that finishes lint#1 removes it; a late lease update is dropped.
    let lint_done = TransitionWrite {
        tasks_removed: vec!["lint#1".to_owned()],
        ..status_write("running", "lint done", 200)
    };
    store.apply_transition("run-1", 1, lint_done).await.unwrap();
    let before = load(&*store, "run-1").await;
    let late = vec![
        swap(
            "run-1",
            "lint#1",
            json(r#"{"worker":null}"#),
            Some(json(r#"{"worker":"w1"}"#)),
        ),
        swap("run-1", "lint#1", json(r#"{"worker":null}"#), None),
        swap(
            "run-1",
            "never#1",
            json(r#"{"worker":null}"#),
            Some(json(r#"{"worker":"w1"}"#)),
        ),
    ];
    assert_eq!(
        store.swap_tasks(late).await.unwrap(),
        vec![false, false, false]
    );
    assert_eq!(load(&*store, "run-1").await, before);
    assert_eq!(before.version, 2);
    assert!(!before.tasks.contains_key("lint#1"));

    // Unknown run: false, and no run appears.
    assert_eq!(
        store
            .swap_tasks(vec![swap("ghost", "plan#1", json("{}"), Some(json("{}")))])
            .await
            .unwrap(),
        vec![false]
    );
    assert!(store.load_run("ghost").await.unwrap().is_none());
    assert_eq!(store.version("ghost").await.unwrap(), None);

    // An empty batch is an empty answer.
    assert!(store.swap_tasks(Vec::new()).await.unwrap().is_empty());
}

async fn list_runs_newest_first_and_limited<S: Store>(store: Arc<S>) {
    assert!(newest(&*store, 10).await.is_empty());
    for (run_id, created_ms) in [
        ("run-a", 100),
        ("run-b", 300),
        ("run-c", 200),
        ("run-d", 50),
        ("run-e", 400),
    ] {
        create(&*store, run_id, created_ms, start(created_ms)).await;
    }
    store
        .apply_transition("run-c", 1, status_write("succeeded", "done", 900))
        .await
        .unwrap();

    let ids = |summaries: Vec<RunSummary>| {
        summaries
            .into_iter()
            .map(|summary| summary.run_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ids(newest(&*store, 3).await),
        strings(&["run-e", "run-b", "run-c"])
    );
    assert_eq!(
        ids(newest(&*store, 100).await),
        strings(&["run-e", "run-b", "run-c", "run-a", "run-d"])
    );
    assert_eq!(
        ids(newest(&*store, 5).await),
        strings(&["run-e", "run-b", "run-c", "run-a", "run-d"])
    );
    assert_eq!(newest(&*store, usize::MAX).await.len(), 5);
    assert!(newest(&*store, 0).await.is_empty());

    let summaries = newest(&*store, 3).await;
    assert_eq!(
        summaries[2],
        RunSummary {
            run_id: "run-c".to_owned(),
            workflow_id: "wf-run-c".to_owned(),
            status: "succeeded".to_owned(),
            created_ms: 200,
            updated_ms: 900,
        }
    );
    assert_eq!(summaries[0].status, "running");
    assert_eq!(summaries[0].updated_ms, 400);
}

async fn list_runs_pages_walk_every_run_once_in_order<S: Store>(store: Arc<S>) {
    // 23 runs, three to a millisecond, whose ids do not sort as they were created: ties are
    // broken by run id, and on a cluster they sit in different shards of the index.
    let mut runs: Vec<Listed> = Vec::new();
    for n in 0..23i64 {
        let run_id = format!("run-{:02}", (n * 7) % 23);
        let created_ms = T + n / 3;
        create(&*store, &run_id, created_ms, start(created_ms)).await;
        runs.push((
            run_id.clone(),
            format!("wf-{run_id}"),
            "running".into(),
            created_ms,
        ));
    }
    let all = expected(&runs, None, None);
    for limit in [1, 2, 3, 5, 7, 23, 50] {
        let mut query = RunQuery::newest(limit);
        let mut walked = Vec::new();
        loop {
            let page = store.list_runs(query.clone()).await.unwrap();
            let left = all.len() - walked.len();
            // No filter: every page is full but the last, which ends the list.
            assert_eq!(page.runs.len(), limit.min(left), "limit {limit}");
            walked.extend(listed(&page.runs));
            match page.next {
                Some(next) => {
                    assert!(
                        walked.len() < all.len(),
                        "limit {limit}: a next after the end"
                    );
                    assert_eq!(next, RunCursor::of(page.runs.last().unwrap()));
                    query.after = Some(next);
                }
                None => break,
            }
        }
        assert_eq!(walked, all, "limit {limit}");
    }

    // A cursor is a position: from a run in the middle of a tie, the rest of the tie follows.
    let middle = &all[10];
    let rest = every_page(
        &*store,
        RunQuery {
            after: Some(RunCursor {
                created_ms: middle.3,
                run_id: middle.0.clone(),
            }),
            ..RunQuery::newest(4)
        },
    )
    .await;
    assert_eq!(listed(&rest), all[11..]);
}

async fn list_runs_pages_through_runs_crowded_in_one_index_shard<S: Store>(store: Arc<S>) {
    // On a cluster an index is 256 shards, and a page reads a few entries of each at a time: 60
    // runs in one shard (by their slot) among 20 elsewhere make a page read that shard again
    // and again, with ties on the way. On one server or in memory it is just 80 runs.
    let mut crowded = Vec::new();
    for n in 0.. {
        let run_id = format!("crowd-{n}");
        if redis_cluster::slot_of(&format!("{{{run_id}}}")).is_multiple_of(256) {
            crowded.push(run_id);
            if crowded.len() == 60 {
                break;
            }
        }
    }
    let spread = (0..20).map(|n| format!("spread-{n}"));
    let mut runs: Vec<Listed> = Vec::new();
    for (n, run_id) in crowded.into_iter().chain(spread).enumerate() {
        let created_ms = T + (n as i64 * 7) % 30;
        let status = ["failed", "succeeded"][n % 2];
        create_in(&*store, &run_id, created_ms, "wf", status).await;
        runs.push((run_id, "wf".into(), status.into(), created_ms));
    }
    for limit in [7, 25] {
        for status in [None, Some(RunStatus::Failed)] {
            let query = RunQuery {
                status,
                ..RunQuery::newest(limit)
            };
            let got = every_page(&*store, query).await;
            assert_eq!(
                listed(&got),
                expected(&runs, status, None),
                "{status:?} {limit}"
            );
        }
    }
}

async fn list_runs_filter_by_status_and_workflow<S: Store>(store: Arc<S>) {
    // 24 runs over two workflows and the four statuses (three of each pair), two of a
    // workflow to a millisecond. Every run starts running and reaches its status by
    // transitions; some running ones fail and are retried, so the status filter follows the
    // status a run has now, not one it had.
    let statuses = ["running", "succeeded", "failed", "cancelled"];
    let mut runs: Vec<Listed> = Vec::new();
    for n in 0..24i64 {
        let run_id = format!("run-{:02}", (n * 5) % 24);
        let workflow_id = ["wf-a", "wf-b"][(n % 2) as usize];
        let status = statuses[((n / 2) % 4) as usize];
        let created_ms = T + n / 4;
        create_in(&*store, &run_id, created_ms, workflow_id, "running").await;
        let mut version = 1;
        let mut path = vec![status];
        if status == "running" && n % 3 == 0 {
            path = vec!["failed", "running"];
        }
        for (step, status) in path.into_iter().enumerate() {
            if status == "running" && step == 0 {
                continue;
            }
            version = store
                .apply_transition(
                    &run_id,
                    version,
                    status_write(status, status, created_ms + 10),
                )
                .await
                .unwrap();
        }
        runs.push((run_id, workflow_id.into(), status.into(), created_ms));
    }
    let status_filters = [
        None,
        Some(RunStatus::Running),
        Some(RunStatus::Succeeded),
        Some(RunStatus::Failed),
        Some(RunStatus::Cancelled),
    ];
    for status in status_filters {
        for workflow_id in [None, Some("wf-a"), Some("wf-b"), Some("wf-none")] {
            let want = expected(&runs, status, workflow_id);
            if workflow_id != Some("wf-none") {
                assert!(!want.is_empty(), "{status:?} {workflow_id:?}");
            }
            for limit in [2, 5] {
                let query = RunQuery {
                    limit,
                    after: None,
                    status,
                    workflow_id: workflow_id.map(str::to_owned),
                };
                let got = every_page(&*store, query).await;
                assert_eq!(
                    listed(&got),
                    want,
                    "{status:?} {workflow_id:?} limit {limit}"
                );
            }
        }
    }
}

async fn a_status_filter_over_many_other_runs_gives_a_short_page_that_goes_on<S: Store>(
    store: Arc<S>,
) {
    // A failed run, then more succeeded runs than a page looks at, then another failed run:
    // the first page stops where its budget ends, with only the first, and the next goes on.
    let limit = 5;
    let budget = scan_budget(limit);
    assert_eq!(budget, MIN_SCAN_BUDGET);
    let between = budget + 100;
    let count = between + 2;
    let mut creating = tokio::task::JoinSet::new();
    let mut runs: Vec<Listed> = Vec::new();
    for n in 0..count {
        let status = if n == 0 || n == count - 1 {
            "failed"
        } else {
            "succeeded"
        };
        // Newest first: run n is created at T - n.
        let created_ms = T - n as i64;
        let run_id = format!("run-{n:05}");
        runs.push((run_id.clone(), "bulk".into(), status.into(), created_ms));
        let store = store.clone();
        creating.spawn(async move {
            create_in(&*store, &run_id, created_ms, "bulk", status).await;
        });
        if creating.len() >= 32 {
            creating.join_next().await.unwrap().unwrap();
        }
    }
    creating.join_all().await;
    create_in(&*store, "other-failed", T - 5, "other", "failed").await;

    for workflow_id in [None, Some("bulk")] {
        let query = RunQuery {
            limit,
            status: Some(RunStatus::Failed),
            workflow_id: workflow_id.map(str::to_owned),
            after: None,
        };
        let first = store.list_runs(query.clone()).await.unwrap();
        let mut failed_first = vec!["run-00000"];
        if workflow_id.is_none() {
            failed_first.push("other-failed");
        }
        assert_eq!(
            first
                .runs
                .iter()
                .map(|run| run.run_id.as_str())
                .collect::<Vec<_>>(),
            failed_first,
            "{workflow_id:?}"
        );
        // It looked at `budget` runs, newest first (the other workflow's one among them when
        // unfiltered), and goes on after the last of them.
        let looked_at = if workflow_id.is_none() {
            budget - 1
        } else {
            budget
        };
        let last_looked_at = &runs[looked_at - 1];
        assert_eq!(
            first.next,
            Some(RunCursor {
                created_ms: last_looked_at.3,
                run_id: last_looked_at.0.clone(),
            }),
            "{workflow_id:?}"
        );
        let second = store
            .list_runs(RunQuery {
                after: first.next.clone(),
                ..query.clone()
            })
            .await
            .unwrap();
        assert_eq!(
            second
                .runs
                .iter()
                .map(|run| run.run_id.as_str())
                .collect::<Vec<_>>(),
            [format!("run-{:05}", count - 1)],
            "{workflow_id:?}"
        );
        assert_eq!(second.next, None, "{workflow_id:?}");
    }
}

async fn an_unknown_cursor_or_workflow_gives_an_empty_page<S: Store>(store: Arc<S>) {
    for (run_id, created_ms) in [("run-a", T), ("run-b", T + 10), ("run-c", T + 20)] {
        create(&*store, run_id, created_ms, start(created_ms)).await;
    }
    let from = |created_ms: i64, run_id: &str| RunQuery {
        after: Some(RunCursor {
            created_ms,
            run_id: run_id.to_owned(),
        }),
        ..RunQuery::newest(10)
    };
    let ids = |runs: Vec<RunSummary>| runs.into_iter().map(|run| run.run_id).collect::<Vec<_>>();

    // A cursor older than every run, of a run that never was: an empty page that ends.
    let page = store.list_runs(from(T - 1, "no-such-run")).await.unwrap();
    assert!(page.runs.is_empty() && page.next.is_none(), "{page:?}");
    // Between two runs, it is still a position.
    let page = store.list_runs(from(T + 15, "no-such-run")).await.unwrap();
    assert_eq!(ids(page.runs), ["run-b", "run-a"]);
    assert_eq!(page.next, None);
    // Newer than every run: all of them.
    let page = store.list_runs(from(i64::MAX, "")).await.unwrap();
    assert_eq!(ids(page.runs), ["run-c", "run-b", "run-a"]);

    // A workflow no run has, with every status filter.
    for status in [None, Some(RunStatus::Running), Some(RunStatus::Failed)] {
        let page = store
            .list_runs(RunQuery {
                status,
                workflow_id: Some("no-such-workflow".into()),
                ..RunQuery::newest(10)
            })
            .await
            .unwrap();
        assert!(
            page.runs.is_empty() && page.next.is_none(),
            "{status:?}: {page:?}"
        );
    }
    // A page of no runs.
    let page = store.list_runs(RunQuery::newest(0)).await.unwrap();
    assert!(page.runs.is_empty() && page.next.is_none(), "{page:?}");
}

async fn active_runs_follow_status<S: Store>(store: Arc<S>) {
    assert!(store.active_runs().await.unwrap().is_empty());
    create(&*store, "run-a", 1, start(1)).await;
    create(&*store, "run-b", 2, start(2)).await;
    create(
        &*store,
        "run-c",
        3,
        TransitionWrite {
            status: "succeeded".to_owned(),
            ..start(3)
        },
    )
    .await;
    create(&*store, "run-d", 4, start(4)).await;
    assert_eq!(
        sorted(store.active_runs().await.unwrap()),
        strings(&["run-a", "run-b", "run-d"])
    );

    // run-b ends.
    store
        .apply_transition("run-b", 1, status_write("succeeded", "done", 10))
        .await
        .unwrap();
    assert_eq!(
        sorted(store.active_runs().await.unwrap()),
        strings(&["run-a", "run-d"])
    );

    // run-a stays running through a transition, then pauses and resumes.
    store
        .apply_transition("run-a", 1, status_write("running", "step", 11))
        .await
        .unwrap();
    assert_eq!(
        sorted(store.active_runs().await.unwrap()),
        strings(&["run-a", "run-d"])
    );
    store
        .apply_transition("run-a", 2, status_write("paused", "pause", 12))
        .await
        .unwrap();
    assert_eq!(
        sorted(store.active_runs().await.unwrap()),
        strings(&["run-d"])
    );
    store
        .apply_transition("run-a", 3, status_write("running", "resume", 13))
        .await
        .unwrap();
    assert_eq!(
        sorted(store.active_runs().await.unwrap()),
        strings(&["run-a", "run-d"])
    );

    // run-d fails; a refused transition changes nothing.
    let failed = TransitionWrite {
        error: Some("boom".to_owned()),
        ..status_write("failed", "failed", 14)
    };
    store.apply_transition("run-d", 1, failed).await.unwrap();
    assert!(
        store
            .apply_transition("run-a", 1, status_write("failed", "stale", 15))
            .await
            .is_err()
    );
    assert_eq!(store.active_runs().await.unwrap(), strings(&["run-a"]));
}

async fn a_principal_s_running_runs_are_counted_until_they_end<S: Store>(store: Arc<S>) {
    assert_eq!(store.running_runs_of("ci").await.unwrap(), 0);
    for (i, run_id) in ["run-a", "run-b", "run-c"].into_iter().enumerate() {
        create(&*store, run_id, i as i64, start(i as i64)).await;
        store.add_principal_run("ci", run_id).await.unwrap();
    }
    store.add_principal_run("ci", "run-a").await.unwrap(); // remembered once
    store.add_principal_run("ops", "run-c").await.unwrap();
    assert_eq!(store.running_runs_of("ci").await.unwrap(), 3);
    assert_eq!(store.running_runs_of("nobody").await.unwrap(), 0);

    store
        .apply_transition("run-b", 1, status_write("succeeded", "done", 10))
        .await
        .unwrap();
    assert_eq!(store.running_runs_of("ci").await.unwrap(), 2);
    store
        .apply_transition("run-c", 1, status_write("cancelled", "stop", 11))
        .await
        .unwrap();
    assert_eq!(store.running_runs_of("ci").await.unwrap(), 1);
    assert_eq!(store.running_runs_of("ops").await.unwrap(), 0);
    // The header keeps who submitted a run.
    assert_eq!(load(&*store, "run-a").await.header.submitted_by, "ci");
}

async fn concurrent_appliers_one_wins<S: Store>(store: Arc<S>) {
    const APPLIERS: usize = 16;
    create(&*store, "run-1", 100, start(100)).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(APPLIERS));
    let tasks: Vec<_> = (0..APPLIERS)
        .map(|i| {
            let store = Arc::clone(&store);
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                let write = TransitionWrite {
                    results: result_bytes(vec![(format!("step{i}#1"), json(&format!("{i}")))]),
                    ..status_write(
                        "running",
                        &format!("event from applier {i}"),
                        200 + i as i64,
                    )
                };
                barrier.wait().await;
                (i, store.apply_transition("run-1", 1, write).await)
            })
        })
        .collect();

    let mut winners = Vec::new();
    for task in tasks {
        let (i, outcome) = task.await.expect("applier task");
        match outcome {
            Ok(version) => {
                assert_eq!(version, 2);
                winners.push(i);
            }
            Err(Error::Conflict {
                expected, actual, ..
            }) => {
                assert_eq!(expected, 1);
                assert_eq!(actual, 2);
            }
            Err(other) => panic!("applier {i}: expected Ok or Conflict, got {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one applier wins: {winners:?}");
    let winner = winners[0];

    let run = load(&*store, "run-1").await;
    assert_eq!(run.version, 2);
    assert_eq!(
        run.events,
        vec![json(&format!("event from applier {winner}"))]
    );
    assert_eq!(
        run.results,
        HashMap::from([(format!("step{winner}#1"), json(&format!("{winner}")))])
    );
    assert_eq!(run.updated_ms, 200 + winner as i64);
}

async fn swap_tasks_compares_exact_bytes_and_moves_timers<S: Store>(store: Arc<S>) {
    let plan = timed("coder", 1, T + 1_000);
    let lint = timed("coder", 1, T + 1_500);
    let first = TransitionWrite {
        tasks_set: vec![
            ("plan#1".to_owned(), plan.clone()),
            ("lint#1".to_owned(), lint.clone()),
        ],
        ..start(100)
    };
    create(&*store, "run-1", 100, first).await;
    assert_eq!(
        due_keys(&*store, "coder", T + 2_000).await,
        strings(&["run-1/plan#1", "run-1/lint#1"])
    );
    let before = load(&*store, "run-1").await;

    // The same task in other bytes (spaces, key order) is not the expected task.
    let renewed = timed("coder", 1, T + 5_000);
    let respaced = json(&format!(
        r#"{{"agent": "coder", "attempt": 1, "due_ms": {}, "worker": "w1"}}"#,
        T + 1_000
    ));
    let reordered = json(&format!(
        r#"{{"worker":"w1","due_ms":{},"attempt":1,"agent":"coder"}}"#,
        T + 1_000
    ));
    for wrong in [
        respaced,
        reordered,
        timed("coder", 2, T + 1_000),
        Vec::new(),
    ] {
        assert_eq!(
            store
                .swap_tasks(vec![swap("run-1", "plan#1", wrong, Some(renewed.clone()))])
                .await
                .unwrap(),
            vec![false]
        );
    }
    assert_eq!(load(&*store, "run-1").await, before);
    assert_eq!(
        due_keys(&*store, "coder", T + 1_000).await,
        strings(&["run-1/plan#1"])
    );

    // The exact bytes: the task is replaced, its timer moves, the version stays.
    assert_eq!(
        store
            .swap_tasks(vec![swap(
                "run-1",
                "plan#1",
                plan.clone(),
                Some(renewed.clone())
            )])
            .await
            .unwrap(),
        vec![true]
    );
    let mut expected = before.clone();
    expected.tasks.insert("plan#1".to_owned(), renewed.clone());
    assert_eq!(load(&*store, "run-1").await, expected);
    assert_eq!(store.version("run-1").await.unwrap(), Some(1));
    assert_eq!(
        store.task("run-1", "plan#1").await.unwrap(),
        Some(renewed.clone())
    );
    // All of a run's tasks at once, a swap's change included, as `load_run` has them.
    assert_eq!(store.tasks("run-1").await.unwrap(), expected.tasks);
    assert!(due_keys(&*store, "coder", T + 1_000).await.is_empty());
    assert_eq!(
        due_keys(&*store, "coder", T + 4_999).await,
        strings(&["run-1/lint#1"])
    );
    assert_eq!(
        store.due_tasks("coder", T + 5_000, 10).await.unwrap(),
        vec![
            due_task("run-1", "lint#1", lint.clone()),
            due_task("run-1", "plan#1", renewed.clone()),
        ]
    );

    // Removing a task removes its timer.
    assert_eq!(
        store
            .swap_tasks(vec![swap("run-1", "lint#1", lint.clone(), None)])
            .await
            .unwrap(),
        vec![true]
    );
    assert_eq!(store.task("run-1", "lint#1").await.unwrap(), None);
    assert!(!load(&*store, "run-1").await.tasks.contains_key("lint#1"));
    assert_eq!(
        due_keys(&*store, "coder", i64::MAX).await,
        strings(&["run-1/plan#1"])
    );

    // Each swap of a batch on its own: one applies, the next is refused.
    let retry = timed("coder", 2, T + 7_000);
    let batch = vec![
        swap("run-1", "plan#1", renewed.clone(), Some(retry.clone())),
        swap("run-1", "lint#1", lint.clone(), Some(timed("coder", 2, T))),
    ];
    assert_eq!(store.swap_tasks(batch).await.unwrap(), vec![true, false]);
    assert_eq!(
        store.task("run-1", "plan#1").await.unwrap(),
        Some(retry.clone())
    );
    assert_eq!(store.task("run-1", "lint#1").await.unwrap(), None);
    assert_eq!(
        store.due_tasks("coder", i64::MAX, 10).await.unwrap(),
        vec![due_task("run-1", "plan#1", retry.clone())]
    );
    // ... and in order: a later swap sees what an earlier one wrote.
    let moved = timed("coder", 2, T + 9_000);
    let batch = vec![
        swap("run-1", "plan#1", renewed.clone(), Some(moved.clone())),
        swap("run-1", "plan#1", retry.clone(), Some(renewed.clone())),
        swap("run-1", "plan#1", renewed.clone(), Some(moved.clone())),
    ];
    assert_eq!(
        store.swap_tasks(batch).await.unwrap(),
        vec![false, true, true]
    );
    assert_eq!(
        store.due_tasks("coder", i64::MAX, 10).await.unwrap(),
        vec![due_task("run-1", "plan#1", moved.clone())]
    );

    // A missing run or task: refused, and nothing is created (no task, no timer, no run).
    let batch = vec![
        swap("ghost", "plan#1", plan.clone(), Some(timed("coder", 1, 0))),
        swap("run-1", "never#1", plan.clone(), Some(timed("coder", 1, 0))),
        swap("run-1", "never#2", Vec::new(), Some(timed("coder", 1, 0))),
    ];
    assert_eq!(
        store.swap_tasks(batch).await.unwrap(),
        vec![false, false, false]
    );
    assert!(store.load_run("ghost").await.unwrap().is_none());
    assert_eq!(store.task("ghost", "plan#1").await.unwrap(), None);
    assert!(store.tasks("ghost").await.unwrap().is_empty());
    assert_eq!(store.task("run-1", "never#1").await.unwrap(), None);
    assert_eq!(
        due_keys(&*store, "coder", i64::MAX).await,
        strings(&["run-1/plan#1"])
    );
    assert_eq!(newest(&*store, 10).await.len(), 1);
    assert_eq!(store.version("run-1").await.unwrap(), Some(1));
}

async fn due_tasks_are_earliest_first_limited_and_per_agent<S: Store>(store: Arc<S>) {
    // Stored bytes are given back as they are, spaces and all.
    let a1 = json(&format!(
        r#"{{ "agent": "coder", "due_ms": {}, "attempt": 1 }}"#,
        T + 300
    ));
    let a2 = timed("reviewer", 1, T + 100);
    let a3 = timed("coder", 3, T + 100);
    let b1 = timed("coder", 1, T + 200);
    let b2 = timed("coder", 1, T + 900);
    let b3 = timed("reviewer", 2, T + 50);
    let untimed = [
        ("no-due#1", json(r#"{"agent":"coder","attempt":1}"#)),
        (
            "no-agent#1",
            json(&format!(r#"{{"attempt":1,"due_ms":{}}}"#, T)),
        ),
        (
            "due-text#1",
            json(&format!(r#"{{"agent":"coder","due_ms":"{}"}}"#, T)),
        ),
        (
            "agent-number#1",
            json(&format!(r#"{{"agent":7,"due_ms":{}}}"#, T)),
        ),
        ("not-json#1", binary()),
        ("array#1", json(r#"["coder",1]"#)),
    ];
    let mut tasks_set = vec![
        ("a1#1".to_owned(), a1.clone()),
        ("a2#1".to_owned(), a2.clone()),
        ("a3#1".to_owned(), a3.clone()),
    ];
    tasks_set.extend(
        untimed
            .iter()
            .map(|(key, bytes)| (key.to_string(), bytes.clone())),
    );
    create(
        &*store,
        "run-a",
        1,
        TransitionWrite {
            tasks_set,
            ..start(1)
        },
    )
    .await;
    create(
        &*store,
        "run-b",
        2,
        TransitionWrite {
            tasks_set: vec![
                ("b1#1".to_owned(), b1.clone()),
                ("b2#1".to_owned(), b2.clone()),
                ("b3#1".to_owned(), b3.clone()),
            ],
            ..start(2)
        },
    )
    .await;

    assert_eq!(
        store.due_tasks("coder", T + 1_000, 10).await.unwrap(),
        vec![
            due_task("run-a", "a3#1", a3.clone()),
            due_task("run-b", "b1#1", b1.clone()),
            due_task("run-a", "a1#1", a1.clone()),
            due_task("run-b", "b2#1", b2.clone()),
        ]
    );
    // Due at `now_ms` is due; a millisecond later is not.
    assert_eq!(
        due_keys(&*store, "coder", T + 300).await,
        strings(&["run-a/a3#1", "run-b/b1#1", "run-a/a1#1"])
    );
    assert_eq!(
        due_keys(&*store, "coder", T + 299).await,
        strings(&["run-a/a3#1", "run-b/b1#1"])
    );
    assert!(due_keys(&*store, "coder", T + 99).await.is_empty());
    assert!(due_keys(&*store, "coder", i64::MIN).await.is_empty());
    // At most `limit`, the earliest.
    assert_eq!(
        store.due_tasks("coder", T + 1_000, 2).await.unwrap(),
        vec![
            due_task("run-a", "a3#1", a3.clone()),
            due_task("run-b", "b1#1", b1.clone()),
        ]
    );
    assert_eq!(
        store.due_tasks("coder", T + 1_000, 1).await.unwrap(),
        vec![due_task("run-a", "a3#1", a3.clone())]
    );
    assert!(
        store
            .due_tasks("coder", T + 1_000, 0)
            .await
            .unwrap()
            .is_empty()
    );
    // Per agent.
    assert_eq!(
        store.due_tasks("reviewer", i64::MAX, 10).await.unwrap(),
        vec![
            due_task("run-b", "b3#1", b3.clone()),
            due_task("run-a", "a2#1", a2.clone()),
        ]
    );
    assert!(due_keys(&*store, "nobody", i64::MAX).await.is_empty());
    assert!(due_keys(&*store, "", i64::MAX).await.is_empty());

    // Tasks without a string agent and an integer due_ms are stored, but have no timer.
    let run = load(&*store, "run-a").await;
    for (key, bytes) in &untimed {
        assert_eq!(run.tasks.get(*key), Some(bytes), "{key}");
    }
    assert_eq!(
        due_keys(&*store, "coder", i64::MAX).await,
        strings(&["run-a/a3#1", "run-b/b1#1", "run-a/a1#1", "run-b/b2#1"])
    );

    // Reading due tasks changes nothing.
    assert_eq!(load(&*store, "run-a").await, run);
}

async fn transitions_move_timers_with_tasks<S: Store>(store: Arc<S>) {
    let first = TransitionWrite {
        tasks_set: vec![
            ("plan#1".to_owned(), timed("coder", 1, T + 100)),
            ("review#1".to_owned(), timed("reviewer", 1, T + 200)),
        ],
        ..start(1)
    };
    create(&*store, "run-1", 1, first).await;
    assert_eq!(
        due_keys(&*store, "coder", T + 100).await,
        strings(&["run-1/plan#1"])
    );
    assert_eq!(
        due_keys(&*store, "reviewer", T + 200).await,
        strings(&["run-1/review#1"])
    );

    // Overwriting plan#1 moves its timer; removing review#1 removes its timer.
    let retried = timed("coder", 2, T + 500);
    let write = TransitionWrite {
        tasks_set: vec![("plan#1".to_owned(), retried.clone())],
        tasks_removed: vec!["review#1".to_owned()],
        ..status_write("running", "plan retried, review done", 10)
    };
    assert_eq!(store.apply_transition("run-1", 1, write).await.unwrap(), 2);
    assert!(due_keys(&*store, "coder", T + 499).await.is_empty());
    assert_eq!(
        store.due_tasks("coder", T + 500, 10).await.unwrap(),
        vec![due_task("run-1", "plan#1", retried.clone())]
    );
    assert!(due_keys(&*store, "reviewer", i64::MAX).await.is_empty());

    // A refused transition moves no timer.
    let stale = TransitionWrite {
        tasks_set: vec![
            ("plan#1".to_owned(), timed("coder", 3, T)),
            ("audit#1".to_owned(), timed("auditor", 1, T)),
        ],
        ..status_write("running", "stale", 11)
    };
    assert!(matches!(
        store.apply_transition("run-1", 1, stale).await,
        Err(Error::Conflict { .. })
    ));
    assert!(due_keys(&*store, "coder", T + 499).await.is_empty());
    assert!(due_keys(&*store, "auditor", i64::MAX).await.is_empty());

    // A task that changes agent changes timer set.
    let handed_over = timed("fixer", 2, T + 600);
    let write = TransitionWrite {
        tasks_set: vec![("plan#1".to_owned(), handed_over.clone())],
        ..status_write("running", "handed over", 12)
    };
    store.apply_transition("run-1", 2, write).await.unwrap();
    assert!(due_keys(&*store, "coder", i64::MAX).await.is_empty());
    assert_eq!(
        store.due_tasks("fixer", T + 600, 10).await.unwrap(),
        vec![due_task("run-1", "plan#1", handed_over)]
    );

    // A task that loses its due time loses its timer, and gets one back with a new due time.
    let waiting = json(r#"{"agent":"fixer","attempt":2}"#);
    let write = TransitionWrite {
        tasks_set: vec![("plan#1".to_owned(), waiting.clone())],
        ..status_write("running", "waiting", 13)
    };
    store.apply_transition("run-1", 3, write).await.unwrap();
    assert_eq!(store.task("run-1", "plan#1").await.unwrap(), Some(waiting));
    assert!(due_keys(&*store, "fixer", i64::MAX).await.is_empty());
    let write = TransitionWrite {
        tasks_set: vec![("plan#1".to_owned(), timed("fixer", 3, T + 700))],
        ..status_write("running", "retry", 14)
    };
    store.apply_transition("run-1", 4, write).await.unwrap();
    assert_eq!(
        due_keys(&*store, "fixer", T + 700).await,
        strings(&["run-1/plan#1"])
    );

    // Removed and set again in one transition: the set wins, with its timer.
    let again = timed("coder", 4, T + 800);
    let write = TransitionWrite {
        tasks_set: vec![("plan#1".to_owned(), again.clone())],
        tasks_removed: vec!["plan#1".to_owned()],
        ..status_write("running", "again", 15)
    };
    store.apply_transition("run-1", 5, write).await.unwrap();
    assert!(due_keys(&*store, "fixer", i64::MAX).await.is_empty());
    assert_eq!(
        store.due_tasks("coder", i64::MAX, 10).await.unwrap(),
        vec![due_task("run-1", "plan#1", again)]
    );

    // The run ends: its last task and timer go.
    let write = TransitionWrite {
        tasks_removed: vec!["plan#1".to_owned()],
        ..status_write("succeeded", "done", 16)
    };
    store.apply_transition("run-1", 6, write).await.unwrap();
    assert!(load(&*store, "run-1").await.tasks.is_empty());
    for agent in ["coder", "reviewer", "fixer", "auditor"] {
        assert!(
            due_keys(&*store, agent, i64::MAX).await.is_empty(),
            "{agent}"
        );
    }
}

async fn fenced_transitions_apply_only_at_the_current_attempt<S: Store>(store: Arc<S>) {
    let plan = timed("coder", 1, T + 100);
    let lint = timed("coder", 1, T + 150);
    let first = TransitionWrite {
        tasks_set: vec![
            ("plan#1".to_owned(), plan.clone()),
            ("lint#1".to_owned(), lint.clone()),
        ],
        ..start(1)
    };
    create(&*store, "run-1", 1, first).await;

    // The current attempt: the write applies.
    let progress = TransitionWrite {
        steps: vec![("plan".to_owned(), json(r#"{"state":"running"}"#))],
        fences: vec![("plan#1".to_owned(), 1), ("lint#1".to_owned(), 1)],
        ..status_write("running", "plan progress", 10)
    };
    assert_eq!(
        store.apply_transition("run-1", 1, progress).await.unwrap(),
        2
    );

    // plan#1's lease expired and attempt 2 took over: attempt 1's answer comes too late.
    let retry = timed("coder", 2, T + 900);
    assert_eq!(
        store
            .swap_tasks(vec![swap(
                "run-1",
                "plan#1",
                plan.clone(),
                Some(retry.clone())
            )])
            .await
            .unwrap(),
        vec![true]
    );
    let before = load(&*store, "run-1").await;
    let late_answer = |fences: Vec<(String, u32)>| TransitionWrite {
        results: result_bytes(vec![("plan#1".to_owned(), json(r#"{"answer":"late"}"#))]),
        steps: vec![("plan".to_owned(), json(r#"{"state":"done"}"#))],
        tasks_set: vec![("review#1".to_owned(), timed("reviewer", 1, T))],
        tasks_removed: vec!["plan#1".to_owned()],
        links: vec![json(r#"{"n":1}"#)],
        decisions: vec![("plan#1/0".to_owned(), json("{}"))],
        error: Some("late".to_owned()),
        fences,
        ..status_write("succeeded", "plan done", 20)
    };
    let refusals = [
        (vec![("plan#1".to_owned(), 1)], "plan#1", 1, "2"),
        (vec![("plan#1".to_owned(), 3)], "plan#1", 3, "2"),
        // The first fence that fails is named.
        (
            vec![("lint#1".to_owned(), 1), ("plan#1".to_owned(), 1)],
            "plan#1",
            1,
            "2",
        ),
        (
            vec![("plan#1".to_owned(), 2), ("lint#1".to_owned(), 2)],
            "lint#1",
            2,
            "1",
        ),
        // A task that is gone.
        (vec![("gone#1".to_owned(), 1)], "gone#1", 1, "none"),
        (
            vec![("plan#1".to_owned(), 2), ("gone#1".to_owned(), 7)],
            "gone#1",
            7,
            "none",
        ),
    ];
    for (fences, task_key, attempt, current) in refusals {
        match store
            .apply_transition("run-1", 2, late_answer(fences.clone()))
            .await
        {
            Err(Error::Fenced {
                run_id,
                task_key: got_key,
                attempt: got_attempt,
                current: got_current,
            }) => {
                assert_eq!(
                    (
                        run_id.as_str(),
                        got_key.as_str(),
                        got_attempt,
                        got_current.as_str()
                    ),
                    ("run-1", task_key, attempt, current),
                    "fences {fences:?}"
                );
            }
            other => panic!("fences {fences:?}: expected Fenced, got {other:?}"),
        }
        assert_eq!(load(&*store, "run-1").await, before);
        assert_eq!(store.version("run-1").await.unwrap(), Some(2));
        assert!(store.decisions("run-1").await.unwrap().is_empty());
        assert!(due_keys(&*store, "reviewer", i64::MAX).await.is_empty());
        assert_eq!(
            due_keys(&*store, "coder", i64::MAX).await,
            strings(&["run-1/lint#1", "run-1/plan#1"])
        );
        assert_eq!(store.active_runs().await.unwrap(), strings(&["run-1"]));
    }

    // Attempt 2's answer applies.
    let answer = TransitionWrite {
        error: None,
        ..late_answer(vec![("plan#1".to_owned(), 2)])
    };
    assert_eq!(store.apply_transition("run-1", 2, answer).await.unwrap(), 3);
    let run = load(&*store, "run-1").await;
    assert_eq!(run.status, "succeeded");
    assert_eq!(run.results["plan#1"], json(r#"{"answer":"late"}"#));
    assert!(!run.tasks.contains_key("plan#1"));
    assert_eq!(
        due_keys(&*store, "coder", i64::MAX).await,
        strings(&["run-1/lint#1"])
    );

    // Its retry, once the task is gone, is fenced with no current attempt.
    match store
        .apply_transition("run-1", 3, late_answer(vec![("plan#1".to_owned(), 2)]))
        .await
    {
        Err(Error::Fenced {
            task_key, current, ..
        }) => assert_eq!((task_key.as_str(), current.as_str()), ("plan#1", "none")),
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert_eq!(load(&*store, "run-1").await, run);
}

/// Two transitions joined with `TransitionWrite::then` (answers settled together) are one
/// write: one version, their events and links in order, the later write of a step winning, a
/// task the first sets and the second removes gone with its timer, and every fence checked, so
/// that one late answer refuses the whole write and nothing is written.
async fn transitions_written_together_apply_in_order<S: Store>(store: Arc<S>) {
    let a = timed("coder", 1, T + 100);
    let b = timed("coder", 1, T + 200);
    let first = TransitionWrite {
        tasks_set: vec![("a#1".to_owned(), a.clone()), ("b#1".to_owned(), b.clone())],
        ..start(1)
    };
    create(&*store, "run-1", 1, first).await;
    let answer = |branch: &str, n: i64| TransitionWrite {
        results: result_bytes(vec![(
            format!("{branch}#1"),
            json(&format!(r#"{{"branch":"{branch}"}}"#)),
        )]),
        steps: vec![
            (branch.to_owned(), json(r#"{"state":"done"}"#)),
            ("fan".to_owned(), json(&format!(r#"{{"settled":{n}}}"#))),
        ],
        tasks_removed: vec![format!("{branch}#1")],
        links: vec![json(&format!(r#"{{"n":{n}}}"#))],
        fences: vec![(format!("{branch}#1"), 1)],
        ..status_write("running", &format!("{branch} answered"), 10 + n)
    };
    // The first answer also sets a task (a retry's timer, say) that the second removes.
    let mut together = TransitionWrite {
        tasks_set: vec![("audit#1".to_owned(), timed("auditor", 1, T))],
        ..answer("a", 1)
    };
    together.then(TransitionWrite {
        tasks_removed: vec!["b#1".to_owned(), "audit#1".to_owned()],
        ..answer("b", 2)
    });

    // A late answer among them refuses the write: nothing changes.
    let retried = timed("coder", 2, T + 900);
    let swapped = store
        .swap_tasks(vec![swap("run-1", "b#1", b.clone(), Some(retried.clone()))])
        .await
        .unwrap();
    assert_eq!(swapped, vec![true]);
    let before = load(&*store, "run-1").await;
    assert!(matches!(
        store.apply_transition("run-1", 1, together.clone()).await,
        Err(Error::Fenced { task_key, attempt: 1, .. }) if task_key == "b#1"
    ));
    assert_eq!(load(&*store, "run-1").await, before);
    assert!(due_keys(&*store, "auditor", i64::MAX).await.is_empty());

    // At the current attempts it applies as one transition.
    let swapped = store
        .swap_tasks(vec![swap("run-1", "b#1", retried, Some(b))])
        .await
        .unwrap();
    assert_eq!(swapped, vec![true]);
    assert_eq!(
        store.apply_transition("run-1", 1, together).await.unwrap(),
        2
    );
    let after = load(&*store, "run-1").await;
    assert_eq!(after.version, 2);
    assert_eq!(after.events, vec![json("a answered"), json("b answered")]);
    assert_eq!(after.links, vec![json(r#"{"n":1}"#), json(r#"{"n":2}"#)]);
    assert_eq!(after.results.len(), 2);
    assert_eq!(after.steps["fan"], json(r#"{"settled":2}"#));
    assert_eq!(after.steps["a"], json(r#"{"state":"done"}"#));
    assert!(after.tasks.is_empty(), "{:?}", after.tasks.keys());
    assert_eq!(after.updated_ms, 12);
    for agent in ["coder", "auditor"] {
        assert!(
            due_keys(&*store, agent, i64::MAX).await.is_empty(),
            "{agent}"
        );
    }
}

async fn task_and_version_read_one_task_and_the_version<S: Store>(store: Arc<S>) {
    assert_eq!(store.version("ghost").await.unwrap(), None);
    assert_eq!(store.task("ghost", "plan#1").await.unwrap(), None);

    let odd = json(r#"{"note":"résumé ✓ {braces}\r\n","attempt":1}"#);
    let first = TransitionWrite {
        tasks_set: vec![
            ("plan#1".to_owned(), odd.clone()),
            ("lint#1".to_owned(), binary()),
        ],
        ..start(1)
    };
    create(&*store, "run-1", 1, first).await;
    assert_eq!(store.version("run-1").await.unwrap(), Some(1));
    assert_eq!(
        store.task("run-1", "plan#1").await.unwrap(),
        Some(odd.clone())
    );
    assert_eq!(store.task("run-1", "lint#1").await.unwrap(), Some(binary()));
    assert_eq!(store.task("run-1", "review#1").await.unwrap(), None);
    assert_eq!(store.task("ghost", "plan#1").await.unwrap(), None);
    assert_eq!(store.version("ghost").await.unwrap(), None);

    let write = TransitionWrite {
        tasks_set: vec![("review#1".to_owned(), json("{}"))],
        tasks_removed: vec!["lint#1".to_owned()],
        ..status_write("running", "lint done", 2)
    };
    store.apply_transition("run-1", 1, write).await.unwrap();
    assert_eq!(store.version("run-1").await.unwrap(), Some(2));
    assert_eq!(store.task("run-1", "lint#1").await.unwrap(), None);
    assert_eq!(
        store.task("run-1", "review#1").await.unwrap(),
        Some(json("{}"))
    );

    // Neither a swap nor a refused transition moves the version.
    let swapped = store
        .swap_tasks(vec![swap("run-1", "plan#1", odd.clone(), Some(json("[]")))])
        .await
        .unwrap();
    assert_eq!(swapped, vec![true]);
    assert!(
        store
            .apply_transition("run-1", 1, status_write("failed", "stale", 3))
            .await
            .is_err()
    );
    assert_eq!(store.version("run-1").await.unwrap(), Some(2));
    assert_eq!(
        store.task("run-1", "plan#1").await.unwrap(),
        Some(json("[]"))
    );
    assert_eq!(load(&*store, "run-1").await.version, 2);
    // Another run's tasks are its own.
    create(&*store, "run-2", 2, start(2)).await;
    assert_eq!(store.task("run-2", "review#1").await.unwrap(), None);
    assert_eq!(store.version("run-2").await.unwrap(), Some(1));
}

async fn due_tasks_take_any_limit<S: Store>(store: Arc<S>) {
    let first = TransitionWrite {
        tasks_set: vec![
            ("plan#1".to_owned(), timed("coder", 1, T + 100)),
            ("lint#1".to_owned(), timed("coder", 1, T + 200)),
        ],
        ..start(1)
    };
    create(&*store, "run-1", 1, first).await;
    for limit in [2, 3, 1 << 40, i64::MAX as usize, usize::MAX] {
        assert_eq!(
            store
                .due_tasks("coder", T + 1_000, limit)
                .await
                .unwrap_or_else(|err| panic!("limit {limit}: {err}")),
            vec![
                due_task("run-1", "plan#1", timed("coder", 1, T + 100)),
                due_task("run-1", "lint#1", timed("coder", 1, T + 200)),
            ],
            "limit {limit}"
        );
    }
}

async fn only_an_integer_due_ms_makes_a_timer<S: Store>(store: Arc<S>) {
    let fractional = json(r#"{"agent":"coder","attempt":1,"due_ms":1000.5}"#);
    let first = TransitionWrite {
        tasks_set: vec![("plan#1".to_owned(), fractional.clone())],
        ..start(1)
    };
    create(&*store, "run-1", 1, first).await;
    assert_eq!(
        store.task("run-1", "plan#1").await.unwrap(),
        Some(fractional)
    );
    assert!(due_keys(&*store, "coder", i64::MAX).await.is_empty());

    // Nor through a swap.
    let swapped = store
        .swap_tasks(vec![swap(
            "run-1",
            "plan#1",
            json(r#"{"agent":"coder","attempt":1,"due_ms":1000.5}"#),
            Some(json(r#"{"agent":"coder","attempt":2,"due_ms":-0.25}"#)),
        )])
        .await
        .unwrap();
    assert_eq!(swapped, vec![true]);
    assert!(due_keys(&*store, "coder", i64::MAX).await.is_empty());
}

async fn a_fenced_first_transition_creates_nothing<S: Store>(store: Arc<S>) {
    // No task exists before the run does, so a fence on the first transition cannot hold.
    let first = TransitionWrite {
        tasks_set: vec![("plan#1".to_owned(), timed("coder", 1, T))],
        fences: vec![("plan#1".to_owned(), 1)],
        ..start(1)
    };
    match store.create_run(header("run-1", 1), first).await {
        Err(Error::Fenced {
            run_id,
            task_key,
            attempt,
            current,
        }) => assert_eq!(
            (
                run_id.as_str(),
                task_key.as_str(),
                attempt,
                current.as_str()
            ),
            ("run-1", "plan#1", 1, "none")
        ),
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert!(store.load_run("run-1").await.unwrap().is_none());
    assert_eq!(store.version("run-1").await.unwrap(), None);
    assert!(newest(&*store, 10).await.is_empty());
    assert!(store.active_runs().await.unwrap().is_empty());
    assert!(due_keys(&*store, "coder", i64::MAX).await.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Settling writes whose answer was lost (a store that timed out): the caller must learn whether
// the write was done, and a write settled as not done must never be done later.

/// A transition with its own write id, as the coordinator writes them.
fn named(mut write: TransitionWrite) -> (TransitionWrite, String) {
    write.write_id = new_write_id();
    let id = write.write_id.clone();
    (write, id)
}

async fn a_settled_create_is_found_or_voided_for_good<S: Store>(store: Arc<S>) {
    // A create that was done is found, and nothing about the run changes.
    create(&*store, "run-1", 1, start(1)).await;
    let before = load(&*store, "run-1").await;
    assert_eq!(
        store.settle_create(&header("run-1", 1)).await.unwrap(),
        Settled::Done
    );
    assert_eq!(load(&*store, "run-1").await, before);

    // A create that was not done (still on its way, say) is voided: when it arrives, it is
    // refused and writes nothing, and the run is never listed.
    assert_eq!(
        store.settle_create(&header("run-2", 2)).await.unwrap(),
        Settled::NotDone
    );
    match store.create_run(header("run-2", 2), start(2)).await {
        Err(Error::Voided(run_id)) => assert_eq!(run_id, "run-2"),
        other => panic!("expected Voided, got {other:?}"),
    }
    assert!(store.load_run("run-2").await.unwrap().is_none());
    assert_eq!(store.version("run-2").await.unwrap(), None);
    let listed: Vec<String> = newest(&*store, 10)
        .await
        .into_iter()
        .map(|run| run.run_id)
        .collect();
    assert_eq!(listed, strings(&["run-1"]));
    assert_eq!(store.active_runs().await.unwrap(), strings(&["run-1"]));
    assert!(
        store
            .runs_of_workflow("wf-run-2", 10)
            .await
            .unwrap()
            .is_empty()
    );
    // Settling again (a settle whose own answer was lost) says the same.
    assert_eq!(
        store.settle_create(&header("run-2", 2)).await.unwrap(),
        Settled::NotDone
    );
    assert_eq!(
        store.settle_create(&header("run-1", 1)).await.unwrap(),
        Settled::Done
    );
}

async fn a_settled_transition_is_found_or_fenced_for_good<S: Store>(store: Arc<S>) {
    create(&*store, "run-1", 1, start(1)).await;

    // A write that was done is found by its id, and the settle changes nothing.
    let (done, done_id) = named(status_write("running", r#"{"e":1}"#, 2));
    assert_eq!(store.apply_transition("run-1", 1, done).await.unwrap(), 2);
    let before = load(&*store, "run-1").await;
    assert_eq!(
        store.settle_transition("run-1", 1, &done_id).await.unwrap(),
        Settled::Done
    );
    assert_eq!(load(&*store, "run-1").await, before);

    // A write that was not done (still on its way) is fenced: the version moves on, so when it
    // arrives it is a conflict and writes nothing. Nothing else about the run changes.
    let (late, late_id) = named(status_write("cancelled", r#"{"e":2}"#, 3));
    assert_eq!(
        store.settle_transition("run-1", 2, &late_id).await.unwrap(),
        Settled::NotDone
    );
    let fenced = load(&*store, "run-1").await;
    assert_eq!(fenced.version, 3);
    assert_eq!(
        StoredRun {
            version: before.version,
            ..fenced.clone()
        },
        before
    );
    match store.apply_transition("run-1", 2, late).await {
        Err(Error::Conflict {
            expected, actual, ..
        }) => assert_eq!((expected, actual), (2, 3)),
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert_eq!(load(&*store, "run-1").await, fenced);
    assert_eq!(store.active_runs().await.unwrap(), strings(&["run-1"]));
    // Settled again: the same answer, and no second fence.
    assert_eq!(
        store.settle_transition("run-1", 2, &late_id).await.unwrap(),
        Settled::NotDone
    );
    assert_eq!(store.version("run-1").await.unwrap(), Some(3));

    // A write that another write beat to its version was not done, and never will be.
    let (other, _) = named(status_write("running", r#"{"e":3}"#, 4));
    assert_eq!(store.apply_transition("run-1", 3, other).await.unwrap(), 4);
    assert_eq!(
        store
            .settle_transition("run-1", 3, &new_write_id())
            .await
            .unwrap(),
        Settled::NotDone
    );
    assert_eq!(store.version("run-1").await.unwrap(), Some(4));
    // The write found done is still found after others came.
    assert_eq!(
        store.settle_transition("run-1", 1, &done_id).await.unwrap(),
        Settled::Done
    );

    // A run that does not exist: nothing was done.
    assert_eq!(
        store
            .settle_transition("ghost", 1, &new_write_id())
            .await
            .unwrap(),
        Settled::NotDone
    );
    assert!(store.load_run("ghost").await.unwrap().is_none());
}

async fn a_settle_remembers_only_the_last_writes<S: Store>(store: Arc<S>) {
    create(&*store, "run-1", 1, start(1)).await;
    let mut ids = Vec::new();
    for n in 1..=WRITES_KEPT as u64 + 2 {
        let (write, id) = named(status_write(
            "running",
            &format!(r#"{{"e":{n}}}"#),
            n as i64,
        ));
        assert_eq!(
            store.apply_transition("run-1", n, write).await.unwrap(),
            n + 1
        );
        ids.push((n, id));
    }
    let version = WRITES_KEPT as u64 + 3;
    for (expected, id) in &ids {
        let settled = store
            .settle_transition("run-1", *expected, id)
            .await
            .unwrap();
        // The write that made version `expected + 1` is remembered while it is among the last
        // WRITES_KEPT; beyond them, the store cannot say (but the write can no longer be done).
        let remembered = expected + 1 > version - WRITES_KEPT as u64;
        let wanted = if remembered {
            Settled::Done
        } else {
            Settled::Unknown
        };
        assert_eq!(settled, wanted, "the write at version {expected}");
    }
    // None of those settles changed the run.
    assert_eq!(store.version("run-1").await.unwrap(), Some(version));
}

async fn a_voided_run_s_idempotency_key_is_reclaimed<S: Store>(store: Arc<S>) {
    let claimed = |run_id: &str| Claim::Held {
        run_id: run_id.to_owned(),
        request_sha256: "digest".to_owned(),
    };
    assert_eq!(
        store
            .claim_idempotency_key("order", "run-a", "digest", 60)
            .await
            .unwrap(),
        Claim::Claimed
    );
    // run-a was voided: the key names run-b from now on.
    assert_eq!(
        store
            .reclaim_idempotency_key("order", "run-a", "run-b", "digest", 60)
            .await
            .unwrap(),
        Claim::Claimed
    );
    assert_eq!(
        store
            .claim_idempotency_key("order", "run-c", "digest", 60)
            .await
            .unwrap(),
        claimed("run-b")
    );
    // A second reclaim from run-a (another submitter saw it voided too) finds run-b.
    assert_eq!(
        store
            .reclaim_idempotency_key("order", "run-a", "run-d", "digest", 60)
            .await
            .unwrap(),
        claimed("run-b")
    );
    // Another request's digest never takes the key over.
    assert_eq!(
        store
            .reclaim_idempotency_key("order", "run-b", "run-e", "other", 60)
            .await
            .unwrap(),
        claimed("run-b")
    );
    // A key that expired (or was never claimed) is claimed.
    assert_eq!(
        store
            .reclaim_idempotency_key("fresh", "run-x", "run-y", "digest", 60)
            .await
            .unwrap(),
        Claim::Claimed
    );
}

// ---------------------------------------------------------------------------------------------
// Redis only: the key layout.

mod redis_layout {
    use std::collections::BTreeSet;

    use super::*;

    async fn raw(server: &RedisServer) -> ::redis::aio::MultiplexedConnection {
        ::redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    async fn keys(con: &mut ::redis::aio::MultiplexedConnection, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = ::redis::cmd("KEYS")
            .arg(pattern)
            .query_async(con)
            .await
            .unwrap();
        keys.sort();
        keys
    }

    async fn start() -> (RedisServer, RedisStore) {
        let server = RedisServer::start();
        assert_ne!(server.port(), 6379, "never the shared Redis");
        let store = RedisStore::connect(&server.url()).await.unwrap();
        assert_eq!(store.prefix(), "baton");
        (server, store)
    }

    #[tokio::test]
    async fn every_run_key_carries_the_run_hash_tag() {
        let (server, store) = start().await;
        let run_ids = ["run-a", "0190b6d4-5d2e-7c3a-9f1e-2b8a4c6d8e0f"];
        for (n, run_id) in run_ids.iter().enumerate() {
            let first = TransitionWrite {
                results: result_bytes(vec![("seed#1".to_owned(), json("1"))]),
                ..super::start(n as i64)
            };
            create(&store, run_id, n as i64, first).await;
            let write = TransitionWrite {
                results: result_bytes(vec![("plan#1".to_owned(), binary())]),
                steps: vec![("plan".to_owned(), json("{}"))],
                tasks_set: vec![("review#1".to_owned(), timed("coder", 1, 1_000))],
                links: vec![json("{}")],
                decisions: vec![("plan#1/0".to_owned(), json("{}"))],
                ..status_write("running", "plan done", 10)
            };
            store.apply_transition(run_id, 1, write).await.unwrap();
            let renewed = swap(
                run_id,
                "review#1",
                timed("coder", 1, 1_000),
                Some(timed("coder", 1, 2_000 + n as i64)),
            );
            assert_eq!(store.swap_tasks(vec![renewed]).await.unwrap(), vec![true]);
        }

        let mut con = raw(&server).await;
        let run_keys = keys(&mut con, "baton:run:*").await;
        for key in &run_keys {
            assert!(
                run_ids
                    .iter()
                    .any(|run_id| key.contains(&format!("{{{run_id}}}"))),
                "{key} does not carry a run's hash tag"
            );
        }
        for run_id in run_ids {
            let mut expected: Vec<String> = [
                "",
                ":events",
                ":results",
                ":steps",
                ":tasks",
                ":chain",
                ":decisions",
            ]
            .iter()
            .map(|suffix| format!("baton:run:{{{run_id}}}{suffix}"))
            .collect();
            expected.sort();
            let mine: Vec<String> = run_keys
                .iter()
                .filter(|key| key.contains(&format!("{{{run_id}}}")))
                .cloned()
                .collect();
            assert_eq!(mine, expected);
        }
        assert_eq!(run_keys.len(), 2 * 7);

        // Besides the runs, only the indexes: all runs, running runs, runs per workflow id, and
        // the timers of each agent.
        let all = keys(&mut con, "*").await;
        let others: Vec<&String> = all.iter().filter(|key| !run_keys.contains(key)).collect();
        assert_eq!(
            others,
            vec![
                "baton:runs",
                "baton:runs:active",
                "baton:timers:coder",
                "baton:workflow:wf-0190b6d4-5d2e-7c3a-9f1e-2b8a4c6d8e0f:runs",
                "baton:workflow:wf-run-a:runs",
            ]
        );

        // A timer is `<run id>/<task key>`, scored with the task's due time.
        let timers: Vec<(String, i64)> = ::redis::cmd("ZRANGE")
            .arg("baton:timers:coder")
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(
            timers,
            vec![
                ("run-a/review#1".to_owned(), 2_000),
                (
                    "0190b6d4-5d2e-7c3a-9f1e-2b8a4c6d8e0f/review#1".to_owned(),
                    2_001
                ),
            ]
        );

        // The header hash holds the documented fields; a `None` error is no field at all.
        let header: HashMap<String, Vec<u8>> = ::redis::cmd("HGETALL")
            .arg("baton:run:{run-a}")
            .query_async(&mut con)
            .await
            .unwrap();
        let fields: BTreeSet<&str> = header.keys().map(String::as_str).collect();
        assert_eq!(
            fields,
            BTreeSet::from([
                "created_ms",
                "input",
                "state_sha256",
                "status",
                "submitted_by",
                "traceparent",
                "updated_ms",
                "version",
                "workflow",
                "workflow_id",
                "writes",
            ])
        );
        assert_eq!(header["input"], binary());
        assert_eq!(header["version"], b"2");
    }

    #[tokio::test]
    async fn a_result_is_stored_once() {
        let (server, store) = start().await;
        let first = TransitionWrite {
            results: result_bytes(vec![("seed#1".to_owned(), json("0"))]),
            ..super::start(1)
        };
        create(&store, "run-1", 1, first).await;
        let write = TransitionWrite {
            results: result_bytes(vec![
                ("seed#1".to_owned(), json("0")),
                ("plan#1".to_owned(), binary()),
                ("plan#1".to_owned(), binary()),
                ("review#1".to_owned(), json("2")),
            ]),
            ..status_write("running", "e", 2)
        };
        store.apply_transition("run-1", 1, write).await.unwrap();
        let retry = TransitionWrite {
            results: result_bytes(vec![("review#1".to_owned(), json("2"))]),
            ..status_write("running", "e", 3)
        };
        store.apply_transition("run-1", 2, retry).await.unwrap();

        let mut con = raw(&server).await;
        let len: usize = ::redis::cmd("HLEN")
            .arg("baton:run:{run-1}:results")
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(len, 3);
        assert_eq!(load(&store, "run-1").await.results.len(), 3);
    }

    #[tokio::test]
    async fn refused_calls_leave_no_keys() {
        let (server, store) = start().await;
        assert!(matches!(
            store
                .apply_transition("ghost", 1, status_write("running", "e", 1))
                .await,
            Err(Error::NotFound(_))
        ));
        let ghost = swap(
            "ghost",
            "plan#1",
            json("{}"),
            Some(timed("coder", 1, 1_000)),
        );
        assert_eq!(store.swap_tasks(vec![ghost]).await.unwrap(), vec![false]);
        let removal = swap("ghost", "plan#1", json("{}"), None);
        assert_eq!(store.swap_tasks(vec![removal]).await.unwrap(), vec![false]);
        assert!(
            store
                .due_tasks("coder", i64::MAX, 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(store.task("ghost", "plan#1").await.unwrap(), None);
        assert_eq!(store.version("ghost").await.unwrap(), None);
        assert!(store.load_run("ghost").await.unwrap().is_none());
        let mut con = raw(&server).await;
        assert!(keys(&mut con, "*").await.is_empty());
    }

    /// The length of each key, asked with its command (`LLEN`, `HLEN`).
    async fn lengths_of(
        con: &mut ::redis::aio::MultiplexedConnection,
        keys: &[(String, &str)],
    ) -> Vec<usize> {
        let mut lengths = Vec::new();
        for (key, count) in keys {
            let len: usize = ::redis::cmd(count).arg(key).query_async(con).await.unwrap();
            lengths.push(len);
        }
        lengths
    }

    #[tokio::test]
    async fn a_key_of_the_wrong_type_is_corrupt_and_nothing_is_written() {
        // Each key a transition writes, replaced by a string in turn: the script must refuse
        // before its first write, naming the key (the header by Redis's own WRONGTYPE, on the
        // read that comes before any write).
        for (n, key) in [
            "",
            ":events",
            ":results",
            ":steps",
            ":tasks",
            ":chain",
            ":decisions",
        ]
        .into_iter()
        .enumerate()
        {
            let (server, store) = start().await;
            let run_id = format!("run-{n}");
            create(&store, &run_id, 1, super::start(1)).await;
            let mut con = raw(&server).await;
            let broken = format!("baton:run:{{{run_id}}}{key}");
            let _: () = ::redis::cmd("DEL")
                .arg(&broken)
                .query_async(&mut con)
                .await
                .unwrap();
            let _: () = ::redis::cmd("SET")
                .arg(&broken)
                .arg("oops")
                .query_async(&mut con)
                .await
                .unwrap();
            // How long every other key of the run is before the transition.
            let others: Vec<(String, &str)> = [
                (":events", "LLEN"),
                (":results", "HLEN"),
                (":steps", "HLEN"),
                (":tasks", "HLEN"),
                (":chain", "LLEN"),
                (":decisions", "HLEN"),
            ]
            .into_iter()
            .filter(|(other, _)| *other != key)
            .map(|(other, count)| (format!("baton:run:{{{run_id}}}{other}"), count))
            .collect();
            let lengths = lengths_of(&mut con, &others).await;
            let write = TransitionWrite {
                results: result_bytes(vec![("plan#1".to_owned(), json("1"))]),
                steps: vec![("plan".to_owned(), json("{}"))],
                tasks_set: vec![(
                    "code#1".to_owned(),
                    json(r#"{"agent":"coder","due_ms":5,"attempt":1}"#),
                )],
                links: vec![json(r#"{"link":1}"#)],
                decisions: vec![("plan#1/0".to_owned(), json("{}"))],
                ..status_write("running", "e", 2)
            };
            match store.apply_transition(&run_id, 1, write).await {
                Err(Error::Corrupt(message)) if key.is_empty() => {
                    assert!(message.contains("WRONGTYPE"), "{key}: {message}")
                }
                Err(Error::Corrupt(message)) => {
                    assert!(message.contains(&broken), "{key}: {message}")
                }
                other => panic!("{key}: expected Corrupt, got {other:?}"),
            }
            let kind: String = ::redis::cmd("TYPE")
                .arg(&broken)
                .query_async(&mut con)
                .await
                .unwrap();
            assert_eq!(kind, "string", "{key}: the broken key is left as it was");
            for (((other, _), before), after) in others
                .iter()
                .zip(lengths)
                .zip(lengths_of(&mut con, &others).await)
            {
                assert_eq!(after, before, "{key}: {other} was written");
            }
            if !key.is_empty() {
                let version: String = ::redis::cmd("HGET")
                    .arg(format!("baton:run:{{{run_id}}}"))
                    .arg("version")
                    .query_async(&mut con)
                    .await
                    .unwrap();
                assert_eq!(version, "1", "{key}: the run moved on");
                let due = store.due_tasks("coder", 10, 10).await.unwrap();
                assert!(due.is_empty(), "{key}: a timer was set: {due:?}");
            }
        }
    }

    /// Index entries the runs do not back: `gone` (no such run) listed at `created_ms`, and
    /// `gone` and the finished `run-b` in the active set.
    async fn stale_index_entries(con: &mut ::redis::aio::MultiplexedConnection, created_ms: i64) {
        let _: () = ::redis::cmd("ZADD")
            .arg("baton:runs")
            .arg(created_ms)
            .arg("gone")
            .query_async(con)
            .await
            .unwrap();
        let _: () = ::redis::cmd("SADD")
            .arg("baton:runs:active")
            .arg("gone")
            .arg("run-b")
            .query_async(con)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn indexes_can_be_rebuilt() {
        let (server, store) = start().await;
        create(&store, "run-a", 1, super::start(1)).await;
        create(&store, "run-b", 2, super::start(2)).await;
        create(&store, "run-c", 3, super::start(3)).await;
        store
            .apply_transition("run-b", 1, status_write("succeeded", "done", 5))
            .await
            .unwrap();
        let listed = newest(&store, 10).await;
        let active = sorted(store.active_runs().await.unwrap());
        assert_eq!(active, strings(&["run-a", "run-c"]));

        // Lose the indexes, and leave a stale id in them.
        let mut con = raw(&server).await;
        let _: () = ::redis::cmd("DEL")
            .arg("baton:runs")
            .arg("baton:runs:active")
            .query_async(&mut con)
            .await
            .unwrap();
        stale_index_entries(&mut con, 7).await;
        assert!(newest(&store, 10).await.len() < listed.len());

        assert_eq!(store.rebuild_indexes().await.unwrap(), 3);
        assert_eq!(newest(&store, 10).await, listed);
        assert_eq!(sorted(store.active_runs().await.unwrap()), active);
        let members: Vec<String> = ::redis::cmd("SMEMBERS")
            .arg("baton:runs:active")
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(sorted(members), active);
    }

    /// The active-runs index may lag (an out-of-order update, a run gone): a page of running
    /// runs checks each run's own status, and lists no run that does not run.
    #[tokio::test]
    async fn a_stale_active_index_lists_only_runs_that_run() {
        let (server, store) = start().await;
        for (run_id, created_ms) in [("run-a", 1), ("run-b", 2), ("run-c", 3)] {
            create(&store, run_id, created_ms, super::start(created_ms)).await;
        }
        store
            .apply_transition("run-b", 1, status_write("succeeded", "done", 5))
            .await
            .unwrap();
        let mut con = raw(&server).await;
        stale_index_entries(&mut con, 4).await;
        for limit in [1, 10] {
            let running = every_page(
                &store,
                RunQuery {
                    status: Some(RunStatus::Running),
                    ..RunQuery::newest(limit)
                },
            )
            .await;
            let ids: Vec<&str> = running.iter().map(|run| run.run_id.as_str()).collect();
            assert_eq!(ids, ["run-c", "run-a"], "limit {limit}");
        }
        let succeeded = every_page(
            &store,
            RunQuery {
                status: Some(RunStatus::Succeeded),
                ..RunQuery::newest(10)
            },
        )
        .await;
        assert_eq!(succeeded.len(), 1);
        assert_eq!(succeeded[0].run_id, "run-b");
    }

    #[tokio::test]
    async fn a_prefix_keeps_stores_apart() {
        let server = RedisServer::start();
        let one = RedisStore::connect_with_prefix(&server.url(), "one")
            .await
            .unwrap();
        let two = RedisStore::connect_with_prefix(&server.url(), "two")
            .await
            .unwrap();
        create(&one, "run-1", 1, super::start(1)).await;
        assert!(two.load_run("run-1").await.unwrap().is_none());
        assert!(newest(&two, 10).await.is_empty());
        create(&two, "run-1", 2, super::start(2)).await;
        assert_eq!(load(&one, "run-1").await.header.created_ms, 1);
        let mut con = raw(&server).await;
        assert!(
            keys(&mut con, "*")
                .await
                .iter()
                .all(|key| key.starts_with("one:") || key.starts_with("two:"))
        );
        assert!(matches!(
            RedisStore::connect_with_prefix(&server.url(), "bad{prefix}").await,
            Err(Error::Unavailable(_))
        ));
    }

    /// Pauses every client of `server` but the caller for `ms` (`mode`: `ALL`, or `WRITE`: only
    /// commands that may write, scripts included, wait).
    async fn pause(con: &mut ::redis::aio::MultiplexedConnection, ms: u64, mode: &str) {
        let _: () = ::redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(ms)
            .arg(mode)
            .query_async(con)
            .await
            .unwrap();
    }

    /// Until a client of the server waits, paused (`CLIENT LIST`: `flags=b`): the store's, with
    /// the write it sent.
    async fn until_a_write_waits(con: &mut ::redis::aio::MultiplexedConnection) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let clients: String = ::redis::cmd("CLIENT")
                .arg("LIST")
                .query_async(con)
                .await
                .unwrap();
            if clients.lines().any(|client| client.contains(" flags=b ")) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no client waits: {clients}"
            );
            tokio::task::yield_now().await;
        }
    }

    /// Has Redis load the scripts of a create and a transition (a run `warm`), so that a write
    /// sent while Redis is paused waits in its script, not in `SCRIPT LOAD`, and is not refused
    /// with `NOSCRIPT` once Redis gets to it.
    async fn load_scripts(store: &RedisStore) {
        create(store, "warm", 0, super::start(0)).await;
        store
            .apply_transition("warm", 1, status_write("running", "{}", 0))
            .await
            .unwrap();
    }

    /// `settle` asked until it answers (each try times out while Redis is paused), for at most
    /// ten seconds.
    async fn settled<F, Fut>(settle: F) -> Settled
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Settled, Error>>,
    {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match settle().await {
                Ok(settled) => return settled,
                Err(error) => assert!(
                    tokio::time::Instant::now() < deadline,
                    "the settle never answered: {error}"
                ),
            }
        }
    }

    /// Attack: a busy Redis (paused here, as a long script or a flood of big submits would
    /// hold it) takes longer than the store's timeout to answer a create or a transition. The
    /// write is not reported failed (it runs once Redis gets to it): it is `Indeterminate`, and
    /// its settle, sent behind it on the same connection, finds it done.
    #[tokio::test]
    async fn a_write_redis_is_too_busy_to_answer_is_indeterminate_and_settled_done() {
        let (server, store) = start().await;
        let mut con = raw(&server).await;
        load_scripts(&store).await;

        let lost = header("run-1", 1);
        pause(&mut con, 1_500, "ALL").await;
        match store.create_run(lost.clone(), super::start(1)).await {
            Err(Error::Indeterminate(why)) => assert!(why.contains("did not answer"), "{why}"),
            other => panic!("expected Indeterminate, got {other:?}"),
        }
        assert_eq!(settled(|| store.settle_create(&lost)).await, Settled::Done);
        assert_eq!(load(&store, "run-1").await.version, 1);
        assert_eq!(newest(&store, 10).await.len(), 2);

        pause(&mut con, 1_500, "ALL").await;
        let (write, id) = named(status_write("cancelled", r#"{"e":"cancel"}"#, 2));
        match store.apply_transition("run-1", 1, write).await {
            Err(Error::Indeterminate(_)) => {}
            other => panic!("expected Indeterminate, got {other:?}"),
        }
        assert_eq!(
            settled(|| store.settle_transition("run-1", 1, &id)).await,
            Settled::Done
        );
        let run = load(&store, "run-1").await;
        assert_eq!((run.version, run.status.as_str()), (2, "cancelled"));
        // The settle brought the active index in line, as the lost answer would have.
        assert_eq!(store.active_runs().await.unwrap(), strings(&["warm"]));
    }

    /// Attack: the same, but the write never reaches Redis's script (its connection dies while
    /// Redis is busy): its settle voids the run id, or fences the version, so that the write
    /// can never be done later, and says it was not done.
    #[tokio::test]
    async fn a_write_lost_on_its_way_is_settled_not_done_and_never_lands() {
        let (server, store) = start().await;
        let mut con = raw(&server).await;
        load_scripts(&store).await;

        let lost = header("run-1", 1);
        pause(&mut con, 1_500, "WRITE").await;
        let creating = tokio::spawn({
            let store = store.clone();
            async move { store.create_run(header("run-1", 1), super::start(1)).await }
        });
        until_a_write_waits(&mut con).await;
        let _: i64 = ::redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query_async(&mut con)
            .await
            .unwrap();
        match creating.await.unwrap() {
            Err(Error::Indeterminate(_)) => {}
            other => panic!("expected Indeterminate, got {other:?}"),
        }
        assert_eq!(
            settled(|| store.settle_create(&lost)).await,
            Settled::NotDone
        );
        assert!(store.load_run("run-1").await.unwrap().is_none());
        assert_eq!(newest(&store, 10).await.len(), 1);
        // The create, should it come now, is refused.
        assert!(matches!(
            store.create_run(header("run-1", 1), super::start(1)).await,
            Err(Error::Voided(_))
        ));

        create(&store, "run-2", 2, super::start(2)).await;
        let before = load(&store, "run-2").await;
        pause(&mut con, 1_500, "WRITE").await;
        let (write, id) = named(status_write("cancelled", r#"{"e":"cancel"}"#, 3));
        let cancelling = tokio::spawn({
            let store = store.clone();
            let write = write.clone();
            async move { store.apply_transition("run-2", 1, write).await }
        });
        until_a_write_waits(&mut con).await;
        let _: i64 = ::redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(matches!(
            cancelling.await.unwrap(),
            Err(Error::Indeterminate(_))
        ));
        assert_eq!(
            settled(|| store.settle_transition("run-2", 1, &id)).await,
            Settled::NotDone
        );
        let fenced = load(&store, "run-2").await;
        assert_eq!(
            (fenced.version, fenced.status.as_str()),
            (2, before.status.as_str())
        );
        // The transition, should it come now, conflicts and writes nothing.
        assert!(matches!(
            store.apply_transition("run-2", 1, write).await,
            Err(Error::Conflict { actual: 2, .. })
        ));
        assert_eq!(load(&store, "run-2").await, fenced);
    }

    /// Attack: Redis reaches its maxmemory (with `noeviction`, the default) and refuses every
    /// write. Reads went on failing too, as `load_run` read in a `MULTI`, whose queued reads a
    /// Redis out of memory refuses. Now every read answers, writes are refused outright (not
    /// `Indeterminate`: nothing was written) naming memory, and so is `ping`, which readiness
    /// asks; once memory is there again, all is as before.
    #[tokio::test]
    async fn reads_answer_while_redis_refuses_writes_for_memory() {
        let (server, store) = start().await;
        let first = TransitionWrite {
            tasks_set: vec![("plan#1".to_owned(), timed("coder", 1, 1_000))],
            decisions: vec![("plan#1/0".to_owned(), json("{}"))],
            ..super::start(1)
        };
        create(&store, "run-1", 1, first).await;
        store
            .apply_transition("run-1", 1, status_write("running", r#"{"e":1}"#, 2))
            .await
            .unwrap();
        let before = load(&store, "run-1").await;
        let mut con = raw(&server).await;
        let _: () = ::redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(1)
            .query_async(&mut con)
            .await
            .unwrap();

        assert_eq!(load(&store, "run-1").await, before);
        assert_eq!(store.version("run-1").await.unwrap(), Some(2));
        assert_eq!(
            listed(&newest(&store, 10).await),
            vec![(
                "run-1".to_owned(),
                "wf-run-1".to_owned(),
                "running".to_owned(),
                1
            )]
        );
        let running = store
            .list_runs(RunQuery {
                status: Some(RunStatus::Running),
                ..RunQuery::newest(10)
            })
            .await
            .unwrap();
        assert_eq!(running.runs.len(), 1);
        assert_eq!(store.active_runs().await.unwrap(), strings(&["run-1"]));
        assert_eq!(
            store.runs_of_workflow("wf-run-1", 10).await.unwrap(),
            strings(&["run-1"])
        );
        assert!(store.task("run-1", "plan#1").await.unwrap().is_some());
        assert_eq!(store.tasks("run-1").await.unwrap().len(), 1);
        assert_eq!(store.decisions("run-1").await.unwrap().len(), 1);
        assert_eq!(due_keys(&store, "coder", i64::MAX).await.len(), 1);

        let memory = |outcome: Result<(), Error>| match outcome {
            Err(Error::Unavailable(why)) => assert!(why.contains("out of memory"), "{why}"),
            other => panic!("expected Unavailable naming memory, got {other:?}"),
        };
        memory(
            store
                .apply_transition("run-1", 2, status_write("succeeded", r#"{"e":2}"#, 3))
                .await
                .map(|_| ()),
        );
        memory(store.create_run(header("run-2", 3), super::start(3)).await);
        memory(store.ping().await);
        assert_eq!(load(&store, "run-1").await, before);
        assert!(store.load_run("run-2").await.unwrap().is_none());
        assert_eq!(newest(&store, 10).await.len(), 1);

        let _: () = ::redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(0)
            .query_async(&mut con)
            .await
            .unwrap();
        store.ping().await.unwrap();
        assert_eq!(
            store
                .apply_transition("run-1", 2, status_write("succeeded", r#"{"e":2}"#, 3))
                .await
                .unwrap(),
            3
        );
        create(&store, "run-2", 3, super::start(3)).await;
    }

    /// A run is listed before it is created (the entries, then the run, in one pipeline), so a
    /// crash between them leaves an entry that names no run: readers skip it, and
    /// `rebuild_indexes` settles it (voids the id, should its create still come) and removes it.
    #[tokio::test]
    async fn an_entry_whose_run_never_came_is_skipped_and_rebuild_voids_it() {
        let (server, store) = start().await;
        create(&store, "run-1", 1, super::start(1)).await;
        let mut con = raw(&server).await;
        let _: () = ::redis::pipe()
            .cmd("ZADD")
            .arg("baton:runs")
            .arg(5)
            .arg("lost")
            .ignore()
            .cmd("SADD")
            .arg("baton:runs:active")
            .arg("lost")
            .ignore()
            .query_async(&mut con)
            .await
            .unwrap();
        let ids = |runs: Vec<RunSummary>| -> Vec<String> {
            runs.into_iter().map(|run| run.run_id).collect()
        };
        assert_eq!(ids(newest(&store, 10).await), strings(&["run-1"]));
        assert_eq!(store.active_runs().await.unwrap(), strings(&["run-1"]));

        assert_eq!(store.rebuild_indexes().await.unwrap(), 1);
        let listed: Vec<String> = ::redis::cmd("ZRANGE")
            .arg("baton:runs")
            .arg(0)
            .arg(-1)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(listed, strings(&["run-1"]));
        assert!(matches!(
            store.create_run(header("lost", 5), super::start(5)).await,
            Err(Error::Voided(_))
        ));
    }

    #[tokio::test]
    async fn a_lost_server_is_unavailable() {
        let (server, store) = start().await;
        create(&store, "run-1", 1, super::start(1)).await;
        drop(server);
        let outcome =
            tokio::time::timeout(std::time::Duration::from_secs(20), store.load_run("run-1"))
                .await
                .expect("load_run returns once the server is gone");
        assert!(matches!(outcome, Err(Error::Unavailable(_))), "{outcome:?}");
    }
}

async fn chain_links_append_and_decisions_keep_their_first_write<S: Store>(store: Arc<S>) {
    let mut first = start(10);
    first.links = vec![json(r#"{"n":1}"#)];
    create(&*store, "run-c", 10, first).await;
    let second = TransitionWrite {
        links: vec![json(r#"{"n":2}"#), json(r#"{"n":3}"#)],
        decisions: vec![
            ("plan#1/0".to_owned(), json(r#"{"v":1}"#)),
            ("plan#1/1".to_owned(), json(r#"{"v":1}"#)),
        ],
        ..status_write("running", "{}", 11)
    };
    store.apply_transition("run-c", 1, second).await.unwrap();
    // A retried write of a decision (its embedding recomputed) does not replace the first.
    let third = TransitionWrite {
        decisions: vec![("plan#1/0".to_owned(), json(r#"{"v":2}"#))],
        ..status_write("running", "{}", 12)
    };
    store.apply_transition("run-c", 2, third).await.unwrap();
    let run = load(&*store, "run-c").await;
    assert_eq!(
        run.links,
        vec![json(r#"{"n":1}"#), json(r#"{"n":2}"#), json(r#"{"n":3}"#)]
    );
    assert_eq!(
        store.decisions("run-c").await.unwrap(),
        BTreeMap::from([
            ("plan#1/0".to_owned(), json(r#"{"v":1}"#)),
            ("plan#1/1".to_owned(), json(r#"{"v":1}"#)),
        ])
    );
    // A refused transition appends no link.
    let stale = TransitionWrite {
        links: vec![json(r#"{"n":4}"#)],
        ..status_write("running", "{}", 13)
    };
    assert!(store.apply_transition("run-c", 1, stale).await.is_err());
    assert_eq!(load(&*store, "run-c").await.links.len(), 3);
    assert!(store.decisions("no-such-run").await.unwrap().is_empty());
}

async fn runs_of_workflow_newest_first_and_limited<S: Store>(store: Arc<S>) {
    for (run_id, created_ms) in [("a", 1), ("b", 3), ("c", 2)] {
        let mut header = header(run_id, created_ms);
        header.workflow_id = "review".to_owned();
        store.create_run(header, start(created_ms)).await.unwrap();
    }
    create(&*store, "other", 4, start(4)).await;
    assert_eq!(
        store.runs_of_workflow("review", 10).await.unwrap(),
        strings(&["b", "c", "a"])
    );
    assert_eq!(
        store.runs_of_workflow("review", 2).await.unwrap(),
        strings(&["b", "c"])
    );
    assert!(
        store
            .runs_of_workflow("nothing", 10)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn idempotency_keys_are_claimed_once_until_they_expire<S: Store>(store: Arc<S>) {
    assert_eq!(
        store
            .claim_idempotency_key("order 42", "run-a", "digest-a", 60)
            .await
            .unwrap(),
        Claim::Claimed
    );
    let held = Claim::Held {
        run_id: "run-a".to_owned(),
        request_sha256: "digest-a".to_owned(),
    };
    // A second claim, with another run id and digest, changes nothing.
    assert_eq!(
        store
            .claim_idempotency_key("order 42", "run-b", "digest-b", 60)
            .await
            .unwrap(),
        held
    );
    assert_eq!(
        store
            .claim_idempotency_key("order 42", "run-c", "digest-c", 60)
            .await
            .unwrap(),
        held
    );
    assert_eq!(
        store
            .claim_idempotency_key("order 43", "run-b", "digest-b", 60)
            .await
            .unwrap(),
        Claim::Claimed
    );
    // Once it expires, the key is free again.
    store
        .claim_idempotency_key("short", "run-d", "digest-d", 1)
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    assert_eq!(
        store
            .claim_idempotency_key("short", "run-e", "digest-e", 1)
            .await
            .unwrap(),
        Claim::Claimed
    );
}

// ---------------------------------------------------------------------------------------------
// Live output

fn piece(step_id: &str, attempt: u32, text: &str, restart: bool) -> OutputPiece {
    OutputPiece {
        step_id: step_id.to_owned(),
        visit: 2,
        attempt,
        text: text.to_owned(),
        restart,
    }
}

fn texts(output: &[(OutputOffset, OutputPiece)]) -> Vec<&str> {
    output
        .iter()
        .map(|(_, piece)| piece.text.as_str())
        .collect()
}

async fn output_appends_in_order_only_while_the_run_runs<S: Store>(store: Arc<S>) {
    create(&*store, "run-a", 1_000, start(1_000)).await;
    create(&*store, "run-b", 1_000, start(1_000)).await;
    store
        .append_output(vec![
            ("run-a".into(), piece("code", 1, "Writing ", false)),
            ("run-b".into(), piece("plan", 1, "b", false)),
            ("run-a".into(), piece("code", 1, "the théme ✓\n", false)),
            ("no-such-run".into(), piece("code", 1, "lost", false)),
            ("run-a".into(), piece("code", 2, "Again", true)),
        ])
        .await
        .unwrap();
    let output = store.read_output("run-a", None).await.unwrap();
    assert_eq!(texts(&output), ["Writing ", "the théme ✓\n", "Again"]);
    assert_eq!(
        output[2].1,
        piece("code", 2, "Again", true),
        "every field kept"
    );
    assert!(
        output.windows(2).all(|pair| pair[0].0 < pair[1].0),
        "offsets grow: {output:?}"
    );
    let after_first = store.read_output("run-a", Some(output[0].0)).await.unwrap();
    assert_eq!(texts(&after_first), ["the théme ✓\n", "Again"]);
    assert_eq!(
        texts(&store.read_output("run-b", None).await.unwrap()),
        ["b"]
    );
    assert!(
        store
            .read_output("no-such-run", None)
            .await
            .unwrap()
            .is_empty(),
        "a piece for a run that does not exist is dropped"
    );

    // Once the run has ended its output takes no more pieces, and stays readable a while for
    // watchers catching up (it expires OUTPUT_KEPT_AFTER_END later).
    store
        .apply_transition("run-a", 1, status_write("succeeded", "{}", 2_000))
        .await
        .unwrap();
    store
        .append_output(vec![("run-a".into(), piece("code", 2, "late", false))])
        .await
        .unwrap();
    assert_eq!(
        texts(&store.read_output("run-a", None).await.unwrap()),
        ["Writing ", "the théme ✓\n", "Again"]
    );
    assert_eq!(
        load(&*store, "run-a").await.status,
        "succeeded",
        "the run itself is untouched"
    );

    // A run that runs again (a failed run retried) takes output again.
    store
        .apply_transition("run-a", 2, status_write("running", "{}", 3_000))
        .await
        .unwrap();
    store
        .append_output(vec![("run-a".into(), piece("code", 3, "resumed", false))])
        .await
        .unwrap();
    assert_eq!(
        texts(&store.read_output("run-a", None).await.unwrap()),
        ["Writing ", "the théme ✓\n", "Again", "resumed"]
    );
    let active = store.active_runs().await.unwrap();
    assert!(active.iter().any(|id| id == "run-a"), "{active:?}");
}

/// Redis expires a run's output a minute after the run ended.
#[tokio::test]
async fn redis_expires_an_ended_runs_output() {
    let server = RedisServer::start();
    let store = RedisStore::connect_with_prefix(&server.url(), "conformance")
        .await
        .unwrap();
    create(&store, "run-a", 1_000, start(1_000)).await;
    store
        .append_output(vec![("run-a".into(), piece("code", 1, "x", false))])
        .await
        .unwrap();
    let client = ::redis::Client::open(server.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let key = "conformance:run:{run-a}:output";
    let ttl: i64 = ::redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(ttl, -1, "no expiry while the run runs");
    store
        .apply_transition("run-a", 1, status_write("failed", "{}", 2_000))
        .await
        .unwrap();
    let ttl: i64 = ::redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut con)
        .await
        .unwrap();
    let kept = baton_coordinator::store::OUTPUT_KEPT_AFTER_END.as_millis() as i64;
    assert!(ttl > kept - 5_000 && ttl <= kept, "{ttl} ms");
    // Retried, the run runs again: its output no longer expires.
    store
        .apply_transition("run-a", 2, status_write("running", "{}", 3_000))
        .await
        .unwrap();
    let ttl: i64 = ::redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(ttl, -1, "no expiry once the run runs again");
}

async fn output_keeps_the_newest_bytes<S: Store>(store: Arc<S>) {
    create(&*store, "run-a", 1_000, start(1_000)).await;
    let mib = 1 << 20;
    let pieces: Vec<(String, OutputPiece)> = (0..6)
        .map(|n| {
            let text = format!("{n}{}", "x".repeat(mib - 1));
            ("run-a".to_owned(), piece("code", 1, &text, false))
        })
        .collect();
    for piece in pieces {
        store.append_output(vec![piece]).await.unwrap();
    }
    let output = store.read_output("run-a", None).await.unwrap();
    let kept: usize = output.iter().map(|(_, piece)| piece.text.len()).sum();
    assert!(kept <= OUTPUT_MAX_BYTES, "{kept} bytes kept");
    let firsts: Vec<char> = output
        .iter()
        .map(|(_, piece)| piece.text.chars().next().unwrap())
        .collect();
    assert_eq!(firsts, ['2', '3', '4', '5'], "the newest, in order");
}

async fn wait_output_returns_what_comes_and_waits_for_it<S: Store>(store: Arc<S>) {
    use std::time::{Duration, Instant};
    create(&*store, "run-a", 1_000, start(1_000)).await;
    create(&*store, "run-b", 1_000, start(1_000)).await;
    store
        .append_output(vec![("run-a".into(), piece("code", 1, "one", false))])
        .await
        .unwrap();
    let seen = store.read_output("run-a", None).await.unwrap()[0].0;
    let start_offset = OutputOffset::default();

    // Nothing new: empty, after the time given.
    let waited = Instant::now();
    let none = store
        .wait_output(vec![("run-a".into(), seen)], Duration::from_millis(100))
        .await
        .unwrap();
    assert!(none.is_empty(), "{none:?}");
    assert!(waited.elapsed() >= Duration::from_millis(90));

    // What is already there comes at once, from every run asked about.
    let both = store
        .wait_output(
            vec![
                ("run-a".into(), start_offset),
                ("run-b".into(), start_offset),
            ],
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(both.len(), 1);
    assert_eq!(
        (both[0].0.as_str(), both[0].2.text.as_str()),
        ("run-a", "one")
    );

    // A piece appended while it waits ends the wait.
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            store
                .append_output(vec![("run-b".into(), piece("plan", 1, "two", false))])
                .await
                .unwrap();
        })
    };
    let came = store
        .wait_output(
            vec![("run-a".into(), seen), ("run-b".into(), start_offset)],
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    writer.await.unwrap();
    assert_eq!(came.len(), 1, "{came:?}");
    assert_eq!(
        (came[0].0.as_str(), came[0].2.text.as_str()),
        ("run-b", "two")
    );
}

fn slots(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs
        .iter()
        .map(|(agent, free)| ((*agent).to_owned(), *free))
        .collect()
}

async fn free_slots_are_summed_over_the_other_coordinators_until_they_expire<S: Store>(
    store: Arc<S>,
) {
    assert!(store.slots_elsewhere("a", 0).await.unwrap().is_empty());
    store
        .advertise_slots("a", slots(&[("coder", 2)]), 1_000)
        .await
        .unwrap();
    store
        .advertise_slots("b", slots(&[("coder", 3), ("tester", 1)]), 2_000)
        .await
        .unwrap();
    store
        .advertise_slots("c", slots(&[("coder", 4)]), 500)
        .await
        .unwrap();
    // Not its own; c's has expired at 600.
    assert_eq!(
        store.slots_elsewhere("a", 600).await.unwrap(),
        slots(&[("coder", 3), ("tester", 1)])
    );
    assert_eq!(
        store.slots_elsewhere("b", 600).await.unwrap(),
        slots(&[("coder", 2)])
    );
    // A new advertisement replaces the coordinator's last one.
    store
        .advertise_slots("b", slots(&[("tester", 2)]), 3_000)
        .await
        .unwrap();
    assert_eq!(
        store.slots_elsewhere("a", 1_500).await.unwrap(),
        slots(&[("tester", 2)])
    );
    store
        .advertise_slots("b", BTreeMap::new(), 3_000)
        .await
        .unwrap();
    assert!(store.slots_elsewhere("a", 1_500).await.unwrap().is_empty());
    // After every advertisement expired, nothing is counted.
    assert!(store.slots_elsewhere("z", 5_000).await.unwrap().is_empty());
}

async fn a_ping_answers_while_the_store_is_there<S: Store>(store: Arc<S>) {
    store.ping().await.unwrap();
}
