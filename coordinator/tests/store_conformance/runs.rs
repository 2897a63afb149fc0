//! [`Runs`](baton_coordinator::store::Runs): a run created and loaded back whole, transitions
//! applied at their version only, results written once, a principal's running runs, chain links
//! and decisions.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use baton_coordinator::store::{Error, RunHeader, RunSummary, Store, StoredRun, TransitionWrite};

use super::support::*;

pub(crate) async fn create_then_load<S: Store>(store: Arc<S>) {
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
        status: baton_core::RunStatus::Running.to_owned(),
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
            status: baton_core::RunStatus::Running.to_owned(),
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
        status: baton_core::RunStatus::Failed.to_owned(),
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
            status: baton_core::RunStatus::Failed.to_owned(),
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

pub(crate) async fn create_twice_is_already_exists<S: Store>(store: Arc<S>) {
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
        status: baton_core::RunStatus::Failed.to_owned(),
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

pub(crate) async fn apply_at_the_right_version<S: Store>(store: Arc<S>) {
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
        status: baton_core::RunStatus::Running.to_owned(),
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
            status: baton_core::RunStatus::Running.to_owned(),
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
        status: baton_core::RunStatus::Failed.to_owned(),
        error: Some("review failed".to_owned()),
        state_sha256: "c".repeat(64),
        updated_ms: 300,
        fences: Vec::new(),
        write_id: String::new(),
    };
    assert_eq!(store.apply_transition("run-1", 2, write).await.unwrap(), 3);
    let run = load(&*store, "run-1").await;
    assert_eq!(run.version, 3);
    assert_eq!(run.status, baton_core::RunStatus::Failed);
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
        status: baton_core::RunStatus::Failed.to_owned(),
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
            status: baton_core::RunStatus::Failed.to_owned(),
            created_ms: 100,
            updated_ms: 400,
        }]
    );
}

pub(crate) async fn apply_at_a_stale_version_is_conflict<S: Store>(store: Arc<S>) {
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
    assert_eq!(
        newest(&*store, 10).await[0].status,
        baton_core::RunStatus::Running
    );
}

pub(crate) async fn apply_to_a_missing_run_is_not_found<S: Store>(store: Arc<S>) {
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

pub(crate) async fn rewriting_a_result<S: Store>(store: Arc<S>) {
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
        status: baton_core::RunStatus::Succeeded.to_owned(),
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
    assert_eq!(run.status, baton_core::RunStatus::Succeeded);
    assert_eq!(run.events.len(), 2);
}

pub(crate) async fn a_principal_s_running_runs_are_counted_until_they_end<S: Store>(store: Arc<S>) {
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

pub(crate) async fn concurrent_appliers_one_wins<S: Store>(store: Arc<S>) {
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

pub(crate) async fn chain_links_append_and_decisions_keep_their_first_write<S: Store>(
    store: Arc<S>,
) {
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
