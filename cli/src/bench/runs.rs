//! What every workload does with its runs: submit one, watch it, check it succeeded; and the
//! sizes `--scale` shrinks.

use anyhow::Context as _;
use baton_proto::Json;
use baton_proto::v1::{RunEvent, RunFinished, SubmitRunRequest, WatchRunRequest};
use serde_json::Value;
use tonic::Streaming;

/// `n` times `--scale`, at least 1.
pub(super) fn scaled(n: usize, scale: f64) -> usize {
    ((n as f64 * scale).round() as usize).max(1)
}

/// Submits a run; its id.
pub(super) async fn submit(
    client: &mut crate::client::Client,
    workflow: Vec<u8>,
    input: &Value,
) -> anyhow::Result<String> {
    let request = SubmitRunRequest {
        workflow,
        input: Some(Json::new(serde_json::to_vec(input)?)),
        idempotency_key: String::new(),
    };
    Ok(client.submit_run(request).await?.into_inner().run_id)
}

/// A run's events, from what has happened so far to its end.
pub(super) async fn watch(
    client: &mut crate::client::Client,
    run_id: &str,
) -> anyhow::Result<Streaming<RunEvent>> {
    let request = WatchRunRequest {
        run_id: run_id.to_owned(),
    };
    Ok(client.watch_run(request).await?.into_inner())
}

/// Fails unless the run ended in success, naming its status and error.
pub(super) fn succeeded(run_id: &str, finished: RunFinished) -> anyhow::Result<()> {
    let record = finished.record.context("no final record")?;
    anyhow::ensure!(
        record.status == "succeeded",
        "run {run_id} {}: {}",
        record.status,
        record.error
    );
    Ok(())
}
