//! What can go wrong when an agent runs.

/// An agent run that produced no step data. Every message names the agent.
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
}

impl AgentError {
    /// The name of the agent that failed.
    pub fn agent(&self) -> &str {
        match self {
            AgentError::Failed { agent, .. }
            | AgentError::Timeout { agent, .. }
            | AgentError::BadOutput { agent, .. }
            | AgentError::Spawn { agent, .. }
            | AgentError::Template { agent, .. } => agent,
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
