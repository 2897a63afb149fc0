//! What a handler receives: one agent step to run.

use baton_proto::connection::Connection;
use baton_proto::v1::worker_service_client::WorkerServiceClient;

use crate::live::OutputSink;
use crate::payload::Payload;

/// One agent step to run.
#[derive(Debug, Clone)]
pub struct Task {
    /// The worker running it (for [`Task::query_decisions`]).
    pub worker_id: String,
    /// Opaque, unique to this attempt (it ends with `@<attempt>`).
    pub task_id: String,
    pub run_id: String,
    pub step_id: String,
    pub visit: u32,
    /// The map item it runs, by index (also the payload's `map.index`).
    pub item: Option<u32>,
    /// Which delivery of this step visit this is, from 1: above 1 the step was tried before
    /// (it failed and is retried, or the worker running it was lost).
    pub attempt: u32,
    pub agent: String,
    /// `{input, context, <reference>}`, as the spec describes, built when first read.
    pub payload: Payload,
    /// 0 when the step sets none.
    pub timeout_ms: u64,
    /// The address of the coordinator that sent the task, the one to ask about its run.
    pub coordinator: String,
    /// W3C trace context of this execution (the worker's span, or the coordinator's when the
    /// worker exports none); empty when the run is not traced. Command agents get it as
    /// `TRACEPARENT`, so their own spans join the run's trace.
    pub traceparent: String,
    /// Where the agent's live output goes: to the run's watchers ([`Task::stream`]).
    pub output: OutputSink,
    /// The session's connection to that coordinator, for queries mid-step.
    channel: Connection,
}

/// The coordinator of a session, as the tasks it sends see it.
#[derive(Debug, Clone)]
pub(super) struct Origin {
    pub(super) address: String,
    pub(super) channel: Connection,
}

impl Task {
    pub(super) fn new(
        worker_id: String,
        origin: Origin,
        task: baton_proto::v1::Task,
        payload: Payload,
        traceparent: String,
        output: OutputSink,
    ) -> Task {
        Task {
            worker_id,
            task_id: task.task_id,
            run_id: task.run_id,
            step_id: task.step_id,
            visit: task.visit,
            item: task.item,
            attempt: task.attempt,
            agent: task.agent,
            payload,
            timeout_ms: task.timeout_ms,
            coordinator: origin.address,
            traceparent,
            output,
            channel: origin.channel,
        }
    }

    /// Streams `text` to whoever watches the run, as the agent produces it (an LLM's tokens,
    /// progress lines). It never waits, and never becomes the step's data: the handler's answer
    /// does. Watchers that fall behind miss pieces and are told so.
    pub fn stream(&self, text: &str) {
        self.output.text(text);
    }

    /// The decisions of this run (or, with `workflow_scope`, of every run of its workflow)
    /// closest in meaning to `text`, best first; only `agent`'s if given.
    pub async fn query_decisions(
        &self,
        text: &str,
        agent: Option<&str>,
        k: u32,
        workflow_scope: bool,
    ) -> Result<Vec<baton_proto::v1::DecisionMatch>, tonic::Status> {
        let response = WorkerServiceClient::new(self.channel.clone())
            .query_decisions(baton_proto::v1::WorkerQueryDecisionsRequest {
                worker_id: self.worker_id.clone(),
                task_id: self.task_id.clone(),
                text: text.to_owned(),
                agent: agent.unwrap_or_default().to_owned(),
                k,
                workflow_scope,
            })
            .await?;
        Ok(response.into_inner().matches)
    }
}
