//! The in-memory store: the embedded default for `baton dev` and for fast tests.
//!
//! - this file: [`MemoryStore`], the maps it keeps behind its locks, and a run's entry.
//! - `runs`: [`Runs`](super::Runs): a transition checked, then applied; settles.
//! - `tasks`: [`Tasks`](super::Tasks), and each agent's timers.
//! - `output`: [`LiveOutput`](super::LiveOutput), a run's pieces in a bounded queue.
//! - `listing`: [`Listing`](super::Listing), walked over the runs as Redis walks its indexes.
//! - `coordination`: [`Coordination`](super::Coordination): idempotency keys and free slots.

mod coordination;
mod listing;
mod output;
mod runs;
mod tasks;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::Notify;

use super::StoredRun;
use coordination::Advertisement;
use output::Output;
use tasks::Timers;

/// Runs in a map behind one lock. Every call holds the lock for its whole write, which is what
/// makes a transition atomic here.
#[derive(Debug, Default)]
pub struct MemoryStore {
    runs: Mutex<BTreeMap<String, Entry>>,
    /// Run ids whose create was settled as never done; only changed while `runs` is locked, so
    /// that a settle and a create of the same id are one before the other.
    voided: Mutex<BTreeSet<String>>,
    /// Only changed while `runs` is locked, so tasks and their timers change together.
    timers: Mutex<Timers>,
    /// Idempotency key -> (run id, request digest, expiry).
    keys: Mutex<BTreeMap<String, (String, String, std::time::Instant)>>,
    /// Wakes `wait_output` callers when output is appended.
    output_added: Notify,
    /// Principal -> the runs it submitted that were running when last looked at.
    principal_runs: Mutex<HashMap<String, BTreeSet<String>>>,
    /// Coordinator -> what it advertised.
    slots: Mutex<HashMap<String, Advertisement>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }
}

#[derive(Debug)]
struct Entry {
    run: StoredRun,
    decisions: BTreeMap<String, Vec<u8>>,
    output: Output,
    /// The `write_id`s of the writes that made the last versions, oldest first, one per version
    /// (a placeholder for a write with none, or a fence), at most [`WRITES_KEPT`].
    ///
    /// [`WRITES_KEPT`]: super::WRITES_KEPT
    writes: VecDeque<String>,
}
