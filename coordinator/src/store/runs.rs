//! Runs and their transitions: the [`Runs`] trait and what it writes and reads back
//! ([`RunHeader`], [`TransitionWrite`], [`StoredRun`], [`Settled`]).

use std::collections::{BTreeMap, HashMap};

use baton_core::RunStatus;
use bytes::Bytes;

use super::Error;
use super::declare::store_trait;

store_trait! {
    /// Runs created and moved on by transitions, each written all or nothing, and read back
    /// whole.
    ///
    /// Contract, for every implementation:
    /// - A write is atomic per run: a reader sees a run before or after a transition, never
    ///   half of it, and a refused write (`AlreadyExists`, `Voided`, `Conflict`, `Fenced`,
    ///   `Corrupt`) writes nothing.
    /// - Results are never overwritten: writing an existing result key with different bytes is
    ///   `Corrupt`; with the same bytes it is a no-op (so a retried write is harmless).
    /// - A transition with `fences` applies only if each fenced task exists and its `attempt` is
    ///   the one given; otherwise it is refused with `Fenced` and nothing is written.
    /// - A transition's tasks move their timers in the same atomic step (the [`Tasks`]
    ///   contract), and a transition that ends a run closes its live output (the
    ///   [`LiveOutput`] contract).
    /// - Chain links are appended, never rewritten; `load_run` returns them in order.
    /// - A write that is `Indeterminate` may have been done, and may still be done later, until
    ///   it is settled (`settle_create`, `settle_transition`). Both settles may be called again
    ///   with the same answer (a settle whose own answer was lost), and both are writes: they
    ///   are `Indeterminate` too when their answer is lost.
    ///
    /// [`Tasks`]: super::Tasks
    /// [`LiveOutput`]: super::LiveOutput
    pub trait Runs {
        /// Writes the header and the first transition (version 1) atomically, or nothing if
        /// the id exists (`AlreadyExists`) or was voided (`Voided`). A run that exists is
        /// listed (`list_runs`, `runs_of_workflow`, `active_runs` while it runs) from then on: a
        /// store whose indexes are apart from its runs writes a run's entries before the run,
        /// and its readers skip entries whose run does not exist (yet, or ever), so no crash
        /// leaves a run unlisted.
        async fn create_run(&self, header: RunHeader, first: TransitionWrite) -> Result<(), Error>;

        /// Applies `write` only if the run is at `expected_version` (else `Conflict`; an
        /// unknown run is `NotFound`), atomically, and returns the new version.
        async fn apply_transition(
            &self,
            run_id: &str,
            expected_version: u64,
            write: TransitionWrite,
        ) -> Result<u64, Error>;

        /// Settles a `create_run` that was `Indeterminate`: `Done` if the run exists; otherwise
        /// the run id is voided, so that every later `create_run` of it is `Voided` and writes
        /// nothing (a create still on its way included), its index entries are removed, and
        /// `NotDone`.
        async fn settle_create(&self, header: &RunHeader) -> Result<Settled, Error>;

        /// Settles an `apply_transition` that was `Indeterminate`: `Done` if the write of that
        /// `write_id` made the run's version `expected_version + 1`. If the run is still at
        /// `expected_version`, its version is raised by one (a fence: the write, should it
        /// still come, is a `Conflict`; readers reload, nothing else changes) and `NotDone`.
        /// If other writes moved it on, `NotDone` or, when they are more than the
        /// [`WRITES_KEPT`] writes a store remembers by id, `Unknown` (as when the run's version
        /// is behind the one expected: a failover lost writes). For a run that does not exist,
        /// `NotDone`.
        async fn settle_transition(
            &self,
            run_id: &str,
            expected_version: u64,
            write_id: &str,
        ) -> Result<Settled, Error>;

        /// Everything stored about the run (`None` for an unknown run), as it stood at one
        /// version.
        async fn load_run(&self, run_id: &str) -> Result<Option<StoredRun>, Error>;

        /// The run's version (`None` for an unknown run).
        async fn version(&self, run_id: &str) -> Result<Option<u64>, Error>;

        /// Remembers that `principal` submitted `run_id`, a run that is running, for
        /// `running_runs_of`.
        async fn add_principal_run(&self, principal: &str, run_id: &str) -> Result<(), Error>;

        /// How many runs remembered for `principal` are still running (those that ended are
        /// forgotten).
        async fn running_runs_of(&self, principal: &str) -> Result<usize, Error>;
    }
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
    pub status: RunStatus,
    pub error: Option<String>,
    pub state_sha256: String,
    pub updated_ms: i64,
    /// Tasks that must be at these attempts for the write to apply, task key -> attempt: the
    /// answer of one attempt is recorded only while that attempt is current.
    pub fences: Vec<(String, u32)>,
    /// Names this write among the run's last [`WRITES_KEPT`], so that one whose answer was lost
    /// can be settled ([`Runs::settle_transition`]): [`WRITE_ID_LEN`] characters, unique in the
    /// run, made by [`new_write_id`]. Empty (or of another length) for a write that will not be
    /// settled.
    pub write_id: String,
}

/// How many of a run's last writes a store remembers by their `write_id`, for
/// [`Runs::settle_transition`].
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

/// Everything stored about a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRun {
    pub header: RunHeader,
    pub version: u64,
    pub status: RunStatus,
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

/// What [`Runs::settle_create`] and [`Runs::settle_transition`] found about a write whose
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
