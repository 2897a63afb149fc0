//! What a coordinator reports about itself: `GetStats` counters, where transitions spend their
//! time, and its metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::Coordinator;
use crate::metrics::{Gauges, MetricFamily};
use crate::store::Store;

/// Counters since this coordinator started, as `GetStats` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    pub workers: u32,
    pub tasks_dispatched: u64,
    pub bytes_to_workers: u64,
    pub transitions: u64,
    /// Microseconds spent in each phase of a transition, summed: the engine, planning the
    /// write, the store, acting on it.
    pub engine_us: u64,
    pub plan_us: u64,
    pub store_us: u64,
    pub act_us: u64,
    pub integrity_failures: u64,
    pub resends: u64,
    pub fenced_results: u64,
    pub retries: u64,
    pub redeliveries: u64,
    pub timeouts: u64,
}

/// What `GetStats` counts besides the metrics.
#[derive(Default)]
pub(super) struct Counters {
    /// Transitions written to the store since start.
    transitions: AtomicU64,
    /// Payloads a worker asked to be sent again.
    resends: AtomicU64,
    /// Where transitions spend their time, for `baton bench`'s profile.
    pub profile: Profile,
}

impl Counters {
    pub fn transition_written(&self) {
        self.transitions.fetch_add(1, Ordering::Relaxed);
    }

    pub fn resent(&self) {
        self.resends.fetch_add(1, Ordering::Relaxed);
    }
}

/// Microseconds spent in each phase of a transition, summed.
#[derive(Default)]
pub(super) struct Profile {
    pub engine_us: AtomicU64,
    pub plan_us: AtomicU64,
    pub store_us: AtomicU64,
    pub act_us: AtomicU64,
}

/// Adds the time since `since` to `counter`; returns now, where the next phase starts.
pub(super) fn add_elapsed(counter: &AtomicU64, since: Instant) -> Instant {
    let now = Instant::now();
    counter.fetch_add((now - since).as_micros() as u64, Ordering::Relaxed);
    now
}

impl<S: Store> Coordinator<S> {
    /// Counters since this coordinator started.
    pub fn stats(&self) -> Stats {
        let hub = self.inner.hub.counters();
        let counters = &self.inner.counters;
        let profile = &counters.profile;
        let metrics = &self.inner.metrics;
        Stats {
            workers: hub.workers as u32,
            tasks_dispatched: hub.tasks_dispatched,
            bytes_to_workers: hub.bytes_to_workers,
            transitions: counters.transitions.load(Ordering::Relaxed),
            engine_us: profile.engine_us.load(Ordering::Relaxed),
            plan_us: profile.plan_us.load(Ordering::Relaxed),
            store_us: profile.store_us.load(Ordering::Relaxed),
            act_us: profile.act_us.load(Ordering::Relaxed),
            integrity_failures: metrics.integrity_failures.get(),
            resends: counters.resends.load(Ordering::Relaxed),
            fenced_results: metrics.fenced.get(),
            retries: metrics.retries.get(),
            redeliveries: metrics.redeliveries.get(),
            timeouts: metrics.timeouts.get(),
        }
    }

    /// The Prometheus text exposition of this coordinator's metrics (`/metrics`).
    pub fn metrics_text(&self) -> String {
        self.inner.metrics.render(self.gauges())
    }

    /// The metrics of [`Coordinator::metrics_text`], as data for export by OTLP.
    pub fn metric_families(&self) -> Vec<MetricFamily> {
        self.inner.metrics.families(self.gauges())
    }

    fn gauges(&self) -> Gauges {
        let (workers, free_slots) = self.inner.hub.capacity();
        Gauges {
            workers,
            runs_in_memory: self.inner.runs.len(),
            free_slots,
            queues: self.inner.hub.queue_stats(),
            computations_waiting: self.computations_waiting(),
        }
    }
}
