//! `baton validate`, run as a user runs it.

mod support;

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
