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

/// The id a worker sees: `"<run>/<step>#<visit>"`.
pub fn task_id(run_id: &str, task: &TaskId) -> String {
    format!("{run_id}/{}", task_key(task))
}

/// Splits a worker-facing task id back into run id and task.
pub fn parse_task_id(task_id: &str) -> Option<(&str, TaskId)> {
    let (run_id, key) = task_id.split_once('/')?;
    let (step_id, visit) = key.rsplit_once('#')?;
    let visit = visit.parse().ok()?;
    Some((
        run_id,
        TaskId {
            step_id: Arc::from(step_id),
            visit,
        },
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
}

/// An agent task that is queued or running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEntry {
    pub agent: String,
    /// queued or running.
    pub state: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub worker_id: String,
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
        let id = task_id("0193-abc", &task);
        assert_eq!(id, "0193-abc/parallel-tests#12");
        assert_eq!(parse_task_id(&id), Some(("0193-abc", task)));
        assert_eq!(parse_task_id("no-slash"), None);
        assert_eq!(parse_task_id("run/step#x"), None);
    }
}
