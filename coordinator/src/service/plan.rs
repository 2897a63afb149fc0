//! A transition as the store write that records it. Pure: nothing changes until the write is
//! acknowledged, and the same inputs always give the same write.
//!
//! One write holds everything a transition changes: the event, each new result once, the step
//! states and tasks that changed (each task with its lease and timer), the links appended to the
//! state chain, the decisions reported (with their embeddings), and the run's status.

use std::sync::Arc;

use baton_core::{Run, StepRecord, TaskId, Transition, Workflow};
use serde_json::Value;

use self::phases::Planner;
use super::json;
use super::runs::{Loaded, SettledTiming};
use crate::decisions::Embedded;
use crate::jq_runs::Evaluation;
use crate::model::{AttemptRecord, LoggedEvent, ModelUsage, StepState, StepStatus, TaskEntry};
use crate::parts::Part;
use crate::store::TransitionWrite;

/// A transition's write, and the changes it makes to the step and task maps.
#[derive(Clone)]
pub(super) struct Planned {
    pub write: TransitionWrite,
    /// Each new result with the part it is stored as, whose bytes its payload part and its
    /// watch event share.
    pub encoded: Vec<(Arc<Value>, Part)>,
    pub steps: Vec<(String, StepState)>,
    pub tasks_set: Vec<(String, TaskEntry)>,
    /// One per step visit settled, in history order.
    pub settled: Vec<SettledTiming>,
}

/// The answer a transition records: which worker answered which attempt of which task. The
/// write is fenced by the attempt: it applies only while that attempt is the task's current one.
#[derive(Debug, Clone, Copy)]
pub(super) struct Answering<'a> {
    /// Empty when no worker answered (a task given up after being lost too often).
    pub worker_id: &'a str,
    pub task: &'a TaskId,
    pub attempt: u32,
    /// The tokens the attempt used.
    pub usage: &'a [ModelUsage],
    /// When the attempt was sent to its worker (ms since the epoch), 0 when unknown.
    pub started_ms: i64,
    /// The data as the worker sent it, digest checked, when it answered with data.
    pub sent: Option<&'a Part>,
}

impl Answering<'_> {
    /// The attempt as it ended at `now_ms`, failed with `error` (empty when it succeeded).
    pub fn record(&self, now_ms: i64, error: &str) -> AttemptRecord {
        AttemptRecord {
            visit: self.task.visit,
            attempt: self.attempt,
            worker_id: (!self.worker_id.is_empty()).then(|| self.worker_id.into()),
            started_ms: self.started_ms,
            finished_ms: now_ms,
            error: (!error.is_empty()).then(|| error.to_owned()),
        }
    }
}

/// Who takes the tasks a transition dispatches: this coordinator, for a lease, if one of its
/// workers serves the agent.
pub(super) struct Holder<'a> {
    pub id: &'a str,
    pub lease_ms: u64,
    pub serves: Box<dyn Fn(&str) -> bool + 'a>,
    /// This coordinator goes on with a run whose walk stopped before a step that runs jq
    /// (not when it is shutting down: then any other one does, at once).
    pub continues: bool,
}

/// What happened and when, for [`plan`].
pub(super) struct Applied<'a> {
    /// The event the transition applied ([`StoredEvent::Started`] for the one that starts
    /// the run); `None` for a write of no event.
    pub event: Option<&'a LoggedEvent>,
    pub answering: Option<Answering<'a>>,
    pub transition: &'a Transition,
    /// How many step visits the run had settled before the transition.
    pub history_before: usize,
    pub now_ms: i64,
    /// Vectors of the decisions the event's result reported.
    pub embedded: Option<&'a Embedded>,
    /// The jq programs the transition ran, in order (their outputs stored under their sites).
    pub computed: &'a [Evaluation],
    /// A task entry (key, attempt) the write applies only while current (a turn of the run's
    /// computation: its continuation timer's).
    pub fence: Option<(&'a str, u32)>,
}

/// Turns a transition into the store write that records it, phase by phase: the answer
/// recorded, the settled visits stored and chained, the programs' outputs kept, the maps'
/// progress, the actions' tasks and timers, the new decisions, then the run's status.
pub(super) fn plan(loaded: &Loaded, applied: &Applied<'_>, holder: &Holder<'_>) -> Planned {
    let mut planner = Planner::new(loaded, applied, holder);
    if let Some(answering) = applied.answering {
        planner.record_answer(answering);
    }
    planner.settle_history();
    planner.keep_data_of_a_failed_answer();
    planner.keep_computed_outputs();
    planner.count_map_progress();
    planner.act();
    planner.drop_taken_continuation();
    planner.store_new_decisions();
    planner.finish()
}

impl Loaded {
    /// Takes on a transition the store acknowledged at `version`.
    pub(super) fn adopt(&mut self, run: Run, version: u64, planned: Planned) {
        self.take_on(run, planned);
        self.version = version;
    }

    /// Takes on a transition before its write, keeping the version (the next transition of a
    /// batch is planned on this one), and returns the write. The caller sets the version once
    /// the store acknowledges the write, or drops this copy of the run if it does not.
    pub(super) fn take_on(&mut self, run: Run, planned: Planned) -> TransitionWrite {
        self.run = run;
        self.steps.extend(planned.steps);
        for key in &planned.write.tasks_removed {
            self.tasks.remove(key);
        }
        self.tasks.extend(planned.tasks_set);
        for (value, part) in planned.encoded {
            self.parts.encoded(&value, part);
        }
        self.updated_ms = planned.write.updated_ms;
        self.state_sha256.clone_from(&planned.write.state_sha256);
        // Spans of the settled steps are written when the transitions are acted on, all of a
        // batch at once.
        self.settled.extend(planned.settled);
        planned.write
    }
}

/// The part a new result is stored and passed on as: the bytes the answering worker sent, whose
/// digest was checked when they arrived, if they are the coordinator's own encoding of `data`
/// (a worker of this version encodes as the coordinator does), so that a 64 KiB result is not
/// hashed a second time; else that encoding, hashed. Comparing is a fraction of hashing, and a
/// result that is not the worker's data (a transform's, an `output` mapping) differs in length
/// or at once.
fn result_part(answering: Option<Answering<'_>>, data: &Value) -> Part {
    let encoding = json(data);
    match answering.and_then(|answering| answering.sent) {
        Some(sent) if sent.json[..] == encoding[..] => sent.clone(),
        _ => Part::new(encoding),
    }
}

/// When `record`'s visit started (the time it started waiting, as the run's step states said
/// before this transition; or when it settled, for a step that took no time) and, for a branch,
/// which visit of its parallel step it belongs to.
fn settled_timing(loaded: &Loaded, run: &Run, record: &StepRecord) -> SettledTiming {
    let since = |id: &str, visit: u32| {
        loaded
            .steps
            .get(id)
            .filter(|state| state.since_visit == visit && state.since_ms > 0)
            .map(|state| state.since_ms)
    };
    let parallel_visit = record.parent.as_deref().map(|parallel| {
        // A parallel step under way when this transition began owns the branches settling in
        // it; otherwise it started in this transition.
        match loaded.steps.get(parallel) {
            Some(state) if state.status == StepStatus::Running && state.since_visit > 0 => {
                state.since_visit
            }
            _ => run.visits(parallel),
        }
    });
    SettledTiming {
        started_ms: since(&record.step_id, record.visit).unwrap_or(record.at_ms),
        parallel_visit,
    }
}

/// The id of the parallel step `step_id` is a branch of, if it is one.
pub(super) fn parallel_of<'w>(workflow: &'w Workflow, step_id: &str) -> Option<&'w str> {
    let index = workflow.index_of(step_id)?;
    Some(&*workflow.step(workflow.parallel_of(index)?).id)
}

/// The id of the map step whose item `step_id` runs: the map step itself (an `agent` map) or
/// the map whose chain holds it.
pub(super) fn map_of<'w>(workflow: &'w Workflow, step_id: &'w str) -> &'w str {
    workflow
        .index_of(step_id)
        .and_then(|index| workflow.map_of(index))
        .map_or(step_id, |map| &*workflow.step(map).id)
}

mod phases;
#[cfg(test)]
mod tests;
