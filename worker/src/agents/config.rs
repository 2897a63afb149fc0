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
//! errors of one that does not compile. `defaults`: `[defaults.<kind>]` tables and the
//! environment variables over them, checked and merged into each agent of their kind.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::{Spanned, Value};

mod defaults;
mod sources;

pub(super) use defaults::KindDefaults;
pub(super) use sources::Source;

/// One kind of agent, `A` being what any agent is: its name in `kind = "..."`, the fields it
/// takes besides `kind`, and how its table becomes an agent.
pub(super) struct Kind<A> {
    pub(super) name: &'static str,
    pub(super) fields: &'static [&'static str],
    pub(super) check: fn(&Checker, Fields) -> Result<A, ConfigError>,
    /// What its agents may inherit (`[defaults.<name>]`, environment variables); `None`: the
    /// kind takes no defaults.
    pub(super) defaults: Option<KindDefaults>,
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
    #[error("{}: agent \"{agent}\": field `{field}`{} {problem}", location(file, *line), from_note(from))]
    Agent {
        file: PathBuf,
        /// The line of the field, or of the agent's table when the field is missing or was set
        /// by an environment variable.
        line: Option<usize>,
        agent: String,
        field: String,
        /// Where the field came from when the agent's table does not set it: `[defaults.llm]`,
        /// or `environment variable BATON_LLM_BASE_URL`.
        from: Option<String>,
        problem: Box<Problem>,
    },
    /// One field of a `[defaults.<kind>]` table is unknown or invalid.
    #[error("{}: [defaults.{kind}]: field `{field}`{} {problem}", location(file, *line), from_note(from))]
    Defaults {
        file: PathBuf,
        /// The line of the field, or of the table when an environment variable set it.
        line: Option<usize>,
        kind: String,
        field: String,
        /// The environment variable that set the field over the table, if one did.
        from: Option<String>,
        problem: Box<Problem>,
    },
}

/// ` (from <where>)`, or nothing.
fn from_note(from: &Option<String>) -> String {
    from.as_ref()
        .map(|from| format!(" (from {from})"))
        .unwrap_or_default()
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
    agents: BTreeMap<String, Spanned<Table<AGENT>>>,
    #[serde(default)]
    defaults: BTreeMap<String, Spanned<Table<DEFAULTS>>>,
}

/// What a table under `[agents]` is, for a message that refuses anything else.
const AGENT: u8 = 0;
/// What a table under `[defaults]` is.
const DEFAULTS: u8 = 1;

/// A table's fields, each with its span; anything but a table is refused with a message that
/// says what the table looks like (`WHAT`: [`AGENT`] or [`DEFAULTS`]).
struct Table<const WHAT: u8>(Fields);

impl<'de, const WHAT: u8> Deserialize<'de> for Table<WHAT> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor<const WHAT: u8>;
        impl<'de, const WHAT: u8> serde::de::Visitor<'de> for Visitor<WHAT> {
            type Value = Table<WHAT>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(match WHAT {
                    AGENT => {
                        "a table of agent fields, like [agents.planner] with kind = \"command\""
                    }
                    _ => {
                        "a table of defaults for one kind of agent, like [defaults.llm] with model = \"...\""
                    }
                })
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Table<WHAT>, A::Error> {
                let mut fields = Fields::new();
                while let Some((key, value)) = map.next_entry::<String, Spanned<Value>>()? {
                    fields.insert(key, value);
                }
                Ok(Table(fields))
            }
        }
        deserializer.deserialize_map(Visitor::<WHAT>)
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
    let defaults = defaults::check_tables(raw.defaults, text, base_dir, file, env, kinds)?;
    let mut agents = BTreeMap::new();
    for (name, table) in raw.agents {
        let table_span = table.span();
        let checker = Checker {
            text,
            file,
            base_dir,
            env,
            table: TableName::Agent(&name),
            table_line: line_of(text, table_span.start),
            inherited: BTreeMap::new(),
        };
        let agent = checker.agent(kinds, table.into_inner().0, table_span, &defaults)?;
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

/// Checks one agent's table (or a kind's defaults): what a kind's `check` reports its problems
/// through, so that each names the file, the line, the agent (or `[defaults.<kind>]`), the
/// field, and where the field came from when the agent's table does not set it.
pub(super) struct Checker<'a> {
    text: &'a str,
    file: &'a Path,
    base_dir: &'a Path,
    env: Env<'a>,
    table: TableName<'a>,
    table_line: usize,
    /// The fields the table did not set itself, with where they came from (`[defaults.llm]`,
    /// `environment variable BATON_LLM_MODEL`).
    inherited: BTreeMap<String, String>,
}

/// Whose fields a [`Checker`] checks.
#[derive(Clone, Copy)]
enum TableName<'a> {
    /// An agent's, by name.
    Agent(&'a str),
    /// `[defaults.<kind>]`'s.
    Defaults(&'static str),
}

impl Checker<'_> {
    /// The agent's name (its key in the file); for defaults, the kind's.
    pub(super) fn agent_name(&self) -> &str {
        match self.table {
            TableName::Agent(name) => name,
            TableName::Defaults(kind) => kind,
        }
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
        let file = self.file.to_owned();
        let line = Some(span.map_or(self.table_line, |s| line_of(self.text, s.start)));
        let field = field.to_owned();
        let from = self.inherited.get(&field).cloned();
        let problem = Box::new(problem);
        match self.table {
            TableName::Agent(agent) => ConfigError::Agent {
                file,
                line,
                agent: agent.to_owned(),
                field,
                from,
                problem,
            },
            TableName::Defaults(kind) => ConfigError::Defaults {
                file,
                line,
                kind: kind.to_owned(),
                field,
                from,
                problem,
            },
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

    /// The agent of `fields` (its table, at `span`), by the check of its `kind`, one of
    /// `kinds`, with what it inherits from its kind's `defaults` and the environment.
    fn agent<A>(
        mut self,
        kinds: &[Kind<A>],
        mut fields: Fields,
        span: Range<usize>,
        defaults: &defaults::Tables,
    ) -> Result<A, ConfigError> {
        let kind = self.kind(kinds, &mut fields)?;
        self.reject_unknown(kinds, kind, &fields, true)?;
        if let Some(spec) = &kind.defaults {
            let table = defaults.get(kind.name);
            self.inherited = spec.inherit(&mut fields, kind.name, table, self.env, span);
        }
        (kind.check)(&self, fields)
    }

    /// The kind `fields` names in `kind` (removed from them), one of `kinds`.
    fn kind<'k, A>(
        &self,
        kinds: &'k [Kind<A>],
        fields: &mut Fields,
    ) -> Result<&'k Kind<A>, ConfigError> {
        Ok(match fields.remove("kind") {
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
        })
    }

    /// Fails on the first (in file order) field `kind` does not take (`kind` itself aside when
    /// `with_kind`, as an agent's table has it).
    fn reject_unknown<A>(
        &self,
        kinds: &[Kind<A>],
        kind: &Kind<A>,
        fields: &Fields,
        with_kind: bool,
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
                    .filter(|_| with_kind)
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

    /// `text` as an agents file in `/tmp`, in the process's environment but for the variables
    /// that set llm agents' defaults (a developer's `BATON_LLM_MODEL` changes no test).
    pub fn parse(text: &str) -> Result<AgentsFile, ConfigError> {
        let lookup = |name: &str| {
            if name.starts_with("BATON_LLM_") {
                None
            } else {
                std::env::var(name).ok()
            }
        };
        AgentsFile::parse_with_env(text, Path::new("/tmp"), &lookup)
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
mod tests;
