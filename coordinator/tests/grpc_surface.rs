//! What any gRPC tool sees of a coordinator: health checking and reflection.

#[path = "support/running.rs"]
mod running;

use baton_coordinator::store::memory::MemoryStore;
use baton_coordinator::{Config, Coordinator};
use running::running;
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

async fn channel(url: String) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn serve() -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    tokio::spawn(baton_coordinator::grpc::serve(
        listener,
        coordinator.clone(),
        async move {
            let _ = stopped.await;
            drop(coordinator);
        },
    ));
    (url, stop)
}

#[tokio::test]
async fn health_checking_reports_both_services_serving() {
    let (url, _stop) = serve().await;
    let mut health = HealthClient::new(channel(url).await);
    for service in ["baton.v1.RunService", "baton.v1.WorkerService", ""] {
        let response = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|status| panic!("{service:?}: {status}"))
            .into_inner();
        assert_eq!(response.status(), ServingStatus::Serving, "{service:?}");
    }
}

#[tokio::test]
async fn reflection_lists_the_baton_services() {
    let (url, _stop) = serve().await;
    let mut reflection = ServerReflectionClient::new(channel(url).await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::once(request))
        .await
        .unwrap()
        .into_inner();
    let response = responses.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection answer: {response:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in [
        "baton.v1.RunService",
        "baton.v1.WorkerService",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
}

#[tokio::test]
async fn a_worker_of_another_protocol_is_refused_at_hello_naming_both_versions() {
    use baton_proto::v1::worker_service_client::WorkerServiceClient;
    use baton_proto::v1::{Hello, WorkerMessage, worker_message};
    let (url, _stop) = serve().await;
    let mut workers = WorkerServiceClient::new(channel(url).await);
    let hello = WorkerMessage {
        message: Some(worker_message::Message::Hello(Hello {
            worker_id: "old".into(),
            agents: vec!["planner".into()],
            capacity: 1,
            cache_bytes: 0,
            protocol: 1,
            held: Vec::new(),
        })),
    };
    let status = workers
        .task_stream(tokio_stream::iter([hello]))
        .await
        .expect_err("an old worker is refused");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("protocol 1")
            && status
                .message()
                .contains(&baton_proto::WORKER_PROTOCOL.to_string()),
        "{}",
        status.message()
    );
}
