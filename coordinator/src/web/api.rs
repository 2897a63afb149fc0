//! The JSON API the pages call. Each handler admits the caller as the RPC it stands for
//! would ([`Admitted`]), checks what it names as the gRPC edge does ([`run_requests`]), calls
//! the coordinator, and answers in the JSON `baton ... --json` prints ([`record_json`]).
//!
//! A run record and its waits go to JSON through their `baton.v1` messages, as the CLI's do,
//! so that both print the same; no `baton.v1` request is built here.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use baton_core::RunStatus;
use baton_proto::v1;
use serde::Deserialize;
use serde_json::{Value, json};

use super::access::{self, Admitted, rpc};
use super::error::ApiError;
use super::extract::{ApiPath, ApiQuery, json_body};
use super::record_json::{record_to_json, waiting_to_json};
use super::{Web, graph};
use crate::auth::Access;
use crate::record::RunRecord;
use crate::run_requests::{self, DecisionAsked};
use crate::store::{RunCursor, RunQuery, Store, run_status};

fn record_json(record: RunRecord) -> Json<Value> {
    Json(record_to_json(&v1::RunRecord::from(record)))
}

pub async fn session<S: Store>(
    State(web): State<Arc<Web<S>>>,
    Admitted { caller, .. }: Admitted<rpc::Session>,
) -> Result<Json<Value>, ApiError> {
    let auth_required = matches!(web.gate.access(), Access::Principals(_) | Access::Certified);
    Ok(Json(json!({
        "auth_required": auth_required,
        "principal": caller.name(),
        "roles": access::roles(&caller),
        "trace_url": web.trace_url,
    })))
}

/// `?status=&workflow=&limit=&cursor=`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    status: Option<String>,
    workflow: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
}

/// The most runs one page of the list shows.
pub const MAX_PAGE: usize = 200;
const DEFAULT_PAGE: usize = 50;

pub async fn list_runs<S: Store>(
    State(web): State<Arc<Web<S>>>,
    ApiQuery(params): ApiQuery<ListParams>,
    _: Admitted<rpc::ListRuns>,
) -> Result<Json<Value>, ApiError> {
    let status = match params.status.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(name) => Some(run_status(name).ok_or_else(|| {
            ApiError::invalid(format!(
                "status: {name:?} is not a run status (running, succeeded, failed, cancelled)"
            ))
        })?),
    };
    let after = match params.cursor.as_deref().filter(|c| !c.is_empty()) {
        None => None,
        Some(cursor) => Some(RunCursor::from_token(cursor).ok_or_else(|| {
            ApiError::invalid(format!(
                "cursor: {cursor:?} is not a page cursor this coordinator gave"
            ))
        })?),
    };
    let query = RunQuery {
        limit: params.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE),
        after,
        status,
        workflow_id: run_requests::workflow_filter(
            "workflow",
            params.workflow.unwrap_or_default(),
            web.coordinator.config(),
        )?,
    };
    let page = web.coordinator.list(query).await?;
    let running: Vec<String> = page
        .runs
        .iter()
        .filter(|run| run.status == RunStatus::Running)
        .map(|run| run.run_id.clone())
        .collect();
    let mut waits = web.coordinator.waits_live(&running).await.into_iter();
    let rows: Vec<Value> = page
        .runs
        .into_iter()
        .map(|run| {
            let mut row = json!({
                "run_id": run.run_id,
                "workflow_id": run.workflow_id,
                "status": run.status,
                "created_ms": run.created_ms,
                "updated_ms": run.updated_ms,
            });
            // A run that cannot be read now is listed without its waits.
            if run.status == RunStatus::Running
                && let Some(Ok(waiting)) = waits.next()
            {
                let waiting: Vec<v1::Waiting> = waiting.into_iter().map(Into::into).collect();
                row["waiting"] = waiting_to_json(&waiting);
            }
            row
        })
        .collect();
    Ok(Json(json!({
        "runs": rows,
        "next": page.next.map(|cursor| cursor.token()),
    })))
}

pub async fn get_run<S: Store>(
    State(web): State<Arc<Web<S>>>,
    ApiPath(run_id): ApiPath<String>,
    _: Admitted<rpc::GetRun>,
) -> Result<Json<Value>, ApiError> {
    let run_id = run_requests::run_id("run id", &run_id)?;
    Ok(record_json(web.coordinator.record_live(run_id).await?))
}

pub async fn run_graph<S: Store>(
    State(web): State<Arc<Web<S>>>,
    ApiPath(run_id): ApiPath<String>,
    _: Admitted<rpc::GetRun>,
) -> Result<Json<graph::Graph>, ApiError> {
    let run_id = run_requests::run_id("run id", &run_id)?;
    let workflow = web.coordinator.workflow(run_id).await?;
    Ok(Json(graph::layout(&workflow)))
}

pub async fn step<S: Store>(
    State(web): State<Arc<Web<S>>>,
    ApiPath((run_id, step_id)): ApiPath<(String, String)>,
    _: Admitted<rpc::GetRun>,
) -> Result<Json<crate::service::StepDetail>, ApiError> {
    let run_id = run_requests::run_id("run id", &run_id)?;
    let step_id = run_requests::step_id("step id", &step_id, web.coordinator.config())?;
    Ok(Json(web.coordinator.inspect_step(run_id, step_id).await?))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    approved: Option<bool>,
    #[serde(default)]
    comment: String,
}

pub async fn decide<S: Store>(
    State(web): State<Arc<Web<S>>>,
    ApiPath((run_id, step_id)): ApiPath<(String, String)>,
    Admitted { caller, body, .. }: Admitted<rpc::DecideApproval>,
) -> Result<Json<Value>, ApiError> {
    let config = web.coordinator.config();
    let run_id = run_requests::run_id("run id", &run_id)?;
    let step_id = run_requests::step_id("step id", &step_id, config)?;
    let decided: DecisionBody = json_body(&body)?;
    let approved = decided.approved.ok_or_else(|| {
        ApiError::invalid("the request body: `approved` (true or false) is missing")
    })?;
    // The web API names no approver: the caller decides, when the coordinator knows who.
    let asked = DecisionAsked {
        approved,
        comment: &decided.comment,
        approver: "",
    };
    let decision = run_requests::decision(&asked, caller.name(), config)?;
    Ok(record_json(
        web.coordinator.decide(run_id, step_id, decision).await?,
    ))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelBody {
    #[serde(default)]
    reason: String,
}

pub async fn cancel<S: Store>(
    State(web): State<Arc<Web<S>>>,
    ApiPath(run_id): ApiPath<String>,
    Admitted { caller, body, .. }: Admitted<rpc::CancelRun>,
) -> Result<Json<Value>, ApiError> {
    let run_id = run_requests::run_id("run id", &run_id)?;
    let cancel: CancelBody = json_body(&body)?;
    let config = web.coordinator.config();
    let reason = run_requests::cancel_reason(&cancel.reason, caller.name(), config)?;
    let by = run_requests::requester(&caller);
    Ok(record_json(
        web.coordinator.cancel(run_id, &reason, by.as_ref()).await?,
    ))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Empty {}

pub async fn retry<S: Store>(
    State(web): State<Arc<Web<S>>>,
    ApiPath(run_id): ApiPath<String>,
    Admitted { caller, body, .. }: Admitted<rpc::RetryRun>,
) -> Result<Json<Value>, ApiError> {
    let run_id = run_requests::run_id("run id", &run_id)?;
    let Empty {} = json_body(&body)?;
    let by = run_requests::requester(&caller);
    Ok(record_json(
        web.coordinator.retry(run_id, by.as_ref()).await?,
    ))
}

pub async fn verify<S: Store>(
    State(web): State<Arc<Web<S>>>,
    ApiPath(run_id): ApiPath<String>,
    Admitted { body, .. }: Admitted<rpc::VerifyRun>,
) -> Result<Json<Value>, ApiError> {
    let run_id = run_requests::run_id("run id", &run_id)?;
    let Empty {} = json_body(&body)?;
    let verified = web.coordinator.verify(run_id).await?;
    let text = |text: String| (!text.is_empty()).then_some(text);
    Ok(Json(json!({
        "ok": verified.ok,
        "links": verified.links,
        "state_sha256": verified.state_sha256,
        "problem": text(verified.problem),
        "visit": (!verified.step_id.is_empty()).then_some(verified.visit),
        "step_id": text(verified.step_id),
    })))
}
