//! The `llm` kind's fields in an agents file, and their checks.

use std::time::Duration;

use serde_json::{Map, Value as Json};
use toml::{Spanned, Value};

use super::LlmAgent;
use super::http::{ApiKey, Client};
use super::reply::{OutputMode, Schema};
use super::request::RESERVED_FIELDS;
use crate::agents::config::{Checker, ConfigError, Fields, KindDefaults, Problem, Source};
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

/// What llm agents inherit: `[defaults.llm]` (any of [`FIELDS`]) and, over it, three
/// environment variables, so that one line or one variable moves every agent of a file to
/// another server.
pub(in crate::agents) const DEFAULTS: KindDefaults = KindDefaults {
    env: &[
        ("BATON_LLM_BASE_URL", "base_url"),
        ("BATON_LLM_MODEL", "model"),
        ("BATON_LLM_API_KEY_ENV", "api_key_env"),
    ],
    alternatives: &[&["prompt", "prompt_file"], &["system", "system_file"]],
    check: check_defaults,
};

/// Where a missing `base_url` or `model` may be given instead of the agent's own table.
const ELSEWHERE: &str = "set it in this table, in [defaults.llm] for every llm agent, or in";

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
        "BATON_LLM_BASE_URL",
    )?;
    let model = required_string(
        checker,
        &mut fields,
        "model",
        "the model to ask, e.g. \"qwen2.5-coder:7b\"",
        "BATON_LLM_MODEL",
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

/// Checks `[defaults.llm]` (with the environment over it) on its own: every field it sets as
/// an agent's would be, with stand-ins for what an agent must have and the table may leave to
/// its agents.
fn check_defaults(checker: &Checker, mut fields: Fields) -> Result<(), ConfigError> {
    let stand_in = |text: &str| Spanned::new(0..0, Value::String(text.to_owned()));
    for (field, value) in [("base_url", "http://localhost/"), ("model", "model")] {
        fields
            .entry(field.to_owned())
            .or_insert_with(|| stand_in(value));
    }
    if !fields.contains_key("prompt") && !fields.contains_key("prompt_file") {
        fields.insert("prompt".to_owned(), stand_in(""));
    }
    check(checker, fields).map(drop)
}

/// A string field that must be set and not blank, with its span; `variable` may set it too.
fn required_string(
    checker: &Checker,
    fields: &mut Fields,
    field: &str,
    hint: &str,
    variable: &str,
) -> Result<(String, std::ops::Range<usize>), ConfigError> {
    let Some(value) = fields.remove(field) else {
        return Err(checker.missing(field, &format!("{hint}; {ELSEWHERE} {variable}")));
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
mod tests;

#[cfg(test)]
mod defaults_tests;
