//! The phases of [`plan`](super::plan), each a method of the [`Planner`] that carries the write
//! as it grows. They run in the order `plan` calls them: later phases read what earlier ones
//! wrote (the results stored, the step states changed).

use std::collections::BTreeMap;

use baton_core::handoff::DecisionRecord;
use baton_core::integrity::ChainLink;
use baton_core::workflow::StepType;
use baton_core::{Action, Run, RunStatus, StepRecord, TaskId};
use bytes::Bytes;

use super::{Answering, Applied, Holder, Planned, json, map_of, parallel_of, result_part};
use super::{Loaded, settled_timing};
use crate::decisions::StoredDecision;
use crate::lease;
use crate::model::{
    AttemptUsage, ItemCounts, LoggedEvent, StepState, StepStatus, StoredEvent, TaskEntry,
    keep_attempts,
};
use crate::store::TransitionWrite;
use crate::task_ref::{chain_step, record_key, task_key, visit_key};

/// A transition's write as it is being planned.
pub(super) struct Planner<'a> {
    loaded: &'a Loaded,
    applied: &'a Applied<'a>,
    holder: &'a Holder<'a>,
    run: &'a Run,
    now: i64,
    /// Only what changes is copied: a transition costs the size of its change, not of the run
    /// (a 500-branch parallel step settles 500 times).
    steps: BTreeMap<String, StepState>,
    write: TransitionWrite,
    planned: Planned,
    /// The state chain's head after the links appended so far.
    head: String,
}

impl<'a> Planner<'a> {
    pub fn new(loaded: &'a Loaded, applied: &'a Applied<'a>, holder: &'a Holder<'a>) -> Self {
        let mut write = TransitionWrite {
            events: applied.event.map(json).into_iter().collect(),
            ..TransitionWrite::default()
        };
        if let Some((key, attempt)) = applied.fence {
            write.fences.push((key.to_owned(), attempt));
        }
        Planner {
            loaded,
            applied,
            holder,
            run: &applied.transition.run,
            now: applied.now_ms,
            steps: BTreeMap::new(),
            write,
            planned: Planned {
                write: TransitionWrite::default(),
                encoded: Vec::new(),
                steps: Vec::new(),
                tasks_set: Vec::new(),
                settled: Vec::new(),
            },
            head: loaded.state_sha256.clone(),
        }
    }

    /// The step's state as this transition changes it, starting from what was loaded.
    fn changed(&mut self, id: &str) -> &mut StepState {
        let loaded = self.loaded;
        self.steps
            .entry(id.to_owned())
            .or_insert_with(|| loaded.steps.get(id).cloned().unwrap_or_default())
    }

    /// The answered task goes, fenced by its attempt; its tokens and attempts are recorded on
    /// its step (a map item's tokens on its map step).
    pub fn record_answer(&mut self, answering: Answering<'_>) {
        let key = task_key(answering.task);
        self.write.tasks_removed.push(key.clone());
        // Recorded only while this attempt is the task's current one.
        self.write.fences.push((key.clone(), answering.attempt));
        match answering.task.item {
            Some(_) => self.count_item_usage(answering, &key),
            None => self.record_attempt(answering, &key),
        }
    }

    /// A map item's tokens are summed on its map step: one write the size of the models used,
    /// however many items there are.
    fn count_item_usage(&mut self, answering: Answering<'_>, key: &str) {
        let map = map_of(self.run.workflow(), &answering.task.step_id);
        let earlier = self.loaded.tasks.get(key).map(|entry| {
            entry
                .usage
                .iter()
                .map(|u| u.usage.clone())
                .collect::<Vec<_>>()
        });
        let counts = self.changed(map).items.get_or_insert_with(Default::default);
        if let Some(earlier) = earlier {
            counts.add_usage(&earlier);
        }
        counts.add_usage(answering.usage);
    }

    /// The worker, tokens and attempt log of an answered step's visit.
    fn record_attempt(&mut self, answering: Answering<'_>, key: &str) {
        let (now, loaded, applied) = (self.now, self.loaded, self.applied);
        let entry = loaded.tasks.get(key);
        let error = match applied.event.map(|logged| &logged.event) {
            Some(StoredEvent::AgentFailed { error, .. }) => error.as_str(),
            _ => "",
        };
        let state = self.changed(&answering.task.step_id);
        if !answering.worker_id.is_empty() {
            state.worker_id = Some(answering.worker_id.into());
        }
        // The answer can overtake the bookkeeping of its own delivery.
        state.attempts = state.attempts.max(answering.attempt);
        // What the visit's failed attempts used and how they ended (carried by its task), then
        // this one.
        if let Some(entry) = entry {
            state.usage.extend(entry.usage.iter().cloned());
        }
        let visit = answering.task.visit;
        state
            .usage
            .extend(AttemptUsage::of(visit, answering.attempt, answering.usage));
        let earlier = entry.map(|entry| entry.attempt_log.iter().cloned());
        keep_attempts(
            &mut state.attempt_log,
            earlier
                .into_iter()
                .flatten()
                .chain([answering.record(now, error)]),
        );
    }

    /// Each step visit the transition settled: its data stored once, a link appended to the
    /// state chain, its step's state.
    pub fn settle_history(&mut self) {
        let run = self.run;
        for record in &run.history_since(self.applied.history_before) {
            self.planned
                .settled
                .push(settled_timing(self.loaded, run, record));
            let key = record_key(record);
            // Agent and transform data is stored once here; parallel and map data is rebuilt
            // from its branches and items, conditions and approvals from the event log.
            if matches!(record.step_type, StepType::Agent | StepType::Transform)
                && let Some(data) = &record.data
            {
                let part = result_part(self.applied.answering, data);
                self.write.results.push((key.clone(), part.json.clone()));
                self.planned.encoded.push((data.clone(), part));
            }
            self.chain(record);
            self.settle_step(record, key);
        }
    }

    fn chain(&mut self, record: &StepRecord) {
        let link = ChainLink::after(
            &self.head,
            &chain_step(record),
            record.visit,
            record.result_sha256(),
        );
        self.head = link.state_sha256.clone();
        self.write.links.push(json(&link));
    }

    /// The state of a settled visit's step; `key` is its result key.
    fn settle_step(&mut self, record: &StepRecord, key: String) {
        let visits = self.run.visits(&record.step_id);
        if record.item.is_some() {
            // An item's step visit: its map step's counts say how the items stand. A chain
            // step's own state shows its visits (over every item) and how the latest ended.
            if record.parent.as_deref() != Some(&*record.step_id) {
                let state = self.changed(&record.step_id);
                state.status = record.status.into();
                state.visits = visits;
            }
            return;
        }
        // A decided (or timed out) approval's timer goes with it.
        if record.step_type == StepType::Approval && self.loaded.tasks.contains_key(&key) {
            self.write.tasks_removed.push(key);
        }
        let state = self.changed(&record.step_id);
        state.status = record.status.into();
        state.visits = visits;
        state.error = record.error.as_deref().map(str::to_owned);
        if record.step_type == StepType::Map
            && record.status != baton_core::StepStatus::Redriven
            && let Some(data) = &record.data
        {
            let counts = state.items.get_or_insert_with(Default::default);
            let entries = data["data"].as_array().map_or(&[][..], Vec::as_slice);
            counts.count = entries.len() as u64;
            counts.succeeded = entries
                .iter()
                .filter(|entry| entry["status"] == "fulfilled")
                .count() as u64;
            counts.failed = counts.count - counts.succeeded;
            counts.running = 0;
        }
    }

    /// The log names an agent's answer by its result key, and a replay reads the data back
    /// from there. An answer the engine took but whose step failed (its messages removed an id
    /// the history does not have) settles with no data, so `settle_history` stored nothing:
    /// without this, the chain would link a visit whose event cannot be read back, and every
    /// load of the run would report tampering for what was the agent's own mistake.
    pub fn keep_data_of_a_failed_answer(&mut self) {
        if let Some(LoggedEvent {
            event: StoredEvent::AgentSucceeded { result, .. },
            ..
        }) = self.applied.event
            && let Some(sent) = self.applied.answering.and_then(|answering| answering.sent)
            && !self.write.results.iter().any(|(key, _)| key == result)
        {
            self.write.results.push((result.clone(), sent.json.clone()));
        }
    }

    /// A replay reads each jq program's output back from its site instead of running it again.
    /// A transform's is its step's result, stored by `settle_history`; a map step's items, or an
    /// output whose step failed after all (the transition's transforms made too much data), are
    /// stored here.
    pub fn keep_computed_outputs(&mut self) {
        for evaluation in self.applied.computed {
            if let Ok(output) = &evaluation.outcome
                && !self
                    .write
                    .results
                    .iter()
                    .any(|(key, _)| *key == evaluation.at)
            {
                self.write.results.push((
                    evaluation.at.clone(),
                    Bytes::copy_from_slice(output.as_bytes()),
                ));
            }
        }
    }

    /// The items of the maps under way, as this transition leaves them.
    pub fn count_map_progress(&mut self) {
        let dispatches_items = self
            .applied
            .transition
            .actions
            .iter()
            .any(|action| matches!(action, Action::Dispatch(task) if task.task.item.is_some()));
        let (now, run) = (self.now, self.run);
        for progress in run.map_progress() {
            if !dispatches_items && !self.steps.contains_key(progress.step_id.as_ref()) {
                continue;
            }
            let state = self.changed(&progress.step_id);
            if state.since_visit != progress.visit {
                // The map's visit starts: its items so far belong to the visit before.
                state.since_visit = progress.visit;
                state.since_ms = now;
                state.visits = progress.visit;
                state.error = None;
                state.items = Some(ItemCounts {
                    usage: Vec::new(),
                    ..ItemCounts::default()
                });
            }
            state.status = StepStatus::Running;
            let counts = state.items.get_or_insert_with(Default::default);
            counts.count = progress.count as u64;
            counts.succeeded = progress.succeeded as u64;
            counts.failed = progress.failed as u64;
            counts.running = progress.running as u64;
        }
    }

    /// The tasks and timers of the transition's actions, and the states of their steps.
    pub fn act(&mut self) {
        let applied = self.applied;
        for action in &applied.transition.actions {
            match action {
                Action::Dispatch(task) => self.dispatch(&task.task, &task.agent),
                Action::AwaitApproval {
                    step_id,
                    visit,
                    timeout_ms,
                    ..
                } => self.await_approval(step_id, *visit, *timeout_ms),
                Action::Abandon(task) => self.abandon(task),
                Action::Finished { .. } => {}
                Action::Continue { .. } => {
                    // Held here for a lease, or (shutting down) due at once for another.
                    let entry = match self.holder.continues {
                        true => lease::continuation(
                            Some(self.holder.id),
                            self.now,
                            self.holder.lease_ms,
                        ),
                        false => lease::continuation(None, self.now, 0),
                    };
                    self.set_task(lease::CONTINUATION.to_owned(), entry);
                }
            }
        }
    }

    fn set_task(&mut self, key: String, entry: TaskEntry) {
        self.write.tasks_set.push((key.clone(), entry.encode()));
        self.planned.tasks_set.push((key, entry));
    }

    fn dispatch(&mut self, task: &TaskId, agent: &str) {
        let owner = (self.holder.serves)(agent).then_some(self.holder.id);
        let entry = lease::dispatched(agent, owner, self.now, self.holder.lease_ms);
        self.set_task(task_key(task), entry);
        if task.item.is_some() {
            // Items: their map step's counts, in `count_map_progress`.
            return;
        }
        let (now, visits) = (self.now, self.run.visits(&task.step_id));
        let state = self.changed(&task.step_id);
        state.status = StepStatus::Queued;
        state.visits = visits;
        state.error = None;
        state.since_ms = now;
        state.since_visit = task.visit;
        // The attempt that reaches a worker is written here when it does.
        state.attempts = 0;
        // A parallel step's visit starts with its first branch.
        if let Some(parallel) = parallel_of(self.run.workflow(), &task.step_id) {
            let visit = self.run.visits(parallel);
            let state = self.changed(parallel);
            if state.since_visit != visit {
                state.since_ms = now;
                state.since_visit = visit;
                state.status = StepStatus::Running;
                state.error = None;
            }
        }
    }

    fn await_approval(&mut self, step_id: &str, visit: u32, timeout_ms: Option<u64>) {
        let (now, visits) = (self.now, self.run.visits(step_id));
        let state = self.changed(step_id);
        state.status = StepStatus::Waiting;
        state.visits = visits;
        state.since_ms = now;
        state.since_visit = visit;
        if let Some(timeout_ms) = timeout_ms {
            self.set_task(
                visit_key(step_id, visit),
                lease::approval_timer(now, timeout_ms),
            );
        }
    }

    fn abandon(&mut self, task: &TaskId) {
        self.write.tasks_removed.push(task_key(task));
        let step = match task.item {
            Some(_) => map_of(self.run.workflow(), &task.step_id),
            None => &task.step_id,
        };
        // A map given up on keeps its failed status; a cancelled run's is cancelled.
        if task.item.is_none() || self.run.status() == RunStatus::Cancelled {
            self.changed(step).status = StepStatus::Cancelled;
        }
    }

    /// A continuation taken up: its timer goes, unless the walk stopped again (`act` set it).
    pub fn drop_taken_continuation(&mut self) {
        let continued = matches!(
            self.applied.event.map(|logged| &logged.event),
            Some(StoredEvent::Continue)
        );
        let set_again = self
            .write
            .tasks_set
            .iter()
            .any(|(key, _)| key == lease::CONTINUATION);
        if continued && !set_again {
            self.write
                .tasks_removed
                .push(lease::CONTINUATION.to_owned());
        }
    }

    /// The decisions the transition reported, with their embeddings.
    pub fn store_new_decisions(&mut self) {
        // `skip` on the vector, not its iterator: O(log n), not a walk over every decision so
        // far.
        let decisions = self.run.decisions();
        let new_decisions = decisions.skip(self.loaded.run.decisions().len().min(decisions.len()));
        for (n, decision) in new_decisions.iter().enumerate() {
            let vector = self
                .applied
                .embedded
                .and_then(|e| e.vectors.get(n).map(|v| (e.model.clone(), v.clone())));
            let stored = StoredDecision {
                run_id: self.loaded.header.run_id.clone(),
                decision: DecisionRecord::clone(decision),
                model: vector.as_ref().map(|(model, _)| model.clone()),
                embedding: vector.map(|(_, v)| v),
            };
            self.write
                .decisions
                .push((decision.key.clone(), stored.encode()));
        }
    }

    /// The step states and the run's status, chain head and time; a finished run keeps no task
    /// or timer (a cancelled run's approval timer, say).
    pub fn finish(mut self) -> Planned {
        if self.run.status().is_terminal() {
            for key in self.loaded.tasks.keys() {
                if !self.write.tasks_removed.contains(key) {
                    self.write.tasks_removed.push(key.clone());
                }
            }
        }
        let mut write = self.write;
        write.steps = self
            .steps
            .iter()
            .map(|(id, state)| (id.clone(), json(state)))
            .collect();
        write.status = self.run.status();
        write.error = self.run.error().map(str::to_owned);
        write.state_sha256 = self.head;
        write.updated_ms = self.now;
        Planned {
            write,
            steps: self.steps.into_iter().collect(),
            ..self.planned
        }
    }
}
