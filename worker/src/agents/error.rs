//! What can go wrong when an agent runs.

use crate::output::ModelCall;

/// An agent run that produced no step data. Every message names the agent; none holds an
/// `llm` agent's API key.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A command agent exited unsuccessfully (non-zero code, or killed by a signal).
    #[error("agent \"{agent}\" {}{}", exit_description(*exit_code, *signal), stderr_suffix(stderr))]
    Failed {
        agent: String,
        /// The exit code; `None` when the process was ended by a signal.
        exit_code: Option<i32>,
        /// The signal that ended the process (Unix), if any.
        signal: Option<i32>,
        /// The end of its stderr, trimmed and capped (see [`super::STDERR_LIMIT`]).
        stderr: String,
    },
    /// A command agent ran past its `timeout_ms` and was killed.
    #[error("agent \"{agent}\" timed out after {after_ms} ms and was killed")]
    Timeout { agent: String, after_ms: u64 },
    /// The agent finished but what it produced is not usable step data (not JSON, too large).
    #[error("agent \"{agent}\" returned bad output: {reason}")]
    BadOutput { agent: String, reason: String },
    /// A command agent's program could not be started.
    #[error("agent \"{agent}\" could not start {program:?}: {reason}")]
    Spawn {
        agent: String,
        program: String,
        reason: String,
    },
    /// A template agent's template failed to render (a missing field in strict mode, a
    /// helper error).
    #[error("agent \"{agent}\": template failed to render: {reason}")]
    Template { agent: String, reason: String },
    /// An `llm` agent's model server gave no reply: it could not be reached, did not answer
    /// in time, was overloaded (429, 5xx) or broke its reply off, every time it was tried.
    #[error("agent \"{agent}\": no reply from the model at {url}: {reason}")]
    ModelUnavailable {
        agent: String,
        url: String,
        reason: String,
        calls: Vec<ModelCall>,
    },
    /// An `llm` agent's model server refused the request (a 4xx: a bad key, an unknown model
    /// or URL, a request it cannot serve): another attempt would be refused the same way.
    #[error("agent \"{agent}\": the model at {url} refused the request (HTTP {status}): {message}")]
    ModelRefused {
        agent: String,
        url: String,
        status: u16,
        /// The server's own message (OpenAI's `error.message`, or the start of its body).
        message: String,
        calls: Vec<ModelCall>,
    },
    /// An `llm` agent's model replied, but not with what its `output` asks for, after the
    /// repairs it was allowed.
    #[error("agent \"{agent}\": unusable reply from the model: {reason}")]
    BadReply {
        agent: String,
        reason: String,
        calls: Vec<ModelCall>,
    },
}

impl AgentError {
    /// The name of the agent that failed.
    pub fn agent(&self) -> &str {
        match self {
            AgentError::Failed { agent, .. }
            | AgentError::Timeout { agent, .. }
            | AgentError::BadOutput { agent, .. }
            | AgentError::Spawn { agent, .. }
            | AgentError::Template { agent, .. }
            | AgentError::ModelUnavailable { agent, .. }
            | AgentError::ModelRefused { agent, .. }
            | AgentError::BadReply { agent, .. } => agent,
        }
    }

    /// The calls to models the run made before it failed (their tokens count all the same).
    pub fn calls(&self) -> &[ModelCall] {
        match self {
            AgentError::ModelUnavailable { calls, .. }
            | AgentError::ModelRefused { calls, .. }
            | AgentError::BadReply { calls, .. } => calls,
            _ => &[],
        }
    }
}

fn exit_description(exit_code: Option<i32>, signal: Option<i32>) -> String {
    match (exit_code, signal) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => "exited unsuccessfully".to_owned(),
    }
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.is_empty() {
        " (stderr was empty)".to_owned()
    } else {
        format!(": {stderr}")
    }
}
