//! The worker's side of the task stream, against fake coordinators that record what it says and
//! say what a test wants: its hello, its heartbeats, where it goes after a lost stream or a
//! goodbye, and what its results say about retrying.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_proto::Json;
use baton_proto::v1::worker_service_server::{WorkerService, WorkerServiceServer};
use baton_proto::v1::{
    CoordinatorMessage, Goodbye, Hello, QueryDecisionsResponse, Task, TaskResult, WorkerMessage,
    WorkerQueryDecisionsRequest, coordinator_message, task_result, worker_message,
};
use baton_worker::{Failure, Worker};
use futures::Stream;
use serde_json::json;
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::{Request, Response, Status, Streaming};

/// Long enough for anything on loopback; only reached when something is broken.
const PATIENCE: Duration = Duration::from_secs(20);

type Outbound = mpsc::UnboundedSender<Result<CoordinatorMessage, Status>>;

/// What a fake coordinator saw on its streams, in order.
#[derive(Debug)]
enum Seen {
    Message(WorkerMessage),
    /// The worker closed the stream (or it broke).
    Ended,
}

/// A coordinator on a loopback port that records every message and sends what it is told to
/// on the latest stream.
struct FakeCoordinator {
    url: String,
    seen: mpsc::UnboundedReceiver<Seen>,
    to_worker: Arc<Mutex<Option<Outbound>>>,
}

struct FakeService {
    seen: mpsc::UnboundedSender<Seen>,
    to_worker: Arc<Mutex<Option<Outbound>>>,
}

#[tonic::async_trait]
impl WorkerService for FakeService {
    type TaskStreamStream =
        Pin<Box<dyn Stream<Item = Result<CoordinatorMessage, Status>> + Send + 'static>>;

    async fn task_stream(
        &self,
        request: Request<Streaming<WorkerMessage>>,
    ) -> Result<Response<Self::TaskStreamStream>, Status> {
        let mut inbound = request.into_inner();
        let (outbound, messages) = mpsc::unbounded_channel();
        *self.to_worker.lock().unwrap() = Some(outbound);
        let seen = self.seen.clone();
        tokio::spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                let _ = seen.send(Seen::Message(message));
            }
            let _ = seen.send(Seen::Ended);
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(
            messages,
        ))))
    }

    async fn query_decisions(
        &self,
        _request: Request<WorkerQueryDecisionsRequest>,
    ) -> Result<Response<QueryDecisionsResponse>, Status> {
        Err(Status::unimplemented("a fake coordinator"))
    }
}

impl FakeCoordinator {
    async fn start() -> FakeCoordinator {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (seen_sender, seen) = mpsc::unbounded_channel();
        let to_worker = Arc::new(Mutex::new(None));
        let service = FakeService {
            seen: seen_sender,
            to_worker: to_worker.clone(),
        };
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(WorkerServiceServer::new(service))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        FakeCoordinator {
            url,
            seen,
            to_worker,
        }
    }

    /// The next thing seen that is not a heartbeat (bounded: heartbeats alone do not count).
    async fn next_seen(&mut self) -> Seen {
        let skipping_heartbeats = async {
            loop {
                match self.seen.recv().await.expect("the fake coordinator runs") {
                    Seen::Message(WorkerMessage {
                        message: Some(worker_message::Message::Heartbeat(_)),
                    }) => continue,
                    seen => return seen,
                }
            }
        };
        tokio::time::timeout(PATIENCE, skipping_heartbeats)
            .await
            .expect("the worker said nothing but heartbeats")
    }

    async fn next_message(&mut self) -> worker_message::Message {
        match self.next_seen().await {
            Seen::Message(WorkerMessage {
                message: Some(message),
            }) => message,
            other => panic!("expected a message, got {other:?}"),
        }
    }

    async fn hello(&mut self) -> Hello {
        match self.next_message().await {
            worker_message::Message::Hello(hello) => hello,
            other => panic!("expected a hello, got {other:?}"),
        }
    }

    async fn result(&mut self) -> TaskResult {
        match self.next_message().await {
            worker_message::Message::Result(result) => result,
            other => panic!("expected a result, got {other:?}"),
        }
    }

    /// Waits for the worker to close the stream.
    async fn stream_ended(&mut self) {
        match self.next_seen().await {
            Seen::Ended => {}
            other => panic!("expected the stream to end, got {other:?}"),
        }
    }

    fn send(&self, message: coordinator_message::Message) {
        let to_worker = self.to_worker.lock().unwrap();
        to_worker
            .as_ref()
            .expect("a worker is connected")
            .send(Ok(CoordinatorMessage {
                message: Some(message),
            }))
            .expect("the stream is open");
    }

    /// A task for `agent` with input `"x"` and no history, its parts sent along.
    fn send_task(&self, task_id: &str, agent: &str, attempt: u32) {
        let (input, messages) = (Json::new(b"\"x\"".to_vec()), Json::new(b"[]".to_vec()));
        let manifest = json!({"input": input.sha256, "context": [], "messages": messages.sha256});
        self.send(coordinator_message::Message::Task(Task {
            task_id: task_id.to_owned(),
            run_id: "run".to_owned(),
            step_id: "step".to_owned(),
            visit: 1,
            agent: agent.to_owned(),
            manifest: Some(Json::new(serde_json::to_vec(&manifest).unwrap())),
            parts: vec![input, messages],
            timeout_ms: 0,
            attempt,
            traceparent: String::new(),
            item: None,
        }));
    }

    /// Ends the stream from the coordinator's side, as a crash or a broken connection would.
    fn end_stream(&self) {
        self.to_worker.lock().unwrap().take();
    }
}

fn data_of(result: &TaskResult) -> serde_json::Value {
    match &result.outcome {
        Some(task_result::Outcome::Data(data)) => serde_json::from_slice(&data.json).unwrap(),
        other => panic!("expected data, got {other:?}"),
    }
}

fn error_of(result: &TaskResult) -> &str {
    match &result.outcome {
        Some(task_result::Outcome::Error(error)) => error,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// An agent `slow` that signals `started` when it runs and answers `"done"` once `release`
/// is notified.
fn slow_agent_worker(started: Arc<Notify>, release: Arc<Notify>) -> baton_worker::WorkerBuilder {
    Worker::builder()
        .id("w")
        .concurrency(2)
        .agent("slow", move |_task| {
            let (started, release) = (started.clone(), release.clone());
            async move {
                started.notify_one();
                release.notified().await;
                Ok(json!("done"))
            }
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_retryable_failure_says_so_in_its_result_and_a_plain_error_does_not() {
    let mut coordinator = FakeCoordinator::start().await;
    let worker = Worker::builder()
        .coordinator(coordinator.url.clone())
        .agent("refuse", |_task| async move {
            Err::<serde_json::Value, _>(Failure::non_retryable("the input names no file"))
        })
        .agent("flaky", |_task| async move {
            let reply: Result<serde_json::Value, String> = Err("the model timed out".to_owned());
            Ok(reply?)
        })
        .build();
    tokio::spawn(worker.run(std::future::pending()));
    coordinator.hello().await;

    coordinator.send_task("run/refuse#1@1", "refuse", 1);
    let result = coordinator.result().await;
    assert_eq!(result.task_id, "run/refuse#1@1");
    assert_eq!(error_of(&result), "the input names no file");
    assert!(result.non_retryable);

    coordinator.send_task("run/flaky#1@1", "flaky", 1);
    let result = coordinator.result().await;
    assert_eq!(error_of(&result), "the model timed out");
    assert!(!result.non_retryable, "a String error may be retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_sees_its_attempt_and_the_coordinator_that_sent_it() {
    let mut coordinator = FakeCoordinator::start().await;
    let worker = Worker::builder()
        .coordinator(coordinator.url.clone())
        .agent("echo", |task| async move {
            Ok(json!({"attempt": task.attempt, "coordinator": task.coordinator}))
        })
        .build();
    tokio::spawn(worker.run(std::future::pending()));
    let hello = coordinator.hello().await;
    assert_eq!(hello.protocol, baton_proto::WORKER_PROTOCOL);
    assert!(hello.held.is_empty(), "a new worker holds nothing");

    coordinator.send_task("run/step#1@3", "echo", 3);
    let result = coordinator.result().await;
    assert_eq!(
        data_of(&result),
        json!({"attempt": 3, "coordinator": coordinator.url})
    );
    assert!(!result.non_retryable);
}

/// The coordinator's stream ends while a task runs: the worker goes on to its next address,
/// names the task in its hello there, and answers it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_outliving_its_stream_is_held_in_the_next_hello_and_answered_there() {
    let (mut first, mut second) = (
        FakeCoordinator::start().await,
        FakeCoordinator::start().await,
    );
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let worker = slow_agent_worker(started.clone(), release.clone())
        .coordinators([first.url.clone(), second.url.clone()])
        .build();
    tokio::spawn(worker.run(std::future::pending()));
    first.hello().await;
    first.send_task("run/step#1@1", "slow", 1);
    tokio::time::timeout(PATIENCE, started.notified())
        .await
        .expect("the agent starts");

    first.end_stream();
    let hello = second.hello().await;
    assert_eq!(hello.held, ["run/step#1@1"]);
    // Its whole capacity: the held task counts against it once the coordinator adopts it.
    assert_eq!(hello.capacity, 2);

    release.notify_one();
    let result = second.result().await;
    assert_eq!(result.task_id, "run/step#1@1");
    assert_eq!(data_of(&result), json!("done"));
}

/// A goodbye (the coordinator is shutting down) ends the stream from the worker's side and
/// sends the worker to its next address; the task it runs carries on and is answered there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_goodbye_sends_the_worker_to_its_next_coordinator_with_its_task_still_running() {
    let (mut first, mut second) = (
        FakeCoordinator::start().await,
        FakeCoordinator::start().await,
    );
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let worker = slow_agent_worker(started.clone(), release.clone())
        .coordinator(format!("{},{}", first.url, second.url))
        .build();
    tokio::spawn(worker.run(std::future::pending()));
    first.hello().await;
    first.send_task("run/step#1@1", "slow", 1);
    tokio::time::timeout(PATIENCE, started.notified())
        .await
        .expect("the agent starts");

    first.send(coordinator_message::Message::Goodbye(Goodbye {}));
    first.stream_ended().await;
    let hello = second.hello().await;
    assert_eq!(hello.held, ["run/step#1@1"], "the task kept running");

    release.notify_one();
    let result = second.result().await;
    assert_eq!(result.task_id, "run/step#1@1");
    assert_eq!(data_of(&result), json!("done"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_come_at_the_configured_interval() {
    let mut coordinator = FakeCoordinator::start().await;
    let worker = Worker::builder()
        .coordinator(coordinator.url.clone())
        .concurrency(3)
        .heartbeat_interval(Duration::from_millis(50))
        .build();
    tokio::spawn(worker.run(std::future::pending()));
    coordinator.hello().await;
    // 40 are due in those 2 s; 5 leave room for a slow machine, and are more than the default
    // interval (a second) could give.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let mut heartbeats = 0;
    while heartbeats < 5 {
        let seen = tokio::time::timeout_at(deadline, coordinator.seen.recv())
            .await
            .unwrap_or_else(|_| panic!("only {heartbeats} heartbeats in 2 s"));
        match seen {
            Some(Seen::Message(WorkerMessage {
                message: Some(worker_message::Message::Heartbeat(beat)),
            })) => {
                assert_eq!(beat.free_capacity, 3);
                heartbeats += 1;
            }
            other => panic!("expected a heartbeat, got {other:?}"),
        }
    }
}
