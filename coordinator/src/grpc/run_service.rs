//! `baton.v1.RunService`: what clients ask of runs.
//!
//! Each call converts its request ([`super::requests`]), calls the service and converts the
//! reply back. The calls that check more than a field or two are also functions of their own,
//! so that in-process tests go through the same checks a client's request does.

use std::pin::Pin;

use baton_proto::v1;
use baton_proto::v1::run_service_server::RunService;
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::requests;
use crate::auth::Caller;
use crate::error::Error;
use crate::service::{Coordinator, Submission, Submitter};
use crate::store::Store;

pub struct Runs<S: Store> {
    coordinator: Coordinator<S>,
    stop: tokio::sync::watch::Receiver<bool>,
}

impl<S: Store> Runs<S> {
    pub fn new(coordinator: Coordinator<S>, stop: tokio::sync::watch::Receiver<bool>) -> Self {
        Self { coordinator, stop }
    }
}

/// `SubmitRun`, in the caller's trace: `traceparent` (W3C, may be empty) is the parent of the
/// run's `SubmitRun` span, whose context is stored with the run.
pub async fn submit<S: Store>(
    coordinator: &Coordinator<S>,
    mut request: v1::SubmitRunRequest,
    traceparent: &str,
    caller: &Caller,
) -> Result<v1::SubmitRunResponse, Error> {
    let input = requests::submitted_input(&mut request)?;
    let span = coordinator.traces().submit(traceparent, caller.name());
    let run_traceparent = span.run_traceparent.clone();
    let submitted =
        match requests::submission(request, input, run_traceparent, coordinator.config()) {
            Ok(submission) => {
                let principal = caller.0.as_ref().map(|principal| Submitter {
                    name: principal.name.clone(),
                    max_running_runs: principal.max_running_runs,
                });
                coordinator
                    .submit(Submission {
                        principal,
                        ..submission
                    })
                    .await
            }
            Err(refused) => Err(refused),
        };
    span.end(match &submitted {
        Ok(run) => Ok((&run.run_id, run.existing, &run.workflow_id)),
        Err(error) => Err(error.to_string()),
    });
    submitted.map(Into::into)
}

/// `QueryDecisions`.
pub async fn query_decisions<S: Store>(
    coordinator: &Coordinator<S>,
    request: v1::QueryDecisionsRequest,
) -> Result<v1::QueryDecisionsResponse, Error> {
    let query = requests::decision_query(request, coordinator.config())?;
    Ok(coordinator.query_decisions(query).await?.into())
}

type EventStream = Pin<Box<dyn Stream<Item = Result<v1::RunEvent, Status>> + Send>>;

#[tonic::async_trait]
impl<S: Store> RunService for Runs<S> {
    async fn submit_run(
        &self,
        request: Request<v1::SubmitRunRequest>,
    ) -> Result<Response<v1::SubmitRunResponse>, Status> {
        // W3C trace context travels as gRPC metadata; a malformed one is ignored, as the
        // standard asks, rather than refusing the run.
        let traceparent = request
            .metadata()
            .get("traceparent")
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let caller = Caller::of(&request);
        let submitted = submit(
            &self.coordinator,
            request.into_inner(),
            &traceparent,
            &caller,
        )
        .await?;
        Ok(Response::new(submitted))
    }

    async fn get_run(
        &self,
        request: Request<v1::GetRunRequest>,
    ) -> Result<Response<v1::RunRecord>, Status> {
        let request = request.into_inner();
        let run_id = requests::run_id("run_id", &request.run_id)?;
        let record = self.coordinator.record(run_id).await?;
        Ok(Response::new(record.into()))
    }

    async fn list_runs(
        &self,
        request: Request<v1::ListRunsRequest>,
    ) -> Result<Response<v1::ListRunsResponse>, Status> {
        let query = requests::run_query(request.into_inner(), self.coordinator.config())?;
        let page = self.coordinator.list(query).await?;
        Ok(Response::new(page.into()))
    }

    type WatchRunStream = EventStream;

    async fn watch_run(
        &self,
        request: Request<v1::WatchRunRequest>,
    ) -> Result<Response<Self::WatchRunStream>, Status> {
        let request = request.into_inner();
        let run_id = requests::run_id("run_id", &request.run_id)?;
        let events = self.coordinator.watch(run_id).await?;
        let events = events
            .map(|event| event.map(Into::into).map_err(Status::from))
            .take_until(super::stopped(self.stop.clone()));
        Ok(Response::new(Box::pin(events)))
    }

    async fn cancel_run(
        &self,
        request: Request<v1::CancelRunRequest>,
    ) -> Result<Response<v1::RunRecord>, Status> {
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let run_id = requests::run_id("run_id", &request.run_id)?;
        let reason =
            requests::cancel_reason(&request.reason, caller.name(), self.coordinator.config())?;
        let record = self
            .coordinator
            .cancel(run_id, &reason, requests::requester(&caller).as_ref())
            .await?;
        Ok(Response::new(record.into()))
    }

    async fn retry_run(
        &self,
        request: Request<v1::RetryRunRequest>,
    ) -> Result<Response<v1::RunRecord>, Status> {
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let run_id = requests::run_id("run_id", &request.run_id)?;
        let record = self
            .coordinator
            .retry(run_id, requests::requester(&caller).as_ref())
            .await?;
        Ok(Response::new(record.into()))
    }

    async fn get_stats(
        &self,
        _: Request<v1::GetStatsRequest>,
    ) -> Result<Response<v1::Stats>, Status> {
        Ok(Response::new(self.coordinator.stats().into()))
    }

    async fn query_decisions(
        &self,
        request: Request<v1::QueryDecisionsRequest>,
    ) -> Result<Response<v1::QueryDecisionsResponse>, Status> {
        let found = query_decisions(&self.coordinator, request.into_inner()).await?;
        Ok(Response::new(found))
    }

    async fn verify_run(
        &self,
        request: Request<v1::VerifyRunRequest>,
    ) -> Result<Response<v1::VerifyRunResponse>, Status> {
        let request = request.into_inner();
        let run_id = requests::run_id("run_id", &request.run_id)?;
        let verified = self.coordinator.verify(run_id).await?;
        Ok(Response::new(verified.into()))
    }

    async fn decide_approval(
        &self,
        request: Request<v1::DecideApprovalRequest>,
    ) -> Result<Response<v1::RunRecord>, Status> {
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let config = self.coordinator.config();
        let run_id = requests::run_id("run_id", &request.run_id)?;
        let step_id = requests::step_id("step_id", &request.step_id, config)?;
        let decision = requests::decision(&request, caller.name(), config)?;
        let record = self.coordinator.decide(run_id, step_id, decision).await?;
        Ok(Response::new(record.into()))
    }
}
