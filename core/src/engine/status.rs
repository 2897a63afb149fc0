//! How a run and its step visits stand: the run's status, each settled visit's status, and the
//! record of a settled visit the run's history keeps.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::handoff::AgentNotes;
use crate::workflow::StepType;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    #[default]
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl RunStatus {
    /// Every status, in the order lists show them (the CLI's `--status`, the docs, the web UI).
    pub const ALL: [RunStatus; 4] = [
        RunStatus::Running,
        RunStatus::Succeeded,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ];

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
