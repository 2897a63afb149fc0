//! The processes a benchmark runs against: Redis, a coordinator (two for the streaming
//! workload, whose watcher reads through the second), workers.

use std::net::TcpListener;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use baton_proto::connection::ClientSecurity;
use tokio::process::{Child, Command};

use super::secure::Secure;

pub struct Cluster {
    pub redis_url: String,
    pub coordinator_url: String,
    /// How the bench's clients reach the coordinators (TLS and a token with `--secure`).
    pub security: ClientSecurity,
    _secure: Option<Secure>,
    /// The process id of the coordinator the workers are connected to.
    pub coordinator_pid: Option<u32>,
    /// A second coordinator no worker is connected to, and its process id, when asked for.
    pub second_coordinator: Option<(String, Option<u32>)>,
    /// The workers' process ids.
    pub worker_pids: Vec<u32>,
    /// Killed on drop (kill_on_drop), Redis last.
    children: Vec<Child>,
    _redis_dir: Option<tempfile::TempDir>,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
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
    /// Starts the processes: `redis-server` unless `redis` names one, a coordinator (and a
    /// second one, with `second_coordinator`), and `workers` workers running `concurrency`
    /// tasks each, whose `blob64k` agent returns `blob_bytes` bytes, serving the agents of
    /// `agents_file` too when given.
    pub async fn start(
        redis: Option<&str>,
        workers: usize,
        concurrency: usize,
        blob_bytes: usize,
        agents_file: Option<&std::path::Path>,
        second_coordinator: bool,
        secure: bool,
    ) -> anyhow::Result<Self> {
        let me = std::env::current_exe().context("cannot find the baton binary")?;
        let secure = secure.then(Secure::new).transpose()?;
        let security = secure.as_ref().map(Secure::client).unwrap_or_default();
        let mut children = Vec::new();
        let mut redis_dir = None;
        let redis_url = match redis {
            Some(url) => url.to_owned(),
            None => {
                let dir = tempfile::tempdir()?;
                let port = free_port()?;
                let child = Command::new("redis-server")
                    .args([
                        "--port",
                        &port.to_string(),
                        "--bind",
                        "127.0.0.1",
                        "--save",
                        "",
                    ])
                    .args(["--appendonly", "no", "--dir"])
                    .arg(dir.path())
                    .stdout(Stdio::null())
                    .kill_on_drop(true)
                    .spawn()
                    .context(
                        "cannot start redis-server (install it, e.g. apt-get install redis-server)",
                    )?;
                children.push(child);
                redis_dir = Some(dir);
                let url = format!("redis://127.0.0.1:{port}");
                let probe = url.clone();
                wait_for("redis-server", Duration::from_secs(10), || {
                    let probe = probe.clone();
                    async move { super::redis_server::used_memory(&probe).await.is_ok() }
                })
                .await?;
                url
            }
        };
        let (coordinator_url, coordinator) =
            start_coordinator(&me, &redis_url, secure.as_ref()).await?;
        let coordinator_pid = coordinator.id();
        children.push(coordinator);
        let second_coordinator = if second_coordinator {
            let (url, child) = start_coordinator(&me, &redis_url, secure.as_ref()).await?;
            let pid = child.id();
            children.push(child);
            Some((url, pid))
        } else {
            None
        };
        let mut worker_pids = Vec::new();
        for n in 0..workers {
            let mut worker = Command::new(&me);
            worker.arg("worker");
            if let Some(path) = agents_file {
                worker.arg("--agents").arg(path);
            }
            children.push(
                worker
                    .args(["--bench-agents", "--coordinator", &coordinator_url])
                    .args([
                        "--concurrency",
                        &concurrency.to_string(),
                        "--id",
                        &format!("bench-{n}"),
                        "--bench-blob-bytes",
                        &blob_bytes.to_string(),
                        "--no-metrics",
                    ])
                    .env("RUST_LOG", "warn")
                    .envs(secure.iter().flat_map(Secure::worker_env))
                    .kill_on_drop(true)
                    .spawn()?,
            );
            worker_pids.extend(children.last().and_then(Child::id));
        }
        let mut client = crate::client::connect_with(&coordinator_url, &security).await?;
        wait_for("the workers", Duration::from_secs(20), || {
            let mut client = client.clone();
            async move {
                client
                    .get_stats(baton_proto::v1::GetStatsRequest {})
                    .await
                    .is_ok_and(|stats| stats.into_inner().workers as usize == workers)
            }
        })
        .await?;
        let _ = &mut client;
        // Redis last: the coordinator should not outlive its store in the logs.
        children.reverse();
        Ok(Self {
            redis_url,
            coordinator_url,
            security,
            _secure: secure,
            coordinator_pid,
            second_coordinator,
            worker_pids,
            children,
            _redis_dir: redis_dir,
        })
    }
}

/// Starts a coordinator on a free port against `redis_url` and waits until it answers.
async fn start_coordinator(
    me: &std::path::Path,
    redis_url: &str,
    secure: Option<&Secure>,
) -> anyhow::Result<(String, Child)> {
    let port = free_port()?;
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
            "--no-metrics",
        ])
        .args(secure.map(Secure::coordinator_args).unwrap_or_default())
        // From the environment, so that a password in the URL stays out of `ps`.
        .env("BATON_REDIS_URL", redis_url)
        .env("RUST_LOG", "warn")
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

impl Cluster {
    /// A client of the coordinator at `url`, one of this cluster's.
    pub async fn client_of(&self, url: &str) -> anyhow::Result<crate::client::Client> {
        crate::client::connect_with(url, &self.security).await
    }

    /// A client of the coordinator the workers are connected to.
    pub async fn client(&self) -> anyhow::Result<crate::client::Client> {
        self.client_of(&self.coordinator_url).await
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
