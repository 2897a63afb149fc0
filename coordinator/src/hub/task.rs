//! What goes through the hub: tasks ready for a worker, the messages sent down a worker's
//! stream, and what the hub tells the coordinator back.

use std::sync::Arc;
use std::time::Duration;

use baton_core::{AgentName, RunId, TaskId, WorkerId};

use crate::clock::Instant;
use crate::parts::{Part, TaskPayload};
use crate::task_ref::TaskRef;
use crate::traces::TaskTrace;

/// A task ready for a worker: one attempt of an agent step, with its payload.
#[derive(Debug, Clone)]
pub struct ReadyTask {
    pub task: TaskRef,
    /// Its visit key (`<step>#<visit>`): with the run id, what the hub finds it by.
    pub key: String,
    pub agent: AgentName,
    /// Its payload, by reference: what each worker is sent depends on what it holds.
    pub payload: TaskPayload,
    /// The step's `timeout_ms` per attempt; 0 for none.
    pub timeout_ms: u64,
    /// The W3C trace context of the attempt's span, the worker's parent; empty untraced.
    pub traceparent: String,
    /// How many times a worker asked for it again because it could not rebuild the payload.
    pub resends: u32,
    /// When it went to the worker holding it: its `timeout_ms` runs from there.
    pub started: Option<Instant>,
    /// When it became ready (dispatched, or delivered again): its queue wait runs from there.
    pub ready_at: Instant,
    /// What its span needs to know about its run; `None` when traces are off.
    pub trace: Option<Arc<TaskTrace>>,
}

impl ReadyTask {
    /// Attempt `task` of an agent step, ready now, with its payload; no timeout, untraced.
    pub fn new(task: TaskRef, agent: impl Into<AgentName>, payload: TaskPayload) -> Self {
        ReadyTask {
            key: task.key(),
            task,
            agent: agent.into(),
            payload,
            timeout_ms: 0,
            traceparent: String::new(),
            resends: 0,
            started: None,
            ready_at: Instant::now(),
            trace: None,
        }
    }

    /// The oldest worker protocol that can run it: a map item's manifest carries the item
    /// (`map`), which a worker before [`baton_proto::MAP_ITEMS_PROTOCOL`] would ignore.
    pub fn needs_protocol(&self) -> u32 {
        if self.task.task.item.is_some() {
            baton_proto::MAP_ITEMS_PROTOCOL
        } else {
            0
        }
    }

    pub fn attempt(&self) -> u32 {
        self.task.attempt
    }

    pub fn run_id(&self) -> &str {
        &self.task.run_id
    }

    /// What a span needs of a task sent to a worker; `None` if it was never sent.
    pub fn sent(&self) -> Option<Sent> {
        Some(Sent {
            agent: self.agent.clone(),
            ready_at: self.ready_at,
            started: self.started?,
            trace: self.trace.clone(),
        })
    }

    /// The task as one worker gets it, with `manifest` and only the parts listed.
    pub(super) fn message(&self, manifest: &Arc<Part>, parts: Vec<Arc<Part>>) -> TaskMessage {
        TaskMessage {
            task: self.task.clone(),
            agent: self.agent.clone(),
            manifest: manifest.clone(),
            parts,
            timeout_ms: self.timeout_ms,
            traceparent: self.traceparent.clone(),
        }
    }
}

/// A task as it goes down one worker's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskMessage {
    pub task: TaskRef,
    pub agent: AgentName,
    pub manifest: Arc<Part>,
    /// The parts this worker does not hold yet, each once.
    pub parts: Vec<Arc<Part>>,
    pub timeout_ms: u64,
    pub traceparent: String,
}

impl TaskMessage {
    /// The payload bytes it carries: its manifest and parts.
    pub fn payload_bytes(&self) -> u64 {
        let parts: usize = self.parts.iter().map(|part| part.json.len()).sum();
        (self.manifest.json.len() + parts) as u64
    }
}

/// What the coordinator says to a worker on its stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToWorker {
    Task(TaskMessage),
    /// Stop running this task (by the id the worker knows it by); its answer is not wanted.
    Cancel {
        task_id: String,
        reason: String,
    },
    /// Empty the part cache: the tasks after this assume it is empty.
    ResetPartCache,
    /// This coordinator is going away: connect to the next one, keeping the tasks held.
    Goodbye,
    /// An answer was refused, and why.
    Rejected {
        task_id: String,
        message: String,
    },
}

/// A task a worker holds, as [`super::Hub::sent`] tells it.
#[derive(Debug, Clone)]
pub struct Sent {
    pub agent: AgentName,
    /// When it became ready (queued, or delivered again).
    pub ready_at: Instant,
    /// When it went to the worker.
    pub started: Instant,
    pub trace: Option<Arc<TaskTrace>>,
}

/// A task handed to a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub worker_id: WorkerId,
    pub run_id: RunId,
    /// Its visit key, as the run's tasks are stored under it.
    pub task_key: String,
    /// The task the key names (the key is not parsed back).
    pub task: TaskId,
    pub agent: AgentName,
    /// How long it waited for a worker.
    pub waited: Duration,
}

/// What [`super::Hub::forget`] did: the worker that held the task (and the task), and what its
/// freed slot took next.
#[derive(Debug, Default)]
pub struct Forgotten {
    pub assignments: Vec<Assignment>,
    pub held: Option<(WorkerId, ReadyTask)>,
}
