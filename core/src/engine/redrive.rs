//! Redrive: a failed run resumed from the step that failed, as a new visit of it.
//!
//! A run that fails at a step keeps where it would resume ([`super::run::Resume`]): the step,
//! why the run came to it (through `on_error`, if it did) and, for a map step, the data of the
//! visit that failed. [`super::Event::Redrive`] records the failed visit as taken up again (a
//! history record with status `redriven`, so the state chain shows it) and enters the step
//! again: an agent, transform or approval runs again; a map step runs only the items that did
//! not succeed, keeping the others' results, and a parallel step (one that fails: it sets
//! `tolerated_failures`) only the branches that did not succeed. A run that did not fail at a
//! step (it was cancelled, its data failed an integrity check, a step reached its visit limit)
//! cannot be redriven.

use std::sync::Arc;

use imbl::Vector;
use serde_json::Value;

use super::build::Builder;
use super::events::EngineError;
use super::outcome::BranchOutcome;
use super::run::{Run, Transition};
use super::status::{RunStatus, StepRecord, StepStatus};

/// Applies [`super::Event::Redrive`] at `at_ms`.
pub(super) fn apply(run: &Run, at_ms: i64) -> Result<Transition, EngineError> {
    run.redrive_target()?;
    let resume = run.redrive.clone().expect("checked by redrive_target");
    let workflow = run.workflow.clone();
    let step = workflow.step(resume.step);
    let mut builder = Builder::new(run.clone());
    builder.run.now_ms = at_ms;
    builder.run.status = RunStatus::Running;
    builder.run.redrive = None;
    let error = builder.run.error.take();
    builder.run.history.push_back(StepRecord {
        step_id: step.id.clone(),
        step_type: step.step_type(),
        visit: run.visits.get(&resume.step).copied().unwrap_or(0),
        parent: None,
        item: None,
        status: StepStatus::Redriven,
        data: None,
        error: error.map(Arc::from),
        next: Some(step.id.clone()),
        notes: None,
        at_ms,
    });
    builder.kept = resume.kept.map(|data| (resume.step, kept_items(&data)));
    builder.redriving = true;
    if let Some(settled) = builder.enter(resume.step, resume.error) {
        builder.settle(settled);
    }
    Ok(builder.finish())
}

/// The items (or branches) of a map (or parallel) step's data that succeeded, in order; `None`
/// for the others.
fn kept_items(data: &Value) -> Vector<Option<BranchOutcome>> {
    data["data"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|entry| {
            (entry["status"] == "fulfilled").then(|| Ok(Arc::new(entry["result"].clone())))
        })
        .collect()
}
