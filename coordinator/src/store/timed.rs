//! A store that times every call it forwards: the store's (Redis's) latency per operation, for
//! `/metrics`. Its implementation of each trait is written by `store_trait!` (`declare.rs`),
//! from the trait's list of methods: each call timed under the method's name.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Told the operation and how long it took, whether it succeeded or not.
pub type Observer = Arc<dyn Fn(&'static str, Duration) + Send + Sync>;

/// `S`, with every call timed.
pub struct Timed<S> {
    inner: S,
    observe: Observer,
}

impl<S> Timed<S> {
    pub fn new(inner: S, observe: Observer) -> Self {
        Timed { inner, observe }
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Awaits `call`, then tells the observer how long it took as `operation`.
    pub(super) async fn time<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = T>,
    ) -> T {
        let started = Instant::now();
        let result = call.await;
        (self.observe)(operation, started.elapsed());
        result
    }
}
