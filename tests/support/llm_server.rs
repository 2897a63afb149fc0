//! A stand-in for an OpenAI-compatible chat completions server (OpenAI, Ollama, vLLM), for
//! tests: it speaks the real wire format and records every request it gets.
//!
//! ```ignore
//! let server = LlmServer::start().await;
//! server.push(Reply::stream(["{\"ok\"", ": true}"]).crlf().comments());
//! // an agent with base_url = server.base_url() ...
//! let request = &server.requests()[0];
//! assert_eq!(request.body["stream"], true);
//! ```
//!
//! Replies are scripted: [`LlmServer::push`] queues them, first in first out, and when the
//! queue is empty the responder set with [`LlmServer::respond_with`] answers (a reply made from
//! the request, for end-to-end runs); with neither, a 500 says that nothing was scripted. A
//! request to any path but `/v1/chat/completions` gets OpenAI's 404.
//!
//! What a reply can be: a whole completion ([`Reply::json`]), a stream of chunks as
//! server-sent events ([`Reply::stream`]: a role chunk, one chunk per piece, a chunk with the
//! finish reason, the usage chunk with empty `choices` when the request asked for it, then
//! `data: [DONE]`; optionally with CRLF line ends and comment lines), an error with OpenAI's
//! body ([`Reply::error`]) or any body ([`Reply::raw`]), with headers such as `Retry-After`. A
//! stream can break off after some pieces, and hold a piece back until the test opens a
//! [`Gate`]; the server counts the replies whose client went away before their end
//! ([`LlmServer::wait_for_closed`]).
//!
//! Included with `#[path]` by the tests that use it; it needs axum, tokio, tokio-stream and
//! serde_json (all of them dependencies of baton-worker and baton-cli).

#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request as HttpRequest, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

/// How long the waiting helpers wait before they fail the test.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    /// The body as JSON (`Value::Null` when it was not JSON).
    pub body: Value,
    /// The body as it came.
    pub raw_body: String,
    /// When it came (its body read).
    pub at: tokio::time::Instant,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The request's `messages`.
    pub fn messages(&self) -> &[Value] {
        self.body["messages"].as_array().map_or(&[], Vec::as_slice)
    }

    /// The content of the last message (the prompt, or a repair request).
    pub fn last_content(&self) -> &str {
        self.messages()
            .last()
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
    }
}

/// Lets a held reply go on when the test says so.
#[derive(Clone, Debug)]
pub struct Gate(Arc<watch::Sender<bool>>);

impl Gate {
    pub fn new() -> Gate {
        Gate(Arc::new(watch::channel(false).0))
    }

    pub fn open(&self) {
        self.0.send_replace(true);
    }

    async fn opened(&self) {
        let mut open = self.0.subscribe();
        let _ = open.wait_for(|open| *open).await;
    }
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new()
    }
}

/// What to send back for one request.
#[derive(Clone, Debug)]
pub struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: ReplyBody,
    model: Option<String>,
    usage: (u64, u64),
    finish_reason: String,
    /// Wait before the n-th piece of a stream (0: before anything, for any reply).
    hold: Option<(usize, Gate)>,
    /// Break the connection after n pieces of a stream.
    break_after: Option<usize>,
    crlf: bool,
    comments: bool,
    done: bool,
}

#[derive(Clone, Debug)]
enum ReplyBody {
    Completion(String),
    Stream(Vec<String>),
    Raw(String),
}

impl Reply {
    fn new(status: u16, body: ReplyBody) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body,
            model: None,
            usage: (11, 7),
            finish_reason: "stop".to_owned(),
            hold: None,
            break_after: None,
            crlf: false,
            comments: false,
            done: true,
        }
    }

    /// A whole chat completion whose message is `content`.
    pub fn json(content: &str) -> Reply {
        Reply::new(200, ReplyBody::Completion(content.to_owned()))
    }

    /// A streamed chat completion, one chunk per piece.
    pub fn stream<S: AsRef<str>>(pieces: impl IntoIterator<Item = S>) -> Reply {
        let pieces = pieces.into_iter().map(|p| p.as_ref().to_owned()).collect();
        Reply::new(200, ReplyBody::Stream(pieces))
    }

    /// An error with OpenAI's body, `{"error": {"message", "type", "code"}}`.
    pub fn error(status: u16, message: &str) -> Reply {
        let body = json!({"error": {
            "message": message, "type": "invalid_request_error", "param": null, "code": null
        }});
        Reply::raw(status, &body.to_string())
    }

    /// OpenAI's 401 for a wrong key.
    pub fn unauthorized() -> Reply {
        Reply::error(
            401,
            "Incorrect API key provided: sk-test-****6789. You can find your API key at https://platform.openai.com/account/api-keys.",
        )
    }

    /// OpenAI's 404 for a model it does not have.
    pub fn model_not_found(model: &str) -> Reply {
        Reply::error(
            404,
            &format!("The model `{model}` does not exist or you do not have access to it."),
        )
    }

    /// OpenAI's 429, asking to come back after `retry_after` (seconds or an HTTP date).
    pub fn rate_limited(retry_after: &str) -> Reply {
        Reply::error(
            429,
            "Rate limit reached for requests. Please try again in a moment.",
        )
        .retry_after(retry_after)
    }

    /// `body` as it is, with this status.
    pub fn raw(status: u16, body: &str) -> Reply {
        Reply::new(status, ReplyBody::Raw(body.to_owned()))
    }

    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn retry_after(self, value: &str) -> Reply {
        self.header("retry-after", value)
    }

    /// The model the reply names (by default, the one the request asked for).
    pub fn model(mut self, model: &str) -> Reply {
        self.model = Some(model.to_owned());
        self
    }

    pub fn usage(mut self, prompt_tokens: u64, completion_tokens: u64) -> Reply {
        self.usage = (prompt_tokens, completion_tokens);
        self
    }

    pub fn finish_reason(mut self, reason: &str) -> Reply {
        self.finish_reason = reason.to_owned();
        self
    }

    /// Holds the reply before its `piece`-th piece (0: before anything) until `gate` opens.
    pub fn hold_before(mut self, piece: usize, gate: &Gate) -> Reply {
        self.hold = Some((piece, gate.clone()));
        self
    }

    /// Breaks the connection off after `pieces` pieces of the stream. What was written just
    /// before may never leave the server: hold the break (`hold_before(pieces, ...)`) until
    /// the client has seen the pieces, to break the stream mid-reply for sure.
    pub fn break_after(mut self, pieces: usize) -> Reply {
        self.break_after = Some(pieces);
        self
    }

    /// Ends lines with CRLF, as some servers do.
    pub fn crlf(mut self) -> Reply {
        self.crlf = true;
        self
    }

    /// Puts comment lines (`: keep-alive`) between events.
    pub fn comments(mut self) -> Reply {
        self.comments = true;
        self
    }

    /// Ends the stream without `data: [DONE]`.
    pub fn without_done(mut self) -> Reply {
        self.done = false;
        self
    }
}

/// A running stand-in server; stopped when dropped.
pub struct LlmServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

type Responder = Box<dyn Fn(&Request) -> Reply + Send + Sync>;

struct Shared {
    replies: Mutex<VecDeque<Reply>>,
    responder: Mutex<Option<Responder>>,
    requests: Mutex<Vec<Request>>,
    /// Replies whose client went away before their end.
    closed: Mutex<usize>,
    /// Bumped on every change, for the waiting helpers.
    changed: watch::Sender<u64>,
}

impl Shared {
    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }
}

impl Drop for LlmServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LlmServer {
    /// Starts a server on a free port of 127.0.0.1.
    pub async fn start() -> LlmServer {
        Self::start_on("127.0.0.1:0").await
    }

    /// Starts a server on `addr`, failing with a clear message if the port is taken. (An
    /// agents file is pointed at it by `BATON_LLM_BASE_URL`, whatever its `base_url`.)
    async fn start_on(addr: &str) -> LlmServer {
        let shared = Arc::new(Shared {
            replies: Mutex::default(),
            responder: Mutex::default(),
            requests: Mutex::default(),
            closed: Mutex::default(),
            changed: watch::channel(0).0,
        });
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("the stand-in LLM server cannot listen on {addr}: {e}"));
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        LlmServer { addr, shared, task }
    }

    /// `http://127.0.0.1:<port>/v1`, an agent's `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queues a reply.
    pub fn push(&self, reply: Reply) -> &Self {
        self.shared.replies.lock().unwrap().push_back(reply);
        self
    }

    /// Answers with `responder` when no reply is queued.
    pub fn respond_with(&self, responder: impl Fn(&Request) -> Reply + Send + Sync + 'static) {
        *self.shared.responder.lock().unwrap() = Some(Box::new(responder));
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// How many replies were cut short by their client going away.
    pub fn closed(&self) -> usize {
        *self.shared.closed.lock().unwrap()
    }

    /// Waits until `n` requests came (panics after [`DEADLINE`]).
    pub async fn wait_for_requests(&self, n: usize) -> Vec<Request> {
        self.wait_until(|| self.requests().len() >= n, "requests")
            .await;
        self.requests()
    }

    /// Waits until `n` replies were cut short by their client (panics after [`DEADLINE`]).
    pub async fn wait_for_closed(&self, n: usize) {
        self.wait_until(|| self.closed() >= n, "closed connections")
            .await;
    }

    async fn wait_until(&self, done: impl Fn() -> bool, what: &str) {
        let mut changed = self.shared.changed.subscribe();
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while !done() {
            if tokio::time::timeout_at(deadline, changed.changed())
                .await
                .is_err()
            {
                panic!("the stand-in LLM server waited {DEADLINE:?} for {what}");
            }
        }
    }
}

async fn handle(State(shared): State<Arc<Shared>>, request: HttpRequest) -> Response {
    let (parts, body) = request.into_parts();
    let raw = axum::body::to_bytes(body, 16 << 20)
        .await
        .unwrap_or_default();
    let raw_body = String::from_utf8_lossy(&raw).into_owned();
    let request = Request {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        headers: parts.headers,
        body: serde_json::from_str(&raw_body).unwrap_or(Value::Null),
        raw_body,
        at: tokio::time::Instant::now(),
    };
    let reply = if request.path != "/v1/chat/completions" {
        Reply::error(
            404,
            &format!(
                "Unknown request URL: {} {}. Please check the URL for typos.",
                request.method, request.path
            ),
        )
    } else {
        let queued = shared.replies.lock().unwrap().pop_front();
        let answered = queued.or_else(|| {
            let responder = shared.responder.lock().unwrap();
            responder.as_ref().map(|respond| respond(&request))
        });
        answered.unwrap_or_else(|| Reply::raw(500, "the stand-in server has no reply scripted"))
    };
    let response = respond(&shared, &request, reply);
    shared.requests.lock().unwrap().push(request);
    shared.bump();
    response
}

/// One piece of a reply's body, or what to do between pieces.
enum Frame {
    Data(String),
    Hold(Gate),
    Break,
}

fn respond(shared: &Arc<Shared>, request: &Request, reply: Reply) -> Response {
    let model = reply
        .model
        .clone()
        .or_else(|| request.body["model"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "stand-in".to_owned());
    let (content_type, frames) = match &reply.body {
        ReplyBody::Raw(body) => ("application/json", vec![Frame::Data(body.clone())]),
        ReplyBody::Completion(content) => {
            let (prompt, completion) = reply.usage;
            let body = json!({
                "id": "chatcmpl-standin", "object": "chat.completion", "created": 0, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                             "finish_reason": reply.finish_reason}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                          "total_tokens": prompt + completion}
            });
            ("application/json", vec![Frame::Data(body.to_string())])
        }
        ReplyBody::Stream(pieces) => {
            let usage = request.body["stream_options"]["include_usage"] == true;
            (
                "text/event-stream",
                stream_frames(&reply, pieces, &model, usage),
            )
        }
    };
    let mut frames: VecDeque<Frame> = frames.into();
    // Holding before the first piece holds everything.
    if let Some((0, gate)) = &reply.hold {
        frames.push_front(Frame::Hold(gate.clone()));
    }
    let (sender, receiver) = mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    tokio::spawn(write_frames(shared.clone(), frames, sender));
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(receiver));
    let mut response = Response::builder()
        .status(StatusCode::from_u16(reply.status).unwrap())
        .header("content-type", content_type);
    for (name, value) in &reply.headers {
        response = response.header(name, value);
    }
    response.body(body).unwrap()
}

/// The events of a streamed completion, with the reply's holds and break among them.
fn stream_frames(reply: &Reply, pieces: &[String], model: &str, usage: bool) -> Vec<Frame> {
    let end = if reply.crlf { "\r\n" } else { "\n" };
    let event = |data: &str| Frame::Data(format!("data: {data}{end}{end}"));
    let chunk = |choices: Value| {
        json!({"id": "chatcmpl-standin", "object": "chat.completion.chunk", "created": 0,
               "model": model, "choices": choices})
    };
    let mut frames = vec![event(
        &chunk(json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]))
            .to_string(),
    )];
    for (at, piece) in pieces.iter().enumerate() {
        if let Some((hold_at, gate)) = &reply.hold
            && *hold_at == at
            && at > 0
        {
            frames.push(Frame::Hold(gate.clone()));
        }
        if reply.break_after == Some(at) {
            frames.push(Frame::Break);
            return frames;
        }
        if reply.comments {
            frames.push(Frame::Data(format!(": keep-alive{end}{end}")));
        }
        frames.push(event(
            &chunk(json!([{"index": 0, "delta": {"content": piece}, "finish_reason": null}]))
                .to_string(),
        ));
    }
    if reply.break_after == Some(pieces.len()) {
        frames.push(Frame::Break);
        return frames;
    }
    frames.push(event(
        &chunk(json!([{"index": 0, "delta": {}, "finish_reason": reply.finish_reason}]))
            .to_string(),
    ));
    if usage {
        let (prompt, completion) = reply.usage;
        let mut last = chunk(json!([]));
        last["usage"] = json!({"prompt_tokens": prompt, "completion_tokens": completion,
                               "total_tokens": prompt + completion});
        frames.push(event(&last.to_string()));
    }
    if reply.done {
        frames.push(event("[DONE]"));
    }
    frames
}

/// Writes `frames` into a response body; notes when the client went away first.
async fn write_frames(
    shared: Arc<Shared>,
    frames: VecDeque<Frame>,
    sender: mpsc::Sender<Result<Bytes, std::io::Error>>,
) {
    let client_gone = |shared: &Shared| {
        *shared.closed.lock().unwrap() += 1;
        shared.bump();
    };
    for frame in frames {
        match frame {
            Frame::Data(text) => {
                if sender.send(Ok(Bytes::from(text))).await.is_err() {
                    return client_gone(&shared);
                }
            }
            Frame::Hold(gate) => {
                tokio::select! {
                    _ = gate.opened() => {}
                    _ = sender.closed() => return client_gone(&shared),
                }
            }
            Frame::Break => {
                let broken = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "broken off");
                let _ = sender.send(Err(broken)).await;
                return;
            }
        }
    }
}
