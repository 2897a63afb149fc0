//! The Redis store on a real Redis Cluster (3 masters, 3 replicas; `support/redis_cluster.rs`),
//! beyond the conformance suite it also passes there: runs spread over every master, the cluster
//! found from one node's URL, a slot that moves mid-run, a master that fails over under
//! `--redis-wait-replicas`, the timer slot registry repaired after a coordinator died between
//! a write and its registration, and the timers of a transition whose answer was lost (applied
//! by a master that answered too late) registered all the same.

#[path = "support/redis_cluster.rs"]
#[allow(dead_code)] // shared harness: not every helper is used here
mod redis_cluster;
#[path = "support/redis_server.rs"]
#[allow(dead_code)]
mod redis_server;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_coordinator::store::redis::{ConnectOptions, RedisStore, WaitReplicas};
use baton_coordinator::store::{Error, Listing, RunHeader, RunQuery, Runs, Tasks, TransitionWrite};
use redis_cluster::RedisCluster;

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

/// A transition that leaves one task of `agent` due at `due_ms`.
fn with_task(status: &str, updated_ms: i64, agent: &str, due_ms: i64) -> TransitionWrite {
    TransitionWrite {
        events: vec![br#"{"kind":"step"}"#.to_vec()],
        tasks_set: vec![(
            "work#1".to_owned(),
            format!(r#"{{"agent":"{agent}","due_ms":{due_ms},"attempt":1}}"#).into_bytes(),
        )],
        status: baton_coordinator::store::run_status(status).expect("a run status"),
        state_sha256: format!("{updated_ms:064}"),
        updated_ms,
        ..TransitionWrite::default()
    }
}

async fn start() -> Arc<RedisCluster> {
    Arc::new(
        tokio::task::spawn_blocking(RedisCluster::start)
            .await
            .expect("start a Redis Cluster"),
    )
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work)
        .await
        .expect("a cluster operation")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runs_land_on_every_master_and_their_timers_with_them() {
    let cluster = RedisCluster::shared();
    // One node's URL is enough: the store finds the cluster behind it.
    let store = RedisStore::connect_with_prefix(&cluster.seed_url(), "spread")
        .await
        .unwrap();
    assert!(store.is_cluster());
    let mut masters = BTreeSet::new();
    let mut runs = Vec::new();
    for n in 0..30 {
        let run_id = format!("run-{n}");
        store
            .create_run(header(&run_id), with_task("running", 1, "coder", 100 + n))
            .await
            .unwrap();
        masters.insert(cluster.master_of_key(&format!("spread:run:{{{run_id}}}")));
        runs.push(run_id);
    }
    assert_eq!(masters.len(), 3, "30 runs should land on all 3 masters");
    // The global indexes are sharded: their entries spread over masters, not one key.
    let index_masters: BTreeSet<u16> = runs
        .iter()
        .map(|run_id| {
            let shard = redis_cluster::slot_of(&format!("{{{run_id}}}")) % 256;
            cluster.master_of_key(&format!("spread:runs:{{i{shard}}}"))
        })
        .collect();
    assert!(index_masters.len() >= 2, "{index_masters:?}");
    let listed: Vec<String> = store
        .list_runs(RunQuery::newest(100))
        .await
        .unwrap()
        .runs
        .into_iter()
        .map(|run| run.run_id)
        .collect();
    let mut newest_first = runs.clone();
    newest_first.sort_by(|a, b| b.cmp(a));
    assert_eq!(listed, newest_first, "every shard merged, newest first");
    // Every run's timer is found by one sweep, earliest first, whichever master holds it.
    let due = store.due_tasks("coder", 1_000, 100).await.unwrap();
    let found: Vec<&str> = due.iter().map(|d| d.run_id.as_str()).collect();
    assert_eq!(found, runs.iter().map(String::as_str).collect::<Vec<_>>());
    // Each run's keys, its timer set included, are on its master: one script wrote them.
    let mut con = redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    for run_id in &runs {
        let slot = redis_cluster::slot_of(&format!("spread:run:{{{run_id}}}"));
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(100)
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(
            keys.iter()
                .any(|k| k.starts_with("spread:timers:{") && k.ends_with(":coder")),
            "{run_id}: no timer set on its slot among {keys:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_that_moves_mid_run_is_followed() {
    let cluster = start().await;
    let store = RedisStore::connect_with_prefix(&cluster.comma_urls(), "moving")
        .await
        .unwrap();
    store
        .create_run(header("r"), with_task("running", 1, "coder", 5))
        .await
        .unwrap();
    let key = "moving:run:{r}";
    let from = cluster.master_of_key(key);
    let to = cluster
        .masters()
        .into_iter()
        .map(|m| m.port)
        .find(|port| *port != from)
        .unwrap();
    let slot = redis_cluster::slot_of(key);
    {
        let cluster = cluster.clone();
        blocking(move || cluster.migrate_slot(slot, to)).await;
    }
    assert_eq!(cluster.master_of_key(key), to);
    // Every call follows the slot to its new master (MOVED), the run and its timer with it.
    assert_eq!(store.version("r").await.unwrap(), Some(1));
    let due = store.due_tasks("coder", 10, 10).await.unwrap();
    assert_eq!(due.len(), 1);
    let version = store
        .apply_transition("r", 1, with_task("running", 2, "coder", 7))
        .await
        .unwrap();
    assert_eq!(version, 2);
    assert_eq!(store.load_run("r").await.unwrap().unwrap().version, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_master_fails_over_and_waited_writes_go_on_once_it_has_a_replica() {
    let cluster = start().await;
    let store = RedisStore::connect_with(
        &cluster.comma_urls(),
        ConnectOptions {
            prefix: "failover".to_owned(),
            // Long enough for a replica on a loaded machine (a replica that is there answers
            // at once; only the write with none waits it out).
            wait: Some(WaitReplicas {
                replicas: 1,
                timeout: Duration::from_secs(2),
            }),
            ..ConnectOptions::default()
        },
    )
    .await
    .unwrap();
    // Every replica has caught up with its master: one still loading the master's first copy
    // does not acknowledge a write yet.
    {
        let cluster = cluster.clone();
        blocking(move || cluster.wait_for_replication()).await;
    }
    store
        .create_run(header("r"), with_task("running", 1, "coder", 5))
        .await
        .expect("a write that its replica acknowledged");
    let master = cluster.master_of_key("failover:run:{r}");
    cluster.kill_node(master);
    let promoted = {
        let cluster = cluster.clone();
        blocking(move || cluster.wait_for_failover(master)).await
    };
    // The write was acknowledged by the replica now in charge: it survived. (Read by a store
    // that does not wait: this one will not vouch for a read no replica backs, and the new
    // master has none yet.)
    let plain = RedisStore::connect_with_prefix(&cluster.comma_urls(), "failover")
        .await
        .unwrap();
    assert_eq!(plain.version("r").await.unwrap(), Some(1));
    let unbacked = store
        .version("r")
        .await
        .expect_err("no replica backs the read");
    assert!(matches!(unbacked, Error::Unavailable(_)), "{unbacked:?}");
    // The new master has no replica yet: a transition is not acknowledged (done on the master
    // alone, it is neither done nor not done for the caller, who must settle it).
    let refused = store
        .apply_transition("r", 1, with_task("running", 2, "coder", 6))
        .await
        .expect_err("no replica to acknowledge it");
    assert!(matches!(refused, Error::Indeterminate(_)), "{refused:?}");
    // The old master comes back as the new one's replica; a retry after reloading applies.
    {
        let cluster = cluster.clone();
        blocking(move || cluster.start_node_again(master)).await;
    }
    assert_eq!(cluster.master_of_key("failover:run:{r}"), promoted);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let version = store.version("r").await.unwrap().unwrap();
        match store
            .apply_transition("r", version, with_task("running", 3, "coder", 7))
            .await
        {
            Ok(_) => break,
            Err(err) => assert!(
                Instant::now() < deadline,
                "writes did not resume once the new master had a replica: {err}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_timer_whose_registration_was_lost_is_found_after_a_repair() {
    let cluster = RedisCluster::shared();
    let store = RedisStore::connect_with_prefix(&cluster.comma_urls(), "repair")
        .await
        .unwrap();
    store
        .create_run(header("r"), with_task("running", 1, "coder", 5))
        .await
        .unwrap();
    // As if the coordinator had died between the run's script and the registration.
    let mut con = redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg("repair:timer-slots:{t:coder}")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(store.repair_registry("coder").await.unwrap(), 1);
    let due = store.due_tasks("coder", 10, 10).await.unwrap();
    assert_eq!(
        due.len(),
        1,
        "the repaired registry leads the sweep to the timer"
    );
}

/// Resumes a stopped Redis process when dropped, so that a failing test leaves no node stopped.
struct Stopped(u32);

impl Stopped {
    fn stop(pid: u32) -> Stopped {
        signal("-STOP", pid);
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal("-CONT", self.0);
    }
}

fn signal(signal: &str, pid: u32) {
    let status = std::process::Command::new("kill")
        .arg(signal)
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transition_whose_answer_was_lost_has_its_timers_found() {
    // A cluster of its own, whose nodes take a stopped master for failed only after 30 s.
    let cluster = Arc::new(blocking(|| RedisCluster::start_with(3, 1, 30_000)).await);
    let store = RedisStore::connect_with_prefix(&cluster.comma_urls(), "lost")
        .await
        .unwrap();
    store
        .create_run(header("r"), TransitionWrite::default())
        .await
        .unwrap();
    // A first transition loads the script on the master (a script sent by its digest alone
    // would come too late and be refused as unknown).
    store
        .apply_transition("r", 1, TransitionWrite::default())
        .await
        .unwrap();
    // This store's first sweep of the agent repairs its registry; the timer below must be found
    // without another repair (the next is minutes away).
    assert!(store.due_tasks("coder", 10, 10).await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The run's master stops for 8 s: the transition reaches it, the store gives up waiting for
    // the answer, and the master runs the script when it goes on, as when a master answers too
    // late while it fails over.
    let master = cluster.master_of_key("lost:run:{r}");
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(
            &mut redis::Client::open(format!("redis://127.0.0.1:{master}/"))
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap(),
        )
        .await
        .unwrap();
    let pid: u32 = info
        .lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
        .expect("the master's process id");
    let stopped = Stopped::stop(pid);
    let lost = store
        .apply_transition("r", 2, with_task("running", 2, "coder", 5))
        .await;
    assert!(
        matches!(lost, Err(Error::Indeterminate(_))),
        "the answer is lost: {lost:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop(stopped);

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let due = store.due_tasks("coder", 10, 10).await.unwrap_or_default();
        if let [due] = due.as_slice() {
            assert_eq!(
                (due.run_id.as_str(), due.task_key.as_str()),
                ("r", "work#1")
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the timer of the transition whose answer was lost was never swept (the run is at \
             version {:?})",
            store.version("r").await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
