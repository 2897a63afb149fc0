//! Who may call the coordinator, and as whom.
//!
//! Every call passes the [`Gate`] (a tower layer in front of every gRPC service) before its
//! handler runs. The gate reads the caller's credentials (a bearer token, the DNS names of a
//! client certificate the TLS layer verified, the peer address) and decides with [`admit`], a
//! pure function of the call's path, those credentials and how the coordinator is configured
//! ([`Access`]). An admitted call carries its [`Caller`] in the request's extensions, so that
//! handlers record who submitted, approved or cancelled, and which agents a worker may serve.
//!
//! - `principals`: the `--auth-tokens` file: principals, roles, limits.
//! - `rpcs`: which role each RPC needs. Which runs a principal may change (its own, or any
//!   with `operate`) depends on the run, so the service decides that
//!   (`service::ownership`).
//! - `gate`: the layer, the tokens file reloaded on change, submit rate limits.

mod gate;
pub mod principals;
mod rpcs;

use std::net::SocketAddr;
use std::sync::Arc;

pub use gate::{Gate, GateLayer, RELOAD_INTERVAL};
pub use principals::{Principal, Principals, Role};
pub use rpcs::{Needs, needs};

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum AuthError {
    #[error("the tokens file: {0}")]
    TokensFile(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    ResourceExhausted(String),
}

impl From<AuthError> for tonic::Status {
    fn from(error: AuthError) -> Self {
        match error {
            AuthError::Unauthenticated(message) => tonic::Status::unauthenticated(message),
            AuthError::PermissionDenied(message) => tonic::Status::permission_denied(message),
            AuthError::ResourceExhausted(message) => tonic::Status::resource_exhausted(message),
            AuthError::TokensFile(message) => tonic::Status::internal(message),
        }
    }
}

/// How this coordinator decides who may call.
#[derive(Debug, Clone)]
pub enum Access {
    /// Protected mode: nothing configured, so only clients on this machine (loopback) may call,
    /// as anyone.
    LoopbackOnly,
    /// `--allow-unauthenticated`: anyone who reaches the port, as anyone.
    Anyone,
    /// `--tls-client-ca` without a tokens file: every client with a certificate the CA signed,
    /// named by its certificate, with every role.
    Certified,
    /// `--auth-tokens`: the principals of the file, by token (or by client certificate).
    Principals(Arc<Principals>),
}

/// What a call presented.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// The token of `authorization: Bearer <token>`.
    pub bearer: Option<String>,
    /// The DNS names of the client certificate, when the TLS layer verified one.
    pub cert_names: Option<Vec<String>>,
    pub peer: Option<SocketAddr>,
}

/// Who is calling, as handlers see it: `None` when the coordinator does not authenticate
/// (protected mode, `--allow-unauthenticated`).
#[derive(Debug, Clone, Default)]
pub struct Caller(pub Option<Arc<Principal>>);

impl Caller {
    /// The caller of a request, from its extensions (none when the call did not pass a gate,
    /// as in-process tests call).
    pub fn of<T>(request: &tonic::Request<T>) -> Caller {
        request
            .extensions()
            .get::<Caller>()
            .cloned()
            .unwrap_or_default()
    }

    pub fn name(&self) -> Option<&str> {
        self.0.as_deref().map(|principal| principal.name.as_str())
    }
}

const HOW_TO_AUTHENTICATE: &str = "send `authorization: Bearer <token>` (the baton CLI and \
workers read BATON_TOKEN_FILE, BATON_TOKEN or --token)";

/// Whether a call to `path` with `credentials` may go on, and as whom.
pub fn admit(path: &str, credentials: &Credentials, access: &Access) -> Result<Caller, AuthError> {
    let needs = needs(path);
    if needs == Needs::Nothing {
        return Ok(Caller(None));
    }
    let principal = match access {
        Access::Anyone => return Ok(Caller(None)),
        Access::LoopbackOnly => {
            return match credentials.peer {
                Some(peer) if peer.ip().is_loopback() => Ok(Caller(None)),
                peer => Err(AuthError::Unauthenticated(format!(
                    "this coordinator answers only clients on its own machine (it has no \
                     --auth-tokens and no --tls-client-ca), and {} is not one: configure \
                     principals with --auth-tokens (see SECURITY.md), or pass \
                     --allow-unauthenticated to accept anyone",
                    peer.map_or("this client".to_owned(), |peer| peer.to_string())
                ))),
            };
        }
        Access::Certified => match &credentials.cert_names {
            Some(names) => Arc::new(Principal::certified(
                names
                    .first()
                    .cloned()
                    .unwrap_or_else(|| "client".to_owned()),
            )),
            None => {
                return Err(AuthError::Unauthenticated(
                    "a client certificate signed by the coordinator's client CA is required".into(),
                ));
            }
        },
        Access::Principals(principals) => {
            let by_token = credentials
                .bearer
                .as_deref()
                .map(|token| principals.by_token(token));
            let by_cert = || {
                credentials
                    .cert_names
                    .as_ref()
                    .and_then(|names| principals.by_cert_names(names.iter().map(String::as_str)))
            };
            match (by_token, by_cert()) {
                (Some(Some(principal)), _) | (None, Some(principal)) => principal.clone(),
                (Some(None), _) => {
                    return Err(AuthError::Unauthenticated(format!(
                        "unknown token: no principal of the coordinator's tokens file has it; \
                         {HOW_TO_AUTHENTICATE}"
                    )));
                }
                (None, None) => {
                    let certified = match &credentials.cert_names {
                        Some(names) => format!(
                            "; the client certificate's names ({}) are no principal's \
                             client_cert_names",
                            names.join(", ")
                        ),
                        None => String::new(),
                    };
                    return Err(AuthError::Unauthenticated(format!(
                        "no credentials: {HOW_TO_AUTHENTICATE}{certified}"
                    )));
                }
            }
        }
    };
    if !needs.met_by(&principal) {
        return Err(AuthError::PermissionDenied(format!(
            "principal `{}` may not call {}: that needs the {} role, and it has {}",
            principal.name,
            rpcs::method(path),
            needs.roles(),
            principal
                .roles
                .iter()
                .map(|role| format!("`{}`", role.name()))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(Caller(Some(principal)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(peer: &str) -> Credentials {
        Credentials {
            peer: Some(peer.parse().unwrap()),
            ..Credentials::default()
        }
    }

    const SUBMIT: &str = "/baton.v1.RunService/SubmitRun";

    #[test]
    fn protected_mode_answers_loopback_peers_only() {
        for peer in ["127.0.0.1:4000", "127.8.9.10:4000", "[::1]:4000"] {
            assert!(
                admit(SUBMIT, &from(peer), &Access::LoopbackOnly).is_ok(),
                "{peer}"
            );
        }
        for peer in [
            "10.0.0.5:4000",
            "192.168.1.2:4000",
            "[fe80::1]:4000",
            "0.0.0.0:1",
        ] {
            let refused = admit(SUBMIT, &from(peer), &Access::LoopbackOnly).unwrap_err();
            let AuthError::Unauthenticated(message) = refused else {
                panic!("{peer}: {refused:?}");
            };
            assert!(message.contains("--auth-tokens"), "{message}");
            assert!(message.contains("--allow-unauthenticated"), "{message}");
            assert!(message.contains(peer.trim_start_matches('[')), "{message}");
        }
        // A peer the transport could not tell is not taken for a local one.
        assert!(admit(SUBMIT, &Credentials::default(), &Access::LoopbackOnly).is_err());
        // Probes pass, whatever the peer.
        assert!(
            admit(
                "/grpc.health.v1.Health/Check",
                &from("10.0.0.5:1"),
                &Access::LoopbackOnly
            )
            .is_ok()
        );
        assert!(admit(SUBMIT, &from("10.0.0.5:4000"), &Access::Anyone).is_ok());
    }

    #[test]
    fn certified_clients_are_named_by_their_certificate() {
        let credentials = Credentials {
            cert_names: Some(vec!["ci.example".into()]),
            ..from("10.0.0.5:1")
        };
        let caller = admit(SUBMIT, &credentials, &Access::Certified).unwrap();
        assert_eq!(caller.name(), Some("ci.example"));
        assert!(matches!(
            admit(SUBMIT, &from("10.0.0.5:1"), &Access::Certified),
            Err(AuthError::Unauthenticated(_))
        ));
    }
}
