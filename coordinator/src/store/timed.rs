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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::{
        Coordination, Listing, LiveOutput, OutputOffset, RunHeader, RunQuery, Runs, Tasks,
        TransitionWrite,
    };

    /// The labels `/metrics` shows are the method names, each call observed once, and
    /// `wait_output` not at all: dashboards and alerts name these.
    #[tokio::test]
    async fn every_call_is_observed_under_its_method_name_but_wait_output() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let observe: Observer = {
            let seen = seen.clone();
            Arc::new(move |operation, _| seen.lock().unwrap().push(operation))
        };
        let store = Timed::new(MemoryStore::new(), observe);
        let header = RunHeader {
            run_id: "run-1".into(),
            workflow_id: "wf".into(),
            workflow: String::new(),
            input: b"null".to_vec(),
            created_ms: 1,
            traceparent: String::new(),
            submitted_by: String::new(),
        };
        let running = || TransitionWrite {
            status: baton_core::RunStatus::Running,
            ..TransitionWrite::default()
        };
        store.create_run(header.clone(), running()).await.unwrap();
        store.apply_transition("run-1", 1, running()).await.unwrap();
        store.settle_create(&header).await.unwrap();
        store.settle_transition("run-1", 2, "").await.unwrap();
        store.load_run("run-1").await.unwrap();
        store.version("run-1").await.unwrap();
        store.add_principal_run("ci", "run-1").await.unwrap();
        store.running_runs_of("ci").await.unwrap();
        store.swap_tasks(Vec::new()).await.unwrap();
        store.due_tasks("coder", 0, 1).await.unwrap();
        store.task("run-1", "plan#1").await.unwrap();
        store.tasks("run-1").await.unwrap();
        store.append_output(Vec::new()).await.unwrap();
        store.read_output("run-1", None).await.unwrap();
        let after = vec![("run-1".to_owned(), OutputOffset::default())];
        store.wait_output(after, Duration::ZERO).await.unwrap();
        store.list_runs(RunQuery::newest(1)).await.unwrap();
        store.active_runs().await.unwrap();
        store.decisions("run-1").await.unwrap();
        store.runs_of_workflow("wf", 1).await.unwrap();
        store
            .claim_idempotency_key("k", "run-1", "d", 1)
            .await
            .unwrap();
        store
            .reclaim_idempotency_key("k", "run-0", "run-1", "d", 1)
            .await
            .unwrap();
        store
            .advertise_slots("c1", BTreeMap::new(), 1)
            .await
            .unwrap();
        store.slots_elsewhere("c1", 0).await.unwrap();
        store.ping().await.unwrap();
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "create_run",
                "apply_transition",
                "settle_create",
                "settle_transition",
                "load_run",
                "version",
                "add_principal_run",
                "running_runs_of",
                "swap_tasks",
                "due_tasks",
                "task",
                "tasks",
                "append_output",
                "read_output",
                "list_runs",
                "active_runs",
                "decisions",
                "runs_of_workflow",
                "claim_idempotency_key",
                "reclaim_idempotency_key",
                "advertise_slots",
                "slots_elsewhere",
                "ping",
            ]
        );
    }
}
