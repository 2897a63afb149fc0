//! `baton probe URL`: a health check for images with no shell and no curl (Docker and compose
//! `healthcheck`, or an exec probe): GET the URL, exit 0 on a 2xx answer.

use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// What to GET, e.g. http://127.0.0.1:9464/readyz.
    url: String,
    /// How long to wait for the answer, in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    timeout_ms: u64,
}

/// Exit 0 when the URL answers 2xx; otherwise 1, saying what it answered (or why it did not).
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(args.timeout_ms))
        .build()?;
    match client.get(&args.url).send().await {
        Ok(response) if response.status().is_success() => Ok(ExitCode::SUCCESS),
        Ok(response) => {
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            eprintln!("baton probe: {}: {status}: {}", args.url, body.trim());
            Ok(ExitCode::FAILURE)
        }
        Err(error) => {
            eprintln!("baton probe: {}: {error}", args.url);
            Ok(ExitCode::FAILURE)
        }
    }
}
