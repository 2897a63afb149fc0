//! `[defaults.llm]` and `BATON_LLM_BASE_URL`, `BATON_LLM_MODEL`, `BATON_LLM_API_KEY_ENV`: what
//! an agent inherits, who wins, and the errors, which name the file, the line, the table (or
//! the agent and where its field came from) and the field.

use crate::agents::config::testing::parse_with_env;
use crate::agents::config::{ConfigError, Problem};
use crate::agents::{Agent, AgentsFile, LlmAgent};

/// Two agents sharing a server and a model: `coder` sets its own model.
const SHARED: &str = r#"[defaults.llm]
base_url = "http://localhost:11434/v1"
model = "qwen2.5-coder:3b"
temperature = 0.2

[agents.planner]
kind = "llm"
prompt = "Plan {{input}}"

[agents.coder]
kind = "llm"
model = "own-model"
prompt = "Code {{input}}"
temperature = 0
"#;

fn llm<'a>(file: &'a AgentsFile, name: &str) -> &'a LlmAgent {
    match file.get(name) {
        Some(Agent::Llm(agent)) => agent,
        other => panic!("{name} is not an llm agent: {other:?}"),
    }
}

fn error(text: &str, vars: &[(&str, &str)]) -> String {
    parse_with_env(text, vars)
        .expect_err("the file should be rejected")
        .to_string()
}

#[test]
fn agents_inherit_what_they_do_not_set() {
    let file = parse_with_env(SHARED, &[]).unwrap();
    let (planner, coder) = (llm(&file, "planner"), llm(&file, "coder"));
    assert_eq!(planner.url(), "http://localhost:11434/v1/chat/completions");
    assert_eq!(planner.model(), "qwen2.5-coder:3b");
    assert_eq!(planner.sampling["temperature"], serde_json::json!(0.2));
    assert_eq!(coder.url(), "http://localhost:11434/v1/chat/completions");
    assert_eq!(coder.model(), "own-model", "the agent's own field wins");
    assert_eq!(coder.sampling["temperature"], serde_json::json!(0));
}

/// The agent's own table, then the environment, then `[defaults.llm]`.
#[test]
fn the_environment_wins_over_the_defaults_and_the_agent_over_both() {
    let env = [
        ("BATON_LLM_BASE_URL", "https://api.openai.com/v1"),
        ("BATON_LLM_MODEL", "gpt-4o-mini"),
        ("BATON_LLM_API_KEY_ENV", "OPENAI_API_KEY"),
        ("OPENAI_API_KEY", "sk-test"),
    ];
    let file = parse_with_env(SHARED, &env).unwrap();
    let (planner, coder) = (llm(&file, "planner"), llm(&file, "coder"));
    assert_eq!(planner.url(), "https://api.openai.com/v1/chat/completions");
    assert_eq!(planner.model(), "gpt-4o-mini");
    assert!(
        format!("{planner:?}").contains("<redacted>"),
        "a key is sent"
    );
    assert_eq!(coder.url(), "https://api.openai.com/v1/chat/completions");
    assert_eq!(coder.model(), "own-model");
    // Blank is unset.
    let file = parse_with_env(SHARED, &[("BATON_LLM_MODEL", " ")]).unwrap();
    assert_eq!(llm(&file, "planner").model(), "qwen2.5-coder:3b");
    // Without any [defaults.llm], the variables alone give what agents leave out.
    let bare = "[agents.a]\nkind = \"llm\"\nprompt = \"x\"\n";
    let file = parse_with_env(bare, &env[..2]).unwrap();
    assert_eq!(llm(&file, "a").model(), "gpt-4o-mini");
}

#[test]
fn an_agent_that_sets_one_of_two_alternatives_inherits_neither() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("shared.md"), "Shared prompt").unwrap();
    let text = r#"[defaults.llm]
base_url = "http://localhost:11434/v1"
model = "m"
prompt_file = "shared.md"
system = "You are careful."

[agents.own]
kind = "llm"
prompt = "Own prompt"

[agents.shared]
kind = "llm"
system_file = "no-such-system.md"
"#;
    let parse = |text: &str| AgentsFile::parse_with_env(text, dir.path(), &|_| None);
    // `shared`'s own system_file is read (and missing), not the default system.
    let message = parse(text).unwrap_err().to_string();
    assert!(
        message
            .starts_with("<inline agents.toml>:13: agent \"shared\": field `system_file` names ")
            && message.contains("no-such-system.md"),
        "{message}"
    );
    let file = parse(&text.replace("system_file = \"no-such-system.md\"\n", "")).unwrap();
    let payload = serde_json::json!({"input": "x"});
    let (own, shared) = (llm(&file, "own"), llm(&file, "shared"));
    assert_eq!(own.prompt.render(&payload).unwrap(), "Own prompt");
    assert_eq!(shared.prompt.render(&payload).unwrap(), "Shared prompt");
    let system = own.system.as_ref().expect("the default system prompt");
    assert_eq!(system.render(&payload).unwrap(), "You are careful.");
}

#[test]
fn a_missing_base_url_says_where_it_may_be_set() {
    let message = error(
        "[agents.a]\nkind = \"llm\"\nmodel = \"m\"\nprompt = \"x\"\n",
        &[],
    );
    assert_eq!(
        message,
        "<inline agents.toml>:1: agent \"a\": field `base_url` is missing (the server's OpenAI-compatible API, e.g. \"http://localhost:11434/v1\"; set it in this table, in [defaults.llm] for every llm agent, or in BATON_LLM_BASE_URL)"
    );
}

/// A bad default is found whether or not an agent inherits it, and named as
/// `[defaults.llm]`'s, at its line.
#[test]
fn bad_defaults_name_the_table_the_field_and_the_line() {
    for (line, expected) in [
        (
            "temperature = \"hot\"",
            "<inline agents.toml>:3: [defaults.llm]: field `temperature` must be a number, 0 or more, found string",
        ),
        (
            "zzz = 1",
            "<inline agents.toml>:3: [defaults.llm]: field `zzz` is not a known field (expected one of: base_url, model, api_key_env, system, system_file, prompt, prompt_file, output, json_schema_file, max_repairs, stream, history, temperature, max_tokens, top_p, stop, seed, extra, http_retries, idle_timeout_ms)",
        ),
        (
            "timeout_ms = 5",
            "<inline agents.toml>:3: [defaults.llm]: field `timeout_ms` does not apply to kind \"llm\" (it belongs to kind \"command\")",
        ),
        (
            "kind = \"llm\"",
            "<inline agents.toml>:3: [defaults.llm]: field `kind` cannot be set here: [defaults.llm] is for every agent of kind \"llm\"",
        ),
        (
            "base_url = \"localhost:11434\"",
            "<inline agents.toml>:3: [defaults.llm]: field `base_url` ",
        ),
        (
            "api_key_env = \"NO_SUCH_KEY\"",
            "<inline agents.toml>:3: [defaults.llm]: field `api_key_env` names the environment variable NO_SUCH_KEY, which is unset or empty",
        ),
    ] {
        // The agent is a command: nothing inherits the defaults, and still they are checked.
        let text = format!(
            "[defaults.llm]\nmodel = \"m\"\n{line}\n\n[agents.a]\nkind = \"command\"\ncommand = [\"true\"]\n"
        );
        let err = parse_with_env(&text, &[]).unwrap_err();
        let message = err.to_string();
        assert!(message.starts_with(expected), "{line}: {message}");
        assert!(
            matches!(err, ConfigError::Defaults { ref kind, .. } if kind == "llm"),
            "{err:?}"
        );
    }
}

#[test]
fn a_bad_variable_is_named_with_the_field_it_sets() {
    let env = [("BATON_LLM_BASE_URL", "localhost:11434")];
    // Over [defaults.llm]: the table's error, at its line.
    let message = error(SHARED, &env);
    assert!(
        message.starts_with(
            "<inline agents.toml>:1: [defaults.llm]: field `base_url` (from environment variable BATON_LLM_BASE_URL) "
        ),
        "{message}"
    );
    // Alone: the error of the first agent that takes it.
    let message = error(
        "[agents.a]\nkind = \"llm\"\nmodel = \"m\"\nprompt = \"x\"\n",
        &env,
    );
    assert!(
        message.starts_with(
            "<inline agents.toml>:1: agent \"a\": field `base_url` (from environment variable BATON_LLM_BASE_URL) "
        ),
        "{message}"
    );
    let message = error(SHARED, &[("BATON_LLM_API_KEY_ENV", "OPENAI_API_KEY")]);
    assert_eq!(
        message,
        "<inline agents.toml>:1: [defaults.llm]: field `api_key_env` (from environment variable BATON_LLM_API_KEY_ENV) names the environment variable OPENAI_API_KEY, which is unset or empty"
    );
    // A file without llm agents or defaults does not read them.
    let commands = "[agents.a]\nkind = \"command\"\ncommand = [\"true\"]\n";
    assert!(parse_with_env(commands, &env).is_ok());
}

/// A default that is valid alone but not with the agent that inherits it: the agent's error,
/// at the default's line, saying where it came from.
#[test]
fn an_inherited_field_that_does_not_fit_its_agent_says_where_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("plan.json"), r#"{"type": "object"}"#).unwrap();
    let text = "[defaults.llm]\nbase_url = \"http://x/v1\"\nmodel = \"m\"\njson_schema_file = \"plan.json\"\n\n[agents.a]\nkind = \"llm\"\nprompt = \"x\"\noutput = \"text\"\n";
    let err = AgentsFile::parse_with_env(text, dir.path(), &|_| None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "<inline agents.toml>:4: agent \"a\": field `json_schema_file` (from [defaults.llm]) does not apply to output = \"text\" (the reply is not JSON)"
    );
    let ConfigError::Agent { from, problem, .. } = err else {
        panic!("an agent's error");
    };
    assert_eq!(from.as_deref(), Some("[defaults.llm]"));
    assert!(matches!(*problem, Problem::Invalid(_)));
}

#[test]
fn only_llm_agents_take_defaults() {
    for table in [
        "[defaults.command]\ntimeout_ms = 5\n",
        "[defaults.python]\n",
    ] {
        let name = table.lines().next().unwrap();
        assert_eq!(
            error(table, &[]),
            format!(
                "<inline agents.toml>:1: {name} is not a table of defaults Baton knows: only [defaults.llm] is (the defaults of every agent of that kind)"
            )
        );
    }
    let message = error("[defaults]\nmodel = \"m\"\n", &[]);
    assert!(
        message.starts_with("<inline agents.toml>:2: ")
            && message.contains("like [defaults.llm] with model = "),
        "{message}"
    );
}
