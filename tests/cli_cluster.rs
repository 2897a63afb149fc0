//! `baton submit`, `baton runs ...` and `baton approve`, run as a user runs them, against a real
//! cluster (private `redis-server`, `baton coordinator`, `baton worker` processes).

#[path = "support/cluster.rs"]
mod harness;
#[path = "support/spec.rs"]
mod spec;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use baton_proto::v1::run_service_client::RunServiceClient;
use baton_proto::v1::{GetRunRequest, ListRunsRequest, RunRecord};
use harness::{Cluster, DEADLINE, Records, baton, output, step};
use serde_json::{Value, json};
use tonic::transport::Channel;

/// The line `baton runs list` prints before its runs.
const RUNS_HEADER: &str = "RUN                                   STATUS     WORKFLOW";

fn feature_workflow() -> PathBuf {
    harness::root().join("examples/feature-development/workflow.json")
}

/// `baton ARGS... --coordinator URL`, as the user `e2e-user`.
fn cli(cluster: &Cluster, args: &[&str]) -> Command {
    let mut command = baton();
    command
        .args(args)
        .arg("--coordinator")
        .arg(cluster.url())
        .env("USER", "e2e-user");
    command
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `baton ARGS` against the cluster and asserts it succeeded; returns stdout.
fn ok(cluster: &Cluster, args: &[&str]) -> String {
    let out = output(&mut cli(cluster, args), None);
    assert!(
        out.status.success(),
        "baton {args:?} exited with {}\n── stdout:\n{}\n── stderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn parse_json(out: &Output) -> Value {
    let stdout = text(&out.stdout);
    serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON value ({e}):\n{stdout}\n── stderr:\n{}",
            text(&out.stderr)
        )
    })
}

async fn get(client: &mut RunServiceClient<Channel>, run_id: &str) -> RunRecord {
    client
        .get_run(GetRunRequest {
            run_id: run_id.to_owned(),
        })
        .await
        .expect("GetRun")
        .into_inner()
}

/// Polls GetRun until `ready` holds.
async fn until(
    client: &mut RunServiceClient<Channel>,
    run_id: &str,
    what: &str,
    ready: impl Fn(&RunRecord) -> bool,
) -> RunRecord {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let record = get(client, run_id).await;
        if ready(&record) {
            return record;
        }
        assert!(
            Instant::now() < deadline,
            "run {run_id}: {what} did not happen within {DEADLINE:?}: {record:#?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

fn waits_for_approval(record: &RunRecord) -> bool {
    record
        .waiting
        .iter()
        .any(|w| w.kind == "approval" && w.step_id == "approve-plan")
}

async fn spec_cluster(worker_ids: &[&str]) -> (Cluster, Records) {
    let mut cluster = Cluster::start().await;
    let records = Records::new(cluster.dir().join("records"));
    cluster.start_spec_workers(&records, worker_ids).await;
    (cluster, records)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_no_worker_serves_stays_queued() {
    let (cluster, _records) = spec_cluster(&["worker-1"]).await;
    let workflow = cluster.dir().join("translate.json");
    std::fs::write(
        &workflow,
        r#"{"id": "translate", "steps": [
            {"id": "translate", "type": "agent", "agent": "translator"}
        ]}"#,
    )
    .unwrap();
    let workflow = workflow.to_str().unwrap();
    let run_id = ok(&cluster, &["submit", workflow, "--input", "hello"])
        .trim()
        .to_owned();

    let record = parse_json(&output(
        &mut cli(&cluster, &["runs", "get", &run_id, "--json"]),
        None,
    ));
    assert_eq!(record["run_id"], json!(run_id));
    assert_eq!(record["status"], json!("running"));
    let waiting = record["waiting"].as_array().expect("waiting");
    assert_eq!(waiting.len(), 1, "{record:#}");
    assert_eq!(waiting[0]["kind"], json!("agent"));
    assert_eq!(waiting[0]["step_id"], json!("translate"));
    assert_eq!(waiting[0]["agent"], json!("translator"));
    assert_eq!(waiting[0]["served"], json!(false));
    let note = waiting[0]["note"].as_str().unwrap();
    assert!(
        note.contains("translator") && note.contains("no connected worker serves it"),
        "{note}"
    );
    assert_eq!(record["steps"][0]["status"], json!("queued"));

    let summary = ok(&cluster, &["runs", "get", &run_id]);
    assert!(
        summary.contains(&format!("run {run_id} running"))
            && summary.contains(
                "step \"translate\" needs agent \"translator\", which no connected worker serves"
            ),
        "{summary}"
    );

    let cancelled = ok(&cluster, &["runs", "cancel", &run_id]);
    assert!(
        cancelled.contains(&format!("run {run_id} cancelled")),
        "{cancelled}"
    );
    let record = parse_json(&output(
        &mut cli(&cluster, &["runs", "get", &run_id, "--json"]),
        None,
    ));
    assert_eq!(record["status"], json!("cancelled"), "{record:#}");
    assert_eq!(record["waiting"], json!([]));
    assert!(ok(&cluster, &["runs", "get", &run_id]).contains(&format!("run {run_id} cancelled")));

    // Cancelling again is refused with a clear error.
    let again = output(&mut cli(&cluster, &["runs", "cancel", &run_id]), None);
    assert!(!again.status.success());
    let stderr = text(&again.stderr);
    assert!(
        stderr.contains(&run_id) && stderr.contains("FailedPrecondition"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_prints_a_run_id_then_approve_watch_list_and_get() {
    let (cluster, records) = spec_cluster(&["worker-1", "worker-2"]).await;
    let workflow = feature_workflow();
    let workflow = workflow.to_str().unwrap();
    let submit = [
        "submit",
        workflow,
        "--input",
        spec::INPUT,
        "--idempotency-key",
        "e2e-1",
    ];
    let stdout = ok(&cluster, &submit);
    let run_id = stdout.trim().to_owned();
    assert_eq!(stdout, format!("{run_id}\n"), "one line, the run id");
    assert_eq!(run_id.len(), 36, "a UUID: {run_id}");
    // A retry with the same key gets the same run; the key with another input is refused.
    assert_eq!(ok(&cluster, &submit), stdout);
    let reused = output(
        &mut cli(
            &cluster,
            &[
                "submit",
                workflow,
                "--input",
                "other",
                "--idempotency-key",
                "e2e-1",
            ],
        ),
        None,
    );
    assert!(!reused.status.success());
    let stderr = text(&reused.stderr);
    assert!(
        stderr.contains(&run_id) && stderr.contains("AlreadyExists"),
        "{stderr}"
    );

    let mut client = cluster.client().await;
    until(&mut client, &run_id, "the approval", waits_for_approval).await;
    let approved = ok(&cluster, &["approve", &run_id, "approve-plan"]);
    assert!(
        approved.contains(&format!("run {run_id} running")),
        "{approved}"
    );

    let watched = ok(&cluster, &["runs", "watch", &run_id]);
    for line in [
        "✓ plan",
        "✓ approve-plan",
        "✓ code",
        "(branch of parallel-tests)",
        "✓ check-tests",
        "-> review",
        "✓ review",
    ] {
        assert!(watched.contains(line), "{line:?} missing from:\n{watched}");
    }
    assert!(
        watched
            .trim_end()
            .ends_with(&format!("run {run_id} succeeded")),
        "{watched}"
    );

    let listed = ok(&cluster, &["runs", "list"]);
    assert_eq!(
        listed.lines().next(),
        Some(RUNS_HEADER),
        "the columns are named first: {listed}"
    );
    assert_eq!(
        listed.lines().count(),
        2,
        "the retry started nothing: {listed}"
    );
    let line = listed
        .lines()
        .find(|line| line.starts_with(&run_id))
        .unwrap_or_else(|| panic!("{run_id} not listed:\n{listed}"));
    assert!(
        line.contains("succeeded") && line.contains("feature-development"),
        "{line}"
    );

    let summary = ok(&cluster, &["runs", "get", &run_id]);
    let record = get(&mut client, &run_id).await;
    assert!(
        summary.contains(&format!("state sha256 {}", record.state_sha256)),
        "{summary}"
    );
    // No exporter and no traceparent: no trace, and it says why.
    assert!(
        summary.contains("\n  trace: none recorded (the coordinator that accepted the run exported no traces, and its submitter sent no traceparent;"),
        "{summary}"
    );
    let plan_line = summary
        .lines()
        .find(|line| line.trim_start().starts_with("plan "))
        .unwrap_or_else(|| panic!("no plan line:\n{summary}"));
    assert!(
        plan_line.contains("succeeded")
            && plan_line.contains("visits 1")
            && plan_line.contains(&format!("on {}", step(&record, "plan").worker_id)),
        "{plan_line}"
    );
    // The approval carries who approved: the user running `baton approve`.
    assert_eq!(
        harness::context(&record)["approve-plan"],
        json!({"approved": true, "approver": "e2e-user"})
    );
    assert_eq!(records.of_run(&run_id).len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_json_waits_and_prints_the_final_record() {
    let (cluster, records) = spec_cluster(&["worker-1", "worker-2"]).await;
    let mut client = cluster.client().await;
    let workflow = feature_workflow();
    let mut submit = cli(
        &cluster,
        &[
            "submit",
            workflow.to_str().unwrap(),
            "--input",
            spec::INPUT,
            "--json",
        ],
    );
    let submitted = std::thread::spawn(move || output(&mut submit, None));

    // Find the run (the only one) and approve it with the CLI while `submit --json` waits.
    let deadline = Instant::now() + DEADLINE;
    let run_id = loop {
        let runs = client
            .list_runs(ListRunsRequest {
                limit: 0,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .runs;
        if let Some(run) = runs.first() {
            break run.run_id.clone();
        }
        assert!(Instant::now() < deadline, "the run never showed up");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    until(&mut client, &run_id, "the approval", waits_for_approval).await;
    ok(
        &cluster,
        &["approve", &run_id, "approve-plan", "--comment", "ship it"],
    );

    let out = submitted.join().expect("the submit thread");
    assert!(
        out.status.success(),
        "submit --json exited with {}: {}",
        out.status,
        text(&out.stderr)
    );
    let record = parse_json(&out);
    let final_record = get(&mut client, &run_id).await;
    assert_eq!(record["run_id"], json!(run_id));
    assert_eq!(record["workflow_id"], json!("feature-development"));
    assert_eq!(record["status"], json!("succeeded"));
    assert_eq!(record["error"], Value::Null);
    assert_eq!(
        record["context"],
        spec::final_context(
            &json!({"approved": true, "comment": "ship it", "approver": "e2e-user"})
        )
    );
    assert_eq!(record["state_sha256"], json!(final_record.state_sha256));
    assert_eq!(record["state_sha256"].as_str().unwrap().len(), 64);
    assert_eq!(record["waiting"], json!([]));
    let steps = record["steps"].as_array().expect("steps");
    let ids: Vec<_> = steps.iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [
            "plan",
            "approve-plan",
            "code",
            "parallel-tests",
            "unit",
            "integration",
            "check-tests",
            "review"
        ]
    );
    let received = records.by_step(&run_id);
    for step in steps {
        let id = step["id"].as_str().unwrap();
        assert_eq!(step["status"], json!("succeeded"), "{step}");
        assert_eq!(step["visits"], json!(1), "{step}");
        match received.get(&(id.to_owned(), 1)) {
            // An agent step names the worker that ran it: the one whose folder has its payload.
            Some(got) => assert_eq!(step["worker_id"], json!(got.worker), "{step}"),
            None => assert_eq!(step["worker_id"], Value::Null, "{step}"),
        }
    }
    assert_eq!(steps[4]["parent"], json!("parallel-tests"));
    assert_eq!(steps[4]["agent"], json!("test-unit"));
}

/// A child whose stdout lines arrive on a channel as it prints them.
struct Lines {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    fn spawn(mut command: Command) -> Lines {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            // Client commands log nothing; an error message shows in the test's output.
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start baton");
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        Lines {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The next line that contains `needle` (earlier lines are kept in `seen`).
    fn wait_for(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no line with {needle:?} within {DEADLINE:?}; so far:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Reads the rest of stdout and waits for the exit.
    fn finish(mut self) -> (std::process::ExitStatus, Vec<String>) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    panic!(
                        "baton did not finish within {DEADLINE:?}:\n{}",
                        self.seen.join("\n")
                    );
                }
            }
        }
        let status = self.child.wait().expect("wait for baton");
        (status, std::mem::take(&mut self.seen))
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_watch_prints_live_progress_through_a_rejection() {
    let (cluster, records) = spec_cluster(&["worker-1", "worker-2"]).await;
    let workflow = feature_workflow();
    let mut watch = Lines::spawn(cli(
        &cluster,
        &[
            "submit",
            workflow.to_str().unwrap(),
            "--input",
            spec::INPUT,
            "--watch",
        ],
    ));
    let first = watch.wait_for("run ");
    let run_id = first
        .strip_prefix("run ")
        .unwrap_or_else(|| panic!("the first line names the run: {first}"))
        .trim()
        .to_owned();

    let waiting = watch.wait_for("⏸ approve-plan");
    assert!(
        waiting.contains("Approve implementation plan?")
            && waiting.contains(&format!("baton approve {run_id} approve-plan")),
        "{waiting}"
    );
    ok(
        &cluster,
        &[
            "approve",
            &run_id,
            "approve-plan",
            "--reject",
            "--comment",
            "split the toggle",
        ],
    );
    let rejected = watch.wait_for("↩ approve-plan");
    assert!(
        rejected.contains("rejected") && rejected.contains("-> plan"),
        "{rejected}"
    );
    watch.wait_for("⏸ approve-plan (visit 2)");
    ok(&cluster, &["approve", &run_id, "approve-plan"]);
    let (status, lines) = watch.finish();
    let all = lines.join("\n");
    assert!(
        status.success(),
        "submit --watch exited with {status}:\n{all}"
    );
    for needle in [
        "▶ plan",
        "started   agent planner on worker-",
        "✓ plan",
        "▶ plan (visit 2)",
        "✓ plan (visit 2)",
        "✓ approve-plan (visit 2)",
        "▶ unit",
        "▶ integration",
        "✓ parallel-tests",
        "✓ review",
    ] {
        assert!(all.contains(needle), "{needle:?} missing from:\n{all}");
    }
    assert_eq!(
        lines.last().map(String::as_str),
        Some(format!("run {run_id} succeeded").as_str()),
        "{all}"
    );
    let second_plan = &records.by_step(&run_id)[&("plan".to_owned(), 2)];
    assert_eq!(
        second_plan.payload["context"]["approve-plan"],
        json!({"approved": false, "comment": "split the toggle", "approver": "e2e-user"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_one_json_object_per_line_when_asked() {
    let mut cluster = Cluster::start_with_env(&[("BATON_LOG_FORMAT", "json")]).await;
    let records = Records::new(cluster.dir().join("records"));
    cluster.start_spec_workers(&records, &["w1"]).await;
    let log = cluster.coordinator_log();
    let lines: Vec<Value> = log
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"))
        })
        .collect();
    let connected = lines
        .iter()
        .find(|line| line["fields"]["message"] == "worker connected")
        .unwrap_or_else(|| panic!("no connection logged: {log}"));
    assert_eq!(connected["level"], "INFO");
    assert_eq!(connected["fields"]["worker_id"], "w1");
    assert!(connected["timestamp"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_list_filters_by_status_and_workflow_and_pages_on() {
    let cluster = Cluster::start().await;
    let workflow = cluster.dir().join("translate.json");
    std::fs::write(
        &workflow,
        r#"{"id": "translate", "steps": [
            {"id": "translate", "type": "agent", "agent": "translator"}
        ]}"#,
    )
    .unwrap();
    let workflow = workflow.to_str().unwrap();
    // No worker serves `translator`: every run stays running until cancelled.
    let runs: Vec<String> = (0..3)
        .map(|_| {
            ok(&cluster, &["submit", workflow, "--input", "hello"])
                .trim()
                .to_owned()
        })
        .collect();
    ok(&cluster, &["runs", "cancel", &runs[0]]);
    // The runs listed, under the header.
    let ids = |listed: &str| -> Vec<String> {
        let mut lines = listed.lines();
        assert_eq!(lines.next(), Some(RUNS_HEADER), "{listed}");
        lines
            .map(|line| line.split_whitespace().next().unwrap().to_owned())
            .collect()
    };

    let running = ids(&ok(&cluster, &["runs", "list", "--status", "running"]));
    assert_eq!(
        running,
        vec![runs[2].clone(), runs[1].clone()],
        "newest first"
    );
    let cancelled = ids(&ok(&cluster, &["runs", "list", "--status", "cancelled"]));
    assert_eq!(cancelled, vec![runs[0].clone()]);
    assert!(ids(&ok(&cluster, &["runs", "list", "--workflow", "another"])).is_empty());
    // --json: the page as one object, no header.
    let page: Value = serde_json::from_str(&ok(
        &cluster,
        &["runs", "list", "--status", "cancelled", "--json"],
    ))
    .unwrap();
    assert_eq!(page["runs"].as_array().map(Vec::len), Some(1), "{page}");
    assert_eq!(page["runs"][0]["run_id"], json!(runs[0]));
    assert_eq!(page["runs"][0]["status"], json!("cancelled"));
    assert_eq!(page["runs"][0]["workflow_id"], json!("translate"));
    assert_eq!(page["next_page_token"], Value::Null);

    // One a page: each page names the token of the next, and the pages cover every run once.
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut args = vec!["runs", "list", "--workflow", "translate", "--limit", "1"];
        if let Some(token) = &token {
            args.extend(["--page-token", token.as_str()]);
        }
        let out = output(&mut cli(&cluster, &args), None);
        assert!(out.status.success(), "{}", text(&out.stderr));
        seen.extend(ids(&text(&out.stdout)));
        token = text(&out.stderr)
            .lines()
            .find_map(|line| line.strip_prefix("next page: --page-token "))
            .map(|next| next.trim().to_owned());
        if token.is_none() {
            break;
        }
        assert!(seen.len() <= 3, "pages never end: {seen:?}");
    }
    assert_eq!(
        seen,
        vec![runs[2].clone(), runs[1].clone(), runs[0].clone()]
    );

    let refused = output(
        &mut cli(&cluster, &["runs", "list", "--status", "sleeping"]),
        None,
    );
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("sleeping"),
        "{}",
        text(&refused.stderr)
    );
}

/// Attack: Redis is busy (paused here, as a long script or a flood of large submits would hold
/// it) for longer than the coordinator settles a create whose answer did not come. `baton submit`
/// used to print `store unavailable: timed out` while Redis created and ran the run a moment
/// later, unlisted. Now it says the run may exist and names it, and `baton runs get` with that id
/// finds it, as `runs list` does, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_on_a_redis_too_busy_to_answer_names_the_run_that_may_exist() {
    let cluster = Cluster::start().await;
    let workflow = feature_workflow();
    let workflow = workflow.to_str().unwrap();
    // A first run, so that Redis has loaded the create's script before it is paused: a create it
    // holds then waits in its script, and runs once Redis gets to it.
    let first = ok(&cluster, &["submit", workflow]);

    let mut redis = cluster.redis_connection().await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(7_000)
        .arg("ALL")
        .query_async(&mut redis)
        .await
        .unwrap();
    let out = output(&mut cli(&cluster, &["submit", workflow]), None);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let run_id = stderr
        .split(|c: char| !(c.is_ascii_hexdigit() || c == '-'))
        .find(|word| word.len() == 36 && word.matches('-').count() == 4)
        .unwrap_or_else(|| panic!("no run id in: {stderr}"))
        .to_owned();
    assert!(
        stderr.contains("may exist")
            && stderr.contains(&format!("baton runs get {run_id}"))
            && stderr.contains("Unavailable"),
        "{stderr}"
    );

    // As the message says: once Redis answers, `baton runs get` finds the run.
    let deadline = Instant::now() + DEADLINE;
    while !output(&mut cli(&cluster, &["runs", "get", &run_id]), None)
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "run {run_id} never appeared");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let listed = ok(&cluster, &["runs", "list"]);
    assert_eq!(listed.matches(run_id.as_str()).count(), 1, "{listed}");
    assert_eq!(listed.matches(first.trim()).count(), 1, "{listed}");
}

/// `runs list --status` takes every run status, as its help says, and refuses anything else
/// naming them all.
#[test]
fn runs_list_takes_every_run_status() {
    let statuses: Vec<&str> = baton_core::RunStatus::ALL
        .iter()
        .map(|status| status.as_str())
        .collect();
    let help = output(baton().args(["runs", "list", "--help"]), None);
    let help = text(&help.stdout);
    assert!(
        help.contains(&format!("[possible values: {}]", statuses.join(", "))),
        "{help}"
    );
    let refused = output(baton().args(["runs", "list", "--status", "pending"]), None);
    let said = text(&refused.stderr);
    assert!(!refused.status.success());
    for status in statuses {
        assert!(said.contains(status), "{status} missing from: {said}");
    }
}

/// `runs get` prints the run's trace id when it has one (here the client's, from
/// `TRACEPARENT`: this coordinator exports no traces), and says why when it has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_get_prints_the_trace_id_or_why_there_is_none() {
    let cluster = Cluster::start().await;
    let workflow = cluster.dir().join("translate.json");
    std::fs::write(
        &workflow,
        r#"{"id": "translate", "steps": [
            {"id": "translate", "type": "agent", "agent": "translator"}
        ]}"#,
    )
    .unwrap();
    let submit = |traceparent: Option<&str>| {
        let mut command = cli(&cluster, &["submit", workflow.to_str().unwrap()]);
        if let Some(traceparent) = traceparent {
            command.env("TRACEPARENT", traceparent);
        }
        let out = output(&mut command, None);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).trim().to_owned()
    };
    let traced = submit(Some(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ));
    let summary = ok(&cluster, &["runs", "get", &traced]);
    assert!(
        summary.contains("\n  trace: 4bf92f3577b34da6a3ce929d0e0e4736\n"),
        "{summary}"
    );
    let untraced = submit(None);
    let summary = ok(&cluster, &["runs", "get", &untraced]);
    assert!(
        summary.contains(
            "\n  trace: none recorded (the coordinator that accepted the run exported no traces, and its submitter sent no traceparent; runs submitted with OTEL_EXPORTER_OTLP_ENDPOINT set get one)\n"
        ),
        "{summary}"
    );
}

/// `baton coordinator` told to listen on a port this test holds: it logs how its port is
/// secured, then stops. What it wrote to stderr: into a pipe, or on a terminal (a
/// pseudo-terminal util-linux's `script` gives it), with `NO_COLOR` set to `no_color` or unset.
fn coordinator_log(on_a_terminal: bool, no_color: Option<&str>) -> String {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = format!("127.0.0.1:{}", taken.local_addr().unwrap().port());
    let args = [
        "coordinator",
        "--memory",
        "--listen",
        &listen,
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    // The environment every test's `baton` gets, but for NO_COLOR.
    let template = baton();
    let mut command = if on_a_terminal {
        let mut script = Command::new("script");
        script
            .arg("-qec")
            .arg(format!(
                "{} {}",
                env!("CARGO_BIN_EXE_baton"),
                args.join(" ")
            ))
            .arg("/dev/null");
        script
    } else {
        let mut direct = Command::new(env!("CARGO_BIN_EXE_baton"));
        direct.args(args);
        direct
    };
    for (name, value) in template.get_envs() {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    match no_color {
        Some(value) => command.env("NO_COLOR", value),
        None => command.env_remove("NO_COLOR"),
    };
    let out = output(&mut command, None);
    drop(taken);
    // `script` copies the terminal's output to its stdout; stderr is the pipe otherwise.
    let log = text(if on_a_terminal {
        &out.stdout
    } else {
        &out.stderr
    });
    assert!(log.contains("INFO"), "nothing was logged: {log:?}");
    log
}

/// Logs are coloured only for a person at a terminal: not into a file or a pipe, and not with
/// `NO_COLOR` set to anything but empty (no-color.org).
#[test]
fn logs_have_no_colour_codes_off_a_terminal_or_with_no_color() {
    const ESCAPE: &str = "\x1b[";
    let piped = coordinator_log(false, None);
    assert!(!piped.contains(ESCAPE), "{piped:?}");
    let terminal = coordinator_log(true, None);
    assert!(
        terminal.contains(ESCAPE),
        "a terminal gets colours: {terminal:?}"
    );
    let empty = coordinator_log(true, Some(""));
    assert!(
        empty.contains(ESCAPE),
        "an empty NO_COLOR is unset: {empty:?}"
    );
    let no_color = coordinator_log(true, Some("1"));
    assert!(!no_color.contains(ESCAPE), "{no_color:?}");
}
