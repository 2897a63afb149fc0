//! The `llm` kind's fields in an agents file, and their checks.

use std::time::Duration;

use serde_json::{Map, Value as Json};
use toml::{Spanned, Value};

use super::LlmAgent;
use super::http::{ApiKey, Client};
use super::reply::{OutputMode, Schema};
use super::request::RESERVED_FIELDS;
use crate::agents::config::{Checker, ConfigError, Fields, Problem, Source};
use crate::agents::template::PromptTemplate;

/// The fields an llm agent takes besides `kind`.
pub(in crate::agents) const FIELDS: &[&str] = &[
    "base_url",
    "model",
    "api_key_env",
    "system",
    "system_file",
    "prompt",
    "prompt_file",
    "output",
    "json_schema_file",
    "max_repairs",
    "stream",
    "history",
    "temperature",
    "max_tokens",
    "top_p",
    "stop",
    "seed",
    "extra",
    "http_retries",
    "idle_timeout_ms",
];

const DEFAULT_MAX_REPAIRS: u32 = 1;
const DEFAULT_HTTP_RETRIES: u32 = 2;
/// Long enough for a local server to load a model and read a long prompt before its first
/// token.
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// The most `max_repairs` and `http_retries` may be: beyond, the step's retry policy is the
/// place for it.
const MAX_TRIES: i64 = 10;

/// The llm agent a table declares (its fields are all of [`FIELDS`]), with its prompts and
/// schema compiled and its API key read from the environment, or the first problem with it.
pub(in crate::agents) fn check(
    checker: &Checker,
    mut fields: Fields,
) -> Result<LlmAgent, ConfigError> {
    let base_url = required_string(
        checker,
        &mut fields,
        "base_url",
        "the server's OpenAI-compatible API, e.g. \"http://localhost:11434/v1\"",
    )?;
    let model = required_string(
        checker,
        &mut fields,
        "model",
        "the model to ask, e.g. \"qwen2.5-coder:7b\"",
    )?;
    let api_key = match fields.remove("api_key_env") {
        None => None,
        Some(value) => Some(api_key(checker, &value)?),
    };
    let system = match checker.inline_or_file(&mut fields, "system", "system_file")? {
        None => None,
        Some(source) => Some(prompt(checker, &source)?),
    };
    let prompt_source = checker.required_inline_or_file(
        &mut fields,
        "prompt",
        "prompt_file",
        "a Handlebars template",
    )?;
    let prompt = prompt(checker, &prompt_source)?;
    let output_field = fields.remove("output");
    let output = match &output_field {
        None => OutputMode::Json,
        Some(value) => output(checker, value)?,
    };
    let schema = match fields.remove("json_schema_file") {
        None => None,
        Some(value) if output == OutputMode::Text => {
            return Err(checker.error(
                "json_schema_file",
                Some(value.span()),
                Problem::Invalid(
                    "does not apply to output = \"text\" (the reply is not JSON)".to_owned(),
                ),
            ));
        }
        Some(value) => Some(schema(checker, &value)?),
    };
    let max_repairs = count(checker, &mut fields, "max_repairs", DEFAULT_MAX_REPAIRS)?;
    let stream = flag(checker, &mut fields, "stream", true)?;
    let history = flag(checker, &mut fields, "history", false)?;
    let sampling = sampling(checker, &mut fields)?;
    let extra = match fields.remove("extra") {
        None => Map::new(),
        Some(value) => extra(checker, &value)?,
    };
    let http_retries = count(checker, &mut fields, "http_retries", DEFAULT_HTTP_RETRIES)?;
    let idle = optional(
        checker,
        &mut fields,
        "idle_timeout_ms",
        DEFAULT_IDLE_TIMEOUT,
        "a positive integer (milliseconds)",
        |value| {
            let ms = value.as_integer().filter(|ms| *ms > 0)?;
            Some(Duration::from_millis(ms as u64))
        },
    )?;

    let client = Client::new(&base_url.0, api_key, &model.0, stream, http_retries, idle)
        .map_err(|reason| checker.error("base_url", Some(base_url.1), Problem::Invalid(reason)))?;
    Ok(LlmAgent {
        name: checker.agent_name().to_owned(),
        model: model.0,
        client,
        system,
        prompt,
        output,
        schema,
        max_repairs,
        stream,
        history,
        sampling,
        extra,
    })
}

/// A string field that must be set and not blank, with its span.
fn required_string(
    checker: &Checker,
    fields: &mut Fields,
    field: &str,
    hint: &str,
) -> Result<(String, std::ops::Range<usize>), ConfigError> {
    let Some(value) = fields.remove(field) else {
        return Err(checker.missing(field, hint));
    };
    match value.get_ref() {
        Value::String(text) if !text.trim().is_empty() => Ok((text.clone(), value.span())),
        _ => Err(checker.invalid(field, &value, &format!("a non-empty string, {hint}"))),
    }
}

/// `api_key_env`: the name of the variable that holds the key, read now.
fn api_key(checker: &Checker, value: &Spanned<Value>) -> Result<ApiKey, ConfigError> {
    let Value::String(variable) = value.get_ref() else {
        return Err(checker.invalid(
            "api_key_env",
            value,
            "the name of an environment variable, e.g. \"OPENAI_API_KEY\"",
        ));
    };
    match checker.env_var(variable) {
        Some(key) if !key.trim().is_empty() => Ok(ApiKey::new(key.trim().to_owned())),
        _ => Err(checker.error(
            "api_key_env",
            Some(value.span()),
            Problem::UnsetVariable {
                variable: variable.clone(),
            },
        )),
    }
}

/// A prompt template (`prompt`, `system` or their files), compiled.
fn prompt(checker: &Checker, source: &Source) -> Result<PromptTemplate, ConfigError> {
    PromptTemplate::compile(&source.text).map_err(|e| checker.compile_error(source, e.reason))
}

/// `output`: `"json"`, `"text"` or `"envelope"`.
fn output(checker: &Checker, value: &Spanned<Value>) -> Result<OutputMode, ConfigError> {
    match value.get_ref() {
        Value::String(s) if s == "json" => Ok(OutputMode::Json),
        Value::String(s) if s == "text" => Ok(OutputMode::Text),
        Value::String(s) if s == "envelope" => Ok(OutputMode::Envelope),
        _ => Err(checker.invalid(
            "output",
            value,
            "\"json\" (the JSON in the reply is the step's data), \"text\" ({\"text\": reply}) or \"envelope\" ({\"data\": ..., \"messages\": [...], \"decisions\": [...]})",
        )),
    }
}

/// `json_schema_file`: a JSON Schema, read and compiled.
fn schema(checker: &Checker, value: &Spanned<Value>) -> Result<Schema, ConfigError> {
    let Value::String(name) = value.get_ref() else {
        return Err(checker.invalid("json_schema_file", value, "a string (a path)"));
    };
    let path = checker.base_dir().join(name);
    let problem = |reason: String| {
        checker.error(
            "json_schema_file",
            Some(value.span()),
            Problem::Invalid(format!("names {}, which {reason}", path.display())),
        )
    };
    let text = std::fs::read_to_string(&path).map_err(|source| {
        checker.error(
            "json_schema_file",
            Some(value.span()),
            Problem::UnreadableFile {
                path: path.clone(),
                source,
            },
        )
    })?;
    let json: Json =
        serde_json::from_str(&text).map_err(|e| problem(format!("is not JSON: {e}")))?;
    Schema::compile(json).map_err(|e| problem(format!("is not a JSON Schema Baton can use: {e}")))
}

/// An optional field, as `read` makes it (`None`: it is not `expected`), else `default`.
fn optional<T>(
    checker: &Checker,
    fields: &mut Fields,
    field: &str,
    default: T,
    expected: &str,
    read: impl Fn(&Value) -> Option<T>,
) -> Result<T, ConfigError> {
    match fields.remove(field) {
        None => Ok(default),
        Some(value) => {
            read(value.get_ref()).ok_or_else(|| checker.invalid(field, &value, expected))
        }
    }
}

/// `true` or `false` (`stream`, `history`).
fn flag(
    checker: &Checker,
    fields: &mut Fields,
    field: &str,
    default: bool,
) -> Result<bool, ConfigError> {
    optional(
        checker,
        fields,
        field,
        default,
        "true or false",
        Value::as_bool,
    )
}

/// A count of tries (`max_repairs`, `http_retries`): 0 to [`MAX_TRIES`].
fn count(
    checker: &Checker,
    fields: &mut Fields,
    field: &str,
    default: u32,
) -> Result<u32, ConfigError> {
    let expected = format!("an integer from 0 to {MAX_TRIES}");
    optional(checker, fields, field, default, &expected, |value| {
        value
            .as_integer()
            .filter(|n| (0..=MAX_TRIES).contains(n))
            .map(|n| n as u32)
    })
}

/// `temperature`, `max_tokens`, `top_p`, `stop` and `seed`, as the request carries them.
fn sampling(checker: &Checker, fields: &mut Fields) -> Result<Map<String, Json>, ConfigError> {
    let mut sampling = Map::new();
    for field in ["temperature", "max_tokens", "top_p", "stop", "seed"] {
        let Some(value) = fields.remove(field) else {
            continue;
        };
        let json = match (field, value.get_ref()) {
            ("temperature" | "top_p", Value::Float(x)) if *x >= 0.0 => Json::from(*x),
            ("temperature" | "top_p", Value::Integer(n)) if *n >= 0 => Json::from(*n),
            ("max_tokens", Value::Integer(n)) if *n > 0 => Json::from(*n),
            ("seed", Value::Integer(n)) => Json::from(*n),
            ("stop", Value::String(s)) => Json::from(s.clone()),
            ("stop", Value::Array(items)) if items.iter().all(Value::is_str) => {
                Json::from(items.iter().filter_map(Value::as_str).collect::<Vec<_>>())
            }
            _ => {
                let expected = match field {
                    "temperature" | "top_p" => "a number, 0 or more",
                    "max_tokens" => "a positive integer",
                    "seed" => "an integer",
                    _ => "a string or an array of strings",
                };
                return Err(checker.invalid(field, &value, expected));
            }
        };
        sampling.insert(field.to_owned(), json);
    }
    Ok(sampling)
}

/// `extra`: a table merged into the request body, none of whose keys Baton sets itself.
fn extra(checker: &Checker, value: &Spanned<Value>) -> Result<Map<String, Json>, ConfigError> {
    let Value::Table(table) = value.get_ref() else {
        return Err(checker.invalid("extra", value, "a table, e.g. { keep_alive = \"5m\" }"));
    };
    if let Some(key) = table
        .keys()
        .find(|key| RESERVED_FIELDS.contains(&key.as_str()))
    {
        return Err(checker.error(
            "extra",
            Some(value.span()),
            Problem::Invalid(format!(
                "sets `{key}`, which Baton sets itself (use the agent's own field, where there is one)"
            )),
        ));
    }
    match serde_json::to_value(table) {
        Ok(Json::Object(map)) => Ok(map),
        _ => Err(checker.invalid("extra", value, "a table of JSON values")),
    }
}

#[cfg(test)]
mod tests {
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
}
