//! What goes into a run and what comes out of it: the events applied to it ([`Event`]), the
//! actions a transition asks of the coordinator ([`Action`]), what an unfinished run waits for
//! ([`Waiting`]) and why an event was refused ([`EngineError`]).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::status::RunStatus;
use crate::handoff::AgentNotes;
use crate::ids::StepId;
use crate::payload::AgentPayload;
use crate::workflow::RetryPolicy;

/// Identifies one dispatch of an agent step: its id and which visit of it this is. A result is
/// accepted only for a task the run is waiting for, so a late answer to an older visit is
/// refused instead of overwriting newer data.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TaskId {
    pub step_id: StepId,
    pub visit: u32,
    /// The item of a map step this task runs, by index. Its step is the map step itself (and
    /// its visit the map's) for an `agent` map, or a step of the map's chain (whose visits are
    /// counted over every item, so that each is unique in the run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<u32>,
}

impl TaskId {
    /// The task of a step visit that is not a map item.
    pub fn new(step_id: impl Into<StepId>, visit: u32) -> Self {
        Self {
            step_id: step_id.into(),
            visit,
            item: None,
        }
    }
}

/// What a person decided at an approval step. It becomes the step's data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub approved: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approver: Option<String>,
}

impl Decision {
    pub fn approve() -> Self {
        Self {
            approved: true,
            comment: None,
            approver: None,
        }
    }

    pub fn reject(comment: impl Into<String>) -> Self {
        Self {
            approved: false,
            comment: Some(comment.into()),
            approver: None,
        }
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a decision is always valid JSON")
    }
}

/// Something that happened to a run, from outside the engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// An agent returned data for a task, and perhaps messages and decisions. The data is
    /// shared, not copied, from the worker's answer to the step's record, the store's write and
    /// the watchers.
    AgentSucceeded {
        task: TaskId,
        data: Arc<Value>,
        #[serde(default, skip_serializing_if = "AgentNotes::is_empty")]
        notes: AgentNotes,
    },
    /// An agent failed a task for good.
    AgentFailed { task: TaskId, error: String },
    /// A person decided an approval step.
    ApprovalDecided { step_id: String, decision: Decision },
    /// Nobody decided visit `visit` of an approval step within its `timeout_ms`: the step fails.
    ApprovalTimedOut { step_id: String, visit: u32 },
    /// The run is to stop now.
    Cancel { reason: String },
    /// The run is to fail now: its stored data cannot be trusted (an integrity failure).
    Halt { error: String },
    /// A failed run is to resume from the step that failed, as a new visit of it: an agent,
    /// transform or approval runs again; a map step runs again only its items that did not
    /// succeed, keeping the results of the others.
    Redrive,
    /// The run is to go on where its walk stopped before a step that runs jq
    /// ([`Action::Continue`]): it enters that step, and stops again before the next such step.
    Continue,
}

/// Something the coordinator must do after a transition.
#[derive(Debug, Clone)]
pub enum Action {
    /// Send an agent step to a worker that serves `agent`.
    Dispatch(AgentTask),
    /// Wait until someone decides the approval step (or, with a `timeout_ms`, until it times
    /// out: then send [`Event::ApprovalTimedOut`]).
    AwaitApproval {
        step_id: Arc<str>,
        visit: u32,
        message: String,
        timeout_ms: Option<u64>,
    },
    /// A task in flight no longer matters (the run was cancelled or failed).
    Abandon(TaskId),
    /// The run ended.
    Finished {
        status: RunStatus,
        error: Option<String>,
    },
    /// The walk stopped before `step_id`, which runs a `jq:` program: apply
    /// [`Event::Continue`] to go on. A top-level step that runs jq is never entered by the
    /// transition that reaches it (a submit, an agent's answer), only in a turn of its own, so
    /// that the coordinator chooses when (fairly between runs) and a run that computes is
    /// stored, listed and cancellable before it does. (A map item's chain is the exception: it
    /// goes on, jq steps included, in the transition of the item's answer.)
    Continue { step_id: Arc<str> },
}

/// An agent step ready for a worker. A map item's payload carries its `map` entry.
#[derive(Debug, Clone)]
pub struct AgentTask {
    pub task: TaskId,
    pub agent: String,
    pub payload: AgentPayload,
    pub retry: Option<RetryPolicy>,
    pub timeout_ms: Option<u64>,
}

/// What an unfinished run is waiting for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    Agent {
        task: TaskId,
        agent: String,
    },
    Approval {
        step_id: Arc<str>,
        message: String,
    },
    /// A step that runs a `jq:` program, waiting for its turn ([`Event::Continue`]).
    Computation {
        step_id: Arc<str>,
    },
}

/// Why an event could not be applied. The run is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("the run has {0} and takes no more events")]
    NotRunning(RunStatus),
    #[error("no task for step \"{}\" (visit {}) is in flight", .0.step_id, .0.visit)]
    UnknownTask(TaskId),
    #[error("step \"{0}\" is not waiting for an approval")]
    NotAwaitingApproval(String),
    #[error("the run has {0}; only a failed run can be retried")]
    NotFailed(RunStatus),
    #[error("the run cannot be retried: it did not fail at a step ({0})")]
    NothingToRedrive(String),
    #[error("the run is not waiting to go on with a computation")]
    NotContinuing,
}
