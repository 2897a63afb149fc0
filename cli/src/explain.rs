//! A failed call to a coordinator, said as what to do: the CLI remembers which coordinator it
//! reached and how, and when a call to it fails the way a TLS mismatch fails (`h2 protocol
//! error`, `operation was canceled`), probes that address once (`baton_proto::diagnose`) and
//! puts what it found before the gRPC error.

use std::sync::Mutex;

use baton_proto::connection::ClientSecurity;
use baton_proto::diagnose::diagnose;
use tonic::Code;

/// The coordinator this process's client connected to, and how.
static CONNECTED: Mutex<Option<(String, ClientSecurity)>> = Mutex::new(None);

/// A call to a coordinator that failed: its status, kept so that it can be explained.
#[derive(Debug)]
pub struct CallFailed(pub tonic::Status);

impl std::fmt::Display for CallFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:?})", self.0.message(), self.0.code())
    }
}

impl std::error::Error for CallFailed {}

/// Notes the coordinator the client now talks to.
pub fn connected(url: &str, security: &ClientSecurity) {
    if let Ok(mut connected) = CONNECTED.lock() {
        *connected = Some((url.to_owned(), security.clone()));
    }
}

/// `result`, with a failed call's cause found and said first when the probe finds one.
pub async fn explained<T>(result: anyhow::Result<T>) -> anyhow::Result<T> {
    let error = match result {
        Ok(value) => return Ok(value),
        Err(error) => error,
    };
    let transport_like = error.downcast_ref::<CallFailed>().is_some_and(|failed| {
        matches!(
            failed.0.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal
        )
    });
    let connected = CONNECTED
        .lock()
        .ok()
        .and_then(|connected| connected.clone());
    match connected {
        Some((url, security)) if transport_like => match diagnose(&url, &security).await {
            Some(hint) => Err(anyhow::anyhow!(
                "{hint}\n  (the call failed with: {error:#})"
            )),
            None => Err(error),
        },
        _ => Err(error),
    }
}
