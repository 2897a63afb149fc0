//! `baton validate`, run as a user runs it; and what `baton submit` and a coordinator refuse
//! of a workflow, an input or an agent's result that `validate` would refuse too.

mod support;

#[path = "support/cluster.rs"]
mod harness;
#[path = "support/spec.rs"]
mod spec;

use std::fs;

use support::{baton, root, stdout};

fn example_files() -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![root().join("examples")];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.ends_with("schemas") {
                // JSON Schemas of llm agents' replies, not workflows.
                continue;
            }
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "json") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn accepts_every_example_of_the_spec() {
    let files = example_files();
    assert!(files.len() >= 7, "the spec has seven workflows: {files:?}");
    let output = baton().arg("validate").args(&files).output().unwrap();
    let out = stdout(&output);
    assert!(output.status.success(), "{out}");
    assert!(
        out.contains(&format!("{0} of {0} files valid", files.len())),
        "{out}"
    );
    assert!(!out.contains("error"), "{out}");
}

#[test]
fn rejects_a_broken_workflow_naming_each_problem_and_its_step() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broken.json");
    fs::write(
        &file,
        r#"{"id": "broken", "steps": [
            {"id": "plan", "type": "agnet", "agent": "planner"},
            {"id": "code", "type": "agent", "agent": "coder", "next": "tset", "input": "plan"},
            {"id": "test", "type": "condition", "condition": "context.code.ok ==="}
        ]}"#,
    )
    .unwrap();
    let output = baton().arg("validate").arg(&file).output().unwrap();
    let out = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    for expected in [
        "error: $.steps[0].type (step \"plan\"): unknown step type \"agnet\"",
        "did you mean \"agent\"?",
        "error: $.steps[1].next (step \"code\"): next names no step: \"tset\"; did you mean \"test\"?",
        "error: $.steps[2].condition (step \"test\"): cannot parse condition",
        "error: $.steps[2] (step \"test\"): a condition step needs \"then\", \"else\" or both",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
}

#[test]
fn warnings_alone_do_not_fail_and_json_output_is_one_object_per_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("warn.json");
    fs::write(
        &file,
        r#"{"steps": [
            {"id": "a", "type": "agent", "agent": "x", "end": true},
            {"id": "b", "type": "agent", "agent": "y"}
        ]}"#,
    )
    .unwrap();
    let output = baton()
        .args(["validate", "--json"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(output.status.success());
    let line: serde_json::Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    assert_eq!(line["valid"], true);
    assert_eq!(line["problems"][0]["severity"], "warning");
    assert_eq!(line["problems"][0]["step_id"], "b");
    assert_eq!(line["problems"][0]["path"], "$.steps[1]");
}

#[test]
fn a_missing_file_is_an_error_not_a_crash() {
    let output = baton()
        .args(["validate", "/nonexistent/workflow.json"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(stdout(&output).contains("cannot read the file"));
}

/// `baton validate --agents FILE` in an environment without BATON_LLM_* but `env`.
fn validate_agents(file: &std::path::Path, env: &[(&str, &str)]) -> std::process::Output {
    let mut command = baton();
    for name in [
        "BATON_LLM_BASE_URL",
        "BATON_LLM_MODEL",
        "BATON_LLM_API_KEY_ENV",
    ] {
        command.env_remove(name);
    }
    command
        .args(["validate", "--agents"])
        .arg(file)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// An agents file is checked as a worker loads it: the example's llm agents with their
/// `[defaults.llm]`; a bad default named with its file, line, table and field; a bad
/// `BATON_LLM_*` variable named as what set the field.
#[test]
fn agents_files_and_their_defaults_are_checked_naming_file_line_table_and_field() {
    let example = root().join("examples/feature-development/agents.llm.toml");
    let output = validate_agents(&example, &[]);
    assert!(output.status.success(), "{}", stdout(&output));
    assert_eq!(stdout(&output), format!("{}: ok\n", example.display()));

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agents.toml");
    fs::write(
        &file,
        "[defaults.llm]\nbase_url = \"http://localhost:11434/v1\"\ntemperature = \"hot\"\n\n[agents.a]\nkind = \"llm\"\nmodel = \"m\"\nprompt = \"x\"\n",
    )
    .unwrap();
    let output = validate_agents(&file, &[]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        stdout(&output),
        format!(
            "{}:3: [defaults.llm]: field `temperature` must be a number, 0 or more, found string\n",
            file.display()
        )
    );

    let output = validate_agents(&example, &[("BATON_LLM_BASE_URL", "localhost:11434")]);
    assert_eq!(output.status.code(), Some(1));
    let said = stdout(&output);
    assert!(
        said.starts_with(&format!(
            "{}:32: [defaults.llm]: field `base_url` (from environment variable BATON_LLM_BASE_URL) ",
            example.display()
        )),
        "{said}"
    );
}

/// A workflow file with workflow id `id` (written JSON-escaped, as an editor would save it).
fn workflow_with_id(dir: &std::path::Path, id: &str) -> std::path::PathBuf {
    let file = dir.join("workflow.json");
    let document = serde_json::json!({
        "id": id,
        "steps": [{"id": "t", "type": "transform", "transform": "input"}]
    });
    fs::write(&file, document.to_string()).unwrap();
    file
}

/// The attack: a workflow id holding an escape sequence cleared the terminal of whoever ran
/// `baton runs list`. `validate` refuses it at `$.id`, and prints it escaped, never raw.
#[test]
fn a_workflow_id_holding_an_ansi_escape_is_refused_at_its_path_and_printed_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let file = workflow_with_id(dir.path(), "\u{1b}[2J\u{1b}[1;31mpayments");
    let output = baton().arg("validate").arg(&file).output().unwrap();
    let out = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(
        out.contains(
            "error: $.id: workflow id \"\\u{1b}[2J\\u{1b}[1;31mpayments\" holds an unprintable \
             character (U+001B) at byte 0"
        ),
        "{out}"
    );
    assert!(
        !out.contains('\u{1b}'),
        "the escape reached the terminal: {out:?}"
    );
}

/// `baton submit` of a workflow whose id holds braces (which would pick the Redis Cluster slot
/// of its run index) is refused by the coordinator naming `$.id`, as `validate` refuses it; so
/// is an input with an integer beyond 64 bits, naming its path, rather than rounded on the way.
#[tokio::test]
async fn submit_refuses_braces_in_the_id_and_big_integers_in_the_input_naming_their_paths() {
    let cluster = harness::Cluster::start_memory().await;
    let dir = tempfile::tempdir().unwrap();
    let braces = workflow_with_id(dir.path(), "{payments}");
    let submit = |file: &std::path::Path, input: &str| {
        let mut command = harness::baton();
        command
            .arg("submit")
            .arg(file)
            .args(["--coordinator", cluster.url(), "--input", input]);
        harness::output(&mut command, None)
    };
    let refused = submit(&braces, "null");
    let err = support::stderr(&refused);
    assert!(!refused.status.success(), "{err}");
    assert!(
        err.contains("error: $.id: workflow id \"{payments}\" holds a brace at byte 0"),
        "{err}"
    );
    let validated = baton().arg("validate").arg(&braces).output().unwrap();
    assert!(stdout(&validated).contains("error: $.id: workflow id \"{payments}\" holds a brace"));

    let fine = workflow_with_id(dir.path(), "payments");
    let refused = submit(
        &fine,
        r#"{"order": {"id": 123456789012345678901234567890}}"#,
    );
    let err = support::stderr(&refused);
    assert!(!refused.status.success(), "{err}");
    assert!(
        err.contains(
            "the input at $.order.id: integer 123456789012345678901234567890 is beyond 64 bits"
        ) && err.contains("write it as a string"),
        "{err}"
    );
    // What fits goes through, written as it was.
    let accepted = submit(&fine, r#"{"order": {"id": 18446744073709551615}}"#);
    assert!(accepted.status.success(), "{}", support::stderr(&accepted));
}

/// An agent that prints an integer beyond 64 bits fails its step naming where, instead of
/// handing the next step a rounded float.
#[tokio::test]
async fn an_agent_returning_an_integer_beyond_64_bits_fails_its_step_naming_the_path() {
    let mut cluster = harness::Cluster::start_memory().await;
    let agents = cluster.dir().join("agents.toml");
    fs::write(
        &agents,
        r#"[agents.ledger]
kind = "command"
command = ["sh", "-c", "cat > /dev/null; echo '{\"balance\": {\"cents\": 123456789012345678901234567890}}'"]
"#,
    )
    .unwrap();
    cluster.start_worker("w1", &agents, 1);
    cluster.wait_for_workers(&["w1"]).await;
    let file = cluster.dir().join("workflow.json");
    fs::write(
        &file,
        r#"{"id": "ledger", "steps": [{"id": "read", "type": "agent", "agent": "ledger"}]}"#,
    )
    .unwrap();
    let mut command = harness::baton();
    command
        .arg("submit")
        .arg(&file)
        .args(["--coordinator", cluster.url(), "--json"]);
    let finished = harness::output(&mut command, None);
    let record: serde_json::Value = serde_json::from_str(&stdout(&finished))
        .unwrap_or_else(|e| panic!("{e}: {}", support::stderr(&finished)));
    assert_eq!(record["status"], "failed", "{record}");
    let error = record["steps"][0]["error"].as_str().unwrap();
    assert!(
        error.contains(
            "stdout at $.balance.cents: integer 123456789012345678901234567890 is beyond 64 bits"
        ),
        "{error}"
    );
    assert!(
        !record.to_string().contains("1.2345678901234568e29"),
        "the rounded number went on: {record}"
    );
}
