//! Agents declared in an agents file (`agents.toml`), and running them on a payload.
//!
//! ```toml
//! [agents.planner]
//! kind = "command"
//! command = ["python3", "planner.py"]   # argv, no shell
//! timeout_ms = 30000                    # optional
//! env = { MODEL = "small" }             # optional, added to the inherited environment
//! non_retryable_exit_codes = [2, 64]    # optional: these exits fail the step without a retry
//!
//! [agents.coder]
//! kind = "template"
//! template = '{"files": {{json context.plan.files}} }'
//! # or: template_file = "coder.hbs"
//! ```
//!
//! Relative paths are taken from the file's folder: `template_file`, a `command[0]` that
//! contains a `/` or names a file there, and the working directory of every command.
//!
//! Both kinds receive the payload Baton hands agents
//! (`{"input": ..., "context": {...}, "<reference>": ..., "messages": [...], "handoff": {...}}`)
//! and answer with one JSON value, the step's data (a command agent with
//! `output = "envelope"` answers `{"data": ..., "messages": [...], "decisions": [...]}`):
//!
//! - `command` ([`CommandAgent`]): the payload on stdin, the answer on stdout, exit status 0.
//! - `template` ([`TemplateAgent`]): a Handlebars template rendered against the payload, in
//!   strict mode without HTML escaping; `{{json value}}` embeds a value as JSON (see
//!   [`template`] for the rules, including how strict mode treats `{{#if}}`).
//!
//! A failure is retried by the step's retry policy unless retrying cannot help: a template
//! renders the same payload the same way every time, and a command says so by exiting with one
//! of its `non_retryable_exit_codes` (see [`Agent::failure`]).
//!
//! Layout: [`config`] reads the file, [`command`] and [`template`] run the two kinds,
//! [`AgentError`] is what a failed run returns.

pub mod command;
pub mod config;
mod error;
pub mod template;

#[cfg(test)]
mod spec_tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use command::{CommandAgent, STDERR_LIMIT, STDOUT_LIMIT};
pub use config::{ConfigError, Problem};
pub use error::AgentError;
pub use template::{Template, TemplateAgent, TemplateError, render_text};

/// The agents of one agents file, by name.
#[derive(Debug)]
pub struct AgentsFile {
    pub agents: BTreeMap<String, Agent>,
}

impl AgentsFile {
    /// Reads and checks the file; relative `command[0]` paths that exist relative to the file's
    /// folder, `template_file` and the working directory of commands are resolved against the
    /// file's folder. Every template is compiled here.
    pub fn load(path: &Path) -> Result<AgentsFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.to_owned(),
            source,
        })?;
        let base_dir = path.parent().unwrap_or(Path::new(""));
        let base_dir = absolute(base_dir).map_err(|source| ConfigError::Read {
            file: path.to_owned(),
            source,
        })?;
        let agents = config::parse_agents(&text, &base_dir, path)?;
        Ok(AgentsFile { agents })
    }

    /// Checks `text` as the contents of an agents file in `base_dir`. Errors name the file
    /// as `<inline agents.toml>`.
    pub fn parse(text: &str, base_dir: &Path) -> Result<AgentsFile, ConfigError> {
        let file = PathBuf::from("<inline agents.toml>");
        let base_dir = absolute(base_dir).map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
        let agents = config::parse_agents(text, &base_dir, &file)?;
        Ok(AgentsFile { agents })
    }

    /// The agent called `name`.
    pub fn get(&self, name: &str) -> Option<&Agent> {
        self.agents.get(name)
    }
}

/// `dir` made absolute against the current directory (an empty path is the current one).
fn absolute(dir: &Path) -> std::io::Result<PathBuf> {
    if dir.as_os_str().is_empty() {
        std::env::current_dir()
    } else {
        std::path::absolute(dir)
    }
}

/// One declared agent.
#[derive(Debug)]
pub enum Agent {
    Command(CommandAgent),
    Template(TemplateAgent),
}

impl Agent {
    /// The agent's name (its key in the agents file).
    pub fn name(&self) -> &str {
        match self {
            Agent::Command(agent) => agent.name(),
            Agent::Template(agent) => agent.name(),
        }
    }

    /// `"command"` or `"template"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Agent::Command(_) => "command",
            Agent::Template(_) => "template",
        }
    }

    /// Runs the agent on a payload (the JSON object Baton hands agents) and returns the step's
    /// data (with messages and decisions, for a command agent with `output = "envelope"`).
    ///
    /// `env` holds extra environment variables for command agents (the runtime passes
    /// `BATON_RUN_ID` etc.); they override the agent's own `env`. Template agents ignore it.
    /// A command agent reads the payload's bytes as they came, without parsing them.
    pub async fn run(
        &self,
        payload: &crate::Payload,
        env: &[(String, String)],
    ) -> Result<crate::Output, AgentError> {
        match self {
            Agent::Command(agent) => agent.run(payload.bytes(), env).await,
            Agent::Template(agent) => agent.run(payload.value()).map(crate::Output::new),
        }
    }

    /// `error`, from this agent's [`Agent::run`], as the runtime reports it: with its message,
    /// and retryable unless another attempt would fail the same way (every template error; a
    /// command's exit with one of its `non_retryable_exit_codes`).
    pub fn failure(&self, error: AgentError) -> crate::Failure {
        let retryable = match self {
            Agent::Command(agent) => agent.is_retryable(&error),
            Agent::Template(_) => false,
        };
        if retryable {
            crate::Failure::retryable(error.to_string())
        } else {
            crate::Failure::non_retryable(error.to_string())
        }
    }
}
