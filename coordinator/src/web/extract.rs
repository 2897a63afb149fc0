//! What the API's handlers read from a request (its query string, path and body), refused
//! with the API's own JSON error ([`ApiError`]) naming what is wrong, where axum's extractors
//! would answer plain text: a script reading `{error, code}` gets it for every refusal.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use tonic::Code;

use super::error::ApiError;

/// The query string as `T`; a parameter that does not fit is named (`limit: invalid digit
/// found in string`).
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(query)) => Ok(ApiQuery(query)),
            Err(rejection) => Err(ApiError::invalid(query_problem(&rejection))),
        }
    }
}

/// The path's parameters as `T`.
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(path)) => Ok(ApiPath(path)),
            Err(rejection) => Err(path_problem(rejection)),
        }
    }
}

/// The request body's bytes, read whole (at most [`super::MAX_BODY_BYTES`]); parse them with
/// [`json_body`] once the caller is admitted, so that a refused caller learns nothing of it.
pub struct Body(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        match Bytes::from_request(request, state).await {
            Ok(bytes) => Ok(Body(bytes)),
            Err(rejection) => Err(body_problem(&rejection)),
        }
    }
}

/// A JSON body as `T`, an empty one as `T::default()`; a field that does not fit is named
/// (`the request body: approved: invalid type: string "yes", expected a boolean ...`).
pub fn json_body<T: DeserializeOwned + Default>(body: &Body) -> Result<T, ApiError> {
    if body.0.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    match axum::Json::<T>::from_bytes(&body.0) {
        Ok(axum::Json(value)) => Ok(value),
        Err(rejection) => Err(ApiError::invalid(format!(
            "the request body: {}",
            json_problem(&rejection)
        ))),
    }
}

/// What is wrong, without axum's preamble ("Failed to deserialize query string: "): its
/// cause, which `serde_path_to_error` prefixes with the parameter's name.
fn query_problem(rejection: &QueryRejection) -> String {
    match rejection {
        QueryRejection::FailedToDeserializeQueryString(failed) => cause(failed),
        other => other.body_text(),
    }
}

fn json_problem(rejection: &JsonRejection) -> String {
    match rejection {
        JsonRejection::JsonDataError(failed) => cause(failed),
        JsonRejection::JsonSyntaxError(failed) => cause(failed),
        other => other.body_text(),
    }
}

fn path_problem(rejection: PathRejection) -> ApiError {
    let status = rejection.status();
    let message = match &rejection {
        PathRejection::FailedToDeserializePathParams(failed) => failed.body_text(),
        other => other.body_text(),
    };
    match status {
        StatusCode::BAD_REQUEST => ApiError::invalid(format!("the path: {message}")),
        // A route without the parameters its handler reads: this coordinator's own bug.
        _ => ApiError::new(Code::Internal, message),
    }
}

fn body_problem(rejection: &BytesRejection) -> ApiError {
    match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            ..ApiError::new(
                Code::ResourceExhausted,
                format!(
                    "the request body is larger than {} bytes",
                    super::MAX_BODY_BYTES
                ),
            )
        },
        _ => ApiError::invalid(format!(
            "the request body cannot be read: {}",
            rejection.body_text()
        )),
    }
}

fn cause(error: &dyn std::error::Error) -> String {
    error
        .source()
        .map_or_else(|| error.to_string(), ToString::to_string)
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Params {
        #[allow(dead_code)]
        limit: Option<usize>,
    }

    async fn query(uri: &str) -> Result<ApiQuery<Params>, ApiError> {
        let (mut parts, ()) = Request::get(uri).body(()).unwrap().into_parts();
        ApiQuery::<Params>::from_request_parts(&mut parts, &()).await
    }

    #[tokio::test]
    async fn a_query_parameter_that_does_not_fit_is_named() {
        let wrong = query("/api/runs?limit=abc").await.err().unwrap();
        assert_eq!(wrong.status, StatusCode::BAD_REQUEST);
        assert_eq!(wrong.message, "limit: invalid digit found in string");
        let unknown = query("/api/runs?limt=5").await.err().unwrap();
        assert!(unknown.message.contains("`limt`"), "{unknown:?}");
        assert!(query("/api/runs?limit=5").await.is_ok());
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Decision {
        approved: Option<bool>,
    }

    #[test]
    fn a_body_field_that_does_not_fit_is_named() {
        let body = |text: &'static str| Body(Bytes::from_static(text.as_bytes()));
        let wrong = json_body::<Decision>(&body(r#"{"approved": "yes"}"#)).unwrap_err();
        assert!(
            wrong
                .message
                .starts_with("the request body: approved: invalid type"),
            "{wrong:?}"
        );
        let broken = json_body::<Decision>(&body(r#"{"approved": tru"#)).unwrap_err();
        assert!(broken.message.contains("line 1"), "{broken:?}");
        assert_eq!(json_body::<Decision>(&body(" \n")).unwrap().approved, None);
        let decided = json_body::<Decision>(&body(r#"{"approved": true}"#)).unwrap();
        assert_eq!(decided.approved, Some(true));
    }
}
