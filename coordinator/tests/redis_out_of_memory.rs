//! A Redis out of memory, through the service, on a real `redis-server` (issue 28, a weak point
//! of Deliver 6).
//!
//! The attack: Redis reaches its `maxmemory` (with `noeviction`, its default policy) and refuses
//! every write. Reads failed too (a run was read back in a `MULTI`, whose queued reads such a
//! Redis refuses), so nobody could look at a run, while `/readyz` still said ready and load
//! balancers kept sending work that could only fail. Now runs stay readable, readiness names the
//! memory, a submit is refused at once and cleanly, and all is as before once memory is there.

#[path = "support/client.rs"]
mod client;
#[path = "support/fake_worker.rs"]
mod fake_worker;
#[path = "support/redis_server.rs"]
#[allow(dead_code)]
mod redis_server;
#[path = "support/running.rs"]
mod running;

use baton_coordinator::store::redis::RedisStore;
use baton_coordinator::store::{Error as StoreError, RunQuery};
use baton_coordinator::{Config, Coordinator, Error, NotReady};
use fake_worker::{FakeWorker, json_bytes};
use redis::aio::MultiplexedConnection;
use redis_server::RedisServer;
use running::running;
use serde_json::json;

const ONE_STEP: &str = r#"{"steps": [{"id": "plan", "type": "agent", "agent": "planner"}]}"#;

async fn maxmemory(con: &mut MultiplexedConnection, bytes: u64) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(bytes)
        .query_async(con)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_stay_readable_and_readiness_names_memory_while_redis_refuses_writes() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let coordinator = running(Coordinator::new(store.clone(), Config::default()));
    let mut worker = FakeWorker::connect(&coordinator, "w", &["planner"]).await;
    let input = json_bytes(&json!("x"));
    let submit = || client::submit(&coordinator, ONE_STEP.as_bytes(), &input);
    let finished = submit().await.unwrap();
    let task = worker.wait_task().await;
    worker
        .complete(&coordinator, &task, &json!({"done": true}), None)
        .await
        .unwrap();
    let running = submit().await.unwrap();
    worker.wait_task().await;
    coordinator.readiness().await.expect("ready");

    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    maxmemory(&mut con, 1).await;

    // Reads answer, from a coordinator that holds nothing in memory too (another one, or this
    // one after a restart, reads every run back from Redis).
    let elsewhere = running::running(Coordinator::new(store, Config::default()));
    for reader in [&coordinator, &elsewhere] {
        assert_eq!(
            reader.record(&finished).await.unwrap().status,
            baton_core::RunStatus::Succeeded
        );
        assert_eq!(
            reader.record(&running).await.unwrap().status,
            baton_core::RunStatus::Running
        );
        let listed: Vec<String> = reader
            .list(RunQuery::newest(10))
            .await
            .unwrap()
            .runs
            .into_iter()
            .map(|run| run.run_id)
            .collect();
        assert_eq!(listed, vec![running.clone(), finished.clone()]);
    }

    // Not ready, and why.
    match coordinator.readiness().await {
        Err(NotReady::StoreUnavailable(why)) => assert!(why.contains("out of memory"), "{why}"),
        other => panic!("expected not ready, got {other:?}"),
    }
    // A submit is refused at once (nothing was written, nothing to settle), naming memory, and
    // leaves no run behind.
    match submit().await {
        Err(Error::Store(StoreError::Unavailable(why))) => {
            assert!(why.contains("out of memory"), "{why}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert_eq!(
        coordinator
            .list(RunQuery::newest(10))
            .await
            .unwrap()
            .runs
            .len(),
        2
    );

    // Memory back (an operator raised maxmemory): ready, and runs move again.
    maxmemory(&mut con, 0).await;
    coordinator.readiness().await.expect("ready again");
    let after = submit().await.unwrap();
    assert!(worker.wait_task().await.task_id.starts_with(&after));
}
