//! [`Tasks`](baton_coordinator::store::Tasks): swaps that compare exact bytes and move timers,
//! due tasks earliest first and per agent, one task and the version read.

use std::sync::Arc;

use baton_coordinator::store::{Store, TransitionWrite};

use super::support::*;

pub(crate) async fn swap_tasks_only_replace_existing_tasks<S: Store>(store: Arc<S>) {
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

pub(crate) async fn swap_tasks_compares_exact_bytes_and_moves_timers<S: Store>(store: Arc<S>) {
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

pub(crate) async fn due_tasks_are_earliest_first_limited_and_per_agent<S: Store>(store: Arc<S>) {
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

pub(crate) async fn task_and_version_read_one_task_and_the_version<S: Store>(store: Arc<S>) {
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

pub(crate) async fn due_tasks_take_any_limit<S: Store>(store: Arc<S>) {
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

pub(crate) async fn only_an_integer_due_ms_makes_a_timer<S: Store>(store: Arc<S>) {
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
