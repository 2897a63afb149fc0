//! DNS rebinding: in protected mode a caller on this machine is let in without credentials, so
//! a page of another site whose name its DNS points at 127.0.0.1 could load the UI and call the
//! API from the user's own browser, as the same origin (it sends its own name in both `Origin`
//! and `Host`, so comparing them proves nothing). What it cannot do is send a `Host` that names
//! this machine: the browser sends the name it resolved. So in protected mode a call from a
//! loopback peer, pages and assets included, that names a host must name this machine. One
//! that names none (an HTTP/1.0 request, a hand-written probe) did not come from a browser,
//! which always sends the name it reached, and goes on.
//!
//! `--allow-unauthenticated` is not checked: it is meant for a coordinator behind something
//! else that authenticates, which reaches it by a name Baton cannot know (SECURITY.md, "The web
//! UI"). With tokens there is nothing to borrow: the other site's page cannot read the token.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use crate::auth::{Access, Gate};

/// The layer's function: refuses a call protected mode would let in for its address whose
/// `Host` does not name this machine; the API in its JSON, a page as text.
pub async fn refuse_rebound(
    State(gate): State<Arc<Gate>>,
    request: Request,
    next: Next,
) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| *peer);
    // HTTP/2 carries the name in the URI (`:authority`) rather than a `Host` header.
    let host = request
        .headers()
        .get(header::HOST)
        .map(|host| host.to_str().unwrap_or("(not text)"))
        .or_else(|| {
            request
                .uri()
                .authority()
                .map(|authority| authority.as_str())
        });
    match check(&gate.access(), peer, host) {
        Ok(()) => next.run(request).await,
        Err(refused) if request.uri().path().starts_with("/api/") => refused.into_response(),
        Err(refused) => (
            refused.status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("{}\n", refused.message),
        )
            .into_response(),
    }
}

/// Whether a call from `peer` naming `host` may go on under `access`.
pub fn check(
    access: &Access,
    peer: Option<SocketAddr>,
    host: Option<&str>,
) -> Result<(), ApiError> {
    let admitted_by_address =
        matches!(access, Access::LoopbackOnly) && peer.is_some_and(|peer| peer.ip().is_loopback());
    let Some(host) = host.filter(|host| admitted_by_address && !names_this_machine(host)) else {
        return Ok(());
    };
    let open = match split(host).and_then(|(_, port)| port) {
        Some(port) => format!("http://127.0.0.1:{port}/"),
        None => "http://127.0.0.1/".to_owned(),
    };
    Err(ApiError::forbidden(format!(
        "refused: its Host, {host:?}, does not name this machine. Without --auth-tokens this \
         coordinator lets in browsers on its own machine with no credentials, and a page of \
         another site whose name was pointed at this machine (DNS rebinding) would be let in \
         too. Open the UI at {open} (or localhost), or configure principals with \
         --auth-tokens (see SECURITY.md)"
    )))
}

/// Whether a `Host` names this machine: `localhost`, a name under `.localhost` (browsers
/// resolve those themselves, never asking DNS), or an IP address, with any port. A name a DNS
/// server answers for can be pointed anywhere; an address cannot.
pub fn names_this_machine(host: &str) -> bool {
    let Some((name, port)) = split(host) else {
        return false;
    };
    if port.is_some_and(|port| port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit())) {
        return false;
    }
    if let Some(v6) = name
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'))
    {
        return v6.parse::<Ipv6Addr>().is_ok();
    }
    if name.parse::<Ipv4Addr>().is_ok() {
        return true;
    }
    let name = name.to_ascii_lowercase();
    name == "localhost"
        || name
            .strip_suffix(".localhost")
            .is_some_and(|below| !below.is_empty() && !below.starts_with('.'))
}

/// A `Host` as its name (an IPv6 address keeps its brackets) and its port, if it has one;
/// `None` when it is not one.
fn split(host: &str) -> Option<(&str, Option<&str>)> {
    if host.starts_with('[') {
        let end = host.find(']')?;
        let (name, rest) = host.split_at(end + 1);
        return match rest {
            "" => Some((name, None)),
            rest => Some((name, Some(rest.strip_prefix(':')?))),
        };
    }
    Some(match host.split_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (host, None),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_is_named_by_localhost_or_an_address() {
        for host in [
            "127.0.0.1:9464",
            "127.0.0.1",
            "localhost:9464",
            "LocalHost",
            "baton.localhost:9464",
            "[::1]:9464",
            "[::1]",
            "10.0.0.5:9464",
            "[fe80::1]:80",
        ] {
            assert!(names_this_machine(host), "{host}");
        }
        for host in [
            "evil.example:9464",
            "evil.example",
            "localhost.evil.example:9464",
            "evillocalhost",
            ".localhost",
            "127.0.0.1.evil.example",
            "127.0.0.1:9464:1",
            "127.0.0.1:",
            "127.0.0.1:http",
            "[::1",
            "[::1]9464",
            "[evil.example]:9464",
            "",
        ] {
            assert!(!names_this_machine(host), "{host}");
        }
    }

    #[test]
    fn protected_mode_refuses_a_local_caller_naming_another_host() {
        let local = Some("127.0.0.1:5000".parse().unwrap());
        let refused = check(&Access::LoopbackOnly, local, Some("evil.example:9464")).unwrap_err();
        assert_eq!(refused.status.as_u16(), 403);
        assert!(
            refused.message.contains("\"evil.example:9464\""),
            "{refused:?}"
        );
        assert!(
            refused.message.contains("http://127.0.0.1:9464/"),
            "{refused:?}"
        );
        assert!(refused.message.contains("--auth-tokens"), "{refused:?}");
        // No Host at all: not a browser, which always names where it went (HTTP/1.0, a probe).
        assert!(check(&Access::LoopbackOnly, local, None).is_ok());
        assert!(check(&Access::LoopbackOnly, local, Some("localhost:9464")).is_ok());
        // Not let in by its address: the API refuses it anyway, and the pages are no secret.
        let remote = Some("10.0.0.9:5000".parse().unwrap());
        assert!(check(&Access::LoopbackOnly, remote, Some("evil.example")).is_ok());
        // Whoever reaches the port, by whatever name the proxy in front passes on.
        assert!(check(&Access::Anyone, local, Some("baton.internal:9464")).is_ok());
        assert!(check(&Access::Certified, local, Some("evil.example")).is_ok());
    }
}
