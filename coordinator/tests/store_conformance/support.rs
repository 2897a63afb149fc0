//! Fixtures every concern's cases share: a run's header and first transition, writes that
//! change a status, tasks with timers, and reads that list, load or find due tasks.

use baton_coordinator::store::{
    DueTask, RunCursor, RunHeader, RunQuery, RunSummary, Store, StoredRun, TaskSwap,
    TransitionWrite, new_write_id,
};
use baton_core::RunStatus;

/// Every byte value, protocol-looking bytes, and invalid UTF-8.
pub(crate) fn binary() -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..=255u8).collect();
    bytes.extend_from_slice(b"\r\n*1\r\n$4\r\nPING\r\n\0{x}\xff\xfe");
    bytes
}

pub(crate) fn json(text: &str) -> Vec<u8> {
    text.as_bytes().to_vec()
}

/// A transition's results, as the store takes them (shared bytes).
pub(crate) fn result_bytes(pairs: Vec<(String, Vec<u8>)>) -> Vec<(String, bytes::Bytes)> {
    pairs
        .into_iter()
        .map(|(key, value)| (key, value.into()))
        .collect()
}

pub(crate) fn header(run_id: &str, created_ms: i64) -> RunHeader {
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
pub(crate) fn start(created_ms: i64) -> TransitionWrite {
    TransitionWrite {
        events: vec![],
        results: Vec::new(),
        steps: vec![("plan".to_owned(), json(r#"{"state":"queued"}"#))],
        tasks_set: vec![("plan#1".to_owned(), json(r#"{"worker":null}"#))],
        tasks_removed: Vec::new(),
        links: Vec::new(),
        decisions: Vec::new(),
        status: baton_core::RunStatus::Running.to_owned(),
        error: None,
        state_sha256: "0".repeat(64),
        updated_ms: created_ms,
        fences: Vec::new(),
        write_id: String::new(),
    }
}

/// A transition that only changes status (and appends `event`).
pub(crate) fn status_write(status: &str, event: &str, updated_ms: i64) -> TransitionWrite {
    TransitionWrite {
        events: vec![json(event)],
        status: baton_coordinator::store::run_status(status).expect("a run status"),
        state_sha256: format!("{updated_ms:064}"),
        updated_ms,
        ..TransitionWrite::default()
    }
}

pub(crate) async fn load<S: Store>(store: &S, run_id: &str) -> StoredRun {
    store
        .load_run(run_id)
        .await
        .expect("load_run")
        .unwrap_or_else(|| panic!("run {run_id} should exist"))
}

pub(crate) async fn create<S: Store>(
    store: &S,
    run_id: &str,
    created_ms: i64,
    first: TransitionWrite,
) {
    store
        .create_run(header(run_id, created_ms), first)
        .await
        .unwrap_or_else(|err| panic!("create {run_id}: {err}"));
}

/// The newest `limit` runs, unfiltered: the first page of `list_runs`.
pub(crate) async fn newest<S: Store>(store: &S, limit: usize) -> Vec<RunSummary> {
    store
        .list_runs(RunQuery::newest(limit))
        .await
        .expect("list_runs")
        .runs
}

/// Every page of `query`, from its `after` on, following `next` until it is `None`; checks
/// each page's length and that its `next` is not before its last run.
pub(crate) async fn every_page<S: Store>(store: &S, mut query: RunQuery) -> Vec<RunSummary> {
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
pub(crate) type Listed = (String, String, String, i64);

pub(crate) fn listed(runs: &[RunSummary]) -> Vec<Listed> {
    runs.iter()
        .map(|run| {
            (
                run.run_id.clone(),
                run.workflow_id.clone(),
                run.status.to_string(),
                run.created_ms,
            )
        })
        .collect()
}

/// `runs` that match `status` and `workflow_id`, newest first (ties by descending run id).
pub(crate) fn expected(
    runs: &[Listed],
    status: Option<RunStatus>,
    workflow_id: Option<&str>,
) -> Vec<Listed> {
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

pub(crate) fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

pub(crate) fn strings(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|id| id.to_string()).collect()
}

/// A time in milliseconds like the coordinator's, to check that timers keep every digit.
pub(crate) const T: i64 = 1_700_000_000_000;

/// A task with a timer: `agent`'s task at `attempt`, due at `due_ms`.
pub(crate) fn timed(agent: &str, attempt: u32, due_ms: i64) -> Vec<u8> {
    json(&format!(
        r#"{{"agent":"{agent}","attempt":{attempt},"due_ms":{due_ms},"worker":"w1"}}"#
    ))
}

pub(crate) fn swap(
    run_id: &str,
    task_key: &str,
    expected: Vec<u8>,
    new: Option<Vec<u8>>,
) -> TaskSwap {
    TaskSwap {
        run_id: run_id.to_owned(),
        task_key: task_key.to_owned(),
        expected,
        new,
    }
}

pub(crate) fn due_task(run_id: &str, task_key: &str, task: Vec<u8>) -> DueTask {
    DueTask {
        run_id: run_id.to_owned(),
        task_key: task_key.to_owned(),
        task,
    }
}

/// The keys of `agent`'s due tasks, `"<run id>/<task key>"`, in the order `due_tasks` gives them.
pub(crate) async fn due_keys<S: Store>(store: &S, agent: &str, now_ms: i64) -> Vec<String> {
    store
        .due_tasks(agent, now_ms, 100)
        .await
        .expect("due_tasks")
        .into_iter()
        .map(|due| format!("{}/{}", due.run_id, due.task_key))
        .collect()
}

/// A transition with its own write id, as the coordinator writes them.
pub(crate) fn named(mut write: TransitionWrite) -> (TransitionWrite, String) {
    write.write_id = new_write_id();
    let id = write.write_id.clone();
    (write, id)
}
