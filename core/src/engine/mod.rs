//! The engine: a pure state machine over one run.
//!
//! `(Run, Event) -> (Run, [Action])`, with no clock and no I/O. The coordinator persists each
//! transition and carries out its actions (send a task to a worker, wait for a person, report the
//! end); feeding the same events to [`Run::replay`] rebuilds the same run, so any coordinator can
//! pick a run up from its stored events.
//!
//! From the ground up (each module uses only those above it in this list):
//! - [`status`]: how a run and its step visits stand ([`RunStatus`], [`StepRecord`]).
//! - [`events`]: what goes in and out of a run ([`Event`], [`Action`], [`Waiting`]).
//! - [`outcome`]: how a step settled, and the `Promise.allSettled` data of a parallel or map step.
//! - [`route`]: where a settled step leads (pure, per step).
//! - [`pending`]: the work a run has started and not yet settled (agents, approvals, branches,
//!   map items).
//! - [`run`]: the run itself ([`Run`]), what it reads out, and what it keeps to go on later.
//! - [`build`]: a transition under construction (`Builder`), the receiver of the modules below.
//! - [`transition`]: entering and settling steps, the body of [`Run::apply`].
//! - [`handoffs`]: what agents hand on to the next agent step: decisions, messages, handoffs.
//! - [`parallel`]: parallel steps: branches started, filed and merged into the step's data.
//! - [`map`]: map steps: items started up to the cap, chains run per item, outcomes filed.
//! - [`redrive`]: a failed run resumed from the step that failed.
//! - this file: the entry points, [`Run::start`], [`Run::apply`] and [`Run::replay`].

mod build;
mod events;
mod handoffs;
mod map;
mod outcome;
mod parallel;
mod pending;
mod redrive;
mod route;
mod run;
mod status;
mod transition;

use std::sync::Arc;

use serde_json::Value;

pub use events::{Action, AgentTask, Decision, EngineError, Event, TaskId, Waiting};
pub use pending::MapProgress;
pub use run::{MessageHistory, Run, Transition};
pub use status::{RunStatus, StepRecord, StepStatus};

use crate::workflow::Workflow;

/// How a run starts, takes events and is rebuilt from them: a transition of
/// [`transition`] (or, for [`Event::Redrive`], of [`redrive`]).
impl Run {
    /// Starts a run at the workflow's entry step. The walk stops before the first step that
    /// runs jq ([`Action::Continue`]).
    pub fn start(workflow: Arc<Workflow>, input: Value) -> Transition {
        Run::start_with(workflow, input, true)
    }

    /// [`Run::start`] as the engine did before steps that run jq waited for
    /// [`Event::Continue`]: every transition walks through them. Only to replay a run stored
    /// then, exactly as it ran.
    pub fn start_settling_jq_inline(workflow: Arc<Workflow>, input: Value) -> Transition {
        Run::start_with(workflow, input, false)
    }

    fn start_with(workflow: Arc<Workflow>, input: Value, yields: bool) -> Transition {
        transition::start(Run::new(workflow, input, yields))
    }

    /// Applies one event. On error the run is unchanged and nothing is to be done.
    pub fn apply(&self, event: Event) -> Result<Transition, EngineError> {
        self.apply_at(event, 0)
    }

    /// Applies one event that happened at `at_ms` (ms since the epoch): the time of the
    /// decisions and handoffs it records.
    pub fn apply_at(&self, event: Event, at_ms: i64) -> Result<Transition, EngineError> {
        match event {
            Event::Redrive => redrive::apply(self, at_ms),
            event => transition::apply(self, event, at_ms),
        }
    }

    /// Rebuilds a run from its input and the events applied to it, in order.
    pub fn replay(
        workflow: Arc<Workflow>,
        input: Value,
        events: impl IntoIterator<Item = Event>,
    ) -> Result<Run, (usize, EngineError)> {
        Run::replay_at(workflow, input, events.into_iter().map(|event| (event, 0)))
    }

    /// [`Run::replay`] of events with the times they were applied at ([`Run::apply_at`]).
    pub fn replay_at(
        workflow: Arc<Workflow>,
        input: Value,
        events: impl IntoIterator<Item = (Event, i64)>,
    ) -> Result<Run, (usize, EngineError)> {
        events.into_iter().enumerate().try_fold(
            Run::start(workflow, input).run,
            |run, (i, (event, at_ms))| {
                run.apply_at(event, at_ms)
                    .map(|t| t.run)
                    .map_err(|error| (i, error))
            },
        )
    }
}
