//! What the coordinator stores besides the engine's own types: encoded with serde as JSON.
//!
//! - [`LoggedEvent`] / [`StoredEvent`]: the event log, agent data by reference.
//! - [`StepState`] and its [`StepStatus`]: the scheduling view of a step, as `GetRun` shows it.
//! - [`TaskEntry`] and its [`TaskState`]: a task in flight with its lease.
//!
//! States are enums whose serde names are the strings stored since the first release, so the
//! stored bytes are the same.

use baton_core::handoff::AgentNotes;
use baton_core::ids::empty_as_none;
use baton_core::{AgentName, Decision, Event, TaskId, WorkerId};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::task_ref::task_key;

/// An event of the log, with the time it was applied at: the engine stamps decisions and
/// handoffs with it, so a replay must apply each event at its original time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoggedEvent {
    /// Milliseconds since the epoch.
    #[serde(default)]
    pub at_ms: i64,
    #[serde(flatten)]
    pub event: StoredEvent,
    /// The `jq:` programs its transition ran, in order: a replay reads their outcomes back
    /// instead of running them again (which would cost their CPU time at every load of the run,
    /// and could end differently near a CPU budget).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jq: Vec<JqRecord>,
    /// How many times its transition's turn of the run's computation went on into another
    /// step that runs jq ([`baton_core::eval::JqRunner::go_on`]): a replay goes on as often.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub went_on: u32,
}

impl LoggedEvent {
    pub fn new(at_ms: i64, event: StoredEvent) -> Self {
        Self {
            at_ms,
            event,
            jq: Vec::new(),
            went_on: 0,
        }
    }
}

/// How one `jq:` program's run ended, as the log keeps it: its output is stored once, in the
/// run's results under `at` (`<step>#<visit>`, `<step>[<item>]#<visit>`, or
/// `<step>#<visit>/items` for a map step's items); an error is kept here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JqRecord {
    pub at: String,
    /// The CPU time it used: what counts against the run's budget.
    #[serde(default)]
    pub cpu_us: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An engine event as stored: an agent's data is in the results, referenced by key, so that it
/// is stored once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum StoredEvent {
    AgentSucceeded {
        task: TaskId,
        result: String,
        worker_id: String,
        /// The agent's messages and decisions, written in the same atomic transition.
        #[serde(default, skip_serializing_if = "AgentNotes::is_empty")]
        notes: AgentNotes,
    },
    AgentFailed {
        task: TaskId,
        error: String,
        worker_id: String,
    },
    ApprovalDecided {
        step_id: String,
        decision: Decision,
    },
    ApprovalTimedOut {
        step_id: String,
        visit: u32,
    },
    Cancel {
        reason: String,
    },
    /// A failed run resumed from the step that failed, at someone's request.
    Redrive {
        /// The principal that asked; `None` without authentication.
        #[serde(
            default,
            deserialize_with = "empty_as_none",
            skip_serializing_if = "Option::is_none"
        )]
        requested_by: Option<String>,
    },
    /// The run went on into a step that runs jq, when its turn came.
    Continue,
    /// The first event of a run created since steps that run jq wait for their turn: a replay
    /// starts it the same way ([`baton_core::Run::start`]). A log that does not begin with it
    /// is a run stored before, replayed as it ran then
    /// ([`baton_core::Run::start_settling_jq_inline`]). Not an engine event.
    Started,
}

impl StoredEvent {
    /// The event as the log keeps it: an agent's data by its result key (the data is stored
    /// once, under that key, by the same transition), with the worker that answered (for a
    /// redrive, `worker_id` is who asked for it). `None`
    /// for [`Event::Halt`], which is never logged: it stops a run whose log cannot be trusted.
    pub fn of(event: &Event, worker_id: &str) -> Option<Self> {
        Some(match event {
            Event::AgentSucceeded { task, notes, .. } => StoredEvent::AgentSucceeded {
                task: task.clone(),
                result: task_key(task),
                worker_id: worker_id.to_owned(),
                notes: notes.clone(),
            },
            Event::AgentFailed { task, error } => StoredEvent::AgentFailed {
                task: task.clone(),
                error: error.clone(),
                worker_id: worker_id.to_owned(),
            },
            Event::ApprovalDecided { step_id, decision } => StoredEvent::ApprovalDecided {
                step_id: step_id.clone(),
                decision: decision.clone(),
            },
            Event::ApprovalTimedOut { step_id, visit } => StoredEvent::ApprovalTimedOut {
                step_id: step_id.clone(),
                visit: *visit,
            },
            Event::Cancel { reason } => StoredEvent::Cancel {
                reason: reason.clone(),
            },
            Event::Redrive => StoredEvent::Redrive {
                requested_by: (!worker_id.is_empty()).then(|| worker_id.to_owned()),
            },
            Event::Continue => StoredEvent::Continue,
            Event::Halt { .. } => return None,
        })
    }

    /// Rebuilds the engine event, fetching an agent's data with `result`. `None` for
    /// [`StoredEvent::Started`], which marks how the run started and applies nothing.
    pub fn to_event(
        &self,
        result: impl Fn(&str) -> Option<Value>,
    ) -> Result<Option<Event>, String> {
        let event = match self {
            StoredEvent::AgentSucceeded {
                task,
                result: key,
                notes,
                ..
            } => Event::AgentSucceeded {
                task: task.clone(),
                data: result(key)
                    .ok_or_else(|| format!("result {key} is missing"))?
                    .into(),
                notes: notes.clone(),
            },
            StoredEvent::AgentFailed { task, error, .. } => Event::AgentFailed {
                task: task.clone(),
                error: error.clone(),
            },
            StoredEvent::ApprovalDecided { step_id, decision } => Event::ApprovalDecided {
                step_id: step_id.clone(),
                decision: decision.clone(),
            },
            StoredEvent::ApprovalTimedOut { step_id, visit } => Event::ApprovalTimedOut {
                step_id: step_id.clone(),
                visit: *visit,
            },
            StoredEvent::Cancel { reason } => Event::Cancel {
                reason: reason.clone(),
            },
            StoredEvent::Redrive { .. } => Event::Redrive,
            StoredEvent::Continue => Event::Continue,
            StoredEvent::Started => return Ok(None),
        };
        Ok(Some(event))
    }
}

/// Where a step stands, as `GetRun` shows it: its task's state while an agent step is in
/// flight, a parallel step's `running`, an approval's `waiting`, then how its last visit ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// Never entered.
    #[default]
    Pending,
    Queued,
    Running,
    /// Its last attempt failed; the next one waits out its backoff.
    Retrying,
    /// An approval waiting for a decision.
    Waiting,
    Succeeded,
    Failed,
    Rejected,
    /// Abandoned when its run stopped.
    Cancelled,
    /// Its failed visit was taken up again by a redrive (until the next visit starts).
    Redriven,
}

impl StepStatus {
    /// Every status, in the order lists show them (the docs, the web UI's legend).
    pub const ALL: [StepStatus; 10] = [
        StepStatus::Pending,
        StepStatus::Queued,
        StepStatus::Running,
        StepStatus::Retrying,
        StepStatus::Waiting,
        StepStatus::Succeeded,
        StepStatus::Failed,
        StepStatus::Rejected,
        StepStatus::Cancelled,
        StepStatus::Redriven,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Pending => "pending",
            StepStatus::Queued => "queued",
            StepStatus::Running => "running",
            StepStatus::Retrying => "retrying",
            StepStatus::Waiting => "waiting",
            StepStatus::Succeeded => "succeeded",
            StepStatus::Failed => "failed",
            StepStatus::Rejected => "rejected",
            StepStatus::Cancelled => "cancelled",
            StepStatus::Redriven => "redriven",
        }
    }
}

impl From<baton_core::StepStatus> for StepStatus {
    fn from(settled: baton_core::StepStatus) -> Self {
        match settled {
            baton_core::StepStatus::Succeeded => StepStatus::Succeeded,
            baton_core::StepStatus::Failed => StepStatus::Failed,
            baton_core::StepStatus::Rejected => StepStatus::Rejected,
            baton_core::StepStatus::Redriven => StepStatus::Redriven,
        }
    }
}

/// A step's state follows its task's while the task is in flight.
impl From<TaskState> for StepStatus {
    fn from(task: TaskState) -> Self {
        match task {
            TaskState::Queued => StepStatus::Queued,
            TaskState::Running => StepStatus::Running,
            TaskState::Retrying => StepStatus::Retrying,
            TaskState::Waiting | TaskState::TimingOut => StepStatus::Waiting,
            TaskState::Continuing => StepStatus::Queued,
        }
    }
}

/// The tokens one call to a model used, as an agent reported it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ModelUsage {
    pub model: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// What one attempt of a step visit used, one entry per call to a model.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AttemptUsage {
    pub visit: u32,
    pub attempt: u32,
    #[serde(flatten)]
    pub usage: ModelUsage,
}

/// One delivery of a step visit to a worker, as it ended: who ran it, when, and how it failed
/// if it did. What the web UI shows of a step's attempts.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub visit: u32,
    pub attempt: u32,
    /// The worker it went to; `None` when it never reached one.
    #[serde(
        default,
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub worker_id: Option<WorkerId>,
    /// When the worker was sent the attempt (ms since the epoch); 0 when unknown (a task given
    /// up after it was lost too often).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub started_ms: i64,
    pub finished_ms: i64,
    /// Why the attempt failed; `None` when it succeeded.
    #[serde(
        default,
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub error: Option<String>,
}

/// How many attempt records a step keeps (the latest): a step retried or looped over many
/// times must not grow its state without bound.
pub const ATTEMPT_RECORDS_KEPT: usize = 20;

/// Appends `records` to `log`, keeping the latest [`ATTEMPT_RECORDS_KEPT`].
pub fn keep_attempts(
    log: &mut Vec<AttemptRecord>,
    records: impl IntoIterator<Item = AttemptRecord>,
) {
    log.extend(records);
    if log.len() > ATTEMPT_RECORDS_KEPT {
        log.drain(..log.len() - ATTEMPT_RECORDS_KEPT);
    }
}

impl AttemptUsage {
    pub fn of(visit: u32, attempt: u32, usage: &[ModelUsage]) -> Vec<AttemptUsage> {
        usage
            .iter()
            .map(|usage| AttemptUsage {
                visit,
                attempt,
                usage: usage.clone(),
            })
            .collect()
    }
}

/// The scheduling view of a step, as `GetRun` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StepState {
    pub status: StepStatus,
    pub visits: u32,
    pub attempts: u32,
    /// The worker running its current attempt, while one does.
    #[serde(
        default,
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub worker_id: Option<WorkerId>,
    /// Why its last visit failed, when it did.
    #[serde(
        default,
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub error: Option<String>,
    /// When its current visit started waiting: queued for a worker, waiting for a decision, or
    /// (a parallel step) its first branch queued; 0 when unknown. Its span starts there.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub since_ms: i64,
    /// The visit `since_ms` belongs to.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub since_visit: u32,
    /// The tokens its attempts used (every visit), recorded when a visit settles. A map
    /// step's items are summed per model in `items`, so that settling one stays O(1).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usage: Vec<AttemptUsage>,
    /// Its latest attempts (every visit), recorded as each one ends; map items are not listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempt_log: Vec<AttemptRecord>,
    /// A map step's items, at its current (or last) visit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<ItemCounts>,
}

/// How a map step's items stand, and the tokens their agents used (summed per model).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ItemCounts {
    pub count: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub running: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usage: Vec<ModelUsage>,
}

impl ItemCounts {
    /// Adds what one item attempt used.
    pub fn add_usage(&mut self, used: &[ModelUsage]) {
        for used in used {
            match self
                .usage
                .iter_mut()
                .find(|total| total.model == used.model)
            {
                Some(total) => {
                    total.prompt_tokens += used.prompt_tokens;
                    total.completion_tokens += used.completion_tokens;
                }
                None => self.usage.push(used.clone()),
            }
        }
    }
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// Where a task in flight is ([`crate::lease`] has the life of a task).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Waiting for a worker, in its holder's queue or due for a claim.
    #[default]
    Queued,
    /// On a worker.
    Running,
    /// Waiting out the backoff before its next attempt; nobody holds it.
    Retrying,
    /// An approval step's timer, waiting for a decision.
    Waiting,
    /// An approval whose timer came due, claimed by a coordinator that is failing the step.
    TimingOut,
    /// A run's walk stopped before a step that runs jq ([`crate::lease::continuation`]):
    /// its holder continues the run when its turn comes; if the holder dies, the timer comes
    /// due and another coordinator does.
    Continuing,
}

/// An agent task that is queued, running or waiting to be retried, with its lease.
///
/// Its `agent` and `due_ms` put it in the agent's timer set ([`crate::store`]): when `due_ms`
/// passes, any coordinator may claim it. Its holder keeps pushing `due_ms` out while it holds
/// the task (queued in its hub, or running on one of its workers); a holder that dies stops,
/// and the task is given out again with `attempt` raised.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TaskEntry {
    pub agent: AgentName,
    pub state: TaskState,
    /// The worker running it, as its holder last wrote down (a lease renewal, a takeover, a
    /// drain); `None` while it is queued, or not written down yet.
    #[serde(
        default,
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub worker_id: Option<WorkerId>,
    /// The principal that worker connected as (`None` without authentication, and in entries
    /// written before principals were recorded): a reconnecting worker takes the task over
    /// only under the same worker id *and* principal, so a worker of another principal that
    /// names the same id gains nothing.
    #[serde(
        default,
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub principal: Option<String>,
    /// Which delivery of the step visit this is, from 1: the fencing token of its answer.
    #[serde(default)]
    pub attempt: u32,
    /// The coordinator holding the task; `None` while nobody does (due now, or retrying).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// When the holder's lease runs out, or the retry is due (ms since the epoch).
    #[serde(default)]
    pub due_ms: i64,
    /// Attempts that failed (the agent's error, or a timeout): what the retry policy counts.
    #[serde(default)]
    pub failures: u32,
    /// Deliveries lost with their worker or coordinator: redelivered, not counted as failures.
    #[serde(default)]
    pub lost: u32,
    /// The last failure, while it is retried.
    #[serde(
        default,
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub error: Option<String>,
    /// The tokens the failed attempts used, carried to the step when its visit settles.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usage: Vec<AttemptUsage>,
    /// The failed attempts of the visit, carried to the step when its visit settles.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempt_log: Vec<AttemptRecord>,
}

impl TaskEntry {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a task entry is JSON")
    }
}

#[cfg(test)]
mod tests;
