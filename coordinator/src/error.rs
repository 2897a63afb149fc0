//! The coordinator's errors. Their gRPC status codes are mapped in one place, at the edge
//! (`grpc/status.rs`).

use baton_core::{Diagnostics, RunStatus};

use crate::store;
use crate::task_ref;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid workflow:\n{0}")]
    InvalidWorkflow(Diagnostics),
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A request without something it needs; the message names the field.
    #[error("{0}")]
    Request(String),
    #[error("{what} is {size} bytes; the limit is {limit}")]
    TooLarge {
        what: &'static str,
        size: usize,
        limit: usize,
    },
    /// A list filter that names no run status; `field` is the request's name for it.
    #[error("{field}: {value:?} is not a run status; use running, succeeded, failed or cancelled")]
    UnknownRunStatus { field: &'static str, value: String },
    /// A page token no page handed out; `field` is the request's name for it.
    #[error(
        "{field}: {value:?} is not a page token; pass the next page token of the page before, or none for the first page"
    )]
    MalformedPageToken { field: &'static str, value: String },
    #[error("no run {0}")]
    RunNotFound(String),
    #[error("run {run_id}: its workflow has no step \"{step_id}\"")]
    StepNotFound { run_id: String, step_id: String },
    #[error("run {run_id}: step \"{step_id}\" is not waiting for an approval")]
    NotAwaitingApproval { run_id: String, step_id: String },
    #[error("run {run_id} has {status} and takes no more events")]
    RunFinished { run_id: String, status: RunStatus },
    #[error("run {run_id} cannot be retried: {why}")]
    NotRetryable { run_id: String, why: String },
    /// A continuation that was taken up already (by this coordinator, or another).
    #[error("run {run_id} is not waiting to go on with a computation")]
    NotContinuing { run_id: String },
    /// A principal asked to change a run that is not its own, without the role to change any
    /// (`service::ownership`).
    #[error(
        "principal `{principal}` may not {change} run {run_id}: {}; changing another principal's run needs the `operate` role (or `admin`)",
        if owner.is_empty() {
            "it was submitted without authentication and belongs to no principal".to_owned()
        } else {
            format!("it belongs to `{owner}`, who submitted it")
        }
    )]
    NotOwner {
        principal: String,
        owner: String,
        run_id: String,
        change: &'static str,
    },
    /// A field of a request that cannot be what it names; `problem` says why.
    #[error("{field}: {problem}")]
    InvalidField {
        field: &'static str,
        problem: String,
    },
    #[error("worker {worker_id} does not hold task {task_id}")]
    TaskNotHeld { worker_id: String, task_id: String },
    /// A late answer: the attempt it answers was superseded (its lease ran out and the task
    /// went to another worker) or the task is no longer in flight.
    #[error(
        "task {task_id}: attempt {attempt} is no longer current (now: {current}); the answer is refused"
    )]
    Superseded {
        task_id: String,
        attempt: u32,
        current: String,
    },
    #[error("malformed task id {0:?}")]
    MalformedTaskId(String),
    #[error("{0}")]
    Digest(#[from] baton_proto::DigestMismatch),
    #[error("{0}")]
    DuplicateWorker(String),
    #[error("a worker stream must start with a hello message")]
    NoHello,
    #[error(
        "principal `{principal}` has {running} runs running; it may have {limit} at once (max_running_runs)"
    )]
    TooManyRunning {
        principal: String,
        running: usize,
        limit: u32,
    },
    #[error(
        "this coordinator serves {limit} watches at once and all are taken: retry later, or watch through another coordinator"
    )]
    TooManyWatchers { limit: usize },
    #[error(
        "the worker speaks worker protocol {worker} and this coordinator serves {oldest} to {newest}: {}",
        if worker > newest {
            "upgrade the coordinators first, then the workers"
        } else {
            "upgrade the worker: a coordinator serves workers of its own version and the one before"
        }
    )]
    Protocol {
        worker: u32,
        oldest: u32,
        newest: u32,
    },
    #[error("run {run_id}: stored state is corrupt: {reason}")]
    Corrupt { run_id: String, reason: String },
    #[error(
        "idempotency key {key:?} belongs to run {run_id}, submitted with another workflow or input; use a new key for a new run"
    )]
    IdempotencyConflict { key: String, run_id: String },
    #[error("cannot embed the text: {0}")]
    Embedding(String),
    #[error("this coordinator is shutting down; use another")]
    ShuttingDown,
    /// A transition that ran jq was stopped (its run is being cancelled, or this coordinator is
    /// shutting down): nothing of it was written.
    #[error(
        "run {run_id}: its jq computation was stopped (the run is being cancelled, or this coordinator is shutting down); nothing of it was recorded"
    )]
    ComputationStopped { run_id: String },
    #[error(transparent)]
    Store(#[from] store::Error),
}

impl From<task_ref::MalformedTaskId> for Error {
    fn from(malformed: task_ref::MalformedTaskId) -> Self {
        Error::MalformedTaskId(malformed.0)
    }
}
