//! What an agent returns: the step's data and, optionally, notes for the agents after it.

use serde_json::{Map, Value, json};

/// An agent's answer: the step's data (what enters the context), messages for the run's
/// history (merged with LangGraph's `add_messages` rules: a new id appends, a known id replaces
/// in place, `{"type": "remove", "id": ...}` deletes) and the decisions it took
/// (`{"summary", "rationale", "related_artifacts"}`), which the next agents find in their
/// handoff and can search by meaning.
///
/// A handler may return plain data (`Ok(json!(...))`): it converts into an `Output` without
/// notes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Output {
    pub data: Value,
    pub messages: Vec<Value>,
    pub decisions: Vec<Value>,
    /// The calls to models that produced it (for the run record, metrics and spans).
    pub calls: Vec<ModelCall>,
}

/// One call to a model: which, the tokens it used, and how long it took. Agents that call
/// models report them with their answer (or their failure); the runtime counts the tokens in
/// the run record and in its metrics, and names them on the execution's span.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelCall {
    /// The provider, as OpenTelemetry's `gen_ai.system` names it (`openai` for any
    /// OpenAI-compatible server).
    pub system: String,
    pub model: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Why the model stopped (`stop`, `length`...), when it said.
    pub finish_reason: Option<String>,
    /// From sending the request to the end of the reply.
    pub duration: std::time::Duration,
    /// From sending the request to the first token, when the reply was streamed.
    pub first_token: Option<std::time::Duration>,
}

impl Output {
    pub fn new(data: Value) -> Self {
        Self {
            data,
            ..Self::default()
        }
    }

    /// Adds a message with this role and content; its id is assigned by Baton
    /// (`<step>#<visit>/<n>`) and its name is the agent's.
    pub fn message(mut self, role: &str, content: impl Into<Value>) -> Self {
        self.messages
            .push(json!({"role": role, "content": content.into()}));
        self
    }

    /// Adds a message given whole (with an `id` to replace an earlier one, `name`,
    /// `metadata`), or a removal marker.
    pub fn raw_message(mut self, message: Value) -> Self {
        self.messages.push(message);
        self
    }

    /// Adds the calls to models that produced this answer.
    pub fn with_calls(mut self, calls: impl IntoIterator<Item = ModelCall>) -> Self {
        self.calls.extend(calls);
        self
    }

    /// Adds a decision.
    pub fn decision(mut self, summary: &str, rationale: &str) -> Self {
        self.decisions
            .push(json!({"summary": summary, "rationale": rationale}));
        self
    }

    /// Adds a decision with the artifacts it concerns.
    pub fn decision_about(mut self, summary: &str, rationale: &str, artifacts: &[&str]) -> Self {
        self.decisions.push(
            json!({"summary": summary, "rationale": rationale, "related_artifacts": artifacts}),
        );
        self
    }

    /// `{"messages": [...], "decisions": [...]}` as sent with the result, or `None` when there
    /// are no notes.
    pub fn notes_json(&self) -> Option<Vec<u8>> {
        if self.messages.is_empty() && self.decisions.is_empty() {
            return None;
        }
        let mut notes = Map::new();
        if !self.messages.is_empty() {
            notes.insert("messages".into(), Value::Array(self.messages.clone()));
        }
        if !self.decisions.is_empty() {
            notes.insert("decisions".into(), Value::Array(self.decisions.clone()));
        }
        Some(serde_json::to_vec(&notes).expect("notes are JSON"))
    }

    /// Reads a command agent's envelope, `{"data": ..., "messages": [...], "decisions": [...]}`
    /// (`messages` and `decisions` optional); the error names the member that is wrong.
    pub fn from_envelope(envelope: Value) -> Result<Output, String> {
        let Value::Object(mut members) = envelope else {
            return Err(format!(
                "expected an envelope object {{\"data\": ..., \"messages\": [...], \"decisions\": [...]}}, found {}",
                kind(&envelope)
            ));
        };
        let data = members
            .remove("data")
            .ok_or("the envelope has no \"data\" member")?;
        let list = |members: &mut Map<String, Value>, name: &str| match members.remove(name) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => Ok(items),
            Some(other) => Err(format!(
                "the envelope's \"{name}\" must be an array, found {}",
                kind(&other)
            )),
        };
        let messages = list(&mut members, "messages")?;
        let decisions = list(&mut members, "decisions")?;
        if let Some(unknown) = members.keys().next() {
            return Err(format!(
                "the envelope has an unknown member \"{unknown}\" (it takes data, messages and decisions)"
            ));
        }
        Ok(Output {
            data,
            messages,
            decisions,
            calls: Vec::new(),
        })
    }
}

impl From<Value> for Output {
    fn from(data: Value) -> Self {
        Output::new(data)
    }
}

/// Compares the data of an answer without notes: `assert_eq!(output, json!(...))`.
impl PartialEq<Value> for Output {
    fn eq(&self, other: &Value) -> bool {
        self.messages.is_empty() && self.decisions.is_empty() && self.data == *other
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_splits_into_data_and_notes() {
        let output = Output::from_envelope(json!({
            "data": {"files": ["a.ts"]},
            "messages": [{"role": "assistant", "content": "done"}],
            "decisions": [{"summary": "Use hooks"}]
        }))
        .unwrap();
        assert_eq!(output.data, json!({"files": ["a.ts"]}));
        assert_eq!(
            serde_json::from_slice::<Value>(&output.notes_json().unwrap()).unwrap(),
            json!({"messages": [{"role": "assistant", "content": "done"}],
                   "decisions": [{"summary": "Use hooks"}]})
        );
    }

    #[test]
    fn a_bad_envelope_names_what_is_wrong() {
        let cases = [
            (json!([1]), "found an array"),
            (json!({"messages": []}), "no \"data\""),
            (
                json!({"data": 1, "messages": {}}),
                "\"messages\" must be an array",
            ),
            (
                json!({"data": 1, "decision": []}),
                "unknown member \"decision\"",
            ),
        ];
        for (envelope, expected) in cases {
            let error = Output::from_envelope(envelope).unwrap_err();
            assert!(error.contains(expected), "{error}");
        }
    }

    #[test]
    fn plain_data_has_no_notes() {
        assert_eq!(Output::from(json!(1)).notes_json(), None);
        assert_eq!(Output::from(json!(1)), json!(1));
        assert_ne!(Output::new(json!(1)).decision("a", "b"), json!(1));
    }
}
