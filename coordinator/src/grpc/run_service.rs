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
        // W3C trace context travels as gRPC metadata; a malformed one is ignored, as the
        // standard asks, rather than refusing the run.
        let traceparent = request
            .metadata()
            .get("traceparent")
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let request = request.into_inner();
        let input = request
            .input
            .ok_or_else(|| Status::invalid_argument("input: a run needs an input (JSON)"))?;
        let key = (!request.idempotency_key.is_empty()).then_some(request.idempotency_key.as_str());
        let submitted = self
            .coordinator
            .submit_traced(&request.workflow, &input, key, &traceparent)
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
        let run_id = request.into_inner().run_id;
        let (past, future) = self.coordinator.watch(&run_id).await?;
        let stream = watch_stream(self.coordinator.clone(), run_id, past, future);
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
/// How long a watch waits for this coordinator's own events before it asks the store whether
/// another coordinator moved the run on.
const CATCH_UP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// A watch: what happened so far, then this coordinator's events as they come, and, whenever
/// it hears nothing for a second, what the store says happened meanwhile (another coordinator
/// may be the one moving the run on). Events are told once each.
fn watch_stream<S: Store>(
    coordinator: Coordinator<S>,
    run_id: String,
    past: Vec<RunEvent>,
    future: Option<tokio::sync::broadcast::Receiver<RunEvent>>,
) -> impl Stream<Item = Result<RunEvent, Status>> + Send {
    let watch = Watch {
        coordinator,
        run_id,
        pending: past.into(),
        told: std::collections::HashSet::new(),
        settled: 0,
        // Set by the RunFinished event (among `past` for a run already over).
        done: false,
        receiver: future,
    };
    futures::stream::unfold(watch, |mut watch| async move {
        loop {
            if let Some(event) = watch.pending.pop_front() {
                if !watch.tell(&event) {
                    continue;
                }
                return Some((Ok(event), watch));
            }
            if watch.done {
                return None;
            }
            let heard = match watch.receiver.as_mut() {
                Some(receiver) => tokio::time::timeout(CATCH_UP_EVERY, receiver.recv())
                    .await
                    .ok(),
                None => {
                    tokio::time::sleep(CATCH_UP_EVERY).await;
                    None
                }
            };
            match heard {
                Some(Ok(event)) => watch.pending.push_back(event),
                Some(Err(RecvError::Lagged(_))) => {
                    watch.done = true;
                    return Some((
                        Err(Status::aborted(
                            "the watcher fell behind the run; watch it again to catch up",
                        )),
                        watch,
                    ));
                }
                // Closed: this coordinator will tell nothing more; the store still can.
                Some(Err(RecvError::Closed)) => watch.receiver = None,
                // Nothing heard for a while: ask the store.
                None => match watch
                    .coordinator
                    .catch_up(&watch.run_id, watch.settled)
                    .await
                {
                    Ok(events) => watch.pending.extend(events),
                    Err(error) => {
                        tracing::debug!(run_id = %watch.run_id, %error, "watch cannot catch up yet")
                    }
                },
            }
        }
    })
}

struct Watch<S: Store> {
    coordinator: Coordinator<S>,
    run_id: String,
    pending: std::collections::VecDeque<RunEvent>,
    /// Step visits settled and approvals requested already told, as `f <step>#<visit>` and
    /// `a <step>#<visit>`.
    told: std::collections::HashSet<String>,
    /// How many step visits were told settled: where a catch-up starts.
    settled: usize,
    done: bool,
    receiver: Option<tokio::sync::broadcast::Receiver<RunEvent>>,
}

impl<S: Store> Watch<S> {
    /// Whether `event` is news; notes it.
    fn tell(&mut self, event: &RunEvent) -> bool {
        match &event.event {
            Some(run_event::Event::StepFinished(step)) => {
                let new = self
                    .told
                    .insert(format!("f {}#{}", step.step_id, step.visit));
                if new {
                    self.settled += 1;
                }
                new
            }
            Some(run_event::Event::ApprovalRequested(approval)) => self
                .told
                .insert(format!("a {}#{}", approval.step_id, approval.visit)),
            Some(run_event::Event::RunFinished(_)) => {
                let first = !self.done;
                self.done = true;
                first
            }
            _ => true,
        }
    }
}
