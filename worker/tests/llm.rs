//! The `llm` agent kind against a stand-in OpenAI-compatible server
//! (`tests/support/llm_server.rs`, at the workspace's root).
//!
//! - `replies`: what it sends, how it reads plain and streamed replies, the JSON it finds,
//!   repairs, envelopes and text, the run's history, the example's prompts.
//! - `failures`: retries (429, 5xx, a broken stream), refusals, the key kept secret, timeouts,
//!   and a cancelled run closing its request.

#[path = "../../tests/support/llm_server.rs"]
mod llm_server;

// In a folder of their own: a file directly in tests/ would be a test crate of its own.
#[path = "llm/failures.rs"]
mod failures;
#[path = "llm/replies.rs"]
mod replies;

use std::path::Path;

use baton_worker::agents::{AgentError, AgentsFile};
use baton_worker::{CollectedOutput, Output, OutputSink, Payload};
use llm_server::{DEADLINE, LlmServer};
use serde_json::{Value, json};

const KEY: &str = "sk-test-5ecret-key-0123456789";

/// An agents file with one llm agent `coder` against `server`, its other fields `fields`,
/// in `dir`, with `TEST_KEY` set to [`KEY`].
fn coder_in(dir: &Path, server: &LlmServer, fields: &str) -> AgentsFile {
    let text = format!(
        "[agents.coder]\nkind = \"llm\"\nbase_url = \"{}\"\nmodel = \"qwen2.5-coder:7b\"\napi_key_env = \"TEST_KEY\"\n{fields}\n",
        server.base_url()
    );
    let env = |name: &str| (name == "TEST_KEY").then(|| KEY.to_owned());
    AgentsFile::parse_with_env(&text, dir, &env).unwrap_or_else(|e| panic!("{e}"))
}

fn coder(server: &LlmServer, fields: &str) -> AgentsFile {
    coder_in(Path::new("/tmp"), server, fields)
}

/// Runs `coder` on `payload`; its answer and the live output it wrote.
async fn run(
    file: &AgentsFile,
    payload: Value,
) -> (Result<Output, AgentError>, Vec<(String, bool)>) {
    let (sink, mut collected) = OutputSink::collecting();
    let agent = file.get("coder").unwrap();
    let answer = agent.run(&Payload::from_value(payload), &[], &sink).await;
    (answer, collected.written())
}

fn payload() -> Value {
    json!({"input": "Add dark mode toggle", "context": {}, "messages": []})
}

/// The text watchers end up with: a restart voids what came before it.
fn shown(pieces: &[(String, bool)]) -> String {
    let mut text = String::new();
    for (piece, restart) in pieces {
        if *restart {
            text.clear();
        }
        text.push_str(piece);
    }
    text
}

async fn next_piece(collected: &mut CollectedOutput) -> (String, bool) {
    tokio::time::timeout(DEADLINE, collected.next())
        .await
        .expect("a piece of live output in time")
        .expect("the sink is still there")
}

/// Runs `coder` of `file` on `payload` in a task of its own, with the end of its live output.
fn spawn_run(
    file: AgentsFile,
    payload: Value,
) -> (
    tokio::task::JoinHandle<Result<Output, AgentError>>,
    CollectedOutput,
) {
    let (sink, collected) = OutputSink::collecting();
    let run = tokio::spawn(async move {
        let payload = Payload::from_value(payload);
        file.get("coder").unwrap().run(&payload, &[], &sink).await
    });
    (run, collected)
}
