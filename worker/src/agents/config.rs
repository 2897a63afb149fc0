//! Reading and checking an agents file (`agents.toml`).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::{Spanned, Value};

use super::Agent;
use super::command::CommandAgent;
use super::template::{Template, TemplateAgent};

/// Fields each kind accepts.
const COMMAND_FIELDS: &[&str] = &[
    "kind",
    "command",
    "timeout_ms",
    "env",
    "output",
    "non_retryable_exit_codes",
];
const TEMPLATE_FIELDS: &[&str] = &["kind", "template", "template_file"];

/// An agents file that cannot be used. Every message starts with the file (and line, when
/// known); problems with one agent name the agent and the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read agents file {}: {source}", file.display())]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    /// The text is not TOML, or its top level is not `[agents.<name>]` tables.
    #[error("{}: {message}", location(file, *line))]
    Toml {
        file: PathBuf,
        line: Option<usize>,
        message: String,
    },
    /// One field of one agent is missing, unknown or invalid.
    #[error("{}: agent \"{agent}\": field `{field}` {problem}", location(file, *line))]
    Agent {
        file: PathBuf,
        /// The line of the field, or of the agent's table when the field is missing.
        line: Option<usize>,
        agent: String,
        field: String,
        problem: Box<Problem>,
    },
}

/// What is wrong with one field of an agent (the text reads after "field `x` ").
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    #[error("is missing ({hint})")]
    Missing { hint: String },
    #[error("has unknown value {0:?} (expected \"command\" or \"template\")")]
    UnknownKind(String),
    #[error("is not a known field (expected one of: {expected})")]
    UnknownField { expected: String },
    #[error("does not apply to kind \"{kind}\" (it belongs to kind \"{belongs_to}\")")]
    WrongKind {
        kind: &'static str,
        belongs_to: &'static str,
    },
    #[error("cannot be set together with `{other}` (set one of them)")]
    Conflict { other: String },
    #[error("is empty: it must be the program to run followed by its arguments")]
    EmptyCommand,
    #[error("{0}")]
    Invalid(String),
    #[error("does not compile: {0}")]
    TemplateCompile(String),
    #[error("names {}, which cannot be read: {source}", path.display())]
    TemplateFile {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn location(file: &Path, line: Option<usize>) -> String {
    match line {
        Some(line) => format!("{}:{line}", file.display()),
        None => file.display().to_string(),
    }
}

type Fields = BTreeMap<String, Spanned<Value>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    agents: BTreeMap<String, Spanned<AgentTable>>,
}

/// One agent's fields, each with its span; anything but a table is refused with a message
/// that says what an agent looks like.
struct AgentTable(Fields);

impl<'de> Deserialize<'de> for AgentTable {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = AgentTable;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "a table of agent fields, like [agents.planner] with kind = \"command\"",
                )
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<AgentTable, A::Error> {
                let mut fields = Fields::new();
                while let Some((key, value)) = map.next_entry::<String, Spanned<Value>>()? {
                    fields.insert(key, value);
                }
                Ok(AgentTable(fields))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// Parses the agents of `text`; `file` only labels errors, `base_dir` must be absolute.
pub(super) fn parse_agents(
    text: &str,
    base_dir: &Path,
    file: &Path,
) -> Result<BTreeMap<String, Agent>, ConfigError> {
    let raw: RawFile = toml::from_str(text).map_err(|e| ConfigError::Toml {
        file: file.to_owned(),
        line: e.span().map(|span| line_of(text, span.start)),
        message: e.message().trim().to_owned(),
    })?;
    let mut agents = BTreeMap::new();
    for (name, table) in raw.agents {
        let table_span = table.span();
        let checker = Checker {
            text,
            file,
            base_dir,
            agent: &name,
            table_line: line_of(text, table_span.start),
        };
        let agent = checker.agent(table.into_inner().0)?;
        agents.insert(name, agent);
    }
    Ok(agents)
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// Checks one agent's table.
struct Checker<'a> {
    text: &'a str,
    file: &'a Path,
    base_dir: &'a Path,
    agent: &'a str,
    table_line: usize,
}

impl Checker<'_> {
    fn error(&self, field: &str, span: Option<Range<usize>>, problem: Problem) -> ConfigError {
        ConfigError::Agent {
            file: self.file.to_owned(),
            line: Some(span.map_or(self.table_line, |s| line_of(self.text, s.start))),
            agent: self.agent.to_owned(),
            field: field.to_owned(),
            problem: Box::new(problem),
        }
    }

    fn invalid(&self, field: &str, value: &Spanned<Value>, expected: &str) -> ConfigError {
        let found = value.get_ref().type_str();
        self.error(
            field,
            Some(value.span()),
            Problem::Invalid(format!("must be {expected}, found {found}")),
        )
    }

    fn agent(&self, mut fields: Fields) -> Result<Agent, ConfigError> {
        let kind = match fields.remove("kind") {
            None => {
                return Err(self.error(
                    "kind",
                    None,
                    Problem::Missing {
                        hint: "expected \"command\" or \"template\"".to_owned(),
                    },
                ));
            }
            Some(kind) => match kind.get_ref() {
                Value::String(s) if s == "command" => "command",
                Value::String(s) if s == "template" => "template",
                Value::String(s) => {
                    return Err(self.error(
                        "kind",
                        Some(kind.span()),
                        Problem::UnknownKind(s.clone()),
                    ));
                }
                _ => return Err(self.invalid("kind", &kind, "\"command\" or \"template\"")),
            },
        };
        self.reject_unknown(kind, &fields)?;
        if kind == "command" {
            self.command(fields).map(Agent::Command)
        } else {
            self.template(fields).map(Agent::Template)
        }
    }

    /// Fails on the first (in file order) field the kind does not take.
    fn reject_unknown(&self, kind: &'static str, fields: &Fields) -> Result<(), ConfigError> {
        let (allowed, other_kind, other_fields) = if kind == "command" {
            (COMMAND_FIELDS, "template", TEMPLATE_FIELDS)
        } else {
            (TEMPLATE_FIELDS, "command", COMMAND_FIELDS)
        };
        let unknown = fields
            .iter()
            .filter(|(key, _)| !allowed.contains(&key.as_str()))
            .min_by_key(|(_, value)| value.span().start);
        let Some((key, value)) = unknown else {
            return Ok(());
        };
        let problem = if other_fields.contains(&key.as_str()) {
            Problem::WrongKind {
                kind,
                belongs_to: other_kind,
            }
        } else {
            Problem::UnknownField {
                expected: allowed.join(", "),
            }
        };
        Err(self.error(key, Some(value.span()), problem))
    }

    fn command(&self, mut fields: Fields) -> Result<CommandAgent, ConfigError> {
        let Some(command) = fields.remove("command") else {
            return Err(self.error(
                "command",
                None,
                Problem::Missing {
                    hint: "the argv to run, no shell, e.g. [\"python3\", \"agent.py\"]".to_owned(),
                },
            ));
        };
        let argv_expected =
            "an array of strings (the argv, no shell), e.g. [\"python3\", \"agent.py\"]";
        let Value::Array(items) = command.get_ref() else {
            return Err(self.invalid("command", &command, argv_expected));
        };
        let mut argv = Vec::with_capacity(items.len());
        for item in items {
            match item {
                Value::String(s) => argv.push(s.clone()),
                _ => return Err(self.invalid("command", &command, argv_expected)),
            }
        }
        if argv.is_empty() {
            return Err(self.error("command", Some(command.span()), Problem::EmptyCommand));
        }
        if argv[0].is_empty() {
            return Err(self.error(
                "command",
                Some(command.span()),
                Problem::Invalid("must start with a program name, found an empty string".into()),
            ));
        }

        let timeout = match fields.remove("timeout_ms") {
            None => None,
            Some(value) => match value.get_ref() {
                Value::Integer(ms) if *ms > 0 => Some(Duration::from_millis(*ms as u64)),
                Value::Integer(ms) => {
                    return Err(self.error(
                        "timeout_ms",
                        Some(value.span()),
                        Problem::Invalid(format!(
                            "must be a positive number of milliseconds, found {ms}"
                        )),
                    ));
                }
                _ => {
                    return Err(self.invalid(
                        "timeout_ms",
                        &value,
                        "a positive integer (milliseconds)",
                    ));
                }
            },
        };

        let mut env = BTreeMap::new();
        if let Some(value) = fields.remove("env") {
            let expected = "a table of strings, e.g. { MODEL = \"small\" }";
            let Value::Table(table) = value.get_ref() else {
                return Err(self.invalid("env", &value, expected));
            };
            for (key, item) in table {
                let Value::String(s) = item else {
                    return Err(self.error(
                        "env",
                        Some(value.span()),
                        Problem::Invalid(format!(
                            "must be {expected}; `{key}` is not a string (found {})",
                            item.type_str()
                        )),
                    ));
                };
                if key.is_empty() || key.contains('=') || key.contains('\0') || s.contains('\0') {
                    return Err(self.error(
                        "env",
                        Some(value.span()),
                        Problem::Invalid(format!(
                            "has an invalid variable {key:?} (names must be non-empty, without `=`; no NUL bytes)"
                        )),
                    ));
                }
                env.insert(key.clone(), s.clone());
            }
        }

        let envelope = match fields.remove("output") {
            None => false,
            Some(value) => match value.get_ref() {
                Value::String(s) if s == "data" => false,
                Value::String(s) if s == "envelope" => true,
                _ => {
                    return Err(self.invalid(
                        "output",
                        &value,
                        "\"data\" (stdout is the step's data) or \"envelope\" (stdout is {\"data\": ..., \"messages\": [...], \"decisions\": [...]})",
                    ));
                }
            },
        };

        let non_retryable_exit_codes = match fields.remove("non_retryable_exit_codes") {
            None => Vec::new(),
            Some(value) => self.exit_codes("non_retryable_exit_codes", &value)?,
        };

        let program = resolve_program(&argv[0], self.base_dir);
        Ok(CommandAgent::new(
            self.agent,
            program,
            argv[1..].to_vec(),
            self.base_dir.to_owned(),
            timeout,
            env,
        )
        .with_envelope(envelope)
        .with_non_retryable_exit_codes(non_retryable_exit_codes))
    }

    /// An array of exit codes a process can report as failure: 1 to 255 (0 is success).
    fn exit_codes(&self, field: &str, value: &Spanned<Value>) -> Result<Vec<i32>, ConfigError> {
        let expected = "an array of exit codes from 1 to 255, e.g. [2, 64]";
        let Value::Array(items) = value.get_ref() else {
            return Err(self.invalid(field, value, expected));
        };
        let mut codes = Vec::with_capacity(items.len());
        for item in items {
            match item {
                Value::Integer(code) if (1..=255).contains(code) => codes.push(*code as i32),
                Value::Integer(code) => {
                    return Err(self.error(
                        field,
                        Some(value.span()),
                        Problem::Invalid(format!("must be {expected}; {code} is not one")),
                    ));
                }
                other => {
                    return Err(self.error(
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

    fn template(&self, mut fields: Fields) -> Result<TemplateAgent, ConfigError> {
        let inline = fields.remove("template");
        let from_file = fields.remove("template_file");
        let (field, span, source) = match (inline, from_file) {
            (Some(_), Some(file)) => {
                return Err(self.error(
                    "template_file",
                    Some(file.span()),
                    Problem::Conflict {
                        other: "template".to_owned(),
                    },
                ));
            }
            (None, None) => {
                return Err(self.error(
                    "template",
                    None,
                    Problem::Missing {
                        hint: "set `template` to a Handlebars template, or `template_file` to a file holding one".to_owned(),
                    },
                ));
            }
            (Some(inline), None) => match inline.get_ref() {
                Value::String(s) => ("template", inline.span(), s.clone()),
                _ => return Err(self.invalid("template", &inline, "a string")),
            },
            (None, Some(file)) => {
                let Value::String(name) = file.get_ref() else {
                    return Err(self.invalid("template_file", &file, "a string (a path)"));
                };
                let path = self.base_dir.join(name);
                let source = std::fs::read_to_string(&path).map_err(|source| {
                    self.error(
                        "template_file",
                        Some(file.span()),
                        Problem::TemplateFile {
                            path: path.clone(),
                            source,
                        },
                    )
                })?;
                ("template_file", file.span(), source)
            }
        };
        let template = Template::compile(&source)
            .map_err(|e| self.error(field, Some(span), Problem::TemplateCompile(e.reason)))?;
        Ok(TemplateAgent::from_compiled(self.agent, template))
    }
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
    use crate::agents::AgentsFile;

    fn parse(text: &str) -> Result<AgentsFile, ConfigError> {
        AgentsFile::parse(text, Path::new("/tmp"))
    }

    /// The error of `text`, checked to name the agent and the field, and to start with the
    /// file and the expected line.
    fn agent_error(text: &str, agent: &str, field: &str, line: usize) -> (Problem, String) {
        let err = parse(text).expect_err("the file should be rejected");
        let message = err.to_string();
        assert!(
            message.starts_with(&format!("<inline agents.toml>:{line}: ")),
            "{message}"
        );
        assert!(message.contains(&format!("agent \"{agent}\"")), "{message}");
        assert!(message.contains(&format!("field `{field}`")), "{message}");
        match err {
            ConfigError::Agent {
                agent: a,
                field: f,
                problem,
                ..
            } => {
                assert_eq!((a.as_str(), f.as_str()), (agent, field));
                (*problem, message)
            }
            other => panic!("expected an agent error, got {other:?}"),
        }
    }

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
    fn a_valid_file() {
        let file = parse(
            r#"
[agents.planner]
kind = "command"
command = ["python3", "planner.py", "--fast"]
timeout_ms = 30000
env = { MODEL = "small" }

[agents.coder]
kind = "template"
template = '{"files": {{json context.plan.files}} }'
"#,
        )
        .unwrap();
        assert_eq!(file.agents.keys().collect::<Vec<_>>(), ["coder", "planner"]);
        let crate::agents::Agent::Command(planner) = file.get("planner").unwrap() else {
            panic!("planner is a command agent");
        };
        assert_eq!(planner.program(), Path::new("python3"));
        assert_eq!(planner.args(), ["planner.py", "--fast"]);
        assert_eq!(planner.dir(), Path::new("/tmp"));
        assert_eq!(planner.timeout(), Some(Duration::from_secs(30)));
        assert_eq!(
            planner.env().get("MODEL").map(String::as_str),
            Some("small")
        );
        assert_eq!(file.get("coder").unwrap().kind(), "template");
    }

    #[test]
    fn an_empty_file_has_no_agents() {
        assert!(parse("").unwrap().agents.is_empty());
    }

    #[test]
    fn unknown_kind() {
        let (problem, message) =
            agent_error("[agents.coder]\nkind = \"llm\"\n", "coder", "kind", 2);
        assert!(matches!(problem, Problem::UnknownKind(ref k) if k == "llm"));
        assert!(message.contains("unknown value \"llm\""), "{message}");
    }

    #[test]
    fn missing_kind() {
        let (problem, _) = agent_error("\n[agents.coder]\ntemplate = \"{}\"\n", "coder", "kind", 2);
        assert!(matches!(problem, Problem::Missing { .. }));
    }

    #[test]
    fn kind_of_the_wrong_type() {
        let (problem, message) = agent_error("[agents.a]\nkind = 1\n", "a", "kind", 2);
        assert!(matches!(problem, Problem::Invalid(_)));
        assert!(message.contains("found integer"), "{message}");
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
    fn unknown_fields() {
        let (problem, message) = agent_error(
            "[agents.planner]\nkind = \"command\"\ncommand = [\"x\"]\ntimeout = 5\nzzz = 1\n",
            "planner",
            "timeout",
            4,
        );
        assert!(matches!(problem, Problem::UnknownField { .. }));
        assert!(
            message.contains("expected one of: kind, command, timeout_ms, env"),
            "{message}"
        );
        // A field of the other kind says so.
        let (problem, message) = agent_error(
            "[agents.planner]\nkind = \"command\"\ncommand = [\"x\"]\ntemplate = \"{}\"\n",
            "planner",
            "template",
            4,
        );
        assert!(matches!(problem, Problem::WrongKind { .. }));
        assert!(
            message.contains("belongs to kind \"template\""),
            "{message}"
        );
    }

    #[test]
    fn unknown_top_level_keys() {
        let err = parse("[agent.planner]\nkind = \"command\"\n").unwrap_err();
        let message = err.to_string();
        assert!(
            matches!(err, ConfigError::Toml { line: Some(1), .. }),
            "{err:?}"
        );
        assert!(message.contains("agent"), "{message}");
    }

    #[test]
    fn an_agent_that_is_not_a_table() {
        let err = parse("[agents]\nplanner = \"python3 planner.py\"\n").unwrap_err();
        assert!(
            matches!(err, ConfigError::Toml { line: Some(2), .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("[agents.planner]"), "{err}");
    }

    #[test]
    fn missing_template() {
        let (problem, message) = agent_error(
            "[agents.coder]\nkind = \"template\"\n",
            "coder",
            "template",
            1,
        );
        assert!(matches!(problem, Problem::Missing { .. }));
        assert!(message.contains("template_file"), "{message}");
    }

    #[test]
    fn both_template_and_template_file() {
        let (problem, message) = agent_error(
            "[agents.coder]\nkind = \"template\"\ntemplate = \"{}\"\ntemplate_file = \"c.hbs\"\n",
            "coder",
            "template_file",
            4,
        );
        assert!(matches!(problem, Problem::Conflict { .. }));
        assert!(message.contains("together with `template`"), "{message}");
    }

    #[test]
    fn template_that_does_not_compile() {
        let (problem, message) = agent_error(
            "[agents.coder]\nkind = \"template\"\ntemplate = \"{{#if x}}open\"\n",
            "coder",
            "template",
            3,
        );
        assert!(matches!(problem, Problem::TemplateCompile(_)));
        assert!(message.contains("does not compile"), "{message}");
    }

    #[test]
    fn unreadable_template_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agents.toml");
        std::fs::write(
            &path,
            "[agents.coder]\nkind = \"template\"\ntemplate_file = \"missing.hbs\"\n",
        )
        .unwrap();
        let err = AgentsFile::load(&path).unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with(&format!("{}:3: ", path.display())),
            "{message}"
        );
        assert!(message.contains("agent \"coder\""), "{message}");
        assert!(message.contains("field `template_file`"), "{message}");
        assert!(message.contains("missing.hbs"), "{message}");
        assert!(
            matches!(&err, ConfigError::Agent { problem, .. } if matches!(**problem, Problem::TemplateFile { .. })),
            "{err:?}"
        );
    }

    #[test]
    fn template_file_is_read_from_the_files_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("templates")).unwrap();
        std::fs::write(
            dir.path().join("templates/coder.hbs"),
            "{\"files\": {{json plan.files}}}\n",
        )
        .unwrap();
        let path = dir.path().join("agents.toml");
        std::fs::write(
            &path,
            "[agents.coder]\nkind = \"template\"\ntemplate_file = \"templates/coder.hbs\"\n",
        )
        .unwrap();
        let file = AgentsFile::load(&path).unwrap();
        let crate::agents::Agent::Template(coder) = file.get("coder").unwrap() else {
            panic!("coder is a template agent");
        };
        let out = coder
            .run(&serde_json::json!({"plan": {"files": ["a"]}}))
            .unwrap();
        assert_eq!(out, serde_json::json!({"files": ["a"]}));
    }

    #[test]
    fn toml_syntax_errors_have_their_line() {
        let err = parse("[agents.a]\nkind = \"command\"\ncommand = [\"x\"\n").unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::Toml {
                    line: Some(3..=4),
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            err.to_string().starts_with("<inline agents.toml>:"),
            "{err}"
        );
    }

    #[test]
    fn unreadable_agents_file() {
        let err = AgentsFile::load(Path::new("/nonexistent/agents.toml")).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }));
        assert!(
            err.to_string()
                .starts_with("cannot read agents file /nonexistent/agents.toml: "),
            "{err}"
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

    #[test]
    fn line_numbers() {
        assert_eq!(line_of("a\nb\nc", 0), 1);
        assert_eq!(line_of("a\nb\nc", 2), 2);
        assert_eq!(line_of("a\nb\nc", 100), 3);
    }
}
