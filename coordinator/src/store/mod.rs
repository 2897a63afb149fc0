//! Where run state lives: the [`Store`] trait, its contract, and its two implementations.
//!
//! - [`memory`]: in one process, for `baton dev` and fast tests.
//! - [`redis`]: the production store; every key of a run carries the run's hash tag.
//! - [`timed`]: any store, with the latency of every call observed (for `/metrics`).
//! - `output`: a run's live output ([`OutputPiece`], [`OutputOffset`]).
//! - `query`: what `list_runs` takes and gives ([`RunQuery`], [`RunCursor`], [`RunPage`]), and
//!   the page walk both stores share.
//!
//! The store keeps bytes (JSON the coordinator encodes), so that both implementations hold
//! exactly the same documents and the coordinator owns their meaning. Both pass the same
//! conformance suite (`tests/store_conformance.rs` in this crate).
//!
//! What a run is made of:
//! - a header (workflow text, input, ids, creation time), written once;
//! - a version, raised by every transition applied (and by a settle that fences a lost one);
//! - an event log: what happened, in order, each event once (agent data by reference);
//! - results: each agent or transform result, once, under `"<step>#<visit>"`;
//! - step states and tasks (queued, running or waiting to be retried; the attempt, the
//!   coordinator that holds it and until when): the scheduling view, overwritten as it changes;
//! - a timer per task, in its agent's timer set, so that due work is found without looking at
//!   every run;
//! - the state chain: one link per settled step visit, appended in order
//!   ([`baton_core::integrity`]), whose last state is the run's `state_sha256`;
//! - the decisions agents reported, by key, each with its embedding;
//! - status, error, the chain's head and last update time.

pub mod memory;
mod output;
mod query;
pub mod redis;
pub mod timed;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

pub use output::{OUTPUT_KEPT_AFTER_END, OUTPUT_MAX_BYTES, OutputOffset, OutputPiece};
pub use query::{MIN_SCAN_BUDGET, RunCursor, RunPage, RunQuery, run_status, scan_budget};

/// Why a store call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("run {0} already exists")]
    AlreadyExists(String),
    #[error("run {0} not found")]
    NotFound(String),
    /// Someone else applied a transition first: reload and retry.
    #[error("run {run_id} is at version {actual}, not {expected}")]
    Conflict {
        run_id: String,
        expected: u64,
        actual: u64,
    },
    /// A fenced transition's task is gone, or at another attempt: the answer is late.
    #[error("run {run_id}: task {task_key} is at attempt {current}, not {attempt}")]
    Fenced {
        run_id: String,
        task_key: String,
        attempt: u32,
        /// `none` when the task is gone.
        current: String,
    },
    /// The store could not be reached, or refused the call before doing anything (a Redis out of
    /// memory, loading, busy): for a write, nothing was written.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A `create_run` or `apply_transition` was sent but its answer never came (it timed out, the
    /// connection dropped, or it reached fewer replicas than asked for), or, on a Redis Cluster,
    /// failed in any way but the script's own refusal (the cluster client tries a request
    /// again, so its last error says nothing of an earlier try that ran): it may have been done
    /// or not, and may even be done later. [`Store::settle_create`] and
    /// [`Store::settle_transition`] find out, and make sure.
    #[error("store unavailable: {0}")]
    Indeterminate(String),
    /// A `create_run` of a run id that [`Store::settle_create`] voided: nothing was written, and
    /// no create of that id ever will be.
    #[error("run {0} was voided: its submit was settled as never done")]
    Voided(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
}

/// What never changes about a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunHeader {
    pub run_id: String,
    pub workflow_id: String,
    /// The workflow document as submitted.
    pub workflow: String,
    /// The run's input, JSON.
    pub input: Vec<u8>,
    pub created_ms: i64,
    /// W3C trace context of the run's `SubmitRun` span, which every span of the run descends
    /// from ([`crate::traces`]); empty when the run is not traced.
    pub traceparent: String,
    /// The principal that submitted the run; empty when the coordinator does not authenticate.
    pub submitted_by: String,
}

/// One transition, written all or nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransitionWrite {
    /// The events that caused it, JSON, in the order they were applied: none for the
    /// transition that starts the run, several for answers settled together
    /// ([`TransitionWrite::then`]).
    pub events: Vec<Vec<u8>>,
    /// New results, `"<step>#<visit>"` -> JSON. Each key is written once. The bytes are the
    /// ones the coordinator's part cache and watch events share (encoded once).
    pub results: Vec<(String, Bytes)>,
    /// Step states to set, step id -> JSON.
    pub steps: Vec<(String, Vec<u8>)>,
    /// Tasks to set, task key -> JSON.
    pub tasks_set: Vec<(String, Vec<u8>)>,
    /// Tasks that are finished or abandoned.
    pub tasks_removed: Vec<String>,
    /// Links appended to the state chain, JSON, in order.
    pub links: Vec<Vec<u8>>,
    /// Decisions reported, key -> JSON (with their embedding). Each key is written once.
    pub decisions: Vec<(String, Vec<u8>)>,
    pub status: String,
    pub error: Option<String>,
    pub state_sha256: String,
    pub updated_ms: i64,
    /// Tasks that must be at these attempts for the write to apply, task key -> attempt: the
    /// answer of one attempt is recorded only while that attempt is current.
    pub fences: Vec<(String, u32)>,
    /// Names this write among the run's last [`WRITES_KEPT`], so that one whose answer was lost
    /// can be settled ([`Store::settle_transition`]): [`WRITE_ID_LEN`] characters, unique in the
    /// run, made by [`new_write_id`]. Empty (or of another length) for a write that will not be
    /// settled.
    pub write_id: String,
}

/// How many of a run's last writes a store remembers by their `write_id`, for
/// [`Store::settle_transition`].
pub const WRITES_KEPT: usize = 8;

/// The length of a [`TransitionWrite::write_id`].
pub const WRITE_ID_LEN: usize = 16;

/// A fresh [`TransitionWrite::write_id`]: 64 random bits in hex. Unique in a run's last
/// [`WRITES_KEPT`] writes is all it needs to be.
pub fn new_write_id() -> String {
    format!("{:016x}", fastrand::u64(..))
}

impl TransitionWrite {
    /// Makes this write also do `next`, as if `next` were written right after it: one write
    /// for several transitions of a run (answers that arrived together). Lists are appended in
    /// order, and a later write of a key wins (a store writes them in order); the one exception
    /// is a task `next` removes, which leaves `tasks_set` here, since a store removes tasks
    /// before it sets them. Fences add up: each is checked against the run as stored before.
    /// The joined write is one write: it keeps this one's `write_id` (`next`'s if it has none).
    pub fn then(&mut self, next: TransitionWrite) {
        self.events.extend(next.events);
        self.results.extend(next.results);
        self.steps
            .retain(|(id, _)| !next.steps.iter().any(|(later, _)| later == id));
        self.steps.extend(next.steps);
        self.tasks_set
            .retain(|(key, _)| !next.tasks_removed.contains(key));
        self.tasks_removed.extend(next.tasks_removed);
        self.tasks_set.extend(next.tasks_set);
        self.links.extend(next.links);
        self.decisions.extend(next.decisions);
        self.fences.extend(next.fences);
        self.status = next.status;
        self.error = next.error;
        self.state_sha256 = next.state_sha256;
        self.updated_ms = next.updated_ms;
        if self.write_id.is_empty() {
            self.write_id = next.write_id;
        }
    }
}

/// A compare-and-swap of one task ([`Store::swap_tasks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSwap {
    pub run_id: String,
    pub task_key: String,
    /// The bytes the task must hold now.
    pub expected: Vec<u8>,
    /// What it holds after; `None` removes it.
    pub new: Option<Vec<u8>>,
}

/// A task whose timer is due ([`Store::due_tasks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueTask {
    pub run_id: String,
    pub task_key: String,
    /// The task as stored.
    pub task: Vec<u8>,
}

/// Everything stored about a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRun {
    pub header: RunHeader,
    pub version: u64,
    pub status: String,
    pub error: Option<String>,
    pub state_sha256: String,
    pub updated_ms: i64,
    pub events: Vec<Vec<u8>>,
    pub results: HashMap<String, Vec<u8>>,
    pub steps: BTreeMap<String, Vec<u8>>,
    pub tasks: BTreeMap<String, Vec<u8>>,
    /// The state chain's links, in order.
    pub links: Vec<Vec<u8>>,
}

/// A line of `ListRuns`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSummary {
    pub run_id: String,
    pub workflow_id: String,
    pub status: String,
    pub created_ms: i64,
    pub updated_ms: i64,
}

/// What [`Store::settle_create`] and [`Store::settle_transition`] found about a write whose
/// answer was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// It was done.
    Done,
    /// It was not done, and never will be.
    NotDone,
    /// It will never be done, but whether it was is more than the store remembers: writes of
    /// others moved the run on by more than [`WRITES_KEPT`] since.
    Unknown,
}

/// Who holds an idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key was free and now names the run id given.
    Claimed,
    /// The key already names a run, submitted with a request of this digest.
    Held {
        run_id: String,
        request_sha256: String,
    },
}

/// Persistent run state.
///
/// Contract, for every implementation:
/// - `create_run` writes the header and the first transition (version 1) atomically, or nothing
///   if the id exists (`AlreadyExists`) or was voided (`Voided`). A run that exists is listed
///   (`list_runs`, `runs_of_workflow`, `active_runs` while it runs) from then on: a store whose
///   indexes are apart from its runs writes a run's entries before the run, and its readers
///   skip entries whose run does not exist (yet, or ever), so no crash leaves a run unlisted.
/// - `apply_transition` applies `write` only if the run is at `expected_version`, atomically: a
///   reader sees the run before or after, never half of it. It returns the new version.
/// - A call that fails with any error but `Indeterminate` changed nothing. A write that is
///   `Indeterminate` may have been done, and may still be done later, until it is settled:
///   - `settle_create(header)`: `Done` if the run exists; otherwise the run id is voided, so
///     that every later `create_run` of it is `Voided` and writes nothing (a create still on
///     its way included), its index entries are removed, and `NotDone`.
///   - `settle_transition(run_id, expected_version, write_id)`: `Done` if the write of that
///     `write_id` made the run's version `expected_version + 1`. If the run is still at
///     `expected_version`, its version is raised by one (a fence: the write, should it still
///     come, is a `Conflict`; readers reload, nothing else changes) and `NotDone`. If other
///     writes moved it on, `NotDone` or, when they are more than the [`WRITES_KEPT`] writes a
///     store remembers by id, `Unknown` (as when the run's version is behind the one expected:
///     a failover lost writes). For a run that does not exist, `NotDone`.
///   - Both may be called again with the same answer (a settle whose own answer was lost), and
///     both are writes: they are `Indeterminate` too when their answer is lost.
/// - Reads never depend on writes: a store that refuses writes (a Redis out of memory) still
///   answers `load_run`, `version`, `list_runs`, `task`, `tasks` and the other reads.
/// - Results are never overwritten: writing an existing result key with different bytes is
///   `Corrupt`; with the same bytes it is a no-op (so a retried write is harmless).
/// - Tasks are JSON objects. A task with a string `agent` and an integer `due_ms` has a timer in
///   that agent's timer set at `due_ms`; every write of the task (a transition's `tasks_set` or
///   `tasks_removed`, a swap) moves or removes its timer in the same atomic step.
/// - A transition with `fences` applies only if each fenced task exists and its `attempt` is the
///   one given; otherwise it is refused with `Fenced` and nothing is written.
/// - `swap_tasks` replaces (or removes) each task only if it holds exactly the expected bytes,
///   each swap on its own, and says which happened; it never creates a task and never changes
///   the version (no engine state changes with it).
/// - `due_tasks` returns up to `limit` tasks of `agent` whose timers are at or before `now_ms`,
///   earliest first, reading only those: its cost follows the due work, not the number of runs.
/// - `task` reads one task, `tasks` all of a run's; `version` a run's version (`None` for an
///   unknown run).
/// - `advertise_slots` replaces what `coordinator` said before about its workers' free slots per
///   agent, until `expires_ms`; `slots_elsewhere` sums, per agent, what the coordinators other
///   than `me` advertised that has not expired at `now_ms` (expired advertisements are ignored,
///   and may be removed).
/// - `ping` makes one round trip to where the state lives, with a write (a small key that
///   expires), and fails if it does not answer or refuses writes (a Redis out of memory, whose
///   reads still work: only a write tells), naming why: a coordinator is ready for work only
///   while it passes.
/// - `list_runs` returns one page of runs ([`RunQuery`] -> [`RunPage`]), newest first:
///   descending `created_ms`, equal times in descending `run_id` (compared as bytes). The page
///   holds up to `limit` runs that match every filter given (`status`, `workflow_id`), strictly
///   after `after` in that order. `next` is where the next page starts: the position of the
///   last entry the page looked at, given only while entries follow it; `None` when the list is
///   over. Following `next` from the start lists every run that matches exactly once, in order,
///   whatever the page size, as long as runs are not created meanwhile with times older than
///   the position reached (the coordinator stamps runs with the time they are submitted).
///   A position is a creation time and a run id, not a reference to a run: a cursor naming a
///   run that does not exist (or no longer matches) is still a place in the order, and a
///   workflow id no run has gives an empty page; neither is an error.
/// - How far a page looks: with no status filter it costs what it returns; with `running` it
///   looks at the runs that are running only (as many as the workers run at once, never the
///   finished ones that pile up), and fills its page. With another status it walks the runs (of the workflow, with a
///   `workflow_id`) and reads their statuses, and stops after [`scan_budget`]`(limit)` entries
///   (ten per run asked for, at least [`MIN_SCAN_BUDGET`]) even with the page short, `next` at
///   the last entry it looked at: a page may be short, or empty, with a `next` that goes on,
///   but never slow. A run whose status changes while it is listed may be missed or listed on
///   two pages. In a Redis store the `running` filter reads the active-runs index, which may
///   lag a status change by one index update (`rebuild_indexes` repairs it); each run listed is
///   checked against its own status and workflow, so a stale index entry is never listed.
/// - `active_runs` lists runs whose status is `running`.
/// - Chain links are appended, never rewritten; `load_run` returns them in order.
/// - `claim_idempotency_key` atomically sets the key to `(run_id, request_sha256)` for `ttl_s`
///   seconds if it is free, and otherwise returns what it holds (never changing it).
///   `reclaim_idempotency_key` sets it to `(run_id, request_sha256)` for `ttl_s` seconds only
///   if it holds `(voided_run_id, request_sha256)` or nothing (`Claimed`), and otherwise
///   returns what it holds: a key whose run was voided names a new one.
/// - `decisions` returns every decision of a run by key (empty for an unknown run);
///   `runs_of_workflow` the ids of the newest `limit` runs created with that workflow id.
/// - Live output ([`OutputPiece`]): `append_output` appends pieces to each run's output, in the
///   order given, only while the run's status is `running` (pieces for a run that ended or does
///   not exist are dropped, not an error). Each piece gets an offset greater than every earlier
///   one of its run. A run keeps the newest [`OUTPUT_MAX_BYTES`] of text: the oldest pieces go
///   first. Once the transition that ends a run is written, its output takes no more pieces,
///   stays readable for [`OUTPUT_KEPT_AFTER_END`], then is gone; a transition that makes an
///   ended run `running` again (a retry) keeps what is left of it and lets it take pieces again.
/// - `read_output` returns a run's pieces after an offset (all with `None`), oldest first (empty
///   for an unknown or ended run); `wait_output` returns the pieces after each run's offset,
///   waiting up to `block` for some to come (empty when none did).
pub trait Store: Send + Sync + 'static {
    fn create_run(
        &self,
        header: RunHeader,
        first: TransitionWrite,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Remembers that `principal` submitted `run_id`, a run that is running, for
    /// `running_runs_of`.
    fn add_principal_run(
        &self,
        principal: &str,
        run_id: &str,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// How many runs remembered for `principal` are still running (those that ended are
    /// forgotten).
    fn running_runs_of(&self, principal: &str)
    -> impl Future<Output = Result<usize, Error>> + Send;

    fn apply_transition(
        &self,
        run_id: &str,
        expected_version: u64,
        write: TransitionWrite,
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    fn settle_create(
        &self,
        header: &RunHeader,
    ) -> impl Future<Output = Result<Settled, Error>> + Send;

    fn settle_transition(
        &self,
        run_id: &str,
        expected_version: u64,
        write_id: &str,
    ) -> impl Future<Output = Result<Settled, Error>> + Send;

    fn load_run(
        &self,
        run_id: &str,
    ) -> impl Future<Output = Result<Option<StoredRun>, Error>> + Send;

    fn swap_tasks(
        &self,
        swaps: Vec<TaskSwap>,
    ) -> impl Future<Output = Result<Vec<bool>, Error>> + Send;

    fn due_tasks(
        &self,
        agent: &str,
        now_ms: i64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<DueTask>, Error>> + Send;

    fn task(
        &self,
        run_id: &str,
        task_key: &str,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, Error>> + Send;

    /// Every task of the run, by key, as stored now (empty for an unknown run): where each
    /// step in flight stands, whoever holds it.
    fn tasks(
        &self,
        run_id: &str,
    ) -> impl Future<Output = Result<BTreeMap<String, Vec<u8>>, Error>> + Send;

    fn version(&self, run_id: &str) -> impl Future<Output = Result<Option<u64>, Error>> + Send;

    fn ping(&self) -> impl Future<Output = Result<(), Error>> + Send;

    fn advertise_slots(
        &self,
        coordinator: &str,
        free: BTreeMap<String, usize>,
        expires_ms: i64,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    fn slots_elsewhere(
        &self,
        me: &str,
        now_ms: i64,
    ) -> impl Future<Output = Result<BTreeMap<String, usize>, Error>> + Send;

    fn list_runs(&self, query: RunQuery) -> impl Future<Output = Result<RunPage, Error>> + Send;

    fn active_runs(&self) -> impl Future<Output = Result<Vec<String>, Error>> + Send;

    fn decisions(
        &self,
        run_id: &str,
    ) -> impl Future<Output = Result<BTreeMap<String, Vec<u8>>, Error>> + Send;

    fn runs_of_workflow(
        &self,
        workflow_id: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<String>, Error>> + Send;

    fn claim_idempotency_key(
        &self,
        key: &str,
        run_id: &str,
        request_sha256: &str,
        ttl_s: u64,
    ) -> impl Future<Output = Result<Claim, Error>> + Send;

    fn reclaim_idempotency_key(
        &self,
        key: &str,
        voided_run_id: &str,
        run_id: &str,
        request_sha256: &str,
        ttl_s: u64,
    ) -> impl Future<Output = Result<Claim, Error>> + Send;

    /// Appends live output, `(run id, piece)` in order.
    fn append_output(
        &self,
        pieces: Vec<(String, OutputPiece)>,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    fn read_output(
        &self,
        run_id: &str,
        after: Option<OutputOffset>,
    ) -> impl Future<Output = Result<Vec<(OutputOffset, OutputPiece)>, Error>> + Send;

    /// Pieces after `(run id, offset)` of each run, as `(run id, offset, piece)`.
    fn wait_output(
        &self,
        after: Vec<(String, OutputOffset)>,
        block: Duration,
    ) -> impl Future<Output = Result<Vec<(String, OutputOffset, OutputPiece)>, Error>> + Send;
}

/// Free slots per agent, summed over several coordinators' advertisements.
pub(crate) fn sum_slots<'a>(
    advertised: impl IntoIterator<Item = &'a BTreeMap<String, usize>>,
) -> BTreeMap<String, usize> {
    let mut sum = BTreeMap::new();
    for free in advertised {
        for (agent, slots) in free {
            *sum.entry(agent.clone()).or_default() += slots;
        }
    }
    sum
}

/// A shared store is a store: two coordinators (or a coordinator and a test) can use one.
impl<S: Store> Store for std::sync::Arc<S> {
    fn create_run(
        &self,
        header: RunHeader,
        first: TransitionWrite,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        S::create_run(self, header, first)
    }

    fn add_principal_run(
        &self,
        principal: &str,
        run_id: &str,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        S::add_principal_run(self, principal, run_id)
    }

    fn running_runs_of(
        &self,
        principal: &str,
    ) -> impl Future<Output = Result<usize, Error>> + Send {
        S::running_runs_of(self, principal)
    }

    fn apply_transition(
        &self,
        run_id: &str,
        expected_version: u64,
        write: TransitionWrite,
    ) -> impl Future<Output = Result<u64, Error>> + Send {
        S::apply_transition(self, run_id, expected_version, write)
    }

    fn settle_create(
        &self,
        header: &RunHeader,
    ) -> impl Future<Output = Result<Settled, Error>> + Send {
        S::settle_create(self, header)
    }

    fn settle_transition(
        &self,
        run_id: &str,
        expected_version: u64,
        write_id: &str,
    ) -> impl Future<Output = Result<Settled, Error>> + Send {
        S::settle_transition(self, run_id, expected_version, write_id)
    }

    fn load_run(
        &self,
        run_id: &str,
    ) -> impl Future<Output = Result<Option<StoredRun>, Error>> + Send {
        S::load_run(self, run_id)
    }

    fn swap_tasks(
        &self,
        swaps: Vec<TaskSwap>,
    ) -> impl Future<Output = Result<Vec<bool>, Error>> + Send {
        S::swap_tasks(self, swaps)
    }

    fn due_tasks(
        &self,
        agent: &str,
        now_ms: i64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<DueTask>, Error>> + Send {
        S::due_tasks(self, agent, now_ms, limit)
    }

    fn task(
        &self,
        run_id: &str,
        task_key: &str,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, Error>> + Send {
        S::task(self, run_id, task_key)
    }

    fn tasks(
        &self,
        run_id: &str,
    ) -> impl Future<Output = Result<BTreeMap<String, Vec<u8>>, Error>> + Send {
        S::tasks(self, run_id)
    }

    fn version(&self, run_id: &str) -> impl Future<Output = Result<Option<u64>, Error>> + Send {
        S::version(self, run_id)
    }

    fn list_runs(&self, query: RunQuery) -> impl Future<Output = Result<RunPage, Error>> + Send {
        S::list_runs(self, query)
    }

    fn active_runs(&self) -> impl Future<Output = Result<Vec<String>, Error>> + Send {
        S::active_runs(self)
    }

    fn ping(&self) -> impl Future<Output = Result<(), Error>> + Send {
        S::ping(self)
    }

    fn advertise_slots(
        &self,
        coordinator: &str,
        free: BTreeMap<String, usize>,
        expires_ms: i64,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        S::advertise_slots(self, coordinator, free, expires_ms)
    }

    fn slots_elsewhere(
        &self,
        me: &str,
        now_ms: i64,
    ) -> impl Future<Output = Result<BTreeMap<String, usize>, Error>> + Send {
        S::slots_elsewhere(self, me, now_ms)
    }

    fn decisions(
        &self,
        run_id: &str,
    ) -> impl Future<Output = Result<BTreeMap<String, Vec<u8>>, Error>> + Send {
        S::decisions(self, run_id)
    }

    fn runs_of_workflow(
        &self,
        workflow_id: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<String>, Error>> + Send {
        S::runs_of_workflow(self, workflow_id, limit)
    }

    fn claim_idempotency_key(
        &self,
        key: &str,
        run_id: &str,
        request_sha256: &str,
        ttl_s: u64,
    ) -> impl Future<Output = Result<Claim, Error>> + Send {
        S::claim_idempotency_key(self, key, run_id, request_sha256, ttl_s)
    }

    fn reclaim_idempotency_key(
        &self,
        key: &str,
        voided_run_id: &str,
        run_id: &str,
        request_sha256: &str,
        ttl_s: u64,
    ) -> impl Future<Output = Result<Claim, Error>> + Send {
        S::reclaim_idempotency_key(self, key, voided_run_id, run_id, request_sha256, ttl_s)
    }

    fn append_output(
        &self,
        pieces: Vec<(String, OutputPiece)>,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        S::append_output(self, pieces)
    }

    fn read_output(
        &self,
        run_id: &str,
        after: Option<OutputOffset>,
    ) -> impl Future<Output = Result<Vec<(OutputOffset, OutputPiece)>, Error>> + Send {
        S::read_output(self, run_id, after)
    }

    fn wait_output(
        &self,
        after: Vec<(String, OutputOffset)>,
        block: Duration,
    ) -> impl Future<Output = Result<Vec<(String, OutputOffset, OutputPiece)>, Error>> + Send {
        S::wait_output(self, after, block)
    }
}
