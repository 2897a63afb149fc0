//! The tests of `config.rs`: the llm kind's fields, their defaults and their errors.

use crate::agents::config::testing::{agent_error, parse, parse_with_env};
use crate::agents::config::{ConfigError, Problem};
use crate::agents::{Agent, AgentsFile};

const MINIMAL: &str =
    "[agents.coder]\nkind = \"llm\"\nbase_url = \"http://localhost:11434/v1\"\nmodel = \"m\"\n";

fn with(fields: &str) -> String {
    format!("{MINIMAL}{fields}")
}

#[test]
fn a_minimal_agent_and_its_defaults() {
    let file = parse(&with("prompt = \"{{input}}\"\n")).unwrap();
    let Agent::Llm(agent) = file.get("coder").unwrap() else {
        panic!("an llm agent");
    };
    assert_eq!(file.get("coder").unwrap().kind(), "llm");
    assert_eq!(agent.model(), "m");
    assert_eq!(agent.url(), "http://localhost:11434/v1/chat/completions");
    assert!(agent.stream && !agent.history);
    assert_eq!(
        (agent.max_repairs, agent.output),
        (1, super::OutputMode::Json)
    );
    assert!(agent.sampling.is_empty() && agent.extra.is_empty());
}

#[test]
fn every_field() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("prompts")).unwrap();
    std::fs::write(dir.path().join("prompts/coder.md"), "Task: {{input}}").unwrap();
    std::fs::write(dir.path().join("code.json"), r#"{"type": "object"}"#).unwrap();
    let text = with(
        r#"api_key_env = "TEST_KEY"
system = "You are {{context.role}}."
prompt_file = "prompts/coder.md"
output = "envelope"
json_schema_file = "code.json"
max_repairs = 3
stream = false
history = true
temperature = 0.2
max_tokens = 512
top_p = 1
stop = ["\n\n", "END"]
seed = 7
extra = { keep_alive = "5m", options = { num_ctx = 8192 } }
http_retries = 0
idle_timeout_ms = 5000
"#,
    );
    let env = |name: &str| (name == "TEST_KEY").then(|| "sk-test-secret".to_owned());
    let file = AgentsFile::parse_with_env(&text, dir.path(), &env).unwrap();
    let Agent::Llm(agent) = file.get("coder").unwrap() else {
        panic!("an llm agent");
    };
    assert!(!agent.stream && agent.history);
    assert_eq!(agent.max_repairs, 3);
    assert_eq!(agent.output, super::OutputMode::Envelope);
    assert_eq!(
        serde_json::Value::Object(agent.sampling.clone()),
        serde_json::json!({"temperature": 0.2, "max_tokens": 512, "top_p": 1, "stop": ["\n\n", "END"], "seed": 7})
    );
    assert_eq!(
        serde_json::Value::Object(agent.extra.clone()),
        serde_json::json!({"keep_alive": "5m", "options": {"num_ctx": 8192}})
    );
    assert_eq!(
        agent.schema.as_ref().unwrap().value(),
        &serde_json::json!({"type": "object"})
    );
    let debug = format!("{file:?}");
    assert!(!debug.contains("sk-test-secret"), "{debug}");
    assert!(debug.contains("<redacted>"), "{debug}");
}

#[test]
fn required_fields() {
    let (problem, message) = agent_error(
        "[agents.coder]\nkind = \"llm\"\nmodel = \"m\"\nprompt = \"x\"\n",
        "coder",
        "base_url",
        1,
    );
    assert!(matches!(problem, Problem::Missing { .. }), "{problem:?}");
    assert!(message.contains("http://localhost:11434/v1"), "{message}");
    agent_error(
        "[agents.coder]\nkind = \"llm\"\nbase_url = \"http://x\"\nprompt = \"x\"\n",
        "coder",
        "model",
        1,
    );
    let (_, message) = agent_error(MINIMAL, "coder", "prompt", 1);
    assert!(message.contains("prompt_file"), "{message}");
    let (problem, _) = agent_error(
        &with("prompt = \"x\"\nprompt_file = \"p.md\"\n"),
        "coder",
        "prompt_file",
        6,
    );
    assert!(matches!(problem, Problem::Conflict { .. }), "{problem:?}");
}

#[test]
fn an_unset_key_variable_names_the_variable_and_the_agent() {
    let text = with("prompt = \"x\"\napi_key_env = \"BATON_TEST_NO_SUCH_KEY\"\n");
    let err = parse_with_env(&text, &[]).unwrap_err();
    let message = err.to_string();
    assert_eq!(
        message,
        "<inline agents.toml>:6: agent \"coder\": field `api_key_env` names the environment variable BATON_TEST_NO_SUCH_KEY, which is unset or empty"
    );
    assert!(parse_with_env(&text, &[("BATON_TEST_NO_SUCH_KEY", " ")]).is_err());
    assert!(parse_with_env(&text, &[("BATON_TEST_NO_SUCH_KEY", "k")]).is_ok());
    // The process's own environment, by default.
    assert!(matches!(
        parse(&text).unwrap_err(),
        ConfigError::Agent { ref problem, .. } if matches!(**problem, Problem::UnsetVariable { .. })
    ));
}

#[test]
fn prompts_that_do_not_compile_name_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("coder.md"), "line one\nline {{/if}} two\n").unwrap();
    let path = dir.path().join("agents.toml");
    std::fs::write(&path, with("prompt_file = \"coder.md\"\n")).unwrap();
    let message = AgentsFile::load(&path).unwrap_err().to_string();
    assert!(
        message.starts_with(&format!(
            "{}:5: agent \"coder\": field `prompt_file` names ",
            path.display()
        )),
        "{message}"
    );
    assert!(
        message.contains("coder.md, which does not compile: line 2, col "),
        "{message}"
    );
    let (problem, message) = agent_error(
        &with("prompt = \"x\"\nsystem = \"{{/if}}\"\n"),
        "coder",
        "system",
        6,
    );
    assert!(
        matches!(problem, Problem::TemplateCompile(_)),
        "{problem:?}"
    );
    assert!(
        message.contains("does not compile: line 1, col 3"),
        "{message}"
    );
}

#[test]
fn bad_values() {
    for (fields, field, needle) in [
        (
            "base_url = \"localhost:11434\"",
            "base_url",
            "http or https",
        ),
        ("base_url = 1", "base_url", "non-empty string"),
        ("output = \"data\"", "output", "\"envelope\""),
        ("max_repairs = -1", "max_repairs", "from 0 to 10"),
        ("http_retries = 11", "http_retries", "from 0 to 10"),
        ("stream = \"yes\"", "stream", "true or false"),
        ("temperature = \"hot\"", "temperature", "a number"),
        ("max_tokens = 0", "max_tokens", "positive integer"),
        ("stop = [1]", "stop", "array of strings"),
        ("idle_timeout_ms = 0", "idle_timeout_ms", "positive integer"),
        ("extra = { messages = [] }", "extra", "sets `messages`"),
        ("extra = { temperature = 1 }", "extra", "sets `temperature`"),
        ("extra = 1", "extra", "a table"),
        ("api_key_env = 1", "api_key_env", "environment variable"),
    ] {
        // A field given again replaces the minimal one: move base_url to the end instead.
        let text = if field == "base_url" {
            format!("[agents.coder]\nkind = \"llm\"\nmodel = \"m\"\nprompt = \"x\"\n{fields}\n")
        } else {
            with(&format!("prompt = \"x\"\n{fields}\n"))
        };
        let line = text.lines().count();
        let (_, message) = agent_error(&text, "coder", field, line);
        assert!(message.contains(needle), "{fields}: {message}");
    }
    let (problem, _) = agent_error(
        &with("prompt = \"x\"\ntimeout_ms = 5\n"),
        "coder",
        "timeout_ms",
        6,
    );
    assert!(
        matches!(
            problem,
            Problem::WrongKind {
                belongs_to: "command",
                ..
            }
        ),
        "{problem:?}"
    );
}

#[test]
fn schemas_are_read_and_compiled() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("not-json.json"), "{").unwrap();
    std::fs::write(dir.path().join("bad.json"), r#"{"type": 12}"#).unwrap();
    for (name, needle) in [
        ("missing.json", "cannot be read"),
        ("not-json.json", "is not JSON"),
        ("bad.json", "is not a JSON Schema"),
    ] {
        let text = with(&format!("prompt = \"x\"\njson_schema_file = \"{name}\"\n"));
        let err = AgentsFile::parse(&text, dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("field `json_schema_file`"), "{err}");
        assert!(err.contains(needle), "{name}: {err}");
    }
    let text = with("prompt = \"x\"\noutput = \"text\"\njson_schema_file = \"s.json\"\n");
    let err = AgentsFile::parse(&text, dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not apply to output = \"text\""), "{err}");
}
