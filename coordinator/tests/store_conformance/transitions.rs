//! Transitions and the tasks they write: timers moved with their tasks, fences that refuse a
//! late attempt's answer (a first transition's included), and writes joined into one.

use std::sync::Arc;

use baton_coordinator::store::{Error, Store, TransitionWrite};

use super::support::*;

pub(crate) async fn transitions_move_timers_with_tasks<S: Store>(store: Arc<S>) {
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

pub(crate) async fn fenced_transitions_apply_only_at_the_current_attempt<S: Store>(store: Arc<S>) {
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
    assert_eq!(run.status, baton_core::RunStatus::Succeeded);
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
pub(crate) async fn transitions_written_together_apply_in_order<S: Store>(store: Arc<S>) {
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

pub(crate) async fn a_fenced_first_transition_creates_nothing<S: Store>(store: Arc<S>) {
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
