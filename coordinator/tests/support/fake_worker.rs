//! A worker played by a test, talking to a `Coordinator` in-process (no gRPC): the tasks it is
//! sent arrive on its stream, its answers go straight to `Coordinator::complete`.

#![allow(dead_code)]

use std::collections::HashMap;

use baton_coordinator::store::Store;
use baton_coordinator::{Coordinator, Error};
use baton_proto::Json;
use baton_proto::v1::{CoordinatorMessage, Task, TaskResult, coordinator_message, task_result};
use serde_json::Value;
use tokio::sync::mpsc;

/// JSON bytes with their SHA-256.
pub fn json_bytes(value: &Value) -> Json {
    Json::new(serde_json::to_vec(value).unwrap())
}

pub struct FakeWorker {
    pub id: String,
    /// Its connection's number, for `Coordinator::disconnect_worker`.
    pub connection: u64,
    pub stream: mpsc::UnboundedReceiver<CoordinatorMessage>,
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
        let (tx, rx) = mpsc::unbounded_channel();
        let (connection, _closed) = coordinator
            .connect_worker(
                id,
                agents.iter().map(|a| a.to_string()).collect(),
                8,
                0,
                held,
                tx,
            )
            .await
            .unwrap();
        FakeWorker {
            id: id.into(),
            connection,
            stream: rx,
        }
    }

    /// The next message, waiting for it up to 10 s: what only a timer sends (a lease that runs
    /// out, a retry's backoff) comes a little later.
    pub async fn wait_message(&mut self) -> CoordinatorMessage {
        tokio::time::timeout(std::time::Duration::from_secs(10), self.stream.recv())
            .await
            .unwrap_or_else(|_| panic!("{} got nothing for 10 s", self.id))
            .expect("stream open")
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
        match self.stream.try_recv() {
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
        coordinator
            .complete(
                &self.id,
                TaskResult {
                    task_id: task.task_id.clone(),
                    outcome: Some(task_result::Outcome::Data(json_bytes(data))),
                    notes: notes.map(json_bytes),
                    non_retryable: false,
                },
            )
            .await
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
        coordinator
            .complete(
                &self.id,
                TaskResult {
                    task_id: task.task_id.clone(),
                    outcome: Some(task_result::Outcome::Error(error.to_owned())),
                    notes: None,
                    non_retryable,
                },
            )
            .await
    }
}

/// The payload a worker with no part cache rebuilds: every part comes with the task.
pub fn payload(task: &Task) -> Value {
    let manifest: baton_core::Manifest =
        serde_json::from_slice(task.manifest.as_ref().unwrap().verified().unwrap()).unwrap();
    let parts: HashMap<&str, &[u8]> = task
        .parts
        .iter()
        .map(|part| (part.sha256.as_str(), part.verified().unwrap()))
        .collect();
    let bytes = baton_core::payload::assemble(&manifest, |d| parts.get(d).copied()).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}
