//! A throwaway Redis Cluster on loopback: `redis-server` processes in cluster mode, each with its
//! own ports and directory, joined by `redis-cli --cluster create`, stopped when dropped. Never
//! the machine's shared Redis. A test can do to it what operators and faults do to a production
//! cluster: kill a node and bring it back, wait for a replica to take over, move slots.
//!
//! Or each node on a host of its own ([`RedisCluster::start_on`]), such as a network namespace of
//! `tests/support/netns.rs`: the node binds and announces the host's address, and the harness
//! talks to it there (the test process must reach every host). A test can then cut a master off
//! from the rest of the cluster while it keeps running, and wait for the majority to replace it
//! ([`RedisCluster::wait_for_failover_of`]) and for it to come back as a replica
//! ([`RedisCluster::wait_for_rejoin`]). This file knows nothing of namespaces: a [`NodeHost`]
//! says how to run a program on the host.
//!
//! Include it next to `redis_server.rs`, whose [`free_port`] it uses: one list of handed-out
//! ports per test binary, so a cluster node and a lone server never get the same port.
//!
//! ```ignore
//! #[path = "support/redis_server.rs"]
//! #[allow(dead_code)]
//! mod redis_server;
//! #[path = "support/redis_cluster.rs"]
//! #[allow(dead_code)]
//! mod redis_cluster;
//! ```
//!
//! Every method blocks the calling thread (seconds, for the ones that wait for the cluster). From
//! an async test that must keep other tasks running meanwhile, call them on
//! `tokio::task::spawn_blocking` (the methods take `&self`: share the cluster in an `Arc`).

use std::ffi::OsStr;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::redis_server::free_port;

/// Number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// How long the cluster gets to become ready, or to settle after a change; then the harness
/// panics with the nodes' logs.
const SETTLE_DEADLINE: Duration = Duration::from_secs(30);
/// How many ports to try for one node when another process takes the ones we picked before the
/// server binds them.
const PORT_ATTEMPTS: usize = 5;
/// Pause between two looks at the cluster while waiting for it.
const POLL: Duration = Duration::from_millis(50);
/// Keys moved per MIGRATE in [`RedisCluster::migrate_slot`].
const MIGRATE_BATCH: usize = 100;
/// How many lines of each node's log a panic message shows.
const LOG_LINES: usize = 60;

/// Runs `redis-server` ("$@") under a small `sh` that kills it when the test process lets go
/// of the shell's stdin, whether by [`Drop`], by [`RedisCluster::kill_node`], or by dying: the
/// kernel closes a dead process's pipes, so a test binary that panics, aborts, is SIGKILLed, or
/// simply exits with the [shared](RedisCluster::shared) cluster still in a static (statics are
/// never dropped) leaves no server behind. We chose this over alternatives:
/// - `prctl(PR_SET_PDEATHSIG)` in a `pre_exec` needs `unsafe`, which the workspace forbids, and
///   fires when the spawning *thread* exits: tokio worker threads come and go.
/// - A watchdog polling `kill -0 <test pid>` reacts a second late, and the test's pid can be
///   reused.
///
/// The watcher reads one line: `keep` means the node is being killed on purpose and will be
/// started again from its directory; anything else (EOF) means the directory can go, which
/// matters for the shared cluster, whose `TempDir`s are never dropped. The shell waits for the
/// server, so it exits, with the server's status, only once the server is dead and reaped: that
/// is how the harness notices a server that could not start (port taken), and why waiting for
/// the shell after closing the pipe means the server is gone. The server's stdin is /dev/null and
/// it does not inherit the pipe.
const WRAPPER: &str = r#"
dir=$1
shift
exec 3<&0 </dev/null
"$@" 3<&- &
server=$!
(
    read -r order <&3
    kill -9 "$server" 2>/dev/null
    if [ "$order" != keep ]; then
        while kill -0 "$server" 2>/dev/null; do sleep 0.05; done
        rm -rf -- "$dir"
    fi
) &
exec 3<&-
wait "$server"
"#;

/// Where a node of [`RedisCluster::start_on`] runs: the address it binds and announces (and where
/// the harness and the cluster's clients reach it), and how to run a program there.
pub struct NodeHost {
    pub ip: Ipv4Addr,
    /// `program` made to run on the host, before any argument is added: for a network namespace,
    /// `ip netns exec <netns> <program>`. The child must be the program itself or a process that
    /// execs it (its stdin is the pipe that keeps the node alive, see the wrapper above).
    pub command: Box<dyn Fn(&OsStr) -> Command + Send + Sync>,
}

impl NodeHost {
    /// A host at `ip` whose programs `command` makes (say `move |p| host.command(p)`).
    pub fn new(ip: Ipv4Addr, command: impl Fn(&OsStr) -> Command + Send + Sync + 'static) -> Self {
        NodeHost {
            ip,
            command: Box::new(command),
        }
    }

    /// This machine's loopback, where [`RedisCluster::start_with`] puts every node.
    pub fn loopback() -> Self {
        NodeHost::new(Ipv4Addr::LOCALHOST, |program: &OsStr| Command::new(program))
    }
}

impl std::fmt::Debug for NodeHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeHost").field("ip", &self.ip).finish()
    }
}

/// A running Redis Cluster; every process is killed and reaped, and every directory removed, on
/// drop.
pub struct RedisCluster {
    nodes: Mutex<Vec<Node>>,
    /// Held by the methods that change the cluster or wait for it, so two of them never
    /// interleave (two slot migrations at once would leave slots open).
    operations: Mutex<()>,
    redis_server: PathBuf,
    redis_cli: PathBuf,
}

/// A master as the cluster sees it at the time of the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Master {
    pub id: String,
    /// The address of its host (127.0.0.1 on loopback).
    pub ip: Ipv4Addr,
    pub port: u16,
    pub slots: Vec<RangeInclusive<u16>>,
}

/// A replica as the cluster sees it at the time of the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    pub id: String,
    pub ip: Ipv4Addr,
    pub port: u16,
    pub master_id: String,
    pub master_ip: Ipv4Addr,
    pub master_port: u16,
}

struct Node {
    host: NodeHost,
    port: u16,
    bus_port: u16,
    node_timeout_ms: u64,
    /// The cluster node id, known once the node is part of the cluster; kept in `nodes.conf`, so
    /// it survives [`RedisCluster::start_node_again`].
    id: String,
    dir: tempfile::TempDir,
    /// `None` while the node is killed.
    process: Option<Process>,
    /// The slots the node owned, as the cluster saw it, when it was killed: where
    /// [`RedisCluster::wait_for_failover`] looks for the new master.
    slots_when_killed: Vec<RangeInclusive<u16>>,
    /// Running but cut off from the others (see [`RedisCluster::wait_for_failover_of`]): what it
    /// says about the cluster is stale, so the harness does not ask it until
    /// [`RedisCluster::wait_for_rejoin`].
    cut_off: bool,
}

impl Node {
    fn addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.host.ip, self.port)
    }

    /// Running and not cut off: the harness asks it about the cluster.
    fn in_view(&self) -> bool {
        self.process.is_some() && !self.cut_off
    }
}

/// The wrapping `sh` and the pipe whose closing kills the server.
struct Process {
    shell: Child,
    lifeline: ChildStdin,
}

impl Process {
    /// Kills the server and waits until it is reaped. With `keep_dir` the wrapper leaves the
    /// directory alone, for a restart.
    fn kill(mut self, keep_dir: bool) {
        if keep_dir {
            // If the server already exited, the watcher may be gone too: nothing to tell.
            let _ = self.lifeline.write_all(b"keep\n");
        }
        drop(self.lifeline);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.shell.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() >= deadline => {
                    // Never seen; better a stray server than a test stuck in drop.
                    let _ = self.shell.kill();
                    let _ = self.shell.wait();
                    return;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }
}

impl RedisCluster {
    /// Starts 3 masters with one replica each (`cluster-node-timeout` 1000 ms) and waits until
    /// the cluster is ready (see [`RedisCluster::start_with`]).
    pub fn start() -> RedisCluster {
        Self::start_with(3, 1, 1000)
    }

    /// Starts `masters * (1 + replicas_per_master)` nodes, joins them with `redis-cli --cluster
    /// create`, and waits until every node says `cluster_state:ok`, all agree on who owns each of
    /// the 16384 slots and on who replicates whom, and every replica's link to its master is up.
    /// Panics (never skips) with the nodes' logs if `redis-server` or `redis-cli` is missing or
    /// the cluster is not ready within 30 s. `redis-cli` needs at least 3 masters.
    pub fn start_with(masters: usize, replicas_per_master: usize, node_timeout_ms: u64) -> Self {
        let count = masters * (1 + replicas_per_master);
        let hosts = (0..count).map(|_| NodeHost::loopback()).collect();
        Self::start_on(hosts, replicas_per_master, node_timeout_ms)
    }

    /// Like [`RedisCluster::start_with`], with one node on each of `hosts`, in order: the
    /// number of masters is `hosts.len() / (1 + replicas_per_master)`, which `redis-cli` places
    /// so that no replica is on its master's host when the hosts' addresses differ. A node
    /// listens on a free port of this process's (see `free_port`), on its host's address, which it
    /// also announces to the cluster; every host must reach the others' and the test process
    /// every host's. The nodes are started one after the other.
    pub fn start_on(
        hosts: Vec<NodeHost>,
        replicas_per_master: usize,
        node_timeout_ms: u64,
    ) -> Self {
        let per_shard = 1 + replicas_per_master;
        assert!(
            hosts.len().is_multiple_of(per_shard),
            "{} hosts do not make shards of one master and {replicas_per_master} replicas",
            hosts.len()
        );
        let masters = hosts.len() / per_shard;
        assert!(
            masters >= 3,
            "`redis-cli --cluster create` needs at least 3 masters, not {masters}"
        );
        let started = Instant::now();
        let cluster = RedisCluster {
            nodes: Mutex::new(Vec::new()),
            operations: Mutex::new(()),
            redis_server: find_binary("redis-server"),
            redis_cli: find_binary("redis-cli"),
        };
        for host in hosts {
            let node = cluster.start_fresh_node(host, node_timeout_ms);
            cluster.lock_nodes().push(node);
        }

        let mut create = Command::new(&cluster.redis_cli);
        create.arg("--cluster").arg("create");
        for addr in cluster.addrs() {
            create.arg(addr.to_string());
        }
        create
            .arg("--cluster-replicas")
            .arg(replicas_per_master.to_string())
            .arg("--cluster-yes");
        cluster.run_redis_cli(create, "redis-cli --cluster create");

        for node in cluster.lock_nodes().iter_mut() {
            node.id = query::<String>(node.addr(), &["CLUSTER", "MYID"])
                .unwrap_or_else(|err| panic!("CLUSTER MYID: {err}"));
        }
        cluster.wait_until(
            started + SETTLE_DEADLINE,
            "the new cluster to be ready",
            |view| view.settled(),
        );
        cluster
    }

    /// One cluster for the whole test binary, started on first use: starting a cluster per test
    /// would take seconds each. Tests sharing it must not see each other, so each one uses its
    /// own key prefix (a hash tag, such as `{test-name}:...`, keeps a test's keys on one slot if
    /// it needs that), and none kills nodes or moves slots on it: those tests start their own.
    ///
    /// A static is never dropped; the servers die with the test process anyway (see the wrapper
    /// in this file). If the cluster does not start, every later caller panics with the first
    /// failure instead of trying again for 30 s each.
    pub fn shared() -> &'static RedisCluster {
        static SHARED: OnceLock<Result<RedisCluster, String>> = OnceLock::new();
        let started = SHARED.get_or_init(|| {
            std::panic::catch_unwind(RedisCluster::start).map_err(|panic| {
                panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
                    .unwrap_or_else(|| "(no message)".to_string())
            })
        });
        match started {
            Ok(cluster) => cluster,
            Err(failure) => panic!("the shared Redis Cluster did not start: {failure}"),
        }
    }

    /// `redis://<ip>:<port>/` of every node (127.0.0.1 on loopback), masters and replicas,
    /// killed or not.
    pub fn urls(&self) -> Vec<String> {
        self.addrs().into_iter().map(url).collect()
    }

    /// The URL of one node, running (and not cut off) when called: enough for a cluster client to
    /// discover the rest.
    pub fn seed_url(&self) -> String {
        url(self.view_addrs()[0])
    }

    /// [`RedisCluster::urls`] joined with `,`, the form a configuration file or flag takes.
    pub fn comma_urls(&self) -> String {
        self.urls().join(",")
    }

    /// The port of every node, in the order they were started.
    pub fn ports(&self) -> Vec<u16> {
        self.lock_nodes().iter().map(|node| node.port).collect()
    }

    /// The address (`ip:port`) of every node, in the order they were started.
    pub fn addrs(&self) -> Vec<SocketAddrV4> {
        self.lock_nodes().iter().map(Node::addr).collect()
    }

    /// The address of the host of the node on `port` (127.0.0.1 on loopback): where a test finds
    /// the host to cut off.
    pub fn node_ip(&self, port: u16) -> Ipv4Addr {
        *self.addr_of(port).ip()
    }

    /// The running masters, as a running node sees them now (failovers and migrations change
    /// this), in port order. Neither asks nor lists a node cut off by
    /// [`RedisCluster::wait_for_failover_of`].
    pub fn masters(&self) -> Vec<Master> {
        let in_view = self.view_addrs();
        let mut masters: Vec<Master> = self
            .one_view()
            .into_iter()
            .filter(|entry| entry.is_master())
            .filter_map(|entry| {
                let addr = in_view.iter().find(|addr| addr.port() == entry.port)?;
                Some(Master {
                    id: entry.id,
                    ip: *addr.ip(),
                    port: entry.port,
                    slots: entry.slots,
                })
            })
            .collect();
        masters.sort_by_key(|master| master.port);
        masters
    }

    /// The running replicas, as a running node sees them now, in port order; like
    /// [`RedisCluster::masters`], without a node that is cut off.
    pub fn replicas(&self) -> Vec<Replica> {
        let in_view = self.view_addrs();
        let all = self.addrs();
        let view = self.one_view();
        let port_of = |id: &str| view.iter().find(|entry| entry.id == id).map(|e| e.port);
        let ip_of = |port: u16| all.iter().find(|a| a.port() == port).map(|a| *a.ip());
        let mut replicas: Vec<Replica> = view
            .iter()
            .filter(|entry| !entry.is_master())
            .filter_map(|entry| {
                let addr = in_view.iter().find(|addr| addr.port() == entry.port)?;
                let master_id = entry.master_id.clone()?;
                let master_port = port_of(&master_id)?;
                Some(Replica {
                    id: entry.id.clone(),
                    ip: *addr.ip(),
                    port: entry.port,
                    master_id,
                    master_ip: ip_of(master_port)?,
                    master_port,
                })
            })
            .collect();
        replicas.sort_by_key(|replica| replica.port);
        replicas
    }

    /// The port of the node owning `slot`, as a running node sees it now: possibly a master that
    /// was killed and not yet replaced.
    pub fn master_of_slot(&self, slot: u16) -> u16 {
        let view = self.one_view();
        view.iter()
            .find(|entry| entry.owns(slot))
            .map(|entry| entry.port)
            .unwrap_or_else(|| panic!("no node owns slot {slot}; the cluster says:\n{view:#?}"))
    }

    /// The port of the master owning `key`'s slot.
    pub fn master_of_key(&self, key: &str) -> u16 {
        self.master_of_slot(slot_of(key))
    }

    /// Kills a node's server with SIGKILL (no chance to save or to say goodbye), keeping its
    /// directory and `nodes.conf` for [`RedisCluster::start_node_again`]. Returns at once: the
    /// cluster notices after `cluster-node-timeout`.
    pub fn kill_node(&self, port: u16) {
        let _operation = self.lock_operations();
        // What the cluster thinks the node owns, for wait_for_failover; asked before the kill,
        // and of another node (the node itself may be stale only if it is partitioned).
        let slots = self
            .one_view()
            .into_iter()
            .find(|entry| entry.port == port)
            .map(|entry| entry.slots)
            .unwrap_or_default();
        let mut nodes = self.lock_nodes();
        let node = node_at(&mut nodes, port);
        let process = node
            .process
            .take()
            .unwrap_or_else(|| panic!("the node on port {port} is not running"));
        node.slots_when_killed = slots;
        node.cut_off = false;
        process.kill(true);
    }

    /// Starts a killed node again on its ports and directory; with the `nodes.conf` there it
    /// rejoins the cluster (a former master comes back as a replica of whoever took over its
    /// slots). Waits until the cluster has settled with it (see [`RedisCluster::start_with`]).
    pub fn start_node_again(&self, port: u16) {
        let _operation = self.lock_operations();
        let deadline = Instant::now() + SETTLE_DEADLINE;
        {
            let mut nodes = self.lock_nodes();
            let node = node_at(&mut nodes, port);
            assert!(
                node.process.is_none(),
                "the node on port {port} is already running"
            );
            // The ports may linger for a moment after the kill.
            loop {
                let mut process = spawn(
                    &self.redis_server,
                    &node.host,
                    node.port,
                    node.bus_port,
                    node.dir.path(),
                    node.node_timeout_ms,
                );
                match wait_for_ping(&mut process, node.addr(), node.dir.path()) {
                    Ok(()) => {
                        node.process = Some(process);
                        node.slots_when_killed.clear();
                        break;
                    }
                    Err(failure) if Instant::now() >= deadline => {
                        panic!("the node on port {port} did not come back: {failure}")
                    }
                    Err(_) => std::thread::sleep(POLL),
                }
            }
        }
        self.wait_until(
            deadline,
            &format!("the node on port {port} to rejoin the cluster"),
            |view| view.settled(),
        );
    }

    /// After [`RedisCluster::kill_node`] of a master: waits until another node (its replica) owns
    /// every slot the killed master owned, and every running node says `cluster_state:ok` and
    /// agrees with the others (see [`RedisCluster::start_with`]). Returns the new master's port.
    /// The killed node is not asked anything (see also [`RedisCluster::wait_for_failover_of`]).
    pub fn wait_for_failover(&self, old_master_port: u16) -> u16 {
        assert!(
            self.lock_nodes()
                .iter()
                .any(|node| node.port == old_master_port && node.process.is_none()),
            "wait_for_failover({old_master_port}): that node was not killed"
        );
        self.wait_for_failover_of(old_master_port)
    }

    /// After the master on `old_master_port` was cut off from the rest of the cluster, killed
    /// ([`RedisCluster::kill_node`]) or still running behind a network partition: waits until
    /// another node (its replica) owns every slot it owned, and the *other* running nodes all say
    /// `cluster_state:ok` and agree with each other (see [`RedisCluster::start_with`]). Returns
    /// the new master's port.
    ///
    /// A running master is from now on *cut off*: the harness does not ask it about the cluster
    /// (it sees the minority's stale view, and says `cluster_state:fail` once it notices) and
    /// leaves it out of [`RedisCluster::masters`], [`RedisCluster::replicas`],
    /// [`RedisCluster::seed_url`] and every wait, until [`RedisCluster::wait_for_rejoin`]. Call
    /// this right after the cut: which slots it owned is asked of the others first, then of the
    /// node itself (reachable from the test process after a partition, not after an isolation).
    pub fn wait_for_failover_of(&self, old_master_port: u16) -> u16 {
        let _operation = self.lock_operations();
        let (old_id, killed_slots, addr) = {
            let mut nodes = self.lock_nodes();
            let node = node_at(&mut nodes, old_master_port);
            if node.process.is_some() {
                node.cut_off = true;
            }
            let killed_slots = node
                .process
                .is_none()
                .then(|| node.slots_when_killed.clone());
            (node.id.clone(), killed_slots, node.addr())
        };
        let slots = match killed_slots {
            Some(slots) => slots,
            None => self.slots_of_cut_off(&old_id, addr),
        };
        assert!(
            !slots.is_empty(),
            "wait_for_failover_of({old_master_port}): that node owned no slots when it was cut off"
        );
        let view = self.wait_until(
            Instant::now() + SETTLE_DEADLINE,
            &format!("a replica to take over from the master on {addr}"),
            |view| {
                if view.owner_ids().any(|id| id == old_id) {
                    return Err(format!("node {old_id} still owns slots"));
                }
                view.settled()
            },
        );
        let first = *slots[0].start();
        view.owner_port(first)
    }

    /// After [`RedisCluster::wait_for_failover_of`] a node that kept running (the test healed the
    /// partition): asks it about the cluster again, and waits until it is a replica and every
    /// running node says `cluster_state:ok` and agrees with the others. Returns the port of its
    /// master.
    pub fn wait_for_rejoin(&self, port: u16) -> u16 {
        let _operation = self.lock_operations();
        let id = {
            let mut nodes = self.lock_nodes();
            let node = node_at(&mut nodes, port);
            assert!(
                node.process.is_some(),
                "wait_for_rejoin({port}): that node is killed; start_node_again brings it back"
            );
            node.cut_off = false;
            node.id.clone()
        };
        let view = self.wait_until(
            Instant::now() + SETTLE_DEADLINE,
            &format!("the node on port {port} to rejoin the cluster as a replica"),
            |view| {
                view.settled()?;
                view.master_id_of(&id)
                    .map(|_| ())
                    .ok_or_else(|| format!("the node on port {port} is not a replica"))
            },
        );
        let master_id = view.master_id_of(&id).expect("checked above").to_owned();
        view.entries(port)
            .iter()
            .find(|entry| entry.id == master_id)
            .map(|entry| entry.port)
            .unwrap_or_else(|| panic!("no node {master_id}, master of port {port}"))
    }

    /// Waits until every running replica has received everything its master has written
    /// (replication offsets equal), so that a write acknowledged before this call survives a
    /// failover.
    pub fn wait_for_replication(&self) {
        let _operation = self.lock_operations();
        let deadline = Instant::now() + SETTLE_DEADLINE;
        for replica in self.replicas() {
            let offset_of = |ip: Ipv4Addr, port: u16, field: &str| -> Result<u64, String> {
                let addr = SocketAddrV4::new(ip, port);
                let info = query::<String>(addr, &["INFO", "replication"])?;
                info_field(&info, field)
                    .and_then(|value| value.parse().ok())
                    .ok_or_else(|| format!("no {field} in INFO replication of {addr}"))
            };
            loop {
                let master =
                    offset_of(replica.master_ip, replica.master_port, "master_repl_offset");
                let copied = offset_of(replica.ip, replica.port, "slave_repl_offset");
                match (master, copied) {
                    (Ok(master), Ok(copied)) if copied >= master => break,
                    (master, copied) if Instant::now() >= deadline => panic!(
                        "the replica on port {} did not catch up with its master on port {} \
                         within {SETTLE_DEADLINE:?} (master offset {master:?}, replica offset \
                         {copied:?}); the nodes' logs:\n{}",
                        replica.port,
                        replica.master_port,
                        self.logs()
                    ),
                    _ => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        }
    }

    /// Moves one slot, with its keys, to the master on `to_master_port`, by the documented
    /// protocol (what `redis-cli --cluster reshard` does, for a slot we choose): IMPORTING on the
    /// destination, MIGRATING on the source, MIGRATE the keys in batches, then SETSLOT NODE on
    /// the destination, the source and every other master. Waits until the cluster agrees again.
    /// Clients see MOVED and ASK redirections meanwhile, as in production.
    pub fn migrate_slot(&self, slot: u16, to_master_port: u16) {
        assert!(slot < SLOTS, "slot {slot} is not below {SLOTS}");
        let _operation = self.lock_operations();
        let deadline = Instant::now() + SETTLE_DEADLINE;
        // Start from a settled cluster: a node that has not heard of the last change would
        // answer SETSLOT with an error.
        let view = self.wait_until(deadline, "the cluster to settle before a migration", |v| {
            v.settled()
        });
        let source_port = view.owner_port(slot);
        if source_port == to_master_port {
            return;
        }
        let id_of = |port: u16| -> String {
            view.entries(port)
                .iter()
                .find(|entry| entry.port == port)
                .map(|entry| entry.id.clone())
                .unwrap_or_else(|| panic!("no node on port {port} in the cluster"))
        };
        let source_id = id_of(source_port);
        let target_id = id_of(to_master_port);
        let slot_arg = slot.to_string();
        let must = |port: u16, args: &[&str]| {
            query::<redis::Value>(self.addr_of(port), args)
                .unwrap_or_else(|err| panic!("{} on port {port}: {err}", args.join(" ")));
        };
        must(
            to_master_port,
            &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &source_id],
        );
        must(
            source_port,
            &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &target_id],
        );
        let batch = MIGRATE_BATCH.to_string();
        loop {
            let keys: Vec<Vec<u8>> = query(
                self.addr_of(source_port),
                &["CLUSTER", "GETKEYSINSLOT", &slot_arg, &batch],
            )
            .unwrap_or_else(|err| panic!("CLUSTER GETKEYSINSLOT on {source_port}: {err}"));
            if keys.is_empty() {
                break;
            }
            // The source dials the destination: at its host's address.
            let mut migrate = redis::cmd("MIGRATE");
            migrate
                .arg(self.node_ip(to_master_port).to_string())
                .arg(to_master_port)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys);
            connect(self.addr_of(source_port))
                .and_then(|mut con| {
                    migrate
                        .query::<redis::Value>(&mut con)
                        .map_err(|err| err.to_string())
                })
                .unwrap_or_else(|err| {
                    panic!("MIGRATE of slot {slot} from {source_port} to {to_master_port}: {err}")
                });
        }
        // The destination first, so that the slot is owned before the source stops serving it.
        let assign = ["CLUSTER", "SETSLOT", &slot_arg, "NODE", &target_id];
        must(to_master_port, &assign);
        must(source_port, &assign);
        for master in view.master_ports() {
            if master != to_master_port && master != source_port {
                must(master, &assign);
            }
        }
        self.wait_until(
            deadline,
            &format!("the cluster to agree that slot {slot} is on port {to_master_port}"),
            |view| {
                if view.owner_port(slot) != to_master_port {
                    return Err(format!("slot {slot} is not on {to_master_port} yet"));
                }
                view.settled()
            },
        );
    }

    /// Moves `count` slots, with their keys, from the master on `from_port` to the master on
    /// `to_port` with `redis-cli --cluster reshard` itself (redis-cli picks the slots). Waits until
    /// the cluster agrees again.
    pub fn reshard(&self, count: u16, from_port: u16, to_port: u16) {
        let _operation = self.lock_operations();
        let deadline = Instant::now() + SETTLE_DEADLINE;
        // redis-cli refuses to reshard a cluster whose nodes disagree.
        let view = self.wait_until(deadline, "the cluster to settle before a reshard", |v| {
            v.settled()
        });
        let id_of = |port: u16| -> String {
            view.entries(port)
                .iter()
                .find(|entry| entry.port == port && entry.is_master())
                .map(|entry| entry.id.clone())
                .unwrap_or_else(|| panic!("no master on port {port} in the cluster"))
        };
        let from_id = id_of(from_port);
        let to_id = id_of(to_port);
        let mut reshard = Command::new(&self.redis_cli);
        reshard
            .arg("--cluster")
            .arg("reshard")
            .arg(self.addr_of(from_port).to_string())
            .arg("--cluster-from")
            .arg(from_id)
            .arg("--cluster-to")
            .arg(to_id)
            .arg("--cluster-slots")
            .arg(count.to_string())
            .arg("--cluster-yes");
        self.run_redis_cli(reshard, "redis-cli --cluster reshard");
        self.wait_until(deadline, "the cluster to settle after a reshard", |view| {
            view.settled()
        });
    }

    /// The last lines of every node's log, for a failure message.
    pub fn logs(&self) -> String {
        let nodes = self.lock_nodes();
        let mut out = String::new();
        for node in nodes.iter() {
            let log =
                std::fs::read_to_string(node.dir.path().join("redis.log")).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_LINES)..];
            let state = match (&node.process, node.cut_off) {
                (None, _) => "killed",
                (Some(_), true) => "running, cut off",
                (Some(_), false) => "running",
            };
            out.push_str(&format!(
                "--- node on {} ({state}, id {}), last {} lines of its log:\n{}\n",
                node.addr(),
                if node.id.is_empty() { "?" } else { &node.id },
                tail.len(),
                tail.join("\n")
            ));
        }
        out
    }

    fn start_fresh_node(&self, host: NodeHost, node_timeout_ms: u64) -> Node {
        let mut last_failure = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let dir = tempfile::tempdir().expect("create a directory for a cluster node");
            // Not port + 10000, the default: that one may be taken, or be another node's port.
            let (port, bus_port) = (free_port(), free_port());
            let mut process = spawn(
                &self.redis_server,
                &host,
                port,
                bus_port,
                dir.path(),
                node_timeout_ms,
            );
            match wait_for_ping(&mut process, SocketAddrV4::new(host.ip, port), dir.path()) {
                Ok(()) => {
                    return Node {
                        host,
                        port,
                        bus_port,
                        node_timeout_ms,
                        id: String::new(),
                        dir,
                        process: Some(process),
                        slots_when_killed: Vec::new(),
                        cut_off: false,
                    };
                }
                // Exited: most likely a port was taken in between; try new ones.
                Err(failure) => last_failure = failure,
            }
        }
        panic!("a cluster node did not start after {PORT_ATTEMPTS} attempts: {last_failure}");
    }

    fn run_redis_cli(&self, mut command: Command, what: &str) {
        let output = command
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|err| panic!("could not run {}: {err}", self.redis_cli.display()));
        // Its exit status, and also its "[ERR]" lines, in case one is only printed.
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() || stdout.contains("[ERR]") || stderr.contains("[ERR]") {
            panic!(
                "{what} failed ({}):\n{stdout}\n{stderr}\nthe nodes' logs:\n{}",
                output.status,
                self.logs()
            );
        }
    }

    /// Looks at every running node until `ready` accepts what they say, and returns that view;
    /// panics with the last reason and the nodes' logs at `deadline`.
    fn wait_until(
        &self,
        deadline: Instant,
        what: &str,
        ready: impl Fn(&ClusterView) -> Result<(), String>,
    ) -> ClusterView {
        loop {
            let failure = match self.look() {
                Ok(view) => match ready(&view) {
                    Ok(()) => return view,
                    Err(failure) => failure,
                },
                Err(failure) => failure,
            };
            if Instant::now() >= deadline {
                panic!(
                    "timed out waiting for {what}: {failure}\nthe nodes' logs:\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// What every running node that is not cut off says now.
    fn look(&self) -> Result<ClusterView, String> {
        let running: Vec<(SocketAddrV4, String)> = self
            .lock_nodes()
            .iter()
            .filter(|node| node.in_view())
            .map(|node| (node.addr(), node.id.clone()))
            .collect();
        if running.is_empty() {
            return Err("every node of the cluster is killed or cut off".to_string());
        }
        let mut views = Vec::new();
        for (addr, id) in running.iter().cloned() {
            let port = addr.port();
            let nodes = parse_cluster_nodes(&query::<String>(addr, &["CLUSTER", "NODES"])?)
                .map_err(|err| format!("CLUSTER NODES of {addr}: {err}"))?;
            let info = query::<String>(addr, &["CLUSTER", "INFO"])?;
            let cluster_ok = info_field(&info, "cluster_state") == Some("ok");
            let is_replica = nodes
                .iter()
                .any(|entry| entry.port == port && !entry.is_master());
            let link_up = if is_replica {
                let replication = query::<String>(addr, &["INFO", "replication"])?;
                info_field(&replication, "master_link_status") == Some("up")
            } else {
                true
            };
            views.push(NodeView {
                port,
                id,
                nodes,
                cluster_ok,
                link_up,
            });
        }
        Ok(ClusterView { views })
    }

    /// `CLUSTER NODES` of the first running node, not cut off, that answers.
    fn one_view(&self) -> Vec<NodeEntry> {
        self.try_one_view()
            .unwrap_or_else(|failures| panic!("no running node answered CLUSTER NODES: {failures}"))
    }

    fn try_one_view(&self) -> Result<Vec<NodeEntry>, String> {
        let mut failures = Vec::new();
        for addr in self.view_addrs() {
            match query::<String>(addr, &["CLUSTER", "NODES"]).and_then(|t| parse_cluster_nodes(&t))
            {
                Ok(nodes) => return Ok(nodes),
                Err(failure) => failures.push(format!("{addr}: {failure}")),
            }
        }
        Err(format!("{failures:?}"))
    }

    /// The slots that node `id`, just cut off at `addr`, owned: as the others still see it, or
    /// else as it sees itself.
    fn slots_of_cut_off(&self, id: &str, addr: SocketAddrV4) -> Vec<RangeInclusive<u16>> {
        let owned = |entries: Vec<NodeEntry>| {
            entries
                .into_iter()
                .find(|entry| entry.id == id && !entry.slots.is_empty())
                .map(|entry| entry.slots)
        };
        let others = self.try_one_view();
        if let Some(slots) = others.clone().ok().and_then(owned) {
            return slots;
        }
        let itself =
            query::<String>(addr, &["CLUSTER", "NODES"]).and_then(|t| parse_cluster_nodes(&t));
        if let Some(slots) = itself.clone().ok().and_then(owned) {
            return slots;
        }
        panic!(
            "which slots the node on {addr} owned when it was cut off: the others no longer say \
             it owns any ({others:?}), and it does not say so itself ({itself:?}); call \
             wait_for_failover_of right after the cut"
        );
    }

    /// The addresses of the running nodes that are not cut off, in the order they were started.
    fn view_addrs(&self) -> Vec<SocketAddrV4> {
        let addrs: Vec<SocketAddrV4> = self
            .lock_nodes()
            .iter()
            .filter(|node| node.in_view())
            .map(Node::addr)
            .collect();
        assert!(
            !addrs.is_empty(),
            "every node of the cluster is killed or cut off"
        );
        addrs
    }

    /// The address of the node on `port`.
    fn addr_of(&self, port: u16) -> SocketAddrV4 {
        node_at(&mut self.lock_nodes(), port).addr()
    }

    fn lock_nodes(&self) -> MutexGuard<'_, Vec<Node>> {
        // A test that panicked mid-operation must not make Drop panic as well.
        self.nodes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_operations(&self) -> MutexGuard<'_, ()> {
        self.operations
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in self.lock_nodes().iter_mut() {
            if let Some(process) = node.process.take() {
                process.kill(false);
            }
        }
        // The TempDirs go with the nodes.
    }
}

/// The hash slot of `key`, as Redis Cluster computes it: CRC16 (XMODEM) of the key, or of its
/// hash tag (what is between the first `{` and the next `}`, if not empty), modulo 16384.
pub fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(bytes);
    crc16_xmodem(hashed) % SLOTS
}

/// CRC16 with polynomial 0x1021 and initial value 0, the variant in Redis's `crc16.c`.
fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// What every running node said at one moment.
struct ClusterView {
    views: Vec<NodeView>,
}

/// What one node said: its `CLUSTER NODES`, `cluster_state`, and, for a replica, whether the
/// link to its master is up.
struct NodeView {
    port: u16,
    id: String,
    nodes: Vec<NodeEntry>,
    cluster_ok: bool,
    link_up: bool,
}

impl ClusterView {
    /// Ready: every running node says `cluster_state:ok`, knows every other running node as
    /// healthy, has no slot migrating or importing, and all agree on the owner of each of the
    /// 16384 slots and on each running node's role; every replica's link to its master is up.
    fn settled(&self) -> Result<(), String> {
        let running: Vec<&str> = self.views.iter().map(|view| view.id.as_str()).collect();
        let first = &self.views[0];
        let slot_map = first.slot_map();
        let covered: u32 = slot_map
            .iter()
            .map(|(range, _)| u32::from(range.end() - range.start()) + 1)
            .sum();
        if covered != u32::from(SLOTS) {
            return Err(format!(
                "port {} sees {covered} of {SLOTS} slots covered",
                first.port
            ));
        }
        let roles = first.roles(&running)?;
        for view in &self.views {
            if !view.cluster_ok {
                return Err(format!("port {} says cluster_state is not ok", view.port));
            }
            if !view.link_up {
                return Err(format!("port {}: master_link_status is not up", view.port));
            }
            if let Some(open) = view.nodes.iter().find(|entry| entry.open_slots) {
                return Err(format!(
                    "port {} sees an open (migrating or importing) slot on port {}",
                    view.port, open.port
                ));
            }
            if view.slot_map() != slot_map {
                return Err(format!(
                    "ports {} and {} disagree about the slots",
                    first.port, view.port
                ));
            }
            if view.roles(&running)? != roles {
                return Err(format!(
                    "ports {} and {} disagree about the roles",
                    first.port, view.port
                ));
            }
        }
        Ok(())
    }

    /// The ids of the nodes owning slots, as any running node sees it.
    fn owner_ids(&self) -> impl Iterator<Item = &str> {
        self.views.iter().flat_map(|view| {
            view.nodes
                .iter()
                .filter(|entry| !entry.slots.is_empty())
                .map(|entry| entry.id.as_str())
        })
    }

    /// The port of the owner of `slot` as the first running node sees it.
    fn owner_port(&self, slot: u16) -> u16 {
        let nodes = &self.views[0].nodes;
        nodes
            .iter()
            .find(|entry| entry.owns(slot))
            .map(|entry| entry.port)
            .unwrap_or_else(|| panic!("no node owns slot {slot}: {nodes:#?}"))
    }

    /// The ports of the masters as the first running node sees them.
    fn master_ports(&self) -> Vec<u16> {
        self.views[0]
            .nodes
            .iter()
            .filter(|entry| entry.is_master() && !entry.is_failing())
            .map(|entry| entry.port)
            .collect()
    }

    /// The id of the master of node `id`, as the first running node sees it; `None` for a master.
    fn master_id_of(&self, id: &str) -> Option<&str> {
        self.views[0]
            .nodes
            .iter()
            .find(|entry| entry.id == id && !entry.is_master())
            .and_then(|entry| entry.master_id.as_deref())
    }

    /// What the node on `port` sees, or else the first running node.
    fn entries(&self, port: u16) -> &[NodeEntry] {
        let view = self
            .views
            .iter()
            .find(|view| view.port == port)
            .unwrap_or(&self.views[0]);
        &view.nodes
    }
}

impl NodeView {
    /// Slot ranges and their owners' ids, sorted, adjacent ranges of one owner merged.
    fn slot_map(&self) -> Vec<(RangeInclusive<u16>, String)> {
        let mut ranges: Vec<(RangeInclusive<u16>, String)> = self
            .nodes
            .iter()
            .flat_map(|entry| {
                entry
                    .slots
                    .iter()
                    .map(|range| (range.clone(), entry.id.clone()))
            })
            .collect();
        ranges.sort_by_key(|(range, _)| *range.start());
        let mut merged: Vec<(RangeInclusive<u16>, String)> = Vec::new();
        for (range, owner) in ranges {
            match merged.last_mut() {
                Some((last, last_owner))
                    if *last_owner == owner
                        && u32::from(*last.end()) + 1 == u32::from(*range.start()) =>
                {
                    *last = *last.start()..=*range.end();
                }
                _ => merged.push((range, owner)),
            }
        }
        merged
    }

    /// For each running node (by id, sorted): the id of its master, or `None` for a master.
    /// Fails if this node does not know a running node, or sees it failing or still joining.
    fn roles(&self, running: &[&str]) -> Result<Vec<(String, Option<String>)>, String> {
        let mut roles = Vec::new();
        for id in running {
            let entry = self
                .nodes
                .iter()
                .find(|entry| entry.id == *id)
                .ok_or_else(|| format!("port {} does not know node {id}", self.port))?;
            if entry.is_failing() || entry.has_flag("handshake") || entry.has_flag("noaddr") {
                return Err(format!(
                    "port {} sees port {} as {}",
                    self.port,
                    entry.port,
                    entry.flags.join(",")
                ));
            }
            let master = (!entry.is_master()).then(|| entry.master_id.clone().unwrap_or_default());
            roles.push((id.to_string(), master));
        }
        roles.sort();
        Ok(roles)
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct NodeEntry {
    id: String,
    port: u16,
    flags: Vec<String>,
    master_id: Option<String>,
    slots: Vec<RangeInclusive<u16>>,
    /// A `[slot->-id]` or `[slot-<-id]` entry: a migration is under way.
    open_slots: bool,
}

impl NodeEntry {
    fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    fn is_master(&self) -> bool {
        self.has_flag("master")
    }

    fn is_failing(&self) -> bool {
        self.has_flag("fail") || self.has_flag("fail?")
    }

    fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|range| range.contains(&slot))
    }
}

/// Parses `CLUSTER NODES`: `<id> <ip:port@cport[,hostname]> <flags> <master> <ping-sent>
/// <pong-recv> <config-epoch> <link-state> <slot>...`.
fn parse_cluster_nodes(text: &str) -> Result<Vec<NodeEntry>, String> {
    let mut entries = Vec::new();
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            return Err(format!("short line {line:?}"));
        }
        let address = fields[1];
        let port = address
            .split_once(':')
            .and_then(|(_, rest)| rest.split(['@', ',']).next())
            .and_then(|port| port.parse().ok())
            .ok_or_else(|| format!("no port in {address:?}"))?;
        let mut slots = Vec::new();
        let mut open_slots = false;
        for slot in &fields[8..] {
            if slot.starts_with('[') {
                open_slots = true;
                continue;
            }
            let parse = |s: &str| {
                s.parse::<u16>()
                    .map_err(|_| format!("bad slot {slot:?} in {line:?}"))
            };
            let range = match slot.split_once('-') {
                Some((start, end)) => parse(start)?..=parse(end)?,
                None => parse(slot)?..=parse(slot)?,
            };
            slots.push(range);
        }
        entries.push(NodeEntry {
            id: fields[0].to_string(),
            port,
            flags: fields[2]
                .split(',')
                .filter(|flag| *flag != "myself")
                .map(str::to_string)
                .collect(),
            master_id: (fields[3] != "-").then(|| fields[3].to_string()),
            slots,
            open_slots,
        });
    }
    Ok(entries)
}

/// `field:value` lines of `INFO` and `CLUSTER INFO`.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.trim_end()
            .strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
    })
}

fn url(addr: SocketAddrV4) -> String {
    format!("redis://{addr}/")
}

fn connect(addr: SocketAddrV4) -> Result<redis::Connection, String> {
    let client = redis::Client::open(url(addr)).map_err(|err| err.to_string())?;
    let con = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .map_err(|err| format!("connect to {addr}: {err}"))?;
    let timeout = Some(Duration::from_secs(10));
    con.set_read_timeout(timeout)
        .and_then(|()| con.set_write_timeout(timeout))
        .map_err(|err| err.to_string())?;
    Ok(con)
}

/// One command on a fresh connection to the node at `addr`.
fn query<T: redis::FromRedisValue>(addr: SocketAddrV4, args: &[&str]) -> Result<T, String> {
    let mut con = connect(addr)?;
    let mut command = redis::cmd(args[0]);
    for arg in &args[1..] {
        command.arg(*arg);
    }
    command
        .query(&mut con)
        .map_err(|err| format!("{} on {addr}: {err}", args.join(" ")))
}

fn node_at(nodes: &mut [Node], port: u16) -> &mut Node {
    nodes
        .iter_mut()
        .find(|node| node.port == port)
        .unwrap_or_else(|| panic!("no node of this cluster listens on port {port}"))
}

/// Starts `redis-server` in cluster mode, under the wrapper, on `host`: bound to its address. When
/// that is not loopback, the node also announces it (a node otherwise learns its address from the
/// first peer that talks to it) and runs without protected mode, which in Redis 7 refuses every
/// client from another address, replicas and the test process included, to a server without a
/// password (the hosts are on a private network of the test's).
fn spawn(
    binary: &Path,
    host: &NodeHost,
    port: u16,
    bus_port: u16,
    dir: &Path,
    node_timeout_ms: u64,
) -> Process {
    let mut command = (host.command)(OsStr::new("sh"));
    command
        .arg("-c")
        .arg(WRAPPER)
        .arg("baton-redis-cluster-node")
        .arg(dir)
        .arg(binary)
        .arg("--port")
        .arg(port.to_string())
        .arg("--bind")
        .arg(host.ip.to_string());
    if !host.ip.is_loopback() {
        command
            .arg("--cluster-announce-ip")
            .arg(host.ip.to_string())
            .arg("--protected-mode")
            .arg("no");
    }
    let mut shell = command
        .arg("--cluster-enabled")
        .arg("yes")
        .arg("--cluster-config-file")
        .arg("nodes.conf")
        .arg("--cluster-node-timeout")
        .arg(node_timeout_ms.to_string())
        .arg("--cluster-port")
        .arg(bus_port.to_string())
        .arg("--appendonly")
        .arg("no")
        .arg("--save")
        .arg("")
        // A master waits 5 s (Redis 7's default) for more replicas before it starts a diskless
        // full sync; here every replica would wait for it, at start and after a failover.
        .arg("--repl-diskless-sync-delay")
        .arg("0")
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        // For whoever looks at a stuck test's directory.
        .arg("--pidfile")
        .arg(dir.join("redis.pid"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|err| panic!("could not run sh for {}: {err}", binary.display()));
    let lifeline = shell.stdin.take().expect("sh was given a piped stdin");
    Process { shell, lifeline }
}

/// Waits until the server answers PING; `Err` with its log if it exited first (most likely: a
/// port was taken). Panics if it neither answers nor exits within the deadline.
fn wait_for_ping(process: &mut Process, addr: SocketAddrV4, dir: &Path) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let log = || std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default();
    loop {
        if let Some(status) = process.shell.try_wait().expect("poll redis-server's shell") {
            return Err(format!(
                "redis-server on {addr} exited with {status}; its log:\n{}",
                log()
            ));
        }
        if query::<String>(addr, &["PING"]).is_ok_and(|reply| reply == "PONG") {
            return Ok(());
        }
        if Instant::now() >= deadline {
            panic!(
                "redis-server on {addr} did not answer PING within 10 s; its log:\n{}",
                log()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn find_binary(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|candidate| is_executable(candidate))
    });
    found.unwrap_or_else(|| {
        panic!(
            "`{name}` was not found on PATH. The Redis Cluster tests start their own cluster and \
             are never skipped. Install Redis 7 or later (Debian/Ubuntu: `sudo apt-get install \
             redis-server redis-tools`; Fedora: `sudo dnf install redis`; macOS: `brew install \
             redis`) or add the directory holding `{name}` to PATH."
        )
    })
}

#[cfg(unix)]
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(not(unix))]
fn is_executable(path: &Path) -> bool {
    path.is_file()
}
