//! The `/metrics` endpoint Prometheus scrapes, served by `baton coordinator` and `baton worker`
//! alike: one HTTP route answering with the text the process's registry renders.

use std::net::SocketAddr;

/// Serves `GET /metrics` on `listener` until `shutdown` completes, with the text `render`
/// produces.
pub async fn serve(
    listener: tokio::net::TcpListener,
    render: impl Fn() -> String + Clone + Send + Sync + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let render = render.clone();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    render(),
                )
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Binds the metrics listener, saying where it listens (port 0 picks a free one).
pub async fn bind(address: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    tracing::info!(address = %listener.local_addr()?, "metrics listening on /metrics");
    Ok(listener)
}
