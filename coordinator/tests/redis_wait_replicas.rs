//! `--redis-wait-replicas`: a transition counts as written only once the replicas asked for have
//! it. Against a real master and replica (two `redis-server`s of the test's own): while the
//! replica follows, every write the store acknowledged is already on the replica when the call
//! returns; once it is gone, writes are refused as unavailable, naming why, reads of the run are
//! refused too (they could show what a failover will lose), and a store that does not wait is
//! unaffected.

#[path = "support/redis_server.rs"]
#[allow(dead_code)] // shared harness: not every helper is used here
mod redis_server;

use std::time::Duration;

use baton_coordinator::store::redis::{ConnectOptions, RedisStore, WaitReplicas};
use baton_coordinator::store::{Error, RunHeader, Runs, TransitionWrite};
use redis_server::RedisServer;

fn header(run_id: &str) -> RunHeader {
    RunHeader {
        run_id: run_id.to_owned(),
        workflow_id: "wf".to_owned(),
        workflow: "{}".to_owned(),
        input: b"{}".to_vec(),
        created_ms: 1,
        traceparent: String::new(),
        submitted_by: String::new(),
    }
}

fn write(status: &str, updated_ms: i64) -> TransitionWrite {
    TransitionWrite {
        events: vec![br#"{"kind":"step"}"#.to_vec()],
        status: baton_coordinator::store::run_status(status).expect("a run status"),
        state_sha256: format!("{updated_ms:064}"),
        updated_ms,
        ..TransitionWrite::default()
    }
}

async fn raw(port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Makes `replica` follow `master` and waits until the link is up.
async fn follow(replica: &RedisServer, master: &RedisServer) {
    let mut con = raw(replica.port()).await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port())
        .query_async(&mut con)
        .await
        .unwrap();
    for _ in 0..200 {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut con)
            .await
            .unwrap();
        if info.contains("master_link_status:up") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the replica did not follow its master within 10 s");
}

async fn store(master: &RedisServer, replicas: u32) -> RedisStore {
    RedisStore::connect_with(
        &master.url(),
        ConnectOptions {
            prefix: "wait".to_owned(),
            wait: Some(WaitReplicas {
                replicas,
                timeout: Duration::from_millis(300),
            }),
            ..ConnectOptions::default()
        },
    )
    .await
    .expect("connect")
}

async fn version_on(port: u16, run_id: &str) -> Option<u64> {
    let mut con = raw(port).await;
    redis::cmd("HGET")
        .arg(format!("wait:run:{{{run_id}}}"))
        .arg("version")
        .query_async(&mut con)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_transition_is_already_on_the_replica() {
    let master = RedisServer::start();
    let replica = RedisServer::start();
    follow(&replica, &master).await;
    let store = store(&master, 1).await;

    for n in 0..20 {
        let run_id = format!("run-{n}");
        store
            .create_run(header(&run_id), write("running", 1))
            .await
            .expect("create_run with a replica that follows");
        // Read from the replica at once: WAIT returned only after it had the write.
        assert_eq!(version_on(replica.port(), &run_id).await, Some(1));
        let version = store
            .apply_transition(&run_id, 1, write("succeeded", 2))
            .await
            .expect("apply_transition with a replica that follows");
        assert_eq!(version, 2);
        assert_eq!(version_on(replica.port(), &run_id).await, Some(2));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_replicas_a_transition_is_not_acknowledged() {
    let master = RedisServer::start();
    let mut replica = RedisServer::start();
    follow(&replica, &master).await;
    let waiting = store(&master, 1).await;
    let plain = RedisStore::connect_with_prefix(&master.url(), "wait")
        .await
        .unwrap();
    waiting
        .create_run(header("before"), write("running", 1))
        .await
        .expect("create_run while the replica follows");

    replica.stop();
    let refused = waiting
        .apply_transition("before", 1, write("succeeded", 2))
        .await
        .expect_err("no replica: the transition must not count as written");
    // Done on the master, but perhaps lost with it: neither done nor not done for the caller,
    // who must settle it (a settle is backed by replicas too) before answering anyone.
    let Error::Indeterminate(why) = &refused else {
        panic!("expected Indeterminate, got {refused:?}");
    };
    assert!(
        why.contains("run before")
            && why.contains("0 of the 1 replicas")
            && why.contains("--redis-wait-replicas"),
        "{why}"
    );
    let refused = waiting
        .create_run(header("after"), write("running", 1))
        .await
        .expect_err("no replica: a new run must not count as created");
    assert!(matches!(refused, Error::Indeterminate(_)), "{refused:?}");
    let unsettled = waiting
        .settle_transition("before", 1, "0123456789abcdef")
        .await
        .expect_err("no replica: a settle must not count either");
    assert!(
        matches!(unsettled, Error::Indeterminate(_)),
        "{unsettled:?}"
    );

    // Nor may a read show it: the master may be cut off from its replicas and about to be
    // replaced by one that never had it.
    let dirty = waiting
        .load_run("before")
        .await
        .expect_err("a read that no replica backs");
    assert!(matches!(dirty, Error::Unavailable(_)), "{dirty:?}");

    // The master did apply it (WAIT cannot undo a write): a store that does not wait sees it,
    // and the version check keeps a retry from applying it twice.
    let run = plain.load_run("before").await.unwrap().unwrap();
    assert_eq!((run.version, run.status.as_str()), (2, "succeeded"));
    let again = waiting
        .apply_transition("before", 1, write("succeeded", 2))
        .await
        .expect_err("a retry at the old version");
    assert!(
        matches!(again, Error::Conflict { actual: 2, .. }),
        "{again:?}"
    );

    // A store that does not wait is not held up by the missing replica.
    plain
        .create_run(header("plain"), write("running", 1))
        .await
        .expect("a store without --redis-wait-replicas");
}
