//! The `command` agent kind: a process that reads the payload on stdin and answers on stdout.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};

use super::AgentError;
use super::template::quote_start;
use crate::Output;

/// Most stdout a command agent may write (its answer); beyond this the run fails.
pub const STDOUT_LIMIT: usize = 64 * 1024 * 1024;
/// How much of a failed command's stderr (its end) an error carries.
pub const STDERR_LIMIT: usize = 64 * 1024;

/// How long to keep reading stdout and stderr after the process has exited. Only a process
/// that left a background child holding its pipes needs this long.
const PIPE_GRACE: Duration = Duration::from_secs(2);
/// How long to wait for a killed process to be reaped.
const REAP_WAIT: Duration = Duration::from_secs(5);
/// How much of a bad stdout an error quotes.
const QUOTE_CHARS: usize = 200;

/// An agent run as a process: `argv`, no shell, in the agents file's folder.
///
/// Protocol: the payload is written to stdin as JSON and stdin is closed; exit status 0 means
/// success, and stdout must then hold one JSON value (surrounding whitespace allowed), the
/// step's data. A non-zero exit fails the step with the end of stderr; an exit code among the
/// agent's `non_retryable_exit_codes` fails it for good (no retry). Stdout and stderr are read
/// concurrently, so neither can fill up and block the process.
///
/// Environment: the worker's own, then the agent's `env`, then what the runtime passes
/// (`BATON_RUN_ID`...), later ones winning.
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
        }
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

    #[cfg(test)]
    pub(super) fn set_stdout_limit(&mut self, limit: usize) {
        self.stdout_limit = limit;
    }

    /// Runs the process with the payload's JSON on stdin; `env` is added last to its
    /// environment.
    pub async fn run(
        &self,
        payload: &[u8],
        env: &[(String, String)],
    ) -> Result<Output, AgentError> {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .current_dir(&self.dir)
            .envs(&self.env)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|e| self.spawn_error(&e))?;
        tracing::debug!(agent = %self.name, pid = child.id(), "command agent started");

        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            unreachable!("all three pipes were requested");
        };
        let input = payload.to_vec();

        let exchange = exchange(&mut child, stdin, input, stdout, stderr, self.stdout_limit);
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
            } => self.interpret(status, &stdout, stderr),
            Outcome::StdoutTooLarge => {
                kill(&mut child).await;
                Err(self.bad_output(format!("stdout exceeded {} bytes", self.stdout_limit)))
            }
            Outcome::PipesLeftOpen => {
                kill(&mut child).await;
                Err(self.bad_output(format!(
                    "the process exited but its stdout or stderr stayed open for {} s (a background process it started still holds them)",
                    PIPE_GRACE.as_secs()
                )))
            }
            Outcome::Io(e) => {
                kill(&mut child).await;
                Err(self.bad_output(format!("reading its output failed: {e}")))
            }
        }
    }

    fn interpret(
        &self,
        status: ExitStatus,
        stdout: &[u8],
        stderr: String,
    ) -> Result<Output, AgentError> {
        if !status.success() {
            return Err(AgentError::Failed {
                agent: self.name.clone(),
                exit_code: status.code(),
                signal: signal_of(status),
                stderr,
            });
        }
        if stdout.iter().all(u8::is_ascii_whitespace) {
            return Err(self.bad_output("stdout is empty; expected one JSON value".to_owned()));
        }
        let value: Value = serde_json::from_slice(stdout).map_err(|e| {
            self.bad_output(format!(
                "stdout is not JSON ({e}); it starts with: {}",
                quote_start(&String::from_utf8_lossy(stdout), QUOTE_CHARS)
            ))
        })?;
        if self.envelope {
            Output::from_envelope(value).map_err(|reason| self.bad_output(reason))
        } else {
            Ok(Output::new(value))
        }
    }

    fn bad_output(&self, reason: String) -> AgentError {
        AgentError::BadOutput {
            agent: self.name.clone(),
            reason,
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

enum Outcome {
    Finished {
        status: ExitStatus,
        stdout: Vec<u8>,
        stderr: String,
    },
    StdoutTooLarge,
    PipesLeftOpen,
    Io(std::io::Error),
}

enum ReadError {
    TooLarge,
    Io(std::io::Error),
}

/// Feeds stdin while reading stdout and stderr, until the process has exited and both pipes
/// are closed.
async fn exchange(
    child: &mut Child,
    stdin: ChildStdin,
    input: Vec<u8>,
    stdout: impl AsyncRead + Unpin,
    stderr: impl AsyncRead + Unpin,
    stdout_limit: usize,
) -> Outcome {
    // Writing stdin runs alongside and never ends the exchange: a process may exit or answer
    // without reading all of it.
    let feed = async {
        write_stdin(stdin, &input).await;
        std::future::pending::<Infallible>().await
    };
    let readers = async {
        tokio::join!(
            read_limited(stdout, stdout_limit),
            read_tail(stderr, STDERR_LIMIT)
        )
    };
    let main = async {
        tokio::pin!(readers);
        let (status, (out, err)) = tokio::select! {
            read = &mut readers => {
                if let (Err(_), _) = &read {
                    // Stop early: the process may keep writing.
                    return read_failure(read.0);
                }
                match child.wait().await {
                    Ok(status) => (status, read),
                    Err(e) => return Outcome::Io(e),
                }
            }
            status = child.wait() => {
                let status = match status {
                    Ok(status) => status,
                    Err(e) => return Outcome::Io(e),
                };
                match tokio::time::timeout(PIPE_GRACE, &mut readers).await {
                    Ok(read) => (status, read),
                    Err(_) => return Outcome::PipesLeftOpen,
                }
            }
        };
        match out {
            Ok(stdout) => Outcome::Finished {
                status,
                stdout,
                stderr: err,
            },
            Err(e) => read_failure(Err(e)),
        }
    };
    tokio::select! {
        outcome = main => outcome,
        never = feed => match never {},
    }
}

fn read_failure(read: Result<Vec<u8>, ReadError>) -> Outcome {
    match read {
        Err(ReadError::TooLarge) => Outcome::StdoutTooLarge,
        Err(ReadError::Io(e)) => Outcome::Io(e),
        Ok(_) => unreachable!("only called on errors"),
    }
}

async fn write_stdin(mut stdin: ChildStdin, input: &[u8]) {
    if let Err(e) = stdin.write_all(input).await {
        // A process that does not read its stdin closes it early: not an error.
        tracing::debug!(error = %e, "could not write the whole payload to the agent's stdin");
        return;
    }
    if let Err(e) = stdin.shutdown().await {
        tracing::debug!(error = %e, "closing the agent's stdin failed");
    }
    drop(stdin);
}

/// Reads to the end, failing once more than `limit` bytes have arrived.
async fn read_limited(reader: impl AsyncRead + Unpin, limit: usize) -> Result<Vec<u8>, ReadError> {
    let mut buffer = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    reader
        .take(cap)
        .read_to_end(&mut buffer)
        .await
        .map_err(ReadError::Io)?;
    if buffer.len() > limit {
        return Err(ReadError::TooLarge);
    }
    Ok(buffer)
}

/// Reads to the end and keeps the last `keep` bytes, as trimmed text; says how much was cut.
async fn read_tail(mut reader: impl AsyncRead + Unpin, keep: usize) -> String {
    let mut buffer = Vec::new();
    let mut chunk = vec![0u8; 8192];
    let mut dropped = 0usize;
    loop {
        match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                buffer.extend_from_slice(&chunk[..n]);
                if buffer.len() > keep.saturating_mul(2) {
                    let cut = buffer.len() - keep;
                    buffer.drain(..cut);
                    dropped += cut;
                }
            }
        }
    }
    if buffer.len() > keep {
        let cut = buffer.len() - keep;
        buffer.drain(..cut);
        dropped += cut;
    }
    let text = String::from_utf8_lossy(&buffer);
    let text = text.trim();
    if dropped > 0 {
        format!("[{dropped} earlier bytes of stderr omitted]\n{text}")
    } else {
        text.to_owned()
    }
}

/// Kills the process (if still running) and reaps it.
async fn kill(child: &mut Child) {
    if let Err(e) = child.start_kill() {
        tracing::debug!(error = %e, "killing the agent process failed (already exited?)");
    }
    if tokio::time::timeout(REAP_WAIT, child.wait()).await.is_err() {
        tracing::warn!(
            pid = child.id(),
            "a killed agent process has not exited yet"
        );
    }
}

#[cfg(unix)]
fn signal_of(status: ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}

#[cfg(not(unix))]
fn signal_of(_: ExitStatus) -> Option<i32> {
    None
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use serde_json::json;
    use tempfile::TempDir;

    use super::*;
    use crate::Payload;
    use crate::agents::{Agent, AgentsFile};

    /// A tempdir holding `agents.toml` with `toml` and the given scripts (executable).
    fn setup(toml: &str, scripts: &[(&str, &str)]) -> (TempDir, AgentsFile) {
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
    fn script_agent(body: &str, extra: &str) -> (TempDir, AgentsFile) {
        setup(
            &format!("[agents.a]\nkind = \"command\"\ncommand = [\"sh\", \"a.sh\"]\n{extra}\n"),
            &[("a.sh", body)],
        )
    }

    async fn run(file: &AgentsFile, payload: &Value) -> Result<crate::Output, AgentError> {
        file.get("a")
            .unwrap()
            .run(&Payload::from_value(payload.clone()), &[])
            .await
    }

    #[tokio::test]
    async fn answers_with_the_json_on_stdout() {
        let (_dir, file) = script_agent(r#"echo '  {"ok": true, "n": [1, 2]}  '"#, "");
        // A big payload the script never reads: the broken pipe is not an error.
        let payload = json!({"input": "x".repeat(1 << 20), "context": {}});
        assert_eq!(
            run(&file, &payload).await.unwrap(),
            json!({"ok": true, "n": [1, 2]})
        );
    }

    #[tokio::test]
    async fn receives_the_payload_on_stdin() {
        let (_dir, file) = script_agent(
            r#"payload=$(cat); printf '{"received": %s, "words": %s}' "$payload" "$(printf '%s' "$payload" | tr ',' '\n' | wc -l)""#,
            "",
        );
        let payload =
            json!({"input": "Add dark mode toggle", "context": {"plan": {"files": ["a", "b"]}}});
        let out = run(&file, &payload).await.unwrap();
        assert_eq!(out.data["received"], payload);
        assert_eq!(out.data["words"], json!(2));
    }

    #[tokio::test]
    async fn an_envelope_agent_hands_on_data_messages_and_decisions() {
        let (_dir, file) = script_agent(
            r#"cat > /dev/null; echo '{"data": {"files": ["a.ts"]}, "messages": [{"role": "assistant", "content": "done"}], "decisions": [{"summary": "Use hooks", "rationale": "simpler"}]}'"#,
            "output = \"envelope\"",
        );
        let out = run(&file, &json!({})).await.unwrap();
        assert_eq!(out.data, json!({"files": ["a.ts"]}));
        assert_eq!(
            out.messages,
            [json!({"role": "assistant", "content": "done"})]
        );
        assert_eq!(
            out.decisions,
            [json!({"summary": "Use hooks", "rationale": "simpler"})]
        );
    }

    #[tokio::test]
    async fn plain_output_is_data_even_when_it_looks_like_an_envelope() {
        let (_dir, file) =
            script_agent(r#"cat > /dev/null; echo '{"data": 1, "messages": []}'"#, "");
        let out = run(&file, &json!({})).await.unwrap();
        assert_eq!(out, json!({"data": 1, "messages": []}));
    }

    #[tokio::test]
    async fn a_bad_envelope_fails_the_step_naming_what_is_wrong() {
        let (_dir, file) = script_agent(
            r#"cat > /dev/null; echo '{"messages": []}'"#,
            "output = \"envelope\"",
        );
        let err = run(&file, &json!({})).await.unwrap_err().to_string();
        assert!(
            err.contains("agent \"a\" returned bad output") && err.contains("no \"data\""),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_non_zero_exit_fails_with_code_and_stderr() {
        let (_dir, file) = script_agent(
            "echo '{\"ignored\": 1}'; echo '  something broke  ' >&2; exit 3",
            "",
        );
        let err = run(&file, &json!({})).await.unwrap_err();
        match &err {
            AgentError::Failed {
                agent,
                exit_code,
                signal,
                stderr,
            } => {
                assert_eq!(agent, "a");
                assert_eq!(*exit_code, Some(3));
                assert_eq!(*signal, None);
                assert_eq!(stderr, "something broke");
            }
            other => panic!("expected Failed, got {other:?}"),
        }
        assert_eq!(
            err.to_string(),
            "agent \"a\" exited with code 3: something broke"
        );
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
    async fn a_signal_is_reported() {
        let (_dir, file) = script_agent("kill -9 $$", "");
        let err = run(&file, &json!({})).await.unwrap_err();
        assert!(
            matches!(
                err,
                AgentError::Failed {
                    exit_code: None,
                    signal: Some(9),
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "agent \"a\" was killed by signal 9 (stderr was empty)"
        );
    }

    #[tokio::test]
    async fn stdout_that_is_not_json_is_quoted() {
        let (_dir, file) = script_agent("echo 'Here is the plan: {\"files\": []}'", "");
        let err = run(&file, &json!({})).await.unwrap_err();
        assert!(matches!(err, AgentError::BadOutput { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.starts_with("agent \"a\" returned bad output: stdout is not JSON"));
        assert!(
            message.contains(r#""Here is the plan: {\"files\": []}""#),
            "{message}"
        );
    }

    #[tokio::test]
    async fn empty_stdout_is_bad_output() {
        let (_dir, file) = script_agent("echo '   '", "");
        let err = run(&file, &json!({})).await.unwrap_err();
        assert!(err.to_string().contains("stdout is empty"), "{err}");
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
            .run(&Payload::from_value(json!({})), &env)
            .await
            .unwrap();
        assert_eq!(
            out,
            json!({"model": "small", "tier": "paid", "run": "run-1", "has_path": true})
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
        let out = file
            .get("bare")
            .unwrap()
            .run(&Payload::from_value(json!({})), &[])
            .await
            .unwrap();
        assert_eq!(
            std::fs::canonicalize(out.data["dir"].as_str().unwrap()).unwrap(),
            dir_path
        );
        let out = file
            .get("nested")
            .unwrap()
            .run(&Payload::from_value(json!({})), &[])
            .await
            .unwrap();
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

    #[tokio::test]
    async fn large_stdin_stdout_and_stderr_do_not_deadlock() {
        // Floods stderr before reading stdin, then answers with 3 MB.
        let (_dir, file) = script_agent(
            r#"head -c 3000000 /dev/zero | tr '\0' e >&2
n=$(wc -c)
printf '{"bytes": %s, "pad": "' "$n"; head -c 3000000 /dev/zero | tr '\0' x; printf '"}'"#,
            "",
        );
        let payload = json!({"input": "i".repeat(2_000_000)});
        let expected_bytes = serde_json::to_vec(&payload).unwrap().len();
        let out = run(&file, &payload).await.unwrap();
        assert_eq!(out.data["bytes"], json!(expected_bytes));
        assert_eq!(out.data["pad"].as_str().unwrap().len(), 3_000_000);
    }

    #[tokio::test]
    async fn stderr_is_capped_to_its_end() {
        let (_dir, file) = script_agent(
            r#"head -c 300000 /dev/zero | tr '\0' e >&2; echo >&2; echo 'the real error' >&2; exit 1"#,
            "",
        );
        let AgentError::Failed { stderr, .. } = run(&file, &json!({})).await.unwrap_err() else {
            panic!("expected Failed");
        };
        assert!(stderr.len() <= STDERR_LIMIT + 100, "{}", stderr.len());
        assert!(stderr.starts_with("["), "{}", &stderr[..80]);
        assert!(stderr.contains("earlier bytes of stderr omitted"));
        assert!(stderr.ends_with("the real error"));
    }

    #[tokio::test]
    async fn stdout_beyond_the_limit_fails() {
        let (_dir, mut file) = script_agent(
            r#"printf '"'; head -c 100000 /dev/zero | tr '\0' x; printf '"'; exec sleep 30"#,
            "",
        );
        let Some(Agent::Command(agent)) = file.agents.get_mut("a") else {
            panic!("a command agent");
        };
        agent.set_stdout_limit(1000);
        let err = run(&file, &json!({})).await.unwrap_err();
        assert!(matches!(err, AgentError::BadOutput { .. }), "{err:?}");
        assert!(
            err.to_string().contains("stdout exceeded 1000 bytes"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_background_child_holding_stdout_does_not_hang_the_run() {
        // The script exits at once, but a background child keeps stdout open for 3 s: the run
        // gives up after the grace period instead of waiting for it.
        let (_dir, file) = script_agent("sleep 3 & echo '{}'", "");
        let err = run(&file, &json!({})).await.unwrap_err();
        assert!(matches!(err, AgentError::BadOutput { .. }), "{err:?}");
        assert!(err.to_string().contains("stayed open"), "{err}");
    }

    #[test]
    fn the_run_future_is_send() {
        fn assert_send<T: Send>(_: T) {}
        let (_dir, file) = script_agent("true", "");
        let payload = json!({});
        let payload = Payload::from_value(payload);
        assert_send(file.get("a").unwrap().run(&payload, &[]));
    }
}
