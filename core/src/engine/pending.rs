//! Work a run has started and not yet settled, by step: an agent's task, an approval, a
//! parallel step's branches, a map step's items. The run keeps it in `pending`; the transitions
//! ([`super::transition`], [`super::parallel`], [`super::map`]) start and settle it, and the
//! run's reads rebuild its tasks and waits from it.

use std::sync::Arc;

use imbl::{OrdMap, Vector};
use serde_json::Value;
use serde_json::value::RawValue;

use super::outcome::BranchOutcome;
use crate::context::Context;
use crate::handoff::Source;
use crate::messages::MessageUpdate;
use crate::payload::ErrorInfo;
use crate::workflow::StepIndex;

/// Work the run has started and not yet settled, by step.
#[derive(Debug, Clone)]
pub(super) enum Pending {
    Agent {
        visit: u32,
        /// Kept so that the payload can be rebuilt after a replay.
        error: Option<ErrorInfo>,
        handoff: Option<Arc<RawValue>>,
    },
    Approval {
        visit: u32,
    },
    // Boxed, as the parallel step's below: `pending` is a persistent map, whose nodes hold 64
    // entries inline and are copied whole by each change to a shared one. An unboxed map run
    // made every entry 312 bytes, and settling a chain's step copied 20 KB (issue 20).
    Map(Box<MapRun>),
    Parallel(Box<ParallelRun>),
}

/// A parallel step waiting for its branches.
#[derive(Debug, Clone)]
pub(super) struct ParallelRun {
    pub(super) visit: u32,
    /// One slot per branch, in workflow order.
    pub(super) outcomes: Vector<Option<BranchOutcome>>,
    /// What each agent branch handed on: merged in branch order when the last settles.
    pub(super) handed: Vector<Option<Handed>>,
    pub(super) remaining: usize,
}

/// What a branch handed on: each agent step visit's source record and messages (ids assigned),
/// one for an agent branch, in branch order for a nested parallel step's agents.
#[derive(Debug, Clone, Default)]
pub(super) struct Handed {
    pub(super) entries: Vec<(Arc<Source>, Vec<MessageUpdate>)>,
}

/// A map step under way.
#[derive(Debug, Clone)]
pub(super) struct MapRun {
    pub(super) visit: u32,
    /// The context when the step started: what every item sees.
    pub(super) snapshot: Context,
    /// Why the run came to the map step through `on_error`: an `agent` map's items receive it.
    pub(super) error: Option<ErrorInfo>,
    pub(super) items: Arc<Vec<Value>>,
    /// One slot per item, in item order.
    pub(super) outcomes: Vector<Option<BranchOutcome>>,
    /// What each item's agents handed on, joined in index order when the step settles.
    pub(super) handed: Vector<Option<Handed>>,
    /// Items not started yet, in order.
    pub(super) queue: Vector<u32>,
    /// Items waiting for an agent, by index.
    pub(super) running: OrdMap<u32, ItemRun>,
    pub(super) succeeded: usize,
    pub(super) failed: usize,
}

/// One item waiting for an agent: where its chain stands.
#[derive(Debug, Clone)]
pub(super) struct ItemRun {
    /// `{"step", "item", "index", "count"}`, as agents receive it under `map`.
    pub(super) info: Arc<Value>,
    /// The step whose task it waits for: the map step, or a step of its chain.
    pub(super) step: StepIndex,
    pub(super) visit: u32,
    /// Why the item came to this step through `on_error` (or, for an `agent` map, the map's).
    pub(super) error: Option<ErrorInfo>,
    pub(super) handoff: Option<Arc<RawValue>>,
    /// The snapshot plus the chain's results so far.
    pub(super) context: Context,
    /// How many times this item entered each step of the chain.
    pub(super) visits: OrdMap<StepIndex, u32>,
    /// The last data the chain produced: the item's result when the chain ends.
    pub(super) last: Option<Arc<Value>>,
    /// The chain's agents that hand on to its next agent (empty: those before the map).
    pub(super) sources: Arc<Vec<Arc<Source>>>,
    /// What the item's agents handed on so far.
    pub(super) handed: Vec<(Arc<Source>, Vec<MessageUpdate>)>,
}

/// How far a map step under way has come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapProgress {
    pub step_id: Arc<str>,
    pub visit: u32,
    /// Items in all.
    pub count: usize,
    pub succeeded: usize,
    pub failed: usize,
    /// Items waiting for an agent.
    pub running: usize,
}

impl MapRun {
    pub(super) fn progress(&self, step_id: &Arc<str>) -> MapProgress {
        MapProgress {
            step_id: step_id.clone(),
            visit: self.visit,
            count: self.items.len(),
            succeeded: self.succeeded,
            failed: self.failed,
            running: self.running.len(),
        }
    }
}
