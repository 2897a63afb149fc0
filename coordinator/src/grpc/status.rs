//! The one place the coordinator's errors become gRPC status codes.

use tonic::{Code, Status};

use crate::error::Error;
use crate::store;

impl From<Error> for Status {
    fn from(error: Error) -> Status {
        let code = match &error {
            Error::InvalidWorkflow(_)
            | Error::InvalidInput(_)
            | Error::Request(_)
            | Error::TooLarge { .. }
            | Error::MalformedTaskId(_)
            | Error::Digest(_)
            | Error::NoHello
            | Error::UnknownRunStatus { .. }
            | Error::MalformedPageToken { .. }
            | Error::InvalidField { .. } => Code::InvalidArgument,
            Error::RunNotFound(_) | Error::StepNotFound { .. } => Code::NotFound,
            Error::NotAwaitingApproval { .. }
            | Error::RunFinished { .. }
            | Error::NotRetryable { .. }
            | Error::NotContinuing { .. }
            | Error::Protocol { .. } => Code::FailedPrecondition,
            Error::TaskNotHeld { .. } | Error::NotOwner { .. } => Code::PermissionDenied,
            Error::Superseded { .. } | Error::Store(store::Error::Fenced { .. }) => {
                Code::FailedPrecondition
            }
            Error::DuplicateWorker(_) | Error::IdempotencyConflict { .. } => Code::AlreadyExists,
            Error::Store(store::Error::NotFound(_)) => Code::NotFound,
            Error::Store(store::Error::Conflict { .. } | store::Error::Voided(_)) => Code::Aborted,
            Error::Store(store::Error::AlreadyExists(_)) => Code::AlreadyExists,
            Error::Store(store::Error::Unavailable(_) | store::Error::Indeterminate(_))
            | Error::Embedding(_)
            | Error::ShuttingDown
            | Error::ComputationStopped { .. } => Code::Unavailable,
            Error::Corrupt { .. } | Error::Store(store::Error::Corrupt(_)) => Code::DataLoss,
            Error::TooManyRunning { .. } | Error::TooManyWatchers { .. } => Code::ResourceExhausted,
        };
        Status::new(code, error.to_string())
    }
}
