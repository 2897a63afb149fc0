//! Reading a model's reply off the wire: a chat completion as one JSON body, or streamed as
//! server-sent events; every read within the agent's idle timeout, within a size limit, and
//! the reply's text shown live as it comes.

use std::time::{Duration, Instant};

use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::Value;
use tokio::time::timeout;

use crate::live::OutputSink;

/// The most a reply may hold (its body, or its streamed text): far beyond any model's output,
/// but a broken server cannot fill the worker's memory.
const MAX_REPLY_BYTES: usize = 8 << 20;

/// How much of an error response is read: enough for the server's message.
const ERROR_BODY_BYTES: usize = 8 << 10;

/// What was read of a reply.
#[derive(Debug, Default)]
pub(super) struct Received {
    pub text: String,
    /// The model the server says answered.
    pub model: Option<String>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub finish_reason: Option<String>,
    /// From sending the request to the first piece of text (streamed replies).
    pub first_token: Option<Duration>,
}

/// A reply that could not be read whole: why, and what had been read.
pub(super) struct Broken {
    pub reason: String,
    pub partial: Received,
}

/// The live output of one agent run: each reply's text as it comes, and a restart when a new
/// reply (a retry, a repair) makes the text shown before void.
pub(super) struct Live<'a> {
    sink: &'a OutputSink,
    /// Text is on the watchers' screens.
    shown: bool,
    /// What is shown belongs to a reply that no longer counts.
    void: bool,
}

impl<'a> Live<'a> {
    pub(super) fn new(sink: &'a OutputSink) -> Self {
        Live {
            sink,
            shown: false,
            void: false,
        }
    }

    /// A new reply begins: whatever was shown before is void.
    pub(super) fn begin_reply(&mut self) {
        self.void |= self.shown;
    }

    fn write(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        if std::mem::take(&mut self.void) {
            self.sink.restart(text);
        } else {
            self.sink.text(text);
        }
        self.shown = true;
    }

    /// The reply is complete: if it showed nothing while an earlier one's text is shown, that
    /// text is cleared.
    pub(super) fn end_reply(&mut self) {
        if std::mem::take(&mut self.void) {
            self.sink.restart("");
            self.shown = false;
        }
    }
}

/// A chat completion, or one chunk of a streamed one.
#[derive(Deserialize)]
struct Completion {
    model: Option<String>,
    #[serde(default)]
    choices: Vec<Choice>,
    usage: Option<Usage>,
    /// Servers report a failure mid-stream as a chunk with an `error`.
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    index: u64,
    /// A whole completion's message.
    message: Option<Content>,
    /// A chunk's piece of the message.
    delta: Option<Content>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Content {
    /// A string, or null (a chunk that only carries the role).
    content: Option<Value>,
}

#[derive(Deserialize)]
struct Usage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
}

impl Received {
    /// Takes what `completion` says about the reply; its text, with `text`.
    fn note(&mut self, completion: &Completion) {
        if self.model.is_none() {
            self.model = completion.model.clone().filter(|m| !m.is_empty());
        }
        if let Some(usage) = &completion.usage {
            self.prompt_tokens = usage.prompt_tokens.or(self.prompt_tokens);
            self.completion_tokens = usage.completion_tokens.or(self.completion_tokens);
        }
        for choice in completion.choices.iter().filter(|c| c.index == 0) {
            if let Some(reason) = &choice.finish_reason {
                self.finish_reason = Some(reason.clone());
            }
        }
    }
}

/// The first choice's text in a whole completion (`message`) or a chunk (`delta`).
fn first_choice_text(completion: &Completion, streamed: bool) -> &str {
    completion
        .choices
        .iter()
        .find(|choice| choice.index == 0)
        .and_then(|choice| {
            if streamed {
                &choice.delta
            } else {
                &choice.message
            }
            .as_ref()
        })
        .and_then(|content| content.content.as_ref())
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Reads a whole chat completion; its text is shown once read.
pub(super) async fn read_plain(
    response: reqwest::Response,
    idle: Duration,
    live: &mut Live<'_>,
) -> Result<Received, Broken> {
    let mut received = Received::default();
    let body = match read_body(response, idle, MAX_REPLY_BYTES).await {
        Ok((body, false)) => body,
        Ok((_, true)) => return Err(broken(too_large(), received)),
        Err(reason) => return Err(broken(reason, received)),
    };
    let completion: Completion = match serde_json::from_slice(&body) {
        Ok(completion) => completion,
        Err(error) => {
            let reason = format!("the reply is not a chat completion ({error})");
            return Err(broken(reason, received));
        }
    };
    if let Some(error) = &completion.error {
        return Err(broken(
            format!("the server reported: {}", error_text(error)),
            received,
        ));
    }
    received.note(&completion);
    received.text = first_choice_text(&completion, false).to_owned();
    live.write(&received.text);
    Ok(received)
}

/// Reads a streamed chat completion (`data: {chunk}` events, then `data: [DONE]`), showing
/// each piece of text as it comes. A stream that ends without `[DONE]` is complete only if it
/// said why the model stopped.
pub(super) async fn read_stream(
    response: reqwest::Response,
    idle: Duration,
    sent: Instant,
    live: &mut Live<'_>,
) -> Result<Received, Broken> {
    let mut received = Received::default();
    let mut events = response.bytes_stream().eventsource();
    loop {
        let event = match timeout(idle, events.next()).await {
            Err(_) => return Err(broken(silent_for(idle), received)),
            Ok(None) if received.finish_reason.is_some() => return Ok(received),
            Ok(None) => {
                let reason = "the stream ended before the reply was complete".to_owned();
                return Err(broken(reason, received));
            }
            Ok(Some(Err(error))) => {
                let reason = match error {
                    eventsource_stream::EventStreamError::Transport(error) => {
                        format!("the stream broke off: {}", describe(error))
                    }
                    other => format!("the stream is not valid server-sent events: {other}"),
                };
                return Err(broken(reason, received));
            }
            Ok(Some(Ok(event))) => event,
        };
        let data = event.data.trim();
        if data == "[DONE]" {
            return Ok(received);
        }
        if data.is_empty() {
            continue;
        }
        let chunk: Completion = match serde_json::from_str(data) {
            Ok(chunk) => chunk,
            Err(error) => {
                let reason = format!("a chunk of the stream is not a completion chunk ({error})");
                return Err(broken(reason, received));
            }
        };
        if let Some(error) = &chunk.error {
            let reason = format!("the server reported mid-reply: {}", error_text(error));
            return Err(broken(reason, received));
        }
        received.note(&chunk);
        let piece = first_choice_text(&chunk, true);
        if !piece.is_empty() {
            received.first_token.get_or_insert_with(|| sent.elapsed());
            if received.text.len() + piece.len() > MAX_REPLY_BYTES {
                return Err(broken(too_large(), received));
            }
            received.text.push_str(piece);
            live.write(piece);
        }
    }
}

/// The server's message in an error response: OpenAI's `{"error": {"message"}}`, or
/// `{"error": "..."}`, `{"message"}`, `{"detail"}`, else the start of the body.
pub(super) async fn error_message(response: reqwest::Response, idle: Duration) -> String {
    let body = match read_body(response, idle, ERROR_BODY_BYTES).await {
        Ok((body, _)) => body,
        Err(reason) => return format!("(the body could not be read: {reason})"),
    };
    if let Ok(value) = serde_json::from_slice::<Value>(&body) {
        let message = error_text(&value);
        if !message.is_empty() {
            return message;
        }
    }
    let text = String::from_utf8_lossy(&body);
    let text = text.trim();
    if text.is_empty() {
        return "(empty body)".to_owned();
    }
    let mut shown: String = text.chars().take(300).collect();
    if shown.len() < text.len() {
        shown.push('…');
    }
    shown
}

/// The message in an error value, as servers write them; empty when it has none.
fn error_text(value: &Value) -> String {
    let candidates = [
        value.pointer("/error/message"),
        value.get("error").filter(|e| e.is_string()),
        value.get("message"),
        value.get("detail"),
        Some(value).filter(|v| v.is_string()),
    ];
    match candidates.into_iter().flatten().next() {
        Some(Value::String(text)) => text.trim().to_owned(),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

/// Reads at most `limit` bytes of the body, each piece within `idle`; `true` when there was
/// more.
async fn read_body(
    mut response: reqwest::Response,
    idle: Duration,
    limit: usize,
) -> Result<(Vec<u8>, bool), String> {
    let mut body = Vec::new();
    loop {
        match timeout(idle, response.chunk()).await {
            Err(_) => return Err(silent_for(idle)),
            Ok(Err(error)) => return Err(format!("the reply broke off: {}", describe(error))),
            Ok(Ok(None)) => return Ok((body, false)),
            Ok(Ok(Some(chunk))) => {
                if body.len() + chunk.len() > limit {
                    body.extend_from_slice(&chunk[..limit - body.len()]);
                    return Ok((body, true));
                }
                body.extend_from_slice(&chunk);
            }
        }
    }
}

fn broken(reason: String, partial: Received) -> Broken {
    Broken { reason, partial }
}

fn too_large() -> String {
    format!("the reply is larger than {} MiB", MAX_REPLY_BYTES >> 20)
}

/// The reason of an idle timeout.
pub(super) fn silent_for(idle: Duration) -> String {
    format!(
        "the server sent nothing for {} ms (idle_timeout_ms)",
        idle.as_millis()
    )
}

/// A transport error with its causes ("connection refused" is a cause, not the message), and
/// without its URL: callers name the URL themselves, without any password.
pub(super) fn describe(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut message = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_new_reply_restarts_the_live_output_only_when_something_was_shown() {
        let (sink, mut collected) = OutputSink::collecting();
        let mut live = Live::new(&sink);
        // Nothing shown yet: a retry needs no restart.
        live.begin_reply();
        live.begin_reply();
        live.write("");
        live.write("Hel");
        live.write("lo");
        live.end_reply();
        // A repair: its first piece restarts the output.
        live.begin_reply();
        live.write("Again");
        live.write("!");
        live.end_reply();
        // A reply that shows nothing clears what the last one showed.
        live.begin_reply();
        live.end_reply();
        live.begin_reply();
        live.write("x");
        let pieces: Vec<(String, bool)> = [
            ("Hel", false),
            ("lo", false),
            ("Again", true),
            ("!", false),
            ("", true),
            ("x", false),
        ]
        .iter()
        .map(|(text, restart)| (text.to_string(), *restart))
        .collect();
        assert_eq!(collected.written(), pieces);
    }

    #[test]
    fn error_messages_as_servers_write_them() {
        for (body, expected) in [
            (
                json!({"error": {"message": " Incorrect API key ", "type": "x"}}),
                "Incorrect API key",
            ),
            (
                json!({"error": "model \"x\" not found, try pulling it first"}),
                "model \"x\" not found, try pulling it first",
            ),
            (json!({"message": "overloaded"}), "overloaded"),
            (
                json!({"detail": [{"loc": ["body"], "msg": "field required"}]}),
                r#"[{"loc":["body"],"msg":"field required"}]"#,
            ),
            (json!({"object": "error"}), ""),
        ] {
            assert_eq!(error_text(&body), expected);
        }
    }
}
