//! The Kubernetes manifests as kubectl renders them, for the tests that check them
//! (`kubernetes.rs`) and run them (`pod_smoke.rs`): `kubectl kustomize DIR`, its YAML read into
//! JSON objects by the PyYAML of `kubernetes-validate`'s own Python (no YAML crate in the tree),
//! and a few readers of rendered objects. Needs `super::images` (for [`tool`] and [`run`]).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use super::images::{DOCKER_DEADLINE, run, tool};

/// `kubectl kustomize dir`: its YAML, and the objects in it as JSON.
pub fn render(dir: &Path) -> (String, Vec<Value>) {
    let output = run(
        Command::new(tool("kubectl")).arg("kustomize").arg(dir),
        DOCKER_DEADLINE,
    );
    assert!(
        output.status.success(),
        "`kubectl kustomize {}` failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let yaml = String::from_utf8(output.stdout).expect("kustomize prints UTF-8");
    let converted = with_input(
        Command::new(python()).args([
            "-c",
            "import json, sys, yaml\n\
             json.dump([d for d in yaml.safe_load_all(sys.stdin) if d], sys.stdout)",
        ]),
        yaml.as_bytes(),
    );
    assert!(
        converted.status.success(),
        "cannot turn the rendered YAML of {} into JSON with PyYAML:\n{}",
        dir.display(),
        String::from_utf8_lossy(&converted.stderr)
    );
    let objects: Vec<Value> = serde_json::from_slice(&converted.stdout).expect("JSON");
    assert!(!objects.is_empty(), "{} renders no object", dir.display());
    (yaml, objects)
}

/// The Python that runs `kubernetes-validate` (it has PyYAML, a dependency of the latter): the
/// one its first line names, or the python3 next to it.
pub fn python() -> PathBuf {
    let validate = tool("kubernetes-validate");
    let script = std::fs::read_to_string(&validate).unwrap_or_default();
    script
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("#!"))
        .and_then(|line| line.split_whitespace().next())
        .map(PathBuf::from)
        .filter(|interpreter| {
            interpreter.is_file()
                && interpreter
                    .file_name()
                    .is_some_and(|name| name.to_string_lossy().starts_with("python"))
        })
        .or_else(|| Some(validate.with_file_name("python3")).filter(|p| p.is_file()))
        .unwrap_or_else(|| {
            panic!(
                "cannot find the Python interpreter of {} (its first line names none, and there \
                 is no python3 next to it)",
                validate.display()
            )
        })
}

/// Runs `command` with `input` on its stdin; its output.
pub fn with_input(command: &mut Command, input: &[u8]) -> Output {
    super::images::process::run_within(command, Some(input), DOCKER_DEADLINE)
        .unwrap_or_else(|error| panic!("{error}"))
}

pub fn kind(object: &Value) -> &str {
    object["kind"].as_str().unwrap_or("?")
}

pub fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or("?")
}

/// A `labels` (or `matchLabels`) map as strings.
pub fn labels(value: &Value) -> BTreeMap<String, String> {
    value
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
        .collect()
}
