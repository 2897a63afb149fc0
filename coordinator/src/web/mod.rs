//! The web UI, served on the coordinator's HTTP port beside `/metrics`: the pages, their
//! assets (embedded in the binary: no separate server, no build step) and the JSON API they
//! call. Every coordinator serves it, reading runs from the store, so any one will do.
//!
//! - `pages`: the HTML, JavaScript and CSS, with the headers that keep them to themselves.
//! - `api`: the JSON API, a thin edge over [`Coordinator`] like the gRPC one: each handler
//!   admits its caller, checks what it names as the gRPC edge does (`crate::run_requests`),
//!   calls the coordinator and answers in JSON.
//! - `events`: a run's watch as server-sent events.
//! - `access`: who may call, decided as for gRPC, through one extractor every handler takes
//!   (`Admitted<rpc::X>`); changes only from the coordinator's pages.
//! - `host`: in protected mode, only a `Host` naming this machine (DNS rebinding).
//! - [`graph`]: a workflow laid out top to bottom, as a pure function.
//! - [`record_json`]: a run record and watch events as JSON (the CLI's `--json` too).
//! - `error`: the API's error, from the coordinator's through its gRPC status.
//! - `extract`: the query string, path and body of an API call, refused with that error.

mod access;
mod api;
mod error;
mod events;
mod extract;
pub mod graph;
mod host;
mod pages;
pub mod record_json;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use crate::auth::Gate;
use crate::service::Coordinator;
use crate::store::Store;

/// The most bytes of a request body (an approval's comment, a cancel's reason).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// An API path that names nothing: a 404 the layer above answers in JSON.
async fn api_not_found() -> axum::http::StatusCode {
    axum::http::StatusCode::NOT_FOUND
}

/// What the web UI serves from.
pub struct Web<S: Store> {
    coordinator: Coordinator<S>,
    gate: Arc<Gate>,
    /// `--trace-url`: a link to a run's trace, `{trace_id}` replaced.
    trace_url: Option<String>,
}

/// The pages and the API, to merge into the HTTP port's router. Serve it with
/// `into_make_service_with_connect_info::<SocketAddr>()`: protected mode admits callers by
/// their address.
pub fn router<S: Store>(
    coordinator: Coordinator<S>,
    gate: Arc<Gate>,
    trace_url: Option<String>,
) -> Router {
    let web = Arc::new(Web {
        coordinator,
        gate: gate.clone(),
        trace_url,
    });
    Router::new()
        .route("/", get(pages::index))
        .route("/runs/{run_id}", get(pages::index))
        .route("/assets/{file}", get(pages::asset))
        .route("/api/session", get(api::session::<S>))
        .route("/api/runs", get(api::list_runs::<S>))
        .route("/api/runs/{run_id}", get(api::get_run::<S>))
        .route("/api/runs/{run_id}/graph", get(api::run_graph::<S>))
        .route("/api/runs/{run_id}/steps/{step_id}", get(api::step::<S>))
        .route("/api/runs/{run_id}/events", get(events::run_events::<S>))
        .route(
            "/api/runs/{run_id}/approvals/{step_id}",
            post(api::decide::<S>),
        )
        .route("/api/runs/{run_id}/cancel", post(api::cancel::<S>))
        .route("/api/runs/{run_id}/retry", post(api::retry::<S>))
        .route("/api/runs/{run_id}/verify", post(api::verify::<S>))
        .route("/api/{*unknown}", axum::routing::any(api_not_found))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(error::unrouted_in_json))
        // Outermost: a page of another site rebound to this machine gets nothing, not a page.
        .layer(axum::middleware::from_fn_with_state(
            gate,
            host::refuse_rebound,
        ))
        .with_state(web)
}
