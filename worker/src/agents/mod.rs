//! Agents declared in an agents file (`agents.toml`), and running them on a payload.
//!
//! - this file: [`AgentsFile`], and [`Agent`], one agent of any kind.
//! - `config`: reading and checking the file, the part every kind shares: the TOML, each
//!   agent's table with its line numbers, the dispatch on `kind`, [`ConfigError`]; a kind's
//!   defaults (`[defaults.llm]` and the environment variables over it, `config/defaults.rs`).
//! - `command/`: the `command` kind, [`CommandAgent`]: running its process (`mod.rs`,
//!   `process.rs`), reading its output or envelope (`output.rs`), its fields (`config.rs`).
//! - `template/`: the `template` kind, [`TemplateAgent`], and Handlebars templates (`mod.rs`);
//!   prompt templates, [`PromptTemplate`] (`prompt.rs`); its fields (`config.rs`).
//! - `llm/`: the `llm` kind, [`LlmAgent`]: a model behind an OpenAI-compatible API, asked with
//!   a prompt rendered from the payload (`mod.rs`); the request (`request.rs`), the call and its
//!   retries (`http.rs`), reading the reply, whole or streamed (`receive.rs`), what the reply
//!   becomes (`reply.rs`), its fields (`config.rs`).
//! - `error`: [`AgentError`], what a failed run returns.
//! - `spec_tests`: the spec's prompt templates and its example's agents, run for real.
//!
//! A new kind gets a folder like `command/`: `mod.rs` holds the agent and runs it, `config.rs`
//! its `FIELDS` (besides `kind`) and the `check` that turns an agent's table into the agent.
//! Then, in this file, it takes a line in `KINDS` and a variant of [`Agent`] with its arms in
//! `Agent`'s methods, and a section in the example below; a problem with its fields that no
//! kind had before is a new [`Problem`].
//!
//! ```toml
//! [agents.planner]
//! kind = "command"
//! command = ["python3", "planner.py"]   # argv, no shell
//! timeout_ms = 30000                    # optional
//! env = { MODEL = "small" }             # optional, added to the inherited environment
//! non_retryable_exit_codes = [2, 64]    # optional: these exits fail the step without a retry
//! stream_stderr = true                  # optional: stderr goes live to the run's watchers
//!
//! [agents.glue]
//! kind = "template"
//! template = '{"files": {{json context.plan.files}} }'
//! # or: template_file = "glue.hbs"
//!
//! [defaults.llm]                          # optional: any llm field, for every llm agent
//! model = "qwen2.5-coder:7b"              # (BATON_LLM_MODEL, BATON_LLM_BASE_URL and
//!                                         # BATON_LLM_API_KEY_ENV win over it; an agent's
//!                                         # own field wins over both)
//!
//! [agents.coder]
//! kind = "llm"
//! base_url = "http://localhost:11434/v1"  # OpenAI-compatible: POST {base_url}/chat/completions
//! model = "qwen2.5-coder:7b"
//! api_key_env = "OPENAI_API_KEY"          # optional: the variable holding the key
//! system = "You are a coding specialist." # optional, a prompt too (or system_file)
//! prompt_file = "prompts/coder.md"        # or prompt = "..."
//! output = "json"                         # "json" (default), "text" or "envelope"
//! json_schema_file = "schemas/code.json"  # optional: response_format, and the reply checked
//! max_repairs = 1                         # optional: unusable replies asked again
//! stream = true                           # optional: tokens to watchers as they come
//! history = false                         # optional: the run's messages before the prompt
//! temperature = 0.2                       # optional, with max_tokens, top_p, stop, seed
//! extra = { keep_alive = "5m" }           # optional: merged into the request body
//! http_retries = 2                        # optional: 429, 5xx, timeouts tried again
//! idle_timeout_ms = 120000                # optional: the longest silence from the server
//! ```
//!
//! Relative paths are taken from the file's folder: `template_file`, `prompt_file`,
//! `system_file`, `json_schema_file`, a `command[0]` that contains a `/` or names a file
//! there, and the working directory of every command. An `llm` agent's key is read from the
//! environment when the file is loaded, and never shown (not in `Debug` output, errors or
//! logs).
//!
//! Every kind receives the payload Baton hands agents
//! (`{"input": ..., "context": {...}, "<reference>": ..., "messages": [...], "handoff": {...}}`)
//! and answer with one JSON value, the step's data (a command agent with
//! `output = "envelope"` answers `{"data": ..., "messages": [...], "decisions": [...]}`):
//!
//! - `command` ([`CommandAgent`]): the payload on stdin, the answer on stdout, exit status 0.
//! - `template` ([`TemplateAgent`]): a Handlebars template rendered against the payload, in
//!   strict mode without HTML escaping; `{{json value}}` embeds a value as JSON (see
//!   `template/mod.rs` for the rules, including how strict mode treats `{{#if}}`).
//! - `llm` ([`LlmAgent`]): its prompt (and system prompt) rendered against the payload as a
//!   prompt (a missing field empty, arrays and objects as compact JSON; see
//!   `template/prompt.rs`), sent to the model; the reply's JSON (whole, in a ```` ```json ````
//!   fence, or the first value in its text; checked against the schema) is the data, and an
//!   unusable reply is asked again with the error, `max_repairs` times. The reply also goes to
//!   the run's history as an assistant message. See `llm/mod.rs` and `llm/http.rs`.
//!
//! A failure is retried by the step's retry policy unless retrying cannot help: a template
//! renders the same payload the same way every time, a command says so by exiting with one
//! of its `non_retryable_exit_codes`, and a model server by refusing the request (a 4xx; see
//! [`Agent::failure`]). An `llm` agent's failure carries the model calls it made.

mod command;
mod config;
mod error;
mod llm;
mod template;

#[cfg(test)]
mod spec_tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use command::{CommandAgent, STDERR_LIMIT, STDOUT_LIMIT};
use config::Kind;
pub use config::{ConfigError, Problem};
pub use error::AgentError;
pub use llm::LlmAgent;
pub use template::{
    PromptTemplate, Template, TemplateAgent, TemplateError, render_prompt, render_text,
};

/// Every kind of agent, in the order messages list them: its name in `kind = "..."`, its
/// fields, and its check, which makes the agent.
const KINDS: &[Kind<Agent>] = &[
    Kind {
        name: "command",
        fields: command::config::FIELDS,
        check: |checker, fields| command::config::check(checker, fields).map(Agent::Command),
        defaults: None,
    },
    Kind {
        name: "template",
        fields: template::config::FIELDS,
        check: |checker, fields| template::config::check(checker, fields).map(Agent::Template),
        defaults: None,
    },
    Kind {
        name: "llm",
        fields: llm::config::FIELDS,
        check: |checker, fields| {
            llm::config::check(checker, fields).map(|agent| Agent::Llm(Box::new(agent)))
        },
        defaults: Some(llm::config::DEFAULTS),
    },
];

/// The agents of one agents file, by name.
#[derive(Debug)]
pub struct AgentsFile {
    pub agents: BTreeMap<String, Agent>,
}

impl AgentsFile {
    /// Reads and checks the file; relative `command[0]` paths that exist relative to the file's
    /// folder, the files fields name and the working directory of commands are resolved
    /// against the file's folder. Every template and schema is compiled here, and API keys are
    /// read from the process's environment.
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
        let agents = config::parse_agents(&text, &base_dir, path, &process_env, KINDS)?;
        Ok(AgentsFile { agents })
    }

    /// Checks `text` as the contents of an agents file in `base_dir`. Errors name the file
    /// as `<inline agents.toml>`.
    pub fn parse(text: &str, base_dir: &Path) -> Result<AgentsFile, ConfigError> {
        AgentsFile::parse_with_env(text, base_dir, &process_env)
    }

    /// [`AgentsFile::parse`], with environment variables (`api_key_env`) looked up by `env`
    /// instead of in the process's environment: for tests, and for callers that keep
    /// secrets elsewhere.
    pub fn parse_with_env(
        text: &str,
        base_dir: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<AgentsFile, ConfigError> {
        let file = PathBuf::from("<inline agents.toml>");
        let base_dir = absolute(base_dir).map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
        let agents = config::parse_agents(text, &base_dir, &file, env, KINDS)?;
        Ok(AgentsFile { agents })
    }

    /// The agent called `name`.
    pub fn get(&self, name: &str) -> Option<&Agent> {
        self.agents.get(name)
    }
}

/// An environment variable of this process, if it is set (and valid Unicode).
fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
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
    /// Boxed: an HTTP client, compiled prompts and a schema are much larger than the others.
    Llm(Box<LlmAgent>),
}

impl Agent {
    /// The agent's name (its key in the agents file).
    pub fn name(&self) -> &str {
        match self {
            Agent::Command(agent) => agent.name(),
            Agent::Template(agent) => agent.name(),
            Agent::Llm(agent) => agent.name(),
        }
    }

    /// `"command"`, `"template"` or `"llm"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Agent::Command(_) => "command",
            Agent::Template(_) => "template",
            Agent::Llm(_) => "llm",
        }
    }

    /// Runs the agent on a payload (the JSON object Baton hands agents) and returns the step's
    /// data (with messages and decisions, for an agent with `output = "envelope"`; an llm
    /// agent's reply as a message, and the model calls it made).
    ///
    /// `env` holds extra environment variables for command agents (the runtime passes
    /// `BATON_RUN_ID` etc.); they override the agent's own `env`. Other kinds ignore it.
    /// A command agent reads the payload's bytes as they came, without parsing them. `output`
    /// takes the agent's live output, for the run's watchers (an llm agent's reply as it
    /// comes). Dropping the future stops the agent: a command's process is killed, an llm
    /// agent's request closed.
    pub async fn run(
        &self,
        payload: &crate::Payload,
        env: &[(String, String)],
        output: &crate::OutputSink,
    ) -> Result<crate::Output, AgentError> {
        match self {
            Agent::Command(agent) => agent.run(payload.bytes(), env, output).await,
            Agent::Template(agent) => {
                if !agent.delay().is_zero() {
                    tokio::time::sleep(agent.delay()).await;
                }
                agent.run(payload.value()).map(crate::Output::new)
            }
            Agent::Llm(agent) => match payload.try_value() {
                Ok(payload) => agent.run(payload, output).await,
                Err(reason) => Err(AgentError::Template {
                    agent: agent.name().to_owned(),
                    reason,
                }),
            },
        }
    }

    /// `error`, from this agent's [`Agent::run`], as the runtime reports it: with its message,
    /// the model calls the run made, and retryable unless another attempt would fail the same
    /// way (every template error; a command's exit with one of its
    /// `non_retryable_exit_codes`; a request a model server refused).
    pub fn failure(&self, error: AgentError) -> crate::Failure {
        let retryable = match self {
            Agent::Command(agent) => agent.is_retryable(&error),
            Agent::Template(_) => false,
            Agent::Llm(agent) => agent.is_retryable(&error),
        };
        let message = error.to_string();
        let failure = if retryable {
            crate::Failure::retryable(message)
        } else {
            crate::Failure::non_retryable(message)
        };
        failure.with_calls(error.calls().iter().cloned())
    }
}
