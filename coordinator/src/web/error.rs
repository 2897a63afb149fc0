//! The web API's one error: an HTTP status and a message that names what is wrong, answered
//! as `{"error": <message>, "code": <the gRPC code's name>}`. Coordinator errors take the gRPC
//! status their RPC would answer with ([`crate::grpc`]'s one mapping), then the HTTP status
//! of that code, so the browser and the CLI are told the same thing.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tonic::Code;

use crate::auth::AuthError;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: Code,
    pub message: String,
}

impl ApiError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ApiError {
            status: http_status(code),
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(Code::PermissionDenied, message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ..Self::invalid(message)
        }
    }
}

impl From<crate::Error> for ApiError {
    fn from(error: crate::Error) -> Self {
        let status = tonic::Status::from(error);
        ApiError::new(status.code(), status.message())
    }
}

impl From<AuthError> for ApiError {
    fn from(error: AuthError) -> Self {
        let status = tonic::Status::from(error);
        ApiError::new(status.code(), status.message())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = code_name(self.code);
        (
            self.status,
            Json(json!({ "error": self.message, "code": code })),
        )
            .into_response()
    }
}

/// The layer's function: an API path the router does not know (404), or a method it does not
/// take there (405), is answered in the API's JSON too, like every other refusal, rather than
/// with axum's empty body.
pub async fn unrouted_in_json(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let api = request.uri().path().starts_with("/api/");
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let response = next.run(request).await;
    let json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|kind| kind.as_bytes().starts_with(b"application/json"));
    if !api || json {
        return response;
    }
    match response.status() {
        StatusCode::NOT_FOUND => {
            ApiError::new(Code::NotFound, format!("no API at {path}")).into_response()
        }
        StatusCode::METHOD_NOT_ALLOWED => ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            ..ApiError::new(
                Code::Unimplemented,
                format!("{path} does not take {method}"),
            )
        }
        .into_response(),
        _ => response,
    }
}

/// The HTTP status of a gRPC code, as gRPC-HTTP gateways map them.
fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::FailedPrecondition => StatusCode::CONFLICT,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Cancelled => StatusCode::from_u16(499).expect("a valid status"),
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// `failed_precondition` for `FailedPrecondition`: what scripts match on.
fn code_name(code: Code) -> String {
    let name = format!("{code:?}");
    let mut snake = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            snake.push('_');
        }
        snake.push(c.to_ascii_lowercase());
    }
    snake
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinator_errors_keep_their_grpc_meaning() {
        let missing = ApiError::from(crate::Error::RunNotFound("r1".into()));
        assert_eq!(missing.status, StatusCode::NOT_FOUND);
        assert_eq!(code_name(missing.code), "not_found");
        assert!(missing.message.contains("r1"));
        let late = ApiError::from(crate::Error::NotAwaitingApproval {
            run_id: "r1".into(),
            step_id: "approve-plan".into(),
        });
        assert_eq!(late.status, StatusCode::CONFLICT);
        assert_eq!(code_name(late.code), "failed_precondition");
        assert!(late.message.contains("approve-plan"), "{late:?}");
    }
}
