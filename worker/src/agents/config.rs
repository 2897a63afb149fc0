//! Reading and checking an agents file (`agents.toml`): the part every kind shares.
//!
//! Here: reading the TOML into one table of fields per agent (with where each stands, for
//! line numbers), the dispatch on `kind`, the fields no kind takes, and the errors
//! ([`ConfigError`], [`Problem`]). Each kind checks its own fields in its folder
//! (`command/config.rs`, `template/config.rs`): a `FIELDS` list and a `check` function that
//! turns the agent's table into the agent, reporting through [`Checker`].
//!
//! The kinds come in as a table of [`Kind`]s (`KINDS`, next to `Agent` in `mod.rs`), so that
//! this file depends on no kind: the kinds' checks use it, not the other way round. The
//! messages that list the kinds or say which kind a field belongs to follow from that table.
//!
//! `sources`: the text of a field given inline or in a file (a template, a prompt), and the
//! errors of one that does not compile.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::{Spanned, Value};

mod sources;

pub(super) use sources::Source;

/// One kind of agent, `A` being what any agent is: its name in `kind = "..."`, the fields it
/// takes besides `kind`, and how its table becomes an agent.
pub(super) struct Kind<A> {
    pub(super) name: &'static str,
    pub(super) fields: &'static [&'static str],
    pub(super) check: fn(&Checker, Fields) -> Result<A, ConfigError>,
}

/// The kinds as a message lists them: `"command", "template" or "llm"`.
fn kind_names<A>(kinds: &[Kind<A>]) -> String {
    let quoted: Vec<String> = kinds
        .iter()
        .map(|kind| format!("{:?}", kind.name))
        .collect();
    match quoted.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, others)) => format!("{} or {last}", others.join(", ")),
        None => String::new(),
    }
}

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
    #[error("has unknown value {kind:?} (expected {expected})")]
    UnknownKind { kind: String, expected: String },
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
    /// A file named by a field (`template_file`, `prompt_file`...) holds a template that does
    /// not compile; the reason gives the line and column in that file.
    #[error("names {}, which does not compile: {reason}", path.display())]
    FileCompile { path: PathBuf, reason: String },
    #[error("names {}, which cannot be read: {source}", path.display())]
    UnreadableFile {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The field names an environment variable (`api_key_env`) that is not set, or empty.
    #[error("names the environment variable {variable}, which is unset or empty")]
    UnsetVariable { variable: String },
}

fn location(file: &Path, line: Option<usize>) -> String {
    match line {
        Some(line) => format!("{}:{line}", file.display()),
        None => file.display().to_string(),
    }
}

/// One agent's fields by name, each with where it stands in the file.
pub(super) type Fields = BTreeMap<String, Spanned<Value>>;

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

/// How an agents file reads environment variables (`api_key_env`): the process's own
/// (`std::env::var`), or what a caller hands in.
pub(super) type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Parses the agents of `text`, each of one of `kinds`; `file` only labels errors, `base_dir`
/// must be absolute.
pub(super) fn parse_agents<A>(
    text: &str,
    base_dir: &Path,
    file: &Path,
    env: Env,
    kinds: &[Kind<A>],
) -> Result<BTreeMap<String, A>, ConfigError> {
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
            env,
            agent: &name,
            table_line: line_of(text, table_span.start),
        };
        let agent = checker.agent(kinds, table.into_inner().0)?;
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

/// Checks one agent's table: what a kind's `check` reports its problems through, so that each
/// names the file, the line, the agent and the field.
pub(super) struct Checker<'a> {
    text: &'a str,
    file: &'a Path,
    base_dir: &'a Path,
    env: Env<'a>,
    agent: &'a str,
    table_line: usize,
}

impl Checker<'_> {
    /// The agent's name (its key in the file).
    pub(super) fn agent_name(&self) -> &str {
        self.agent
    }

    /// The agents file's folder, absolute: where relative paths are taken from.
    pub(super) fn base_dir(&self) -> &Path {
        self.base_dir
    }

    /// The value of the environment variable `variable`, if it is set.
    pub(super) fn env_var(&self, variable: &str) -> Option<String> {
        (self.env)(variable)
    }

    /// `problem` with `field`, at the line of `span` (the agent's table's line when the field
    /// is missing).
    pub(super) fn error(
        &self,
        field: &str,
        span: Option<Range<usize>>,
        problem: Problem,
    ) -> ConfigError {
        ConfigError::Agent {
            file: self.file.to_owned(),
            line: Some(span.map_or(self.table_line, |s| line_of(self.text, s.start))),
            agent: self.agent.to_owned(),
            field: field.to_owned(),
            problem: Box::new(problem),
        }
    }

    /// `field` is missing; `hint` says what to set it to.
    pub(super) fn missing(&self, field: &str, hint: &str) -> ConfigError {
        self.error(
            field,
            None,
            Problem::Missing {
                hint: hint.to_owned(),
            },
        )
    }

    /// `field` is not what it must be: "must be `expected`, found <its TOML type>".
    pub(super) fn invalid(
        &self,
        field: &str,
        value: &Spanned<Value>,
        expected: &str,
    ) -> ConfigError {
        let found = value.get_ref().type_str();
        self.error(
            field,
            Some(value.span()),
            Problem::Invalid(format!("must be {expected}, found {found}")),
        )
    }

    /// The agent of `fields`, by the check of its `kind`, one of `kinds`.
    fn agent<A>(&self, kinds: &[Kind<A>], mut fields: Fields) -> Result<A, ConfigError> {
        let kind = match fields.remove("kind") {
            None => {
                return Err(self.missing("kind", &format!("expected {}", kind_names(kinds))));
            }
            Some(kind) => match kind.get_ref() {
                Value::String(name) => match kinds.iter().find(|k| k.name == name) {
                    Some(known) => known,
                    None => {
                        return Err(self.error(
                            "kind",
                            Some(kind.span()),
                            Problem::UnknownKind {
                                kind: name.clone(),
                                expected: kind_names(kinds),
                            },
                        ));
                    }
                },
                _ => return Err(self.invalid("kind", &kind, &kind_names(kinds))),
            },
        };
        self.reject_unknown(kinds, kind, &fields)?;
        (kind.check)(self, fields)
    }

    /// Fails on the first (in file order) field `kind` does not take.
    fn reject_unknown<A>(
        &self,
        kinds: &[Kind<A>],
        kind: &Kind<A>,
        fields: &Fields,
    ) -> Result<(), ConfigError> {
        let unknown = fields
            .iter()
            .filter(|(key, _)| !kind.fields.contains(&key.as_str()))
            .min_by_key(|(_, value)| value.span().start);
        let Some((key, value)) = unknown else {
            return Ok(());
        };
        let other_kind = kinds
            .iter()
            .find(|other| other.name != kind.name && other.fields.contains(&key.as_str()));
        let problem = match other_kind {
            Some(other) => Problem::WrongKind {
                kind: kind.name,
                belongs_to: other.name,
            },
            None => {
                let allowed: Vec<&str> = std::iter::once("kind")
                    .chain(kind.fields.iter().copied())
                    .collect();
                Problem::UnknownField {
                    expected: allowed.join(", "),
                }
            }
        };
        Err(self.error(key, Some(value.span()), problem))
    }
}

/// What the tests of every kind's fields share.
#[cfg(test)]
pub(super) mod testing {
    use std::path::Path;

    use super::{ConfigError, Problem};
    use crate::agents::AgentsFile;

    /// `text` as an agents file in `/tmp`.
    pub fn parse(text: &str) -> Result<AgentsFile, ConfigError> {
        AgentsFile::parse(text, Path::new("/tmp"))
    }

    /// `text` as an agents file in `/tmp`, in an environment of `vars` only.
    pub fn parse_with_env(text: &str, vars: &[(&str, &str)]) -> Result<AgentsFile, ConfigError> {
        let lookup = |name: &str| {
            vars.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        };
        AgentsFile::parse_with_env(text, Path::new("/tmp"), &lookup)
    }

    /// The error of `text`, checked to name the agent and the field, and to start with the
    /// file and the expected line.
    pub fn agent_error(text: &str, agent: &str, field: &str, line: usize) -> (Problem, String) {
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
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::testing::{agent_error, parse};
    use super::*;
    use crate::agents::AgentsFile;

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
            agent_error("[agents.coder]\nkind = \"python\"\n", "coder", "kind", 2);
        assert!(matches!(problem, Problem::UnknownKind { ref kind, .. } if kind == "python"));
        assert!(message.contains("unknown value \"python\""), "{message}");
    }

    /// The messages that list kinds, or say which kind a field belongs to, are built from the
    /// table of kinds: word for word what they were when they were written out.
    #[test]
    fn messages_that_name_kinds() {
        for (text, expected) in [
            (
                "[agents.a]\n",
                "<inline agents.toml>:1: agent \"a\": field `kind` is missing (expected \"command\", \"template\" or \"llm\")",
            ),
            (
                "[agents.a]\nkind = \"python\"\n",
                "<inline agents.toml>:2: agent \"a\": field `kind` has unknown value \"python\" (expected \"command\", \"template\" or \"llm\")",
            ),
            (
                "[agents.a]\nkind = 1\n",
                "<inline agents.toml>:2: agent \"a\": field `kind` must be \"command\", \"template\" or \"llm\", found integer",
            ),
            (
                "[agents.a]\nkind = \"command\"\ntemplate = \"{}\"\n",
                "<inline agents.toml>:3: agent \"a\": field `template` does not apply to kind \"command\" (it belongs to kind \"template\")",
            ),
            (
                "[agents.a]\nkind = \"template\"\nzzz = 1\n",
                "<inline agents.toml>:3: agent \"a\": field `zzz` is not a known field (expected one of: kind, template, template_file, delay_ms)",
            ),
        ] {
            assert_eq!(parse(text).unwrap_err().to_string(), expected);
        }
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
    fn line_numbers() {
        assert_eq!(line_of("a\nb\nc", 0), 1);
        assert_eq!(line_of("a\nb\nc", 2), 2);
        assert_eq!(line_of("a\nb\nc", 100), 3);
    }
}
