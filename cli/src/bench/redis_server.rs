//! The Redis a benchmark runs against: how much memory it uses, and emptying it between
//! repetitions.

use anyhow::Context as _;

async fn connection(url: &str) -> anyhow::Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url)?;
    Ok(client.get_multiplexed_async_connection().await?)
}

/// Redis's `used_memory`, in bytes.
pub async fn used_memory(url: &str) -> anyhow::Result<u64> {
    let mut connection = connection(url).await?;
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut connection)
        .await?;
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|value| value.trim().parse().ok())
        .context("INFO memory has no used_memory")
}

/// Empties the database, so that each repetition of a workload starts from nothing.
pub async fn flush(url: &str) -> anyhow::Result<()> {
    let mut connection = connection(url).await?;
    let () = redis::cmd("FLUSHDB").query_async(&mut connection).await?;
    Ok(())
}

/// What a Redis server has done so far: commands run (scripts' own commands included, as
/// `INFO commandstats` counts them), bytes in and out over the network, and its CPU time.
#[derive(Debug, Clone, Copy, Default)]
pub struct Work {
    pub commands: u64,
    pub net_bytes: u64,
    pub cpu_s: f64,
}

impl Work {
    /// What was done between `before` and `self`.
    pub fn since(self, before: Work) -> Work {
        Work {
            commands: self.commands.saturating_sub(before.commands),
            net_bytes: self.net_bytes.saturating_sub(before.net_bytes),
            cpu_s: (self.cpu_s - before.cpu_s).max(0.0),
        }
    }
}

/// The server's [`Work`] so far, from `INFO commandstats`, `INFO stats` and `INFO cpu`.
pub async fn work(url: &str) -> anyhow::Result<Work> {
    let mut connection = connection(url).await?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .arg("stats")
        .arg("cpu")
        .query_async(&mut connection)
        .await?;
    let mut work = Work::default();
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
            work.net_bytes += bytes.trim().parse::<u64>().unwrap_or_default();
        } else if let Some(seconds) = line
            .strip_prefix("used_cpu_sys:")
            .or_else(|| line.strip_prefix("used_cpu_user:"))
        {
            work.cpu_s += seconds.trim().parse::<f64>().unwrap_or_default();
        }
    }
    Ok(work)
}
