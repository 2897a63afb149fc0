//! What an agent process's ending makes of the step: its exit status and stdout become the
//! step's data (or an envelope of data and notes), or an error saying what was wrong.

use std::process::ExitStatus;

use baton_core::big_integers::first_big_integer;
use serde_json::Value;

use crate::Output;
use crate::agents::AgentError;
use crate::agents::template::quote_start;

/// How much of a bad stdout an error quotes.
const QUOTE_CHARS: usize = 200;

/// The answer of `agent`'s process, which exited with `status` having written `stdout` and
/// `stderr` (its end): stdout's one JSON value is the step's data, or an envelope of data and
/// notes when `envelope`.
pub(super) fn interpret(
    agent: &str,
    envelope: bool,
    status: ExitStatus,
    stdout: &[u8],
    stderr: String,
) -> Result<Output, AgentError> {
    if !status.success() {
        return Err(AgentError::Failed {
            agent: agent.to_owned(),
            exit_code: status.code(),
            signal: signal_of(status),
            stderr,
        });
    }
    if stdout.iter().all(u8::is_ascii_whitespace) {
        return Err(bad_output(
            agent,
            "stdout is empty; expected one JSON value".to_owned(),
        ));
    }
    let value: Value = serde_json::from_slice(stdout).map_err(|e| {
        bad_output(
            agent,
            format!(
                "stdout is not JSON ({e}); it starts with: {}",
                quote_start(&String::from_utf8_lossy(stdout), QUOTE_CHARS)
            ),
        )
    })?;
    // serde_json read an integer beyond 64 bits as a float; sent on, it would be another number.
    if let Some(found) = first_big_integer(stdout, &value) {
        return Err(bad_output(
            agent,
            format!("stdout at {}: {}", found.path, found.problem()),
        ));
    }
    if envelope {
        Output::from_envelope(value).map_err(|reason| bad_output(agent, reason))
    } else {
        Ok(Output::new(value))
    }
}

/// `agent` ended without usable step data, for `reason`.
pub(super) fn bad_output(agent: &str, reason: String) -> AgentError {
    AgentError::BadOutput {
        agent: agent.to_owned(),
        reason,
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
    use serde_json::json;

    use crate::agents::AgentError;
    use crate::agents::command::tests::{run, script_agent};

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

    /// serde_json would read it as 1.2345678901234568e29 and the step would go on with it.
    #[tokio::test]
    async fn an_integer_beyond_64_bits_is_bad_output_naming_where_not_a_rounded_float() {
        let (_dir, file) = script_agent(
            r#"cat > /dev/null; echo '{"data": {"id": 123456789012345678901234567890}}'"#,
            "output = \"envelope\"",
        );
        let err = run(&file, &json!({})).await.unwrap_err();
        assert!(matches!(err, AgentError::BadOutput { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "agent \"a\" returned bad output: stdout at $.data.id: integer \
             123456789012345678901234567890 is beyond 64 bits, which JSON readers round to a \
             float; write it as a string (\"123456789012345678901234567890\")"
        );
        let (_dir, file) = script_agent(r#"echo '[18446744073709551615, 1e30]'"#, "");
        assert_eq!(
            run(&file, &json!({})).await.unwrap(),
            json!([u64::MAX, 1e30]),
            "what fits, and floats, are kept"
        );
    }

    #[tokio::test]
    async fn empty_stdout_is_bad_output() {
        let (_dir, file) = script_agent("echo '   '", "");
        let err = run(&file, &json!({})).await.unwrap_err();
        assert!(err.to_string().contains("stdout is empty"), "{err}");
    }
}
