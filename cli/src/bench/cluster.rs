//! The processes a benchmark runs against: Redis, a coordinator, workers.

use std::net::TcpListener;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tokio::process::{Child, Command};

pub struct Cluster {
    pub redis_url: String,
    pub coordinator_url: String,
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
    pub async fn start(
        redis: Option<&str>,
        workers: usize,
        concurrency: usize,
        scale: f64,
    ) -> anyhow::Result<Self> {
        let me = std::env::current_exe().context("cannot find the baton binary")?;
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
                    async move { super::workloads::redis_used_memory(&probe).await.is_ok() }
                })
                .await?;
                url
            }
        };
        let port = free_port()?;
        let coordinator_url = format!("http://127.0.0.1:{port}");
        children.push(
            Command::new(&me)
                .args([
                    "coordinator",
                    "--listen",
                    &format!("127.0.0.1:{port}"),
                    "--no-metrics",
                    "--redis",
                    &redis_url,
                ])
                .env("RUST_LOG", "warn")
                .kill_on_drop(true)
                .spawn()?,
        );
        let url = coordinator_url.clone();
        wait_for("the coordinator", Duration::from_secs(20), || {
            let url = url.clone();
            async move { crate::client::connect(&url).await.is_ok() }
        })
        .await?;
        for n in 0..workers {
            children.push(
                Command::new(&me)
                    .args([
                        "worker",
                        "--bench-agents",
                        "--coordinator",
                        &coordinator_url,
                    ])
                    .args([
                        "--concurrency",
                        &concurrency.to_string(),
                        "--id",
                        &format!("bench-{n}"),
                        "--bench-blob-bytes",
                        &super::workloads::scaled(64 * 1024, scale).to_string(),
                        "--no-metrics",
                    ])
                    .env("RUST_LOG", "warn")
                    .kill_on_drop(true)
                    .spawn()?,
            );
        }
        let mut client = crate::client::connect(&coordinator_url).await?;
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
            children,
            _redis_dir: redis_dir,
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.start_kill();
        }
    }
}
