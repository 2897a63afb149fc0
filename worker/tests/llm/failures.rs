//! When the model server does not answer as it should: retries, refusals, timeouts, a
//! cancelled run; and the key, kept out of everything but the Authorization header.

use std::path::Path;
use std::time::Duration;

use baton_worker::agents::{AgentError, AgentsFile};
use serde_json::json;

use super::llm_server::{DEADLINE, Gate, LlmServer, Reply};
use super::{KEY, coder, next_piece, payload, run, shown, spawn_run};

#[tokio::test]
async fn a_429_is_retried_after_the_servers_retry_after() {
    let server = LlmServer::start().await;
    server.push(Reply::rate_limited("1"));
    server.push(Reply::json("{\"ok\": true}"));
    let file = coder(&server, "prompt = \"x\"\nstream = false\nhttp_retries = 1");
    let (answer, _) = run(&file, payload()).await;
    let output = answer.unwrap();
    assert_eq!(output.data, json!({"ok": true}));
    let requests = server.requests();
    let waited = requests[1].at - requests[0].at;
    assert!(waited >= Duration::from_millis(900), "waited {waited:?}");
    assert_eq!(output.calls.len(), 2, "the refused call counts as a call");
    assert_eq!(output.calls[0].prompt_tokens, 0);
}

#[tokio::test]
async fn a_retry_after_longer_than_a_minute_fails_the_attempt_at_once() {
    let server = LlmServer::start().await;
    server.push(Reply::rate_limited("3600"));
    let file = coder(&server, "prompt = \"x\"");
    let error = run(&file, payload()).await.0.unwrap_err();
    assert!(
        matches!(error, AgentError::ModelUnavailable { .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.ends_with(
            "(the server asks to retry after 3600 s, longer than the 60 s waited within an attempt)"
        ),
        "{message}"
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn server_errors_are_retried_then_fail_the_attempt_retryable() {
    let server = LlmServer::start().await;
    for _ in 0..3 {
        server.push(Reply::raw(503, "upstream overloaded").retry_after("0"));
    }
    let file = coder(&server, "prompt = \"x\"");
    let agent = file.get("coder").unwrap();
    let (answer, _) = run(&file, payload()).await;
    let error = answer.unwrap_err();
    assert!(
        matches!(error, AgentError::ModelUnavailable { .. }),
        "{error:?}"
    );
    let failure = agent.failure(error);
    assert!(failure.is_retryable());
    assert_eq!(
        failure.message(),
        format!(
            "agent \"coder\": no reply from the model at {}/chat/completions: HTTP 503: upstream overloaded (tried 3 times)",
            server.base_url()
        )
    );
    assert_eq!(failure.calls().len(), 3);
    assert_eq!(server.requests().len(), 3, "the default http_retries is 2");
}

#[tokio::test]
async fn refusals_are_not_retried_and_name_the_server_message_and_url() {
    let server = LlmServer::start().await;
    server.push(Reply::unauthorized());
    server.push(Reply::model_not_found("qwen2.5-coder:7b"));
    server.push(Reply::raw(400, "plain text complaint"));
    let file = coder(&server, "prompt = \"x\"");
    let agent = file.get("coder").unwrap();
    for (status, expected) in [
        (401, "Incorrect API key provided: sk-test-****6789."),
        (404, "The model `qwen2.5-coder:7b` does not exist"),
        (400, "plain text complaint"),
    ] {
        let (answer, _) = run(&file, payload()).await;
        let error = answer.unwrap_err();
        assert!(
            matches!(error, AgentError::ModelRefused { status: s, .. } if s == status),
            "{error:?}"
        );
        let failure = agent.failure(error);
        assert!(!failure.is_retryable(), "{failure}");
        let message = failure.message();
        assert!(
            message.starts_with(&format!(
                "agent \"coder\": the model at {}/chat/completions refused the request (HTTP {status}): ",
                server.base_url()
            )),
            "{message}"
        );
        assert!(message.contains(expected), "{message}");
        assert!(!message.contains(KEY), "{message}");
        assert_eq!(failure.calls().len(), 1);
    }
    assert_eq!(server.requests().len(), 3, "no retries");
}

#[tokio::test]
async fn a_wrong_base_url_gets_the_servers_404_and_is_not_retried() {
    let server = LlmServer::start().await;
    // Without its /v1.
    let text = format!(
        "[agents.coder]\nkind = \"llm\"\nbase_url = \"http://{}\"\nmodel = \"m\"\nprompt = \"x\"\n",
        server.addr()
    );
    let file = AgentsFile::parse(&text, Path::new("/tmp")).unwrap();
    let error = run(&file, payload()).await.0.unwrap_err();
    assert!(
        matches!(error, AgentError::ModelRefused { status: 404, .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        format!(
            "agent \"coder\": the model at http://{}/chat/completions refused the request (HTTP 404): Unknown request URL: POST /chat/completions. Please check the URL for typos.",
            server.addr()
        )
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_stream_broken_midway_is_retried_and_the_live_output_restarts() {
    let server = LlmServer::start().await;
    let gate = Gate::new();
    server.push(
        Reply::stream(["{\"files\": ", "[\"a.ts\"", "]}"])
            .hold_before(2, &gate)
            .break_after(2),
    );
    server.push(Reply::stream(["{\"files\": ", "[\"b.ts\"]}"]));
    let file = coder(&server, "prompt = \"x\"");
    let (run, mut collected) = spawn_run(file, payload());
    let mut live = vec![
        next_piece(&mut collected).await,
        next_piece(&mut collected).await,
    ];
    // The client has the first two pieces: now the connection breaks.
    gate.open();
    let output = tokio::time::timeout(DEADLINE, run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    live.extend(collected.written());
    assert_eq!(output.data, json!({"files": ["b.ts"]}));
    assert_eq!(
        live,
        [
            ("{\"files\": ".to_owned(), false),
            ("[\"a.ts\"".to_owned(), false),
            ("{\"files\": ".to_owned(), true),
            ("[\"b.ts\"]}".to_owned(), false),
        ]
    );
    assert_eq!(shown(&live), "{\"files\": [\"b.ts\"]}");
    assert_eq!(output.calls.len(), 2);
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn the_key_is_only_ever_in_the_authorization_header() {
    let server = LlmServer::start().await;
    // A server (or a proxy) that echoes the key back in its error.
    server.push(Reply::error(401, &format!("key {KEY} is revoked")));
    for _ in 0..2 {
        server.push(Reply::raw(500, &format!("{{\"error\": \"bad key {KEY}\"}}")).retry_after("0"));
    }
    let file = coder(&server, "prompt = \"{{input}}\"\nhttp_retries = 1");
    let agent = file.get("coder").unwrap();
    assert!(!format!("{file:?}").contains(KEY));
    assert!(!format!("{agent:?}").contains(KEY));
    for _ in 0..2 {
        let error = run(&file, payload()).await.0.unwrap_err();
        assert!(!format!("{error:?}").contains(KEY), "{error:?}");
        let failure = agent.failure(error);
        assert!(!failure.message().contains(KEY), "{failure}");
        assert!(failure.message().contains("<redacted>"), "{failure}");
        assert!(!format!("{failure:?}").contains(KEY));
    }
    for request in server.requests() {
        assert!(!request.raw_body.contains(KEY));
        for (name, value) in &request.headers {
            let value = value.to_str().unwrap();
            if name == "authorization" {
                assert_eq!(value, format!("Bearer {KEY}"));
            } else {
                assert!(!value.contains(KEY), "{name}: {value}");
            }
        }
    }
}

#[tokio::test]
async fn an_unreachable_server_is_retried_then_fails_with_no_model_call() {
    // A port nobody listens on: bind one, then let it go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let text = format!(
        "[agents.coder]\nkind = \"llm\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\nmodel = \"m\"\nprompt = \"x\"\nhttp_retries = 1\n"
    );
    let file = AgentsFile::parse(&text, Path::new("/tmp")).unwrap();
    let error = run(&file, payload()).await.0.unwrap_err();
    assert!(
        matches!(error, AgentError::ModelUnavailable { .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains("(tried 2 times)"), "{message}");
    assert!(message.to_lowercase().contains("connect"), "{message}");
    assert!(error.calls().is_empty(), "no connection, no model call");
}

#[tokio::test]
async fn a_silent_server_times_out_and_its_connection_is_closed() {
    let server = LlmServer::start().await;
    let gate = Gate::new();
    server.push(Reply::stream(["{\"a\": ", "1}"]).hold_before(1, &gate));
    let file = coder(
        &server,
        "prompt = \"x\"\nidle_timeout_ms = 300\nhttp_retries = 0",
    );
    let error = run(&file, payload()).await.0.unwrap_err();
    let message = error.to_string();
    assert!(
        message.ends_with("the server sent nothing for 300 ms (idle_timeout_ms) (tried 1 time)"),
        "{message}"
    );
    server.wait_for_closed(1).await;
    assert_eq!(error.calls().len(), 1);
}

#[tokio::test]
async fn dropping_a_running_agent_closes_its_request_at_once() {
    let server = LlmServer::start().await;
    let gate = Gate::new();
    server.push(Reply::stream(["{\"a\": ", "1}"]).hold_before(1, &gate));
    let file = coder(&server, "prompt = \"x\"");
    let (run, mut collected) = spawn_run(file, payload());
    // The reply has started: a request is in flight, mid-stream.
    assert_eq!(next_piece(&mut collected).await.0, "{\"a\": ");
    assert_eq!(server.closed(), 0);
    // A cancelled run or a timed-out step drops the agent's future.
    run.abort();
    assert!(run.await.unwrap_err().is_cancelled());
    server.wait_for_closed(1).await;
    gate.open();
}
