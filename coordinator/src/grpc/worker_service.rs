//! `baton.v1.WorkerService`: one long-lived stream per worker.

use std::pin::Pin;

use baton_proto::v1::worker_service_server::WorkerService;
use baton_proto::v1::{
    CoordinatorMessage, QueryDecisionsResponse, TaskRejected, WorkerMessage,
    WorkerQueryDecisionsRequest, coordinator_message, worker_message,
};
use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::error::Error;
use crate::service::Coordinator;
use crate::store::Store;

pub struct Workers<S: Store> {
    coordinator: Coordinator<S>,
    stop: watch::Receiver<bool>,
}

impl<S: Store> Workers<S> {
    pub fn new(coordinator: Coordinator<S>, stop: watch::Receiver<bool>) -> Self {
        Self { coordinator, stop }
    }
}

type MessageStream = Pin<Box<dyn Stream<Item = Result<CoordinatorMessage, Status>> + Send>>;

#[tonic::async_trait]
impl<S: Store> WorkerService for Workers<S> {
    type TaskStreamStream = MessageStream;

    async fn query_decisions(
        &self,
        request: Request<WorkerQueryDecisionsRequest>,
    ) -> Result<Response<QueryDecisionsResponse>, Status> {
        let response = self
            .coordinator
            .worker_query_decisions(request.into_inner())
            .await?;
        Ok(Response::new(response))
    }

    async fn task_stream(
        &self,
        request: Request<Streaming<WorkerMessage>>,
    ) -> Result<Response<Self::TaskStreamStream>, Status> {
        let mut inbound = request.into_inner();
        let hello = match inbound.message().await? {
            Some(WorkerMessage {
                message: Some(worker_message::Message::Hello(hello)),
            }) => hello,
            _ => return Err(Error::NoHello.into()),
        };
        if hello.protocol != baton_proto::WORKER_PROTOCOL {
            return Err(Error::Protocol {
                worker: hello.protocol,
                coordinator: baton_proto::WORKER_PROTOCOL,
            }
            .into());
        }
        if hello.worker_id.is_empty() {
            return Err(Status::invalid_argument(
                "hello.worker_id: a worker needs an id",
            ));
        }
        let (outbound, receiver) = mpsc::unbounded_channel();
        let (connection, closed) = self
            .coordinator
            .connect_worker(
                &hello.worker_id,
                hello.agents.clone(),
                hello.capacity.max(1) as usize,
                hello.cache_bytes,
                hello.held,
                outbound.clone(),
            )
            .await?;
        let coordinator = self.coordinator.clone();
        let worker_id = hello.worker_id;
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
                        // and the heartbeats behind it must still be heard meanwhile.
                        let (coordinator, worker_id) = (coordinator.clone(), worker_id.clone());
                        let outbound = outbound.clone();
                        completing.spawn(async move {
                            let task_id = result.task_id.clone();
                            if let Err(error) = coordinator.complete(&worker_id, result).await {
                                tracing::warn!(%worker_id, %task_id, %error, "result refused");
                                let _ = outbound.send(CoordinatorMessage {
                                    message: Some(coordinator_message::Message::Rejected(
                                        TaskRejected {
                                            task_id,
                                            message: error.to_string(),
                                        },
                                    )),
                                });
                            }
                        });
                    }
                    Ok(WorkerMessage {
                        message: Some(worker_message::Message::Resend(request)),
                    }) => {
                        // On its own task too: giving up on a resend records a failure.
                        let (coordinator, worker_id) = (coordinator.clone(), worker_id.clone());
                        completing.spawn(async move {
                            let task_id = request.task_id.clone();
                            if let Err(error) = coordinator.resend(&worker_id, request).await {
                                tracing::warn!(%worker_id, %task_id, %error, "resend refused");
                            }
                        });
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
        let stream = UnboundedReceiverStream::new(receiver)
            .map(Ok)
            .take_until(super::stopped(self.stop.clone()))
            // The coordinator let the worker go (silent too long): end the stream, so that a
            // worker that is in fact alive notices and reconnects.
            .take_until(closed);
        Ok(Response::new(Box::pin(stream)))
    }
}
