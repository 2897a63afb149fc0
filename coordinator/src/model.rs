//! What the coordinator stores besides the engine's own types: encoded with serde as JSON.

use std::sync::Arc;

use baton_core::handoff::AgentNotes;
use baton_core::{Decision, Event, TaskId};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Key of a task and of a result: `"<step>#<visit>"`.
pub fn task_key(task: &TaskId) -> String {
    format!("{}#{}", task.step_id, task.visit)
}

/// The id a worker sees: `"<run>/<step>#<visit>@<attempt>"`. The attempt is the fencing token:
/// an answer is accepted only for the task's current attempt.
pub fn task_id(run_id: &str, task: &TaskId, attempt: u32) -> String {
    format!("{run_id}/{}@{attempt}", task_key(task))
}

/// Splits a worker-facing task id back into run id, task and attempt.
pub fn parse_task_id(task_id: &str) -> Option<(&str, TaskId, u32)> {
    let (run_id, key) = task_id.split_once('/')?;
    let (step_id, visit) = key.rsplit_once('#')?;
    let (visit, attempt) = visit.split_once('@')?;
    let visit = visit.parse().ok()?;
    let attempt = attempt.parse().ok()?;
    Some((
        run_id,
        TaskId {
            step_id: Arc::from(step_id),
            visit,
        },
        attempt,
    ))
}

/// An event of the log, with the time it was applied at: the engine stamps decisions and
/// handoffs with it, so a replay must apply each event at its original time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoggedEvent {
    /// Milliseconds since the epoch.
    #[serde(default)]
    pub at_ms: i64,
    #[serde(flatten)]
    pub event: StoredEvent,
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
}

impl StoredEvent {
    /// Rebuilds the engine event, fetching an agent's data with `result`.
    pub fn to_event(&self, result: impl Fn(&str) -> Option<Value>) -> Result<Event, String> {
        Ok(match self {
            StoredEvent::AgentSucceeded {
                task,
                result: key,
                notes,
                ..
            } => Event::AgentSucceeded {
                task: task.clone(),
                data: result(key).ok_or_else(|| format!("result {key} is missing"))?,
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
        })
    }
}

/// The scheduling view of a step, as `GetRun` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StepState {
    /// pending, queued, running, waiting, succeeded, failed or rejected.
    pub status: String,
    pub visits: u32,
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub worker_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// When its current visit started waiting: queued for a worker, waiting for a decision, or
    /// (a parallel step) its first branch queued; 0 when unknown. Its span starts there.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub since_ms: i64,
    /// The visit `since_ms` belongs to.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub since_visit: u32,
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// An agent task that is queued, running or waiting to be retried, with its lease.
///
/// Its `agent` and `due_ms` put it in the agent's timer set ([`crate::store`]): when `due_ms`
/// passes, any coordinator may claim it. Its holder keeps pushing `due_ms` out while it holds
/// the task (queued in its hub, or running on one of its workers); a holder that dies stops,
/// and the task is given out again with `attempt` raised.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TaskEntry {
    pub agent: String,
    /// queued, running or retrying (waiting out its backoff).
    pub state: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub worker_id: String,
    /// Which delivery of the step visit this is, from 1: the fencing token of its answer.
    #[serde(default)]
    pub attempt: u32,
    /// The coordinator holding the task; empty while nobody does (due now, or retrying).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
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
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

impl TaskEntry {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a task entry is JSON")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn logged_events_round_trip_and_old_entries_read_with_no_time() {
        let logged = LoggedEvent {
            at_ms: 1_795_428_000_000,
            event: StoredEvent::AgentSucceeded {
                task: TaskId {
                    step_id: "plan".into(),
                    visit: 1,
                },
                result: "plan#1".into(),
                worker_id: "w1".into(),
                notes: AgentNotes::from_json(br#"{"decisions": [{"summary": "s"}]}"#).unwrap(),
            },
        };
        let bytes = serde_json::to_vec(&logged).unwrap();
        assert_eq!(
            serde_json::from_slice::<LoggedEvent>(&bytes).unwrap(),
            logged
        );
        let old = json!({"event": "cancel", "reason": "stop"}).to_string();
        let read: LoggedEvent = serde_json::from_str(&old).unwrap();
        assert_eq!(read.at_ms, 0);
        assert_eq!(
            read.event,
            StoredEvent::Cancel {
                reason: "stop".into()
            }
        );
    }

    #[test]
    fn task_ids_round_trip_even_with_hyphens_and_hashes() {
        let task = TaskId {
            step_id: "parallel-tests".into(),
            visit: 12,
        };
        let id = task_id("0193-abc", &task, 3);
        assert_eq!(id, "0193-abc/parallel-tests#12@3");
        assert_eq!(parse_task_id(&id), Some(("0193-abc", task, 3)));
        assert_eq!(parse_task_id("no-slash"), None);
        assert_eq!(parse_task_id("run/step#x@1"), None);
        assert_eq!(parse_task_id("run/step#1"), None, "the attempt is required");
        assert_eq!(parse_task_id("run/step#1@x"), None);
    }
}
