//! The Redis Cluster harness (`support/redis_cluster.rs`) does what the cluster tests rely on: it
//! starts a working cluster, moves slots with their keys, fails a master over to its replica,
//! and leaves no `redis-server` behind, not even when the test binary dies.

#[path = "support/redis_cluster.rs"]
#[allow(dead_code)] // shared harness: not every helper is used here
mod redis_cluster;
#[path = "support/redis_server.rs"]
#[allow(dead_code)]
mod redis_server;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis_cluster::{RedisCluster, SLOTS, slot_of};

async fn cluster_connection(cluster: &RedisCluster) -> ClusterConnection {
    ClusterClient::new(cluster.urls())
        .expect("a cluster client for the harness's URLs")
        .get_async_connection()
        .await
        .expect("connect to the test cluster")
}

/// The processes (servers and their wrapping shells) still serving any of `ports`.
fn processes_on(ports: &[u16]) -> String {
    let alternatives: Vec<String> = ports.iter().map(u16::to_string).collect();
    let pattern = format!(
        "(127\\.0\\.0\\.1:|--port )({})( |$)",
        alternatives.join("|")
    );
    let output = Command::new("pgrep")
        .arg("-af")
        .arg(&pattern)
        .output()
        .expect("run pgrep");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Waits up to 5 s for every process on `ports` to be gone; panics with those left.
fn assert_no_process_on(ports: &[u16]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = processes_on(ports);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "processes left on ports {ports:?}:\n{left}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_new_cluster_has_three_masters_owning_all_slots_and_three_replicas() {
    let started = Instant::now();
    let cluster = RedisCluster::start();
    eprintln!("RedisCluster::start() took {:?}", started.elapsed());

    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "{masters:#?}");
    let mut owned = 0u32;
    for master in &masters {
        assert!(!master.slots.is_empty(), "{master:?} owns no slot");
        owned += master
            .slots
            .iter()
            .map(|range| u32::from(range.end() - range.start()) + 1)
            .sum::<u32>();
    }
    assert_eq!(owned, u32::from(SLOTS));

    let replicas = cluster.replicas();
    assert_eq!(replicas.len(), 3, "{replicas:#?}");
    for master in &masters {
        assert_eq!(
            replicas
                .iter()
                .filter(|replica| replica.master_id == master.id)
                .count(),
            1,
            "{master:?} should have one replica: {replicas:#?}"
        );
    }
    for slot in [0, 5460, 5461, 10922, 10923, SLOTS - 1] {
        let port = cluster.master_of_slot(slot);
        assert!(
            masters
                .iter()
                .any(|m| m.port == port && m.slots.iter().any(|r| r.contains(&slot))),
            "slot {slot} on {port}: {masters:#?}"
        );
    }

    let urls = cluster.urls();
    assert_eq!(urls.len(), 6);
    assert_eq!(cluster.comma_urls(), urls.join(","));
    assert!(urls.contains(&cluster.seed_url()));
}

#[test]
fn a_cluster_without_replicas_starts_too() {
    let cluster = RedisCluster::start_with(3, 0, 500);
    assert_eq!(cluster.masters().len(), 3);
    assert!(cluster.replicas().is_empty());
    assert_eq!(cluster.urls().len(), 3);
}

#[test]
fn slot_of_agrees_with_cluster_keyslot() {
    let cluster = RedisCluster::shared();
    let mut con = redis::Client::open(cluster.seed_url())
        .unwrap()
        .get_connection()
        .expect("connect to a node");
    for key in [
        "",
        "a",
        "baton:run:1",
        "123456789",
        "{user1000}.following",
        "{user1000}.followers",
        "foo{}{bar}",
        "foo{{bar}}zap",
        "foo{bar}{zap}",
        "{}",
        "}{",
        "ünïcødé",
    ] {
        let expected: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut con)
            .expect("CLUSTER KEYSLOT");
        assert_eq!(slot_of(key), expected, "slot of {key:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_client_reads_back_what_it_wrote_on_the_shared_cluster() {
    let cluster = RedisCluster::shared();
    let mut con = cluster_connection(cluster).await;
    // Keys on many slots, so on every master.
    for i in 0..100 {
        let key = format!("harness-shared:{i}");
        let () = con.set(&key, i).await.expect("SET through the cluster");
    }
    for i in 0..100 {
        let key = format!("harness-shared:{i}");
        let value: i32 = con.get(&key).await.expect("GET through the cluster");
        assert_eq!(value, i, "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_slot_moves_the_slot_with_its_keys() {
    let cluster = RedisCluster::start();
    let mut con = cluster_connection(&cluster).await;
    // More keys than one MIGRATE batch.
    let keys: Vec<String> = (0..250).map(|i| format!("{{moving}}:{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let () = con.set(key, i).await.unwrap();
    }
    let slot = slot_of("{moving}");
    let source = cluster.master_of_slot(slot);
    let target = cluster
        .masters()
        .into_iter()
        .find(|master| master.port != source)
        .unwrap()
        .port;

    cluster.migrate_slot(slot, target);

    assert_eq!(cluster.master_of_slot(slot), target);
    let owner = cluster
        .masters()
        .into_iter()
        .find(|m| m.port == target)
        .unwrap();
    assert!(owner.slots.iter().any(|range| range.contains(&slot)));
    // The keys are on the target now, and nowhere else.
    let count_on = |port: u16| -> usize {
        let mut node = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_connection()
            .unwrap();
        redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query(&mut node)
            .unwrap()
    };
    assert_eq!(count_on(target), keys.len());
    assert_eq!(count_on(source), 0);
    // The client still has the old slot map: it follows the MOVED redirection.
    for (i, key) in keys.iter().enumerate() {
        let value: usize = con.get(key).await.expect("GET after the migration");
        assert_eq!(value, i, "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reshard_moves_slots_with_redis_cli() {
    let cluster = RedisCluster::start();
    let mut con = cluster_connection(&cluster).await;
    for i in 0..200 {
        let () = con.set(format!("resharded:{i}"), i).await.unwrap();
    }
    let masters = cluster.masters();
    let slots_of = |port: u16| -> u32 {
        cluster
            .masters()
            .iter()
            .find(|m| m.port == port)
            .unwrap()
            .slots
            .iter()
            .map(|range| u32::from(range.end() - range.start()) + 1)
            .sum()
    };
    let (from, to) = (masters[0].port, masters[1].port);
    let (from_before, to_before) = (slots_of(from), slots_of(to));

    cluster.reshard(10, from, to);

    assert_eq!(slots_of(from), from_before - 10);
    assert_eq!(slots_of(to), to_before + 10);
    for i in 0..200 {
        let value: i32 = con.get(format!("resharded:{i}")).await.unwrap();
        assert_eq!(value, i);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_master_promotes_its_replica_and_the_old_master_rejoins_as_replica() {
    let cluster = RedisCluster::start();
    let mut con = cluster_connection(&cluster).await;
    let () = con.set("survivor", "still here").await.unwrap();
    cluster.wait_for_replication();
    let old_master = cluster.master_of_key("survivor");
    let replica = cluster
        .replicas()
        .into_iter()
        .find(|replica| replica.master_port == old_master)
        .expect("the master has a replica");

    cluster.kill_node(old_master);
    let killed = Instant::now();
    let new_master = cluster.wait_for_failover(old_master);
    let failover = killed.elapsed();
    eprintln!("failover took {failover:?}");

    assert_eq!(new_master, replica.port);
    assert_eq!(cluster.master_of_key("survivor"), new_master);
    assert!(
        failover < Duration::from_secs(10),
        "failover took {failover:?}"
    );
    assert!(cluster.masters().iter().all(|m| m.port != old_master));
    let value: String = con.get("survivor").await.expect("GET after the failover");
    assert_eq!(value, "still here");

    cluster.start_node_again(old_master);
    let rejoined = cluster
        .replicas()
        .into_iter()
        .find(|replica| replica.port == old_master)
        .expect("the old master is back as a replica");
    assert_eq!(rejoined.master_port, new_master);
}

#[test]
fn dropping_the_cluster_leaves_no_server_and_no_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let ports = run_child("harness_child_drops_its_cluster", tmp.path());
    assert_no_process_on(&ports);
    assert_empty(tmp.path());
}

#[test]
fn a_killed_test_binary_leaves_no_server_and_no_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let ports = run_child("harness_child_is_killed", tmp.path());
    assert_no_process_on(&ports);
    assert_empty(tmp.path());
}

#[test]
fn the_shared_cluster_does_not_outlive_its_test_binary() {
    let tmp = tempfile::tempdir().unwrap();
    let ports = run_child("harness_child_uses_the_shared_cluster", tmp.path());
    assert_no_process_on(&ports);
    assert_empty(tmp.path());
}

/// Runs one of the `harness_child_*` tests below in a child test process with its own TMPDIR,
/// and returns the ports it printed.
fn run_child(test: &str, tmp: &std::path::Path) -> Vec<u16> {
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "--nocapture",
            "--test-threads=1",
            test,
        ])
        .env("TMPDIR", tmp)
        .stdin(Stdio::null())
        .output()
        .expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let ports: Vec<u16> = stdout
        .lines()
        // libtest prints the test's name on the same line, before it.
        .find_map(|line| line.split_once("PORTS ").map(|(_, ports)| ports.trim()))
        .unwrap_or_else(|| {
            panic!(
                "{test} printed no ports ({}):\n{stdout}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            )
        })
        .split(',')
        .map(|port| port.parse().unwrap())
        .collect();
    assert_eq!(ports.len(), 6);
    ports
}

fn assert_empty(dir: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "left behind: {left:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn print_ports(cluster: &RedisCluster) {
    let ports: Vec<String> = cluster.ports().iter().map(u16::to_string).collect();
    println!("PORTS {}", ports.join(","));
    assert!(!processes_on(&cluster.ports()).is_empty());
}

#[test]
#[ignore = "run by dropping_the_cluster_leaves_no_server_and_no_directory"]
fn harness_child_drops_its_cluster() {
    let cluster = RedisCluster::start();
    print_ports(&cluster);
    drop(cluster);
}

#[test]
#[ignore = "run by a_killed_test_binary_leaves_no_server_and_no_directory"]
fn harness_child_is_killed() {
    let cluster = RedisCluster::start();
    print_ports(&cluster);
    // The most sudden death: no unwinding, no drop, no exit handlers.
    Command::new("kill")
        .args(["-9", &std::process::id().to_string()])
        .status()
        .unwrap();
    std::thread::sleep(Duration::from_secs(10));
    unreachable!("still alive after SIGKILL");
}

#[test]
#[ignore = "run by the_shared_cluster_does_not_outlive_its_test_binary"]
fn harness_child_uses_the_shared_cluster() {
    // Returns with the cluster in a static, which is never dropped.
    print_ports(RedisCluster::shared());
}
