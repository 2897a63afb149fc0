//! The `command` agent kind: a process that reads the payload on stdin and answers on stdout.
//!
//! - this file: [`CommandAgent`], and running it: spawning the process, its time limit, what
//!   each way it can end means.
//! - `process`: the exchange with the running process: stdin fed while stdout and stderr are
//!   read, within limits, until it has exited; killing and reaping it.
//! - `output`: what its exit status and stdout make: the step's data, an envelope of data and
//!   notes, or an error saying what was wrong.
//! - `config`: the kind's fields in an agents file, and their checks.

pub(super) mod config;
mod output;
mod process;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

use super::AgentError;
use crate::{Output, OutputSink};
use output::bad_output;
use process::{Outcome, PIPE_GRACE, exchange, kill};
pub use process::{STDERR_LIMIT, STDOUT_LIMIT};

/// The variables through which the `baton` binary takes a credential: the worker's token and
/// client certificate, and those a coordinator or client in the same environment reads. A
/// command agent's process does not inherit them: with the worker's token, any agent could
/// connect as the worker and answer, or name, the tasks of every agent the worker serves.
pub const CREDENTIAL_VARIABLES: &[&str] = &[
    "BATON_TOKEN",
    "BATON_TLS_CLIENT_CERT",
    "BATON_TLS_CLIENT_KEY",
    "BATON_TLS_CERT",
    "BATON_TLS_KEY",
    "BATON_AUTH_TOKENS",
    "BATON_REDIS_URL",
    "BATON_REDIS",
    "BATON_EMBEDDINGS_API_KEY",
];

/// An agent run as a process: `argv`, no shell, in the agents file's folder.
///
/// Protocol: the payload is written to stdin as JSON and stdin is closed; exit status 0 means
/// success, and stdout must then hold one JSON value (surrounding whitespace allowed), the
/// step's data. A non-zero exit fails the step with the end of stderr; an exit code among the
/// agent's `non_retryable_exit_codes` fails it for good (no retry). Stdout and stderr are read
/// concurrently, so neither can fill up and block the process.
///
/// Environment: the worker's own without its Baton credentials ([`CREDENTIAL_VARIABLES`]),
/// then the agent's `env`, then what the runtime passes (`BATON_RUN_ID`...), later ones
/// winning. An agent that needs a credential gets it only from its `env` in the agents file.
///
/// Live output: with `stream_stderr = true`, what the process writes to stderr is streamed to
/// the run's watchers as it comes (progress lines, a model's tokens), and still kept for the
/// error of a failed run. Stdout stays the answer.
///
/// On timeout the process is killed (SIGKILL) and reaped. Only that process: children it
/// started in the background are not, so an agent script should `exec` its last program (or
/// handle the cleanup itself).
#[derive(Debug, Clone)]
pub struct CommandAgent {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    dir: PathBuf,
    timeout: Option<Duration>,
    env: BTreeMap<String, String>,
    stdout_limit: usize,
    /// `output = "envelope"`: stdout is `{"data", "messages", "decisions"}`, not the data.
    envelope: bool,
    /// Exit codes by which the process says that running it again cannot help.
    non_retryable_exit_codes: BTreeSet<i32>,
    /// `stream_stderr = true`: stderr goes to the run's watchers as it comes.
    stream_stderr: bool,
}

impl CommandAgent {
    pub(super) fn new(
        name: &str,
        program: PathBuf,
        args: Vec<String>,
        dir: PathBuf,
        timeout: Option<Duration>,
        env: BTreeMap<String, String>,
    ) -> CommandAgent {
        CommandAgent {
            name: name.to_owned(),
            program,
            args,
            dir,
            timeout,
            env,
            stdout_limit: STDOUT_LIMIT,
            envelope: false,
            non_retryable_exit_codes: BTreeSet::new(),
            stream_stderr: false,
        }
    }

    /// Streams what the process writes to stderr to the run's watchers (`stream_stderr`).
    pub fn with_stream_stderr(mut self, stream: bool) -> Self {
        self.stream_stderr = stream;
        self
    }

    pub fn stream_stderr(&self) -> bool {
        self.stream_stderr
    }

    /// Exit codes that fail the step at once, whatever its retry policy
    /// (`non_retryable_exit_codes`).
    pub fn with_non_retryable_exit_codes(mut self, codes: impl IntoIterator<Item = i32>) -> Self {
        self.non_retryable_exit_codes = codes.into_iter().collect();
        self
    }

    pub fn non_retryable_exit_codes(&self) -> &BTreeSet<i32> {
        &self.non_retryable_exit_codes
    }

    /// Whether `error`, from this agent's [`Self::run`], may go away on another attempt: all
    /// do but an exit with one of the agent's `non_retryable_exit_codes`.
    pub fn is_retryable(&self, error: &AgentError) -> bool {
        match error {
            AgentError::Failed {
                exit_code: Some(code),
                ..
            } => !self.non_retryable_exit_codes.contains(code),
            _ => true,
        }
    }

    /// Reads stdout as an envelope `{"data", "messages", "decisions"}` instead of plain data.
    pub fn with_envelope(mut self, envelope: bool) -> Self {
        self.envelope = envelope;
        self
    }

    /// Whether stdout is an envelope (`output = "envelope"`).
    pub fn envelope(&self) -> bool {
        self.envelope
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The program spawned: an absolute path when `command[0]` was a path relative to the
    /// agents file, else the name as written (looked up on `PATH`).
    pub fn program(&self) -> &Path {
        &self.program
    }

    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// The working directory: the agents file's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The variables the agent's `env` adds.
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.env
    }

    /// The process to spawn, `env` added last to its environment, the worker's credentials
    /// taken out first (an agent's own `env` may pass one back).
    fn command(&self, env: &[(String, String)]) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args).current_dir(&self.dir);
        for variable in CREDENTIAL_VARIABLES {
            command.env_remove(variable);
        }
        command
            .envs(&self.env)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    #[cfg(test)]
    pub(super) fn set_stdout_limit(&mut self, limit: usize) {
        self.stdout_limit = limit;
    }

    /// Runs the process with the payload's JSON on stdin; `env` is added last to its
    /// environment. With `stream_stderr`, its stderr goes to `output` as it comes.
    pub async fn run(
        &self,
        payload: &[u8],
        env: &[(String, String)],
        output: &OutputSink,
    ) -> Result<Output, AgentError> {
        let mut command = self.command(env);
        let mut child = command.spawn().map_err(|e| self.spawn_error(&e))?;
        tracing::debug!(agent = %self.name, pid = child.id(), "command agent started");

        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            unreachable!("all three pipes were requested");
        };
        let input = payload.to_vec();

        let live = self.stream_stderr.then_some(output);
        let exchange = exchange(
            &mut child,
            stdin,
            input,
            (stdout, self.stdout_limit),
            stderr,
            live,
        );
        let outcome = match self.timeout {
            None => exchange.await,
            Some(limit) => match tokio::time::timeout(limit, exchange).await {
                Ok(outcome) => outcome,
                Err(_) => {
                    tracing::warn!(agent = %self.name, after_ms = limit.as_millis() as u64, "command agent timed out; killing it");
                    kill(&mut child).await;
                    return Err(AgentError::Timeout {
                        agent: self.name.clone(),
                        after_ms: limit.as_millis().try_into().unwrap_or(u64::MAX),
                    });
                }
            },
        };

        match outcome {
            Outcome::Finished {
                status,
                stdout,
                stderr,
            } => output::interpret(&self.name, self.envelope, status, &stdout, stderr),
            Outcome::StdoutTooLarge => {
                kill(&mut child).await;
                Err(bad_output(
                    &self.name,
                    format!("stdout exceeded {} bytes", self.stdout_limit),
                ))
            }
            Outcome::PipesLeftOpen => {
                kill(&mut child).await;
                Err(bad_output(
                    &self.name,
                    format!(
                        "the process exited but its stdout or stderr stayed open for {} s (a background process it started still holds them)",
                        PIPE_GRACE.as_secs()
                    ),
                ))
            }
            Outcome::Io(e) => {
                kill(&mut child).await;
                Err(bad_output(
                    &self.name,
                    format!("reading its output failed: {e}"),
                ))
            }
        }
    }

    fn spawn_error(&self, e: &std::io::Error) -> AgentError {
        let reason = match e.kind() {
            std::io::ErrorKind::NotFound if self.program.is_absolute() => {
                format!("{} does not exist", self.program.display())
            }
            std::io::ErrorKind::NotFound => format!(
                "program not found (not on PATH, and not a file in {})",
                self.dir.display()
            ),
            std::io::ErrorKind::PermissionDenied => {
                "permission denied (is it executable?)".to_owned()
            }
            _ => e.to_string(),
        };
        AgentError::Spawn {
            agent: self.name.clone(),
            program: self.program.display().to_string(),
            reason,
        }
    }
}

/// Command agents run for real, from agents files in a tempdir; the helpers serve the tests of
/// `process` and `output` too.
#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use serde_json::{Value, json};
    use tempfile::TempDir;

    use super::*;
    use crate::Payload;
    use crate::agents::{Agent, AgentsFile};

    /// A tempdir holding `agents.toml` with `toml` and the given scripts (executable).
    pub(super) fn setup(toml: &str, scripts: &[(&str, &str)]) -> (TempDir, AgentsFile) {
        let dir = tempfile::tempdir().unwrap();
        for (name, body) in scripts {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let path = dir.path().join("agents.toml");
        std::fs::write(&path, toml).unwrap();
        let file = AgentsFile::load(&path).unwrap_or_else(|e| panic!("{e}"));
        (dir, file)
    }

    /// One `sh script.sh` agent called `a`.
    pub(super) fn script_agent(body: &str, extra: &str) -> (TempDir, AgentsFile) {
        setup(
            &format!("[agents.a]\nkind = \"command\"\ncommand = [\"sh\", \"a.sh\"]\n{extra}\n"),
            &[("a.sh", body)],
        )
    }

    /// Runs agent `a` of `file` on `payload`, without extra environment.
    pub(super) async fn run(
        file: &AgentsFile,
        payload: &Value,
    ) -> Result<crate::Output, AgentError> {
        run_named(file, "a", payload).await
    }

    /// Runs agent `name` of `file` on `payload`, without extra environment.
    pub(super) async fn run_named(
        file: &AgentsFile,
        name: &str,
        payload: &Value,
    ) -> Result<crate::Output, AgentError> {
        file.get(name)
            .unwrap()
            .run(
                &Payload::from_value(payload.clone()),
                &[],
                &crate::OutputSink::none(),
            )
            .await
    }

    #[tokio::test]
    async fn only_the_listed_exit_codes_are_not_retried() {
        let (dir, file) = script_agent(
            "cat > /dev/null; exit \"$(cat code)\"",
            "non_retryable_exit_codes = [2, 64]",
        );
        let agent = file.get("a").unwrap();
        for (code, retryable) in [(64, false), (2, false), (1, true), (3, true)] {
            std::fs::write(dir.path().join("code"), code.to_string()).unwrap();
            let err = run(&file, &json!({})).await.unwrap_err();
            let message = err.to_string();
            let failure = agent.failure(err);
            assert_eq!(failure.is_retryable(), retryable, "exit {code}");
            assert_eq!(
                failure.message(),
                message,
                "the message is the agent error's"
            );
        }
        // Anything else (bad output here, or a timeout) may go another way next time.
        let (_dir, file) =
            script_agent("echo 'not json'; exit 0", "non_retryable_exit_codes = [1]");
        let err = run(&file, &json!({})).await.unwrap_err();
        assert!(file.get("a").unwrap().failure(err).is_retryable());
    }

    #[tokio::test]
    async fn a_timeout_kills_the_process() {
        let (dir, file) = script_agent("echo $$ > pid; exec sleep 30", "timeout_ms = 300");
        let err = run(&file, &json!({})).await.unwrap_err();
        assert!(
            matches!(err, AgentError::Timeout { ref agent, after_ms: 300 } if agent == "a"),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "agent \"a\" timed out after 300 ms and was killed"
        );
        // The process was killed and reaped: it no longer exists, not even as a zombie.
        let pid = std::fs::read_to_string(dir.path().join("pid")).unwrap();
        let status = std::process::Command::new("kill")
            .args(["-0", pid.trim()])
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(!status.success(), "process {} is still alive", pid.trim());
    }

    #[tokio::test]
    async fn env_is_inherited_then_agent_then_runtime() {
        let (_dir, file) = script_agent(
            r#"printf '{"model": "%s", "tier": "%s", "run": "%s", "has_path": %s}' "$MODEL" "$TIER" "$BATON_RUN_ID" "$([ -n "$PATH" ] && echo true || echo false)""#,
            r#"env = { MODEL = "small", TIER = "free" }"#,
        );
        let env = [
            ("BATON_RUN_ID".to_owned(), "run-1".to_owned()),
            ("TIER".to_owned(), "paid".to_owned()),
        ];
        let out = file
            .get("a")
            .unwrap()
            .run(
                &Payload::from_value(json!({})),
                &env,
                &crate::OutputSink::none(),
            )
            .await
            .unwrap();
        assert_eq!(
            out,
            json!({"model": "small", "tier": "paid", "run": "run-1", "has_path": true})
        );
    }

    /// The weak point of issue 28: command agents inherited the worker's `BATON_TOKEN`, so
    /// any agent could connect as the worker. None of its credentials reach the process,
    /// unless the agents file passes one in the agent's `env`.
    #[test]
    fn an_agent_process_gets_no_baton_credential_unless_its_env_passes_one() {
        let (_dir, file) = script_agent("true", r#"env = { BATON_TLS_CLIENT_KEY = "agent.key" }"#);
        let Agent::Command(agent) = file.get("a").unwrap() else {
            panic!("a command agent");
        };
        let command = agent.command(&[("BATON_RUN_ID".to_owned(), "r".to_owned())]);
        let envs: BTreeMap<String, Option<String>> = command
            .as_std()
            .get_envs()
            .map(|(k, v)| {
                let text = |s: &std::ffi::OsStr| s.to_string_lossy().into_owned();
                (text(k), v.map(text))
            })
            .collect();
        for variable in CREDENTIAL_VARIABLES {
            let expected = match *variable {
                "BATON_TLS_CLIENT_KEY" => Some("agent.key".to_owned()),
                _ => None,
            };
            assert_eq!(envs.get(*variable), Some(&expected), "{variable}");
        }
        assert_eq!(envs["BATON_RUN_ID"].as_deref(), Some("r"));
        assert!(
            !envs.contains_key("BATON_COORDINATOR") && !envs.contains_key("PATH"),
            "everything else is inherited as it is"
        );
    }

    #[tokio::test]
    async fn paths_are_relative_to_the_agents_file() {
        let toml = r#"
[agents.bare]
kind = "command"
command = ["agent.sh"]

[agents.nested]
kind = "command"
command = ["./bin/agent.sh", "data.txt"]
"#;
        let (dir, file) = setup(
            toml,
            &[
                ("agent.sh", r#"printf '{"dir": "%s"}' "$(pwd)""#),
                ("bin/agent.sh", r#"printf '{"arg": "%s"}' "$(cat "$1")""#),
            ],
        );
        std::fs::write(dir.path().join("data.txt"), "from the file's folder").unwrap();
        let dir_path = std::fs::canonicalize(dir.path()).unwrap();
        let out = run_named(&file, "bare", &json!({})).await.unwrap();
        assert_eq!(
            std::fs::canonicalize(out.data["dir"].as_str().unwrap()).unwrap(),
            dir_path
        );
        let out = run_named(&file, "nested", &json!({})).await.unwrap();
        assert_eq!(out, json!({"arg": "from the file's folder"}));
        let Agent::Command(nested) = file.get("nested").unwrap() else {
            panic!("a command agent");
        };
        assert!(nested.program().is_absolute(), "{:?}", nested.program());
    }

    #[tokio::test]
    async fn a_missing_program_is_named() {
        let (_dir, file) = setup(
            "[agents.a]\nkind = \"command\"\ncommand = [\"baton-no-such-program\"]\n",
            &[],
        );
        let err = run(&file, &json!({})).await.unwrap_err();
        assert!(
            matches!(err, AgentError::Spawn { ref program, .. } if program == "baton-no-such-program"),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(
            message.starts_with(
                "agent \"a\" could not start \"baton-no-such-program\": program not found"
            ),
            "{message}"
        );
        let (_dir, file) = setup(
            "[agents.a]\nkind = \"command\"\ncommand = [\"./missing.sh\"]\n",
            &[],
        );
        let message = run(&file, &json!({})).await.unwrap_err().to_string();
        assert!(message.contains("missing.sh does not exist"), "{message}");
    }

    #[test]
    fn the_run_future_is_send() {
        fn assert_send<T: Send>(_: T) {}
        let (_dir, file) = script_agent("true", "");
        let payload = json!({});
        let payload = Payload::from_value(payload);
        assert_send(
            file.get("a")
                .unwrap()
                .run(&payload, &[], &crate::OutputSink::none()),
        );
    }
}
