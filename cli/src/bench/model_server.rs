//! W5's model: a stand-in OpenAI-compatible server in the bench process that streams tokens,
//! each the time it was sent, so that the watcher can tell how long a token took to reach it
//! through Baton. The bench's workers serve an `llm` agent that asks it.
//!
//! `POST /v1/chat/completions` with a prompt `"N R"`: after [`THINKING`] (a model's time to
//! its first token, and time for the watcher to connect), N chunks of server-sent events,
//! `"<ns since the epoch>;"` each, R a second (0: as fast as the connection takes them), then
//! the finish reason, the usage chunk and `data: [DONE]`, as OpenAI streams a reply.

use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::http::header::CONTENT_TYPE;
use axum::response::Response;
use serde_json::{Value, json};
use tokio_stream::wrappers::IntervalStream;
use tokio_stream::{Stream, StreamExt as _};

/// How long the model thinks before it answers.
const THINKING: Duration = Duration::from_millis(300);

/// The agents file the bench's workers serve besides their built-in agents: `stream`, an `llm`
/// agent that asks the server at `base_url` for `{{input.pieces}}` tokens at `{{input.per_s}}`
/// a second.
pub fn agents_toml(base_url: &str) -> String {
    format!(
        r#"[agents.stream]
kind = "llm"
base_url = "{base_url}"
model = "bench-tokens"
prompt = "{{{{input.pieces}}}} {{{{input.per_s}}}}"
output = "text"
"#
    )
}

/// Nanoseconds since the epoch: what a token says.
pub fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

/// The server, serving until dropped.
pub struct ModelServer {
    /// Its OpenAI-compatible base URL (`http://127.0.0.1:PORT/v1`).
    pub base_url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ModelServer {
    /// Starts the server on a free loopback port.
    pub async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base_url = format!("http://{}/v1", listener.local_addr()?);
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(|body: axum::Json<Value>| async move {
                tokio::time::sleep(THINKING).await;
                complete(&body)
            }),
        );
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(ModelServer { base_url, task })
    }
}

/// The streamed reply to a request whose last message asks for `N R`: N tokens, R a second.
fn complete(request: &Value) -> Response {
    let prompt = request["messages"]
        .as_array()
        .and_then(|messages| messages.last())
        .and_then(|message| message["content"].as_str())
        .unwrap_or_default();
    let mut numbers = prompt.split_whitespace().map(|n| n.parse().unwrap_or(0));
    let tokens: u64 = numbers.next().unwrap_or(0);
    let per_s: u64 = numbers.next().unwrap_or(0);
    let body = match per_s {
        0 => Body::from_stream(events(tokens, tokio_stream::iter(0..tokens))),
        per_s => {
            let mut pace = tokio::time::interval(Duration::from_secs(1) / per_s as u32);
            pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let ticks = IntervalStream::new(pace).take(tokens as usize);
            Body::from_stream(events(tokens, ticks))
        }
    };
    Response::builder()
        .header(CONTENT_TYPE, "text/event-stream")
        .body(body)
        .expect("a valid response")
}

fn event(data: &Value) -> Result<Bytes, Infallible> {
    Ok(Bytes::from(format!("data: {data}\n\n")))
}

/// The events of a reply of `tokens` tokens, one per item of `ticks`, each stamped as the
/// server sends it (the stream is lazy: a token is made when the connection takes it).
fn events<T>(
    tokens: u64,
    ticks: impl Stream<Item = T>,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let body = ticks.map(|_| {
        event(&json!({"choices": [{"index": 0, "delta": {"content": format!("{};", now_ns())}}]}))
    });
    let end = [
        event(&json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})),
        event(&json!({"choices": [], "usage": {
            "prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1
        }})),
        Ok(Bytes::from_static(b"data: [DONE]\n\n")),
    ];
    body.chain(tokio_stream::iter(end))
}
