//! A client played by a test, in process: its requests go through the gRPC edge's conversions
//! and checks (sizes, digests, depth) before they reach the coordinator, as a real client's do.

#![allow(dead_code)]

use baton_coordinator::grpc::run_service;
use baton_coordinator::store::Store;
use baton_coordinator::{Coordinator, Error};
use baton_proto::Json;
use baton_proto::v1::{SubmitRunRequest, SubmitRunResponse};

/// Submits `workflow` with `input`; returns the run's id.
pub async fn submit<S: Store>(
    coordinator: &Coordinator<S>,
    workflow: &[u8],
    input: &Json,
) -> Result<String, Error> {
    Ok(submit_once(coordinator, workflow, input, None)
        .await?
        .run_id)
}

/// Submits with an idempotency key.
pub async fn submit_once<S: Store>(
    coordinator: &Coordinator<S>,
    workflow: &[u8],
    input: &Json,
    idempotency_key: Option<&str>,
) -> Result<SubmitRunResponse, Error> {
    let request = SubmitRunRequest {
        workflow: workflow.to_vec(),
        input: Some(input.clone()),
        idempotency_key: idempotency_key.unwrap_or_default().to_owned(),
    };
    run_service::submit(coordinator, request, "", &Default::default()).await
}
