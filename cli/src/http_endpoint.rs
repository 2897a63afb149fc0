//! The HTTP port `baton coordinator` and `baton worker` serve beside gRPC: `/metrics` for
//! Prometheus, `/healthz` and `/readyz` for kubelet and Docker probes, and on a coordinator the
//! web UI. Plain HTTP on its own port, so probes work whether or not the gRPC port uses TLS,
//! and carry no credentials.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::Context as _;
use axum::http::{StatusCode, header};

/// Whether the process should be sent work now: `Err` carries the reason `/readyz` shows.
pub type Readiness =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// Serves `/metrics` (the text `render` produces), `/healthz` (200 while the process answers at
/// all) and `/readyz` (200 or 503 with `ready`'s reason) on `listener`, with the routes of
/// `more` (the coordinator's web UI), until the task is dropped or aborted.
pub async fn serve(
    listener: tokio::net::TcpListener,
    render: impl Fn() -> String + Clone + Send + Sync + 'static,
    ready: Readiness,
    more: axum::Router,
) -> std::io::Result<()> {
    let app = more
        .route(
            "/metrics",
            axum::routing::get(move || {
                let render = render.clone();
                async move {
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        render(),
                    )
                }
            }),
        )
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
        .route(
            "/readyz",
            axum::routing::get(move || {
                let ready = ready.clone();
                async move {
                    match ready().await {
                        Ok(()) => (StatusCode::OK, "ready\n".to_owned()),
                        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
                    }
                }
            }),
        );
    // The web UI admits callers by their address in protected mode.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}

/// Where the HTTP port listens: the address given, else `default`.
///
/// An address given explicitly that is taken is an error: the operator's probes and scrape
/// configs point at it. The default taken (a second process on one machine, as the README's
/// cluster recipe starts) is only a warning, and a free port on the same interface is used; the
/// log names it.
pub async fn bind(
    given: Option<SocketAddr>,
    default: SocketAddr,
) -> anyhow::Result<tokio::net::TcpListener> {
    let address = given.unwrap_or(default);
    let listener = match tokio::net::TcpListener::bind(address).await {
        Ok(listener) => listener,
        Err(error) if given.is_none() && error.kind() == std::io::ErrorKind::AddrInUse => {
            let free = SocketAddr::new(default.ip(), 0);
            let listener = tokio::net::TcpListener::bind(free)
                .await
                .with_context(|| format!("cannot serve metrics on {free}"))?;
            tracing::warn!(
                default = %default,
                address = %listener.local_addr()?,
                "the default HTTP port is taken (another Baton process on this machine?); \
                 serving /metrics, /healthz, /readyz (and a coordinator's web UI) on a free \
                 port instead; give --metrics-listen to choose one"
            );
            return Ok(listener);
        }
        Err(error) => {
            return Err(crate::port_in_use::bind_error(
                "serve metrics on",
                address,
                "--metrics-listen",
                error,
            ));
        }
    };
    tracing::info!(
        address = %listener.local_addr()?,
        "serving /metrics, /healthz and /readyz"
    );
    Ok(listener)
}
