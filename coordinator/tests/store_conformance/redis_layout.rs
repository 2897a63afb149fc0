//! Redis only: the key layout. Every key of a run carries its hash tag, results are stored
//! once, a refused call leaves no key, the indexes are rebuilt and never list a run that is
//! not there, and a prefix keeps stores apart.

use std::collections::{BTreeSet, HashMap};

use baton_coordinator::store::redis::RedisStore;
use baton_coordinator::store::{
    Error, Listing, RunQuery, RunSummary, Runs, Tasks, TransitionWrite,
};
use baton_core::RunStatus;

use super::redis_server::RedisServer;
use super::support::{self, *};

pub(crate) async fn raw(server: &RedisServer) -> ::redis::aio::MultiplexedConnection {
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

pub(crate) async fn start() -> (RedisServer, RedisStore) {
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
            ..support::start(n as i64)
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
        ..support::start(1)
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
        create(&store, &run_id, 1, support::start(1)).await;
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
    create(&store, "run-a", 1, support::start(1)).await;
    create(&store, "run-b", 2, support::start(2)).await;
    create(&store, "run-c", 3, support::start(3)).await;
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
        create(&store, run_id, created_ms, support::start(created_ms)).await;
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
    create(&one, "run-1", 1, support::start(1)).await;
    assert!(two.load_run("run-1").await.unwrap().is_none());
    assert!(newest(&two, 10).await.is_empty());
    create(&two, "run-1", 2, support::start(2)).await;
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

/// A run is listed before it is created (the entries, then the run, in one pipeline), so a
/// crash between them leaves an entry that names no run: readers skip it, and
/// `rebuild_indexes` settles it (voids the id, should its create still come) and removes it.
#[tokio::test]
async fn an_entry_whose_run_never_came_is_skipped_and_rebuild_voids_it() {
    let (server, store) = start().await;
    create(&store, "run-1", 1, support::start(1)).await;
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
    let ids =
        |runs: Vec<RunSummary>| -> Vec<String> { runs.into_iter().map(|run| run.run_id).collect() };
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
        store.create_run(header("lost", 5), support::start(5)).await,
        Err(Error::Voided(_))
    ));
}

/// A run whose tasks `plan#1` and `review#1` both have timers of agent `coder`, due at 1,000.
async fn two_timed_tasks(store: &RedisStore) {
    let first = TransitionWrite {
        tasks_set: vec![
            ("plan#1".to_owned(), timed("coder", 1, 1_000)),
            ("review#1".to_owned(), timed("coder", 1, 1_000)),
        ],
        ..support::start(1)
    };
    create(store, "run-t", 1, first).await;
}

fn due_keys(due: &[baton_coordinator::store::DueTask]) -> Vec<String> {
    due.iter()
        .map(|task| format!("{}/{}", task.run_id, task.task_key))
        .collect()
}

/// A sweep only reads: Redis holds a command that may write for as long as writes are paused
/// (`CLIENT PAUSE WRITE`, as in a failover), and with it every later command on the
/// coordinator's one connection, reads of runs too.
#[tokio::test]
async fn a_sweep_reads_due_timers_while_writes_are_paused() {
    let (server, store) = start().await;
    two_timed_tasks(&store).await;
    // A sweep before the pause, as a running coordinator's are every few milliseconds: Redis
    // knows a script's flags only once it holds the script, and holds an `EVALSHA` of one it
    // does not (whose `NOSCRIPT` answer would have the store load it) through the pause.
    assert!(store.due_tasks("coder", 0, 10).await.unwrap().is_empty());
    let mut con = raw(&server).await;
    let _: () = ::redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(120_000)
        .arg("WRITE")
        .query_async(&mut con)
        .await
        .unwrap();
    // Not a measure of speed: a sweep held by the pause would wait two minutes.
    let due = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        store.due_tasks("coder", 2_000, 10),
    )
    .await
    .expect("a sweep is not held by a pause of writes")
    .unwrap();
    let _: () = ::redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(due_keys(&due), strings(&["run-t/plan#1", "run-t/review#1"]));
}

/// A timer whose task is gone (only a hand edit does that) is dropped by the sweep that finds
/// it, and the other due timers are still found.
#[tokio::test]
async fn a_timer_whose_task_is_gone_is_dropped_by_the_sweep() {
    let (server, store) = start().await;
    two_timed_tasks(&store).await;
    let mut con = raw(&server).await;
    let _: i64 = ::redis::cmd("HDEL")
        .arg("baton:run:{run-t}:tasks")
        .arg("plan#1")
        .query_async(&mut con)
        .await
        .unwrap();
    let due = store.due_tasks("coder", 2_000, 10).await.unwrap();
    assert_eq!(due_keys(&due), strings(&["run-t/review#1"]));
    let timers: Vec<String> = ::redis::cmd("ZRANGE")
        .arg("baton:timers:coder")
        .arg(0)
        .arg(-1)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(timers, strings(&["run-t/review#1"]));
}
