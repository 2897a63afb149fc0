//! The coordinator's errors, and their gRPC status codes (the one place they are mapped).

use baton_core::Diagnostics;
use tonic::{Code, Status};

use crate::store;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid workflow:\n{0}")]
    InvalidWorkflow(Diagnostics),
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("{what} is {size} bytes; the limit is {limit}")]
    TooLarge {
        what: &'static str,
        size: usize,
        limit: usize,
    },
    #[error("no run {0}")]
    RunNotFound(String),
    #[error("run {run_id}: step \"{step_id}\" is not waiting for an approval")]
    NotAwaitingApproval { run_id: String, step_id: String },
    #[error("run {run_id} has {status} and takes no more events")]
    RunFinished { run_id: String, status: String },
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
        "the worker speaks worker protocol {worker} and this coordinator {coordinator}: run the same Baton version on both"
    )]
    Protocol { worker: u32, coordinator: u32 },
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
    #[error(transparent)]
    Store(#[from] store::Error),
}

impl From<Error> for Status {
    fn from(error: Error) -> Status {
        let code = match &error {
            Error::InvalidWorkflow(_)
            | Error::InvalidInput(_)
            | Error::TooLarge { .. }
            | Error::MalformedTaskId(_)
            | Error::Digest(_)
            | Error::NoHello => Code::InvalidArgument,
            Error::RunNotFound(_) => Code::NotFound,
            Error::NotAwaitingApproval { .. }
            | Error::RunFinished { .. }
            | Error::Protocol { .. } => Code::FailedPrecondition,
            Error::TaskNotHeld { .. } => Code::PermissionDenied,
            Error::Superseded { .. } | Error::Store(store::Error::Fenced { .. }) => {
                Code::FailedPrecondition
            }
            Error::DuplicateWorker(_) | Error::IdempotencyConflict { .. } => Code::AlreadyExists,
            Error::Store(store::Error::NotFound(_)) => Code::NotFound,
            Error::Store(store::Error::Conflict { .. }) => Code::Aborted,
            Error::Store(store::Error::AlreadyExists(_)) => Code::AlreadyExists,
            Error::Store(store::Error::Unavailable(_))
            | Error::Embedding(_)
            | Error::ShuttingDown => Code::Unavailable,
            Error::Corrupt { .. } | Error::Store(store::Error::Corrupt(_)) => Code::DataLoss,
        };
        Status::new(code, error.to_string())
    }
}
