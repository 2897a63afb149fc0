//! The worker runtime and Rust SDK: connect to a coordinator, take tasks, run agents, answer.
//!
//! ```no_run
//! # async fn example() {
//! use baton_worker::Worker;
//! let worker = Worker::builder()
//!     .coordinator("http://127.0.0.1:50051")
//!     .agent("planner", |task| async move {
//!         Ok(serde_json::json!({"files": ["src/theme.ts"], "input": task.payload["input"]}))
//!     })
//!     .build();
//! if let Err(refused) = worker.run(std::future::pending()).await {
//!     eprintln!("{refused}");
//! }
//! # }
//! ```
//!
//! A worker keeps no state of its own between tasks, only a bounded cache of payload parts (see
//! [`crate::payload`]) that starts empty with each stream. It checks every part it receives
//! against its SHA-256 before running the agent and sends each result with its own. When its
//! coordinator goes away it reconnects, to the next of its coordinators, with exponential
//! backoff (at once when the coordinator said goodbye); tasks still running finish and their
//! answers go to whichever coordinator it is connected to by then, which it tells about them in
//! its hello.
//!
//! Layout: [`WorkerBuilder`] configures a worker, `session` holds the streams to coordinators,
//! [`Task`] is what a handler receives; this file runs tasks and answers them.

mod builder;
mod session;
mod task;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use baton_proto::Json;
use baton_proto::v1::{TaskOutput, TaskResult, WorkerMessage, task_result, worker_message};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

pub use builder::WorkerBuilder;
pub use session::Denied;
pub use task::Task;

use crate::live::{self, OutputSink};
use crate::payload::Payload;
use crate::traces::ExecutionSpan;
use crate::{Failure, ModelCall, Output};
use task::Origin;
use tracing::Instrument as _;

/// The agent's answer (its data, and any messages and decisions), or why it failed.
pub type AgentResult = Result<Output, Failure>;

type Handler = Arc<dyn Fn(Task) -> Pin<Box<dyn Future<Output = AgentResult> + Send>> + Send + Sync>;

/// Called after every task, for logs and `baton dev`'s transcript.
pub type Observer = Arc<dyn Fn(&Task, &AgentResult) + Send + Sync>;

pub struct Worker {
    id: String,
    /// Never empty; sessions go round it, so the worker outlives any one coordinator.
    coordinators: Vec<String>,
    concurrency: usize,
    part_cache_bytes: u64,
    heartbeat_interval: Duration,
    agents: BTreeMap<String, Handler>,
    observer: Option<Observer>,
    /// TLS roots, client certificate and token for every coordinator.
    security: baton_proto::connection::ClientSecurity,
    /// The stream of the current session. Tasks answer through it when they finish, so that a
    /// task that outlives a reconnect answers on the new stream, not the dead one.
    current: std::sync::Mutex<Option<mpsc::Sender<WorkerMessage>>>,
    /// The tasks running now, by task id, so that a cancel can stop one and the next session's
    /// hello can name them.
    running: std::sync::Mutex<std::collections::HashMap<String, tokio::task::AbortHandle>>,
    /// Shutting down: no new tasks.
    draining: std::sync::atomic::AtomicBool,
    /// How long a shutdown waits for running tasks.
    shutdown_grace: Duration,
    /// Spans of agent executions ([`crate::traces`]).
    traces: bool,
    metrics: Arc<crate::metrics::WorkerMetrics>,
}

impl Worker {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The worker's metrics (for `/metrics`); a handle that stays valid while it runs.
    pub fn metrics(&self) -> Arc<crate::metrics::WorkerMetrics> {
        self.metrics.clone()
    }

    /// Serves tasks until `shutdown` completes, reconnecting whenever the stream breaks.
    ///
    /// When `shutdown` completes the worker drains: it tells the coordinator to send it nothing
    /// more, lets the tasks it holds finish and answers them (up to its grace period, 30 s by
    /// default), then closes the stream; the coordinator gives anything left to another worker.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), Denied> {
        let worker = Arc::new(self);
        let slots = Arc::new(Semaphore::new(worker.concurrency));
        let mut serving = tokio::spawn(worker.clone().serve(slots));
        // The sessions end when `run` returns, whatever the way out.
        let _serving = AbortOnDrop(serving.abort_handle());
        tokio::select! {
            () = shutdown => {}
            denied = &mut serving => {
                if let Ok(denied) = denied {
                    return Err(denied);
                }
            }
        }
        worker.drain().await;
        Ok(())
    }

    /// Stops taking tasks and waits (up to the grace period) for those running to be answered.
    async fn drain(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let sender = self.current.lock().expect("session lock").clone();
        if let Some(sender) = &sender {
            let _ = sender.send(drain_message()).await;
        }
        let running = || self.running.lock().expect("running lock").len();
        tracing::info!(worker_id = %self.id, running = running(), "draining");
        let deadline = tokio::time::Instant::now() + self.shutdown_grace;
        while running() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if running() > 0 {
            tracing::warn!(worker_id = %self.id, abandoned = running(), "grace period over; the coordinator gives the unfinished tasks to another worker");
        }
        // Answers queued on the stream go out before it closes.
        let sender = self.current.lock().expect("session lock").clone();
        if let Some(sender) = sender {
            let flushed = tokio::time::Instant::now() + Duration::from_secs(2);
            while sender.capacity() < sender.max_capacity() && tokio::time::Instant::now() < flushed
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    /// Runs a task in the background, holding `slot` until its answer is sent.
    fn start(
        self: &Arc<Self>,
        task: baton_proto::v1::Task,
        payload: Payload,
        origin: Origin,
        slot: OwnedSemaphorePermit,
    ) {
        let worker = self.clone();
        let task_id = task.task_id.clone();
        // Registered before it can finish, so that its own removal comes after.
        let mut running = self.running.lock().expect("running lock");
        let handle = tokio::spawn(async move {
            let task_id = task.task_id.clone();
            let result = worker.execute(task, payload, origin).await;
            worker.answer(result).await;
            // Only now: a draining worker waits for the answer, not just the agent, and a
            // reconnecting one names the task in its hello until it is answered.
            worker
                .running
                .lock()
                .expect("running lock")
                .remove(&task_id);
            drop(slot);
        });
        running.insert(task_id, handle.abort_handle());
    }

    /// Sends an answer on the current session's stream, waiting out a reconnect (up to a
    /// minute) rather than dropping it.
    async fn answer(&self, message: WorkerMessage) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while tokio::time::Instant::now() < deadline {
            let sender = self.current.lock().expect("session lock").clone();
            if let Some(sender) = sender
                && sender.send(message.clone()).await.is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tracing::warn!(worker_id = %self.id, "dropped an answer: no coordinator for a minute");
    }

    /// Runs the agent and wraps its answer.
    async fn execute(
        &self,
        task: baton_proto::v1::Task,
        payload: Payload,
        origin: Origin,
    ) -> WorkerMessage {
        let task_id = task.task_id.clone();
        let agent = task.agent.clone();
        let running = self.metrics.task_started(&task.agent);
        let mut span = ExecutionSpan::start(self.traces, &self.id, &task);
        let (trace_id, span_id) = span.ids();
        // Every log line of the execution names its trace, so a log leads to the trace.
        let logs = tracing::info_span!("task", %task_id, %trace_id, %span_id);
        let (output, pieces) = OutputSink::channel();
        let (done, agent_done) = tokio::sync::oneshot::channel();
        // The agent's live output goes out as it comes, and all of it before the answer.
        let run = async {
            let answer = self
                .run_agent(task, payload, origin, span.traceparent.clone(), output)
                .instrument(logs.clone())
                .await;
            let _ = done.send(());
            answer
        };
        let (answer, ()) = tokio::join!(run, self.forward_output(&task_id, pieces, agent_done));
        if let Err(failure) = &answer {
            logs.in_scope(|| {
                tracing::warn!(
                    retryable = failure.is_retryable(),
                    error = failure.message(),
                    "agent failed"
                )
            });
        }
        let calls = match &answer {
            Ok(output) => output.calls.as_slice(),
            Err(failure) => failure.calls(),
        };
        self.metrics.model_calls(&agent, calls);
        span.record_calls(calls);
        let usage = calls.iter().map(usage).collect();
        span.finish(answer.as_ref().err().map(Failure::message));
        running.finished(answer.is_ok());
        let (outcome, notes, non_retryable) = match answer {
            Ok(output) => (
                task_result::Outcome::Data(Json::new(
                    serde_json::to_vec(&output.data).expect("a JSON value serialises"),
                )),
                output.notes_json().map(Json::new),
                false,
            ),
            Err(failure) => (
                task_result::Outcome::Error(failure.message().to_owned()),
                None,
                !failure.is_retryable(),
            ),
        };
        WorkerMessage {
            message: Some(worker_message::Message::Result(TaskResult {
                task_id,
                outcome: Some(outcome),
                notes,
                non_retryable,
                usage,
            })),
        }
    }

    /// Sends the agent's live output to the coordinator, piece by piece, until the agent is
    /// done. Output is not queued across a reconnect: with no session, it is dropped.
    async fn forward_output(
        &self,
        task_id: &str,
        mut pieces: live::Receiver,
        mut agent_done: tokio::sync::oneshot::Receiver<()>,
    ) {
        let mut closed = false;
        loop {
            let piece = if closed {
                pieces.next().await
            } else {
                tokio::select! {
                    piece = pieces.next() => piece,
                    _ = &mut agent_done => {
                        // What the agent wrote still goes; nothing after it.
                        pieces.close();
                        closed = true;
                        continue;
                    }
                }
            };
            let Some(piece) = piece else {
                return;
            };
            let sender = self.current.lock().expect("session lock").clone();
            let Some(sender) = sender else {
                continue;
            };
            let message = WorkerMessage {
                message: Some(worker_message::Message::Output(TaskOutput {
                    task_id: task_id.to_owned(),
                    text: piece.text,
                    restart: piece.restart,
                })),
            };
            let _ = sender.send(message).await;
        }
    }

    async fn run_agent(
        &self,
        task: baton_proto::v1::Task,
        payload: Payload,
        origin: Origin,
        traceparent: String,
        output: OutputSink,
    ) -> AgentResult {
        let handler = self.agents.get(&task.agent).ok_or_else(|| {
            Failure::retryable(format!(
                "this worker does not serve agent \"{}\"",
                task.agent
            ))
        })?;
        let task = Task::new(self.id.clone(), origin, task, payload, traceparent, output);
        // The handler runs as its own task, so that a panic fails the step instead of leaving
        // it unanswered, and a step's timeout_ms stops it. Neither says anything about the
        // next attempt, so both are retryable.
        let mut running = tokio::spawn(handler(task.clone()));
        // If this task is cancelled (dropped), the handler stops with it.
        let _stop_handler = AbortOnDrop(running.abort_handle());
        let joined = if task.timeout_ms > 0 {
            match tokio::time::timeout(Duration::from_millis(task.timeout_ms), &mut running).await {
                Ok(joined) => joined,
                Err(_) => {
                    running.abort();
                    return Err(Failure::retryable(format!(
                        "agent \"{}\" timed out after {} ms",
                        task.agent, task.timeout_ms
                    )));
                }
            }
        } else {
            running.await
        };
        let result = match joined {
            Ok(result) => result,
            Err(error) if error.is_panic() => Err(Failure::retryable(format!(
                "agent \"{}\" panicked",
                task.agent
            ))),
            Err(error) => Err(Failure::retryable(format!(
                "agent \"{}\" did not finish: {error}",
                task.agent
            ))),
        };
        if let Some(observer) = &self.observer {
            observer(&task, &result);
        }
        result
    }
}

/// A call to a model as the result reports it.
fn usage(call: &ModelCall) -> baton_proto::v1::Usage {
    baton_proto::v1::Usage {
        model: call.model.clone(),
        prompt_tokens: call.prompt_tokens,
        completion_tokens: call.completion_tokens,
    }
}

fn drain_message() -> WorkerMessage {
    WorkerMessage {
        message: Some(worker_message::Message::Drain(baton_proto::v1::Drain {})),
    }
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
