//! Who may call the web API, decided exactly as for gRPC: the caller's credentials go to
//! [`auth::admit`] with the path of the RPC the call stands for, so a principal may do in the
//! browser what its roles allow over gRPC, no more. Every handler takes its caller through one
//! extractor, [`Admitted`], named by that RPC (`Admitted<rpc::CancelRun>`).
//!
//! The browser adds one risk gRPC clients do not have: another site's page making the user's
//! browser call the coordinator (CSRF), which matters where no token is needed (protected
//! mode, `--allow-unauthenticated`). Changes therefore need a JSON body, which a cross-site
//! form cannot send without a CORS preflight the coordinator never grants, and a cross-site
//! `Origin` or `Sec-Fetch-Site` is refused outright. A page that is not cross-site to the
//! coordinator because its name was rebound to it is `host`'s to refuse.

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Request};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::Web;
use super::error::ApiError;
use super::extract::{ApiQuery, Body};
use crate::auth::{self, Caller, Credentials, Gate, Role};
use crate::store::Store;

/// Declares [`Rpc`] and, in [`rpc`], a type for each of its variants, from one list.
macro_rules! rpcs {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// The RPC a web call stands for, by its gRPC path: the role it needs is that RPC's.
        #[derive(Debug, Clone, Copy)]
        pub enum Rpc {
            $($(#[$doc])* $name,)*
        }

        /// Each [`Rpc`] as a type: `Admitted<rpc::CancelRun>` admits its caller as `CancelRun`
        /// would.
        pub mod rpc {
            use super::{Rpc, RpcCall};
            $(
                #[doc = concat!("[`Rpc::", stringify!($name), "`], as a type.")]
                pub struct $name;

                impl RpcCall for $name {
                    const RPC: Rpc = Rpc::$name;
                }
            )*
        }
    };
}

rpcs!(
    GetRun,
    ListRuns,
    WatchRun,
    CancelRun,
    RetryRun,
    DecideApproval,
    VerifyRun,
    /// Who is calling: any principal the coordinator knows.
    Session,
);

impl Rpc {
    fn path(self) -> &'static str {
        match self {
            Rpc::GetRun => "/baton.v1.RunService/GetRun",
            Rpc::ListRuns => "/baton.v1.RunService/ListRuns",
            Rpc::WatchRun => "/baton.v1.RunService/WatchRun",
            Rpc::CancelRun => "/baton.v1.RunService/CancelRun",
            Rpc::RetryRun => "/baton.v1.RunService/RetryRun",
            Rpc::DecideApproval => "/baton.v1.RunService/DecideApproval",
            Rpc::VerifyRun => "/baton.v1.RunService/VerifyRun",
            // Not a RunService method: it needs someone, not a role.
            Rpc::Session => "/baton.web/Session",
        }
    }

    /// A change (a POST): it carries a JSON body, and only this coordinator's own pages may
    /// send it ([`same_origin_change`]).
    fn is_change(self) -> bool {
        matches!(
            self,
            Rpc::CancelRun | Rpc::RetryRun | Rpc::DecideApproval | Rpc::VerifyRun
        )
    }

    /// Its bearer token may come in the URL (`?access_token=`): the run's events, which the
    /// page reads through an EventSource, and an EventSource cannot send headers.
    fn token_in_url(self) -> bool {
        matches!(self, Rpc::WatchRun)
    }
}

/// An [`Rpc`] as a type, for [`Admitted`].
pub trait RpcCall {
    const RPC: Rpc;
}

/// The prologue of every API call, as an extractor: the last of a handler's arguments, after
/// its path and query (refused first). The caller of a call standing for `R`, admitted as it
/// would be over gRPC ([`admit`]). A change must also come from this coordinator's own pages
/// ([`same_origin_change`]), and its body comes with it: read whole (at most
/// [`super::MAX_BODY_BYTES`]) before the caller is admitted, for the handler to parse
/// ([`super::extract::json_body`]) now that it is, so that a refused caller learns nothing of it.
pub struct Admitted<R> {
    pub caller: Caller,
    /// A change's body; empty for a read.
    pub body: Body,
    rpc: PhantomData<fn() -> R>,
}

/// `?access_token=`, where [`Rpc::token_in_url`].
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct UrlToken {
    access_token: Option<String>,
}

impl<S: Store, R: RpcCall> FromRequest<Arc<Web<S>>> for Admitted<R> {
    type Rejection = Response;

    async fn from_request(request: Request, web: &Arc<Web<S>>) -> Result<Self, Response> {
        let rpc = R::RPC;
        let (mut parts, body) = request.into_parts();
        let ConnectInfo(peer) = ConnectInfo::<SocketAddr>::from_request_parts(&mut parts, web)
            .await
            .map_err(IntoResponse::into_response)?;
        let token = if rpc.token_in_url() {
            let ApiQuery(UrlToken { access_token }) = ApiQuery::from_request_parts(&mut parts, web)
                .await
                .map_err(IntoResponse::into_response)?;
            access_token
        } else {
            None
        };
        let headers = parts.headers.clone();
        let body = if rpc.is_change() {
            let body = Body::from_request(Request::from_parts(parts, body), web)
                .await
                .map_err(IntoResponse::into_response)?;
            same_origin_change(&headers).map_err(IntoResponse::into_response)?;
            body
        } else {
            Body(Bytes::new())
        };
        let caller = admit(&web.gate, rpc, &headers, peer, token.as_deref())
            .map_err(IntoResponse::into_response)?;
        Ok(Admitted {
            caller,
            body,
            rpc: PhantomData,
        })
    }
}

/// The caller of a web call standing for `rpc`, or why it may not go on. `token` is a bearer
/// token passed in the URL, for the one route a browser cannot send headers to (an
/// EventSource).
pub fn admit(
    gate: &Gate,
    rpc: Rpc,
    headers: &HeaderMap,
    peer: SocketAddr,
    token: Option<&str>,
) -> Result<Caller, ApiError> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
        .or(token)
        .filter(|token| !token.is_empty())
        .map(str::to_owned);
    let credentials = Credentials {
        bearer,
        // The HTTP port has no TLS, so no client certificate.
        cert_names: None,
        peer: Some(peer),
    };
    Ok(auth::admit(rpc.path(), &credentials, &gate.access())?)
}

/// Refuses a change (a POST) that another site's page could have sent.
pub fn same_origin_change(headers: &HeaderMap) -> Result<(), ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    if !content_type
        .split(';')
        .next()
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
    {
        return Err(ApiError::unsupported_media_type(format!(
            "a change needs a JSON body with `Content-Type: application/json`, not {:?}",
            content_type
        )));
    }
    if headers
        .get("sec-fetch-site")
        .is_some_and(|site| site == "cross-site")
    {
        return Err(ApiError::forbidden(
            "refused: the request came from another site's page",
        ));
    }
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let origin_host = origin.split_once("://").map_or(origin, |(_, rest)| rest);
        if origin_host != host {
            return Err(ApiError::forbidden(format!(
                "refused: the request came from {origin}, not from this coordinator ({host})"
            )));
        }
    }
    Ok(())
}

/// The roles the caller has, by name: every role that concerns the UI when the coordinator
/// does not authenticate.
pub fn roles(caller: &Caller) -> Vec<&'static str> {
    let all = [Role::Read, Role::Submit, Role::Approve, Role::Operate];
    all.into_iter()
        .filter(|role| {
            caller
                .0
                .as_ref()
                .is_none_or(|principal| principal.has(*role))
        })
        .map(Role::name)
        .collect()
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(name, value)| {
                (
                    axum::http::HeaderName::from_static(name),
                    HeaderValue::from_static(value),
                )
            })
            .collect()
    }

    #[test]
    fn a_change_needs_a_json_body_from_this_coordinators_own_pages() {
        let json = ("content-type", "application/json; charset=utf-8");
        assert!(same_origin_change(&headers(&[json])).is_ok());
        assert!(
            same_origin_change(&headers(&[
                json,
                ("host", "127.0.0.1:9464"),
                ("origin", "http://127.0.0.1:9464")
            ]))
            .is_ok()
        );
        let form = same_origin_change(&headers(&[(
            "content-type",
            "application/x-www-form-urlencoded",
        )]))
        .unwrap_err();
        assert_eq!(form.status.as_u16(), 415, "{form:?}");
        let elsewhere = same_origin_change(&headers(&[
            json,
            ("host", "127.0.0.1:9464"),
            ("origin", "https://evil.example"),
        ]))
        .unwrap_err();
        assert_eq!(elsewhere.status.as_u16(), 403);
        assert!(elsewhere.message.contains("evil.example"), "{elsewhere:?}");
        let cross = same_origin_change(&headers(&[json, ("sec-fetch-site", "cross-site")]));
        assert_eq!(cross.unwrap_err().status.as_u16(), 403);
    }

    #[test]
    fn a_bearer_token_in_the_header_or_the_url_names_the_principal() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
            "t-alice-0123456789abcdef",
        ));
        std::fs::write(
            file.path(),
            format!("[principals.alice]\ntoken_sha256 = \"{digest}\"\nroles = [\"read\"]\n"),
        )
        .unwrap();
        let gate = Gate::configure(Some(file.path().to_owned()), false, false).unwrap();
        let peer: SocketAddr = "10.0.0.9:5000".parse().unwrap();
        let by_header = headers(&[("authorization", "Bearer t-alice-0123456789abcdef")]);
        let caller = admit(&gate, Rpc::GetRun, &by_header, peer, None).unwrap();
        assert_eq!(caller.name(), Some("alice"));
        assert_eq!(roles(&caller), ["read"]);
        let caller = admit(
            &gate,
            Rpc::WatchRun,
            &HeaderMap::new(),
            peer,
            Some("t-alice-0123456789abcdef"),
        )
        .unwrap();
        assert_eq!(caller.name(), Some("alice"));
        let denied = admit(&gate, Rpc::DecideApproval, &by_header, peer, None).unwrap_err();
        assert_eq!(denied.status.as_u16(), 403);
        assert!(denied.message.contains("approve"), "{denied:?}");
        let none = admit(&gate, Rpc::Session, &HeaderMap::new(), peer, None).unwrap_err();
        assert_eq!(none.status.as_u16(), 401);
    }

    #[test]
    fn protected_mode_admits_this_machine_only_as_anyone() {
        let gate = Gate::loopback_only();
        let local = admit(
            &gate,
            Rpc::DecideApproval,
            &HeaderMap::new(),
            "127.0.0.1:1".parse().unwrap(),
            None,
        )
        .unwrap();
        assert_eq!(roles(&local), ["read", "submit", "approve", "operate"]);
        let remote = admit(
            &gate,
            Rpc::GetRun,
            &HeaderMap::new(),
            "10.1.2.3:1".parse().unwrap(),
            None,
        );
        assert_eq!(remote.unwrap_err().status.as_u16(), 401);
    }
}
