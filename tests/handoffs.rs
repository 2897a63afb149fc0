//! Handoffs end to end: real `baton coordinator` and `baton worker` processes on a private
//! Redis, `command` agents that answer envelopes (`output = "envelope"`) with messages and
//! decisions, and the `baton` CLI to search decisions and verify runs.

#[path = "support/cluster.rs"]
mod harness;
#[path = "support/spec.rs"]
mod spec;

use baton_proto::v1::run_service_client::RunServiceClient;
use baton_proto::v1::{DecideApprovalRequest, GetStatsRequest};
use harness::{Cluster, Records, Watch, baton, context};
use redis::AsyncCommands;
use serde_json::{Value, json};
use tonic::transport::Channel;

fn feature_workflow() -> Vec<u8> {
    std::fs::read(harness::root().join("examples/feature-development/workflow.json"))
        .expect("read the feature-development example")
}

/// Submits the feature-development workflow, approves the plan, and waits for the end.
async fn run_feature_development(client: &mut RunServiceClient<Channel>) -> (String, Value) {
    let run_id = harness::submit(client, feature_workflow(), &json!(spec::INPUT)).await;
    let mut watch = Watch::start(client, &run_id).await;
    watch.approval("approve-plan").await;
    client
        .decide_approval(DecideApprovalRequest {
            run_id: run_id.clone(),
            step_id: "approve-plan".to_owned(),
            approved: true,
            ..Default::default()
        })
        .await
        .expect("DecideApproval");
    let record = watch.finished().await;
    assert_eq!(record.status, "succeeded", "{record:#?}");
    (run_id, context(&record))
}

/// Runs `baton ARGS --coordinator URL` and returns its exit code and stdout.
fn cli(cluster: &Cluster, args: &[&str]) -> (i32, String) {
    let out = baton()
        .args(args)
        .arg("--coordinator")
        .arg(cluster.url())
        .output()
        .expect("run baton");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn summaries(matches: &Value) -> Vec<&str> {
    matches
        .as_array()
        .expect("an array of matches")
        .iter()
        .map(|m| m["summary"].as_str().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_hand_on_messages_and_decisions_across_workers() {
    let mut cluster = Cluster::start().await;
    let records = Records::new(cluster.dir().join("records"));
    for id in ["worker-1", "worker-2"] {
        let agents = records.memory_agents_file(id);
        cluster.start_worker(id, &agents, 4);
    }
    cluster.wait_for_workers(&["worker-1", "worker-2"]).await;
    let mut client = cluster.client().await;
    let (run_id, final_context) = run_feature_development(&mut client).await;

    // Zero loss: the envelopes' data, and only it, is the context: every step's result.
    assert_eq!(
        final_context,
        spec::final_context(&json!({"approved": true}))
    );

    let received = records.by_step(&run_id);
    let full = |step: &str| received[&(step.to_owned(), 1)].full.clone();
    // The spec's fields are as before; Baton's own keys come after them.
    for (step, expected) in spec::payloads(&json!({"approved": true})) {
        assert_eq!(received[&(step.to_owned(), 1)].payload, expected, "{step}");
    }

    // The history every agent saw before it ran: in order, the testers in branch order.
    let ids = |payload: &Value| -> Vec<String> {
        payload["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                format!(
                    "{}:{}",
                    m["id"].as_str().unwrap(),
                    m["name"].as_str().unwrap()
                )
            })
            .collect()
    };
    assert!(ids(&full("plan")).is_empty());
    assert_eq!(ids(&full("code")), ["plan#1/0:planner"]);
    assert_eq!(
        ids(&full("review")),
        [
            "plan#1/0:planner",
            "code#1/0:coder",
            "unit#1/0:test-unit",
            "integration#1/0:test-integration"
        ]
    );

    // A sequential handoff across the approval, and a parallel merge into the reviewer.
    let coder = full("code");
    assert_eq!(coder["handoff"]["source_agent"], json!("planner"));
    assert_eq!(coder["handoff"]["target_agent"], json!("coder"));
    assert_eq!(
        coder["handoff"]["decisions"][0]["summary"],
        json!("Use CSS variables for the theme colours")
    );
    assert_eq!(
        coder["handoff"]["memory_refs"],
        json!(["decision:plan#1/0", "message:plan#1/0"])
    );
    let reviewer = full("review");
    assert_eq!(reviewer["handoff"]["source_agent"], Value::Null);
    assert_eq!(
        reviewer["handoff"]["source_agents"],
        json!(["test-unit", "test-integration"])
    );
    assert_eq!(
        summaries(&reviewer["handoff"]["decisions"]),
        [
            "Mock matchMedia in unit tests",
            "Run integration tests against a built bundle"
        ]
    );

    // The reviewer asked the coordinator mid-step, with `baton decisions`, from its own
    // environment (BATON_COORDINATOR, BATON_RUN_ID).
    let asked = std::fs::read_dir(records.root())
        .unwrap()
        .filter_map(|worker| {
            std::fs::read_to_string(
                worker
                    .unwrap()
                    .path()
                    .join(format!("{run_id}.review-decisions.out")),
            )
            .ok()
        })
        .next()
        .expect("the reviewer saved its query's answer");
    let asked: Value = serde_json::from_str(&asked).expect("baton decisions --json is JSON");
    assert_eq!(
        summaries(&asked)[0],
        "Use CSS variables for the theme colours"
    );

    // The run record keeps the history, the decisions and every handoff.
    let (code, out) = cli(&cluster, &["runs", "get", &run_id, "--json"]);
    assert_eq!(code, 0, "{out}");
    let record: Value = serde_json::from_str(&out).expect("runs get --json");
    assert_eq!(record["messages"].as_array().unwrap().len(), 5);
    assert_eq!(record["decisions"].as_array().unwrap().len(), 5);
    let handoffs: Vec<(&str, Value)> = record["handoffs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["step_id"].as_str().unwrap(), h["source_agents"].clone()))
        .collect();
    assert_eq!(
        handoffs,
        [
            ("code", json!(["planner"])),
            ("unit", json!(["coder"])),
            ("integration", json!(["coder"])),
            ("review", json!(["test-unit", "test-integration"])),
        ]
    );

    // Decisions by shared words, filtered by agent, as JSON with scores.
    let (code, out) = cli(
        &cluster,
        &[
            "decisions",
            &run_id,
            "React context for the theme",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{out}");
    let matches: Value = serde_json::from_str(&out).expect("decisions --json");
    assert_eq!(matches.as_array().unwrap().len(), 5);
    assert_eq!(
        summaries(&matches)[0],
        "Keep the current theme in a React context"
    );
    let scores: Vec<f64> = matches
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["score"].as_f64().unwrap())
        .collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    assert!(scores[0] > scores[1], "{scores:?}");
    let (code, out) = cli(
        &cluster,
        &[
            "decisions",
            &run_id,
            "tests",
            "--agent",
            "test-unit",
            "-k",
            "3",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{out}");
    let matches: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(summaries(&matches), ["Mock matchMedia in unit tests"]);
    assert_eq!(matches[0]["agent"], json!("test-unit"));
    assert_eq!(matches[0]["rationale"], json!("jsdom has no media queries"));

    // A second run of the same workflow: the workflow scope finds both runs' decisions.
    let (second, _) = run_feature_development(&mut client).await;
    let (code, out) = cli(
        &cluster,
        &[
            "decisions",
            "feature-development",
            "CSS variables",
            "--workflow",
            "-k",
            "2",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{out}");
    let matches: Value = serde_json::from_str(&out).unwrap();
    let mut runs: Vec<&str> = matches
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["run_id"].as_str().unwrap())
        .collect();
    runs.sort_unstable();
    let mut expected = vec![run_id.as_str(), second.as_str()];
    expected.sort_unstable();
    assert_eq!(runs, expected, "the planner's decision of each run");

    // Both chains hold.
    for run in [&run_id, &second] {
        let (code, out) = cli(&cluster, &["runs", "verify", run]);
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("state chain holds (8 links"), "{out}");
    }
}

/// One byte of a stored result changed with a raw Redis command: `baton runs verify` names the
/// step and exits non-zero; the other results are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_verify_names_a_corrupted_step() {
    let mut cluster = Cluster::start().await;
    let records = Records::new(cluster.dir().join("records"));
    cluster.start_spec_workers(&records, &["worker-1"]).await;
    let mut client = cluster.client().await;
    let (run_id, _) = run_feature_development(&mut client).await;
    let (code, out) = cli(&cluster, &["runs", "verify", &run_id]);
    assert_eq!(code, 0, "{out}");

    let mut redis = redis::Client::open(cluster.redis().url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let results = format!("baton:run:{{{run_id}}}:results");
    let before: std::collections::HashMap<String, Vec<u8>> = redis.hgetall(&results).await.unwrap();
    let mut code_result = before["code#1"].clone();
    let at = code_result
        .windows(7)
        .position(|w| w == b"toggle.")
        .expect("the coder's result names toggle.tsx");
    code_result[at] = b'T';
    let _: () = redis.hset(&results, "code#1", &code_result).await.unwrap();

    let (code, out) = cli(&cluster, &["runs", "verify", &run_id]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("does NOT hold at step \"code\" (visit 1)"),
        "{out}"
    );
    let after: std::collections::HashMap<String, Vec<u8>> = redis.hgetall(&results).await.unwrap();
    for (key, bytes) in &before {
        if key != "code#1" {
            assert_eq!(&after[key], bytes, "{key} is unchanged");
        }
    }
}

/// The coordinator flips a byte of the first payload part it sends (a test hook): the worker
/// refuses the payload, asks for the task again, and the run goes on with exactly the spec's
/// payloads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_corrupted_on_the_wire_is_refused_and_sent_again() {
    let mut cluster = Cluster::start_with_env(&[("BATON_TEST_CORRUPT_PARTS", "1")]).await;
    let records = Records::new(cluster.dir().join("records"));
    cluster.start_spec_workers(&records, &["worker-1"]).await;
    let mut client = cluster.client().await;
    let (run_id, final_context) = run_feature_development(&mut client).await;
    assert_eq!(
        final_context,
        spec::final_context(&json!({"approved": true}))
    );
    let received = records.by_step(&run_id);
    for (step, expected) in spec::payloads(&json!({"approved": true})) {
        assert_eq!(received[&(step.to_owned(), 1)].payload, expected, "{step}");
    }
    let stats = client
        .get_stats(GetStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.resends, 1, "{stats:?}");
    let logs = cluster.logs();
    assert!(logs.contains("payload did not arrive intact"), "{logs}");
}

/// Issue 28, hole 5: an agent whose envelope removes a message id the history never had. The
/// step fails naming the id (the agent's mistake), and nothing about the run is an integrity
/// failure: `runs verify` holds, the coordinator counts no integrity failure, and a run that
/// routes the failure through `on_error` ends `succeeded` with no integrity error. Before, the
/// answer's result was never stored while its event and chain link were, so every read of the
/// run reported "result a#1 is missing" as tampering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envelope_removing_an_unknown_message_fails_its_step_not_the_chain() {
    let mut cluster = Cluster::start().await;
    let records = Records::new(cluster.dir().join("records"));
    let agents = records.agents_file_with(
        "worker-1",
        &[
            ("forgetful", vec!["forgetful-agent.sh"]),
            ("spec", vec!["spec-agent.sh", "planner"]),
        ],
        &format!(
            "output = \"envelope\"\nenv = {{ RECORD_ROOT = {}, WORKER = \"worker-1\" }}\n",
            serde_json::to_string(&records.root().display().to_string()).unwrap()
        ),
    );
    cluster.start_worker("worker-1", &agents, 2);
    cluster.wait_for_workers(&["worker-1"]).await;
    let mut client = cluster.client().await;

    let failing = json!({"steps": [{"id": "a", "type": "agent", "agent": "forgetful"}]});
    let run_id = harness::submit(&mut client, failing.to_string().into_bytes(), &json!({})).await;
    let record = Watch::start(&mut client, &run_id).await.finished().await;
    assert_eq!(record.status, "failed", "{record:#?}");
    let step = record.steps.iter().find(|s| s.step_id == "a").unwrap();
    assert_eq!(step.status, "failed", "{step:#?}");
    assert!(
        step.error.contains("no-such-message") && step.error.contains("cannot remove"),
        "the step's error names the unknown id: {}",
        step.error
    );
    assert!(!record.error.contains("integrity"), "{}", record.error);
    let (code, out) = cli(&cluster, &["runs", "verify", &run_id]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("state chain holds"), "{out}");
    // Read back from the store, not from the coordinator's memory: the replay must find the
    // answer's data.
    let (code, out) = cli(&cluster, &["runs", "get", &run_id, "--json"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("no-such-message"), "{out}");
    assert!(!out.contains("is missing"), "{out}");

    let recovering = json!({"steps": [
        {"id": "a", "type": "agent", "agent": "forgetful", "on_error": "fallback"},
        {"id": "fallback", "type": "transform", "transform": "input"}
    ]});
    let run_id = harness::submit(
        &mut client,
        recovering.to_string().into_bytes(),
        &json!({"x": 1}),
    )
    .await;
    let record = Watch::start(&mut client, &run_id).await.finished().await;
    assert_eq!(record.status, "succeeded", "{record:#?}");
    let (code, out) = cli(&cluster, &["runs", "verify", &run_id]);
    assert_eq!(code, 0, "{out}");

    let stats = client
        .get_stats(GetStatsRequest {})
        .await
        .expect("GetStats")
        .into_inner();
    assert_eq!(stats.integrity_failures, 0, "{stats:#?}");
}
