//! Faults that kill -9 cannot show. Each process of the cluster runs on a host of its own (a
//! network namespace, `support/netns.rs`) and the test cuts the network between them, silently,
//! the way a switch or a cloud network fails; or, on a Redis Cluster, it kills a master.
//!
//! - [`a_coordinator_cut_off_from_redis`]: its workers stay connected to it; the other
//!   coordinator's workers take its runs over once its leases run out, it says it is not ready,
//!   and what it tries to write after the cut heals is fenced.
//! - [`a_worker_cut_off_from_its_coordinator`]: its tasks go to another worker once it is taken
//!   for dead; when the cut heals its late answers are refused.
//! - [`a_redis_master_killed`]: its replica takes over (`--redis-wait-replicas 1`), the runs in
//!   flight finish.
//! - [`a_redis_master_cut_off_from_its_cluster`]: the minority side must not keep transitions
//!   that are then lost.
//!
//! Each one checks that every run succeeds, that no step visit is answered twice in a run's event
//! log, and that every step result a watcher was told about is the one the run kept: a
//! transition the coordinator acted on and Redis then lost would show as a step whose result
//! changed.

// `support/netns.rs` and `support/cluster.rs` each include `support/process.rs` for themselves.
#![allow(clippy::duplicate_mod)]

#[path = "support/executions.rs"]
mod executions;
#[path = "support/fleet.rs"]
mod fleet;
#[path = "support/cluster.rs"]
mod harness;
#[path = "support/netns.rs"]
mod netns;
#[path = "support/spec.rs"]
mod spec;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_proto::v1::run_service_client::RunServiceClient;
use baton_proto::v1::{GetRunRequest, GetStatsRequest, RunRecord, WatchRunRequest, run_event};
use fleet::{Fleet, RedisConnection, Timing};
use harness::Records;
use harness::redis_cluster::{NodeHost, RedisCluster};
use netns::{Host, Net};
use serde_json::{Value, json};

/// Each test must be over by then.
const BUDGET: Duration = Duration::from_secs(90);
const RUNS: usize = 8;
const LEASE_MS: u64 = 2_000;
const WORKER_SILENCE_MS: u64 = 3_000;
const GRPC_PORT: u16 = 50051;
const HTTP_PORT: u16 = 9464;
const REDIS_PORT: u16 = 6379;

/// Three steps of the `slow` agent, one after the other.
fn workflow() -> Vec<u8> {
    json!({"id": "faults", "steps": [
        {"id": "a", "type": "agent", "agent": "slow", "next": "b"},
        {"id": "b", "type": "agent", "agent": "slow", "next": "c"},
        {"id": "c", "type": "agent", "agent": "slow"}
    ]})
    .to_string()
    .into_bytes()
}

fn agents(records: &Records, worker: &str) -> PathBuf {
    agents_taking(records, worker, "0.4")
}

/// Agents that take `seconds` each.
fn agents_taking(records: &Records, worker: &str, seconds: &str) -> PathBuf {
    records.agents_file(worker, &[("slow", vec!["fault-agent.sh", seconds])])
}

/// A process on a host, killed and reaped when dropped.
struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Hosts and what runs on them. Processes go before the net, so that they are dropped first.
struct Site {
    procs: Vec<Proc>,
    records: Records,
    dir: tempfile::TempDir,
    net: Net,
}

impl Site {
    fn new(name: &str) -> Site {
        let dir = tempfile::tempdir().expect("a folder for the site");
        Site {
            procs: Vec::new(),
            records: Records::new(dir.path().join("records")),
            dir,
            net: Net::new(name),
        }
    }

    fn spawn(&mut self, name: &str, host: &Host, program: &str, args: &[String]) {
        let log = self.dir.path().join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("a log file");
        let mut command = host.command(program);
        // As `harness::baton()` does: nothing from the caller's environment.
        for var in [
            "BATON_COORDINATOR",
            "BATON_TOKEN",
            "BATON_REDIS",
            "BATON_REDIS_URL",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "TRACEPARENT",
        ] {
            command.env_remove(var);
        }
        command
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("clone a log file"))
            .stderr(file);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {name}: {e}"));
        self.procs.push(Proc {
            name: name.to_owned(),
            child,
            log,
        });
    }

    fn redis(&mut self, host: &Host) -> String {
        let dir = self.dir.path().join("redis");
        std::fs::create_dir_all(&dir).unwrap();
        let args = [
            "--bind",
            &host.ip().to_string(),
            "--port",
            &REDIS_PORT.to_string(),
            "--protected-mode",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            &dir.display().to_string(),
        ]
        .map(str::to_owned);
        self.spawn("redis", host, "redis-server", &args);
        format!("redis://{}:{REDIS_PORT}/", host.ip())
    }

    fn coordinator(&mut self, id: &str, host: &Host, redis_url: &str) -> String {
        self.coordinator_with(id, host, redis_url, &[])
    }

    fn coordinator_with(
        &mut self,
        id: &str,
        host: &Host,
        redis_url: &str,
        extra: &[&str],
    ) -> String {
        let ip = host.ip();
        let mut args = [
            "coordinator",
            "--listen",
            &format!("{ip}:{GRPC_PORT}"),
            "--redis",
            redis_url,
            "--id",
            id,
            "--lease-ms",
            &LEASE_MS.to_string(),
            "--worker-silence-ms",
            &WORKER_SILENCE_MS.to_string(),
            "--metrics-listen",
            &format!("{ip}:{HTTP_PORT}"),
            // Workers on other hosts, and no principals in this test.
            "--allow-unauthenticated",
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        self.spawn(id, host, env!("CARGO_BIN_EXE_baton"), &args);
        format!("http://{ip}:{GRPC_PORT}")
    }

    fn worker(&mut self, id: &str, host: &Host, coordinators: &str) {
        let agents = agents(&self.records, id);
        let args = [
            "worker",
            "--coordinator",
            coordinators,
            "--agents",
            &agents.display().to_string(),
            "--concurrency",
            "2",
            "--id",
            id,
            "--metrics-listen",
            "127.0.0.1:0",
        ]
        .map(str::to_owned);
        self.spawn(id, host, env!("CARGO_BIN_EXE_baton"), &args);
    }

    fn logs(&self) -> String {
        self.procs
            .iter()
            .map(|p| {
                let text = std::fs::read_to_string(&p.log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(40)..].join("\n");
                format!("──── {}:\n{tail}\n", p.name)
            })
            .collect()
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("the site's logs:\n{}", self.logs());
        }
    }
}

async fn client(url: &str) -> Option<RunServiceClient<tonic::transport::Channel>> {
    let endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())
        .ok()?
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(5));
    Some(RunServiceClient::new(endpoint.connect().await.ok()?))
}

/// Waits until the coordinator at `url` answers and has `workers` workers.
async fn ready(url: &str, workers: u32) {
    let deadline = Instant::now() + harness::DEADLINE;
    loop {
        if let Some(mut client) = client(url).await
            && let Ok(stats) = client.get_stats(GetStatsRequest {}).await
            && stats.into_inner().workers >= workers
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{url} did not get {workers} workers"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn submit(url: &str) -> Vec<String> {
    let mut client = client(url).await.expect("a coordinator to submit to");
    let mut runs = Vec::new();
    for n in 0..RUNS {
        runs.push(harness::submit(&mut client, workflow(), &json!(n)).await);
    }
    runs
}

/// Watches `run_id` on any of `urls` until it finishes, reconnecting when a stream breaks (a
/// watch starts over from the run's history): every step result it was told, per step visit.
fn watch(run_id: String, urls: Vec<String>) -> tokio::task::JoinHandle<Watched> {
    tokio::spawn(async move {
        let mut watched = Watched::default();
        let deadline = Instant::now() + BUDGET;
        for url in urls.iter().cycle() {
            if Instant::now() > deadline {
                break;
            }
            let Some(mut client) = client(url).await else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let request = WatchRunRequest {
                run_id: run_id.clone(),
            };
            let Ok(stream) = client.watch_run(request).await else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let mut stream = stream.into_inner();
            while let Ok(Some(event)) = stream.message().await {
                match event.event {
                    Some(run_event::Event::StepFinished(finished)) => {
                        let data: Value = finished
                            .data
                            .as_ref()
                            .map(|d| serde_json::from_slice(&d.json).unwrap_or(Value::Null))
                            .unwrap_or(Value::Null);
                        let told = watched
                            .results
                            .entry((finished.step_id, finished.visit))
                            .or_default();
                        if !told.contains(&data) {
                            told.push(data);
                        }
                    }
                    Some(run_event::Event::RunFinished(_)) => return watched,
                    _ => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        watched
    })
}

#[derive(Debug, Default)]
struct Watched {
    /// (step, visit) -> every distinct result a watcher was told.
    results: BTreeMap<(String, u32), Vec<Value>>,
}

/// Polls until every run finished, on any of `urls`.
async fn finished(
    urls: &[String],
    runs: &[String],
    site_logs: impl Fn() -> String,
) -> Vec<RunRecord> {
    let deadline = Instant::now() + BUDGET;
    let mut done: BTreeMap<String, RunRecord> = BTreeMap::new();
    while done.len() < runs.len() {
        assert!(
            Instant::now() < deadline,
            "{} of {} runs finished within {BUDGET:?}\n{}",
            done.len(),
            runs.len(),
            site_logs()
        );
        let pending: Vec<&String> = runs.iter().filter(|r| !done.contains_key(*r)).collect();
        for run_id in pending {
            for url in urls {
                let Some(mut client) = client(url).await else {
                    continue;
                };
                let request = GetRunRequest {
                    run_id: run_id.clone(),
                };
                if let Ok(record) = client.get_run(request).await {
                    let record = record.into_inner();
                    if record.status != "running" {
                        done.insert(run_id.clone(), record);
                    }
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    runs.iter().map(|r| done.remove(r).unwrap()).collect()
}

/// Waits until every run finished and every watcher saw its run end.
async fn settle(
    urls: &[String],
    runs: &[String],
    watchers: Vec<tokio::task::JoinHandle<Watched>>,
    logs: impl Fn() -> String,
) -> (Vec<RunRecord>, Vec<Watched>) {
    let records = finished(urls, runs, logs).await;
    let watched = futures::future::join_all(watchers)
        .await
        .into_iter()
        .map(|watched| watched.expect("a watcher"))
        .collect();
    (records, watched)
}

/// What every fault test checks once its runs finished: each succeeded; its event log answers
/// each step visit once; and each result a watcher was told is the one the run kept.
async fn check(
    runs: &[String],
    records: &[RunRecord],
    watched: Vec<Watched>,
    redis: &mut impl redis::aio::ConnectionLike,
) {
    for ((run_id, record), watched) in runs.iter().zip(records).zip(watched) {
        assert_eq!(record.status, "succeeded", "{run_id}: {}", record.error);
        let context: Value =
            serde_json::from_slice(&record.context.as_ref().unwrap().json).unwrap();

        let events: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(format!("baton:run:{{{run_id}}}:events"))
            .arg(0)
            .arg(-1)
            .query_async(redis)
            .await
            .unwrap();
        let mut answered: BTreeMap<(String, u64), usize> = BTreeMap::new();
        for event in &events {
            let event: Value = serde_json::from_slice(event).unwrap();
            if let Some(task) = event.get("task") {
                let key = (
                    task["step_id"].as_str().unwrap().to_owned(),
                    task["visit"].as_u64().unwrap(),
                );
                *answered.entry(key).or_default() += 1;
            }
        }
        let once: BTreeMap<(String, u64), usize> = ["a", "b", "c"]
            .into_iter()
            .map(|step| ((step.to_owned(), 1), 1))
            .collect();
        assert_eq!(answered, once, "{run_id}: each step visit answered once");

        for ((step, visit), told) in &watched.results {
            assert_eq!(
                told.len(),
                1,
                "{run_id}: watchers were told {step}#{visit} ended in different ways: {told:?}"
            );
            assert_eq!(
                &context[step], &told[0],
                "{run_id}: {step}#{visit} kept another result than the one watchers were told"
            );
        }
    }
}

async fn single_redis(url: &str) -> RedisConnection {
    RedisConnection::Single(
        redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("the test reaches Redis"),
    )
}

/// Until `/readyz` of the coordinator on `ip` answers with `status`.
async fn readiness_becomes(ip: Ipv4Addr, status: u16, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    // reqwest is built without a crypto provider of its own; this test speaks plain HTTP.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    while Instant::now() < deadline {
        if let Ok(response) = client
            .get(format!("http://{ip}:{HTTP_PORT}/readyz"))
            .send()
            .await
            && response.status().as_u16() == status
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Waits until `records` logged `n` executions.
async fn executions(records: &Records, n: usize) {
    let deadline = Instant::now() + harness::DEADLINE;
    while executions::read(records.root()).len() < n {
        assert!(Instant::now() < deadline, "fewer than {n} executions");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_coordinator_cut_off_from_redis() {
    let mut site = Site::new("coordinator-cut");
    let net_redis = site.net.host("redis");
    let (h1, h2) = (site.net.host("c1"), site.net.host("c2"));
    let (hw1, hw2) = (site.net.host("w1"), site.net.host("w2"));
    let redis_url = site.redis(&net_redis);
    let c1 = site.coordinator("c1", &h1, &redis_url);
    let c2 = site.coordinator("c2", &h2, &redis_url);
    // Each worker knows only its own coordinator: w1 stays with c1 through the cut.
    site.worker("w1", &hw1, &c1);
    site.worker("w2", &hw2, &c2);
    ready(&c1, 1).await;
    ready(&c2, 1).await;
    let urls = vec![c1.clone(), c2.clone()];

    // c1 takes the runs and hands their first steps to w1.
    let runs = submit(&c1).await;
    let watchers: Vec<_> = runs
        .iter()
        .map(|r| watch(r.clone(), urls.clone()))
        .collect();
    executions(&site.records, 2).await;

    site.net.partition(&[&h1], &[&net_redis]);
    assert!(
        readiness_becomes(h1.ip(), 503, Duration::from_secs(10)).await,
        "c1 still says it is ready while it cannot reach Redis\n{}",
        site.logs()
    );
    // Its leases run out, c2 takes the runs over and w2 carries them on.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !executions::read(site.records.root())
        .iter()
        .any(|e| e.worker == "w2")
    {
        assert!(
            Instant::now() < deadline,
            "c2 never took over c1's runs\n{}",
            site.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(LEASE_MS)).await;
    site.net.heal();
    assert!(
        readiness_becomes(h1.ip(), 200, Duration::from_secs(10)).await,
        "c1 is not ready again after the cut healed"
    );

    let (records, watched) = settle(&urls, &runs, watchers, || site.logs()).await;
    check(
        &runs,
        &records,
        watched,
        &mut single_redis(&redis_url).await,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_cut_off_from_its_coordinator() {
    let mut site = Site::new("worker-cut");
    let net_redis = site.net.host("redis");
    let h1 = site.net.host("c1");
    let (hw1, hw2) = (site.net.host("w1"), site.net.host("w2"));
    let redis_url = site.redis(&net_redis);
    let c1 = site.coordinator("c1", &h1, &redis_url);
    site.worker("w1", &hw1, &c1);
    ready(&c1, 1).await;
    // Only w1 at first, so that it holds tasks when it is cut off.
    let runs = submit(&c1).await;
    let urls = vec![c1.clone()];
    let watchers: Vec<_> = runs
        .iter()
        .map(|r| watch(r.clone(), urls.clone()))
        .collect();
    executions(&site.records, 2).await;
    site.net.partition(&[&hw1], &[&h1]);
    site.worker("w2", &hw2, &c1);

    // w1 is taken for dead after its silence, and w2 runs its tasks again.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !executions::read(site.records.root())
        .iter()
        .any(|e| e.worker == "w2" && e.attempt >= 2)
    {
        assert!(
            Instant::now() < deadline,
            "w1's tasks never went to w2\n{}",
            site.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    site.net.heal();

    let (records, watched) = settle(&urls, &runs, watchers, || site.logs()).await;
    check(
        &runs,
        &records,
        watched,
        &mut single_redis(&redis_url).await,
    )
    .await;

    // w1 finished what it held during the cut; after it, those answers were refused.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut client = client(&c1).await.unwrap();
        let stats = client
            .get_stats(GetStatsRequest {})
            .await
            .unwrap()
            .into_inner();
        if stats.fenced_results >= 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no late answer of w1 was refused: {stats:?}\n{}",
            site.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_master_killed() {
    let cluster = Arc::new(
        tokio::task::spawn_blocking(RedisCluster::start)
            .await
            .expect("start a Redis Cluster"),
    );
    let timing = Timing {
        lease_ms: LEASE_MS,
        worker_silence_ms: WORKER_SILENCE_MS,
    };
    let mut fleet =
        Fleet::start_on_cluster(cluster.clone(), 2, timing, &["--redis-wait-replicas", "1"]).await;
    let records = Records::new(fleet.dir().join("records"));
    for id in ["w1", "w2"] {
        let file = agents(&records, id);
        fleet.start_worker(id, &file, 2);
    }
    fleet.wait_for_workers(2).await;
    let urls = vec![fleet.url(0), fleet.url(1)];
    let runs = submit(&urls[0]).await;
    let watchers: Vec<_> = runs
        .iter()
        .map(|r| watch(r.clone(), urls.clone()))
        .collect();
    executions(&records, 2).await;

    // The master of the most runs dies with transitions in flight; its replica takes over.
    let mut per_master: BTreeMap<u16, usize> = BTreeMap::new();
    for run_id in &runs {
        *per_master
            .entry(cluster.master_of_key(&format!("baton:run:{{{run_id}}}")))
            .or_default() += 1;
    }
    let (&victim, _) = per_master.iter().max_by_key(|(_, n)| **n).unwrap();
    cluster.kill_node(victim);
    let promoted = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.wait_for_failover(victim))
            .await
            .unwrap()
    };
    assert_ne!(promoted, victim);
    // Back as a replica of the new master: transitions there can reach a replica again.
    {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.start_node_again(victim))
            .await
            .unwrap();
    }

    let (finished, watched) = settle(&urls, &runs, watchers, || {
        format!("{}\n{}", fleet.logs(), cluster.logs())
    })
    .await;
    check(
        &runs,
        &finished,
        watched,
        &mut fleet.redis_connection().await,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_master_cut_off_from_its_cluster() {
    let mut site = Site::new("master-cut");
    let redis_hosts: Vec<Host> = (1..=6).map(|n| site.net.host(&format!("r{n}"))).collect();
    let (h1, hw1, hw2) = (
        site.net.host("c1"),
        site.net.host("w1"),
        site.net.host("w2"),
    );
    let node_hosts = redis_hosts
        .iter()
        .map(|host| {
            let host = host.clone();
            NodeHost::new(host.ip(), move |program| host.command(program))
        })
        .collect();
    // Declared after the site: its servers stop before the hosts go.
    let cluster = Arc::new(
        tokio::task::spawn_blocking(move || RedisCluster::start_on(node_hosts, 1, 1000))
            .await
            .expect("start a Redis Cluster on six hosts"),
    );
    let c1 = site.coordinator_with(
        "c1",
        &h1,
        &cluster.comma_urls(),
        &["--redis-wait-replicas", "1"],
    );
    site.worker("w1", &hw1, &c1);
    site.worker("w2", &hw2, &c1);
    ready(&c1, 2).await;
    let urls = vec![c1.clone()];
    let runs = submit(&c1).await;
    let watchers: Vec<_> = runs
        .iter()
        .map(|r| watch(r.clone(), urls.clone()))
        .collect();
    executions(&site.records, 2).await;

    // The master of the most runs loses the rest of the cluster, not the coordinator: for a
    // node timeout it still takes writes, which its replica never gets.
    let mut per_master: BTreeMap<u16, usize> = BTreeMap::new();
    for run_id in &runs {
        *per_master
            .entry(cluster.master_of_key(&format!("baton:run:{{{run_id}}}")))
            .or_default() += 1;
    }
    let (&cut, _) = per_master.iter().max_by_key(|(_, n)| **n).unwrap();
    let cut_ip = cluster.node_ip(cut);
    let cut_host = redis_hosts.iter().find(|h| h.ip() == cut_ip).unwrap();
    let others: Vec<&Host> = redis_hosts.iter().filter(|h| h.ip() != cut_ip).collect();
    site.net.partition(&[cut_host], &others);
    let promoted = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.wait_for_failover_of(cut))
            .await
            .unwrap()
    };
    assert_ne!(promoted, cut);
    // The majority carries on without it for a while; then the cut heals and the old master
    // comes back as a replica, dropping whatever it took alone.
    tokio::time::sleep(Duration::from_secs(2)).await;
    site.net.heal();
    {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.wait_for_rejoin(cut))
            .await
            .unwrap();
    }

    let (records, watched) = settle(&urls, &runs, watchers, || {
        format!("{}\n{}", site.logs(), cluster.logs())
    })
    .await;
    let mut redis = RedisConnection::Cluster(
        redis::cluster::ClusterClient::new(cluster.urls())
            .unwrap()
            .get_async_connection()
            .await
            .unwrap(),
    );
    check(&runs, &records, watched, &mut redis).await;
}

/// Not a fault, but what operators do to a live cluster: `redis-cli --cluster reshard` moves
/// every slot of the master that holds the most runs to another master while those runs are
/// in flight. Their keys move under the coordinator (`MOVED`, `ASK`, `TRYAGAIN`), and no step
/// may fail for it. The runs are submitted until their keys are on every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reshard_mid_run() {
    let cluster = Arc::new(
        tokio::task::spawn_blocking(RedisCluster::start)
            .await
            .expect("start a Redis Cluster"),
    );
    let timing = Timing {
        lease_ms: LEASE_MS,
        worker_silence_ms: WORKER_SILENCE_MS,
    };
    let mut fleet = Fleet::start_on_cluster(cluster.clone(), 1, timing, &[]).await;
    let records = Records::new(fleet.dir().join("records"));
    // The agents answer only once the reshard is over, so that the runs are in flight while
    // their keys move, however long the reshard takes on a loaded machine (runs of agents that
    // merely took a second each once all finished before it did, in CI).
    let hold = records.root().join("hold");
    std::fs::write(&hold, "").unwrap();
    for id in ["w1", "w2"] {
        let file = agents(&records, id);
        fleet.start_worker(id, &file, 2);
    }
    fleet.wait_for_workers(2).await;
    let urls = vec![fleet.url(0)];
    let master_of = |run_id: &str| cluster.master_of_key(&format!("baton:run:{{{run_id}}}"));

    let mut client = client(&urls[0]).await.unwrap();
    let mut runs: Vec<String> = Vec::new();
    let mut per_master: BTreeMap<u16, usize> = BTreeMap::new();
    while runs.len() < RUNS || per_master.len() < 3 {
        assert!(runs.len() < 40, "40 runs and still not on every master");
        let run_id = harness::submit(&mut client, workflow(), &json!(runs.len())).await;
        *per_master.entry(master_of(&run_id)).or_default() += 1;
        runs.push(run_id);
    }
    let watchers: Vec<_> = runs
        .iter()
        .map(|r| watch(r.clone(), urls.clone()))
        .collect();
    executions(&records, 2).await;

    let (&from, _) = per_master.iter().max_by_key(|(_, n)| **n).unwrap();
    let to = *per_master.keys().find(|port| **port != from).unwrap();
    let moving: Vec<String> = runs
        .iter()
        .filter(|r| master_of(r) == from)
        .cloned()
        .collect();
    let unfinished = |run_id: &String| {
        executions::read(records.root())
            .iter()
            .filter(|e| e.run_id == *run_id)
            .count()
            < 3
    };
    assert!(
        moving.iter().any(unfinished),
        "every run on the master to empty finished before the reshard began"
    );
    let slots: u16 = cluster
        .masters()
        .iter()
        .find(|m| m.port == from)
        .map(|m| {
            m.slots
                .iter()
                .map(|range| range.end() - range.start() + 1)
                .sum()
        })
        .unwrap();
    {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.reshard(slots, from, to))
            .await
            .unwrap();
    }
    for run_id in &moving {
        assert_eq!(master_of(run_id), to, "{run_id} did not move");
    }
    assert!(
        moving.iter().any(unfinished),
        "every moved run finished during the reshard: none of them moved mid-run"
    );
    std::fs::remove_file(&hold).unwrap();

    let (finished, watched) = settle(&urls, &runs, watchers, || {
        format!("{}\n{}", fleet.logs(), cluster.logs())
    })
    .await;
    check(
        &runs,
        &finished,
        watched,
        &mut fleet.redis_connection().await,
    )
    .await;
    // No step failed on the way: each ran once, at its first attempt.
    for record in &finished {
        for step in &record.steps {
            assert_eq!(
                (step.status.as_str(), step.attempts),
                ("succeeded", 1),
                "{}: {step:?}",
                record.run_id
            );
        }
    }
}
