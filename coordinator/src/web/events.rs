//! A run's watch as server-sent events: what makes the run page move without a reload. Any
//! coordinator serves it, as any serves `WatchRun`: the watch catches up from the store.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use baton_proto::v1;
use futures::{Stream, StreamExt};
use serde_json::json;

use super::Web;
use super::access::{Admitted, rpc};
use super::error::ApiError;
use super::extract::ApiPath;
use super::record_json::event_to_json;
use crate::run_requests;
use crate::store::Store;

/// The caller may give its token as `?access_token=` ([`Admitted`] reads it): an EventSource
/// cannot send an `Authorization` header.
pub async fn run_events<S: Store>(
    State(web): State<Arc<Web<S>>>,
    ApiPath(run_id): ApiPath<String>,
    _: Admitted<rpc::WatchRun>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let run_id = run_requests::run_id("run id", &run_id)?;
    let watch = web.coordinator.watch(run_id).await?;
    let events = watch.filter_map(|event| async move {
        Some(Ok(match event {
            Ok(event) => {
                let (name, data) = event_to_json(&v1::RunEvent::from(event))?;
                Event::default().event(name).data(data.to_string())
            }
            // The watch ends after an error; the page falls back to reading the run.
            Err(error) => {
                let error = ApiError::from(error);
                Event::default()
                    .event("error")
                    .data(json!({ "error": error.message }).to_string())
            }
        }))
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}
