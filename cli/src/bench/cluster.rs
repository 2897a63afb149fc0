//! The processes a benchmark runs against: Redis (one server, or a Redis Cluster), the
//! coordinators (`--coordinators`, plus one no worker uses for the streaming workload, whose
//! watcher reads through it), workers spread over the coordinators.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use baton_proto::connection::ClientSecurity;
use tokio::process::{Child, Command};

use super::ports::free_port;
use super::redis_server::Topology;
use super::secure::Secure;

pub struct Cluster {
    /// What the coordinators are given as `--redis`: one URL, or a cluster's nodes separated by
    /// commas.
    pub redis_url: String,
    /// The Redis nodes behind it, as found at the start (`redis_server::Topology`).
    pub topology: Topology,
    /// The first coordinator: the one the workloads other than W3 submit to and watch on.
    pub coordinator_url: String,
    /// How the bench's clients reach the coordinators (TLS and a token with `--secure`).
    pub security: ClientSecurity,
    _secure: Option<Secure>,
    /// The coordinators the workers are connected to (`--coordinators`), the first being
    /// `coordinator_url`: their URLs and process ids.
    pub coordinators: Vec<(String, Option<u32>)>,
    /// A second coordinator no worker is connected to, and its process id, when asked for.
    pub second_coordinator: Option<(String, Option<u32>)>,
    /// The workers' process ids.
    pub worker_pids: Vec<u32>,
    /// `--redis-wait-replicas` and `--redis-wait-timeout-ms` of every coordinator, for one
    /// started later ([`Cluster::start_web_coordinator`]).
    wait_replicas: u32,
    wait_timeout_ms: u64,
    /// Killed on drop (kill_on_drop), before the Redis below.
    children: Vec<Child>,
    /// The Redis the bench started, if it did (one server or a cluster); killed after the
    /// coordinators and workers (the fields drop after [`Drop::drop`] killed the children), so
    /// the coordinators do not outlive their store in the logs.
    _single_redis: Option<super::redis_server::LocalRedis>,
    _redis_cluster: Option<super::redis_cluster::RedisCluster>,
}

/// What the cluster runs on and with: see [`Cluster::start`].
pub struct Options<'a> {
    /// An existing Redis (or a cluster's nodes, comma-separated) instead of one the bench starts.
    pub redis: Option<&'a str>,
    /// Start a Redis Cluster (3 masters) instead of one redis-server.
    pub redis_cluster: bool,
    /// `--redis-wait-replicas` of every coordinator, and how many replicas the bench's own Redis
    /// gets (each master of its cluster gets at least one).
    pub wait_replicas: u32,
    pub wait_timeout_ms: u64,
    pub coordinators: usize,
    pub workers: usize,
    /// Tasks each worker runs at once.
    pub concurrency: usize,
    /// What `blob64k` returns.
    pub blob_bytes: usize,
    /// An agents file the workers serve besides their built-in agents.
    pub agents_file: Option<&'a std::path::Path>,
    /// Start another coordinator no worker connects to (W5's watcher's).
    pub second_coordinator: bool,
    pub secure: bool,
}

/// Waits until `ready` holds, or fails after `deadline`.
async fn wait_for<F, Fut>(what: &str, deadline: Duration, mut ready: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < deadline {
        if ready().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("{what} was not ready after {deadline:?}")
}

impl Cluster {
    /// Starts the processes: Redis unless `options.redis` names one (a single `redis-server`
    /// with `wait_replicas` replicas, or a Redis Cluster of 3 masters), `coordinators`
    /// coordinators (and a second one no worker uses, with `second_coordinator`), and
    /// `workers` workers, spread over the coordinators: worker `n` connects to coordinator `n
    /// mod N` first, the others being where it goes if it loses that one.
    pub async fn start(options: Options<'_>) -> anyhow::Result<Self> {
        let me = std::env::current_exe().context("cannot find the baton binary")?;
        let secure = options.secure.then(Secure::new).transpose()?;
        let security = secure.as_ref().map(Secure::client).unwrap_or_default();
        let wait_replicas = options.wait_replicas as usize;
        let (mut single_redis, mut redis_cluster) = (None, None);
        let redis_url = match (options.redis, options.redis_cluster) {
            (Some(url), _) => url.to_owned(),
            (None, true) => {
                let cluster =
                    super::redis_cluster::RedisCluster::start(3, wait_replicas.max(1)).await?;
                redis_cluster.insert(cluster).comma_urls()
            }
            (None, false) => {
                let redis = super::redis_server::LocalRedis::start(wait_replicas).await?;
                single_redis.insert(redis).master.url()
            }
        };
        let topology = Topology::discover(&redis_url).await?;
        let redis = RedisFlags {
            url: &redis_url,
            wait_replicas: options.wait_replicas,
            wait_timeout_ms: options.wait_timeout_ms,
        };
        let mut children = Vec::new();
        let mut coordinators = Vec::new();
        for _ in 0..options.coordinators.max(1) {
            let (url, child) = start_coordinator(&me, &redis, secure.as_ref(), None).await?;
            coordinators.push((url, child.id()));
            children.push(child);
        }
        let second_coordinator = if options.second_coordinator {
            let (url, child) = start_coordinator(&me, &redis, secure.as_ref(), None).await?;
            let pid = child.id();
            children.push(child);
            Some((url, pid))
        } else {
            None
        };
        let urls: Vec<&str> = coordinators.iter().map(|(url, _)| url.as_str()).collect();
        let mut worker_pids = Vec::new();
        for n in 0..options.workers {
            // This worker's coordinator first, then the others in turn.
            let first = n % urls.len();
            let list = [&urls[first..], &urls[..first]].concat().join(",");
            let mut worker = Command::new(&me);
            worker.arg("worker");
            if let Some(path) = options.agents_file {
                worker.arg("--agents").arg(path);
            }
            children.push(
                worker
                    .args(["--bench-agents", "--coordinator", &list])
                    .args([
                        "--concurrency",
                        &options.concurrency.to_string(),
                        "--id",
                        &format!("bench-{n}"),
                        "--bench-blob-bytes",
                        &options.blob_bytes.to_string(),
                        "--no-metrics",
                    ])
                    .env("RUST_LOG", "warn")
                    .envs(malloc_env())
                    .envs(secure.iter().flat_map(Secure::worker_env))
                    .kill_on_drop(true)
                    .spawn()?,
            );
            worker_pids.extend(children.last().and_then(Child::id));
        }
        let mut clients = Vec::new();
        for url in &urls {
            clients.push(crate::client::connect_with(url, &security).await?);
        }
        let workers = options.workers;
        wait_for("the workers", Duration::from_secs(20), || {
            let clients = clients.clone();
            async move {
                let mut connected = 0;
                for mut client in clients {
                    match client.get_stats(baton_proto::v1::GetStatsRequest {}).await {
                        Ok(stats) => connected += stats.into_inner().workers as usize,
                        Err(_) => return false,
                    }
                }
                connected == workers
            }
        })
        .await?;
        Ok(Self {
            redis_url,
            topology,
            coordinator_url: coordinators[0].0.clone(),
            security,
            _secure: secure,
            coordinators,
            second_coordinator,
            worker_pids,
            wait_replicas: options.wait_replicas,
            wait_timeout_ms: options.wait_timeout_ms,
            children,
            _single_redis: single_redis,
            _redis_cluster: redis_cluster,
        })
    }
}

/// How every coordinator reaches Redis.
struct RedisFlags<'a> {
    url: &'a str,
    wait_replicas: u32,
    wait_timeout_ms: u64,
}

/// Starts a coordinator on a free port against `redis` and waits until it answers; with
/// `http`, its HTTP port (the web UI) there, else none.
async fn start_coordinator(
    me: &std::path::Path,
    redis: &RedisFlags<'_>,
    secure: Option<&Secure>,
    http: Option<u16>,
) -> anyhow::Result<(String, Child)> {
    let port = free_port()?;
    let http = match http {
        Some(port) => vec!["--metrics-listen".to_owned(), format!("127.0.0.1:{port}")],
        None => vec!["--no-metrics".to_owned()],
    };
    let url = match secure {
        Some(_) => Secure::url(port),
        None => format!("http://127.0.0.1:{port}"),
    };
    let security = secure.map(Secure::client).unwrap_or_default();
    let child = Command::new(me)
        .args([
            "coordinator",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--redis-wait-replicas",
            &redis.wait_replicas.to_string(),
            "--redis-wait-timeout-ms",
            &redis.wait_timeout_ms.to_string(),
        ])
        .args(http)
        .args(secure.map(Secure::coordinator_args).unwrap_or_default())
        // From the environment, so that a password in the URL stays out of `ps`.
        .env("BATON_REDIS_URL", redis.url)
        .env("RUST_LOG", "warn")
        .envs(malloc_env())
        .kill_on_drop(true)
        .spawn()?;
    let probe = url.clone();
    wait_for("a coordinator", Duration::from_secs(20), || {
        let (probe, security) = (probe.clone(), security.clone());
        async move { crate::client::connect_with(&probe, &security).await.is_ok() }
    })
    .await?;
    Ok((url, child))
}

/// A coordinator with the web UI on its HTTP port, no worker connected to it: any coordinator
/// serves the UI, reading runs from the store. Killed on drop.
pub struct WebCoordinator {
    /// `http://127.0.0.1:<port>`, its HTTP port.
    pub http_url: String,
    pub pid: Option<u32>,
    _child: Child,
}

impl Cluster {
    /// Starts a [`WebCoordinator`] on this cluster's Redis, and waits until its HTTP port
    /// answers.
    pub async fn start_web_coordinator(&self) -> anyhow::Result<WebCoordinator> {
        let me = std::env::current_exe().context("cannot find the baton binary")?;
        let redis = RedisFlags {
            url: &self.redis_url,
            wait_replicas: self.wait_replicas,
            wait_timeout_ms: self.wait_timeout_ms,
        };
        let http_port = free_port()?;
        let (_, child) =
            start_coordinator(&me, &redis, self._secure.as_ref(), Some(http_port)).await?;
        let http_url = format!("http://127.0.0.1:{http_port}");
        let healthz = format!("{http_url}/healthz");
        let http = reqwest::Client::new();
        wait_for("a coordinator's HTTP port", Duration::from_secs(20), || {
            let request = http.get(&healthz).send();
            async move { request.await.is_ok_and(|r| r.status().is_success()) }
        })
        .await?;
        Ok(WebCoordinator {
            http_url,
            pid: child.id(),
            _child: child,
        })
    }

    /// A client of the coordinator at `url`, one of this cluster's.
    pub async fn client_of(&self, url: &str) -> anyhow::Result<crate::client::Client> {
        crate::client::connect_with(url, &self.security).await
    }

    /// A client of the first coordinator.
    pub async fn client(&self) -> anyhow::Result<crate::client::Client> {
        self.client_of(&self.coordinator_url).await
    }

    /// A client of each coordinator the workers are connected to, in order.
    pub async fn clients(&self) -> anyhow::Result<Vec<crate::client::Client>> {
        let mut clients = Vec::new();
        for (url, _) in &self.coordinators {
            clients.push(self.client_of(url).await?);
        }
        Ok(clients)
    }

    /// The coordinators' counters (`GetStats`), summed over the coordinators the workers are
    /// connected to: a run submitted to one of them is dispatched, and its payloads sent, by
    /// whichever holds its tasks.
    pub async fn stats(&self) -> anyhow::Result<baton_proto::v1::Stats> {
        let mut sum = baton_proto::v1::Stats::default();
        for mut client in self.clients().await? {
            let stats = client
                .get_stats(baton_proto::v1::GetStatsRequest {})
                .await?
                .into_inner();
            sum.workers += stats.workers;
            sum.tasks_dispatched += stats.tasks_dispatched;
            sum.bytes_to_workers += stats.bytes_to_workers;
            sum.transitions += stats.transitions;
            sum.engine_us += stats.engine_us;
            sum.plan_us += stats.plan_us;
            sum.store_us += stats.store_us;
            sum.act_us += stats.act_us;
        }
        Ok(sum)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.start_kill();
        }
    }
}

/// CPU time (user + system) a process has used so far, from `/proc`; `None` elsewhere.
pub fn cpu_time(pid: Option<u32>) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // Linux reports in USER_HZ, 100 per second on every architecture Baton runs on.
    Some(Duration::from_millis(ticks * 10))
}

/// glibc malloc's thresholds as the image sets them (`deploy/docker/Dockerfile`), for the
/// coordinators and workers the bench starts, unless the bench's own environment sets them: the
/// bench measures Baton as it is deployed. Without them a process's first burst of large values
/// pays an mmap and munmap per block (W4's first repetition took 2.5x its median).
pub const MALLOC_ENV: [(&str, &str); 2] = [
    ("MALLOC_MMAP_THRESHOLD_", "33554432"),
    ("MALLOC_TRIM_THRESHOLD_", "67108864"),
];

fn malloc_env() -> impl Iterator<Item = (&'static str, &'static str)> {
    MALLOC_ENV
        .into_iter()
        .filter(|(name, _)| std::env::var_os(name).is_none())
}
