//! One item's work: the map's agent, or its chain driven step by step inside the item's own
//! context (the snapshot plus the chain's results), routed like top-level steps, in a loop.

use std::sync::Arc;

use imbl::OrdMap;
use serde_json::{Value, json};

use super::ItemNext;
use super::reads::item_task;
use crate::context::{Context, StepResult};
use crate::engine::build::Builder;
use crate::engine::events::{Action, TaskId};
use crate::engine::outcome::{BranchOutcome, Outcome};
use crate::engine::pending::{ItemRun, MapRun};
use crate::engine::route::{Route, route};
use crate::engine::status::{StepRecord, StepStatus};
use crate::eval::{JqSite, Scope};
use crate::payload::ErrorInfo;
use crate::workflow::{MapBody, MapStep, StepIndex, StepKind, StepType};

/// What paths, conditions and jq programs of a chain step read: the item's context and `map`.
struct ItemScope<'a> {
    context: &'a Context,
    info: &'a Value,
}

impl Scope for ItemScope<'_> {
    fn input(&self) -> &Value {
        self.context.input()
    }

    fn result(&self, key: &str) -> Option<&Value> {
        self.context.result(key)
    }

    fn to_document(&self) -> Value {
        let mut document = self.context.to_document();
        document["map"] = Value::clone(self.info);
        document
    }

    fn map_item(&self) -> Option<&Value> {
        Some(self.info)
    }
}

/// What happens next to an item whose chain is being driven.
pub(super) enum Next {
    /// Step `index` (visit) settled with this outcome.
    Settled(StepIndex, u32, Outcome),
    /// Enter this chain step (through `on_error`, with the failure).
    Enter(StepIndex, Option<ErrorInfo>),
    /// It waits for an agent.
    Waits,
    Done(BranchOutcome),
}

impl Builder {
    /// Starts item `i`: its agent, or its chain's first step.
    pub(super) fn start_item(
        &mut self,
        index: StepIndex,
        spec: &MapStep,
        map: &MapRun,
        i: u32,
    ) -> ItemNext {
        let workflow = self.run.workflow.clone();
        let step = workflow.step(index);
        let info = Arc::new(json!({
            "step": step.id.as_ref(),
            "item": map.items[i as usize],
            "index": i,
            "count": map.items.len(),
        }));
        let mut item = ItemRun {
            info,
            step: index,
            visit: map.visit,
            error: None,
            handoff: None,
            context: map.snapshot.clone(),
            visits: OrdMap::new(),
            last: None,
            sources: Arc::default(),
            handed: Vec::new(),
        };
        match &spec.body {
            MapBody::Agent(agent) => {
                item.error = map.error.clone();
                match self.dispatch_item(index, agent, i, &mut item) {
                    Ok(()) => ItemNext::Waits(item),
                    Err(error) => ItemNext::Done(Err(error), Vec::new()),
                }
            }
            MapBody::Chain(chain) => self.drive(index, item, i, Next::Enter(chain[0], None)),
        }
    }

    /// Sends the item's agent task for step `index` (the map step or a chain agent).
    fn dispatch_item(
        &mut self,
        index: StepIndex,
        agent: &str,
        i: u32,
        item: &mut ItemRun,
    ) -> Result<(), Arc<str>> {
        let workflow = self.run.workflow.clone();
        let step = workflow.step(index);
        if let Some(key) = &step.input
            && item.context.data(key).is_none()
        {
            return Err(format!("Referenced step not found: {key}").into());
        }
        let sources = if item.sources.is_empty() {
            self.run.sources.clone()
        } else {
            item.sources.clone()
        };
        item.step = index;
        item.handoff = self.handoff_into(step, agent, item.visit, Some(i), &sources);
        let task = TaskId {
            step_id: step.id.clone().into(),
            visit: item.visit,
            item: Some(i),
        };
        let task = item_task(&self.run, task, agent, item);
        self.actions.push(Action::Dispatch(task));
        Ok(())
    }

    /// Runs an item's chain on from `next` until it waits for an agent or ends. A loop, not
    /// recursion: a chain of transforms and conditions may go round thousands of times.
    pub(super) fn drive(
        &mut self,
        map_index: StepIndex,
        mut item: ItemRun,
        i: u32,
        mut next: Next,
    ) -> ItemNext {
        loop {
            next = match next {
                Next::Settled(index, visit, outcome) => {
                    self.go_on(map_index, &mut item, i, index, visit, outcome)
                }
                Next::Enter(index, error) => self.enter_chain(&mut item, i, index, error),
                Next::Waits => return ItemNext::Waits(item),
                Next::Done(outcome) => {
                    return ItemNext::Done(outcome, std::mem::take(&mut item.handed));
                }
            }
        }
    }

    /// Enters chain step `index` for an item: an agent waits; a transform or condition settles.
    fn enter_chain(
        &mut self,
        item: &mut ItemRun,
        i: u32,
        index: StepIndex,
        error: Option<ErrorInfo>,
    ) -> Next {
        let workflow = self.run.workflow.clone();
        let step = workflow.step(index);
        let in_item = item.visits.get(&index).copied().unwrap_or(0) + 1;
        if in_item > step.max_visits {
            return Next::Done(Err(format!(
                "step \"{}\" reached its limit of {} visits in item {i}; if the loop is meant to run longer, raise \"max_visits\" on the workflow or the step",
                step.id, step.max_visits
            )
            .into()));
        }
        item.visits.insert(index, in_item);
        // Visits are counted over every item, so that each task and result is unique in the run.
        let visit = self.bump_visit(index);
        let outcome = match &step.kind {
            StepKind::Agent { agent } => {
                item.visit = visit;
                item.error = error;
                match self.dispatch_item(index, agent, i, item) {
                    Ok(()) => return Next::Waits,
                    Err(error) => Outcome::Failed(error),
                }
            }
            StepKind::Transform { transform, .. } => {
                let scope = ItemScope {
                    context: &item.context,
                    info: &item.info,
                };
                let site = JqSite {
                    step_id: &step.id,
                    visit,
                    item: Some(i),
                    items: false,
                };
                match transform.evaluate(&scope, &site) {
                    Ok(data) => self.within_transform_budget(data),
                    Err(error) => Outcome::Failed(error.into()),
                }
            }
            StepKind::Condition { condition, .. } => {
                let scope = ItemScope {
                    context: &item.context,
                    info: &item.info,
                };
                Outcome::Condition(condition.is_true(&scope))
            }
            _ => unreachable!("validation keeps chains to agents, transforms and conditions"),
        };
        Next::Settled(index, visit, outcome)
    }

    /// Step `index` of an item settled with `outcome`: records it, keeps its data in the
    /// item's context, and routes within the chain.
    fn go_on(
        &mut self,
        map_index: StepIndex,
        item: &mut ItemRun,
        i: u32,
        index: StepIndex,
        visit: u32,
        outcome: Outcome,
    ) -> Next {
        let workflow = self.run.workflow.clone();
        let step = workflow.step(index);
        self.record_item(map_index, index, visit, i, &outcome);
        if index == map_index {
            // An `agent` map: the agent's answer is the item's.
            return Next::Done(match outcome {
                Outcome::Data(data) => Ok(data),
                Outcome::Failed(error) => Err(error),
                _ => unreachable!("an agent settles with data or an error"),
            });
        }
        let error = match &outcome {
            Outcome::Data(data) => {
                item.context = item.context.with_result(
                    step.context_key.clone(),
                    StepResult::success(step.id.clone(), visit, data.clone()),
                );
                item.last = Some(data.clone());
                None
            }
            Outcome::Failed(error) => {
                item.context = item.context.with_result(
                    step.context_key.clone(),
                    StepResult::failure(step.id.clone(), visit, error.clone()),
                );
                Some(error.clone())
            }
            _ => None,
        };
        match route(step, &outcome) {
            Route::Goto(next) => Next::Enter(next, None),
            Route::Recover(next) => Next::Enter(
                next,
                Some(ErrorInfo {
                    step: step.id.clone(),
                    message: error.unwrap_or_else(|| "step failed".into()),
                }),
            ),
            Route::End => Next::Done(Ok(item
                .last
                .clone()
                .unwrap_or_else(|| Arc::new(Value::Null)))),
            Route::Fail => Next::Done(Err(error.unwrap_or_else(|| "step failed".into()))),
        }
    }

    /// Keeps one settled step visit of an item in the history (and on the state chain).
    fn record_item(
        &mut self,
        map_index: StepIndex,
        index: StepIndex,
        visit: u32,
        i: u32,
        outcome: &Outcome,
    ) {
        let workflow = self.run.workflow.clone();
        let step = workflow.step(index);
        let (status, data, error) = match outcome {
            Outcome::Data(data) => (StepStatus::Succeeded, Some(data.clone()), None),
            Outcome::Failed(error) => (StepStatus::Failed, None, Some(error.clone())),
            Outcome::Condition(value) => (
                StepStatus::Succeeded,
                Some(Arc::new(json!({ "result": value }))),
                None,
            ),
            _ => unreachable!("chain steps settle with data, an error or a condition"),
        };
        let step_type = if index == map_index {
            StepType::Agent
        } else {
            step.step_type()
        };
        self.run.history.push_back(StepRecord {
            step_id: step.id.clone(),
            step_type,
            visit,
            parent: Some(workflow.step(map_index).id.clone()),
            item: Some(i),
            status,
            data,
            error,
            next: None,
            notes: self.notes.take(),
            at_ms: self.run.now_ms,
        });
    }
}
