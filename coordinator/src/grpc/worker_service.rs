//! `baton.v1.WorkerService`: one long-lived stream per worker, and agents' decision queries.
//!
//! What a worker sends is converted and checked here ([`super::requests`]); what the hub sends
//! it goes out as `baton.v1` messages, through the wire faults of a test, if any.

use std::pin::Pin;

use baton_proto::v1;
use baton_proto::v1::worker_service_server::WorkerService;
use baton_proto::v1::{CoordinatorMessage, WorkerMessage, worker_message};
use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::{Faults, requests};
use crate::auth::Caller;
use crate::bounded;
use crate::error::Error;
use crate::hub::ToWorker;
use crate::service::{Coordinator, WorkerHello};
use crate::store::Store;

pub struct Workers<S: Store> {
    coordinator: Coordinator<S>,
    stop: watch::Receiver<bool>,
    faults: Faults,
}

impl<S: Store> Workers<S> {
    pub fn new(coordinator: Coordinator<S>, stop: watch::Receiver<bool>) -> Self {
        Self {
            coordinator,
            stop,
            faults: Faults::none(),
        }
    }

    /// Injects `faults` into every worker's stream (tests only).
    pub fn with_faults(self, faults: Faults) -> Self {
        Self { faults, ..self }
    }
}

/// A worker's answer to a task: converted, checked, and recorded.
pub async fn answer<S: Store>(
    coordinator: &Coordinator<S>,
    worker_id: &str,
    result: v1::TaskResult,
) -> Result<(), Error> {
    let answer = requests::answer(result, coordinator.config())?;
    coordinator.complete(worker_id, answer).await
}

/// A worker could not rebuild a task's payload and asks for it again.
pub async fn resend<S: Store>(
    coordinator: &Coordinator<S>,
    worker_id: &str,
    request: v1::ResendTask,
) -> Result<(), Error> {
    let (task, reason) = requests::resend_request(request, coordinator.config())?;
    coordinator.resend(worker_id, task, &reason).await
}

/// A piece of an agent's live output, from the worker running it.
pub fn output<S: Store>(
    coordinator: &Coordinator<S>,
    worker_id: &str,
    output: v1::TaskOutput,
) -> Result<(), Error> {
    let (task, text, restart) = requests::output_piece(output, coordinator.config())?;
    coordinator.live_output(worker_id, &task, text, restart)
}

/// An agent's decision query, through the task its worker holds: a worker of the caller's
/// principal (`principal`, empty without authentication), since the request names the worker
/// in a field anyone can fill in.
pub async fn query_decisions<S: Store>(
    coordinator: &Coordinator<S>,
    principal: &str,
    request: v1::WorkerQueryDecisionsRequest,
) -> Result<v1::QueryDecisionsResponse, Error> {
    let mut query = requests::worker_query(request, coordinator.config())?;
    query.principal = (!principal.is_empty()).then(|| principal.to_owned());
    Ok(coordinator.worker_query_decisions(query).await?.into())
}

/// Refuses a worker whose principal may not serve one of the agents it offers, naming it.
fn may_serve(caller: &Caller, agents: &[String]) -> Result<(), Status> {
    let Some(principal) = &caller.0 else {
        return Ok(());
    };
    match agents.iter().find(|agent| !principal.may_serve(agent)) {
        None => Ok(()),
        Some(agent) => {
            let allowed: Vec<&str> = principal
                .agents
                .iter()
                .flatten()
                .map(String::as_str)
                .collect();
            Err(Status::permission_denied(format!(
                "principal `{}` may not serve agent `{agent}` (its agents: {}); remove it \
                 from this worker's agents file",
                principal.name,
                allowed.join(", ")
            )))
        }
    }
}

type MessageStream = Pin<Box<dyn Stream<Item = Result<CoordinatorMessage, Status>> + Send>>;

#[tonic::async_trait]
impl<S: Store> WorkerService for Workers<S> {
    type TaskStreamStream = MessageStream;

    async fn query_decisions(
        &self,
        request: Request<v1::WorkerQueryDecisionsRequest>,
    ) -> Result<Response<v1::QueryDecisionsResponse>, Status> {
        let caller = Caller::of(&request);
        let principal = caller.name().unwrap_or_default();
        let found = query_decisions(&self.coordinator, principal, request.into_inner()).await?;
        Ok(Response::new(found))
    }

    async fn task_stream(
        &self,
        request: Request<Streaming<WorkerMessage>>,
    ) -> Result<Response<Self::TaskStreamStream>, Status> {
        let caller = Caller::of(&request);
        let mut inbound = request.into_inner();
        let hello = match inbound.message().await? {
            Some(WorkerMessage {
                message: Some(worker_message::Message::Hello(hello)),
            }) => WorkerHello {
                principal: caller.name().unwrap_or_default().to_owned(),
                ..WorkerHello::try_from(hello)?
            },
            _ => return Err(Error::NoHello.into()),
        };
        may_serve(&caller, &hello.agents)?;
        let worker_id = hello.worker_id.clone();
        let (outbound, receiver) = mpsc::unbounded_channel();
        let (connection, closed) = self
            .coordinator
            .connect_worker(hello, outbound.clone())
            .await?;
        let coordinator = self.coordinator.clone();
        tokio::spawn(async move {
            // Results being recorded: the stream's end waits for them, so that an answer that
            // arrived before the end is not taken for lost.
            let mut completing = tokio::task::JoinSet::new();
            while let Some(message) = inbound.next().await {
                coordinator.hub().seen(&worker_id);
                while completing.try_join_next().is_some() {}
                match message {
                    Ok(WorkerMessage {
                        message: Some(worker_message::Message::Result(result)),
                    }) => {
                        // On its own task: a result may wait for a store that is restarting,
                        // and the heartbeats behind it must still be heard meanwhile. Boxed: the
                        // answer's future holds a whole transition's state (kilobytes), which a
                        // spawn would otherwise copy several times over for every answer.
                        let (coordinator, worker_id) = (coordinator.clone(), worker_id.clone());
                        let outbound = outbound.clone();
                        completing.spawn(async move {
                            let task_id = result.task_id.clone();
                            let answered = Box::pin(answer(&coordinator, &worker_id, result));
                            if let Err(error) = answered.await {
                                // The reason may quote what the worker sent (a digest): cut.
                                let limit = coordinator.config().max_error_bytes;
                                let message = bounded::cut(&error.to_string(), limit);
                                let task_id = bounded::cut(&task_id, limit);
                                tracing::warn!(%worker_id, %task_id, error = %message, "result refused");
                                let _ = outbound.send(ToWorker::Rejected { task_id, message });
                            }
                        });
                    }
                    Ok(WorkerMessage {
                        message: Some(worker_message::Message::Resend(request)),
                    }) => {
                        // On its own task too: giving up on a resend records a failure.
                        let (coordinator, worker_id) = (coordinator.clone(), worker_id.clone());
                        completing.spawn(async move {
                            let limit = coordinator.config().max_error_bytes;
                            let task_id = bounded::cut(&request.task_id, limit);
                            if let Err(error) = resend(&coordinator, &worker_id, request).await {
                                tracing::warn!(%worker_id, %task_id, %error, "resend refused");
                            }
                        });
                    }
                    Ok(WorkerMessage {
                        message: Some(worker_message::Message::Output(output)),
                    }) => {
                        // Live output is for watchers: a piece refused is dropped, quietly.
                        if let Err(error) = self::output(&coordinator, &worker_id, output) {
                            tracing::debug!(%worker_id, %error, "live output refused");
                        }
                    }
                    Ok(WorkerMessage {
                        message: Some(worker_message::Message::Drain(_)),
                    }) => {
                        tracing::info!(%worker_id, "worker draining: no new tasks for it");
                        coordinator.hub().drain(&worker_id);
                    }
                    // Heartbeats say the worker is alive (seen above); hello is only first.
                    Ok(_) => {}
                    Err(status) => {
                        tracing::info!(%worker_id, %status, "worker stream broke");
                        break;
                    }
                }
            }
            completing.join_all().await;
            coordinator.disconnect_worker(&worker_id, connection).await;
        });
        let faults = self.faults.clone();
        let stream = UnboundedReceiverStream::new(receiver)
            .map(move |message| Ok(faults.apply(message.into())))
            .take_until(super::stopped(self.stop.clone()))
            // The coordinator let the worker go (silent too long): end the stream, so that a
            // worker that is in fact alive notices and reconnects.
            .take_until(closed);
        Ok(Response::new(Box::pin(stream)))
    }
}
