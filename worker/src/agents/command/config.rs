//! The `command` kind's fields in an agents file, and their checks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::{Spanned, Value};

use super::CommandAgent;
use crate::agents::config::{Checker, ConfigError, Fields, Problem};

/// The fields a command agent takes besides `kind`.
pub(in crate::agents) const FIELDS: &[&str] = &[
    "command",
    "timeout_ms",
    "env",
    "output",
    "non_retryable_exit_codes",
    "stream_stderr",
];

/// The command agent a table declares (its fields are all of [`FIELDS`]), or the first problem
/// with it, checking the fields in the order of [`FIELDS`].
pub(in crate::agents) fn check(
    checker: &Checker,
    mut fields: Fields,
) -> Result<CommandAgent, ConfigError> {
    let argv = argv(checker, fields.remove("command"))?;
    let timeout = match fields.remove("timeout_ms") {
        None => None,
        Some(value) => Some(timeout(checker, &value)?),
    };
    let env = match fields.remove("env") {
        None => BTreeMap::new(),
        Some(value) => env(checker, &value)?,
    };
    let envelope = match fields.remove("output") {
        None => false,
        Some(value) => envelope(checker, &value)?,
    };
    let non_retryable_exit_codes = match fields.remove("non_retryable_exit_codes") {
        None => Vec::new(),
        Some(value) => exit_codes(checker, "non_retryable_exit_codes", &value)?,
    };
    let stream_stderr = match fields.remove("stream_stderr") {
        None => false,
        Some(value) => match value.get_ref() {
            Value::Boolean(stream) => *stream,
            _ => {
                return Err(checker.invalid(
                    "stream_stderr",
                    &value,
                    "true (what the command writes to stderr is streamed live to the run's watchers) or false",
                ));
            }
        },
    };

    let program = resolve_program(&argv[0], checker.base_dir());
    Ok(CommandAgent::new(
        checker.agent_name(),
        program,
        argv[1..].to_vec(),
        checker.base_dir().to_owned(),
        timeout,
        env,
    )
    .with_envelope(envelope)
    .with_non_retryable_exit_codes(non_retryable_exit_codes)
    .with_stream_stderr(stream_stderr))
}

/// `command`: the argv, a program name and its arguments.
fn argv(checker: &Checker, command: Option<Spanned<Value>>) -> Result<Vec<String>, ConfigError> {
    let Some(command) = command else {
        return Err(checker.missing(
            "command",
            "the argv to run, no shell, e.g. [\"python3\", \"agent.py\"]",
        ));
    };
    let argv_expected =
        "an array of strings (the argv, no shell), e.g. [\"python3\", \"agent.py\"]";
    let Value::Array(items) = command.get_ref() else {
        return Err(checker.invalid("command", &command, argv_expected));
    };
    let mut argv = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Value::String(s) => argv.push(s.clone()),
            _ => return Err(checker.invalid("command", &command, argv_expected)),
        }
    }
    if argv.is_empty() {
        return Err(checker.error("command", Some(command.span()), Problem::EmptyCommand));
    }
    if argv[0].is_empty() {
        return Err(checker.error(
            "command",
            Some(command.span()),
            Problem::Invalid("must start with a program name, found an empty string".into()),
        ));
    }
    Ok(argv)
}

/// `timeout_ms`: a positive number of milliseconds.
fn timeout(checker: &Checker, value: &Spanned<Value>) -> Result<Duration, ConfigError> {
    match value.get_ref() {
        Value::Integer(ms) if *ms > 0 => Ok(Duration::from_millis(*ms as u64)),
        Value::Integer(ms) => Err(checker.error(
            "timeout_ms",
            Some(value.span()),
            Problem::Invalid(format!(
                "must be a positive number of milliseconds, found {ms}"
            )),
        )),
        _ => Err(checker.invalid("timeout_ms", value, "a positive integer (milliseconds)")),
    }
}

/// `env`: variables to add to the inherited environment, as a table of strings.
fn env(checker: &Checker, value: &Spanned<Value>) -> Result<BTreeMap<String, String>, ConfigError> {
    let expected = "a table of strings, e.g. { MODEL = \"small\" }";
    let Value::Table(table) = value.get_ref() else {
        return Err(checker.invalid("env", value, expected));
    };
    let mut env = BTreeMap::new();
    for (key, item) in table {
        let Value::String(s) = item else {
            return Err(checker.error(
                "env",
                Some(value.span()),
                Problem::Invalid(format!(
                    "must be {expected}; `{key}` is not a string (found {})",
                    item.type_str()
                )),
            ));
        };
        if key.is_empty() || key.contains('=') || key.contains('\0') || s.contains('\0') {
            return Err(checker.error(
                "env",
                Some(value.span()),
                Problem::Invalid(format!(
                    "has an invalid variable {key:?} (names must be non-empty, without `=`; no NUL bytes)"
                )),
            ));
        }
        env.insert(key.clone(), s.clone());
    }
    Ok(env)
}

/// `output`: whether stdout is an envelope (`"envelope"`) or the step's data (`"data"`).
fn envelope(checker: &Checker, value: &Spanned<Value>) -> Result<bool, ConfigError> {
    match value.get_ref() {
        Value::String(s) if s == "data" => Ok(false),
        Value::String(s) if s == "envelope" => Ok(true),
        _ => Err(checker.invalid(
            "output",
            value,
            "\"data\" (stdout is the step's data) or \"envelope\" (stdout is {\"data\": ..., \"messages\": [...], \"decisions\": [...]})",
        )),
    }
}

/// An array of exit codes a process can report as failure: 1 to 255 (0 is success).
fn exit_codes(
    checker: &Checker,
    field: &str,
    value: &Spanned<Value>,
) -> Result<Vec<i32>, ConfigError> {
    let expected = "an array of exit codes from 1 to 255, e.g. [2, 64]";
    let Value::Array(items) = value.get_ref() else {
        return Err(checker.invalid(field, value, expected));
    };
    let mut codes = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Value::Integer(code) if (1..=255).contains(code) => codes.push(*code as i32),
            Value::Integer(code) => {
                return Err(checker.error(
                    field,
                    Some(value.span()),
                    Problem::Invalid(format!("must be {expected}; {code} is not one")),
                ));
            }
            other => {
                return Err(checker.error(
                    field,
                    Some(value.span()),
                    Problem::Invalid(format!(
                        "must be {expected}; found {} in it",
                        other.type_str()
                    )),
                ));
            }
        }
    }
    Ok(codes)
}

/// `command[0]` as spawned: a relative path that contains a `/`, or names a file in the agents
/// file's folder, is taken from that folder; anything else (`python3`) is looked up on `PATH`.
fn resolve_program(program: &str, base_dir: &Path) -> PathBuf {
    let path = Path::new(program);
    if path.is_relative() {
        let candidate = base_dir.join(path);
        if program.contains('/') || candidate.is_file() {
            return candidate;
        }
    }
    path.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::Agent;
    use crate::agents::config::testing::{agent_error, parse};

    #[test]
    fn output_is_data_or_envelope() {
        let (problem, message) = agent_error(
            "[agents.a]\nkind = \"command\"\ncommand = [\"x\"]\noutput = \"json\"\n",
            "a",
            "output",
            4,
        );
        assert!(matches!(problem, Problem::Invalid(_)), "{problem:?}");
        assert!(message.contains("\"envelope\""), "{message}");
        let file =
            parse("[agents.a]\nkind = \"command\"\ncommand = [\"x\"]\noutput = \"envelope\"\n")
                .unwrap();
        let Agent::Command(agent) = file.get("a").unwrap() else {
            panic!("a command agent");
        };
        assert!(agent.envelope());
        let (problem, _) = agent_error(
            "[agents.t]\nkind = \"template\"\ntemplate = \"1\"\noutput = \"envelope\"\n",
            "t",
            "output",
            4,
        );
        assert!(
            matches!(problem, Problem::WrongKind { .. }),
            "output belongs to command agents: {problem:?}"
        );
    }

    #[test]
    fn non_retryable_exit_codes_are_exit_codes() {
        let file = parse(
            "[agents.a]\nkind = \"command\"\ncommand = [\"x\"]\nnon_retryable_exit_codes = [2, 64]\n",
        )
        .unwrap();
        let Agent::Command(agent) = file.get("a").unwrap() else {
            panic!("a command agent");
        };
        assert_eq!(
            agent.non_retryable_exit_codes().iter().collect::<Vec<_>>(),
            [&2, &64]
        );
        for (value, needle) in [
            ("[0]", "0 is not one"),
            ("[2, 256]", "256 is not one"),
            ("[\"2\"]", "found string in it"),
            ("2", "found integer"),
        ] {
            let text = format!(
                "[agents.a]\nkind = \"command\"\ncommand = [\"x\"]\nnon_retryable_exit_codes = {value}\n"
            );
            let (problem, message) = agent_error(&text, "a", "non_retryable_exit_codes", 4);
            assert!(matches!(problem, Problem::Invalid(_)), "{problem:?}");
            assert!(message.contains(needle), "{value}: {message}");
        }
        let (problem, _) = agent_error(
            "[agents.t]\nkind = \"template\"\ntemplate = \"1\"\nnon_retryable_exit_codes = [2]\n",
            "t",
            "non_retryable_exit_codes",
            4,
        );
        assert!(matches!(problem, Problem::WrongKind { .. }), "{problem:?}");
    }

    #[test]
    fn missing_command() {
        let (problem, message) = agent_error(
            "[agents.planner]\nkind = \"command\"\ntimeout_ms = 5\n",
            "planner",
            "command",
            1,
        );
        assert!(matches!(problem, Problem::Missing { .. }));
        assert!(message.contains("is missing"), "{message}");
    }

    #[test]
    fn empty_argv() {
        let (problem, _) = agent_error(
            "[agents.planner]\nkind = \"command\"\ncommand = []\n",
            "planner",
            "command",
            3,
        );
        assert!(matches!(problem, Problem::EmptyCommand));
        let (problem, _) = agent_error(
            "[agents.planner]\nkind = \"command\"\ncommand = [\"\", \"x\"]\n",
            "planner",
            "command",
            3,
        );
        assert!(matches!(problem, Problem::Invalid(_)));
    }

    #[test]
    fn command_must_be_an_argv() {
        let (problem, message) = agent_error(
            "[agents.planner]\nkind = \"command\"\ncommand = \"python3 planner.py\"\n",
            "planner",
            "command",
            3,
        );
        assert!(matches!(problem, Problem::Invalid(_)));
        assert!(message.contains("array of strings"), "{message}");
        agent_error(
            "[agents.planner]\nkind = \"command\"\ncommand = [\"a\", 1]\n",
            "planner",
            "command",
            3,
        );
    }

    #[test]
    fn bad_timeouts_and_env() {
        for (value, needle) in [
            ("0", "positive"),
            ("-5", "positive"),
            ("\"30s\"", "found string"),
            ("1.5", "found float"),
        ] {
            let text = format!(
                "[agents.p]\nkind = \"command\"\ncommand = [\"x\"]\ntimeout_ms = {value}\n"
            );
            let (_, message) = agent_error(&text, "p", "timeout_ms", 4);
            assert!(message.contains(needle), "{value}: {message}");
        }
        let (_, message) = agent_error(
            "[agents.p]\nkind = \"command\"\ncommand = [\"x\"]\nenv = { N = 1 }\n",
            "p",
            "env",
            4,
        );
        assert!(
            message.contains("`N` is not a string (found integer)"),
            "{message}"
        );
        agent_error(
            "[agents.p]\nkind = \"command\"\ncommand = [\"x\"]\nenv = \"A=1\"\n",
            "p",
            "env",
            4,
        );
    }

    #[test]
    fn program_paths_are_resolved_against_the_files_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("agent.sh"), "").unwrap();
        let base = dir.path();
        assert_eq!(resolve_program("agent.sh", base), base.join("agent.sh"));
        assert_eq!(resolve_program("./agent.sh", base), base.join("./agent.sh"));
        assert_eq!(resolve_program("bin/later", base), base.join("bin/later"));
        assert_eq!(resolve_program("python3", base), Path::new("python3"));
        assert_eq!(resolve_program("/bin/sh", base), Path::new("/bin/sh"));
    }
}
