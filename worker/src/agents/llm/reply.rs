//! What an `llm` agent makes of a model's reply: the step's answer, or what is wrong with it,
//! in words a repair request can put to the model. Pure functions.

use baton_core::big_integers::first_big_integer;
use serde_json::{Value, json};

use crate::output::Output;

/// How many schema errors a repair request (and the final error) names.
const SCHEMA_ERRORS_SHOWN: usize = 5;

/// What the reply becomes (the agent's `output`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OutputMode {
    /// The JSON in the reply is the step's data.
    Json,
    /// `{"text": reply}`.
    Text,
    /// The JSON in the reply is `{"data", "messages", "decisions"}`.
    Envelope,
}

/// A JSON Schema the reply must match, compiled once.
pub(super) struct Schema {
    value: Value,
    validator: jsonschema::Validator,
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Schema").field(&self.value).finish()
    }
}

impl Schema {
    /// Compiles `value`; a schema that refers to anything outside itself is refused (nothing is
    /// fetched).
    pub(super) fn compile(value: Value) -> Result<Schema, String> {
        let validator = jsonschema::validator_for(&value).map_err(|e| e.to_string())?;
        Ok(Schema { value, validator })
    }

    /// The schema as written, for `response_format`.
    pub(super) fn value(&self) -> &Value {
        &self.value
    }

    /// Whether `instance` matches: else its first errors, each at its JSON pointer.
    fn check(&self, instance: &Value) -> Result<(), String> {
        let errors: Vec<_> = self.validator.iter_errors(instance).collect();
        if errors.is_empty() {
            return Ok(());
        }
        let mut shown: Vec<String> = errors
            .iter()
            .take(SCHEMA_ERRORS_SHOWN)
            .map(|error| {
                let pointer = error.instance_path().to_string();
                let at = if pointer.is_empty() {
                    "the top level".to_owned()
                } else {
                    pointer
                };
                format!("at {at}: {error}")
            })
            .collect();
        if errors.len() > SCHEMA_ERRORS_SHOWN {
            shown.push(format!("and {} more", errors.len() - SCHEMA_ERRORS_SHOWN));
        }
        Err(format!(
            "it does not match the JSON schema: {}",
            shown.join("; ")
        ))
    }
}

/// The answer `reply` gives in `mode`, or what is wrong with it.
pub(super) fn answer(
    reply: &str,
    mode: OutputMode,
    schema: Option<&Schema>,
) -> Result<Output, String> {
    if mode == OutputMode::Text {
        return Ok(Output::new(json!({"text": reply})));
    }
    let value = extract_json(reply)?;
    if let Some(schema) = schema {
        schema.check(&value)?;
    }
    match mode {
        OutputMode::Envelope => Output::from_envelope(value),
        OutputMode::Json | OutputMode::Text => Ok(Output::new(value)),
    }
}

/// The JSON in a reply: the whole reply if it is JSON; else the first complete value in its
/// first ```` ```json ```` fence; else the first complete value in the text, from the first
/// `{` or `[` that can start one (`[see below]` cannot). What comes after that value is
/// ignored.
pub(super) fn extract_json(reply: &str) -> Result<Value, String> {
    if let Ok(value) = serde_json::from_str(reply.trim()) {
        return exact(value, reply.trim(), "the reply");
    }
    let (holder, text) = match fenced_json(reply) {
        Some(fenced) => ("the ```json block", fenced),
        None => ("the reply", reply),
    };
    let nothing = || format!("{holder} holds no JSON object or array");
    let start = json_start(text).ok_or_else(nothing)?;
    let mut values = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
    match values.next() {
        Some(Ok(value)) => exact(
            value,
            &text[start..start + values.byte_offset()],
            &format!("the JSON in {holder}"),
        ),
        Some(Err(error)) if error.is_eof() => Err(format!(
            "the JSON in {holder} ends before it is complete ({error})"
        )),
        Some(Err(error)) => Err(format!("the JSON in {holder} is not valid ({error})")),
        None => Err(nothing()),
    }
}

/// `value`, read from `text`, unless `text` holds an integer beyond 64 bits: serde_json read it
/// as a float, and the step would get another number than the model wrote. Refused naming
/// where, so that a repair can ask for it as a string.
fn exact(value: Value, text: &str, holder: &str) -> Result<Value, String> {
    match first_big_integer(text.as_bytes(), &value) {
        None => Ok(value),
        Some(found) => Err(format!("{holder} at {}: {}", found.path, found.problem())),
    }
}

/// The text of the first ```` ```json ```` fence (to its closing fence, or to the end of the
/// reply when it was cut off).
fn fenced_json(reply: &str) -> Option<&str> {
    let lower = reply.to_ascii_lowercase();
    let open = lower.find("```json")?;
    let after_tag = &reply[open + "```json".len()..];
    let body = &after_tag[after_tag.find('\n').map_or(after_tag.len(), |i| i + 1)..];
    Some(match body.find("```") {
        Some(close) => &body[..close],
        None => body,
    })
}

/// Where the first JSON object or array in `text` starts: a `{` followed by `"` or `}`, or a
/// `[` followed by a value or `]` (whitespace between allowed).
fn json_start(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    bytes.iter().enumerate().find_map(|(at, &byte)| {
        let next = bytes[at + 1..]
            .iter()
            .copied()
            .find(|b| !b.is_ascii_whitespace());
        let starts = match (byte, next) {
            (b'{', Some(b'"' | b'}')) => true,
            (b'[', Some(b'{' | b'[' | b'"' | b']' | b'-' | b't' | b'f' | b'n' | b'0'..=b'9')) => {
                true
            }
            // Cut off right after the bracket: still where the JSON starts.
            (b'{' | b'[', None) => true,
            _ => false,
        };
        starts.then_some(at)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_reply_that_is_json() {
        assert_eq!(extract_json(" {\"a\": 1}\n").unwrap(), json!({"a": 1}));
        assert_eq!(extract_json("[1, 2]").unwrap(), json!([1, 2]));
        assert_eq!(extract_json("42").unwrap(), json!(42));
    }

    #[test]
    fn a_fenced_reply() {
        let reply =
            "Here is the plan:\n```json\n{\"files\": [\"a.ts\"]}\n```\nAnd {\"not\": \"this\"}";
        assert_eq!(extract_json(reply).unwrap(), json!({"files": ["a.ts"]}));
        let reply = "```JSON\n[1]\n```";
        assert_eq!(extract_json(reply).unwrap(), json!([1]));
        // The first value of the fence; what follows it in the fence is ignored.
        let reply = "```json\n{\"a\": 1}\n{\"b\": 2}\n```";
        assert_eq!(extract_json(reply).unwrap(), json!({"a": 1}));
    }

    #[test]
    fn json_in_prose() {
        let reply = "Sure [see below]: {\"approved\": true, \"comments\": []} Hope it helps {x}";
        assert_eq!(
            extract_json(reply).unwrap(),
            json!({"approved": true, "comments": []})
        );
        assert_eq!(extract_json("result: [ 1 ] done").unwrap(), json!([1]));
        assert_eq!(extract_json("empty: {} ok").unwrap(), json!({}));
    }

    #[test]
    fn truncated_and_missing_json_are_named() {
        for (reply, expected) in [
            (
                "{\"files\": [\"a.ts\"], \"steps\": [\"one\"",
                "the JSON in the reply ends before it is complete (EOF",
            ),
            (
                "```json\n{\"files\": [\"a.ts\"],\n",
                "the JSON in the ```json block ends before it is complete",
            ),
            (
                "I cannot do that.",
                "the reply holds no JSON object or array",
            ),
            ("{\"a\": tru}", "the JSON in the reply is not valid ("),
            (
                "```json\nnothing\n```",
                "the ```json block holds no JSON object or array",
            ),
        ] {
            let err = extract_json(reply).unwrap_err();
            assert!(err.starts_with(expected), "{reply}: {err}");
        }
    }

    #[test]
    fn an_integer_beyond_64_bits_is_named_for_a_repair_not_rounded() {
        for (reply, expected) in [
            (
                "{\"id\": 123456789012345678901234567890}",
                "the reply at $.id: integer 123456789012345678901234567890 is beyond 64 bits",
            ),
            (
                "Here: {\"ids\": [1, -99999999999999999999]} and {\"n\": 123456789012345678901234567890}",
                "the JSON in the reply at $.ids[1]: integer -99999999999999999999",
            ),
            (
                "```json\n[18446744073709551616]\n```",
                "the JSON in the ```json block at $[0]: integer 18446744073709551616",
            ),
        ] {
            let err = extract_json(reply).unwrap_err();
            assert!(err.starts_with(expected), "{reply}: {err}");
            assert!(err.contains("write it as a string"), "{err}");
        }
        // What comes after the value read is not the step's: it is not looked at.
        assert_eq!(
            extract_json("{\"a\": 1} then 123456789012345678901234567890").unwrap(),
            json!({"a": 1})
        );
    }

    fn schema() -> Schema {
        Schema::compile(json!({
            "type": "object",
            "required": ["files", "approach"],
            "properties": {"files": {"type": "array", "items": {"type": "string"}}}
        }))
        .unwrap()
    }

    #[test]
    fn schema_errors_name_their_pointer() {
        let err = answer("{\"files\": [\"a\", 1]}", OutputMode::Json, Some(&schema())).unwrap_err();
        assert!(
            err.starts_with("it does not match the JSON schema: "),
            "{err}"
        );
        assert!(
            err.contains("at /files/1: 1 is not of type \"string\""),
            "{err}"
        );
        assert!(
            err.contains("at the top level: \"approach\" is a required property"),
            "{err}"
        );
        let ok = answer(
            "{\"files\": [], \"approach\": \"x\"}",
            OutputMode::Json,
            Some(&schema()),
        );
        assert_eq!(ok.unwrap().data, json!({"files": [], "approach": "x"}));
    }

    #[test]
    fn a_schema_that_does_not_compile() {
        let err = Schema::compile(json!({"type": "no such type"})).unwrap_err();
        assert!(!err.is_empty());
        assert!(Schema::compile(json!({"$ref": "https://example.com/s.json"})).is_err());
    }

    #[test]
    fn text_and_envelope() {
        let out = answer("just words {", OutputMode::Text, None).unwrap();
        assert_eq!(out.data, json!({"text": "just words {"}));
        let out = answer(
            "```json\n{\"data\": {\"ok\": true}, \"decisions\": [{\"summary\": \"Use hooks\", \"rationale\": \"simpler\"}]}\n```",
            OutputMode::Envelope,
            None,
        )
        .unwrap();
        assert_eq!(out.data, json!({"ok": true}));
        assert_eq!(
            out.decisions,
            [json!({"summary": "Use hooks", "rationale": "simpler"})]
        );
        let err = answer("{\"ok\": true}", OutputMode::Envelope, None).unwrap_err();
        assert!(err.contains("no \"data\" member"), "{err}");
    }
}
