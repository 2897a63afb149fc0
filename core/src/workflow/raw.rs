//! The workflow document as written. Every field is optional here so that validation, not serde,
//! decides what is missing and can report all of it at once.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Default, Deserialize)]
pub struct RawWorkflow {
    pub id: Option<String>,
    pub description: Option<String>,
    pub max_visits: Option<u32>,
    /// Kept as raw values so that each step is read, and reported on, by itself.
    pub steps: Option<Vec<Value>>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

pub const WORKFLOW_FIELDS: &[&str] = &["id", "description", "max_visits", "steps"];

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RawStep {
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub step_type: Option<String>,
    /// Known, so that it does not land in `unknown`, and read so that it must be a string.
    #[expect(
        dead_code,
        reason = "a step's description is for people; the engine never reads it"
    )]
    pub description: Option<String>,
    pub agent: Option<String>,
    pub next: Option<String>,
    pub end: Option<bool>,
    pub input: Option<String>,
    pub transform: Option<String>,
    pub output: Option<String>,
    pub on_error: Option<String>,
    pub steps: Option<Vec<Value>>,
    pub condition: Option<String>,
    pub then: Option<String>,
    #[serde(rename = "else")]
    pub otherwise: Option<String>,
    pub message: Option<String>,
    pub on_approve: Option<String>,
    pub on_reject: Option<String>,
    pub retry: Option<RawRetry>,
    pub timeout_ms: Option<u64>,
    pub max_visits: Option<u32>,
    pub items: Option<String>,
    pub max_concurrency: Option<u32>,
    /// A count or `"N%"`: read as JSON so that validation can say which it is not.
    pub tolerated_failures: Option<Value>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

pub const STEP_FIELDS: &[&str] = &[
    "id",
    "type",
    "description",
    "agent",
    "next",
    "end",
    "input",
    "transform",
    "output",
    "on_error",
    "steps",
    "condition",
    "then",
    "else",
    "message",
    "on_approve",
    "on_reject",
    "retry",
    "timeout_ms",
    "max_visits",
    "items",
    "max_concurrency",
    "tolerated_failures",
];

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RawRetry {
    pub max_attempts: Option<u32>,
    pub initial_interval_ms: Option<u64>,
    pub backoff_coefficient: Option<f64>,
    pub max_interval_ms: Option<u64>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

pub const RETRY_FIELDS: &[&str] = &[
    "max_attempts",
    "initial_interval_ms",
    "backoff_coefficient",
    "max_interval_ms",
];
