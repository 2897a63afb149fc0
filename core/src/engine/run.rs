//! The run: its state ([`Run`]), what it reads out (its history, what it waits for, the tasks
//! in flight rebuilt as dispatched) and what it keeps to go on later: where its walk stopped
//! before a computation ([`Continuation`]) and where a failed run would resume ([`Resume`]).
//!
//! The transitions that change it are [`super::transition`]'s and the modules beside it; the
//! entry points ([`Run::start`], [`Run::apply`], [`Run::replay`]) are the engine's own.

use std::sync::Arc;

use imbl::{OrdMap, Vector};
use serde_json::Value;

use super::events::{Action, AgentTask, EngineError, TaskId, Waiting};
use super::outcome::{BranchOutcome, Outcome};
use super::pending::{MapProgress, Pending};
use super::status::{RunStatus, StepRecord};
use crate::context::Context;
use crate::handoff::{DecisionRecord, Handoff, Source};
use crate::messages::Message;
use crate::payload::{AgentPayload, ErrorInfo};
use crate::workflow::{StepIndex, StepKind, Workflow};

/// One run of a workflow. Immutable: [`Run::apply`] returns a new run.
#[derive(Debug, Clone)]
pub struct Run {
    pub(super) workflow: Arc<Workflow>,
    pub(super) context: Context,
    pub(super) status: RunStatus,
    pub(super) error: Option<String>,
    pub(super) visits: OrdMap<StepIndex, u32>,
    pub(super) pending: OrdMap<StepIndex, Pending>,
    pub(super) history: Vector<StepRecord>,
    pub(super) messages: MessageHistory,
    pub(super) decisions: Vector<Arc<DecisionRecord>>,
    pub(super) handoffs: Vector<Arc<Handoff>>,
    /// The agent step visits that hand over to the next agent step (several after a merge).
    pub(super) sources: Arc<Vec<Arc<Source>>>,
    /// When the event being applied happened (ms since the epoch; 0 when unknown).
    pub(super) now_ms: i64,
    /// Where a failed run would resume ([`super::Event::Redrive`]), if it failed at a step.
    pub(super) redrive: Option<Resume>,
    /// Where the walk stopped before a step that runs jq, until [`super::Event::Continue`].
    pub(super) continuation: Option<Continuation>,
    /// Whether steps that run jq wait for [`super::Event::Continue`]: false only for a run stored
    /// before they did, replayed as it ran ([`Run::start_settling_jq_inline`]).
    pub(super) yields: bool,
}

/// The outcome of a transition: the new run and what to do about it.
#[derive(Debug, Clone)]
pub struct Transition {
    pub run: Run,
    pub actions: Vec<Action>,
}

impl Run {
    /// A run of `workflow` on `input` before anything happened: no step entered yet.
    pub(super) fn new(workflow: Arc<Workflow>, input: Value, yields: bool) -> Run {
        Run {
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
        }
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
        let StepKind::Agent { agent } = &step.kind else {
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

    /// The step the run's walk stopped before, waiting for [`super::Event::Continue`].
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
                    (Pending::Agent { visit, .. }, StepKind::Agent { agent }) => {
                        vec![Waiting::Agent {
                            task: TaskId::new(step.id.clone(), *visit),
                            agent: agent.clone(),
                        }]
                    }
                    (Pending::Approval { .. }, StepKind::Approval { message, .. }) => {
                        vec![Waiting::Approval {
                            step_id: step.id.clone(),
                            message: message.clone(),
                        }]
                    }
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

    /// Whether [`super::Event::Redrive`] would resume the run, and at which step; or why not.
    pub fn redrive_target(&self) -> Result<Arc<str>, EngineError> {
        if self.status != RunStatus::Failed {
            return Err(EngineError::NotFailed(self.status));
        }
        let resume = self.redrive.as_ref().ok_or_else(|| {
            EngineError::NothingToRedrive(self.error.clone().unwrap_or_else(|| "no error".into()))
        })?;
        Ok(self.workflow.step(resume.step).id.clone())
    }
}

/// Where a run's walk stopped before a step that runs jq, with what entering it needs: the
/// error that routed there (`on_error`), and a redrive's exemption from the visit limit and
/// kept map outcomes, when a redrive's walk stopped.
#[derive(Debug, Clone)]
pub(super) struct Continuation {
    pub(super) step: StepIndex,
    pub(super) error: Option<ErrorInfo>,
    pub(super) redriving: bool,
    pub(super) kept: Option<(StepIndex, Vector<Option<BranchOutcome>>)>,
}

/// The run's message history, with its JSON shared by every payload until it changes.
#[derive(Debug, Clone)]
pub struct MessageHistory {
    messages: Arc<Vec<Message>>,
    json: Arc<Value>,
}

impl MessageHistory {
    pub(super) fn new(messages: Vec<Message>) -> Self {
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

/// Where a failed run resumes.
#[derive(Debug, Clone)]
pub(super) struct Resume {
    pub(super) step: StepIndex,
    /// Why the run came to the step (through `on_error`): the step receives it again.
    pub(super) error: Option<ErrorInfo>,
    /// A map or parallel step's data at the visit that failed.
    pub(super) kept: Option<Arc<Value>>,
}

impl Resume {
    /// Where a run that failed at step `index` (settled with `outcome`, entered with `error`)
    /// would resume.
    pub(super) fn at(index: StepIndex, outcome: &Outcome, error: Option<ErrorInfo>) -> Self {
        let kept = match outcome {
            Outcome::Merged { data, .. } => Some(data.clone()),
            _ => None,
        };
        Resume {
            step: index,
            error,
            kept,
        }
    }
}
