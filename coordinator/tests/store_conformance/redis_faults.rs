//! Redis only: a Redis that does not answer or refuses. A write it is too busy to answer, or
//! that is lost on its way, is `Indeterminate` and settled; reads go on while it refuses writes
//! for memory; a server gone is `Unavailable`.

use baton_coordinator::store::redis::RedisStore;
use baton_coordinator::store::{
    Coordination, Error, Listing, RunQuery, Runs, Settled, Tasks, TransitionWrite,
};
use baton_core::RunStatus;

use super::redis_layout::{raw, start};
use super::support::{self, *};

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
    create(store, "warm", 0, support::start(0)).await;
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
    match store.create_run(lost.clone(), support::start(1)).await {
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
        async move {
            store
                .create_run(header("run-1", 1), support::start(1))
                .await
        }
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
        store
            .create_run(header("run-1", 1), support::start(1))
            .await,
        Err(Error::Voided(_))
    ));

    create(&store, "run-2", 2, support::start(2)).await;
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
        ..support::start(1)
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
    memory(
        store
            .create_run(header("run-2", 3), support::start(3))
            .await,
    );
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
    create(&store, "run-2", 3, support::start(3)).await;
}

#[tokio::test]
async fn a_lost_server_is_unavailable() {
    let (server, store) = start().await;
    create(&store, "run-1", 1, support::start(1)).await;
    drop(server);
    let outcome = tokio::time::timeout(std::time::Duration::from_secs(20), store.load_run("run-1"))
        .await
        .expect("load_run returns once the server is gone");
    assert!(matches!(outcome, Err(Error::Unavailable(_))), "{outcome:?}");
}
