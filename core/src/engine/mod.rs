//! The engine: a pure state machine over one run.
//!
//! `(Run, Event) -> (Run, [Action])`, with no clock and no I/O. The coordinator persists each
//! transition and carries out its actions (send a task to a worker, wait for a person, report the
//! end); feeding the same events to [`Run::replay`] rebuilds the same run, so any coordinator can
//! pick a run up from its stored events.
//!
//! - `mod.rs`: the run and what goes in and out of it ([`Run`], [`Event`], [`Action`]).
//! - [`transition`]: entering and settling steps, the body of [`Run::apply`].
//! - [`handoffs`]: what agents hand on to the next agent step: decisions, messages, handoffs.
//! - [`route`]: where a settled step leads (pure, per step).
//! - [`parallel`]: parallel steps: branches started, filed and merged into the step's data.
//! - [`map`]: map steps: items started up to the cap, chains run per item, outcomes filed.
//! - [`redrive`]: a failed run resumed from the step that failed.

mod handoffs;
mod map;
mod parallel;
mod redrive;
mod route;
mod transition;

use std::sync::Arc;

use imbl::{OrdMap, Vector};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::context::Context;
use crate::handoff::{AgentNotes, DecisionRecord, Handoff, Source};
use crate::messages::{Message, MessageUpdate};
use crate::payload::{AgentPayload, ErrorInfo};
use crate::workflow::{RetryPolicy, StepIndex, StepType, Workflow};

/// Identifies one dispatch of an agent step: its id and which visit of it this is. A result is
/// accepted only for a task the run is waiting for, so a late answer to an older visit is
/// refused instead of overwriting newer data.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TaskId {
    pub step_id: Arc<str>,
    pub visit: u32,
    /// The item of a map step this task runs, by index. Its step is the map step itself (and
    /// its visit the map's) for an `agent` map, or a step of the map's chain (whose visits are
    /// counted over every item, so that each is unique in the run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<u32>,
}

impl TaskId {
    /// The task of a step visit that is not a map item.
    pub fn new(step_id: impl Into<Arc<str>>, visit: u32) -> Self {
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
    /// An agent returned data for a task, and perhaps messages and decisions.
    AgentSucceeded {
        task: TaskId,
        data: Value,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl RunStatus {
    pub fn is_terminal(self) -> bool {
        self != RunStatus::Running
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Succeeded,
    Failed,
    /// An approval that was turned down.
    Rejected,
    /// A failed visit a redrive took up again: the next visit of the step resumes it.
    Redriven,
}

impl StepStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Succeeded => "succeeded",
            StepStatus::Failed => "failed",
            StepStatus::Rejected => "rejected",
            StepStatus::Redriven => "redriven",
        }
    }
}

/// One settled visit of a step, kept in the run's history (branches included).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepRecord {
    pub step_id: Arc<str>,
    pub step_type: StepType,
    pub visit: u32,
    /// The parallel step this was a branch of, or the map step whose item it ran.
    pub parent: Option<Arc<str>>,
    /// The map item it ran, by index.
    pub item: Option<u32>,
    pub status: StepStatus,
    pub data: Option<Arc<Value>>,
    pub error: Option<Arc<str>>,
    /// Where routing went next (top-level steps only).
    pub next: Option<Arc<str>>,
    /// The messages and decisions an agent returned with its data, as it returned them.
    pub notes: Option<Arc<AgentNotes>>,
    /// When it settled: the time of the event applied (ms since the epoch; 0 when unknown).
    pub at_ms: i64,
}

impl StepRecord {
    /// The SHA-256 of the settled visit's outcome in canonical JSON (RFC 8785):
    /// `{"status", "data", "error", "notes", "at_ms"}`, absent members as `null`, large integers
    /// kept exact ([`crate::integrity::ExactNumbers`]). It is what the run's state chain records
    /// for this visit ([`crate::integrity`]); the time is in it because decisions and handoffs
    /// are stamped with it.
    pub fn result_sha256(&self) -> String {
        use crate::integrity::{ExactNumbers, canonical_object_sha256};
        // The members in canonical (sorted) order.
        canonical_object_sha256(|members| {
            members.member("at_ms", &self.at_ms)?;
            members.member("data", &self.data.as_deref().map(ExactNumbers))?;
            members.member("error", &self.error.as_deref())?;
            members.member("notes", &self.notes.as_deref())?;
            members.member("status", &self.status)
        })
    }
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

/// Work the run has started and not yet settled, by step.
#[derive(Debug, Clone)]
enum Pending {
    Agent {
        visit: u32,
        /// Kept so that the payload can be rebuilt after a replay.
        error: Option<ErrorInfo>,
        handoff: Option<Arc<serde_json::value::RawValue>>,
    },
    Approval {
        visit: u32,
    },
    // Boxed, as the parallel step's below: `pending` is a persistent map, whose nodes hold 64
    // entries inline and are copied whole by each change to a shared one. An unboxed map run
    // made every entry 312 bytes, and settling a chain's step copied 20 KB (issue 20).
    Map(Box<map::MapRun>),
    Parallel(Box<ParallelRun>),
}

/// A parallel step waiting for its branches.
#[derive(Debug, Clone)]
struct ParallelRun {
    visit: u32,
    /// One slot per branch, in workflow order.
    outcomes: Vector<Option<BranchOutcome>>,
    /// What each agent branch handed on: merged in branch order when the last settles.
    handed: Vector<Option<Handed>>,
    remaining: usize,
}

/// What a branch handed on: each agent step visit's source record and messages (ids assigned),
/// one for an agent branch, in branch order for a nested parallel step's agents.
#[derive(Debug, Clone, Default)]
struct Handed {
    entries: Vec<(Arc<Source>, Vec<MessageUpdate>)>,
}

/// The run's message history, with its JSON shared by every payload until it changes.
#[derive(Debug, Clone)]
pub struct MessageHistory {
    messages: Arc<Vec<Message>>,
    json: Arc<Value>,
}

impl MessageHistory {
    fn new(messages: Vec<Message>) -> Self {
        let json = Arc::new(serde_json::to_value(&messages).expect("messages are JSON"));
        Self {
            messages: Arc::new(messages),
            json,
        }
    }

    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// The history as agents receive it, a JSON array.
    pub fn json(&self) -> &Arc<Value> {
        &self.json
    }
}

impl Default for MessageHistory {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

/// How one branch settled: its data, or its error.
type BranchOutcome = Result<Arc<Value>, Arc<str>>;

/// Where a run's walk stopped before a step that runs jq, with what entering it needs: the
/// error that routed there (`on_error`), and a redrive's exemption from the visit limit and
/// kept map outcomes, when a redrive's walk stopped.
#[derive(Debug, Clone)]
struct Continuation {
    step: StepIndex,
    error: Option<ErrorInfo>,
    redriving: bool,
    kept: Option<(StepIndex, Vector<Option<BranchOutcome>>)>,
}

pub use map::MapProgress;

/// One run of a workflow. Immutable: [`Run::apply`] returns a new run.
#[derive(Debug, Clone)]
pub struct Run {
    workflow: Arc<Workflow>,
    context: Context,
    status: RunStatus,
    error: Option<String>,
    visits: OrdMap<StepIndex, u32>,
    pending: OrdMap<StepIndex, Pending>,
    history: Vector<StepRecord>,
    messages: MessageHistory,
    decisions: Vector<Arc<DecisionRecord>>,
    handoffs: Vector<Arc<Handoff>>,
    /// The agent step visits that hand over to the next agent step (several after a merge).
    sources: Arc<Vec<Arc<Source>>>,
    /// When the event being applied happened (ms since the epoch; 0 when unknown).
    now_ms: i64,
    /// Where a failed run would resume ([`Event::Redrive`]), if it failed at a step.
    redrive: Option<redrive::Resume>,
    /// Where the walk stopped before a step that runs jq, until [`Event::Continue`].
    continuation: Option<Continuation>,
    /// Whether steps that run jq wait for [`Event::Continue`]: false only for a run stored
    /// before they did, replayed as it ran ([`Run::start_settling_jq_inline`]).
    yields: bool,
}

/// The outcome of a transition: the new run and what to do about it.
#[derive(Debug, Clone)]
pub struct Transition {
    pub run: Run,
    pub actions: Vec<Action>,
}

impl Run {
    /// Starts a run at the workflow's entry step. The walk stops before the first step that
    /// runs jq ([`Action::Continue`]).
    pub fn start(workflow: Arc<Workflow>, input: Value) -> Transition {
        Run::start_with(workflow, input, true)
    }

    /// [`Run::start`] as the engine did before steps that run jq waited for
    /// [`Event::Continue`]: every transition walks through them. Only to replay a run stored
    /// then, exactly as it ran.
    pub fn start_settling_jq_inline(workflow: Arc<Workflow>, input: Value) -> Transition {
        Run::start_with(workflow, input, false)
    }

    fn start_with(workflow: Arc<Workflow>, input: Value, yields: bool) -> Transition {
        let run = Run {
            context: Context::new(input),
            workflow,
            status: RunStatus::Running,
            error: None,
            visits: OrdMap::new(),
            pending: OrdMap::new(),
            history: Vector::new(),
            messages: MessageHistory::default(),
            decisions: Vector::new(),
            handoffs: Vector::new(),
            sources: Arc::default(),
            now_ms: 0,
            redrive: None,
            continuation: None,
            yields,
        };
        transition::start(run)
    }

    /// Applies one event. On error the run is unchanged and nothing is to be done.
    pub fn apply(&self, event: Event) -> Result<Transition, EngineError> {
        transition::apply(self, event, 0)
    }

    /// Applies one event that happened at `at_ms` (ms since the epoch): the time of the
    /// decisions and handoffs it records.
    pub fn apply_at(&self, event: Event, at_ms: i64) -> Result<Transition, EngineError> {
        transition::apply(self, event, at_ms)
    }

    /// Rebuilds a run from its input and the events applied to it, in order.
    pub fn replay(
        workflow: Arc<Workflow>,
        input: Value,
        events: impl IntoIterator<Item = Event>,
    ) -> Result<Run, (usize, EngineError)> {
        Run::replay_at(workflow, input, events.into_iter().map(|event| (event, 0)))
    }

    /// [`Run::replay`] of events with the times they were applied at ([`Run::apply_at`]).
    pub fn replay_at(
        workflow: Arc<Workflow>,
        input: Value,
        events: impl IntoIterator<Item = (Event, i64)>,
    ) -> Result<Run, (usize, EngineError)> {
        events.into_iter().enumerate().try_fold(
            Run::start(workflow, input).run,
            |run, (i, (event, at_ms))| {
                run.apply_at(event, at_ms)
                    .map(|t| t.run)
                    .map_err(|error| (i, error))
            },
        )
    }

    pub fn workflow(&self) -> &Arc<Workflow> {
        &self.workflow
    }

    pub fn context(&self) -> &Context {
        &self.context
    }

    pub fn status(&self) -> RunStatus {
        self.status
    }

    /// Why the run failed or was cancelled.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Every settled step visit, in the order they settled.
    pub fn history(&self) -> &Vector<StepRecord> {
        &self.history
    }

    /// The step visits settled after the first `settled`, in order: what a transition added.
    /// Walked from the end, so it costs what was added, where `history().iter().skip(n)` would
    /// walk the n records before them (a map of 10,000 items would walk its whole history for
    /// every item) and `Vector::skip` built a new vector at every step (issue 20).
    pub fn history_since(&self, settled: usize) -> Vec<&StepRecord> {
        let added = self.history.len().saturating_sub(settled);
        let mut records: Vec<&StepRecord> = self.history.iter().rev().take(added).collect();
        records.reverse();
        records
    }

    /// The run's message history.
    pub fn messages(&self) -> &MessageHistory {
        &self.messages
    }

    /// Every decision agents reported, in the order they were accepted.
    pub fn decisions(&self) -> &Vector<Arc<DecisionRecord>> {
        &self.decisions
    }

    /// Every handoff into an agent step, in the order the steps were entered.
    pub fn handoffs(&self) -> &Vector<Arc<Handoff>> {
        &self.handoffs
    }

    /// How many times the step has been entered.
    pub fn visits(&self, step_id: &str) -> u32 {
        self.workflow
            .index_of(step_id)
            .and_then(|index| self.visits.get(&index).copied())
            .unwrap_or(0)
    }

    /// The agent tasks in flight, rebuilt exactly as they were dispatched: after a replay, the
    /// coordinator sends these again.
    pub fn pending_tasks(&self) -> Vec<AgentTask> {
        self.pending
            .iter()
            .flat_map(|(&index, pending)| match pending {
                Pending::Map(map) => self.item_tasks(index, map),
                _ => self
                    .pending_agent_task(index, pending)
                    .into_iter()
                    .collect(),
            })
            .collect()
    }

    /// One agent task in flight, rebuilt as it was dispatched, if the run waits for it: what a
    /// coordinator delivers again, without building every other pending task's payload.
    pub fn pending_task(&self, task: &TaskId) -> Option<AgentTask> {
        if task.item.is_some() {
            return self.pending_item_task(task);
        }
        let index = self.workflow.index_of(&task.step_id)?;
        let rebuilt = self.pending_agent_task(index, self.pending.get(&index)?)?;
        (rebuilt.task == *task).then_some(rebuilt)
    }

    fn pending_agent_task(&self, index: StepIndex, pending: &Pending) -> Option<AgentTask> {
        let Pending::Agent {
            visit,
            error,
            handoff,
        } = pending
        else {
            return None;
        };
        let step = self.workflow.step(index);
        let crate::workflow::StepKind::Agent { agent } = &step.kind else {
            return None;
        };
        // The context and the messages have not changed since the dispatch: top-level steps
        // settle one at a time, and a parallel step's branches all started from the context as
        // it is now (their messages merge when the last branch settles).
        let reference = step.input.as_ref().and_then(|key| {
            self.context
                .data(key)
                .map(|data| (key.clone(), data.clone()))
        });
        Some(AgentTask {
            task: TaskId::new(step.id.clone(), *visit),
            agent: agent.clone(),
            payload: AgentPayload {
                context: self.context.clone(),
                reference,
                error: error.clone(),
                messages: self.messages.json.clone(),
                handoff: handoff.clone(),
                map: None,
            },
            retry: step.retry.clone(),
            timeout_ms: step.timeout_ms,
        })
    }

    /// The step the run's walk stopped before, waiting for [`Event::Continue`].
    pub fn continuation(&self) -> Option<&Arc<str>> {
        let continuation = self.continuation.as_ref()?;
        Some(&self.workflow.step(continuation.step).id)
    }

    /// Agent tasks in flight, approvals awaited and a computation waiting for its turn, in
    /// workflow order.
    pub fn waiting(&self) -> Vec<Waiting> {
        let computing = self.continuation().map(|step_id| Waiting::Computation {
            step_id: step_id.clone(),
        });
        self.pending
            .iter()
            .flat_map(|(&index, pending)| {
                let step = self.workflow.step(index);
                match (pending, &step.kind) {
                    (Pending::Map(map), _) => self.items_waiting(map),
                    (Pending::Agent { visit, .. }, crate::workflow::StepKind::Agent { agent }) => {
                        vec![Waiting::Agent {
                            task: TaskId::new(step.id.clone(), *visit),
                            agent: agent.clone(),
                        }]
                    }
                    (
                        Pending::Approval { .. },
                        crate::workflow::StepKind::Approval { message, .. },
                    ) => vec![Waiting::Approval {
                        step_id: step.id.clone(),
                        message: message.clone(),
                    }],
                    _ => Vec::new(),
                }
            })
            .chain(computing)
            .collect()
    }

    /// The progress of each map step under way, in workflow order.
    pub fn map_progress(&self) -> Vec<MapProgress> {
        self.pending
            .iter()
            .filter_map(|(&index, pending)| match pending {
                Pending::Map(map) => Some(map.progress(&self.workflow.step(index).id)),
                _ => None,
            })
            .collect()
    }

    /// Whether [`Event::Redrive`] would resume the run, and at which step; or why not.
    pub fn redrive_target(&self) -> Result<Arc<str>, EngineError> {
        redrive::target(self)
    }
}
