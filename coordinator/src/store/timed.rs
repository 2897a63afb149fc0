//! A store that times every call it forwards: the store's (Redis's) latency per operation, for
//! `/metrics`.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{
    Claim, DueTask, Error, OutputOffset, OutputPiece, RunHeader, RunPage, RunQuery, Settled, Store,
    StoredRun, TaskSwap, TransitionWrite,
};

/// Told the operation and how long it took, whether it succeeded or not.
pub type Observer = Arc<dyn Fn(&'static str, Duration) + Send + Sync>;

/// `S`, with every call timed.
pub struct Timed<S> {
    inner: S,
    observe: Observer,
}

impl<S: Store> Timed<S> {
    pub fn new(inner: S, observe: Observer) -> Self {
        Timed { inner, observe }
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    async fn time<T>(&self, operation: &'static str, call: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let result = call.await;
        (self.observe)(operation, started.elapsed());
        result
    }
}

impl<S: Store> Store for Timed<S> {
    async fn create_run(&self, header: RunHeader, first: TransitionWrite) -> Result<(), Error> {
        self.time("create_run", self.inner.create_run(header, first))
            .await
    }

    async fn add_principal_run(&self, principal: &str, run_id: &str) -> Result<(), Error> {
        self.time(
            "add_principal_run",
            self.inner.add_principal_run(principal, run_id),
        )
        .await
    }

    async fn running_runs_of(&self, principal: &str) -> Result<usize, Error> {
        self.time("running_runs_of", self.inner.running_runs_of(principal))
            .await
    }

    async fn apply_transition(
        &self,
        run_id: &str,
        expected_version: u64,
        write: TransitionWrite,
    ) -> Result<u64, Error> {
        self.time(
            "apply_transition",
            self.inner.apply_transition(run_id, expected_version, write),
        )
        .await
    }

    async fn settle_create(&self, header: &RunHeader) -> Result<Settled, Error> {
        self.time("settle_create", self.inner.settle_create(header))
            .await
    }

    async fn settle_transition(
        &self,
        run_id: &str,
        expected_version: u64,
        write_id: &str,
    ) -> Result<Settled, Error> {
        self.time(
            "settle_transition",
            self.inner
                .settle_transition(run_id, expected_version, write_id),
        )
        .await
    }

    async fn load_run(&self, run_id: &str) -> Result<Option<StoredRun>, Error> {
        self.time("load_run", self.inner.load_run(run_id)).await
    }

    async fn swap_tasks(&self, swaps: Vec<TaskSwap>) -> Result<Vec<bool>, Error> {
        self.time("swap_tasks", self.inner.swap_tasks(swaps)).await
    }

    async fn due_tasks(
        &self,
        agent: &str,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<DueTask>, Error> {
        self.time("due_tasks", self.inner.due_tasks(agent, now_ms, limit))
            .await
    }

    async fn task(&self, run_id: &str, task_key: &str) -> Result<Option<Vec<u8>>, Error> {
        self.time("task", self.inner.task(run_id, task_key)).await
    }

    async fn tasks(&self, run_id: &str) -> Result<BTreeMap<String, Vec<u8>>, Error> {
        self.time("tasks", self.inner.tasks(run_id)).await
    }

    async fn version(&self, run_id: &str) -> Result<Option<u64>, Error> {
        self.time("version", self.inner.version(run_id)).await
    }

    async fn list_runs(&self, query: RunQuery) -> Result<RunPage, Error> {
        self.time("list_runs", self.inner.list_runs(query)).await
    }

    async fn ping(&self) -> Result<(), Error> {
        self.time("ping", self.inner.ping()).await
    }

    async fn advertise_slots(
        &self,
        coordinator: &str,
        free: BTreeMap<String, usize>,
        expires_ms: i64,
    ) -> Result<(), Error> {
        self.time(
            "advertise_slots",
            self.inner.advertise_slots(coordinator, free, expires_ms),
        )
        .await
    }

    async fn slots_elsewhere(
        &self,
        me: &str,
        now_ms: i64,
    ) -> Result<BTreeMap<String, usize>, Error> {
        self.time("slots_elsewhere", self.inner.slots_elsewhere(me, now_ms))
            .await
    }

    async fn active_runs(&self) -> Result<Vec<String>, Error> {
        self.time("active_runs", self.inner.active_runs()).await
    }

    async fn decisions(&self, run_id: &str) -> Result<BTreeMap<String, Vec<u8>>, Error> {
        self.time("decisions", self.inner.decisions(run_id)).await
    }

    async fn runs_of_workflow(
        &self,
        workflow_id: &str,
        limit: usize,
    ) -> Result<Vec<String>, Error> {
        self.time(
            "runs_of_workflow",
            self.inner.runs_of_workflow(workflow_id, limit),
        )
        .await
    }

    async fn claim_idempotency_key(
        &self,
        key: &str,
        run_id: &str,
        request_sha256: &str,
        ttl_s: u64,
    ) -> Result<Claim, Error> {
        self.time(
            "claim_idempotency_key",
            self.inner
                .claim_idempotency_key(key, run_id, request_sha256, ttl_s),
        )
        .await
    }

    async fn reclaim_idempotency_key(
        &self,
        key: &str,
        voided_run_id: &str,
        run_id: &str,
        request_sha256: &str,
        ttl_s: u64,
    ) -> Result<Claim, Error> {
        self.time(
            "reclaim_idempotency_key",
            self.inner
                .reclaim_idempotency_key(key, voided_run_id, run_id, request_sha256, ttl_s),
        )
        .await
    }

    async fn append_output(&self, pieces: Vec<(String, OutputPiece)>) -> Result<(), Error> {
        self.time("append_output", self.inner.append_output(pieces))
            .await
    }

    async fn read_output(
        &self,
        run_id: &str,
        after: Option<OutputOffset>,
    ) -> Result<Vec<(OutputOffset, OutputPiece)>, Error> {
        self.time("read_output", self.inner.read_output(run_id, after))
            .await
    }

    /// Not timed: it waits for output by design, so its duration says nothing about the store.
    async fn wait_output(
        &self,
        after: Vec<(String, OutputOffset)>,
        block: Duration,
    ) -> Result<Vec<(String, OutputOffset, OutputPiece)>, Error> {
        self.inner.wait_output(after, block).await
    }
}
