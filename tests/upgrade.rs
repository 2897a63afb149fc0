//! Rolling upgrades: while a Deployment rolls, coordinators and workers of adjacent versions
//! meet. A coordinator serves workers of its own protocol and the one before (coordinators roll
//! first, then workers); a worker of a newer protocol is told to wait for the coordinators.
//!
//! The previous version's worker is played on the wire: it says hello with
//! `WORKER_PROTOCOL - 1` and speaks only that protocol's messages (no live output, no token
//! usage in its results), beside a real `baton worker` of this version in the same run.

#[path = "support/cluster.rs"]
mod harness;
#[path = "support/spec.rs"]
mod spec;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use baton_proto::Json;
use baton_proto::v1::worker_service_client::WorkerServiceClient;
use baton_proto::v1::{
    GetRunRequest, Hello, RunRecord, SubmitRunRequest, TaskResult, coordinator_message,
    task_result, worker_message,
};
use harness::{DEADLINE, LoneCoordinator, baton, step, worker_message};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// A worker stream as a worker of protocol `protocol` opens it.
async fn hello(
    url: &str,
    protocol: u32,
    agents: &[&str],
) -> (
    mpsc::Sender<baton_proto::v1::WorkerMessage>,
    Result<tonic::Streaming<baton_proto::v1::CoordinatorMessage>, tonic::Status>,
) {
    let (outbound, receiver) = mpsc::channel(16);
    outbound
        .send(worker_message(worker_message::Message::Hello(Hello {
            worker_id: format!("protocol-{protocol}"),
            agents: agents.iter().map(|a| a.to_string()).collect(),
            capacity: 1,
            cache_bytes: 0,
            protocol,
            held: Vec::new(),
        })))
        .await
        .unwrap();
    let mut client = WorkerServiceClient::connect(url.to_owned()).await.unwrap();
    let stream = client
        .task_stream(ReceiverStream::new(receiver))
        .await
        .map(|response| response.into_inner());
    (outbound, stream)
}

/// A `baton worker` of this version, killed on drop.
struct RealWorker(Child);

impl Drop for RealWorker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn until_finished(
    client: &mut baton_proto::v1::run_service_client::RunServiceClient<tonic::transport::Channel>,
    run_id: &str,
) -> RunRecord {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let record = client
            .get_run(GetRunRequest {
                run_id: run_id.to_owned(),
            })
            .await
            .unwrap()
            .into_inner();
        if record.status != "running" {
            return record;
        }
        assert!(Instant::now() < deadline, "never finished: {record:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_of_the_previous_protocol_works_beside_this_version_in_one_run() {
    let coordinator = LoneCoordinator::start(&["--memory"], &[]).await;
    let previous = baton_proto::WORKER_PROTOCOL - 1;
    let (outbound, stream) = hello(coordinator.url(), previous, &["planner"]).await;
    let mut inbound = stream.expect("a worker of the previous protocol is served");

    // This version's worker serves the step after.
    let dir = tempfile::tempdir().unwrap();
    let agents = dir.path().join("agents.toml");
    std::fs::write(
        &agents,
        "[agents.coder]\nkind = \"template\"\ntemplate = '{\"built\": {{json plan.files}} }'\n",
    )
    .unwrap();
    let _real = RealWorker(
        baton()
            .args(["worker", "--id", "this-version", "--agents"])
            .arg(&agents)
            .args([
                "--coordinator",
                coordinator.url(),
                "--metrics-listen",
                "127.0.0.1:0",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

    let mut client = coordinator.client().await;
    let workflow = json!({"steps": [
        {"id": "plan", "type": "agent", "agent": "planner", "next": "code"},
        {"id": "code", "type": "agent", "agent": "coder", "input": "plan"}
    ]});
    let run_id = client
        .submit_run(SubmitRunRequest {
            workflow: workflow.to_string().into_bytes(),
            input: Some(Json::new(br#""dark mode""#.to_vec())),
            idempotency_key: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;

    // The old worker gets the plan's task and answers as its protocol does: data, no usage.
    let task = loop {
        let message = tokio::time::timeout(DEADLINE, inbound.message())
            .await
            .expect("a task within the deadline")
            .expect("the stream stays open")
            .expect("a message");
        if let Some(coordinator_message::Message::Task(task)) = message.message {
            break task;
        }
    };
    assert_eq!(
        (task.run_id.as_str(), task.step_id.as_str()),
        (run_id.as_str(), "plan")
    );
    outbound
        .send(worker_message(worker_message::Message::Result(
            TaskResult {
                task_id: task.task_id,
                outcome: Some(task_result::Outcome::Data(Json::new(
                    br#"{"files": ["src/theme.ts"]}"#.to_vec(),
                ))),
                ..TaskResult::default()
            },
        )))
        .await
        .unwrap();

    let record = until_finished(&mut client, &run_id).await;
    assert_eq!(
        record.status,
        "succeeded",
        "{}\n{}",
        record.error,
        coordinator.log()
    );
    assert_eq!(
        step(&record, "plan").worker_id,
        format!("protocol-{previous}")
    );
    assert_eq!(step(&record, "code").worker_id, "this-version");
    let context: serde_json::Value =
        serde_json::from_slice(&record.context.as_ref().unwrap().json).unwrap();
    assert_eq!(context["code"], json!({"built": ["src/theme.ts"]}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_outside_the_two_protocols_are_told_which_side_to_upgrade() {
    let coordinator = LoneCoordinator::start(&["--memory"], &[]).await;
    let (_newer, refused) = hello(
        coordinator.url(),
        baton_proto::WORKER_PROTOCOL + 1,
        &["planner"],
    )
    .await;
    let refused = refused.expect_err("a newer worker waits for the coordinators");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("upgrade the coordinators first"),
        "{}",
        refused.message()
    );

    let (_older, refused) = hello(
        coordinator.url(),
        baton_proto::WORKER_PROTOCOL - 2,
        &["planner"],
    )
    .await;
    let refused = refused.expect_err("two versions back is too old");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("upgrade the worker"),
        "{}",
        refused.message()
    );
}
