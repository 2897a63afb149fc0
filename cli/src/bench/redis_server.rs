//! The Redis a benchmark runs against: starting the bench's own `redis-server` (with replicas
//! when `--redis-wait-replicas` needs some), finding which nodes are masters and which replicas
//! (one server or a Redis Cluster), what they have done so far, how much memory they use, and
//! emptying them between repetitions.
//!
//! Every figure is summed over the masters: they run the store's commands, so a workload's cost
//! on a Redis Cluster is comparable with its cost on one server. Replicas only apply what their
//! master sends them; their CPU is reported apart (`Work::replica_cpu_s`).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo as _};

use super::ports::free_port;

/// How many ports to try for one server when another process takes the one picked for it
/// before the server binds it.
const PORT_ATTEMPTS: usize = 5;

/// One `redis-server` process the bench started, in a directory of its own. Killed, reaped and
/// its directory removed on drop: the kill waits for the process so that the directory is not
/// removed under a server still writing to it.
pub struct Server {
    pub port: u16,
    child: Child,
    /// Removed after the server is dead (fields drop after [`Drop::drop`]).
    dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts `redis-server` on a free loopback port with `args` besides the bench's defaults
    /// (no persistence, no full-sync delay for replicas), and waits until it answers. Tries new
    /// ports when the server exits at once (most likely its port was taken meanwhile); `ports`
    /// is how many ports it needs (a cluster node needs a bus port too), given to `args`.
    pub async fn start(
        ports: usize,
        args: impl Fn(&[u16], &Path) -> Vec<String>,
    ) -> anyhow::Result<Server> {
        let mut last_failure = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let dir = tempfile::tempdir()?;
            let ports = (0..ports)
                .map(|_| free_port())
                .collect::<anyhow::Result<Vec<u16>>>()?;
            let port = ports[0];
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                // A master waits 5 s (Redis 7's default) for more replicas before a diskless
                // full sync; every replica would wait for it at start.
                .args(["--repl-diskless-sync-delay", "0"])
                .arg("--dir")
                .arg(dir.path())
                .arg("--logfile")
                .arg(dir.path().join("redis.log"))
                .args(args(&ports, dir.path()))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .context(
                    "cannot start redis-server (install it, e.g. apt-get install redis-server)",
                )?;
            let mut server = Server { port, child, dir };
            match server.wait_ready().await {
                Ok(()) => return Ok(server),
                Err(failure) => last_failure = format!("{failure:#}"),
            }
        }
        bail!("redis-server did not start after {PORT_ATTEMPTS} attempts: {last_failure}")
    }

    /// Waits until the server answers PING; fails with its log if it exits first or does not
    /// answer within 10 s.
    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let url = self.url();
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "redis-server on port {} exited with {status}: {}",
                    self.port,
                    self.log()
                );
            }
            if let Ok(mut connection) = connection(url.as_str()).await {
                let pong: redis::RedisResult<String> =
                    redis::cmd("PING").query_async(&mut connection).await;
                if pong.is_ok() {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "redis-server on port {} did not answer within 10 s: {}",
                    self.port,
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The end of the server's log, for errors.
    pub fn log(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

/// The bench's own single Redis: one master and `replicas` replicas of it, so that
/// `--redis-wait-replicas` has replicas to wait for.
pub struct LocalRedis {
    pub master: Server,
    pub replicas: Vec<Server>,
}

impl LocalRedis {
    /// Starts the master, then its replicas (`--replicaof`), and waits until every replica has
    /// finished its first sync: until then `WAIT` would count it out.
    pub async fn start(replicas: usize) -> anyhow::Result<LocalRedis> {
        let master = Server::start(1, |_, _| Vec::new()).await?;
        let mut started = Vec::new();
        for _ in 0..replicas {
            let master_port = master.port.to_string();
            started.push(
                Server::start(1, |_, _| {
                    vec![
                        "--replicaof".into(),
                        "127.0.0.1".into(),
                        master_port.clone(),
                    ]
                })
                .await?,
            );
        }
        let local = LocalRedis {
            master,
            replicas: started,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        for replica in &local.replicas {
            loop {
                let info = info(replica.url().as_str(), "replication").await?;
                if info_field(&info, "master_link_status") == Some("up") {
                    break;
                }
                if Instant::now() >= deadline {
                    bail!(
                        "the replica on port {} did not sync with its master within 30 s: {}",
                        replica.port,
                        replica.log()
                    );
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(local)
    }
}

/// Which Redis nodes a benchmark's numbers come from.
#[derive(Debug, Clone)]
pub struct Topology {
    /// A Redis Cluster (else one server, with or without replicas).
    pub cluster: bool,
    /// The masters: for a cluster, those that own slots.
    pub masters: Vec<ConnectionInfo>,
    pub replicas: Vec<ConnectionInfo>,
}

impl Topology {
    /// Finds the nodes behind `urls` (one URL, or a cluster's nodes separated by commas, as
    /// `--redis` takes them), from the first that answers: a node whose `INFO cluster` says
    /// `cluster_enabled:1` lists the cluster's masters and replicas in `CLUSTER NODES`; one
    /// server lists its replicas in `INFO replication`. The nodes are reached with the first
    /// URL's credentials and scheme.
    pub async fn discover(urls: &str) -> anyhow::Result<Topology> {
        let mut failures = Vec::new();
        for url in urls.split(',').map(str::trim).filter(|url| !url.is_empty()) {
            match Self::discover_from(url).await {
                Ok(topology) => return Ok(topology),
                Err(error) => failures.push(format!(
                    "{}: {error:#}",
                    baton_coordinator::store::redis::redacted(url)
                )),
            }
        }
        bail!("no Redis node answered: {}", failures.join("; "))
    }

    async fn discover_from(url: &str) -> anyhow::Result<Topology> {
        let seed = url.into_connection_info()?;
        let cluster =
            info_field(&info(seed.clone(), "cluster").await?, "cluster_enabled") == Some("1");
        let (mut masters, mut replicas) = (Vec::new(), Vec::new());
        if cluster {
            let mut connection = connection(seed.clone()).await?;
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async(&mut connection)
                .await?;
            for line in nodes.lines() {
                let fields: Vec<&str> = line.split_whitespace().collect();
                if fields.len() < 8 {
                    continue;
                }
                let flags: Vec<&str> = fields[2].split(',').collect();
                if flags
                    .iter()
                    .any(|flag| ["fail", "fail?", "handshake", "noaddr"].contains(flag))
                {
                    continue;
                }
                // ip:port@cport[,hostname]
                let Some((host, port)) = fields[1]
                    .split(['@', ','])
                    .next()
                    .and_then(|address| address.rsplit_once(':'))
                else {
                    continue;
                };
                let port: u16 = port.parse().context("a port in CLUSTER NODES")?;
                let node = at(&seed, host, port);
                if flags.contains(&"master") {
                    // A master without slots runs none of the store's commands.
                    if fields.len() > 8 {
                        masters.push(node);
                    }
                } else if flags.contains(&"slave") {
                    replicas.push(node);
                }
            }
        } else {
            let replication = info(seed.clone(), "replication").await?;
            for line in replication.lines() {
                // slave0:ip=127.0.0.1,port=6380,state=online,offset=0,lag=0
                let Some((name, fields)) = line.trim().split_once(':') else {
                    continue;
                };
                if !name.starts_with("slave") || !name[5..].chars().all(|c| c.is_ascii_digit()) {
                    continue;
                }
                let field = |key: &str| {
                    fields
                        .split(',')
                        .find_map(|field| field.strip_prefix(key)?.strip_prefix('='))
                };
                if let (Some(host), Some(port)) = (field("ip"), field("port")) {
                    replicas.push(at(&seed, host, port.parse()?));
                }
            }
            masters.push(seed);
        }
        anyhow::ensure!(!masters.is_empty(), "the cluster has no master with slots");
        Ok(Topology {
            cluster,
            masters,
            replicas,
        })
    }

    /// `"single"` or `"cluster"`, as the bench's lines say.
    pub fn kind(&self) -> &'static str {
        if self.cluster { "cluster" } else { "single" }
    }
}

/// `seed` (its scheme, credentials and database) at another host and port.
fn at(seed: &ConnectionInfo, host: &str, port: u16) -> ConnectionInfo {
    // CLUSTER NODES leaves a node's own address empty until it has met another node.
    let host = if host.is_empty() {
        match seed.addr() {
            ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. } => host.clone(),
            _ => "127.0.0.1".to_owned(),
        }
    } else {
        host.to_owned()
    };
    let addr = match seed.addr() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host, port),
    };
    seed.clone().set_addr(addr)
}

async fn connection(
    node: impl redis::IntoConnectionInfo,
) -> anyhow::Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(node)?;
    Ok(client.get_multiplexed_async_connection().await?)
}

/// `INFO section` of one node.
async fn info(node: impl redis::IntoConnectionInfo, section: &str) -> anyhow::Result<String> {
    let mut connection = connection(node).await?;
    Ok(redis::cmd("INFO")
        .arg(section)
        .query_async(&mut connection)
        .await?)
}

/// The value of `field:value` in `INFO` or `CLUSTER INFO` text.
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.trim_end()
            .strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
    })
}

/// The masters' `used_memory`, summed, in bytes.
pub async fn used_memory(topology: &Topology) -> anyhow::Result<u64> {
    let mut total = 0;
    for master in &topology.masters {
        total += info_field(&info(master.clone(), "memory").await?, "used_memory")
            .and_then(|value| value.trim().parse::<u64>().ok())
            .context("INFO memory has no used_memory")?;
    }
    Ok(total)
}

/// Empties the store, so that each repetition of a workload starts from nothing: `FLUSHDB` on
/// one server (the URL's database only), `FLUSHALL` on every master of a cluster (a cluster has
/// one database). Replicas follow their masters.
pub async fn flush(topology: &Topology) -> anyhow::Result<()> {
    let command = if topology.cluster {
        "FLUSHALL"
    } else {
        "FLUSHDB"
    };
    for master in &topology.masters {
        let mut connection = connection(master.clone()).await?;
        let () = redis::cmd(command).query_async(&mut connection).await?;
    }
    Ok(())
}

/// What the Redis nodes have done so far: the masters' commands (scripts' own commands
/// included, as `INFO commandstats` counts them), their bytes in and out over the network with
/// clients, and their CPU time; what they sent their replicas, and the replicas' CPU time,
/// apart.
///
/// Redis 7's `total_net_output_bytes` includes the replication stream (it is counted in
/// `total_net_repl_output_bytes` as well), so `net_bytes` leaves that out: with or without
/// replicas, it is the traffic with the coordinators, as it was before the bench had replicas.
#[derive(Debug, Clone, Copy, Default)]
pub struct Work {
    pub commands: u64,
    pub net_bytes: u64,
    pub cpu_s: f64,
    /// What the masters sent their replicas (`total_net_repl_output_bytes`).
    pub replication_bytes: u64,
    pub replica_cpu_s: f64,
}

impl Work {
    /// What was done between `before` and `self`.
    pub fn since(self, before: Work) -> Work {
        Work {
            commands: self.commands.saturating_sub(before.commands),
            net_bytes: self.net_bytes.saturating_sub(before.net_bytes),
            cpu_s: (self.cpu_s - before.cpu_s).max(0.0),
            replication_bytes: self
                .replication_bytes
                .saturating_sub(before.replication_bytes),
            replica_cpu_s: (self.replica_cpu_s - before.replica_cpu_s).max(0.0),
        }
    }

    /// Adds `other` to this.
    pub fn add(&mut self, other: Work) {
        self.commands += other.commands;
        self.net_bytes += other.net_bytes;
        self.cpu_s += other.cpu_s;
        self.replication_bytes += other.replication_bytes;
        self.replica_cpu_s += other.replica_cpu_s;
    }
}

/// The [`Work`] of `topology`'s nodes so far, from `INFO commandstats`, `INFO stats` and `INFO
/// cpu` of each.
pub async fn work(topology: &Topology) -> anyhow::Result<Work> {
    let mut total = Work::default();
    for master in &topology.masters {
        total.add(node_work(master.clone()).await?);
    }
    for replica in &topology.replicas {
        total.replica_cpu_s += node_work(replica.clone()).await?.cpu_s;
    }
    Ok(total)
}

/// One node's [`Work`], its CPU as a master's.
async fn node_work(node: ConnectionInfo) -> anyhow::Result<Work> {
    let mut connection = connection(node).await?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .arg("stats")
        .arg("cpu")
        .query_async(&mut connection)
        .await?;
    let mut work = Work::default();
    let mut client_and_replication_bytes = 0;
    for line in info.lines() {
        if let Some(stat) = line.strip_prefix("cmdstat_") {
            // cmdstat_evalsha:calls=12,usec=...
            let calls = stat
                .split_once(':')
                .and_then(|(_, fields)| fields.split(',').find_map(|f| f.strip_prefix("calls=")))
                .and_then(|calls| calls.parse::<u64>().ok());
            work.commands += calls.unwrap_or_default();
        } else if let Some(bytes) = line
            .strip_prefix("total_net_input_bytes:")
            .or_else(|| line.strip_prefix("total_net_output_bytes:"))
        {
            client_and_replication_bytes += bytes.trim().parse::<u64>().unwrap_or_default();
        } else if let Some(bytes) = line.strip_prefix("total_net_repl_output_bytes:") {
            work.replication_bytes += bytes.trim().parse::<u64>().unwrap_or_default();
        } else if let Some(seconds) = line
            .strip_prefix("used_cpu_sys:")
            .or_else(|| line.strip_prefix("used_cpu_user:"))
        {
            work.cpu_s += seconds.trim().parse::<f64>().unwrap_or_default();
        }
    }
    work.net_bytes = client_and_replication_bytes.saturating_sub(work.replication_bytes);
    Ok(work)
}

/// Waits until the masters run fewer than `per_second` commands a second (over a quarter of a
/// second), for at most `deadline`; says on stderr when they never do.
///
/// On a Redis Cluster each coordinator rebuilds each agent's timer slot registry from the
/// 16,384 slots' timer sets when it first sweeps that agent, and every 5 minutes after
/// (`coordinator/src/store/redis/timers.rs`): 16,384 reads in the background, which would
/// otherwise land in whichever workload runs then and swamp its per-step Redis figures. That
/// is a cost of the cluster, but a cost per agent and minute, not per step; the bench lets it
/// pass before a rep and reports it here (the idle sweeps are a few dozen commands a second per
/// coordinator).
pub async fn wait_quiet(
    topology: &Topology,
    per_second: u64,
    deadline: Duration,
) -> anyhow::Result<()> {
    const WINDOW: Duration = Duration::from_millis(250);
    let start = Instant::now();
    let mut before = work(topology).await?;
    loop {
        tokio::time::sleep(WINDOW).await;
        let now = work(topology).await?;
        let commands = now.since(before).commands;
        if commands * 4 < per_second {
            return Ok(());
        }
        if start.elapsed() >= deadline {
            eprintln!(
                "bench: Redis still runs {} commands a second after {deadline:?}; measuring anyway",
                commands * 4
            );
            return Ok(());
        }
        before = now;
    }
}
