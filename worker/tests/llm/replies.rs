//! What an llm agent sends, and what it makes of the replies it gets.

use std::path::Path;
use std::time::Duration;

use baton_worker::agents::{Agent, AgentError, AgentsFile};
use baton_worker::{OutputSink, Payload};
use serde_json::json;

use super::llm_server::{DEADLINE, Gate, LlmServer, Reply};
use super::{KEY, coder, coder_in, next_piece, payload, run, shown, spawn_run};

#[tokio::test]
async fn a_plain_reply_and_the_request_it_answers() {
    let server = LlmServer::start().await;
    server.push(
        Reply::json("{\"files\": [\"src/theme.ts\"]}")
            .model("qwen2.5-coder:7b-instruct-q4")
            .usage(120, 30),
    );
    let file = coder(
        &server,
        "system = \"You code for {{context.team}}.\"\nprompt = \"Task: {{input}}\"\nstream = false\ntemperature = 0.2\nmax_tokens = 300\nseed = 7\nstop = \"END\"\nextra = { keep_alive = \"5m\", options = { num_ctx = 8192 } }\n",
    );
    let mut input = payload();
    input["context"]["team"] = json!("the web team");
    let (answer, live) = run(&file, input).await;
    let output = answer.unwrap();
    assert_eq!(output.data, json!({"files": ["src/theme.ts"]}));
    assert_eq!(
        output.messages,
        [json!({"role": "assistant", "content": "{\"files\": [\"src/theme.ts\"]}"})]
    );
    assert_eq!(shown(&live), "{\"files\": [\"src/theme.ts\"]}");
    let [call] = output.calls.as_slice() else {
        panic!("one call: {:?}", output.calls);
    };
    assert_eq!(call.system, "openai");
    assert_eq!(call.model, "qwen2.5-coder:7b-instruct-q4");
    assert_eq!((call.prompt_tokens, call.completion_tokens), (120, 30));
    assert_eq!(call.finish_reason.as_deref(), Some("stop"));
    assert_eq!(call.first_token, None);
    assert!(call.duration > Duration::ZERO);

    let [request] = server.requests().try_into().unwrap();
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(
        request.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(
        request.body,
        json!({
            "model": "qwen2.5-coder:7b",
            "messages": [
                {"role": "system", "content": "You code for the web team."},
                {"role": "user", "content": "Task: Add dark mode toggle"}
            ],
            "temperature": 0.2, "max_tokens": 300, "seed": 7, "stop": "END",
            "stream": false,
            "keep_alive": "5m", "options": {"num_ctx": 8192}
        })
    );
}

#[tokio::test]
async fn a_streamed_reply_reaches_the_sink_piece_by_piece_as_it_comes() {
    let server = LlmServer::start().await;
    let gate = Gate::new();
    server.push(
        Reply::stream(["{\"files\": ", "[\"a.ts\"", ", \"b.ts\"]}"])
            .crlf()
            .comments()
            .usage(50, 9)
            .hold_before(2, &gate),
    );
    let file = coder(&server, "prompt = \"{{input}}\"");
    let (run, mut collected) = spawn_run(file, payload());
    // The first pieces arrive while the server still holds the rest.
    assert_eq!(
        next_piece(&mut collected).await,
        ("{\"files\": ".to_owned(), false)
    );
    assert_eq!(
        next_piece(&mut collected).await,
        ("[\"a.ts\"".to_owned(), false)
    );
    assert!(!run.is_finished());
    gate.open();
    let output = tokio::time::timeout(DEADLINE, run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(collected.written(), [(", \"b.ts\"]}".to_owned(), false)]);
    assert_eq!(output.data, json!({"files": ["a.ts", "b.ts"]}));
    let [call] = output.calls.as_slice() else {
        panic!("one call: {:?}", output.calls);
    };
    assert_eq!((call.prompt_tokens, call.completion_tokens), (50, 9));
    assert_eq!(call.model, "qwen2.5-coder:7b");
    assert_eq!(call.finish_reason.as_deref(), Some("stop"));
    let first_token = call.first_token.expect("a streamed reply's first token");
    assert!(first_token <= call.duration);

    let [request] = server.requests().try_into().unwrap();
    assert_eq!(request.header("accept"), Some("text/event-stream"));
    assert_eq!(request.body["stream"], true);
    assert_eq!(
        request.body["stream_options"],
        json!({"include_usage": true})
    );
    assert!(request.body.get("response_format").is_none());
}

#[tokio::test]
async fn a_stream_without_done_is_complete_once_the_model_said_why_it_stopped() {
    let server = LlmServer::start().await;
    server.push(Reply::stream(["[1, ", "2]"]).without_done());
    let (answer, _) = run(&coder(&server, "prompt = \"x\""), payload()).await;
    assert_eq!(answer.unwrap().data, json!([1, 2]));
}

#[tokio::test]
async fn json_is_found_in_a_fence_or_in_prose() {
    let server = LlmServer::start().await;
    server.push(Reply::json(
        "Here is the plan:\n```json\n{\"approach\": \"CSS variables\"}\n```\nGood luck!",
    ));
    server.push(Reply::stream([
        "Sure! ",
        "{\"approved\": true} ",
        "Anything else?",
    ]));
    let file = coder(&server, "prompt = \"x\"");
    let (answer, _) = run(&file, payload()).await;
    assert_eq!(answer.unwrap().data, json!({"approach": "CSS variables"}));
    let (answer, _) = run(&file, payload()).await;
    let output = answer.unwrap();
    assert_eq!(output.data, json!({"approved": true}));
    // The history keeps what the model said, prose and all.
    assert_eq!(
        output.messages[0]["content"],
        "Sure! {\"approved\": true} Anything else?"
    );
}

#[tokio::test]
async fn a_truncated_reply_is_repaired() {
    let server = LlmServer::start().await;
    let truncated = "{\"files\": [\"src/theme.ts\", \"src/tog";
    server.push(
        Reply::stream([truncated])
            .finish_reason("length")
            .usage(100, 4096),
    );
    server.push(Reply::stream(["{\"files\": [\"src/theme.ts\"]}"]).usage(140, 12));
    let file = coder(&server, "prompt = \"Plan: {{input}}\"");
    let (answer, live) = run(&file, payload()).await;
    let output = answer.unwrap();
    assert_eq!(output.data, json!({"files": ["src/theme.ts"]}));
    // The repair's reply starts the live output again.
    assert_eq!(
        live,
        [
            (truncated.to_owned(), false),
            ("{\"files\": [\"src/theme.ts\"]}".to_owned(), true)
        ]
    );
    assert_eq!(
        output.messages.len(),
        1,
        "only the final reply goes to the history"
    );
    assert_eq!(output.calls.len(), 2);
    assert_eq!(output.calls[0].finish_reason.as_deref(), Some("length"));
    assert_eq!(output.calls[1].prompt_tokens, 140);

    let requests = server.requests();
    let repair = requests[1].messages();
    assert_eq!(repair.len(), 3);
    assert_eq!(
        repair[0],
        json!({"role": "user", "content": "Plan: Add dark mode toggle"})
    );
    assert_eq!(
        repair[1],
        json!({"role": "assistant", "content": truncated})
    );
    let asked = repair[2]["content"].as_str().unwrap();
    assert_eq!(repair[2]["role"], "user");
    assert!(
        asked.contains("ends before it is complete (EOF while parsing"),
        "{asked}"
    );
    assert!(
        asked.contains("cut off at the model's token limit"),
        "{asked}"
    );
}

#[tokio::test]
async fn a_reply_that_fails_the_schema_is_repaired_with_its_pointer() {
    let dir = tempfile::tempdir().unwrap();
    let schema = json!({
        "type": "object",
        "required": ["files", "approach"],
        "properties": {"files": {"type": "array", "items": {"type": "string"}}}
    });
    std::fs::write(dir.path().join("plan.json"), schema.to_string()).unwrap();
    let server = LlmServer::start().await;
    server.push(Reply::json(
        "{\"files\": [\"a.ts\", 2], \"approach\": \"x\"}",
    ));
    server.push(Reply::json("{\"files\": [\"a.ts\"], \"approach\": \"x\"}"));
    let file = coder_in(
        dir.path(),
        &server,
        "prompt = \"x\"\njson_schema_file = \"plan.json\"\nstream = false",
    );
    let (answer, _) = run(&file, payload()).await;
    assert_eq!(
        answer.unwrap().data,
        json!({"files": ["a.ts"], "approach": "x"})
    );
    let requests = server.requests();
    assert_eq!(
        requests[0].body["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "coder", "schema": schema}})
    );
    let asked = requests[1].last_content();
    assert!(
        asked.contains("does not match the JSON schema: at /files/1: 2 is not of type \"string\""),
        "{asked}"
    );
}

#[tokio::test]
async fn a_reply_still_unusable_after_its_repairs_fails_quoting_it() {
    let server = LlmServer::start().await;
    let rambling = format!("I think the plan should be... {}", "and so on ".repeat(50));
    server.push(Reply::json(&rambling).usage(10, 100));
    server.push(Reply::json(&rambling).usage(20, 100));
    let file = coder(&server, "prompt = \"x\"\nstream = false\nmax_repairs = 1");
    let agent = file.get("coder").unwrap();
    let (answer, _) = run(&file, payload()).await;
    let error = answer.unwrap_err();
    assert!(matches!(error, AgentError::BadReply { .. }), "{error:?}");
    let failure = agent.failure(error);
    assert!(failure.is_retryable());
    let message = failure.message();
    assert!(
        message.starts_with("agent \"coder\": unusable reply from the model: the reply holds no JSON object or array, after 1 repair; the reply starts with: \"I think the plan should be... and so on"),
        "{message}"
    );
    assert!(message.ends_with("…\""), "quoted short: {message}");
    assert!(message.len() < 400, "{message}");
    let tokens: Vec<u64> = failure.calls().iter().map(|c| c.prompt_tokens).collect();
    assert_eq!(
        tokens,
        [10, 20],
        "the calls of a failed attempt are reported"
    );
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn an_envelope_records_decisions_and_text_output_wraps_the_reply() {
    let server = LlmServer::start().await;
    server.push(Reply::json(
        &json!({
            "data": {"approved": true},
            "decisions": [{"summary": "Use CSS variables", "rationale": "no runtime cost"}]
        })
        .to_string(),
    ));
    let file = coder(
        &server,
        "prompt = \"x\"\noutput = \"envelope\"\nstream = false",
    );
    let (answer, _) = run(&file, payload()).await;
    let output = answer.unwrap();
    assert_eq!(output.data, json!({"approved": true}));
    assert_eq!(
        output.decisions,
        [json!({"summary": "Use CSS variables", "rationale": "no runtime cost"})]
    );
    assert_eq!(output.messages.len(), 1);

    server.push(Reply::stream(["Looks ", "good {to me"]));
    let file = coder(&server, "prompt = \"x\"\noutput = \"text\"");
    let (answer, _) = run(&file, payload()).await;
    let output = answer.unwrap();
    assert_eq!(output.data, json!({"text": "Looks good {to me"}));
    assert_eq!(
        output.messages,
        [json!({"role": "assistant", "content": "Looks good {to me"})]
    );
}

#[tokio::test]
async fn the_runs_history_goes_before_the_prompt() {
    let server = LlmServer::start().await;
    server.push(Reply::json("{}"));
    server.push(Reply::json("{}"));
    let mut input = payload();
    input["messages"] = json!([
        {"id": "plan#1/1", "role": "assistant", "name": "planner", "content": "{\"files\": []}"},
        {"id": "approve#1/1", "role": "approver", "name": "alice", "content": {"approved": true}},
    ]);
    let file = coder(
        &server,
        "system = \"S\"\nprompt = \"P\"\nhistory = true\nstream = false",
    );
    run(&file, input.clone()).await.0.unwrap();
    let without = coder(&server, "prompt = \"P\"\nstream = false");
    run(&without, input).await.0.unwrap();
    let requests = server.requests();
    assert_eq!(
        requests[0].body["messages"],
        json!([
            {"role": "system", "content": "S"},
            {"role": "assistant", "name": "planner", "content": "{\"files\": []}"},
            {"role": "user", "name": "alice", "content": "{\"approved\":true}"},
            {"role": "user", "content": "P"}
        ])
    );
    assert_eq!(
        requests[1].body["messages"],
        json!([{"role": "user", "content": "P"}])
    );
}

/// The example's llm agents, pointed at the stand-in server by `BATON_LLM_BASE_URL` alone, send
/// the spec's prompts rendered by the prompt rules.
#[tokio::test]
async fn the_example_agents_send_the_specs_prompts() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/feature-development");
    let text = std::fs::read_to_string(dir.join("agents.llm.toml")).unwrap();
    let server = LlmServer::start().await;
    let base_url = server.base_url();
    let env = |name: &str| (name == "BATON_LLM_BASE_URL").then(|| base_url.clone());
    let agents = AgentsFile::parse_with_env(&text, &dir, &env).unwrap_or_else(|e| panic!("{e}"));
    // A plan fits the planner's schema; the others take any JSON.
    let answer = json!({"files": ["src/theme.ts"], "approach": "CSS variables", "steps": ["one"]});
    let reply = answer.to_string();
    server.respond_with(move |_| Reply::stream([reply.as_str()]));

    let plan = json!({
        "files": ["src/theme.ts", "src/toggle.tsx"],
        "approach": "Use CSS variables",
        "steps": ["Create theme context", "Build toggle component", "Add tests"]
    });
    let code = json!({
        "filesCreated": ["src/theme.ts", "src/toggle.tsx"],
        "filesModified": ["src/App.tsx"],
        "changes": "Added theme context and toggle component"
    });
    let coder_payload = json!({
        "input": "Add dark mode toggle", "plan": plan,
        "context": {"plan": plan, "approve-plan": {"approved": true}}
    });
    let reviewer_payload = json!({
        "input": "Add dark mode toggle", "code": code,
        "context": {"plan": plan, "code": code, "parallel-tests": {
            "data": [
                {"stepId": "unit", "result": {"passed": 15, "failed": 0, "coverage": 95}},
                {"stepId": "integration", "result": {"passed": 5, "failed": 0}}
            ],
            "success": true
        }}
    });
    for (agent, payload, expected) in [
        (
            "planner",
            json!({"input": "Add dark mode toggle", "context": {}}),
            "## Task\nAdd dark mode toggle\n",
        ),
        (
            "coder",
            coder_payload,
            "Files to create: [\"src/theme.ts\",\"src/toggle.tsx\"]\n",
        ),
        (
            "reviewer",
            reviewer_payload,
            "- unit: 15 passed, 0 failed\n- integration: 5 passed, 0 failed\n",
        ),
    ] {
        let agent = agents.get(agent).unwrap();
        let output = agent
            .run(&Payload::from_value(payload), &[], &OutputSink::none())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(output.data, answer);
        let request = server.requests().pop().unwrap();
        let prompt = request.last_content();
        assert!(prompt.contains(expected), "{}: {prompt}", agent.name());
        assert!(!prompt.contains("{{"), "{prompt}");
    }
    assert!(matches!(agents.get("test-unit"), Some(Agent::Llm(_))));
}
