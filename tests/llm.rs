//! `llm` agents end to end, with the real `baton` binaries and a stand-in OpenAI-compatible
//! server (`support/llm_server.rs`): the spec's workflow with the spec's four prompts through
//! `baton dev` exactly as the README runs it and on a cluster with the same agents file, each
//! moved from the example's Ollama to the stand-in by environment variables alone; tokens
//! streaming to a watcher on another coordinator while the model still streams; a cancel and a
//! timeout in the middle of a stream.

#[path = "support/fleet.rs"]
mod fleet;
#[path = "support/cluster.rs"]
mod harness;
#[path = "support/llm_server.rs"]
mod llm_server;
#[path = "support/spec.rs"]
mod spec;

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use baton_proto::v1::run_service_client::RunServiceClient;
use baton_proto::v1::{
    CancelRunRequest, DecideApprovalRequest, GetRunRequest, RunEvent, RunRecord, WatchRunRequest,
    run_event,
};
use fleet::{Fleet, Timing};
use harness::{DEADLINE, baton, output_within};
use llm_server::{Gate, LlmServer, Reply, Request};
use serde_json::{Value, json};
use tonic::Streaming;
use tonic::transport::Channel;

/// The model `examples/feature-development/agents.llm.toml` names in its `[defaults.llm]`.
const EXAMPLE_MODEL: &str = "qwen2.5-coder:3b";

fn example(path: &str) -> PathBuf {
    harness::root()
        .join("examples/feature-development")
        .join(path)
}

/// Which of the spec's agents a request is from, by its prompt's first line.
fn agent_of(request: &Request) -> &'static str {
    let prompt = request
        .messages()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or(""));
    let text: String = prompt.collect::<Vec<_>>().join("\n");
    if text.contains("You are a planning specialist") {
        "planner"
    } else if text.contains("You are a coding specialist") {
        "coder"
    } else if text.contains("unit tests") && text.contains("You are a testing specialist") {
        "test-unit"
    } else if text.contains("You are a testing specialist") {
        "test-integration"
    } else if text.contains("You are a code reviewer") {
        "reviewer"
    } else {
        "unknown"
    }
}

/// Answers as a model would for the spec's pipeline, with the troubles the tests want once
/// each: a reply in a fence with prose around it (the coder), a 429 (the unit tester's first
/// request), a reply cut short then repaired (the integration tester).
fn model() -> impl Fn(&Request) -> Reply + Send + Sync + 'static {
    let seen: Mutex<std::collections::HashMap<&'static str, u32>> = Mutex::default();
    move |request| {
        let agent = agent_of(request);
        let n = {
            let mut seen = seen.lock().unwrap();
            let n = seen.entry(agent).or_default();
            *n += 1;
            *n
        };
        let reply = |text: &str| Reply::stream(chunks(text)).usage(120, 40);
        match (agent, n) {
            ("planner", _) => reply(
                r#"{"files": ["src/theme.ts", "src/toggle.tsx"], "approach": "Use CSS variables", "steps": ["Create theme context", "Build toggle component", "Add tests"]}"#,
            ),
            ("coder", _) => reply(
                "Here is the change.\n```json\n{\"filesCreated\": [\"src/theme.ts\", \"src/toggle.tsx\"], \"filesModified\": [\"src/App.tsx\"], \"changes\": \"Added theme context and toggle component\"}\n```\nThat is all.",
            ),
            ("test-unit", 1) => Reply::rate_limited("0"),
            ("test-unit", _) => reply(
                r#"{"passed": 15, "failed": 0, "coverage": 95, "details": "All tests passed"}"#,
            ),
            ("test-integration", 1) => reply(r#"{"passed": 5, "failed": 0, "details": "All"#),
            ("test-integration", _) => {
                reply(r#"{"passed": 5, "failed": 0, "details": "All tests passed"}"#)
            }
            ("reviewer", _) => reply(
                r#"{"approved": true, "comments": ["Good implementation", "Tests pass"], "suggestions": []}"#,
            ),
            _ => Reply::error(400, "a prompt this model does not know"),
        }
    }
}

/// A reply's text in pieces of a few characters, as tokens come.
fn chunks(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(7).map(|c| c.iter().collect()).collect()
}

/// Checks every prompt the pipeline sent: all rendered, the plan's files in the coder's, the
/// test counts in the reviewer's, the repair with the bad reply and its error.
fn check_the_prompts(requests: &[Request]) {
    for request in requests {
        for message in request.messages() {
            let content = message["content"].as_str().unwrap_or("");
            assert!(!content.contains("{{"), "an unrendered prompt: {content}");
        }
        assert_eq!(request.body["stream"], json!(true));
        assert_eq!(request.body["stream_options"]["include_usage"], json!(true));
    }
    let of = |agent: &str| -> Vec<&Request> {
        requests.iter().filter(|r| agent_of(r) == agent).collect()
    };
    let planner = of("planner");
    assert!(
        planner[0]
            .last_content()
            .contains("## Task\nAdd dark mode toggle")
    );
    assert_eq!(
        planner[0].body["response_format"]["type"],
        json!("json_schema")
    );
    let coder = of("coder")[0].last_content().to_owned();
    assert!(
        coder.contains(r#"Files to create: ["src/theme.ts","src/toggle.tsx"]"#),
        "{coder}"
    );
    assert!(coder.contains("Approach: Use CSS variables"), "{coder}");
    assert_eq!(of("test-unit").len(), 2, "the 429 was tried again");
    let integration = of("test-integration");
    assert_eq!(integration.len(), 2, "the cut reply was repaired once");
    let repair = integration[1].messages();
    let bad = &repair[repair.len() - 2];
    assert_eq!(bad["role"], json!("assistant"));
    assert_eq!(
        bad["content"],
        json!(r#"{"passed": 5, "failed": 0, "details": "All"#)
    );
    assert!(
        integration[1].last_content().contains("JSON"),
        "the repair names the error: {}",
        integration[1].last_content()
    );
    let reviewer = of("reviewer")[0].last_content().to_owned();
    assert!(
        reviewer.contains("- unit: 15 passed, 0 failed"),
        "{reviewer}"
    );
    assert!(
        reviewer.contains("- integration: 5 passed, 0 failed"),
        "{reviewer}"
    );
    assert!(
        reviewer.contains(r#"Files created: ["src/theme.ts","src/toggle.tsx"]"#),
        "{reviewer}"
    );
    // With `history = true` the reviewer sees what the agents before it answered.
    let history = of("reviewer")[0].messages();
    assert!(
        history.iter().any(|m| m["role"] == "assistant"
            && m["content"]
                .as_str()
                .unwrap_or("")
                .contains("\"passed\": 15")),
        "{history:?}"
    );
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The README's recipe, as printed (the binary `cargo run` builds, run from the repository):
/// `baton dev examples/feature-development/workflow.json --agents
/// examples/feature-development/agents.llm.toml --input "Add dark mode toggle"`, answering the
/// plan's approval at the terminal; `BATON_LLM_BASE_URL` in its environment, as the README
/// says, sends every agent of the file to the stand-in server instead of a local Ollama.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baton_dev_runs_the_spec_pipeline_against_a_local_model_as_the_readme_says() {
    let server = LlmServer::start().await;
    server.respond_with(model());
    let base_url = server.base_url();
    let args = [
        "dev",
        "examples/feature-development/workflow.json",
        "--agents",
        "examples/feature-development/agents.llm.toml",
        "--input",
        "Add dark mode toggle",
    ];
    harness::assert_doc_runs("docs/src/agents.md", "## Models (`llm` agents)", &args);
    let out = tokio::task::spawn_blocking(move || {
        let mut command = baton();
        command
            .current_dir(harness::root())
            .args(args)
            .env("BATON_LLM_BASE_URL", base_url);
        output_within(&mut command, Some("y\n"), Duration::from_secs(60))
    })
    .await
    .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    // Tokens were printed under their steps as they came: the reviewer's, which streams after
    // the approval was answered at the terminal, so surely to the watch (`baton dev` submits,
    // then watches: on a busy machine the planner may be done before the watch begins).
    assert!(stdout.contains("output"), "{stdout}");
    assert!(stdout.contains("    │ {\"approved\": true"), "{stdout}");
    assert!(
        stdout.contains("run ") && stdout.contains(" succeeded"),
        "{stdout}"
    );
    check_the_prompts(&server.requests());

    // With --json, only the final record: every step's data from its reply, and the tokens.
    server.respond_with(model());
    let server_requests_before = server.requests().len();
    let base_url = server.base_url();
    let out = tokio::task::spawn_blocking(move || {
        let mut command = baton();
        command
            .current_dir(harness::root())
            .args(args)
            .args(["--json", "--auto-approve"])
            .env("BATON_LLM_BASE_URL", base_url);
        output_within(&mut command, None, Duration::from_secs(60))
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let record: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(record["status"], json!("succeeded"));
    assert_eq!(
        record["context"]["code"]["filesModified"],
        json!(["src/App.tsx"]),
        "the fenced reply was parsed"
    );
    assert_eq!(record["context"]["review"]["approved"], json!(true));
    let calls = server.requests().len() - server_requests_before;
    let usage = &record["usage"][0];
    assert_eq!(usage["model"], json!(EXAMPLE_MODEL));
    // Every call answered with usage (120, 40) but the 429, which used none.
    assert_eq!(
        usage["prompt_tokens"],
        json!(120 * (calls as u64 - 1)),
        "{record}"
    );
    let unit = record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "unit")
        .unwrap();
    assert_eq!(unit["usage"][1]["completion_tokens"], json!(40), "{unit}");
}

/// A watch of a run: its events as they come, with a deadline.
struct Watch(Streaming<RunEvent>);

impl Watch {
    async fn start(client: &mut RunServiceClient<Channel>, run_id: &str) -> Watch {
        let events = client
            .watch_run(WatchRunRequest {
                run_id: run_id.to_owned(),
            })
            .await
            .unwrap()
            .into_inner();
        Watch(events)
    }

    async fn next(&mut self) -> run_event::Event {
        tokio::time::timeout(DEADLINE, self.0.message())
            .await
            .expect("an event within the deadline")
            .unwrap()
            .expect("the watch goes on")
            .event
            .unwrap()
    }

    /// The live output told until `until` holds for all of it.
    async fn output_until(&mut self, until: impl Fn(&str) -> bool) -> String {
        let mut streamed = String::new();
        while !until(&streamed) {
            if let run_event::Event::StepOutput(output) = self.next().await {
                streamed.push_str(&output.text);
            }
        }
        streamed
    }

    /// Events until the run's end; the output told on the way, and the final record.
    async fn finished(&mut self) -> (String, RunRecord) {
        let mut streamed = String::new();
        loop {
            match self.next().await {
                run_event::Event::StepOutput(output) => streamed.push_str(&output.text),
                run_event::Event::RunFinished(finished) => {
                    return (streamed, finished.record.unwrap());
                }
                _ => {}
            }
        }
    }
}

async fn submit(client: &mut RunServiceClient<Channel>, workflow: &Value) -> String {
    harness::submit(client, workflow.to_string(), &json!("go")).await
}

/// Two coordinators on one Redis, every process with `env`; workers go to the first.
async fn fleet(env: &[(&str, &str)]) -> Fleet {
    let timing = Timing {
        lease_ms: 2_000,
        worker_silence_ms: 3_000,
    };
    Fleet::start_with_env(2, timing, env).await
}

/// The spec's workflow on a cluster of real processes, with the very agents file `baton dev`
/// uses: a worker on one coordinator, the run watched and approved through the other. The
/// worker's environment moves every agent to another server and model
/// (`BATON_LLM_BASE_URL`, `BATON_LLM_MODEL`), as it would move them from Ollama to OpenAI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_agents_file_runs_unchanged_on_a_cluster() {
    let server = LlmServer::start().await;
    server.respond_with(model());
    let base_url = server.base_url();
    let env = [
        ("BATON_LLM_BASE_URL", base_url.as_str()),
        ("BATON_LLM_MODEL", "gpt-4o-mini"),
    ];
    let mut fleet = fleet(&env).await;
    fleet.start_worker("w1", &example("agents.llm.toml"), 4);
    fleet.wait_for_workers(1).await;
    let mut client = fleet.client(1).await.unwrap();
    let workflow = std::fs::read(example("workflow.json")).unwrap();
    let run_id = harness::submit(&mut client, workflow, &json!(spec::INPUT)).await;
    let mut watch = Watch::start(&mut client, &run_id).await;
    let mut planned = String::new();
    loop {
        match watch.next().await {
            run_event::Event::StepOutput(output) => planned.push_str(&output.text),
            run_event::Event::ApprovalRequested(_) => break,
            _ => {}
        }
    }
    assert!(planned.contains("src/toggle.tsx"), "{planned}");
    client
        .decide_approval(DecideApprovalRequest {
            run_id: run_id.clone(),
            step_id: "approve-plan".into(),
            approved: true,
            comment: String::new(),
            approver: "e2e".into(),
        })
        .await
        .unwrap();
    let (streamed, record) = watch.finished().await;
    assert_eq!(record.status, "succeeded", "{}", record.error);
    assert!(streamed.contains("\"approved\": true"), "{streamed}");
    let requests = server.requests();
    check_the_prompts(&requests);
    for request in &requests {
        assert_eq!(request.body["model"], json!("gpt-4o-mini"));
    }
    assert_eq!(record.usage.len(), 1);
    assert_eq!(record.usage[0].model, "gpt-4o-mini");
    assert!(record.usage[0].completion_tokens > 0);
    drop(fleet);
}

/// A one-step workflow of agent `talker`, which may be retried.
fn talker_workflow(timeout_ms: Option<u64>) -> Value {
    let mut step = json!({"id": "talk", "type": "agent", "agent": "talker",
                          "retry": {"max_attempts": 2, "initial_interval_ms": 10}});
    if let Some(timeout_ms) = timeout_ms {
        step["timeout_ms"] = json!(timeout_ms);
    }
    json!({"id": "talk", "steps": [step]})
}

/// An agents file with one `llm` agent, `talker`, on `server`, with a key from
/// `BATON_TEST_LLM_KEY`.
fn talker_agents(fleet: &Fleet, server: &LlmServer) -> PathBuf {
    let path = fleet.dir().join("talker.toml");
    std::fs::write(
        &path,
        format!(
            "[agents.talker]\nkind = \"llm\"\nbase_url = \"{}\"\nmodel = \"small\"\napi_key_env = \"BATON_TEST_LLM_KEY\"\nprompt = \"Say something about {{{{input}}}}.\"\n",
            server.base_url()
        ),
    )
    .unwrap();
    path
}

const SECRET: &str = "sk-test-0123456789-do-not-log";

async fn talker_fleet(server: &LlmServer) -> Fleet {
    let timing = Timing {
        lease_ms: 2_000,
        worker_silence_ms: 3_000,
    };
    let mut fleet = Fleet::start_with_env(2, timing, &[("BATON_TEST_LLM_KEY", SECRET)]).await;
    let agents = talker_agents(&fleet, server);
    fleet.start_worker("w1", &agents, 2);
    fleet.wait_for_workers(1).await;
    fleet
}

/// The worker is connected to one coordinator; a watcher on the other sees the first tokens
/// while the model still streams (the server holds the last piece until the test saw the
/// first ones), and a watcher that joins then gets what was streamed so far.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_reach_a_watcher_on_another_coordinator_while_the_model_streams() {
    let server = LlmServer::start().await;
    let gate = Gate::new();
    server.push(
        Reply::stream(["{\"answer\":", " 42, \"why\":", " \"because\"}"])
            .usage(11, 7)
            .hold_before(2, &gate),
    );
    let fleet = talker_fleet(&server).await;
    let mut far = fleet.client(1).await.unwrap();
    let run_id = submit(&mut far, &talker_workflow(None)).await;
    let mut early = Watch::start(&mut far, &run_id).await;
    let first = early
        .output_until(|text| text.contains("42, \"why\":"))
        .await;
    assert_eq!(
        first, "{\"answer\": 42, \"why\":",
        "the held piece is not out yet"
    );

    let mut near = fleet.client(0).await.unwrap();
    let mut late = Watch::start(&mut near, &run_id).await;
    let so_far = late
        .output_until(|text| text.contains("42, \"why\":"))
        .await;
    assert_eq!(
        so_far, first,
        "a late watcher first gets what was streamed so far"
    );

    gate.open();
    let (rest, record) = early.finished().await;
    assert_eq!(rest, " \"because\"}");
    assert_eq!(record.status, "succeeded", "{}", record.error);
    assert_eq!(
        harness::context(&record)["talk"],
        json!({"answer": 42, "why": "because"}),
        "the result is the reply, parsed"
    );
    let (late_rest, _) = late.finished().await;
    assert_eq!(late_rest, " \"because\"}");
    assert_eq!(
        (
            record.usage[0].prompt_tokens,
            record.usage[0].completion_tokens
        ),
        (11, 7)
    );

    // The key went to the model, and nowhere else.
    let request = &server.requests()[0];
    assert_eq!(
        request.header("authorization"),
        Some(format!("Bearer {SECRET}").as_str())
    );
    let logs: String = ["coordinator-0", "coordinator-1", "w1"]
        .iter()
        .map(|name| fleet.log_of(name))
        .collect();
    assert!(!logs.contains(SECRET), "the key is in a log");
    let full = far
        .get_run(GetRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        !format!("{full:?}").contains(SECRET),
        "the key is in the record"
    );
}

/// Cancelling a run while its model streams closes the request at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_run_mid_stream_closes_the_request() {
    let server = LlmServer::start().await;
    let never = Gate::new();
    server.push(Reply::stream(["{\"partial\":", " true}"]).hold_before(1, &never));
    let fleet = talker_fleet(&server).await;
    let mut client = fleet.client(1).await.unwrap();
    let run_id = submit(&mut client, &talker_workflow(None)).await;
    let mut watch = Watch::start(&mut client, &run_id).await;
    watch.output_until(|text| text.contains("partial")).await;
    let record = client
        .cancel_run(CancelRunRequest {
            run_id: run_id.clone(),
            reason: "changed my mind".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(record.status, "cancelled");
    server.wait_for_closed(1).await;
}

/// An attempt whose model stalls mid-stream past the step's timeout is stopped (its request
/// closed) and retried; the retry's reply is the step's data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_times_out_mid_stream_is_retried() {
    let server = LlmServer::start().await;
    let never = Gate::new();
    server.push(Reply::stream(["{\"stalled\":", " true}"]).hold_before(1, &never));
    server.push(Reply::stream(["{\"second\":", " \"try\"}"]));
    let fleet = talker_fleet(&server).await;
    let mut client = fleet.client(0).await.unwrap();
    let run_id = submit(&mut client, &talker_workflow(Some(1_000))).await;
    let mut watch = Watch::start(&mut client, &run_id).await;
    let (streamed, record) = watch.finished().await;
    assert_eq!(record.status, "succeeded", "{}", record.error);
    assert_eq!(harness::context(&record)["talk"], json!({"second": "try"}));
    assert!(
        streamed.contains("stalled") && streamed.contains("second"),
        "{streamed}"
    );
    assert_eq!(harness::step(&record, "talk").attempts, 2);
    server.wait_for_closed(1).await;
}
