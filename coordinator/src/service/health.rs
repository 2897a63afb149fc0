//! Readiness, for probes (`/readyz`): whether this coordinator should be sent work now.

use std::time::Duration;

use super::Coordinator;
use crate::store::Store;

/// How long the store has to answer a readiness probe: a probe must not hang on a Redis that
/// accepts the connection but never replies.
const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a coordinator should not be sent work now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// SIGTERM came: it is sending its workers elsewhere.
    #[error("draining: this coordinator is shutting down")]
    Draining,
    /// The store did not answer its probe, or refused to write it: a Redis out of memory
    /// answers reads (runs can be looked at) but refuses every transition, so no run can move.
    #[error("the store cannot take work: {0}")]
    StoreUnavailable(String),
}

impl<S: Store> Coordinator<S> {
    /// Ready when it is not draining and its store takes a write (the store's `ping`) within
    /// two seconds.
    pub async fn readiness(&self) -> Result<(), NotReady> {
        if self.inner.leases.stopping() {
            return Err(NotReady::Draining);
        }
        // The untimed store: probes are not the traffic the store's latency metrics describe.
        match tokio::time::timeout(PING_TIMEOUT, self.inner.store.inner().ping()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(NotReady::StoreUnavailable(error.to_string())),
            Err(_) => Err(NotReady::StoreUnavailable(format!(
                "no answer to its probe within {} s",
                PING_TIMEOUT.as_secs()
            ))),
        }
    }
}
