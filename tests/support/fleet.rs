//! A cluster to break on purpose: a durable `redis-server` (append-only file, fsync at every
//! write) that can be restarted, or a Redis Cluster whose masters can be killed
//! ([`Fleet::start_on_cluster`]), several `baton coordinator` processes on fixed ports that can be
//! killed (SIGKILL), stopped (SIGTERM) and started again, and `baton worker` processes that know
//! every coordinator's address and can be killed and replaced. Everything is a child of the test,
//! killed when the [`Fleet`] is dropped; a failing test prints the end of every log.
//!
//! Include it next to `support/cluster.rs` as `harness`, whose helpers it uses.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use baton_proto::v1::run_service_client::RunServiceClient;
use baton_proto::v1::{GetStatsRequest, Stats};
use tonic::transport::Channel;

use std::sync::Arc;

use super::harness::redis_cluster::RedisCluster;
use super::harness::{DEADLINE, Records, RedisServer, baton, free_port};

/// Where the fleet keeps its state.
pub enum Backend {
    Single(RedisServer),
    Cluster(Arc<RedisCluster>),
}

/// A connection to the fleet's Redis, whichever [`Backend`]: commands on it go where their keys
/// live.
#[derive(Clone)]
pub enum RedisConnection {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            RedisConnection::Single(con) => con.req_packed_command(cmd),
            RedisConnection::Cluster(con) => con.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            RedisConnection::Single(con) => con.req_packed_commands(pipeline, offset, count),
            RedisConnection::Cluster(con) => con.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Single(con) => con.get_db(),
            RedisConnection::Cluster(con) => con.get_db(),
        }
    }
}

/// A process of the fleet, and every log file it (and its earlier incarnations) wrote.
struct Node {
    name: String,
    child: Option<Child>,
    logs: Vec<PathBuf>,
}

impl Node {
    fn spawn(&mut self, dir: &Path, mut command: Command) {
        let log = dir.join(format!("{}-{}.log", self.name, self.logs.len() + 1));
        let file = std::fs::File::create(&log).expect("create a log file");
        command
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("clone the log file"))
            .stderr(file);
        self.child = Some(
            command
                .spawn()
                .unwrap_or_else(|e| panic!("could not start {}: {e}", self.name)),
        );
        self.logs.push(log);
    }

    fn signal(&mut self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(child.id().to_string())
                .status();
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The last `lines` lines of every log.
    fn tail(&self, lines: usize) -> String {
        let mut out = String::new();
        for log in &self.logs {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            let start = all.len().saturating_sub(lines);
            out.push_str(&format!("──── {} ({}):\n", self.name, log.display()));
            for line in &all[start..] {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

/// How the coordinators are run.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// `--lease-ms`: how long a dead coordinator's tasks wait.
    pub lease_ms: u64,
    /// `--worker-silence-ms`.
    pub worker_silence_ms: u64,
}

pub struct Fleet {
    dir: tempfile::TempDir,
    backend: Backend,
    /// Given to every coordinator after the fleet's own flags.
    coordinator_args: Vec<String>,
    timing: Timing,
    ports: Vec<u16>,
    /// Where each coordinator serves `/metrics`.
    metrics_ports: Vec<u16>,
    /// Where each worker serves `/metrics`, by id.
    worker_metrics_ports: std::collections::BTreeMap<String, u16>,
    coordinators: Vec<Node>,
    workers: Vec<Node>,
    /// Set in the environment of every process the fleet starts.
    env: Vec<(String, String)>,
}

impl Fleet {
    /// A durable Redis and `coordinators` coordinators on it, each answering.
    pub async fn start(coordinators: usize, timing: Timing) -> Fleet {
        Self::start_with_env(coordinators, timing, &[]).await
    }

    /// [`Fleet::start`], with `env` set for every process it starts (coordinators and workers).
    pub async fn start_with_env(
        coordinators: usize,
        timing: Timing,
        env: &[(&str, &str)],
    ) -> Fleet {
        Self::start_on(
            Backend::Single(RedisServer::start_durable()),
            coordinators,
            timing,
            env,
            &[],
        )
        .await
    }

    /// [`Fleet::start_with_env`], each coordinator also given `coordinator_args`.
    pub async fn start_with_args(
        coordinators: usize,
        timing: Timing,
        env: &[(&str, &str)],
        coordinator_args: &[&str],
    ) -> Fleet {
        Self::start_on(
            Backend::Single(RedisServer::start_durable()),
            coordinators,
            timing,
            env,
            coordinator_args,
        )
        .await
    }

    /// `coordinators` coordinators on `cluster` (given every node's URL), each with
    /// `coordinator_args` too, each answering.
    pub async fn start_on_cluster(
        cluster: Arc<RedisCluster>,
        coordinators: usize,
        timing: Timing,
        coordinator_args: &[&str],
    ) -> Fleet {
        Self::start_on(
            Backend::Cluster(cluster),
            coordinators,
            timing,
            &[],
            coordinator_args,
        )
        .await
    }

    async fn start_on(
        backend: Backend,
        coordinators: usize,
        timing: Timing,
        env: &[(&str, &str)],
        coordinator_args: &[&str],
    ) -> Fleet {
        let mut fleet = Fleet {
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            dir: tempfile::tempdir().expect("create the fleet's folder"),
            backend,
            coordinator_args: coordinator_args.iter().map(|a| (*a).to_owned()).collect(),
            timing,
            ports: (0..coordinators).map(|_| free_port()).collect(),
            metrics_ports: (0..coordinators).map(|_| free_port()).collect(),
            worker_metrics_ports: Default::default(),
            coordinators: (0..coordinators)
                .map(|n| Node {
                    name: format!("coordinator-{n}"),
                    child: None,
                    logs: Vec::new(),
                })
                .collect(),
            workers: Vec::new(),
        };
        for n in 0..coordinators {
            fleet.start_coordinator(n).await;
        }
        fleet
    }

    /// The fleet's single Redis server; panics on a cluster.
    pub fn redis(&mut self) -> &mut RedisServer {
        match &mut self.backend {
            Backend::Single(server) => server,
            Backend::Cluster(_) => panic!("this fleet runs on a Redis Cluster"),
        }
    }

    /// The fleet's Redis Cluster; panics on a single server.
    pub fn redis_cluster(&self) -> &Arc<RedisCluster> {
        match &self.backend {
            Backend::Cluster(cluster) => cluster,
            Backend::Single(_) => panic!("this fleet runs on a single Redis"),
        }
    }

    /// What coordinators get as `--redis`: the server's URL, or every cluster node's.
    fn redis_url(&self) -> String {
        match &self.backend {
            Backend::Single(server) => server.url(),
            Backend::Cluster(cluster) => cluster.comma_urls(),
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn url(&self, n: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[n])
    }

    /// Coordinator `n`'s HTTP port: its web UI, `/metrics`, the probes.
    pub fn http_url(&self, n: usize) -> String {
        format!("http://127.0.0.1:{}", self.metrics_ports[n])
    }

    /// Coordinator `n`'s metrics endpoint.
    pub fn metrics_url(&self, n: usize) -> String {
        format!("http://127.0.0.1:{}/metrics", self.metrics_ports[n])
    }

    /// Worker `id`'s metrics endpoint.
    pub fn worker_metrics_url(&mut self, id: &str) -> String {
        format!("http://127.0.0.1:{}/metrics", self.worker_metrics_port(id))
    }

    fn worker_metrics_port(&mut self, id: &str) -> u16 {
        *self
            .worker_metrics_ports
            .entry(id.to_owned())
            .or_insert_with(free_port)
    }

    /// Every coordinator's URL, separated by commas, as workers and clients take them.
    pub fn urls(&self) -> String {
        (0..self.ports.len())
            .map(|n| self.url(n))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts coordinator `n` (again) on its port, and waits until it answers.
    pub async fn start_coordinator(&mut self, n: usize) {
        let mut command = baton();
        command
            .arg("coordinator")
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.ports[n]))
            .arg("--redis")
            .arg(self.redis_url())
            .arg("--id")
            .arg(format!("coordinator-{n}"))
            .arg("--lease-ms")
            .arg(self.timing.lease_ms.to_string())
            .arg("--worker-silence-ms")
            .arg(self.timing.worker_silence_ms.to_string())
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{}", self.metrics_ports[n]))
            .args(&self.coordinator_args)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Ok(filter) = std::env::var("BATON_TEST_RUST_LOG") {
            command.env("RUST_LOG", filter);
        }
        let dir = self.dir.path().to_owned();
        self.coordinators[n].spawn(&dir, command);
        let deadline = Instant::now() + DEADLINE;
        while self.stats(n).await.is_none() {
            if let Some(status) = self.coordinators[n]
                .child
                .as_mut()
                .and_then(|c| c.try_wait().expect("poll a coordinator"))
            {
                panic!("coordinator-{n} exited with {status}\n{}", self.logs());
            }
            assert!(
                Instant::now() < deadline,
                "coordinator-{n} did not answer\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The process id of coordinator `n`, which must be running.
    pub fn coordinator_pid(&self, n: usize) -> u32 {
        self.coordinators[n]
            .child
            .as_ref()
            .unwrap_or_else(|| panic!("coordinator-{n} is not running"))
            .id()
    }

    /// SIGKILL: no goodbye to anyone.
    pub fn kill_coordinator(&mut self, n: usize) {
        self.coordinators[n].kill();
    }

    /// SIGTERM, then waits (bounded) for the coordinator to exit; returns its status.
    pub async fn terminate_coordinator(&mut self, n: usize) -> ExitStatus {
        self.coordinators[n].signal("TERM");
        let deadline = Instant::now() + DEADLINE;
        loop {
            let child = self.coordinators[n].child.as_mut().expect("running");
            if let Some(status) = child.try_wait().expect("poll a coordinator") {
                self.coordinators[n].child = None;
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "coordinator-{n} did not stop\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts `baton worker --id ID --coordinator <every url> --agents AGENTS`.
    pub fn start_worker(&mut self, id: &str, agents: &Path, concurrency: usize) {
        self.start_worker_at(id, agents, concurrency, self.urls());
    }

    /// Starts a worker connected to coordinator `n` only.
    pub fn start_worker_on(&mut self, id: &str, agents: &Path, concurrency: usize, n: usize) {
        self.start_worker_at(id, agents, concurrency, self.url(n));
    }

    fn start_worker_at(&mut self, id: &str, agents: &Path, concurrency: usize, urls: String) {
        let mut command = baton();
        command
            .arg("worker")
            .arg("--coordinator")
            .arg(urls)
            .arg("--agents")
            .arg(agents)
            .arg("--concurrency")
            .arg(concurrency.to_string())
            .arg("--id")
            .arg(id)
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{}", self.worker_metrics_port(id)))
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        let mut node = Node {
            name: id.to_owned(),
            child: None,
            logs: Vec::new(),
        };
        node.spawn(self.dir.path(), command);
        self.workers.push(node);
    }

    /// Starts worker `id` serving one agent, `slow`, that logs each execution under `records`
    /// and takes `seconds` (`tests/agents/logged-agent.sh`).
    pub fn start_logged_worker(
        &mut self,
        records: &Records,
        id: &str,
        seconds: &str,
        concurrency: usize,
    ) {
        let agents = records.agents_file(id, &[("slow", vec!["logged-agent.sh", seconds])]);
        self.start_worker(id, &agents, concurrency);
    }

    /// SIGKILL on a worker: its tasks die with it.
    pub fn kill_worker(&mut self, id: &str) {
        self.workers
            .iter_mut()
            .find(|w| w.name == id)
            .unwrap_or_else(|| panic!("no worker {id}"))
            .kill();
    }

    /// The ids of the workers running now.
    pub fn live_workers(&self) -> Vec<String> {
        self.workers
            .iter()
            .filter(|w| w.child.is_some())
            .map(|w| w.name.clone())
            .collect()
    }

    /// Coordinator `n`'s counters, or `None` if it does not answer.
    /// With `BATON_TOKEN` in the fleet's environment, it asks with that token (its principal
    /// needs the `read` role).
    pub async fn stats(&self, n: usize) -> Option<Stats> {
        let mut client = RunServiceClient::connect(self.url(n)).await.ok()?;
        let mut request = tonic::Request::new(GetStatsRequest {});
        if let Some((_, token)) = self.env.iter().find(|(key, _)| key == "BATON_TOKEN") {
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("a header value"),
            );
        }
        Some(client.get_stats(request).await.ok()?.into_inner())
    }

    /// Waits until the coordinators have `workers` workers connected between them.
    pub async fn wait_for_workers(&self, workers: u32) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let mut connected = 0;
            for n in 0..self.ports.len() {
                connected += self.stats(n).await.map_or(0, |s| s.workers);
            }
            if connected >= workers {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{connected} of {workers} workers connected\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A client of coordinator `n`.
    pub async fn client(&self, n: usize) -> Option<RunServiceClient<Channel>> {
        RunServiceClient::connect(self.url(n)).await.ok()
    }

    /// A connection to the fleet's Redis (a cluster client on a cluster).
    pub async fn redis_connection(&self) -> RedisConnection {
        match &self.backend {
            Backend::Single(server) => RedisConnection::Single(
                redis::Client::open(server.url())
                    .expect("a Redis URL")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connect to Redis"),
            ),
            Backend::Cluster(cluster) => RedisConnection::Cluster(
                redis::cluster::ClusterClient::new(cluster.urls())
                    .expect("cluster URLs")
                    .get_async_connection()
                    .await
                    .expect("connect to the Redis Cluster"),
            ),
        }
    }

    /// Everything process `name` (a coordinator or worker) has logged, in every incarnation.
    pub fn log_of(&self, name: &str) -> String {
        self.coordinators
            .iter()
            .chain(&self.workers)
            .filter(|node| node.name == name)
            .flat_map(|node| &node.logs)
            .map(|log| std::fs::read_to_string(log).unwrap_or_default())
            .collect()
    }

    /// The end of every process's logs, for a failure message.
    pub fn logs(&self) -> String {
        self.coordinators
            .iter()
            .chain(&self.workers)
            .map(|node| node.tail(60))
            .collect()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for node in self.coordinators.iter_mut().chain(&mut self.workers) {
            node.kill();
        }
        if std::thread::panicking() {
            eprintln!("the fleet's logs:\n{}", self.logs());
        }
        // For a look at a run that passed but took long: BATON_KEEP_LOGS=DIR keeps every log.
        if let Some(keep) = std::env::var_os("BATON_KEEP_LOGS") {
            let keep = std::path::PathBuf::from(keep);
            let _ = std::fs::create_dir_all(&keep);
            for log in self
                .coordinators
                .iter()
                .chain(&self.workers)
                .flat_map(|n| &n.logs)
            {
                if let Some(name) = log.file_name() {
                    let _ = std::fs::copy(log, keep.join(name));
                }
            }
        }
    }
}
