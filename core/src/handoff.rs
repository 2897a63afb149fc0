//! What agents hand on besides their data: messages, decisions, and the handoff record.
//!
//! An agent's result may carry [`AgentNotes`]: messages for the run's history (merged with
//! [`crate::messages::add_messages`]) and the decisions it took. The engine records each
//! decision with its agent, step, visit and the transition's time ([`DecisionRecord`]), and at
//! every transition into an agent step writes a [`Handoff`]: which agents handed over (several
//! after a parallel merge), the decisions they took, and the keys under which those decisions
//! and messages are kept. The target agent receives it under the payload key `handoff`.
//!
//! Timestamps come from the event that caused the transition (the coordinator's clock when it
//! accepted the result), never from the engine, so replaying a run rebuilds the same records.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::messages::MessageUpdate;

/// A decision as an agent reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewDecision {
    pub summary: String,
    #[serde(default)]
    pub rationale: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub related_artifacts: Vec<String>,
}

/// What an agent returned besides its data.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentNotes {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<MessageUpdate>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<NewDecision>,
}

impl AgentNotes {
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty() && self.decisions.is_empty()
    }

    /// Reads `{"messages": [...], "decisions": [...]}` (either may be absent), naming the JSON
    /// path of the first problem.
    pub fn from_json(bytes: &[u8]) -> Result<Self, String> {
        let mut deserializer = serde_json::Deserializer::from_slice(bytes);
        serde_path_to_error::deserialize(&mut deserializer)
            .map_err(|e| format!("{}: {}", e.path(), e.inner()))
    }
}

/// A decision as the run keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRecord {
    /// `<step>#<visit>/<n>`: unique in the run, and the same on every replay.
    pub key: String,
    pub agent: String,
    pub step_id: String,
    pub visit: u32,
    pub summary: String,
    pub rationale: String,
    /// RFC 3339, UTC: when the coordinator accepted the result that carried it.
    pub timestamp: String,
    pub related_artifacts: Vec<String>,
}

impl DecisionRecord {
    /// The text embedded for search.
    pub fn text(&self) -> String {
        if self.rationale.is_empty() {
            self.summary.clone()
        } else {
            format!("{}: {}", self.summary, self.rationale)
        }
    }

    /// How a handoff's `memory_refs` names this decision.
    pub fn reference(&self) -> String {
        format!("decision:{}", self.key)
    }
}

/// An agent step visit that handed work on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Source {
    pub agent: String,
    pub step_id: Arc<str>,
    pub visit: u32,
    /// The map item it ran, by index.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item: Option<u32>,
    pub decisions: Vec<Arc<DecisionRecord>>,
    /// Ids of the messages it added or replaced.
    pub message_ids: Vec<String>,
}

/// One handoff into an agent step, as the target agent receives it under `handoff`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Handoff {
    /// The agent that handed over when there is exactly one; `null` after a parallel merge
    /// (see `source_agents`).
    pub source_agent: Option<String>,
    /// Every agent that handed over, in workflow (branch) order.
    pub source_agents: Vec<String>,
    pub target_agent: String,
    pub step_id: Arc<str>,
    pub visit: u32,
    /// The map item the target runs, by index.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item: Option<u32>,
    /// The decisions the sources took, in source order.
    pub decisions: Vec<Arc<DecisionRecord>>,
    /// Keys of the stored decisions (`decision:<key>`) and messages (`message:<id>`).
    pub memory_refs: Vec<String>,
    /// RFC 3339, UTC; `null` if the transition carried no time.
    pub timestamp: Option<String>,
}

impl Handoff {
    pub fn new(
        sources: &[Arc<Source>],
        target_agent: &str,
        step_id: Arc<str>,
        visit: u32,
        timestamp: Option<String>,
    ) -> Self {
        let source_agents: Vec<String> = sources.iter().map(|s| s.agent.clone()).collect();
        let decisions: Vec<Arc<DecisionRecord>> = sources
            .iter()
            .flat_map(|s| s.decisions.iter().cloned())
            .collect();
        let memory_refs = sources
            .iter()
            .flat_map(|s| {
                s.decisions
                    .iter()
                    .map(|d| d.reference())
                    .chain(s.message_ids.iter().map(|id| format!("message:{id}")))
            })
            .collect();
        Self {
            source_agent: match source_agents.as_slice() {
                [one] => Some(one.clone()),
                _ => None,
            },
            source_agents,
            target_agent: target_agent.to_owned(),
            step_id,
            visit,
            item: None,
            decisions,
            memory_refs,
            timestamp,
        }
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a handoff is JSON")
    }

    /// The record as JSON text, written once for every payload that carries it.
    pub fn to_raw(&self) -> Box<serde_json::value::RawValue> {
        serde_json::value::to_raw_value(self).expect("a handoff is JSON")
    }
}

/// Milliseconds since the epoch as RFC 3339 (UTC); `None` for 0 (no time known).
pub fn rfc3339(at_ms: i64) -> Option<String> {
    if at_ms == 0 {
        return None;
    }
    jiff::Timestamp::from_millisecond(at_ms)
        .ok()
        .map(|t| t.to_string())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn notes_name_the_path_of_a_bad_field() {
        let error =
            AgentNotes::from_json(br#"{"decisions": [{"summary": "x"}, {"rationale": 1}]}"#)
                .unwrap_err();
        assert!(error.starts_with("decisions[1]"), "{error}");
        let error = AgentNotes::from_json(br#"{"messages": [{"role": "user"}]}"#).unwrap_err();
        assert!(error.starts_with("messages[0]"), "{error}");
    }

    #[test]
    fn a_merge_has_several_sources_and_no_single_source_agent() {
        let decision = Arc::new(DecisionRecord {
            key: "unit#1/0".into(),
            agent: "tester".into(),
            step_id: "unit".into(),
            visit: 1,
            summary: "Use vitest".into(),
            rationale: "fast".into(),
            timestamp: "2026-11-23T10:00:00Z".into(),
            related_artifacts: vec![],
        });
        let sources = [
            Arc::new(Source {
                agent: "tester".into(),
                step_id: "unit".into(),
                visit: 1,
                item: None,
                decisions: vec![decision],
                message_ids: vec!["unit#1/0".into()],
            }),
            Arc::new(Source {
                agent: "integrator".into(),
                step_id: "integration".into(),
                visit: 1,
                item: None,
                decisions: vec![],
                message_ids: vec![],
            }),
        ];
        let handoff = Handoff::new(
            &sources,
            "reviewer",
            "review".into(),
            1,
            rfc3339(1_795_428_000_000),
        );
        let value = handoff.to_value();
        assert_eq!(value["source_agent"], Value::Null);
        assert_eq!(value["source_agents"], json!(["tester", "integrator"]));
        assert_eq!(
            value["memory_refs"],
            json!(["decision:unit#1/0", "message:unit#1/0"])
        );
        assert_eq!(value["timestamp"], json!("2026-11-23T10:00:00Z"));
    }
}
