//! `baton dev`: a whole run in one process on the in-memory store, run as a user runs it; and the
//! same run on a real cluster giving the same state checksum.

#[path = "support/cluster.rs"]
mod harness;
#[path = "support/otlp.rs"]
mod otlp;
#[path = "support/recipes.rs"]
mod recipes;
#[path = "support/spec.rs"]
mod spec;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use baton_proto::v1::{DecideApprovalRequest, VerifyRunRequest};
use harness::{Cluster, Records, Watch, baton, output};
use serde_json::{Value, json};

fn example(path: &str) -> PathBuf {
    harness::root()
        .join("examples/feature-development")
        .join(path)
}

/// `baton dev <feature-development> --agents AGENTS --input "Add dark mode toggle" ARGS...`,
/// as the user `e2e-user`.
fn dev(agents: &Path, args: &[&str]) -> Command {
    let mut command = baton();
    command
        .arg("dev")
        .arg(example("workflow.json"))
        .arg("--agents")
        .arg(agents)
        .arg("--input")
        .arg(spec::INPUT)
        .args(args)
        .env("USER", "e2e-user");
    command
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "baton dev exited with {}\n── stdout:\n{}\n── stderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// The decision `--auto-approve` takes: the bare approval the spec shows.
fn auto_approval() -> Value {
    json!({"approved": true})
}

/// The JSON blocks of a transcript that follow a `── ... received:` or `── ... returned:` header
/// (`what` is `"received"` or `"returned"`), each with its step, in order. A `returned:` header
/// that names no step belongs to the step whose payload was printed just before.
fn blocks(transcript: &str, what: &str) -> Vec<(String, Value)> {
    let mut found = Vec::new();
    let mut last_step = String::new();
    let mut lines = transcript.lines();
    while let Some(line) = lines.next() {
        let Some(header) = line.trim_start().strip_prefix("──") else {
            continue;
        };
        let header = header.trim();
        let Some((named, kind)) = header
            .strip_suffix(':')
            .and_then(|h| h.rsplit_once(' ').or(Some(("", h))))
        else {
            continue;
        };
        let step = match named.split(" (agent ").next().unwrap_or_default() {
            "" => last_step.clone(),
            step => step.to_owned(),
        };
        if kind == "received" {
            last_step = step.clone();
        }
        if kind != what {
            continue;
        }
        let mut json = String::new();
        let value = loop {
            let line = lines
                .next()
                .unwrap_or_else(|| panic!("the block of {header:?} never ends:\n{transcript}"));
            json.push_str(line);
            json.push('\n');
            if let Ok(value) = serde_json::from_str::<Value>(&json) {
                break value;
            }
        };
        found.push((step, value));
    }
    found
}

#[test]
fn dev_auto_approve_prints_each_payload_and_result() {
    // The README's first command, run by the binary `cargo run` builds.
    harness::assert_doc_runs(
        "README.md",
        "## Two commands",
        &[
            "dev",
            "examples/feature-development/workflow.json",
            "--agents",
            "examples/feature-development/agents.toml",
            "--input",
            spec::INPUT,
            "--auto-approve",
        ],
    );
    let out = output(&mut dev(&example("agents.toml"), &["--auto-approve"]), None);
    assert_success(&out);
    let transcript = text(&out.stdout);
    let run_id = transcript
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("run "))
        .unwrap_or_else(|| panic!("the first line names the run:\n{transcript}"))
        .to_owned();

    let mut received: Vec<(String, Value)> = blocks(&transcript, "received")
        .into_iter()
        .map(|(step, payload)| (step, spec::spec_view(payload)))
        .collect();
    received.sort_by(|a, b| a.0.cmp(&b.0));
    let mut expected: Vec<(String, Value)> = spec::payloads(&auto_approval())
        .into_iter()
        .map(|(step, payload)| (step.to_owned(), payload))
        .collect();
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(received, expected, "{transcript}");

    let mut returned = blocks(&transcript, "returned");
    returned.sort_by(|a, b| a.0.cmp(&b.0));
    let mut answers: Vec<(String, Value)> = spec::results()
        .into_iter()
        .map(|(key, value)| (key.split('#').next().unwrap().to_owned(), value))
        .collect();
    answers.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(returned, answers, "{transcript}");

    for line in [
        "(agent planner) received:",
        "⏸ approve-plan",
        "✓ approve-plan",
        "✓ parallel-tests",
        "✓ check-tests",
        "-> review",
    ] {
        assert!(
            transcript.contains(line),
            "{line:?} missing from:\n{transcript}"
        );
    }
    // The run's end, then its state chain, checked before `baton dev` exits.
    let end = format!("run {run_id} succeeded\nstate chain verified: 8 links, head ");
    assert!(transcript.contains(&end), "{transcript}");
}

#[test]
fn dev_json_prints_exactly_one_json_object() {
    let out = output(
        &mut dev(&example("agents.toml"), &["--auto-approve", "--json"]),
        None,
    );
    assert_success(&out);
    let stdout = text(&out.stdout);
    let record: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not exactly one JSON value ({e}):\n{stdout}"));
    assert_eq!(record["status"], json!("succeeded"));
    assert_eq!(record["workflow_id"], json!("feature-development"));
    assert_eq!(record["context"], spec::final_context(&auto_approval()));
    let sha = record["state_sha256"].as_str().expect("state_sha256");
    assert!(
        sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()),
        "{sha}"
    );
    // The transcript went to stderr.
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("── review (agent reviewer) received:"),
        "{stderr}"
    );
}

#[test]
fn dev_rejection_from_stdin_runs_the_plan_twice() {
    let out = output(
        &mut dev(&example("agents.toml"), &[]),
        Some("n: split the toggle\ny\n"),
    );
    assert_success(&out);
    let transcript = text(&out.stdout);
    let plans: Vec<Value> = blocks(&transcript, "received")
        .into_iter()
        .filter(|(step, _)| step == "plan")
        .map(|(_, payload)| spec::spec_view(payload))
        .collect();
    assert_eq!(plans.len(), 2, "the planner ran twice:\n{transcript}");
    assert_eq!(plans[0], json!({"input": spec::INPUT, "context": {}}));
    assert_eq!(
        plans[1],
        json!({
            "input": spec::INPUT,
            "context": {
                "plan": spec::plan(),
                "approve-plan": {"approved": false, "comment": "split the toggle", "approver": "e2e-user"}
            }
        })
    );
    assert!(transcript.contains("↩ approve-plan"), "{transcript}");
    assert!(transcript.contains("✓ plan (visit 2)"), "{transcript}");
    assert!(transcript.contains("✓ review"), "{transcript}");
}

#[test]
fn dev_json_with_a_prompt_keeps_stdout_one_json_object() {
    let out = output(
        &mut dev(&example("agents.toml"), &["--json"]),
        Some("y: ship it\n"),
    );
    assert_success(&out);
    let stdout = text(&out.stdout);
    let record: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not exactly one JSON value ({e}):\n{stdout}"));
    assert_eq!(
        record["context"]["approve-plan"],
        json!({"approved": true, "comment": "ship it", "approver": "e2e-user"})
    );
}

/// The same workflow, input, agent answers and decision give the same context in `baton dev`
/// (in-memory store, one worker) and on a cluster (Redis, two workers), and each run's state
/// chain holds. (The chains themselves differ: each starts from its run's id.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_and_cluster_agree_on_the_context_and_both_chains_hold() {
    let mut cluster = Cluster::start().await;
    let records = Records::new(cluster.dir().join("records"));
    cluster
        .start_spec_workers(&records, &["worker-1", "worker-2"])
        .await;
    let mut client = cluster.client().await;
    let workflow = std::fs::read(example("workflow.json")).unwrap();
    let run_id = harness::submit(&mut client, workflow, &json!(spec::INPUT)).await;
    let mut watch = Watch::start(&mut client, &run_id).await;
    watch.approval("approve-plan").await;
    // The decision `baton dev --auto-approve` takes: no comment, no approver.
    client
        .decide_approval(DecideApprovalRequest {
            run_id: run_id.clone(),
            step_id: "approve-plan".to_owned(),
            approved: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let on_cluster = watch.finished().await;
    assert_eq!(on_cluster.status, "succeeded");

    // `baton dev` with the same `sh` agents, and with the example's template agents: all three
    // agree on every answer, so on the context and the checksum.
    let dev_agents = records.spec_agents_file("dev");
    for agents in [dev_agents, example("agents.toml")] {
        let out = output(&mut dev(&agents, &["--auto-approve", "--json"]), None);
        assert_success(&out);
        let record: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        assert_eq!(record["status"], json!("succeeded"));
        assert_eq!(
            record["context"],
            harness::context(&on_cluster),
            "{}",
            agents.display()
        );
        assert_ne!(record["state_sha256"], json!(on_cluster.state_sha256));
        // `baton dev` verifies its run's chain before it exits and says so.
        assert!(
            text(&out.stderr).contains("state chain verified"),
            "{}",
            text(&out.stderr)
        );
    }
    let verified = client
        .verify_run(VerifyRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(verified.ok, "{verified:?}");
    assert_eq!(verified.state_sha256, on_cluster.state_sha256);
    assert_eq!(verified.links, 8, "one link per settled step visit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_exports_the_run_as_one_trace_when_an_otlp_endpoint_is_set() {
    let (receiver, endpoint) = otlp::Receiver::start().await;
    let mut command = dev(&example("agents.toml"), &["--auto-approve"]);
    command
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100");
    let out = tokio::task::spawn_blocking(move || output(&mut command, None))
        .await
        .unwrap();
    assert_success(&out);

    // Flushed before `baton dev` exited: every span is already here.
    let spans = receiver.spans();
    let submitted: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "baton.v1.RunService/SubmitRun")
        .collect();
    assert_eq!(submitted.len(), 1, "{spans:#?}");
    let trace = otlp::of_trace(&spans, &submitted[0].trace_id);
    assert_eq!(trace.len(), spans.len(), "one trace: {spans:#?}");
    otlp::assert_connected(&trace, "");
    assert!(trace.iter().all(|s| s.service == "baton-dev"));
    for step in [
        "plan",
        "approve-plan",
        "code",
        "parallel-tests",
        "check-tests",
        "review",
    ] {
        let step_span = otlp::one(&trace, &format!("step {step}"));
        assert_eq!(step_span.attribute("baton.step.id"), step);
    }
    let review = otlp::one(&trace, "step review");
    let executions = otlp::named(&trace, "execute reviewer");
    assert_eq!(executions.len(), 1);
    assert_eq!(executions[0].parent_span_id, review.span_id);
}

#[test]
fn the_readme_map_example_runs_as_printed_with_progress_not_a_line_per_item() {
    let args = [
        "dev",
        "examples/test-each/workflow.json",
        "--agents",
        "examples/test-each/agents.toml",
    ];
    harness::assert_doc_runs(
        "docs/src/maps.md",
        "# Fanning out over data: map steps",
        &args,
    );
    let out = output(baton().current_dir(harness::root()).args(args), None);
    assert_success(&out);
    let transcript = text(&out.stdout);
    let lines: Vec<&str> = transcript
        .lines()
        .filter(|line| !line.starts_with("    "))
        .collect();
    // The map's items are counts on one line, not a line per item.
    assert!(
        lines
            .iter()
            .any(|l| l.contains("⋯ test-each") && l.contains("/4 items done")),
        "{transcript}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("✓ test-each") && l.contains("(4 items, 0 failed)")),
        "{transcript}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("▶ test-each")),
        "no line per item: {transcript}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("run ") && l.ends_with(" succeeded")),
        "{transcript}"
    );
    // The first item's exchange stands for the others: its payload carries the item.
    let received = blocks(&transcript, "received");
    let (_, first) = received
        .iter()
        .find(|(step, _)| step == "test-each")
        .unwrap_or_else(|| panic!("item 0's exchange is shown: {transcript}"));
    assert_eq!(
        first["map"],
        json!({"step": "test-each", "item": "src/theme.ts", "index": 0, "count": 4}),
        "{transcript}"
    );
    assert_eq!(first["context"]["plan"]["files"][3], "src/index.ts");
    let reviewed = blocks(&transcript, "returned")
        .into_iter()
        .find(|(step, _)| step == "review")
        .map(|(_, value)| value)
        .unwrap_or_else(|| panic!("the reviewer answered: {transcript}"));
    assert_eq!(reviewed["approved"], true, "{transcript}");
    // Only the file whose tests failed went through the chain's agent.
    assert_eq!(
        reviewed["explained"],
        json!({"file": "src/app.tsx", "why": "a flaky snapshot"}),
        "{transcript}"
    );
}

/// README.md's "Install" with Rust, its `baton dev` line run as printed from the repository root
/// with this run's `baton` first on PATH, where `cargo install --locked --path cli` puts the
/// same package's binary (the install itself is a release build of a quarter of an hour here,
/// and the suite builds that package with `--locked` already).
#[test]
fn the_readme_s_install_recipe_runs_the_example_as_printed() {
    let lines = recipes::block("README.md", "## Install");
    assert_eq!(lines[0], "cargo install --locked --path cli", "{lines:#?}");
    let path = harness::path_with_baton();
    let mut command = Command::new("bash");
    command
        .args(["-c", &lines[1]])
        .current_dir(harness::root())
        .env("PATH", path)
        .env("NO_COLOR", "1");
    let out = output(&mut command, None);
    assert_success(&out);
    let printed = text(&out.stdout);
    for line in [
        "(agent planner) received:",
        "✓ approve-plan",
        "✓ parallel-tests",
    ] {
        assert!(printed.contains(line), "no {line:?} in:\n{printed}");
    }
}
