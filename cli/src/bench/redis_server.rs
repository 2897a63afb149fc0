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
