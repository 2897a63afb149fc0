//! Where run state lives: the [`Store`] traits, their contracts, and their two implementations.
//!
//! [`Store`] is every concern at once, which is what the coordinator takes; each concern is a
//! trait of its own, with its contract in its doc comments, and its own file:
//! - `runs`: [`Runs`], runs created and moved on by transitions, settles of lost writes
//!   ([`RunHeader`], [`TransitionWrite`], [`StoredRun`], [`Settled`]).
//! - `tasks`: [`Tasks`], tasks and their timers ([`TaskSwap`], [`DueTask`]).
//! - `output`: [`LiveOutput`], a run's live output ([`OutputPiece`], [`OutputOffset`]).
//! - `listing`: [`Listing`], runs listed, the running ones, a workflow's, a run's decisions
//!   ([`RunSummary`]).
//! - `query`: what `list_runs` takes and gives ([`RunQuery`], [`RunCursor`], [`RunPage`]), and
//!   the page walk both stores share.
//! - `coordination`: [`Coordination`], idempotency keys, free worker slots, and `ping`
//!   ([`Claim`]).
//! - `error`: [`Error`], why a call failed.
//! - `declare`: `store_trait!`, which declares each trait and writes its `Arc<S>` and
//!   [`Timed`](timed::Timed) implementations from the one list of its methods.
//!
//! And the stores:
//! - [`memory`]: in one process, for `baton dev` and fast tests.
//! - [`redis`]: the production store; every key of a run carries the run's hash tag.
//! - [`timed`]: any store, with the latency of every call observed (for `/metrics`).
//!
//! The store keeps bytes (JSON the coordinator encodes), so that both implementations hold
//! exactly the same documents and the coordinator owns their meaning. Both pass the same
//! conformance suite (`tests/store_conformance/` in this crate, a file per concern).
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

mod coordination;
mod declare;
mod error;
mod listing;
pub mod memory;
mod output;
mod query;
pub mod redis;
mod runs;
mod tasks;
pub mod timed;

pub(crate) use coordination::sum_slots;
pub use coordination::{Claim, Coordination};
pub use error::Error;
pub use listing::{Listing, RunSummary};
pub use output::{LiveOutput, OUTPUT_KEPT_AFTER_END, OUTPUT_MAX_BYTES, OutputOffset, OutputPiece};
pub use query::{MIN_SCAN_BUDGET, RunCursor, RunPage, RunQuery, run_status, scan_budget};
pub use runs::{
    RunHeader, Runs, Settled, StoredRun, TransitionWrite, WRITE_ID_LEN, WRITES_KEPT, new_write_id,
};
pub use tasks::{DueTask, TaskSwap, Tasks};

/// Persistent run state: every concern of the store, which is what the coordinator takes.
///
/// There is nothing to implement: every type that implements the five traits is a `Store`
/// (a shared `Arc<S>` and a [`Timed`](timed::Timed) store included, as `store_trait!` writes
/// them for each trait). A function that needs one concern may take that trait alone.
///
/// Contract, for every implementation and every call, besides each trait's own:
/// - A call that fails with any error but [`Error::Indeterminate`] changed nothing.
/// - Reads never depend on writes: a store that refuses writes (a Redis out of memory) still
///   answers `load_run`, `version`, `list_runs`, `task`, `tasks` and the other reads.
pub trait Store: Runs + Tasks + LiveOutput + Listing + Coordination {}

impl<S: Runs + Tasks + LiveOutput + Listing + Coordination> Store for S {}
