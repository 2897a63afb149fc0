//! Settling writes whose answer was lost (a store that timed out): the caller must learn
//! whether the write was done, and a write settled as not done must never be done later.

use std::sync::Arc;

use baton_coordinator::store::{Error, Settled, Store, StoredRun, WRITES_KEPT, new_write_id};

use super::support::*;

pub(crate) async fn a_settled_create_is_found_or_voided_for_good<S: Store>(store: Arc<S>) {
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

pub(crate) async fn a_settled_transition_is_found_or_fenced_for_good<S: Store>(store: Arc<S>) {
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

pub(crate) async fn a_settle_remembers_only_the_last_writes<S: Store>(store: Arc<S>) {
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
