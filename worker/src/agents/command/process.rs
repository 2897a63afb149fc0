//! The exchange with a running agent process: its stdin fed while its stdout and stderr are
//! read, within limits, until it has exited and both pipes are closed; killing and reaping it.

use std::convert::Infallible;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin};

use crate::OutputSink;

/// Most stdout a command agent may write (its answer); beyond this the run fails.
pub const STDOUT_LIMIT: usize = 64 * 1024 * 1024;
/// How much of a failed command's stderr (its end) an error carries.
pub const STDERR_LIMIT: usize = 64 * 1024;

/// How long to keep reading stdout and stderr after the process has exited. Only a process
/// that left a background child holding its pipes needs this long.
pub(super) const PIPE_GRACE: Duration = Duration::from_secs(2);
/// How long to wait for a killed process to be reaped.
const REAP_WAIT: Duration = Duration::from_secs(5);

/// How an exchange ended.
pub(super) enum Outcome {
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

/// Feeds stdin while reading stdout (up to its limit) and stderr, until the process has exited
/// and both pipes are closed. Stderr also goes to `live` as it comes, if given.
pub(super) async fn exchange(
    child: &mut Child,
    stdin: ChildStdin,
    input: Vec<u8>,
    (stdout, stdout_limit): (impl AsyncRead + Unpin, usize),
    stderr: impl AsyncRead + Unpin,
    live: Option<&OutputSink>,
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
            read_tail(stderr, STDERR_LIMIT, live)
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
/// What arrives also goes to `live` as text, as it comes (a character split between two reads
/// waits for its other half).
async fn read_tail(
    mut reader: impl AsyncRead + Unpin,
    keep: usize,
    live: Option<&OutputSink>,
) -> String {
    let mut buffer = Vec::new();
    let mut chunk = vec![0u8; 8192];
    let mut dropped = 0usize;
    let mut unsent: Vec<u8> = Vec::new();
    loop {
        match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Some(live) = live {
                    unsent.extend_from_slice(&chunk[..n]);
                    let whole = match std::str::from_utf8(&unsent) {
                        Ok(_) => unsent.len(),
                        // Up to a character cut at the end; invalid bytes go as they are.
                        Err(e) if e.error_len().is_none() => e.valid_up_to(),
                        Err(_) => unsent.len(),
                    };
                    if whole > 0 {
                        live.text(&String::from_utf8_lossy(&unsent[..whole]));
                        unsent.drain(..whole);
                    }
                }
                buffer.extend_from_slice(&chunk[..n]);
                if buffer.len() > keep.saturating_mul(2) {
                    let cut = buffer.len() - keep;
                    buffer.drain(..cut);
                    dropped += cut;
                }
            }
        }
    }
    if let (Some(live), false) = (live, unsent.is_empty()) {
        live.text(&String::from_utf8_lossy(&unsent));
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
pub(super) async fn kill(child: &mut Child) {
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

#[cfg(all(test, unix))]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::agents::Agent;
    use crate::agents::AgentError;
    use crate::agents::command::tests::{run, script_agent};

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
    async fn with_stream_stderr_what_the_process_writes_there_goes_live_as_it_comes() {
        let (_dir, mut file) = script_agent(
            r#"printf 'thinking ' >&2; sleep 0.2; printf 'd\303' >&2; sleep 0.2; printf '\251j\303\240 vu\n' >&2; echo '{"done": true}'"#,
            "",
        );
        let Some(Agent::Command(agent)) = file.agents.remove("a") else {
            panic!("a command agent");
        };
        let agent = agent.with_stream_stderr(true);
        let (sink, mut pieces) = crate::live::OutputSink::channel();
        let running = {
            let agent = agent.clone();
            tokio::spawn(async move { agent.run(b"{}", &[], &sink).await })
        };
        // The first piece arrives while the process still runs.
        let first = pieces.next().await.unwrap().text;
        assert_eq!(first, "thinking ");
        assert!(!running.is_finished(), "streamed before the process ended");
        let answer = running.await.unwrap().unwrap();
        assert_eq!(
            answer.data,
            json!({"done": true}),
            "stdout stays the answer"
        );
        let mut rest = String::new();
        while let Some(piece) = pieces.next().await {
            rest.push_str(&piece.text);
        }
        // A character split between two writes is kept whole.
        assert_eq!(rest, "déjà vu\n");

        // Without it, nothing is streamed.
        let quiet = agent.with_stream_stderr(false);
        let (sink, mut pieces) = crate::live::OutputSink::channel();
        quiet.run(b"{}", &[], &sink).await.unwrap();
        drop(sink);
        assert!(pieces.next().await.is_none());
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
}
