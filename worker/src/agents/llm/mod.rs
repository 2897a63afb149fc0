//! The `llm` agent kind: a prompt rendered from the payload, sent to a server that speaks
//! OpenAI's chat completions API (OpenAI, Ollama, vLLM...), and the model's reply made the
//! step's data.
//!
//! - this file: [`LlmAgent`], and one run of it: the conversation, the repairs of replies
//!   that cannot be used, the answer.
//! - `request`: the chat messages (system, the run's history, the prompt) and the body of the
//!   request; pure.
//! - `http`: calling the server: the key, timeouts, retries within an attempt, what each
//!   status means.
//! - `receive`: reading a reply, whole or streamed, and showing it live.
//! - `reply`: what a reply becomes: the JSON in it (whole, fenced, or in prose), checked
//!   against the schema, as data or an envelope; pure.
//! - `config`: the kind's fields in an agents file, and their checks.

pub(super) mod config;
mod http;
mod receive;
mod reply;
mod request;

use serde_json::{Map, Value};

use super::error::AgentError;
use super::template::{PromptTemplate, quote_start};
use crate::live::OutputSink;
use crate::output::{ModelCall, Output};
use http::{CallError, Client, Exchange};
use receive::Live;
use reply::{OutputMode, Schema};
use request::RequestShape;

/// How much of an unusable reply the error quotes.
const QUOTE_CHARS: usize = 200;

/// An agent that asks a model. Its `Debug` output never holds the API key.
#[derive(Debug)]
pub struct LlmAgent {
    name: String,
    model: String,
    /// The server, and how to call it (the model, streaming, retries, timeouts).
    client: Client,
    system: Option<PromptTemplate>,
    prompt: PromptTemplate,
    output: OutputMode,
    schema: Option<Schema>,
    /// How many times a reply that cannot be used is asked again.
    max_repairs: u32,
    stream: bool,
    /// The run's message history goes before the prompt.
    history: bool,
    /// `temperature`, `max_tokens`, `top_p`, `stop`, `seed`, as set.
    sampling: Map<String, Value>,
    /// Merged into every request body as it is.
    extra: Map<String, Value>,
}

impl LlmAgent {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The model asked for (the server may name another in its reply).
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Where requests go: `{base_url}/chat/completions`, without any password.
    pub fn url(&self) -> &str {
        self.client.url()
    }

    /// Renders the prompts against `payload`, asks the model (repairing unusable replies up to
    /// `max_repairs` times) and returns its answer: the data, the reply as an assistant
    /// message for the run's history, an envelope's notes, and every model call made. The
    /// reply's text goes to `output` as it comes.
    pub async fn run(&self, payload: &Value, output: &OutputSink) -> Result<Output, AgentError> {
        let render = |template: &PromptTemplate| {
            template.render(payload).map_err(|e| AgentError::Template {
                agent: self.name.clone(),
                reason: e.reason,
            })
        };
        let system = self.system.as_ref().map(render).transpose()?;
        let prompt = render(&self.prompt)?;
        let history = payload.get("messages").filter(|_| self.history);
        let mut messages = request::conversation(system, history, prompt);
        let shape = RequestShape {
            model: &self.model,
            sampling: &self.sampling,
            extra: &self.extra,
            schema: self
                .schema
                .as_ref()
                .map(|s| (self.name.as_str(), s.value())),
            stream: self.stream,
        };
        let mut exchange = Exchange {
            live: Live::new(output),
            calls: Vec::new(),
        };
        let mut repairs = 0;
        loop {
            let body = request::body(&shape, &messages);
            let received = match self.client.complete(&body, &mut exchange).await {
                Ok(received) => received,
                Err(error) => return Err(self.call_failed(error, exchange.calls)),
            };
            let mut problem = match reply::answer(&received.text, self.output, self.schema.as_ref())
            {
                Ok(answer) => {
                    return Ok(answer
                        .message("assistant", received.text)
                        .with_calls(exchange.calls));
                }
                Err(problem) => problem,
            };
            if received.finish_reason.as_deref() == Some("length") {
                problem.push_str(" (the reply was cut off at the model's token limit)");
            }
            if repairs == self.max_repairs {
                return Err(AgentError::BadReply {
                    agent: self.name.clone(),
                    reason: unusable(&problem, repairs, &received.text),
                    calls: exchange.calls,
                });
            }
            repairs += 1;
            tracing::debug!(agent = %self.name, %problem, repairs, "asking the model to repair its reply");
            messages.extend(request::repair(&received.text, &problem, self.output));
        }
    }

    /// Whether `error`, from [`Self::run`], may go away on another attempt: all but a request
    /// the server refused and a prompt that does not render.
    pub fn is_retryable(&self, error: &AgentError) -> bool {
        !matches!(
            error,
            AgentError::ModelRefused { .. } | AgentError::Template { .. }
        )
    }

    fn call_failed(&self, error: CallError, calls: Vec<ModelCall>) -> AgentError {
        let agent = self.name.clone();
        let url = self.client.url().to_owned();
        match error {
            CallError::Unavailable(reason) => AgentError::ModelUnavailable {
                agent,
                url,
                reason,
                calls,
            },
            CallError::Refused { status, message } => AgentError::ModelRefused {
                agent,
                url,
                status,
                message,
                calls,
            },
        }
    }
}

/// The reason a reply is still unusable after `repairs`, quoting its start.
fn unusable(problem: &str, repairs: u32, reply: &str) -> String {
    let after = match repairs {
        0 => String::new(),
        1 => ", after 1 repair".to_owned(),
        n => format!(", after {n} repairs"),
    };
    format!(
        "{problem}{after}; the reply starts with: {}",
        quote_start(reply, QUOTE_CHARS)
    )
}
