//! A transition under construction ([`Builder`]): the run being changed and the actions it
//! asks for, with what one transition tracks while it walks (its time, a redrive's kept
//! outcomes, a computation's turn, the bytes its transforms produced).

use std::sync::Arc;

use imbl::Vector;

use super::events::Action;
use super::outcome::{BranchOutcome, Outcome};
use super::run::{Run, Transition};
use crate::handoff::AgentNotes;
use crate::payload::ErrorInfo;
use crate::workflow::StepIndex;

/// A step that settled, waiting to be recorded and routed.
pub(super) type Settled = (StepIndex, u32, Outcome);

/// One transition under construction. Its methods are written where their concern is:
/// entering and settling steps in [`super::transition`], what agents hand on in
/// [`super::handoffs`], parallel steps in [`super::parallel`], map steps in [`super::map`]; so
/// its fields are `pub(super)`.
pub(super) struct Builder {
    pub(super) run: Run,
    pub(super) actions: Vec<Action>,
    /// The transition's time as RFC 3339, formatted once when first needed.
    pub(super) timestamp: Option<Arc<str>>,
    /// The notes of the agent result being applied: they go on its step record, the first
    /// record this transition writes.
    pub(super) notes: Option<Arc<AgentNotes>>,
    /// About how many bytes of data the transforms settled in this transition produced.
    pub(super) transformed_bytes: usize,
    /// A redrive's map step, with the outcomes of the visit that failed: what succeeded is kept.
    pub(super) kept: Option<(StepIndex, Vector<Option<BranchOutcome>>)>,
    /// Why the run came to the agent or map step settling now (through `on_error`): what a
    /// redrive of it hands the step again.
    pub(super) entered_with: Option<ErrorInfo>,
    /// This transition is a redrive: the step it enters again is not held to its visit limit.
    pub(super) redriving: bool,
    /// This transition applies [`super::Event::Continue`]: the first step that runs jq it reaches is
    /// entered (the one the walk stopped before); the walk stops before any other, unless the
    /// jq runner says the turn goes on ([`crate::eval::JqRunner::go_on`]).
    pub(super) continuing: bool,
    /// This transition applies [`super::Event::Continue`] (and took up its first step already or not).
    pub(super) in_turn: bool,
}

impl Builder {
    pub(super) fn new(run: Run) -> Self {
        Builder {
            run,
            actions: Vec::new(),
            timestamp: None,
            notes: None,
            transformed_bytes: 0,
            kept: None,
            entered_with: None,
            redriving: false,
            continuing: false,
            in_turn: false,
        }
    }

    /// The transition built: the new run and what the coordinator is to do.
    pub(super) fn finish(self) -> Transition {
        Transition {
            run: self.run,
            actions: self.actions,
        }
    }
}
