//! Map steps: the same work for every item of a list, as an `impl Builder` beside
//! [`super::transition`] and [`super::handoffs`]; the map's state ([`MapRun`], [`ItemRun`]) is
//! [`super::pending`]'s, as every step's work under way is.
//!
//! Entering a map step evaluates `items` against the context as it is then (the snapshot every
//! item sees) and starts items in order until `max_concurrency` of them wait for agents; each
//! item that settles files its outcome into its slot and starts the next. An item runs the map's
//! `agent` (a task of the map step itself, per item) or its chain, routed like top-level steps
//! inside an item context of its own (the snapshot plus the chain's results). When every item has
//! settled, the step's data is `{"success", "data": [{"index", "status", "result", "error"}]}` in
//! item order, and the items' messages join the history in index order. More failures than
//! `tolerated_failures` abandon the items in flight at once and fail the step.
//!
//! Everything an item changes is O(1) (persistent vectors and maps, shared snapshots): settling
//! one item of 100,000 costs what settling one of ten does, until the last one builds the data.
//!
//! - this file: entering the map, filing items and settling it.
//! - `chain`: one item's work: its agent, or its chain driven step by step.
//! - `reads`: the tasks and waits of items in flight, rebuilt from the run.

mod chain;
mod reads;

use std::sync::Arc;

use imbl::{OrdMap, Vector};
use serde_json::{Map, Value, json};

use super::build::Builder;
use super::events::{Action, EngineError, TaskId};
use super::handoffs::ItemHand;
use super::outcome::{BranchOutcome, Outcome};
use super::pending::{Handed, ItemRun, MapRun, Pending};
use crate::context::Context;
use crate::eval::JqSite;
use crate::handoff::Source;
use crate::limits::{MAP_MAX_IN_FLIGHT, MAX_MAP_ITEMS};
use crate::messages::MessageUpdate;
use crate::payload::ErrorInfo;
use crate::workflow::{MapStep, StepIndex, StepKind};
use chain::Next;

/// Where an item stands after a step of it settled.
enum ItemNext {
    /// It waits for an agent again.
    Waits(ItemRun),
    /// It is done, with this outcome.
    Done(BranchOutcome, Vec<(Arc<Source>, Vec<MessageUpdate>)>),
}

impl Builder {
    /// Enters a map step: evaluates its items and starts them. Returns its outcome when it
    /// settles at once (no items, or items that need no agent).
    pub(super) fn begin_map(
        &mut self,
        index: StepIndex,
        visit: u32,
        snapshot: &Context,
        error: Option<ErrorInfo>,
        kept: Option<Vector<Option<BranchOutcome>>>,
    ) -> Option<Outcome> {
        let workflow = self.run.workflow.clone();
        let StepKind::Map(map) = &workflow.step(index).kind else {
            unreachable!("only map steps begin as maps");
        };
        let site = JqSite {
            step_id: &workflow.step(index).id,
            visit,
            item: None,
            items: true,
        };
        let items = match items_of(map, snapshot, &site) {
            Ok(items) => items,
            Err(error) => return Some(Outcome::Failed(error.into())),
        };
        // A redrive keeps what succeeded, if the items are still the same list.
        let kept = kept.filter(|kept| kept.len() == items.len());
        let mut outcomes: Vector<Option<BranchOutcome>> = Vector::new();
        let mut queue = Vector::new();
        let mut succeeded = 0;
        for i in 0..items.len() {
            match kept.as_ref().and_then(|kept| kept[i].clone()) {
                Some(Ok(result)) => {
                    outcomes.push_back(Some(Ok(result)));
                    succeeded += 1;
                }
                _ => {
                    outcomes.push_back(None);
                    queue.push_back(i as u32);
                }
            }
        }
        let run = MapRun {
            visit,
            snapshot: snapshot.clone(),
            error,
            handed: Vector::from(vec![None; items.len()]),
            items: Arc::new(items),
            outcomes,
            queue,
            running: OrdMap::new(),
            succeeded,
            failed: 0,
        };
        self.advance_map(index, run)
    }

    /// Takes the map item `task` answers, if the run waits for it: the map step's index, its
    /// state (out of `pending`, put back by [`Builder::advance_map`]) and the item.
    fn take_item(&mut self, task: &TaskId) -> Result<(StepIndex, MapRun, ItemRun), EngineError> {
        let unknown = || EngineError::UnknownTask(task.clone());
        let (item, step) = task
            .item
            .zip(self.run.workflow.index_of(&task.step_id))
            .ok_or_else(unknown)?;
        let map_index = match self.run.workflow.map_of(step) {
            Some(map) => map,
            None => step,
        };
        let Some(Pending::Map(map)) = self.run.pending.get(&map_index) else {
            return Err(unknown());
        };
        match map.running.get(&item) {
            Some(running) if running.step == step && running.visit == task.visit => {}
            _ => return Err(unknown()),
        }
        let Some(Pending::Map(mut map)) = self.run.pending.remove(&map_index) else {
            unreachable!("just found");
        };
        let running = map.running.remove(&item).expect("just found");
        Ok((map_index, *map, running))
    }

    /// An agent of a map item answered: the item goes on (or is done), the map starts what it
    /// can. Returns the map step if it settled.
    pub(super) fn settle_item(
        &mut self,
        task: &TaskId,
        outcome: impl FnOnce(&mut Builder, &mut ItemHand<'_>) -> Outcome,
    ) -> Result<Option<(StepIndex, u32, Outcome)>, EngineError> {
        let (map_index, mut map, mut item) = self.take_item(task)?;
        let index = task.item.expect("an item task");
        let outcome = outcome(
            self,
            &mut ItemHand {
                sources: &mut item.sources,
                handed: &mut item.handed,
            },
        );
        let step = item.step;
        let next = self.drive(
            map_index,
            item,
            index,
            Next::Settled(step, task.visit, outcome),
        );
        self.file(&mut map, index, next);
        let visit = map.visit;
        Ok(self
            .advance_map(map_index, map)
            .map(|outcome| (map_index, visit, outcome)))
    }

    /// Starts items while there is room, and settles the map once every item has settled (or
    /// too many failed). Puts the map back into `pending` while it waits.
    fn advance_map(&mut self, index: StepIndex, mut map: MapRun) -> Option<Outcome> {
        let workflow = self.run.workflow.clone();
        let step = workflow.step(index);
        let StepKind::Map(spec) = &step.kind else {
            unreachable!("only map steps advance");
        };
        let cap = spec.max_concurrency.unwrap_or(MAP_MAX_IN_FLIGHT) as usize;
        loop {
            if let Some(tolerance) = spec.tolerated_failures
                && tolerance.exceeded_by(map.failed, map.items.len())
            {
                self.entered_with = map.error.clone();
                return Some(self.give_up(step.id.clone(), spec, map));
            }
            if map.running.len() >= cap {
                break;
            }
            let Some(i) = map.queue.pop_front() else {
                break;
            };
            let next = self.start_item(index, spec, &map, i);
            self.file(&mut map, i, next);
        }
        if map.running.is_empty() && map.queue.is_empty() {
            self.entered_with = map.error.clone();
            return Some(self.collect(index, map, None));
        }
        self.run.pending.insert(index, Pending::Map(Box::new(map)));
        None
    }

    /// Files where an item stands: waiting again, or settled into its slot.
    fn file(&mut self, map: &mut MapRun, i: u32, next: ItemNext) {
        match next {
            ItemNext::Waits(item) => {
                map.running.insert(i, item);
            }
            ItemNext::Done(outcome, handed) => {
                if outcome.is_ok() {
                    map.succeeded += 1;
                } else {
                    map.failed += 1;
                }
                map.outcomes.set(i as usize, Some(outcome));
                if !handed.is_empty() {
                    map.handed.set(i as usize, Some(Handed { entries: handed }));
                }
            }
        }
    }

    /// Too many items failed: those in flight are abandoned, those not started never run, and
    /// the step fails.
    fn give_up(&mut self, step_id: Arc<str>, spec: &MapStep, mut map: MapRun) -> Outcome {
        let tolerance = spec
            .tolerated_failures
            .expect("only a map with a tolerance gives up");
        let why = format!(
            "{} of {} items failed; tolerated_failures is {tolerance}",
            map.failed,
            map.items.len()
        );
        for (i, item) in std::mem::take(&mut map.running) {
            self.actions.push(Action::Abandon(TaskId {
                step_id: self.run.workflow.step(item.step).id.clone().into(),
                visit: item.visit,
                item: Some(i),
            }));
            map.outcomes
                .set(i as usize, Some(Err(format!("abandoned: {why}").into())));
        }
        for i in std::mem::take(&mut map.queue) {
            map.outcomes
                .set(i as usize, Some(Err(format!("not run: {why}").into())));
        }
        let index = self
            .run
            .workflow
            .index_of(&step_id)
            .expect("the map step is in its workflow");
        self.collect(index, map, Some(why.into()))
    }

    /// Every item has settled (or been given up): the step's data, in item order, and the
    /// items' messages into the history, in index order.
    fn collect(&mut self, index: StepIndex, map: MapRun, failed: Option<Arc<str>>) -> Outcome {
        self.merge_handed(index, &map.handed);
        let mut all_succeeded = true;
        let data: Vec<Value> = map
            .outcomes
            .iter()
            .enumerate()
            .map(|(i, outcome)| {
                let mut entry = Map::with_capacity(4);
                entry.insert("index".into(), json!(i));
                match outcome {
                    Some(Ok(result)) => {
                        entry.insert("status".into(), json!("fulfilled"));
                        entry.insert("result".into(), Value::clone(result));
                        entry.insert("error".into(), Value::Null);
                    }
                    Some(Err(error)) => {
                        all_succeeded = false;
                        entry.insert("status".into(), json!("rejected"));
                        entry.insert("result".into(), Value::Null);
                        entry.insert("error".into(), json!(error.as_ref()));
                    }
                    None => unreachable!("every item has settled"),
                }
                Value::Object(entry)
            })
            .collect();
        Outcome::Merged {
            data: Arc::new(json!({"success": all_succeeded, "data": data})),
            all_succeeded,
            failed,
        }
    }
}

/// The items of a map step: an array, of at most [`MAX_MAP_ITEMS`].
fn items_of(map: &MapStep, snapshot: &Context, site: &JqSite<'_>) -> Result<Vec<Value>, String> {
    let items = map
        .items
        .evaluate(snapshot, site)
        .map_err(|error| format!("items \"{}\": {error}", map.items_source))?;
    match items {
        Value::Array(items) if items.len() > MAX_MAP_ITEMS => Err(format!(
            "items \"{}\" gave {} items; a map step takes at most {MAX_MAP_ITEMS}",
            map.items_source,
            items.len()
        )),
        Value::Array(items) => Ok(items),
        other => Err(format!(
            "items must give an array; \"{}\" gave {}",
            map.items_source,
            kind_of(&other)
        )),
    }
}

/// "an object", "a string", ... with a short excerpt of scalars.
fn kind_of(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("a boolean ({b})"),
        Value::Number(n) => format!("a number ({n})"),
        Value::String(s) => format!("a string (\"{}\")", s.chars().take(40).collect::<String>()),
        Value::Array(_) => "an array".into(),
        Value::Object(fields) => format!("an object with {} fields", fields.len()),
    }
}
