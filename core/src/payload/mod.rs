//! What an agent receives: the spec's Method 1 and Method 2 payload.
//!
//! ```text
//! { "input": <run input>, "context": { <key>: <data>, ... }, "<ref>": <data of step.input> }
//! ```
//! plus `"error": {"step", "message"}` when the step was reached through another step's
//! `on_error`, then `"messages"` (the run's message history, always) and `"handoff"` (the record
//! of the agents that handed over, when there were any) and, for a map step's item, `"map"`:
//! `{"step", "item", "index", "count"}`. The payload holds a context snapshot, not a copy: it is serialised straight from
//! the shared results.
//!
//! - `manifest`: the payload by reference, each part named by its SHA-256 ([`Manifest`]), and its
//!   parts spliced back together ([`assemble`]).

use std::sync::Arc;

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::context::Context;

mod manifest;
pub use manifest::{
    INLINE_MARK, INLINE_MAX_BYTES, LISTING_ENTRY_BYTES, ListingChange, Manifest, MissingPart,
    RawJson, assemble, assemble_with_context, inline_json, inline_reference, listing_bytes,
};

/// Top-level keys of the agent payload that Baton owns; no step id or alias may take them.
/// `messages` and `handoff` are kept for message history and handoff records, `map` for the
/// item a map step's agent runs.
pub const RESERVED_KEYS: &[&str] = &["input", "context", "error", "messages", "handoff", "map"];

/// The failure that sent a run to an `on_error` step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorInfo {
    /// The step that failed.
    pub step: Arc<str>,
    pub message: Arc<str>,
}

/// The input of one agent step.
#[derive(Debug, Clone)]
pub struct AgentPayload {
    pub context: Context,
    /// `step.input` and the data it names (Method 2).
    pub reference: Option<(Arc<str>, Arc<Value>)>,
    pub error: Option<ErrorInfo>,
    /// The run's message history, a JSON array (shared: one `Arc` per version of the history).
    pub messages: Arc<Value>,
    /// The handoff record of this step visit (see [`crate::handoff::Handoff`]), as JSON: it is
    /// written once and copied into the payload as it is.
    pub handoff: Option<Arc<RawValue>>,
    /// For a map step's item: `{"step", "item", "index", "count"}`.
    pub map: Option<Arc<Value>>,
}

impl AgentPayload {
    /// The payload as a JSON value (copies; for tests and small payloads).
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a payload is always valid JSON")
    }

    /// The payload as JSON bytes.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a payload is always valid JSON")
    }
}

impl Serialize for AgentPayload {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("input", self.context.input().as_ref())?;
        if let Some((key, data)) = &self.reference {
            map.serialize_entry(key.as_ref(), data.as_ref())?;
        }
        map.serialize_entry("context", &self.context.visible_serializer())?;
        if let Some(error) = &self.error {
            map.serialize_entry("error", error)?;
        }
        map.serialize_entry("messages", self.messages.as_ref())?;
        if let Some(handoff) = &self.handoff {
            map.serialize_entry("handoff", handoff.as_ref())?;
        }
        if let Some(item) = &self.map {
            map.serialize_entry("map", item.as_ref())?;
        }
        map.end()
    }
}
