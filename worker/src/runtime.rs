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
//! worker.run(std::future::pending()).await;
//! # }
//! ```
//!
//! A worker keeps no state of its own between tasks, only a bounded cache of payload parts (see
//! [`crate::payload`]) that starts empty with each stream. It checks every part it receives
//! against its SHA-256 before running the agent and sends each result with its own. When the
//! coordinator goes away it reconnects with exponential backoff; tasks still running finish and
//! their answers go to whichever coordinator it is connected to by then.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use baton_proto::Json;
use baton_proto::v1::worker_service_client::WorkerServiceClient;
use baton_proto::v1::{
    Heartbeat, Hello, ResendTask, TaskResult, WorkerMessage, coordinator_message, task_result,
    worker_message,
};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::Output;
use crate::payload::{PartCache, Payload};

/// One agent step to run.
#[derive(Debug, Clone)]
pub struct Task {
    /// The worker running it (for [`Task::query_decisions`]).
    pub worker_id: String,
    pub task_id: String,
    pub run_id: String,
    pub step_id: String,
    pub visit: u32,
    pub agent: String,
    /// `{input, context, <reference>}`, as the spec describes, built when first read.
    pub payload: Payload,
    /// 0 when the step sets none.
    pub timeout_ms: u64,
    /// A connection to the coordinator, for queries mid-step.
    coordinator: Option<tonic::transport::Channel>,
}

impl Task {
    /// The decisions of this run (or, with `workflow_scope`, of every run of its workflow)
    /// closest in meaning to `text`, best first; only `agent`'s if given.
    pub async fn query_decisions(
        &self,
        text: &str,
        agent: Option<&str>,
        k: u32,
        workflow_scope: bool,
    ) -> Result<Vec<baton_proto::v1::DecisionMatch>, tonic::Status> {
        let channel = self
            .coordinator
            .clone()
            .ok_or_else(|| tonic::Status::unavailable("this task has no coordinator connection"))?;
        let response = WorkerServiceClient::new(channel)
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

/// The agent's answer (its data, and any messages and decisions), or why it failed.
pub type AgentResult = Result<Output, String>;

type Handler = Arc<dyn Fn(Task) -> Pin<Box<dyn Future<Output = AgentResult> + Send>> + Send + Sync>;

/// Called after every task, for logs and `baton dev`'s transcript.
pub type Observer = Arc<dyn Fn(&Task, &AgentResult) + Send + Sync>;

pub struct Worker {
    id: String,
    coordinator: String,
    concurrency: usize,
    part_cache_bytes: u64,
    agents: BTreeMap<String, Handler>,
    observer: Option<Observer>,
    /// The stream of the current session. Tasks answer through it when they finish, so that a
    /// task that outlives a reconnect answers on the new stream, not the dead one.
    current: std::sync::Mutex<Option<mpsc::Sender<WorkerMessage>>>,
    /// A connection for agents' queries (decisions), made once the worker runs.
    channel: std::sync::OnceLock<tonic::transport::Channel>,
    /// The tasks running now, by task id, so that a cancel can stop one.
    running: std::sync::Mutex<std::collections::HashMap<String, tokio::task::AbortHandle>>,
    /// Shutting down: no new tasks.
    draining: std::sync::atomic::AtomicBool,
    /// How long a shutdown waits for running tasks.
    shutdown_grace: Duration,
}

pub struct WorkerBuilder {
    id: Option<String>,
    coordinator: String,
    concurrency: usize,
    part_cache_bytes: u64,
    agents: BTreeMap<String, Handler>,
    observer: Option<Observer>,
    shutdown_grace: Duration,
}

impl Worker {
    /// 256 MiB of payload parts: a 200-step run of 1 MiB results is sent to a worker once.
    pub const DEFAULT_PART_CACHE_BYTES: u64 = 256 << 20;

    pub fn builder() -> WorkerBuilder {
        WorkerBuilder {
            id: None,
            coordinator: "http://127.0.0.1:50051".into(),
            concurrency: 4,
            part_cache_bytes: Self::DEFAULT_PART_CACHE_BYTES,
            agents: BTreeMap::new(),
            observer: None,
            shutdown_grace: Duration::from_secs(30),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Serves tasks until `shutdown` completes, reconnecting whenever the stream breaks.
    ///
    /// When `shutdown` completes the worker drains: it tells the coordinator to send it nothing
    /// more, lets the tasks it holds finish and answers them (up to its grace period, 30 s by
    /// default), then closes the stream; the coordinator gives anything left to another worker.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        let worker = Arc::new(self);
        if let Ok(endpoint) = tonic::transport::Endpoint::from_shared(worker.coordinator.clone()) {
            let _ = worker.channel.set(endpoint.connect_lazy());
        }
        let slots = Arc::new(Semaphore::new(worker.concurrency));
        let serving = tokio::spawn(worker.clone().serve(slots));
        // The sessions end when `run` returns, whatever the way out.
        let _serving = AbortOnDrop(serving.abort_handle());
        shutdown.await;
        worker.drain().await;
    }

    /// Sessions, one after another, reconnecting with backoff.
    async fn serve(self: Arc<Self>, slots: Arc<Semaphore>) {
        let mut backoff = Backoff::new();
        loop {
            if let Err(error) = self.clone().session(slots.clone(), &mut backoff).await {
                tracing::warn!(worker_id = %self.id, %error, "lost the coordinator");
            }
            tokio::time::sleep(backoff.next()).await;
        }
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

    /// One connection: hello, then tasks until the stream ends.
    async fn session(
        self: Arc<Self>,
        slots: Arc<Semaphore>,
        backoff: &mut Backoff,
    ) -> Result<(), String> {
        let mut client = WorkerServiceClient::connect(self.coordinator.clone())
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", self.coordinator))?
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        let (outbound, receiver) = mpsc::channel::<WorkerMessage>(1_024);
        outbound
            .send(WorkerMessage {
                message: Some(worker_message::Message::Hello(Hello {
                    worker_id: self.id.clone(),
                    agents: self.agents.keys().cloned().collect(),
                    // Tasks still running from a previous session hold their slots.
                    capacity: slots.available_permits().max(1) as u32,
                    cache_bytes: self.part_cache_bytes,
                    protocol: baton_proto::WORKER_PROTOCOL,
                })),
            })
            .await
            .map_err(|_| "stream closed".to_owned())?;
        let mut inbound = client
            .task_stream(ReceiverStream::new(receiver))
            .await
            .map_err(|status| format!("coordinator refused the stream: {}", status.message()))?
            .into_inner();
        backoff.reset();
        *self.current.lock().expect("session lock") = Some(outbound.clone());
        // A worker that reconnects while draining says so again on the new stream.
        if self.draining.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = outbound.send(drain_message()).await;
        }
        // Cleared when the session ends or is dropped: a sender left behind would keep the
        // stream open, and the coordinator would think this worker is still there.
        let _session = EndSession(self.clone());
        tracing::info!(worker_id = %self.id, coordinator = %self.coordinator, "connected");
        // Aborted when the session ends or is dropped (shutdown): the heartbeat holds a sender of
        // the stream, and a stream with a sender left open never closes on the coordinator's side.
        let _heartbeat = AbortOnDrop({
            let (outbound, slots) = (outbound.clone(), slots.clone());
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(Duration::from_secs(5));
                loop {
                    ticks.tick().await;
                    let beat = WorkerMessage {
                        message: Some(worker_message::Message::Heartbeat(Heartbeat {
                            free_capacity: slots.available_permits() as u32,
                        })),
                    };
                    if outbound.send(beat).await.is_err() {
                        return;
                    }
                }
            })
            .abort_handle()
        });
        let mut cache = PartCache::new(self.part_cache_bytes);
        loop {
            let message = match inbound.message().await {
                Ok(Some(message)) => message,
                Ok(None) => break Err("the coordinator closed the stream".to_owned()),
                Err(status) => break Err(status.message().to_owned()),
            };
            match message.message {
                Some(coordinator_message::Message::Task(mut task)) => {
                    // At once and in arrival order: the coordinator touched its copy of the
                    // cache in the order it sent the tasks.
                    let parts = std::mem::take(&mut task.parts);
                    let payload = match cache.receive(task.manifest.take(), parts) {
                        Ok(payload) => payload,
                        Err(error) => {
                            // The task is dropped here; the coordinator resets both caches and
                            // sends it again whole (or fails its step after a few tries).
                            tracing::warn!(task_id = %task.task_id, %error, "payload rejected; asking for it again");
                            let resend = WorkerMessage {
                                message: Some(worker_message::Message::Resend(ResendTask {
                                    task_id: task.task_id,
                                    reason: error.to_string(),
                                })),
                            };
                            if outbound.send(resend).await.is_err() {
                                break Err("stream closed".to_owned());
                            }
                            continue;
                        }
                    };
                    let permit = slots.clone().acquire_owned().await.expect("never closed");
                    let worker = self.clone();
                    let task_id = task.task_id.clone();
                    // Registered before it can finish, so that its own removal comes after.
                    let mut running = self.running.lock().expect("running lock");
                    let handle = tokio::spawn(async move {
                        let task_id = task.task_id.clone();
                        let result = worker.execute(task, payload).await;
                        worker.answer(result).await;
                        // Only now: a draining worker waits for the answer, not just the agent.
                        worker
                            .running
                            .lock()
                            .expect("running lock")
                            .remove(&task_id);
                        drop(permit);
                    });
                    running.insert(task_id, handle.abort_handle());
                }
                Some(coordinator_message::Message::Cancel(cancel)) => {
                    // Dropping the task drops its agent: a handler's future, a command's process
                    // (killed on drop), and the slot it held.
                    let handle = self
                        .running
                        .lock()
                        .expect("running lock")
                        .remove(&cancel.task_id);
                    if let Some(handle) = handle {
                        handle.abort();
                        tracing::info!(task_id = %cancel.task_id, reason = %cancel.reason, "task cancelled; agent stopped");
                    }
                }
                Some(coordinator_message::Message::ResetPartCache(_)) => {
                    cache = PartCache::new(self.part_cache_bytes);
                }
                Some(coordinator_message::Message::Rejected(rejected)) => {
                    tracing::warn!(task_id = %rejected.task_id, reason = %rejected.message, "result rejected");
                }
                None => {}
            }
        }
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
    async fn execute(&self, task: baton_proto::v1::Task, payload: Payload) -> WorkerMessage {
        let task_id = task.task_id.clone();
        let (outcome, notes) = match self.run_agent(task, payload).await {
            Ok(output) => (
                task_result::Outcome::Data(Json::new(
                    serde_json::to_vec(&output.data).expect("a JSON value serialises"),
                )),
                output.notes_json().map(Json::new),
            ),
            Err(error) => (task_result::Outcome::Error(error), None),
        };
        WorkerMessage {
            message: Some(worker_message::Message::Result(TaskResult {
                task_id,
                outcome: Some(outcome),
                notes,
            })),
        }
    }

    async fn run_agent(&self, task: baton_proto::v1::Task, payload: Payload) -> AgentResult {
        let handler = self
            .agents
            .get(&task.agent)
            .ok_or_else(|| format!("this worker does not serve agent \"{}\"", task.agent))?;
        let task = Task {
            worker_id: self.id.clone(),
            coordinator: self.channel.get().cloned(),
            task_id: task.task_id,
            run_id: task.run_id,
            step_id: task.step_id,
            visit: task.visit,
            agent: task.agent,
            payload,
            timeout_ms: task.timeout_ms,
        };
        // The handler runs as its own task, so that a panic fails the step instead of leaving
        // it unanswered, and a step's timeout_ms stops it.
        let mut running = tokio::spawn(handler(task.clone()));
        // If this task is cancelled (dropped), the handler stops with it.
        let _stop_handler = AbortOnDrop(running.abort_handle());
        let joined = if task.timeout_ms > 0 {
            match tokio::time::timeout(Duration::from_millis(task.timeout_ms), &mut running).await {
                Ok(joined) => joined,
                Err(_) => {
                    running.abort();
                    return Err(format!(
                        "agent \"{}\" timed out after {} ms",
                        task.agent, task.timeout_ms
                    ));
                }
            }
        } else {
            running.await
        };
        let result = match joined {
            Ok(result) => result,
            Err(error) if error.is_panic() => Err(format!("agent \"{}\" panicked", task.agent)),
            Err(error) => Err(format!("agent \"{}\" did not finish: {error}", task.agent)),
        };
        if let Some(observer) = &self.observer {
            observer(&task, &result);
        }
        result
    }
}

impl WorkerBuilder {
    /// The worker's id; defaults to `<host>-<pid>`.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// The coordinator's URL, such as `http://127.0.0.1:50051`.
    pub fn coordinator(mut self, url: impl Into<String>) -> Self {
        self.coordinator = url.into();
        self
    }

    /// How many tasks run at once.
    pub fn concurrency(mut self, tasks: usize) -> Self {
        self.concurrency = tasks.max(1);
        self
    }

    /// The bytes of payload parts kept between tasks, so that results every later step sees
    /// cross the network once; 0 keeps none. Defaults to
    /// [`Worker::DEFAULT_PART_CACHE_BYTES`].
    pub fn part_cache_bytes(mut self, bytes: u64) -> Self {
        self.part_cache_bytes = bytes;
        self
    }

    /// Serves `name` with an async function from task to data (a JSON value, or an
    /// [`Output`] with messages and decisions).
    pub fn agent<F, Fut, O>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        F: Fn(Task) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, String>> + Send + 'static,
        O: Into<Output> + 'static,
    {
        let handler = Arc::new(handler);
        let handler: Handler = Arc::new(move |task| {
            let answer = handler(task);
            Box::pin(async move { answer.await.map(Into::into) })
        });
        self.agents.insert(name.into(), handler);
        self
    }

    /// How long a shutdown waits for the tasks running to finish and be answered (default
    /// 30 s); what is still running then goes back to the coordinator.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Sees every task and its result.
    pub fn observer(
        mut self,
        observer: impl Fn(&Task, &AgentResult) + Send + Sync + 'static,
    ) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    pub fn build(self) -> Worker {
        let id = self.id.unwrap_or_else(default_id);
        Worker {
            id,
            coordinator: self.coordinator,
            concurrency: self.concurrency,
            part_cache_bytes: self.part_cache_bytes,
            agents: self.agents,
            observer: self.observer,
            current: std::sync::Mutex::new(None),
            channel: std::sync::OnceLock::new(),
            running: Default::default(),
            draining: Default::default(),
            shutdown_grace: self.shutdown_grace,
        }
    }
}

fn default_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "worker".into());
    format!("{host}-{}", std::process::id())
}

fn drain_message() -> WorkerMessage {
    WorkerMessage {
        message: Some(worker_message::Message::Drain(baton_proto::v1::Drain {})),
    }
}

/// Forgets the session's stream when dropped.
struct EndSession(Arc<Worker>);

impl Drop for EndSession {
    fn drop(&mut self) {
        if let Ok(mut current) = self.0.current.lock() {
            *current = None;
        }
    }
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// 100 ms doubling to 5 s, reset by a successful connection.
struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    fn new() -> Self {
        Self { next: Self::FIRST }
    }

    fn next(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        delay
    }

    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_ceiling_and_resets() {
        let mut backoff = Backoff::new();
        let delays: Vec<u64> = (0..8).map(|_| backoff.next().as_millis() as u64).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        backoff.reset();
        assert_eq!(backoff.next(), Duration::from_millis(100));
    }
}
