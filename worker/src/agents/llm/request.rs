//! What an `llm` agent sends: the chat messages and the body of `POST /chat/completions`.
//! Pure functions, so the wire format is tested without a server.

use serde_json::{Map, Value, json};

use super::reply::OutputMode;

/// The request fields Baton writes itself; `extra` may not set them (it would silently win or
/// lose against the agent's own fields).
pub(super) const RESERVED_FIELDS: &[&str] = &[
    "model",
    "messages",
    "stream",
    "stream_options",
    "response_format",
    "temperature",
    "max_tokens",
    "top_p",
    "stop",
    "seed",
];

/// The chat roles passed on as they are; any other role in the run's history goes as `user`
/// with a `name`.
const CHAT_ROLES: &[&str] = &["system", "user", "assistant", "tool"];

/// The conversation of a first request: the system message (if any), the run's history (when
/// the agent has `history = true`, `history` is the payload's `messages`), then the prompt as
/// the user's message.
pub(super) fn conversation(
    system: Option<String>,
    history: Option<&Value>,
    prompt: String,
) -> Vec<Value> {
    let mut messages = Vec::new();
    if let Some(system) = system {
        messages.push(json!({"role": "system", "content": system}));
    }
    if let Some(Value::Array(history)) = history {
        messages.extend(history.iter().filter_map(chat_message));
    }
    messages.push(json!({"role": "user", "content": prompt}));
    messages
}

/// One message of the run's history (`{"role", "content", "name"?, "id", ...}`) as a chat
/// message: content that is not a string goes as JSON text; a role the chat API does not know
/// (and a `tool` message without the `tool_call_id` the API requires) goes as `user`, named
/// after the message's `name` or its role. Entries without a role are skipped.
fn chat_message(message: &Value) -> Option<Value> {
    let role = message.get("role")?.as_str()?;
    let content = match message.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    };
    let name = message.get("name").and_then(Value::as_str);
    let tool_call_id = message.get("tool_call_id").and_then(Value::as_str);
    let known = CHAT_ROLES.contains(&role) && (role != "tool" || tool_call_id.is_some());
    let mut chat = Map::new();
    if known {
        chat.insert("role".into(), role.into());
        if let Some(name) = name.filter(|_| role != "tool") {
            chat.insert("name".into(), chat_name(name).into());
        }
        if let Some(id) = tool_call_id.filter(|_| role == "tool") {
            chat.insert("tool_call_id".into(), id.into());
        }
    } else {
        chat.insert("role".into(), "user".into());
        chat.insert("name".into(), chat_name(name.unwrap_or(role)).into());
    }
    chat.insert("content".into(), content.into());
    Some(Value::Object(chat))
}

/// `name` as OpenAI accepts a message's (or a schema's) name: letters, digits, `_` and `-`, at
/// most 64.
fn chat_name(name: &str) -> String {
    let cleaned: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if cleaned.is_empty() {
        "unnamed".to_owned()
    } else {
        cleaned
    }
}

/// What a request carries besides its messages.
pub(super) struct RequestShape<'a> {
    pub model: &'a str,
    /// `temperature`, `max_tokens`, `top_p`, `stop`, `seed`: those the agent sets.
    pub sampling: &'a Map<String, Value>,
    /// Merged into the body as it is (its keys are none of [`RESERVED_FIELDS`]).
    pub extra: &'a Map<String, Value>,
    /// `(agent name, schema)`: sent as `response_format`.
    pub schema: Option<(&'a str, &'a Value)>,
    pub stream: bool,
}

/// The body of `POST /chat/completions` for `messages`.
pub(super) fn body(shape: &RequestShape, messages: &[Value]) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), shape.model.into());
    body.insert("messages".into(), Value::Array(messages.to_vec()));
    for (key, value) in shape.sampling {
        body.insert(key.clone(), value.clone());
    }
    if let Some((name, schema)) = shape.schema {
        body.insert(
            "response_format".into(),
            json!({"type": "json_schema", "json_schema": {"name": chat_name(name), "schema": schema}}),
        );
    }
    body.insert("stream".into(), shape.stream.into());
    if shape.stream {
        // Without it the stream carries no token counts.
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    for (key, value) in shape.extra {
        body.insert(key.clone(), value.clone());
    }
    Value::Object(body)
}

/// The messages that ask the model again: its unusable `reply` as the assistant's, then what
/// was wrong with it.
pub(super) fn repair(reply: &str, problem: &str, mode: OutputMode) -> [Value; 2] {
    let wanted = match mode {
        OutputMode::Envelope => {
            "only the corrected JSON object {\"data\": ..., \"messages\": [...], \"decisions\": [...]}"
        }
        OutputMode::Json | OutputMode::Text => "only the corrected JSON",
    };
    [
        json!({"role": "assistant", "content": reply}),
        json!({
            "role": "user",
            "content": format!("Your reply could not be used: {problem}. Reply again with {wanted}, nothing else."),
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_is_system_history_then_prompt() {
        let history = json!([
            {"id": "plan#1/1", "role": "assistant", "name": "planner", "content": "the plan"},
            {"id": "x", "role": "user", "content": {"files": ["a.ts"]}},
            {"id": "y", "role": "reviewer notes", "name": "review.bot", "content": "nits"},
            {"id": "z", "role": "critic", "content": null},
            {"id": "t1", "role": "tool", "tool_call_id": "call_1", "name": "grep", "content": "3 hits"},
            {"id": "t2", "role": "tool", "name": "grep", "content": "no call id"},
            {"id": "s", "role": "system", "content": "be brief"},
            {"no": "role"},
            "not an object",
        ]);
        let messages = conversation(Some("You code.".into()), Some(&history), "Task".into());
        assert_eq!(
            Value::Array(messages),
            json!([
                {"role": "system", "content": "You code."},
                {"role": "assistant", "name": "planner", "content": "the plan"},
                {"role": "user", "content": "{\"files\":[\"a.ts\"]}"},
                {"role": "user", "name": "review_bot", "content": "nits"},
                {"role": "user", "name": "critic", "content": ""},
                {"role": "tool", "tool_call_id": "call_1", "content": "3 hits"},
                {"role": "user", "name": "grep", "content": "no call id"},
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "Task"},
            ])
        );
    }

    #[test]
    fn without_system_or_history_only_the_prompt_goes() {
        assert_eq!(
            conversation(None, None, "P".into()),
            [json!({"role": "user", "content": "P"})]
        );
    }

    #[test]
    fn names_are_made_acceptable() {
        assert_eq!(chat_name("test-unit"), "test-unit");
        assert_eq!(chat_name("a b/c"), "a_b_c");
        assert_eq!(chat_name(""), "unnamed");
        assert_eq!(chat_name(&"x".repeat(100)).len(), 64);
    }

    #[test]
    fn a_body_with_everything() {
        let sampling = json!({"temperature": 0.2, "max_tokens": 100, "stop": ["\n\n"], "seed": 7});
        let extra = json!({"keep_alive": "5m", "options": {"num_ctx": 8192}});
        let schema = json!({"type": "object"});
        let shape = RequestShape {
            model: "qwen2.5-coder:7b",
            sampling: sampling.as_object().unwrap(),
            extra: extra.as_object().unwrap(),
            schema: Some(("coder", &schema)),
            stream: true,
        };
        let messages = [json!({"role": "user", "content": "P"})];
        assert_eq!(
            body(&shape, &messages),
            json!({
                "model": "qwen2.5-coder:7b",
                "messages": [{"role": "user", "content": "P"}],
                "temperature": 0.2, "max_tokens": 100, "stop": ["\n\n"], "seed": 7,
                "response_format": {"type": "json_schema", "json_schema": {"name": "coder", "schema": {"type": "object"}}},
                "stream": true,
                "stream_options": {"include_usage": true},
                "keep_alive": "5m", "options": {"num_ctx": 8192}
            })
        );
        let empty = Map::new();
        let plain = RequestShape {
            model: "m",
            sampling: &empty,
            extra: &empty,
            schema: None,
            stream: false,
        };
        assert_eq!(
            body(&plain, &messages),
            json!({"model": "m", "messages": [{"role": "user", "content": "P"}], "stream": false})
        );
    }

    #[test]
    fn a_repair_carries_the_reply_and_the_problem() {
        let [assistant, user] = repair("{\"a\":", "EOF while parsing", OutputMode::Json);
        assert_eq!(
            assistant,
            json!({"role": "assistant", "content": "{\"a\":"})
        );
        let text = user["content"].as_str().unwrap();
        assert_eq!(user["role"], "user");
        assert!(text.contains("EOF while parsing"), "{text}");
        let [_, user] = repair("x", "no data", OutputMode::Envelope);
        assert!(user["content"].as_str().unwrap().contains("\"decisions\""));
    }
}
