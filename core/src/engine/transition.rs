//! Entering and settling steps: the body of [`Run::start`] and [`Run::apply`].
//!
//! Transforms and conditions settle as soon as they are entered, so one transition may run
//! through several of them until it reaches work that waits (an agent, an approval, a parallel
//! step with such branches) or the end of the run. Visit limits bound that walk. A top-level
//! step that runs a `jq:` program is the exception: the walk stops before it
//! ([`Action::Continue`]), and only [`Event::Continue`] enters it, one such step a transition,
//! so that the coordinator decides when a computation runs and can stop it between two.

use std::sync::Arc;

use serde_json::{Value, json};

use super::build::{Builder, Settled};
use super::events::{Action, AgentTask, EngineError, Event, TaskId, Waiting};
use super::outcome::{Outcome, failure_summary, rejection_error};
use super::pending::Pending;
use super::route::{Route, route};
use super::run::{Continuation, Resume, Run, Transition};
use super::status::{RunStatus, StepRecord, StepStatus};
use crate::context::{Context, StepResult};
use crate::eval::JqSite;
use crate::handoff::AgentNotes;
use crate::limits::MAX_TRANSFORMED_BYTES_PER_TRANSITION;
use crate::payload::{AgentPayload, ErrorInfo};
use crate::workflow::{Step, StepIndex, StepKind};

pub(super) fn start(run: Run) -> Transition {
    let mut builder = Builder::new(run);
    let entry = builder.run.workflow.entry();
    if let Some(settled) = builder.enter(entry, None) {
        builder.settle(settled);
    }
    builder.finish()
}

pub(super) fn apply(run: &Run, event: Event, at_ms: i64) -> Result<Transition, EngineError> {
    if run.status.is_terminal() {
        return Err(EngineError::NotRunning(run.status));
    }
    let mut builder = Builder::new(run.clone());
    builder.run.now_ms = at_ms;
    match event {
        Event::AgentSucceeded { task, data, notes } if task.item.is_some() => {
            builder.notes = (!notes.is_empty()).then(|| Arc::new(notes.clone()));
            let settled = builder.settle_item(&task, |builder, hand| {
                match builder.hand_on_item(&task, notes, hand) {
                    Ok(()) => Outcome::Data(data),
                    Err(refused) => Outcome::Failed(refused),
                }
            })?;
            if let Some(settled) = settled {
                builder.settle(settled);
            }
        }
        Event::AgentFailed { task, error } if task.item.is_some() => {
            let settled = builder.settle_item(&task, |builder, hand| {
                builder
                    .hand_on_item(&task, AgentNotes::default(), hand)
                    .expect("without notes there is nothing to refuse");
                Outcome::Failed(error.into())
            })?;
            if let Some(settled) = settled {
                builder.settle(settled);
            }
        }
        Event::AgentSucceeded { task, data, notes } => {
            let (index, visit) = builder.take_agent(&task)?;
            builder.notes = (!notes.is_empty()).then(|| Arc::new(notes.clone()));
            let outcome = match builder.hand_on(index, visit, notes) {
                Ok(()) => Outcome::Data(data),
                Err(refused) => Outcome::Failed(refused),
            };
            builder.settle((index, visit, outcome));
        }
        Event::AgentFailed { task, error } => {
            let (index, visit) = builder.take_agent(&task)?;
            builder
                .hand_on(index, visit, AgentNotes::default())
                .expect("without notes there is nothing to refuse");
            builder.settle((index, visit, Outcome::Failed(error.into())));
        }
        Event::ApprovalDecided { step_id, decision } => {
            let (index, visit) = builder.take_approval(&step_id, None)?;
            builder.settle((index, visit, Outcome::Approval(decision)));
        }
        Event::ApprovalTimedOut { step_id, visit } => {
            let (index, visit) = builder.take_approval(&step_id, Some(visit))?;
            let timeout = builder
                .run
                .workflow
                .step(index)
                .timeout_ms
                .unwrap_or_default();
            let error = format!("approval timed out after {timeout} ms");
            builder.settle((index, visit, Outcome::Failed(error.into())));
        }
        Event::Cancel { reason } => builder.end(RunStatus::Cancelled, Some(reason)),
        Event::Halt { error } => builder.end(RunStatus::Failed, Some(error)),
        Event::Continue => {
            let continuation = builder
                .run
                .continuation
                .take()
                .ok_or(EngineError::NotContinuing)?;
            builder.continuing = true;
            builder.in_turn = true;
            builder.redriving = continuation.redriving;
            builder.kept = continuation.kept;
            if let Some(settled) = builder.enter(continuation.step, continuation.error) {
                builder.settle(settled);
            }
        }
        Event::Redrive => unreachable!("a redrive is applied by super::redrive"),
    }
    Ok(builder.finish())
}

impl Builder {
    fn take_agent(&mut self, task: &TaskId) -> Result<(StepIndex, u32), EngineError> {
        let unknown = || EngineError::UnknownTask(task.clone());
        let index = self
            .run
            .workflow
            .index_of(&task.step_id)
            .ok_or_else(unknown)?;
        match self.run.pending.get(&index) {
            Some(Pending::Agent { visit, error, .. }) if *visit == task.visit => {
                self.entered_with = error.clone();
                self.run.pending.remove(&index);
                Ok((index, task.visit))
            }
            _ => Err(unknown()),
        }
    }

    /// Takes the approval `step_id` is waiting for (only visit `only_visit`, if given: a
    /// timeout of an earlier visit is stale).
    fn take_approval(
        &mut self,
        step_id: &str,
        only_visit: Option<u32>,
    ) -> Result<(StepIndex, u32), EngineError> {
        let not_waiting = || EngineError::NotAwaitingApproval(step_id.to_owned());
        let index = self
            .run
            .workflow
            .index_of(step_id)
            .ok_or_else(not_waiting)?;
        match self.run.pending.get(&index) {
            Some(Pending::Approval { visit }) if only_visit.is_none_or(|v| v == *visit) => {
                let visit = *visit;
                self.run.pending.remove(&index);
                Ok((index, visit))
            }
            _ => Err(not_waiting()),
        }
    }

    /// Records settled steps and follows their routes until work waits or the run ends.
    pub(super) fn settle(&mut self, settled: Settled) {
        let mut next = Some(settled);
        while let Some((index, visit, outcome)) = next.take() {
            if self.run.status.is_terminal() {
                return;
            }
            next = match self.run.workflow.step(index).parent {
                Some(parent) => self.settle_branch(parent, index, visit, outcome),
                None => self
                    .settle_top_level(index, visit, outcome)
                    .and_then(|(target, error)| self.enter(target, error)),
            };
        }
    }

    pub(super) fn bump_visit(&mut self, index: StepIndex) -> u32 {
        let visit = self.run.visits.get(&index).copied().unwrap_or(0) + 1;
        self.run.visits.insert(index, visit);
        visit
    }

    /// Enters a top-level step; returns it at once if it settled without waiting.
    pub(super) fn enter(&mut self, index: StepIndex, error: Option<ErrorInfo>) -> Option<Settled> {
        let workflow = self.run.workflow.clone();
        let step = workflow.step(index);
        // A step that runs jq is entered only in a turn of the run's computation: the walk
        // stops here, unless this is that turn (and it goes on).
        if self.run.yields
            && workflow.runs_jq(index)
            && !std::mem::take(&mut self.continuing)
            && !(self.in_turn && crate::eval::go_on_installed())
        {
            self.run.continuation = Some(Continuation {
                step: index,
                error,
                redriving: std::mem::take(&mut self.redriving),
                kept: self.kept.take(),
            });
            self.actions.push(Action::Continue {
                step_id: step.id.clone(),
            });
            return None;
        }
        let visit = self.bump_visit(index);
        // A redrive resumes a visit that failed: that entry alone does not count against the
        // limit (the flag is spent by the first step entered, whatever follows in the walk).
        let redriving = std::mem::take(&mut self.redriving);
        if visit > step.max_visits && !redriving {
            self.end(
                RunStatus::Failed,
                Some(format!(
                    "step \"{}\" reached its limit of {} visits; if the loop is meant to run longer, raise \"max_visits\" on the workflow or the step",
                    step.id, step.max_visits
                )),
            );
            return None;
        }
        let snapshot = self.run.context.clone();
        self.begin(index, visit, &snapshot, error)
            .map(|outcome| (index, visit, outcome))
    }

    /// Starts a step against `snapshot`. Returns its outcome when it settles at once.
    pub(super) fn begin(
        &mut self,
        index: StepIndex,
        visit: u32,
        snapshot: &Context,
        error: Option<ErrorInfo>,
    ) -> Option<Outcome> {
        let workflow = self.run.workflow.clone();
        let step = workflow.step(index);
        match &step.kind {
            StepKind::Agent { agent } => {
                let reference = match &step.input {
                    None => None,
                    Some(key) => match snapshot.data(key) {
                        Some(data) => Some((key.clone(), data.clone())),
                        None => {
                            return Some(Outcome::Failed(
                                format!("Referenced step not found: {key}").into(),
                            ));
                        }
                    },
                };
                let sources = self.run.sources.clone();
                let handoff = self.handoff_into(step, agent, visit, None, &sources);
                self.run.pending.insert(
                    index,
                    Pending::Agent {
                        visit,
                        error: error.clone(),
                        handoff: handoff.clone(),
                    },
                );
                self.actions.push(Action::Dispatch(AgentTask {
                    task: TaskId::new(step.id.clone(), visit),
                    agent: agent.clone(),
                    payload: AgentPayload {
                        context: snapshot.clone(),
                        reference,
                        error,
                        messages: self.run.messages.json().clone(),
                        handoff,
                        map: None,
                    },
                    retry: step.retry.clone(),
                    timeout_ms: step.timeout_ms,
                }));
                None
            }
            StepKind::Transform { transform, .. } => {
                let site = JqSite {
                    step_id: &step.id,
                    visit,
                    item: None,
                    items: false,
                };
                Some(match transform.evaluate(snapshot, &site) {
                    Ok(data) => self.within_transform_budget(data),
                    Err(error) => Outcome::Failed(error.into()),
                })
            }
            StepKind::Condition { condition, .. } => {
                Some(Outcome::Condition(condition.is_true(snapshot)))
            }
            StepKind::Map(_) => {
                let kept = match self.kept.take() {
                    Some((step, kept)) if step == index => Some(kept),
                    other => {
                        self.kept = other;
                        None
                    }
                };
                self.begin_map(index, visit, snapshot, error, kept)
            }
            StepKind::Approval { message, .. } => {
                self.run.pending.insert(index, Pending::Approval { visit });
                self.actions.push(Action::AwaitApproval {
                    step_id: step.id.clone(),
                    visit,
                    message: message.clone(),
                    timeout_ms: step.timeout_ms,
                });
                None
            }
            StepKind::Parallel { .. } => self.begin_parallel(index, visit, snapshot),
        }
    }

    /// A transform's data, unless the transforms of this transition have produced more than
    /// [`MAX_TRANSFORMED_BYTES_PER_TRANSITION`]: a loop of transforms and conditions settles
    /// within one transition, copying its data on every visit, and without this bound one
    /// submit could make the coordinator copy (and store) gigabytes.
    pub(super) fn within_transform_budget(&mut self, data: Value) -> Outcome {
        self.transformed_bytes = self
            .transformed_bytes
            .saturating_add(approximate_bytes(&data));
        if self.transformed_bytes > MAX_TRANSFORMED_BYTES_PER_TRANSITION {
            return Outcome::Failed(
                format!(
                    "the transforms reached without waiting for an agent or an approval produced \
                     over {} MiB of data; a loop of transforms copies its data on every visit",
                    MAX_TRANSFORMED_BYTES_PER_TRANSITION >> 20
                )
                .into(),
            );
        }
        Outcome::Data(Arc::new(data))
    }

    /// Stops whatever step `index` waits for (its agent's task, its approval, a parallel
    /// step's branches, a map step's items), and forgets it.
    pub(super) fn abandon(&mut self, index: StepIndex) {
        let workflow = self.run.workflow.clone();
        let Some(pending) = self.run.pending.remove(&index) else {
            return;
        };
        let step = workflow.step(index);
        match pending {
            Pending::Agent { visit, .. } | Pending::Approval { visit } => {
                // An approval's timer goes the way of a task.
                self.actions
                    .push(Action::Abandon(TaskId::new(step.id.clone(), visit)));
            }
            Pending::Map(map) => {
                let run = self.run.clone();
                self.actions
                    .extend(run.items_waiting(&map).into_iter().filter_map(
                        |waiting| match waiting {
                            Waiting::Agent { task, .. } => Some(Action::Abandon(task)),
                            Waiting::Approval { .. } | Waiting::Computation { .. } => None,
                        },
                    ));
            }
            Pending::Parallel(_) => {
                if let StepKind::Parallel { branches, .. } = &step.kind {
                    for &branch in branches {
                        self.abandon(branch);
                    }
                }
            }
        }
    }

    /// Stores a top-level step's result, records it, and decides where the run goes.
    fn settle_top_level(
        &mut self,
        index: StepIndex,
        visit: u32,
        outcome: Outcome,
    ) -> Option<(StepIndex, Option<ErrorInfo>)> {
        let workflow = self.run.workflow.clone();
        let step = workflow.step(index);
        let entered_with = self.entered_with.take();
        let next = route(step, &outcome);
        let filed = Filed::of(step, visit, &outcome, next);
        let error = filed.error.clone();
        self.file_top_level(step, visit, filed, next);
        self.follow(step, index, next, &outcome, error, entered_with)
    }

    /// Puts a settled top-level step's result into the context (a condition's excepted) and
    /// its visit into the history, with where it routes.
    fn file_top_level(&mut self, step: &Step, visit: u32, filed: Filed, next: Route) {
        if let Some(result) = filed.stored {
            self.run.context = self
                .run
                .context
                .with_result(step.context_key.clone(), result);
        }
        let target = match next {
            Route::Goto(target) | Route::Recover(target) => Some(target),
            Route::End | Route::Fail => None,
        };
        self.run.history.push_back(StepRecord {
            step_id: step.id.clone(),
            step_type: step.step_type(),
            visit,
            parent: None,
            item: None,
            status: filed.status,
            data: filed.data,
            error: filed.error,
            next: target.map(|t| self.run.workflow.step(t).id.clone()),
            notes: self.notes.take(),
            at_ms: self.run.now_ms,
        });
    }

    /// Goes where a settled top-level step routes: the next step to enter (through `on_error`
    /// with the failure), or the run's end. A run that fails keeps where a redrive resumes.
    fn follow(
        &mut self,
        step: &Step,
        index: StepIndex,
        next: Route,
        outcome: &Outcome,
        error: Option<Arc<str>>,
        entered_with: Option<ErrorInfo>,
    ) -> Option<(StepIndex, Option<ErrorInfo>)> {
        match next {
            Route::Goto(target) => Some((target, None)),
            Route::Recover(target) => Some((
                target,
                Some(ErrorInfo {
                    step: step.id.clone(),
                    message: error.unwrap_or_else(|| "step failed".into()),
                }),
            )),
            Route::End => {
                self.end(RunStatus::Succeeded, None);
                None
            }
            Route::Fail => {
                self.run.redrive = Some(Resume::at(index, outcome, entered_with));
                let error = error.unwrap_or_else(|| "step failed".into());
                self.end(
                    RunStatus::Failed,
                    Some(format!("step \"{}\" failed: {error}", step.id)),
                );
                None
            }
        }
    }

    /// Ends the run; tasks still in flight are abandoned.
    fn end(&mut self, status: RunStatus, error: Option<String>) {
        // Every step waiting is in `pending`, branches included: its agents' tasks and its
        // maps' items are stopped; approvals' timers go with the run's other tasks.
        let pending: Vec<StepIndex> = self.run.pending.keys().copied().collect();
        for index in pending {
            match self.run.pending.get(&index) {
                Some(Pending::Agent { .. } | Pending::Map(_)) => self.abandon(index),
                _ => {
                    self.run.pending.remove(&index);
                }
            }
        }
        self.run.continuation = None;
        self.run.status = status;
        self.run.error = error.clone();
        self.actions.push(Action::Finished { status, error });
    }
}

/// What a settled top-level step files: its result for the context (none for a condition,
/// which only routes), and its history record's status, data and error.
struct Filed {
    stored: Option<StepResult>,
    status: StepStatus,
    data: Option<Arc<Value>>,
    error: Option<Arc<str>>,
}

impl Filed {
    /// What visit `visit` of the top-level `step` files, having settled with `outcome` and
    /// routing to `next`.
    fn of(step: &Step, visit: u32, outcome: &Outcome, next: Route) -> Filed {
        let success = |data: &Arc<Value>| StepResult::success(step.id.clone(), visit, data.clone());
        let failure = |error: &Arc<str>| StepResult::failure(step.id.clone(), visit, error.clone());
        let filed = |stored, status, data, error| Filed {
            stored,
            status,
            data,
            error,
        };
        match outcome {
            Outcome::Data(data) => filed(
                Some(success(data)),
                StepStatus::Succeeded,
                Some(data.clone()),
                None,
            ),
            Outcome::Failed(error) => filed(
                Some(failure(error)),
                StepStatus::Failed,
                None,
                Some(error.clone()),
            ),
            // Conditions only route: their value is kept in the history, not the context.
            Outcome::Condition(value) => filed(
                None,
                StepStatus::Succeeded,
                Some(Arc::new(json!({ "result": value }))),
                None,
            ),
            Outcome::Approval(decision) => {
                let data = Arc::new(decision.to_value());
                match (decision.approved, next) {
                    (true, _) => filed(
                        Some(success(&data)),
                        StepStatus::Succeeded,
                        Some(data),
                        None,
                    ),
                    // A routed rejection is data the next step needs (the reviewer's comment).
                    (false, Route::Goto(_)) => {
                        filed(Some(success(&data)), StepStatus::Rejected, Some(data), None)
                    }
                    (false, _) => {
                        let error = rejection_error(step, decision);
                        filed(
                            Some(failure(&error)),
                            StepStatus::Rejected,
                            Some(data),
                            Some(error),
                        )
                    }
                }
            }
            // A parallel or map step's data always enters the context, so that later steps
            // (and `on_error`) can read `success` and each branch's or item's outcome.
            Outcome::Merged {
                data,
                all_succeeded,
                failed,
            } => {
                let tolerated = step.tolerated_failures().is_some();
                let error = match failed {
                    Some(error) => Some(error.clone()),
                    None if *all_succeeded || tolerated => None,
                    None => Some(failure_summary(data)),
                };
                let status = if error.is_some() {
                    StepStatus::Failed
                } else {
                    StepStatus::Succeeded
                };
                filed(Some(success(data)), status, Some(data.clone()), error)
            }
        }
    }
}

/// About the size of `value` as JSON, without writing it: what a transform's data costs to keep
/// and store.
fn approximate_bytes(value: &Value) -> usize {
    match value {
        Value::Null | Value::Bool(_) => 4,
        Value::Number(_) => 8,
        Value::String(text) => text.len() + 2,
        Value::Array(items) => items.iter().map(approximate_bytes).sum::<usize>() + items.len() + 2,
        Value::Object(fields) => {
            fields
                .iter()
                .map(|(key, value)| key.len() + 4 + approximate_bytes(value))
                .sum::<usize>()
                + 2
        }
    }
}
