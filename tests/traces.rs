//! OpenTelemetry traces of runs, as an operator's collector receives them: a real coordinator and
//! real workers export by OTLP/gRPC to a receiver in this test (the opentelemetry-proto
//! `TraceService`), configured only by the standard `OTEL_*` variables.

#[path = "support/fleet.rs"]
mod fleet;
#[path = "support/cluster.rs"]
mod harness;
#[path = "support/otlp.rs"]
mod otlp;
#[path = "support/spec.rs"]
mod spec;

use std::time::{Duration, Instant};

use baton_proto::Json;
use baton_proto::v1::run_service_client::RunServiceClient;
use baton_proto::v1::{
    CancelRunRequest, DecideApprovalRequest, GetRunRequest, RunRecord, SubmitRunRequest,
};
use fleet::{Fleet, Timing};
use harness::Records;
use otlp::{Receiver, named, of_trace, one};
use serde_json::json;
use tonic::transport::Channel;

/// Whether `waiting` started when `before` was being recorded: the wait of a step entered by
/// the transition that recorded `before`'s answer (stored to the millisecond).
fn waits_from_the_end_of(waiting: &otlp::Received, before: &otlp::Received) -> bool {
    let ms = 1_000_000;
    waiting.start_ns + ms >= before.start_ns && waiting.start_ns <= before.end_ns + ms
}

/// The span of a SubmitRun call, named as the RPC conventions name a server span.
const SUBMIT: &str = "baton.v1.RunService/SubmitRun";

/// The spans a fleet exports to `endpoint` with: quick batches, and a resource attribute.
fn otel_env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.to_owned()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=trace-test".to_owned(),
        ),
        // Logs as a collector takes them, each naming its trace.
        ("BATON_LOG_FORMAT", "json".to_owned()),
    ]
}

async fn start_fleet(endpoint: &str) -> Fleet {
    let env = otel_env(endpoint);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Fleet::start_with_env(
        1,
        Timing {
            lease_ms: 2_000,
            worker_silence_ms: 3_000,
        },
        &env,
    )
    .await
}

/// Agents for the trace tests: `work` takes `seconds`, `broken` fails.
fn start_workers(fleet: &mut Fleet, records: &Records, ids: &[&str], seconds: &str) {
    for id in ids {
        let agents = records.agents_file(
            id,
            &[
                ("work", vec!["traced-agent.sh", seconds]),
                ("broken", vec!["traced-agent.sh", "0", "fail"]),
            ],
        );
        fleet.start_worker(id, &agents, 1);
    }
}

async fn submit(
    client: &mut RunServiceClient<Channel>,
    workflow: serde_json::Value,
    traceparent: Option<&str>,
) -> String {
    let mut request = tonic::Request::new(SubmitRunRequest {
        workflow: workflow.to_string().into_bytes(),
        input: Some(Json::new(b"\"trace me\"".to_vec())),
        idempotency_key: String::new(),
    });
    if let Some(traceparent) = traceparent {
        request
            .metadata_mut()
            .insert("traceparent", traceparent.parse().unwrap());
    }
    client
        .submit_run(request)
        .await
        .unwrap()
        .into_inner()
        .run_id
}

async fn wait_until(
    client: &mut RunServiceClient<Channel>,
    run_id: &str,
    done: impl Fn(&RunRecord) -> bool,
) -> RunRecord {
    let deadline = Instant::now() + harness::DEADLINE;
    loop {
        if let Ok(record) = client
            .get_run(GetRunRequest {
                run_id: run_id.to_owned(),
            })
            .await
        {
            let record = record.into_inner();
            if done(&record) {
                return record;
            }
        }
        assert!(Instant::now() < deadline, "run {run_id} never got there");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn finished(client: &mut RunServiceClient<Channel>, run_id: &str) -> RunRecord {
    wait_until(client, run_id, |r| r.status != "running").await
}

/// A receiver, one coordinator exporting to it, and `workers` (one slot each) whose `work`
/// agent takes `seconds`, all connected; and a client.
async fn traced_cluster(
    workers: &[&str],
    seconds: &str,
) -> (Receiver, Fleet, Records, RunServiceClient<Channel>) {
    let (receiver, endpoint) = Receiver::start().await;
    let mut fleet = start_fleet(&endpoint).await;
    let records = Records::new(fleet.dir().join("records"));
    start_workers(&mut fleet, &records, workers, seconds);
    fleet.wait_for_workers(workers.len() as u32).await;
    let client = fleet.client(0).await.unwrap();
    (receiver, fleet, records, client)
}

/// Waits until an agent has started (it writes its line first).
async fn wait_for_an_agent(records: &Records) {
    let deadline = Instant::now() + harness::DEADLINE;
    while agent_traceparents(records).is_empty() {
        assert!(Instant::now() < deadline, "the agent never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Lines `<run> <step> <attempt> <worker> <traceparent>` the agents wrote.
fn agent_traceparents(records: &Records) -> Vec<Vec<String>> {
    std::fs::read_to_string(records.root().join("traceparents.log"))
        .unwrap_or_default()
        .lines()
        .map(|line| line.split(' ').map(str::to_owned).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_run_is_one_trace_from_submit_through_every_worker() {
    // One slot each, and branches that take their time: the two branches run on both workers.
    let (receiver, fleet, records, mut client) = traced_cluster(&["w1", "w2"], "0.5").await;

    // Continues the caller's trace.
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let pipeline = json!({"id": "traced-pipeline", "steps": [
        {"id": "plan", "type": "agent", "agent": "work"},
        {"id": "tests", "type": "parallel", "steps": [
            {"id": "unit", "type": "agent", "agent": "work"},
            {"id": "integration", "type": "agent", "agent": "work"}
        ]}
    ]});
    let traceparent = format!("00-{client_trace}-{client_span}-01");
    let run = submit(&mut client, pipeline, Some(&traceparent)).await;
    // Starts its own trace; fails, once retried.
    let failing = json!({"id": "traced-failure", "steps": [
        {"id": "build", "type": "agent", "agent": "broken",
         "retry": {"max_attempts": 2, "initial_interval_ms": 50}}
    ]});
    let failed = submit(&mut client, failing, None).await;

    let record = finished(&mut client, &run).await;
    assert_eq!(record.status, "succeeded", "{}", record.error);
    assert_eq!(record.trace_id, client_trace, "the record names its trace");
    let failed_record = finished(&mut client, &failed).await;
    assert_eq!(failed_record.status, "failed");
    let failed_trace = failed_record.trace_id.clone();
    assert_eq!(
        failed_trace.len(),
        32,
        "a trace of its own: {failed_record:?}"
    );
    assert_ne!(failed_trace, client_trace);

    let spans = receiver
        .wait_for("both runs' spans", |spans| {
            let run = of_trace(spans, client_trace);
            let failed = of_trace(spans, &failed_trace);
            named(&run, "execute work").len() == 3
                && named(&run, "step tests").len() == 1
                && named(&run, "step unit").len() == 1
                && named(&run, "step integration").len() == 1
                && named(&failed, "step build").len() == 2
                && named(&failed, "execute broken").len() == 2
        })
        .await;

    // Exactly one trace per run: every span that names a run is in that run's trace, and each
    // trace has one SubmitRun.
    for span in &spans {
        match span.attributes.get("baton.run.id").map(String::as_str) {
            Some(id) if id == run => assert_eq!(span.trace_id, client_trace, "{span:#?}"),
            Some(id) if id == failed => assert_eq!(span.trace_id, failed_trace, "{span:#?}"),
            _ => {}
        }
    }
    let trace = of_trace(&spans, client_trace);
    otlp::assert_connected(&trace, client_span);
    let submitted = one(&trace, SUBMIT);
    assert_eq!(
        submitted.parent_span_id, client_span,
        "continues the caller"
    );
    assert_eq!(submitted.attribute("baton.run.id"), run);
    assert_eq!(submitted.attribute("baton.workflow.id"), "traced-pipeline");
    assert_eq!(submitted.service, "baton-coordinator");
    assert_eq!(
        submitted
            .resource
            .get("service.instance.id")
            .map(String::as_str),
        Some("coordinator-0"),
        "the coordinator's id tells it from its replicas"
    );
    assert_eq!(
        submitted
            .resource
            .get("deployment.environment")
            .map(String::as_str),
        Some("trace-test"),
        "OTEL_RESOURCE_ATTRIBUTES is honoured"
    );

    // SubmitRun -> step -> worker execution; a branch's step is under its parallel step's.
    let plan = one(&trace, "step plan");
    let tests = one(&trace, "step tests");
    assert_eq!(plan.parent_span_id, submitted.span_id);
    assert_eq!(tests.parent_span_id, submitted.span_id);
    assert_eq!(tests.attribute("baton.step.type"), "parallel");
    let mut branch_workers = Vec::new();
    for step in ["plan", "unit", "integration"] {
        let step_span = one(&trace, &format!("step {step}"));
        if step != "plan" {
            assert_eq!(
                step_span.parent_span_id, tests.span_id,
                "{step} is a branch"
            );
        }
        for (key, value) in [
            ("baton.run.id", run.as_str()),
            ("baton.workflow.id", "traced-pipeline"),
            ("baton.step.id", step),
            ("baton.step.type", "agent"),
            ("baton.agent", "work"),
            ("baton.attempt", "1"),
        ] {
            assert_eq!(step_span.attribute(key), value, "{step_span:#?}");
        }
        assert!(step_span.events.contains(&"dispatched".to_owned()));
        let worker = step_span.attribute("baton.worker.id");
        // Its queue wait and its persistence are its children.
        for child in ["queue wait", "persist"] {
            assert!(
                trace
                    .iter()
                    .any(|s| s.name == child && s.parent_span_id == step_span.span_id),
                "{step} has a {child} span"
            );
        }
        let executions: Vec<_> = named(&trace, "execute work")
            .into_iter()
            .filter(|s| s.parent_span_id == step_span.span_id)
            .collect();
        assert_eq!(executions.len(), 1, "one execution under step {step}");
        let execution = executions[0];
        assert_eq!(execution.service, "baton-worker");
        assert_eq!(
            execution
                .resource
                .get("service.instance.id")
                .map(String::as_str),
            Some(worker)
        );
        assert_eq!(execution.attribute("baton.worker.id"), worker);
        assert_eq!(execution.attribute("baton.step.id"), step);
        assert_eq!(execution.attribute("baton.attempt"), "1");
        assert!(execution.start_ns >= step_span.start_ns && execution.end_ns <= step_span.end_ns);
        // The agent's process got the execution span as its TRACEPARENT.
        let given: Vec<_> = agent_traceparents(&records)
            .into_iter()
            .filter(|line| line[0] == run && line[1] == step)
            .collect();
        assert_eq!(
            given[0][4],
            format!("00-{client_trace}-{}-01", execution.span_id)
        );
        if step != "plan" {
            branch_workers.push(worker.to_owned());
        }
    }
    branch_workers.sort();
    assert_eq!(
        branch_workers,
        ["w1", "w2"],
        "the branches ran on both workers"
    );

    // The failed run: both attempts in its trace, errors with their message, the retry an
    // event on the first and a link from the second.
    let trace = of_trace(&spans, &failed_trace);
    otlp::assert_connected(&trace, "");
    let submitted = one(&trace, SUBMIT);
    assert_eq!(submitted.parent_span_id, "", "a trace of its own");
    let mut attempts = named(&trace, "step build");
    attempts.sort_by_key(|s| s.attribute("baton.attempt").to_owned());
    for attempt in &attempts {
        assert_eq!(attempt.parent_span_id, submitted.span_id);
        assert_eq!(attempt.status_code, 2, "error status: {attempt:#?}");
        assert!(
            attempt.status_message.contains("the build broke"),
            "{}",
            attempt.status_message
        );
    }
    assert!(attempts[0].events.contains(&"retry scheduled".to_owned()));
    assert!(!attempts[1].events.contains(&"retry scheduled".to_owned()));
    assert_eq!(attempts[1].links.len(), 1);
    assert_eq!(attempts[1].links[0].0, attempts[0].span_id);
    for execution in named(&trace, "execute broken") {
        assert_eq!(execution.status_code, 2);
        assert!(
            attempts
                .iter()
                .any(|a| a.span_id == execution.parent_span_id)
        );
    }

    // A log line leads to its trace: the worker's about the failed attempt names the trace and
    // the execution's span, the coordinator's about the retry the attempt's span.
    let lines = |name: &str| -> Vec<serde_json::Value> {
        fleet
            .log_of(name)
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    };
    let failure_logged = ["w1", "w2"].iter().flat_map(|w| lines(w)).find(|line| {
        line["fields"]["message"] == "agent failed" && line["span"]["trace_id"] == failed_trace
    });
    let failure_logged = failure_logged.expect("a worker logged the failed attempt, as JSON");
    let executions = named(&trace, "execute broken");
    assert!(
        executions
            .iter()
            .any(|e| failure_logged["span"]["span_id"] == e.span_id.as_str()),
        "{failure_logged}"
    );
    let retry_logged = lines("coordinator-0")
        .into_iter()
        .find(|line| line["span"]["trace_id"] == failed_trace)
        .expect("the coordinator logged the retry with its trace");
    assert_eq!(
        retry_logged["span"]["span_id"],
        attempts[0].span_id.as_str()
    );

    // `baton runs get` shows the trace id.
    let output = harness::baton()
        .args(["runs", "get", &run, "--coordinator", &fleet.url(0)])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{shown}");
    assert!(
        shown.contains(&format!("trace: {client_trace}")),
        "runs get shows the trace: {shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stays_one_trace_across_a_coordinator_restart() {
    let (receiver, mut fleet, _records, mut client) = traced_cluster(&["w1"], "0").await;
    let workflow = json!({"id": "traced-approval", "steps": [
        {"id": "plan", "type": "agent", "agent": "work"},
        {"id": "approve", "type": "approval", "message": "Ship it?"},
        {"id": "review", "type": "agent", "agent": "work"}
    ]});
    let run = submit(&mut client, workflow, None).await;
    let waiting = wait_until(&mut client, &run, |r| {
        r.waiting.iter().any(|w| w.step_id == "approve")
    })
    .await;
    let trace_id = waiting.trace_id.clone();
    receiver
        .wait_for("the first steps' spans", |spans| {
            let trace = of_trace(spans, &trace_id);
            named(&trace, SUBMIT).len() == 1 && named(&trace, "step plan").len() == 1
        })
        .await;

    // The coordinator dies while the run waits; a new one (same Redis) takes the decision.
    fleet.kill_coordinator(0);
    fleet.start_coordinator(0).await;
    fleet.wait_for_workers(1).await;
    let mut client = fleet.client(0).await.unwrap();
    client
        .decide_approval(DecideApprovalRequest {
            run_id: run.clone(),
            step_id: "approve".to_owned(),
            approved: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let record = finished(&mut client, &run).await;
    assert_eq!(record.status, "succeeded", "{}", record.error);
    assert_eq!(record.trace_id, trace_id);

    let spans = receiver
        .wait_for("the steps after the restart", |spans| {
            let trace = of_trace(spans, &trace_id);
            named(&trace, "step review").len() == 1 && named(&trace, "execute work").len() == 2
        })
        .await;
    let trace = of_trace(&spans, &trace_id);
    otlp::assert_connected(&trace, "");
    let submitted = one(&trace, SUBMIT);
    let plan = one(&trace, "step plan");
    let approve = one(&trace, "step approve");
    let review = one(&trace, "step review");
    assert_eq!(approve.parent_span_id, submitted.span_id);
    assert_eq!(approve.attribute("baton.step.type"), "approval");
    // The approval's span covers its wait, which began before the restart, when the plan was
    // recorded (the stored start has millisecond precision).
    assert!(
        waits_from_the_end_of(approve, plan),
        "the approval waited from {} but the plan ran {}..{}",
        approve.start_ns,
        plan.start_ns,
        plan.end_ns
    );
    assert!(approve.end_ns <= review.start_ns + 5_000_000);
    assert_eq!(review.parent_span_id, submitted.span_id);
    let execution = named(&trace, "execute work")
        .into_iter()
        .find(|s| s.attribute("baton.step.id") == "review")
        .expect("the review's execution");
    assert_eq!(execution.parent_span_id, review.span_id);
    // Nothing of the run went to another trace.
    assert!(
        spans
            .iter()
            .filter(|s| s.attributes.get("baton.run.id") == Some(&run))
            .all(|s| s.trace_id == trace_id)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_delivery_and_a_loop_stay_in_the_run_trace() {
    // w1's agent takes long enough to be killed in the middle.
    let (receiver, mut fleet, records, mut client) = traced_cluster(&["w1"], "30").await;
    let workflow = json!({"id": "traced-loss", "steps": [
        {"id": "plan", "type": "agent", "agent": "work"},
        {"id": "approve", "type": "approval", "message": "Ship it?", "on_reject": "plan"}
    ]});
    let run = submit(&mut client, workflow, None).await;
    wait_for_an_agent(&records).await;
    // The worker dies mid-task; the next one takes the task as attempt 2.
    fleet.kill_worker("w1");
    start_workers(&mut fleet, &records, &["w2"], "0");
    let waiting = wait_until(&mut client, &run, |r| {
        r.waiting.iter().any(|w| w.step_id == "approve")
    })
    .await;
    let trace_id = waiting.trace_id.clone();
    // Rejected once: the plan and the approval are visited twice.
    let decide = |approved| DecideApprovalRequest {
        run_id: run.clone(),
        step_id: "approve".to_owned(),
        approved,
        ..Default::default()
    };
    client.decide_approval(decide(false)).await.unwrap();
    let _ = wait_until(&mut client, &run, |r| {
        r.steps
            .iter()
            .any(|s| s.step_id == "approve" && s.visits == 2)
            && r.waiting.iter().any(|w| w.step_id == "approve")
    })
    .await;
    client.decide_approval(decide(true)).await.unwrap();
    let record = finished(&mut client, &run).await;
    assert_eq!(record.status, "succeeded", "{}", record.error);

    let spans = receiver
        .wait_for("both visits' spans, and w2's two executions", |spans| {
            let trace = of_trace(spans, &trace_id);
            // The workers export their spans on their own schedule: the coordinator's may all be
            // in before w2's are.
            named(&trace, "step approve").len() == 2
                && named(&trace, "step plan").len() == 3
                && named(&trace, "execute work").len() >= 2
        })
        .await;
    let trace = of_trace(&spans, &trace_id);
    // The killed worker's span never got out; everything else is connected.
    otlp::assert_connected(&trace, "");
    let mut plans = named(&trace, "step plan");
    plans.sort_by_key(|s| {
        (
            s.attribute("baton.step.visit").to_owned(),
            s.attribute("baton.attempt").to_owned(),
        )
    });
    let (lost, redelivered, second_visit) = (plans[0], plans[1], plans[2]);
    assert_eq!(lost.attribute("baton.attempt"), "1");
    assert_eq!(lost.attribute("baton.worker.id"), "w1");
    assert_eq!(lost.status_code, 2);
    assert_eq!(lost.status_message, "its worker was lost");
    assert_eq!(redelivered.attribute("baton.attempt"), "2");
    assert_eq!(redelivered.attribute("baton.worker.id"), "w2");
    assert!(
        redelivered
            .events
            .contains(&"previous delivery lost".to_owned())
    );
    assert_eq!(redelivered.links[0].0, lost.span_id);
    assert_eq!(second_visit.attribute("baton.step.visit"), "2");
    // The attempt that ran is the parent of the execution that answered.
    let executions: Vec<_> = named(&trace, "execute work")
        .into_iter()
        .filter(|e| e.parent_span_id == redelivered.span_id)
        .collect();
    assert_eq!(executions.len(), 1, "{trace:#?}");
    assert_eq!(executions[0].attribute("baton.attempt"), "2");

    // Each approval visit has its own span, from its own wait.
    let mut approvals = named(&trace, "step approve");
    approvals.sort_by_key(|s| s.attribute("baton.step.visit").to_owned());
    assert_eq!(approvals[0].attribute("baton.step.visit"), "1");
    assert_eq!(approvals[1].attribute("baton.step.visit"), "2");
    assert_ne!(approvals[0].span_id, approvals[1].span_id);
    assert!(waits_from_the_end_of(approvals[0], redelivered));
    assert!(waits_from_the_end_of(approvals[1], second_visit));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_run_ends_its_running_attempt_in_the_trace() {
    let (receiver, _fleet, records, mut client) = traced_cluster(&["w1"], "30").await;
    let workflow = json!({"id": "traced-cancel", "steps": [
        {"id": "plan", "type": "agent", "agent": "work"}
    ]});
    let run = submit(&mut client, workflow, None).await;
    wait_for_an_agent(&records).await;
    let record = client
        .cancel_run(CancelRunRequest {
            run_id: run.clone(),
            reason: "changed my mind".to_owned(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(record.status, "cancelled");

    let spans = receiver
        .wait_for("the cancelled attempt and its execution", |spans| {
            let trace = of_trace(spans, &record.trace_id);
            named(&trace, "step plan").len() == 1 && named(&trace, "execute work").len() == 1
        })
        .await;
    let trace = of_trace(&spans, &record.trace_id);
    otlp::assert_connected(&trace, "");
    let attempt = one(&trace, "step plan");
    assert!(
        attempt.events.contains(&"abandoned".to_owned()),
        "{attempt:#?}"
    );
    let execution = one(&trace, "execute work");
    assert_eq!(execution.parent_span_id, attempt.span_id);
    assert_eq!(execution.status_code, 2, "stopped: {execution:#?}");
}
