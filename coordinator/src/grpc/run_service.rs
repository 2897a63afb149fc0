//! `baton.v1.RunService`.

use std::pin::Pin;

use baton_core::Decision;
use baton_proto::v1::run_event;
use baton_proto::v1::run_service_server::RunService;
use baton_proto::v1::{
    CancelRunRequest, DecideApprovalRequest, GetRunRequest, GetStatsRequest, ListRunsRequest,
    ListRunsResponse, QueryDecisionsRequest, QueryDecisionsResponse, RunEvent, RunRecord, Stats,
    SubmitRunRequest, SubmitRunResponse, VerifyRunRequest, VerifyRunResponse, WatchRunRequest,
};
use futures::Stream;
use tokio::sync::broadcast::error::RecvError;
use tonic::{Request, Response, Status};

use crate::service::Coordinator;
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

type EventStream = Pin<Box<dyn Stream<Item = Result<RunEvent, Status>> + Send>>;

#[tonic::async_trait]
impl<S: Store> RunService for Runs<S> {
    async fn submit_run(
        &self,
        request: Request<SubmitRunRequest>,
    ) -> Result<Response<SubmitRunResponse>, Status> {
        let request = request.into_inner();
        let input = request
            .input
            .ok_or_else(|| Status::invalid_argument("input: a run needs an input (JSON)"))?;
        let key = (!request.idempotency_key.is_empty()).then_some(request.idempotency_key.as_str());
        let submitted = self
            .coordinator
            .submit_once(&request.workflow, &input, key)
            .await?;
        Ok(Response::new(SubmitRunResponse {
            run_id: submitted.run_id,
            existing: submitted.existing,
        }))
    }

    async fn get_run(
        &self,
        request: Request<GetRunRequest>,
    ) -> Result<Response<RunRecord>, Status> {
        let record = self
            .coordinator
            .record(&request.into_inner().run_id)
            .await?;
        Ok(Response::new(record))
    }

    async fn list_runs(
        &self,
        request: Request<ListRunsRequest>,
    ) -> Result<Response<ListRunsResponse>, Status> {
        let runs = self
            .coordinator
            .list(request.into_inner().limit as usize)
            .await?;
        Ok(Response::new(ListRunsResponse { runs }))
    }

    type WatchRunStream = EventStream;

    async fn watch_run(
        &self,
        request: Request<WatchRunRequest>,
    ) -> Result<Response<Self::WatchRunStream>, Status> {
        let (past, future) = self.coordinator.watch(&request.into_inner().run_id).await?;
        let stream = async_stream(past, future);
        let stream = futures::StreamExt::take_until(stream, super::stopped(self.stop.clone()));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn cancel_run(
        &self,
        request: Request<CancelRunRequest>,
    ) -> Result<Response<RunRecord>, Status> {
        let request = request.into_inner();
        let record = self
            .coordinator
            .cancel(&request.run_id, &request.reason)
            .await?;
        Ok(Response::new(record))
    }

    async fn get_stats(&self, _: Request<GetStatsRequest>) -> Result<Response<Stats>, Status> {
        Ok(Response::new(self.coordinator.stats()))
    }

    async fn query_decisions(
        &self,
        request: Request<QueryDecisionsRequest>,
    ) -> Result<Response<QueryDecisionsResponse>, Status> {
        let response = self
            .coordinator
            .query_decisions(request.into_inner())
            .await?;
        Ok(Response::new(response))
    }

    async fn verify_run(
        &self,
        request: Request<VerifyRunRequest>,
    ) -> Result<Response<VerifyRunResponse>, Status> {
        let response = self
            .coordinator
            .verify(&request.into_inner().run_id)
            .await?;
        Ok(Response::new(response))
    }

    async fn decide_approval(
        &self,
        request: Request<DecideApprovalRequest>,
    ) -> Result<Response<RunRecord>, Status> {
        let request = request.into_inner();
        let decision = Decision {
            approved: request.approved,
            comment: (!request.comment.is_empty()).then_some(request.comment),
            approver: (!request.approver.is_empty()).then_some(request.approver),
        };
        let record = self
            .coordinator
            .decide(&request.run_id, &request.step_id, decision)
            .await?;
        Ok(Response::new(record))
    }
}

/// The past events, then live ones until the run finishes.
fn async_stream(
    past: Vec<RunEvent>,
    future: Option<tokio::sync::broadcast::Receiver<RunEvent>>,
) -> impl Stream<Item = Result<RunEvent, Status>> + Send {
    let past = futures::stream::iter(past.into_iter().map(Ok));
    let live = futures::stream::unfold(future, |receiver| async move {
        let mut receiver = receiver?;
        match receiver.recv().await {
            Ok(event) => {
                let last = matches!(event.event, Some(run_event::Event::RunFinished(_)));
                Some((Ok(event), if last { None } else { Some(receiver) }))
            }
            Err(RecvError::Lagged(_)) => Some((
                Err(Status::aborted(
                    "the watcher fell behind the run; watch it again to catch up",
                )),
                None,
            )),
            Err(RecvError::Closed) => None,
        }
    });
    futures::StreamExt::chain(past, live)
}
