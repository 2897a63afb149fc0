//! A coordinator running ([`Coordinator::run`]: its clock, its computers, its movers of live
//! output) for as long as the test holds it, as a server's would for as long as it serves.

#![allow(dead_code)]

use std::ops::Deref;

use baton_coordinator::Coordinator;
use baton_coordinator::store::Store;
use tokio::sync::oneshot;

/// A coordinator whose [`Coordinator::run`] goes on until this is dropped; it reads as the
/// coordinator (`&running` where a `&Coordinator` is expected, `running.clone()` for a handle).
pub struct Running<S: Store> {
    coordinator: Coordinator<S>,
    stop: Option<oneshot::Sender<()>>,
}

/// Starts `coordinator`'s [`Coordinator::run`] on a task of its own (inside the test's
/// runtime). Dropping what this returns asks `run` to stop, as a killed process would (no
/// drain): `run` is woken at once, its tasks start nothing new from then on, and it returns
/// once what they had under way has finished. A drop cannot wait for that on the
/// single-threaded runtime of most tests: it happens when the test next awaits, before any
/// timer that came due meanwhile is served.
pub fn running<S: Store>(coordinator: Coordinator<S>) -> Running<S> {
    let (stop, stopped) = oneshot::channel::<()>();
    let runner = coordinator.clone();
    tokio::spawn(async move {
        runner
            .run(async {
                let _ = stopped.await;
            })
            .await;
    });
    Running {
        coordinator,
        stop: Some(stop),
    }
}

impl<S: Store> Deref for Running<S> {
    type Target = Coordinator<S>;

    fn deref(&self) -> &Coordinator<S> {
        &self.coordinator
    }
}

impl<S: Store> Drop for Running<S> {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
