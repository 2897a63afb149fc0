//! The cluster end to end, over gRPC: a private `redis-server`, the real `baton coordinator` and
//! `baton worker` processes, and `command` agents (POSIX `sh`) that save every payload they
//! receive, so that the tests check what each agent got and which worker ran it.

#[path = "support/cluster.rs"]
mod harness;
#[path = "support/spec.rs"]
mod spec;

use std::collections::BTreeSet;

use baton_proto::Json;
use baton_proto::v1::worker_service_client::WorkerServiceClient;
use baton_proto::v1::{
    CancelRunRequest, DecideApprovalRequest, GetRunRequest, Hello, ListRunsRequest,
    SubmitRunRequest, TaskResult, coordinator_message, task_result, worker_message,
};
use harness::{Cluster, Records, Watch, context, step, worker_message};
use redis::AsyncCommands;
use serde_json::{Value, json};
use tonic::Code;

fn feature_workflow() -> Vec<u8> {
    std::fs::read(harness::root().join("examples/feature-development/workflow.json"))
        .expect("read the feature-development example")
}

fn input(value: &Value) -> Option<Json> {
    Some(Json::new(serde_json::to_vec(value).unwrap()))
}

fn decision(run_id: &str, approved: bool, comment: &str) -> DecideApprovalRequest {
    DecideApprovalRequest {
        run_id: run_id.to_owned(),
        step_id: "approve-plan".to_owned(),
        approved,
        comment: comment.to_owned(),
        approver: String::new(),
    }
}

/// The run's keys in Redis, as `baton coordinator` lays them out (prefix `baton`).
fn run_key(run_id: &str) -> String {
    format!("baton:run:{{{run_id}}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feature_development_runs_across_two_workers() {
    let mut cluster = Cluster::start().await;
    let records = Records::new(cluster.dir().join("records"));
    cluster
        .start_spec_workers(&records, &["worker-1", "worker-2"])
        .await;
    let mut client = cluster.client().await;

    let run_id = harness::submit(&mut client, feature_workflow(), &json!(spec::INPUT)).await;
    let mut watch = Watch::start(&mut client, &run_id).await;
    assert_eq!(watch.approval("approve-plan").await, 1);
    let waiting = client
        .get_run(GetRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(waiting.status, "running");
    assert_eq!(step(&waiting, "approve-plan").status, "waiting");
    assert_eq!(waiting.waiting.len(), 1, "{waiting:#?}");
    assert_eq!(
        (
            waiting.waiting[0].kind.as_str(),
            waiting.waiting[0].step_id.as_str(),
            waiting.waiting[0].message.as_str()
        ),
        ("approval", "approve-plan", "Approve implementation plan?")
    );
    client
        .decide_approval(decision(&run_id, true, ""))
        .await
        .expect("DecideApproval");
    let record = watch.finished().await;

    assert_eq!(record.status, "succeeded", "{record:#?}");
    assert_eq!(record.error, "");
    assert!(record.waiting.is_empty());
    let approval = json!({"approved": true});
    assert_eq!(context(&record), spec::final_context(&approval));

    // Every agent received exactly what the spec shows, once.
    let received = records.by_step(&run_id);
    let expected = spec::payloads(&approval);
    assert_eq!(
        received.keys().cloned().collect::<Vec<_>>(),
        {
            let mut keys: Vec<_> = expected.iter().map(|(s, _)| (s.to_string(), 1)).collect();
            keys.sort();
            keys
        },
        "one payload per agent step"
    );
    for (step_id, payload) in &expected {
        let got = &received[&(step_id.to_string(), 1)];
        assert_eq!(&got.payload, payload, "the payload of {step_id}");
        // The record's worker, the watch's StepStarted and the folder the agent wrote to agree.
        assert_eq!(step(&record, step_id).worker_id, got.worker, "{step_id}");
        // (The plan may have finished before the watch began, and a watch that begins late
        // replays settled steps only; every later step started while the test watched.)
        let started = watch.started_on(step_id);
        if *step_id != "plan" || !started.is_empty() {
            assert_eq!(started, [got.worker.as_str()], "{step_id}");
        }
    }
    let workers: BTreeSet<_> = received.values().map(|r| r.worker.as_str()).collect();
    assert_eq!(
        workers,
        BTreeSet::from(["worker-1", "worker-2"]),
        "the steps spread over both workers"
    );
    for (step_id, status, visits) in [
        ("plan", "succeeded", 1),
        ("approve-plan", "succeeded", 1),
        ("code", "succeeded", 1),
        ("parallel-tests", "succeeded", 1),
        ("unit", "succeeded", 1),
        ("integration", "succeeded", 1),
        ("check-tests", "succeeded", 1),
        ("review", "succeeded", 1),
    ] {
        let state = step(&record, step_id);
        assert_eq!(
            (state.status.as_str(), state.visits),
            (status, visits),
            "{step_id}"
        );
    }
    assert_eq!(step(&record, "unit").parent, "parallel-tests");

    // GetRun after the end says the same as the final event.
    let got = client
        .get_run(GetRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got, record);

    // The run's state is in Redis.
    let mut redis = cluster.redis_connection().await;
    let key = run_key(&run_id);
    let header: std::collections::HashMap<String, Vec<u8>> = redis.hgetall(&key).await.unwrap();
    let field = |name: &str| String::from_utf8_lossy(&header[name]).into_owned();
    assert_eq!(field("status"), "succeeded");
    assert_eq!(field("workflow_id"), "feature-development");
    assert_eq!(field("state_sha256"), record.state_sha256);
    assert_eq!(
        serde_json::from_slice::<Value>(&header["input"]).unwrap(),
        json!(spec::INPUT)
    );
    let results: std::collections::HashMap<String, Vec<u8>> =
        redis.hgetall(format!("{key}:results")).await.unwrap();
    let results: std::collections::BTreeMap<String, Value> = results
        .into_iter()
        .map(|(k, v)| (k, serde_json::from_slice(&v).unwrap()))
        .collect();
    let expected_results: std::collections::BTreeMap<String, Value> = spec::results()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    assert_eq!(results, expected_results);
    let events: Vec<Vec<u8>> = redis.lrange(format!("{key}:events"), 0, -1).await.unwrap();
    assert!(!events.is_empty());
    let mut kinds: Vec<String> = events
        .iter()
        .map(|e| {
            let event: Value = serde_json::from_slice(e).unwrap();
            event["event"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "agent_succeeded",
            "agent_succeeded",
            "agent_succeeded",
            "agent_succeeded",
            "agent_succeeded",
            "approval_decided",
            "started"
        ],
        "how the run started, one event per agent answer and one for the decision"
    );
    let listed: Option<f64> = redis.zscore("baton:runs", &run_id).await.unwrap();
    assert!(listed.is_some(), "the run is in the runs index");
    let active: bool = redis.sismember("baton:runs:active", &run_id).await.unwrap();
    assert!(!active, "a finished run is not active");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_plan_loops_back_to_plan() {
    let mut cluster = Cluster::start().await;
    let records = Records::new(cluster.dir().join("records"));
    cluster
        .start_spec_workers(&records, &["worker-1", "worker-2"])
        .await;
    let mut client = cluster.client().await;

    let run_id = harness::submit(&mut client, feature_workflow(), &json!(spec::INPUT)).await;
    let mut watch = Watch::start(&mut client, &run_id).await;
    assert_eq!(watch.approval("approve-plan").await, 1);
    let rejected = client
        .decide_approval(decision(&run_id, false, "split the toggle"))
        .await
        .expect("DecideApproval")
        .into_inner();
    assert_eq!(rejected.status, "running");
    assert_eq!(watch.approval("approve-plan").await, 2);
    client
        .decide_approval(decision(&run_id, true, ""))
        .await
        .expect("DecideApproval");
    let record = watch.finished().await;
    assert_eq!(record.status, "succeeded", "{record:#?}");

    let received = records.by_step(&run_id);
    let plans: Vec<_> = received.keys().filter(|(s, _)| s == "plan").collect();
    assert_eq!(plans.len(), 2, "the planner ran twice: {received:#?}");
    assert_eq!(
        received[&("plan".to_owned(), 1)].payload,
        json!({"input": spec::INPUT, "context": {}})
    );
    assert_eq!(
        received[&("plan".to_owned(), 2)].payload,
        json!({
            "input": spec::INPUT,
            "context": {
                "plan": spec::plan(),
                "approve-plan": {"approved": false, "comment": "split the toggle"}
            }
        })
    );
    // The second decision replaced the first in the context the coder sees.
    assert_eq!(
        received[&("code".to_owned(), 1)].payload["context"]["approve-plan"],
        json!({"approved": true})
    );
    assert_eq!(
        context(&record),
        spec::final_context(&json!({"approved": true}))
    );

    let got = client
        .get_run(GetRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            step(&got, "plan").status.as_str(),
            step(&got, "plan").visits
        ),
        ("succeeded", 2)
    );
    assert_eq!(step(&got, "approve-plan").visits, 2);
    assert_eq!(step(&got, "code").visits, 1);

    // Both plans are kept in Redis.
    let mut redis = cluster.redis_connection().await;
    let results: std::collections::HashMap<String, Vec<u8>> = redis
        .hgetall(format!("{}:results", run_key(&run_id)))
        .await
        .unwrap();
    for key in ["plan#1", "plan#2"] {
        assert_eq!(
            serde_json::from_slice::<Value>(&results[key]).unwrap(),
            spec::plan(),
            "{key}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_branches_run_at_once_on_two_workers() {
    let mut cluster = Cluster::start().await;
    let records = Records::new(cluster.dir().join("records"));
    // Both workers serve both branches' agents but run one task at a time, and each branch only
    // finishes once the other has started: the run can only succeed if the two branches ran at
    // the same time, hence on two workers.
    for id in ["worker-1", "worker-2"] {
        let agents = records.agents_file(
            id,
            &[
                ("meet-left", vec!["rendezvous.sh", "left", "right"]),
                ("meet-right", vec!["rendezvous.sh", "right", "left"]),
            ],
        );
        cluster.start_worker(id, &agents, 1);
    }
    cluster.wait_for_workers(&["worker-1", "worker-2"]).await;
    let workflow = br#"{"id": "rendezvous", "steps": [
        {"id": "meet", "type": "parallel", "steps": [
            {"id": "left", "type": "agent", "agent": "meet-left"},
            {"id": "right", "type": "agent", "agent": "meet-right"}
        ]}
    ]}"#;
    let mut client = cluster.client().await;
    let run_id = harness::submit(&mut client, workflow.to_vec(), &json!("meet")).await;
    let mut watch = Watch::start(&mut client, &run_id).await;
    let record = watch.finished().await;
    assert_eq!(record.status, "succeeded", "{record:#?}");

    let meet = &context(&record)["meet"];
    assert_eq!(
        meet["success"],
        json!(true),
        "both branches met each other: {meet:#}"
    );
    let data = meet["data"].as_array().expect("parallel data");
    assert_eq!(
        data.iter().map(|d| d["stepId"].clone()).collect::<Vec<_>>(),
        [json!("left"), json!("right")]
    );
    let result_workers: BTreeSet<_> = data
        .iter()
        .map(|d| d["result"]["worker"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(result_workers.len(), 2, "{meet:#}");

    // The branches were recorded by two different worker processes...
    let received = records.by_step(&run_id);
    let left = &received[&("left".to_owned(), 1)];
    let right = &received[&("right".to_owned(), 1)];
    assert_ne!(left.worker, right.worker);
    assert_eq!(left.payload, json!({"input": "meet", "context": {}}));
    assert_eq!(right.payload, left.payload);
    // ...which GetRun names too.
    let got = client
        .get_run(GetRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let (left_step, right_step) = (step(&got, "left"), step(&got, "right"));
    assert_eq!(left_step.worker_id, left.worker);
    assert_eq!(right_step.worker_id, right.worker);
    assert_eq!(
        (left_step.parent.as_str(), right_step.parent.as_str()),
        ("meet", "meet")
    );
    assert_ne!(left_step.worker_id, right_step.worker_id);
}

/// Asserts the status code of `result` and that its message contains every one of `needles`.
fn assert_refused<T: std::fmt::Debug>(
    result: Result<T, tonic::Status>,
    code: Code,
    needles: &[&str],
) {
    let status = result.expect_err("the call must be refused");
    assert_eq!(status.code(), code, "{status:?}");
    for needle in needles {
        assert!(
            status.message().contains(needle),
            "{needle:?} missing from the message: {}",
            status.message()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_a_clear_error_and_nothing_is_stored() {
    let cluster = Cluster::start().await;
    let mut client = cluster.client().await;
    let mut redis = cluster.redis_connection().await;
    let valid = br#"{"id": "gate", "steps": [
        {"id": "gate", "type": "approval", "message": "Go?"},
        {"id": "after", "type": "agent", "agent": "nobody-serves-this"}
    ]}"#
    .to_vec();
    let submit = |workflow: Vec<u8>, input: Option<Json>| SubmitRunRequest {
        workflow,
        input,
        idempotency_key: String::new(),
    };

    // Malformed JSON.
    assert_refused(
        client
            .submit_run(submit(b"{\"steps\": [".to_vec(), input(&json!("x"))))
            .await,
        Code::InvalidArgument,
        &["invalid workflow", "not valid JSON", "line 1 column 11"],
    );
    // Not UTF-8.
    assert_refused(
        client
            .submit_run(submit(vec![0xff, 0xfe, b'{'], input(&json!("x"))))
            .await,
        Code::InvalidArgument,
        &["UTF-8"],
    );
    // An invalid workflow: every problem with its path and step.
    let broken = br#"{"id": "broken", "steps": [
        {"id": "plan", "type": "agnet", "agent": "planner"},
        {"id": "code", "type": "agent", "agent": "coder", "next": "tset", "input": "plan"},
        {"id": "test", "type": "condition", "condition": "context.code.ok ==="}
    ]}"#;
    assert_refused(
        client
            .submit_run(submit(broken.to_vec(), input(&json!("x"))))
            .await,
        Code::InvalidArgument,
        &[
            "$.steps[0].type (step \"plan\"): unknown step type \"agnet\"",
            "$.steps[1].next (step \"code\"): next names no step: \"tset\"",
            "$.steps[2].condition (step \"test\")",
            "$.steps[2] (step \"test\"): a condition step needs \"then\", \"else\" or both",
        ],
    );
    // An input over the 4 MiB limit.
    let big = json!("x".repeat(4 << 20));
    let big_len = serde_json::to_vec(&big).unwrap().len().to_string();
    assert_refused(
        client.submit_run(submit(valid.clone(), input(&big))).await,
        Code::InvalidArgument,
        &["the input is", &big_len, "4194304"],
    );
    // A workflow over the 1 MiB limit (spaces after a valid document).
    let mut huge = valid.clone();
    huge.resize((1 << 20) + 1, b' ');
    assert_refused(
        client.submit_run(submit(huge, input(&json!("x")))).await,
        Code::InvalidArgument,
        &["the workflow is 1048577 bytes", "1048576"],
    );
    // An input whose SHA-256 does not match its bytes.
    let mut tampered = Json::new(br#""Add dark mode toggle""#.to_vec());
    tampered.flip(1, tampered.json[1] ^ b'a');
    assert_refused(
        client
            .submit_run(submit(valid.clone(), Some(tampered.clone())))
            .await,
        Code::InvalidArgument,
        &["SHA-256", &tampered.sha256],
    );
    // An input that is not JSON (with a matching digest), and no input at all.
    assert_refused(
        client
            .submit_run(submit(valid.clone(), Some(Json::new(b"{oops".to_vec()))))
            .await,
        Code::InvalidArgument,
        &["the input is not valid JSON"],
    );
    assert_refused(
        client.submit_run(submit(valid.clone(), None)).await,
        Code::InvalidArgument,
        &["input"],
    );
    // None of that stored anything.
    let runs = client
        .list_runs(ListRunsRequest {
            limit: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .runs;
    assert!(runs.is_empty(), "{runs:#?}");
    let keys: Vec<String> = redis.keys("*").await.unwrap();
    assert!(keys.is_empty(), "Redis holds {keys:?}");

    // Unknown runs.
    let unknown = "01900000-0000-7000-8000-000000000000";
    let get = |run_id: &str| GetRunRequest {
        run_id: run_id.to_owned(),
    };
    assert_refused(
        client.get_run(get(unknown)).await,
        Code::NotFound,
        &[unknown],
    );
    assert_refused(
        client
            .decide_approval(DecideApprovalRequest {
                run_id: unknown.to_owned(),
                step_id: "gate".to_owned(),
                approved: true,
                ..Default::default()
            })
            .await,
        Code::NotFound,
        &[unknown],
    );
    assert_refused(
        client
            .cancel_run(CancelRunRequest {
                run_id: unknown.to_owned(),
                reason: String::new(),
            })
            .await,
        Code::NotFound,
        &[unknown],
    );
    let keys: Vec<String> = redis.keys("*").await.unwrap();
    assert!(keys.is_empty(), "looking up unknown runs stored {keys:?}");

    // A decision for a step that is not waiting changes nothing.
    let run_id = client
        .submit_run(submit(valid.clone(), input(&json!("go"))))
        .await
        .expect("a valid run is accepted")
        .into_inner()
        .run_id;
    let before = client.get_run(get(&run_id)).await.unwrap().into_inner();
    assert_eq!(step(&before, "gate").status, "waiting");
    let stored_before = stored(&mut redis, &run_id).await;
    for step_id in ["after", "no-such-step"] {
        assert_refused(
            client
                .decide_approval(DecideApprovalRequest {
                    run_id: run_id.clone(),
                    step_id: step_id.to_owned(),
                    approved: true,
                    ..Default::default()
                })
                .await,
            Code::FailedPrecondition,
            &[&run_id, &format!("step \"{step_id}\" is not waiting")],
        );
    }
    assert_eq!(
        client.get_run(get(&run_id)).await.unwrap().into_inner(),
        before
    );
    assert_eq!(stored(&mut redis, &run_id).await, stored_before);

    // Nor does a decision for a run that is over.
    let cancelled = client
        .cancel_run(CancelRunRequest {
            run_id: run_id.clone(),
            reason: "test over".to_owned(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cancelled.status, "cancelled");
    let stored_cancelled = stored(&mut redis, &run_id).await;
    assert_refused(
        client
            .decide_approval(DecideApprovalRequest {
                run_id: run_id.clone(),
                step_id: "gate".to_owned(),
                approved: true,
                ..Default::default()
            })
            .await,
        Code::FailedPrecondition,
        &[&run_id, "cancelled"],
    );
    assert_eq!(
        client.get_run(get(&run_id)).await.unwrap().into_inner(),
        cancelled
    );
    assert_eq!(stored(&mut redis, &run_id).await, stored_cancelled);
}

/// The run's header hash and event log as Redis holds them.
async fn stored(
    redis: &mut redis::aio::MultiplexedConnection,
    run_id: &str,
) -> (std::collections::BTreeMap<String, Vec<u8>>, Vec<Vec<u8>>) {
    let key = run_key(run_id);
    let header: std::collections::BTreeMap<String, Vec<u8>> = redis.hgetall(&key).await.unwrap();
    assert!(!header.is_empty(), "run {run_id} is not in Redis");
    let events: Vec<Vec<u8>> = redis.lrange(format!("{key}:events"), 0, -1).await.unwrap();
    (header, events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_for_a_task_the_worker_does_not_hold_is_refused() {
    let mut cluster = Cluster::start().await;
    let records = Records::new(cluster.dir().join("records"));
    // The real worker's agent holds its task until the test creates the "release" mark.
    let agents = records.agents_file(
        "worker-1",
        &[("held", vec!["rendezvous.sh", "work", "release"])],
    );
    cluster.start_worker("worker-1", &agents, 1);
    cluster.wait_for_workers(&["worker-1"]).await;
    let mut client = cluster.client().await;
    let workflow = br#"{"id": "held", "steps": [
        {"id": "work", "type": "agent", "agent": "held"},
        {"id": "queued", "type": "agent", "agent": "nobody-serves-this"}
    ]}"#;
    let run_id = harness::submit(&mut client, workflow.to_vec(), &json!("x")).await;
    let get = || GetRunRequest {
        run_id: run_id.clone(),
    };
    let deadline = std::time::Instant::now() + harness::DEADLINE;
    let before = loop {
        let record = client.get_run(get()).await.unwrap().into_inner();
        if step(&record, "work").status == "running" {
            break record;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never ran: {record:#?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    assert_eq!(step(&before, "work").worker_id, "worker-1");
    let mut redis = cluster.redis_connection().await;
    let stored_before = stored(&mut redis, &run_id).await;

    // A fake worker: it says hello, serving another agent, and answers tasks it never got: the
    // one worker-1 is running, one of a step not started yet, one of no run, and a malformed id.
    let (outbound, receiver) = tokio::sync::mpsc::channel(16);
    outbound
        .send(worker_message(worker_message::Message::Hello(Hello {
            worker_id: "impostor".to_owned(),
            agents: vec!["something-else".to_owned()],
            capacity: 1,
            cache_bytes: 0,
            protocol: baton_proto::WORKER_PROTOCOL,
            held: Vec::new(),
        })))
        .await
        .unwrap();
    let mut workers = WorkerServiceClient::connect(cluster.url().to_owned())
        .await
        .unwrap();
    let mut inbound = workers
        .task_stream(tokio_stream::wrappers::ReceiverStream::new(receiver))
        .await
        .expect("TaskStream")
        .into_inner();
    let forged = |task_id: &str| {
        worker_message(worker_message::Message::Result(TaskResult {
            task_id: task_id.to_owned(),
            outcome: Some(task_result::Outcome::Data(Json::new(
                br#"{"forged": true}"#.to_vec(),
            ))),
            notes: None,
            non_retryable: false,
            usage: Vec::new(),
        }))
    };
    let held_elsewhere = format!("{run_id}/work#1");
    let not_started = format!("{run_id}/queued#1");
    let no_run = "01900000-0000-7000-8000-000000000000/work#1";
    for task_id in [
        held_elsewhere.as_str(),
        &not_started,
        no_run,
        "not-a-task-id",
    ] {
        outbound.send(forged(task_id)).await.unwrap();
        let message = tokio::time::timeout(harness::DEADLINE, inbound.message())
            .await
            .expect("an answer to the forged result")
            .expect("the stream stays open")
            .expect("a message");
        match message.message {
            Some(coordinator_message::Message::Rejected(rejected)) => {
                assert_eq!(rejected.task_id, task_id);
                assert!(
                    rejected.message.contains(task_id),
                    "the rejection names the task: {}",
                    rejected.message
                );
            }
            other => panic!("expected TaskRejected for {task_id}, got {other:?}"),
        }
    }

    // The run did not move, and Redis holds no result.
    let after = client.get_run(get()).await.unwrap().into_inner();
    assert_eq!(after, before);
    assert_eq!(context(&after), json!({}));
    assert_eq!(stored(&mut redis, &run_id).await, stored_before);
    let results: i64 = redis
        .hlen(format!("{}:results", run_key(&run_id)))
        .await
        .unwrap();
    assert_eq!(results, 0);

    // The real worker's answer still counts.
    let mut watch = Watch::start(&mut client, &run_id).await;
    std::fs::write(records.root().join(format!("{run_id}.release.arrived")), "").unwrap();
    let deadline = std::time::Instant::now() + harness::DEADLINE;
    loop {
        let record = client.get_run(get()).await.unwrap().into_inner();
        if step(&record, "work").status == "succeeded" {
            assert_eq!(
                context(&record)["work"],
                json!({"branch": "work", "met": "release", "worker": "worker-1"})
            );
            assert_eq!(step(&record, "queued").status, "queued");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never finished: {record:#?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    client
        .cancel_run(CancelRunRequest {
            run_id: run_id.clone(),
            reason: "done".to_owned(),
        })
        .await
        .unwrap();
    assert_eq!(watch.finished().await.status, "cancelled");
}

/// Submits the feature-development workflow, approves the plan as soon as it asks, and returns
/// the run id and final record.
async fn run_feature_development(cluster: &Cluster) -> (String, baton_proto::v1::RunRecord) {
    let mut client = cluster.client().await;
    let run_id = harness::submit(&mut client, feature_workflow(), &json!(spec::INPUT)).await;
    let mut watch = Watch::start(&mut client, &run_id).await;
    watch.approval("approve-plan").await;
    client
        .decide_approval(decision(&run_id, true, ""))
        .await
        .expect("DecideApproval");
    let record = watch.finished().await;
    assert_eq!(record.status, "succeeded", "{record:#?}");
    (run_id, record)
}

/// Scheduling and the store change nothing an agent or a client sees: two workers on Redis and
/// one worker on the memory store give the same context and payloads, and both state chains
/// hold (each chain starts from its own run id, so the heads differ).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_and_payloads_leave_workers_and_the_store_out() {
    // Two workers on Redis...
    let mut on_redis = Cluster::start().await;
    let redis_records = Records::new(on_redis.dir().join("records"));
    on_redis
        .start_spec_workers(&redis_records, &["worker-1", "worker-2"])
        .await;
    // ...and one worker running one task at a time, on a coordinator with `--memory`.
    let mut in_memory = Cluster::start_memory().await;
    let memory_records = Records::new(in_memory.dir().join("records"));
    let agents = memory_records.spec_agents_file("solo");
    in_memory.start_worker("solo", &agents, 1);
    in_memory.wait_for_workers(&["solo"]).await;

    let (redis_run, a) = run_feature_development(&on_redis).await;
    let (memory_run, b) = run_feature_development(&in_memory).await;
    assert_eq!(context(&a), context(&b));
    assert_eq!(a.state_sha256.len(), 64);
    for (cluster, run_id, record) in [(&on_redis, &redis_run, &a), (&in_memory, &memory_run, &b)] {
        let verified = cluster
            .client()
            .await
            .verify_run(baton_proto::v1::VerifyRunRequest {
                run_id: run_id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(verified.ok, "{verified:?}");
        assert_eq!(verified.state_sha256, record.state_sha256);
    }
    let workers = |r: &baton_proto::v1::RunRecord| {
        r.steps
            .iter()
            .map(|s| s.worker_id.clone())
            .collect::<Vec<_>>()
    };
    assert_ne!(
        workers(&a),
        workers(&b),
        "different scheduling, same context"
    );
    let payloads = |records: &Records, run_id: &str| {
        records
            .of_run(run_id)
            .into_iter()
            .map(|r| (r.step_id, r.n, r.payload))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        payloads(&redis_records, &redis_run),
        payloads(&memory_records, &memory_run)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_survives_a_coordinator_restart() {
    let mut cluster = Cluster::start().await;
    let records = Records::new(cluster.dir().join("records"));
    cluster
        .start_spec_workers(&records, &["worker-1", "worker-2"])
        .await;
    let mut client = cluster.client().await;
    let run_id = harness::submit(&mut client, feature_workflow(), &json!(spec::INPUT)).await;
    let mut watch = Watch::start(&mut client, &run_id).await;
    watch.approval("approve-plan").await;
    let before = client
        .get_run(GetRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    drop((watch, client));

    // A new coordinator on the same Redis knows the run from what is stored.
    cluster.restart_coordinator().await;
    cluster.wait_for_workers(&["worker-1", "worker-2"]).await;
    let mut client = cluster.client().await;
    let after = client
        .get_run(GetRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .expect("the restarted coordinator finds the run")
        .into_inner();
    assert_eq!(after.status, "running");
    assert_eq!(after.state_sha256, before.state_sha256);
    assert_eq!(context(&after), context(&before));
    assert_eq!(after.waiting, before.waiting);
    assert_eq!(
        step(&after, "plan").worker_id,
        step(&before, "plan").worker_id
    );

    let mut watch = Watch::start(&mut client, &run_id).await;
    client
        .decide_approval(decision(&run_id, true, ""))
        .await
        .expect("DecideApproval after the restart");
    let record = watch.finished().await;
    assert_eq!(record.status, "succeeded", "{record:#?}");
    assert_eq!(
        context(&record),
        spec::final_context(&json!({"approved": true}))
    );
    let received = records.by_step(&run_id);
    for (step_id, payload) in spec::payloads(&json!({"approved": true})) {
        assert_eq!(
            received[&(step_id.to_owned(), 1)].payload,
            payload,
            "the payload of {step_id}"
        );
    }
    assert_eq!(received.len(), 5, "no agent ran twice: {received:#?}");
}

/// SIGTERM on a worker (what Kubernetes sends a pod it stops): it takes no new task, finishes
/// the one it runs, answers it, and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_worker_finish_its_task_before_it_exits() {
    let mut cluster = Cluster::start().await;
    let records = Records::new(cluster.dir().join("records"));
    let agents = records.agents_file("leaving", &[("slow", vec!["slow-agent.sh", "1"])]);
    cluster.start_worker("leaving", &agents, 2);
    cluster.wait_for_workers(&["leaving"]).await;
    let mut client = cluster.client().await;
    let workflow =
        br#"{"id": "slow", "steps": [{"id": "s", "type": "agent", "agent": "slow"}]}"#.to_vec();
    let run_id = harness::submit(&mut client, workflow.clone(), &json!("x")).await;
    let started = records
        .root()
        .join("leaving")
        .join(format!("{run_id}.started"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !started.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    cluster.terminate_worker("leaving");
    let status = cluster.worker_exit("leaving").await;
    assert!(status.success(), "the worker exits 0: {status}");
    let record = client
        .get_run(GetRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(record.status, "succeeded", "{record:#?}");
    assert_eq!(context(&record), json!({"s": "done after 1 s"}));
    let logs = cluster.logs();
    assert!(logs.contains("worker draining"), "{logs}");
}
