//! The gRPC edge: decode, convert to the service's domain types, call the service, convert
//! back, map the error. Nothing about runs is decided here; no `baton.v1` type goes below it.
//!
//! - [`run_service`]: `baton.v1.RunService` for clients.
//! - [`worker_service`]: `baton.v1.WorkerService`, the workers' long-lived task stream.
//! - [`requests`]: proto requests into domain types, with the checks of what the wire carries
//!   (digests, sizes, depth, the limits on an answer's notes).
//! - `replies`: domain types back into proto messages.
//! - `status`: the coordinator's errors as gRPC status codes, the one place they are mapped.
//! - [`faults`]: a test hook that corrupts payloads on the wire.
//! - [`tls`]: TLS and mTLS on the port, certificates reloaded from disk.
//!
//! Every call passes the [`crate::auth`] gate first (health checks pass it without
//! credentials).

pub mod faults;
mod replies;
pub mod requests;
pub mod run_service;
mod status;
pub mod tls;
pub mod worker_service;

use std::future::Future;
use std::time::Duration;

use baton_proto::v1::run_service_server::RunServiceServer;
use baton_proto::v1::worker_service_server::WorkerServiceServer;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

pub use self::faults::Faults;
use self::tls::Tls;
use crate::auth::{Gate, GateLayer};
use crate::service::Coordinator;
use crate::store::Store;

/// Accepted connections, with Nagle's algorithm off: small messages (a task, a result) go out at
/// once instead of waiting up to 40 ms for a delayed ACK.
fn incoming(
    listener: TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures::StreamExt::map(TcpListenerStream::new(listener), |connection| {
        let stream = connection?;
        stream.set_nodelay(true)?;
        Ok(stream)
    })
}

/// Resolves once the server starts shutting down.
pub(crate) async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopping| *stopping).await;
}

/// Largest gRPC message accepted: room for a payload that carries a large context.
pub const MAX_MESSAGE_BYTES: usize = 96 << 20;

/// Who may call, and over what: the gate, and TLS when configured.
#[derive(Clone)]
pub struct Security {
    pub gate: std::sync::Arc<Gate>,
    pub tls: Option<Tls>,
}

impl Security {
    /// Plaintext, loopback clients only (protected mode): what a server with nothing
    /// configured does.
    pub fn protected() -> Self {
        Self {
            gate: Gate::loopback_only(),
            tls: None,
        }
    }
}

/// Serves the run and worker services, health checking and reflection on `listener` until
/// `shutdown` completes, in protected mode ([`Security::protected`]). Shutdown ends the long-lived streams (workers' task streams, run
/// watches) at once, so that workers reconnect to another coordinator instead of holding on to
/// one that no longer accepts anything, and the graceful shutdown can finish.
pub async fn serve<S: Store>(
    listener: TcpListener,
    coordinator: Coordinator<S>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    serve_with(
        listener,
        coordinator,
        shutdown,
        Security::protected(),
        Faults::none(),
    )
    .await
}

/// [`serve`], with the given security, and faults injected on the wire (tests only).
pub async fn serve_with<S: Store>(
    listener: TcpListener,
    coordinator: Coordinator<S>,
    shutdown: impl Future<Output = ()> + Send,
    security: Security,
    faults: Faults,
) -> Result<(), tonic::transport::Error> {
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<RunServiceServer<run_service::Runs<S>>>()
        .await;
    health_reporter
        .set_serving::<WorkerServiceServer<worker_service::Workers<S>>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(baton_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .expect("the descriptor sets are valid");
    let (stopping, stop) = tokio::sync::watch::channel(false);
    let shutdown = async move {
        shutdown.await;
        let _ = stopping.send(true);
    };
    let runs = RunServiceServer::new(run_service::Runs::new(coordinator.clone(), stop.clone()))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let workers = worker_service::Workers::new(coordinator, stop).with_faults(faults);
    let workers = WorkerServiceServer::new(workers)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    // The watchers of the tokens file and the certificate end with the server.
    let watchers: Vec<_> = [security.gate.watch(), security.tls.as_ref().map(Tls::watch)]
        .into_iter()
        .flatten()
        .map(|task| AbortOnDrop(task.abort_handle()))
        .collect();
    let router = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .layer(GateLayer(security.gate))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(runs)
        .add_service(workers);
    let served = match &security.tls {
        Some(tls) => {
            router
                .serve_with_incoming_shutdown(tls.incoming(listener), shutdown)
                .await
        }
        None => {
            router
                .serve_with_incoming_shutdown(incoming(listener), shutdown)
                .await
        }
    };
    drop(watchers);
    served
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
