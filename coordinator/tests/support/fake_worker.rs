//! A worker played by a test, talking to a `Coordinator` in process (no network): the tasks it
//! is sent arrive on its stream as the `baton.v1` messages a real worker gets, and its hello and
//! answers go through the gRPC edge's conversions and checks, as a real worker's do.

#![allow(dead_code)]

use std::collections::HashMap;

use baton_coordinator::grpc::worker_service;
use baton_coordinator::hub::ToWorker;
use baton_coordinator::service::WorkerHello;
use baton_coordinator::store::Store;
use baton_coordinator::{Coordinator, Error};
use baton_proto::Json;
use baton_proto::v1::{
    CoordinatorMessage, Hello, ResendTask, Task, TaskOutput, TaskResult, Usage,
    coordinator_message, task_result,
};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TryRecvError;

/// JSON bytes with their SHA-256.
pub fn json_bytes(value: &Value) -> Json {
    Json::new(serde_json::to_vec(value).unwrap())
}

pub struct FakeWorker {
    pub id: String,
    /// Its connection's number, for `Coordinator::disconnect_worker`.
    pub connection: u64,
    stream: mpsc::UnboundedReceiver<ToWorker>,
}

impl FakeWorker {
    /// Connects a worker serving `agents`, 8 tasks at once, without a part cache.
    pub async fn connect<S: Store>(
        coordinator: &Coordinator<S>,
        id: &str,
        agents: &[&str],
    ) -> Self {
        Self::reconnect(coordinator, id, agents, Vec::new()).await
    }

    /// Connects a worker that still runs the tasks `held` (task ids) from an earlier stream.
    pub async fn reconnect<S: Store>(
        coordinator: &Coordinator<S>,
        id: &str,
        agents: &[&str],
        held: Vec<String>,
    ) -> Self {
        Self::hello(coordinator, id, agents, 8, held).await.unwrap()
    }

    /// Says hello as a worker with `capacity` slots that still runs `held`: connected, or why
    /// not.
    pub async fn hello<S: Store>(
        coordinator: &Coordinator<S>,
        id: &str,
        agents: &[&str],
        capacity: u32,
        held: Vec<String>,
    ) -> Result<Self, Error> {
        Self::hello_speaking(
            coordinator,
            id,
            agents,
            capacity,
            held,
            baton_proto::WORKER_PROTOCOL,
        )
        .await
    }

    /// [`FakeWorker::hello`] from a worker speaking worker protocol `protocol`.
    pub async fn hello_speaking<S: Store>(
        coordinator: &Coordinator<S>,
        id: &str,
        agents: &[&str],
        capacity: u32,
        held: Vec<String>,
        protocol: u32,
    ) -> Result<Self, Error> {
        Self::hello_caching(coordinator, id, agents, capacity, held, protocol, 0).await
    }

    /// [`FakeWorker::hello_speaking`] from a worker that says it keeps `cache_bytes` of parts
    /// (and context listings): the coordinator then sends it only what that cache lacks, and
    /// [`payload`] can no longer rebuild its payloads.
    pub async fn hello_caching<S: Store>(
        coordinator: &Coordinator<S>,
        id: &str,
        agents: &[&str],
        capacity: u32,
        held: Vec<String>,
        protocol: u32,
        cache_bytes: u64,
    ) -> Result<Self, Error> {
        let (tx, rx) = mpsc::unbounded_channel();
        let hello = Hello {
            worker_id: id.into(),
            agents: agents.iter().map(|a| a.to_string()).collect(),
            capacity,
            cache_bytes,
            protocol,
            held,
        };
        let hello = WorkerHello::try_from(hello)?;
        let (connection, _closed) = coordinator.connect_worker(hello, tx).await?;
        Ok(FakeWorker {
            id: id.into(),
            connection,
            stream: rx,
        })
    }

    /// Says hello as a worker that authenticated as `principal` (the gRPC edge fills it in
    /// from the call; its agents are ones the principal may serve), serving `agents` with 8
    /// slots and still running `held`: connected, or why not.
    pub async fn hello_as<S: Store>(
        coordinator: &Coordinator<S>,
        id: &str,
        principal: &str,
        agents: &[&str],
        held: Vec<String>,
    ) -> Result<Self, Error> {
        let (tx, rx) = mpsc::unbounded_channel();
        let hello = Hello {
            worker_id: id.into(),
            agents: agents.iter().map(|a| a.to_string()).collect(),
            capacity: 8,
            cache_bytes: 0,
            protocol: baton_proto::WORKER_PROTOCOL,
            held,
        };
        let hello = WorkerHello {
            principal: principal.into(),
            ..WorkerHello::try_from(hello)?
        };
        let (connection, _closed) = coordinator.connect_worker(hello, tx).await?;
        Ok(FakeWorker {
            id: id.into(),
            connection,
            stream: rx,
        })
    }

    /// The next message, waiting for it up to 10 s: what only a timer sends (a lease that runs
    /// out, a retry's backoff) comes a little later.
    pub async fn wait_message(&mut self) -> CoordinatorMessage {
        tokio::time::timeout(std::time::Duration::from_secs(10), self.stream.recv())
            .await
            .unwrap_or_else(|_| panic!("{} got nothing for 10 s", self.id))
            .expect("stream open")
            .into()
    }

    /// The next message sent to it, if any.
    pub fn try_recv(&mut self) -> Result<CoordinatorMessage, TryRecvError> {
        self.stream.try_recv().map(Into::into)
    }

    /// The next task, waiting for it up to 10 s.
    pub async fn wait_task(&mut self) -> Task {
        match self.wait_message().await {
            CoordinatorMessage {
                message: Some(coordinator_message::Message::Task(task)),
            } => task,
            other => panic!("{} expected a task, got {other:?}", self.id),
        }
    }

    /// The next message, which must be a task.
    pub fn next_task(&mut self) -> Task {
        match self.try_recv() {
            Ok(CoordinatorMessage {
                message: Some(coordinator_message::Message::Task(task)),
            }) => task,
            other => panic!("{} expected a task, got {other:?}", self.id),
        }
    }

    /// Whether nothing more was sent to it.
    pub fn has_nothing(&mut self) -> bool {
        self.stream.try_recv().is_err()
    }

    /// Answers `task` with `data`, and `notes` (`{"messages": [...], "decisions": [...]}`) if
    /// given.
    pub async fn complete<S: Store>(
        &self,
        coordinator: &Coordinator<S>,
        task: &Task,
        data: &Value,
        notes: Option<&Value>,
    ) -> Result<(), Error> {
        let result = TaskResult {
            task_id: task.task_id.clone(),
            outcome: Some(task_result::Outcome::Data(json_bytes(data))),
            notes: notes.map(json_bytes),
            non_retryable: false,
            usage: Vec::new(),
        };
        self.send(coordinator, result).await
    }
}

impl FakeWorker {
    /// Answers `task` with an error; `non_retryable` says retrying cannot help.
    pub async fn fail<S: Store>(
        &self,
        coordinator: &Coordinator<S>,
        task: &Task,
        error: &str,
        non_retryable: bool,
    ) -> Result<(), Error> {
        let result = TaskResult {
            task_id: task.task_id.clone(),
            outcome: Some(task_result::Outcome::Error(error.to_owned())),
            notes: None,
            non_retryable,
            usage: Vec::new(),
        };
        self.send(coordinator, result).await
    }

    /// Sends any result, as it is. Like every message on a worker's stream, it is a sign of life
    /// (a worker silent for `worker_silence_ms` is taken for dead).
    pub async fn send<S: Store>(
        &self,
        coordinator: &Coordinator<S>,
        result: TaskResult,
    ) -> Result<(), Error> {
        coordinator.hub().seen(&self.id);
        worker_service::answer(coordinator, &self.id, result).await
    }

    /// Streams `text` as the live output of `task`.
    pub fn stream<S: Store>(
        &self,
        coordinator: &Coordinator<S>,
        task: &Task,
        text: &str,
        restart: bool,
    ) -> Result<(), Error> {
        let output = TaskOutput {
            task_id: task.task_id.clone(),
            text: text.to_owned(),
            restart,
        };
        coordinator.hub().seen(&self.id);
        worker_service::output(coordinator, &self.id, output)
    }

    /// Answers `task` with `data`, reporting the tokens the attempt used.
    pub async fn complete_with_usage<S: Store>(
        &self,
        coordinator: &Coordinator<S>,
        task: &Task,
        data: &Value,
        usage: &[(&str, u64, u64)],
    ) -> Result<(), Error> {
        let result = TaskResult {
            task_id: task.task_id.clone(),
            outcome: Some(task_result::Outcome::Data(json_bytes(data))),
            notes: None,
            non_retryable: false,
            usage: usage_of(usage),
        };
        self.send(coordinator, result).await
    }

    /// Fails `task` (retryable), reporting the tokens the attempt used.
    pub async fn fail_with_usage<S: Store>(
        &self,
        coordinator: &Coordinator<S>,
        task: &Task,
        error: &str,
        usage: &[(&str, u64, u64)],
    ) -> Result<(), Error> {
        let result = TaskResult {
            task_id: task.task_id.clone(),
            outcome: Some(task_result::Outcome::Error(error.to_owned())),
            notes: None,
            non_retryable: false,
            usage: usage_of(usage),
        };
        self.send(coordinator, result).await
    }

    /// Asks for `task` again: the payload did not arrive intact.
    pub async fn resend<S: Store>(
        &self,
        coordinator: &Coordinator<S>,
        task_id: &str,
        reason: &str,
    ) -> Result<(), Error> {
        let request = ResendTask {
            task_id: task_id.to_owned(),
            reason: reason.to_owned(),
        };
        worker_service::resend(coordinator, &self.id, request).await
    }
}

/// `(model, prompt tokens, completion tokens)` as a result reports them.
fn usage_of(usage: &[(&str, u64, u64)]) -> Vec<Usage> {
    usage
        .iter()
        .map(|(model, prompt_tokens, completion_tokens)| Usage {
            model: (*model).to_owned(),
            prompt_tokens: *prompt_tokens,
            completion_tokens: *completion_tokens,
        })
        .collect()
}

/// The payload a worker with no part cache rebuilds: every part comes with the task, and a
/// context listing is a change from the empty one.
pub fn payload(task: &Task) -> Value {
    let manifest: baton_core::Manifest =
        serde_json::from_slice(task.manifest.as_ref().unwrap().verified().unwrap()).unwrap();
    let parts: HashMap<&str, &[u8]> = task
        .parts
        .iter()
        .map(|part| (part.sha256.as_str(), part.verified().unwrap()))
        .collect();
    let part = |digest: &str| parts.get(digest).copied();
    let bytes = match &manifest.listing {
        None => baton_core::payload::assemble(&manifest, part).unwrap(),
        Some(change) => {
            assert_eq!(
                change.base, None,
                "a worker without a cache holds no listing"
            );
            let context: Vec<(&str, &[u8])> = change
                .set
                .iter()
                .map(|(key, reference)| {
                    let json = baton_core::payload::inline_json(reference)
                        .or_else(|| part(reference))
                        .expect("every part comes with the task");
                    (key.as_str(), json)
                })
                .collect();
            baton_core::payload::assemble_with_context(&manifest, part, &context).unwrap()
        }
    };
    serde_json::from_slice(&bytes).unwrap()
}
