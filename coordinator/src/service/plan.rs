//! A transition as the store write that records it. Pure: nothing changes until the write is
//! acknowledged, and the same inputs always give the same write.
//!
//! One write holds everything a transition changes: the event, each new result once, the step
//! states and tasks that changed (each task with its lease and timer), the links appended to the
//! state chain, the decisions reported (with their embeddings), and the run's status.

use std::collections::BTreeMap;
use std::sync::Arc;

use baton_core::handoff::DecisionRecord;
use baton_core::integrity::ChainLink;
use baton_core::workflow::StepType;
use baton_core::{Action, Run, RunStatus, StepRecord, TaskId, Transition, Workflow};
use bytes::Bytes;
use serde_json::Value;

use super::json;
use super::runs::{Loaded, SettledTiming};
use crate::decisions::{Embedded, StoredDecision};
use crate::jq_runs::Evaluation;
use crate::lease;
use crate::model::{
    AttemptRecord, AttemptUsage, ItemCounts, LoggedEvent, ModelUsage, StepState, StepStatus,
    StoredEvent, TaskEntry, keep_attempts,
};
use crate::parts::Part;
use crate::store::TransitionWrite;
use crate::task_ref::{chain_step, record_key, task_key, visit_key};

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
            worker_id: self.worker_id.to_owned(),
            started_ms: self.started_ms,
            finished_ms: now_ms,
            error: error.to_owned(),
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

/// Turns a transition into the store write that records it.
pub(super) fn plan(loaded: &Loaded, applied: &Applied<'_>, holder: &Holder<'_>) -> Planned {
    let run = &applied.transition.run;
    let now = applied.now_ms;
    // Only what changes is copied: a transition costs the size of its change, not of the run
    // (a 500-branch parallel step settles 500 times).
    let mut steps: BTreeMap<String, StepState> = BTreeMap::new();
    let mut write = TransitionWrite {
        events: applied.event.map(json).into_iter().collect(),
        ..TransitionWrite::default()
    };
    let mut tasks_set = Vec::new();
    let mut head = loaded.state_sha256.clone();
    if let Some((key, attempt)) = applied.fence {
        write.fences.push((key.to_owned(), attempt));
    }
    if let Some(answering) = applied.answering {
        let key = task_key(answering.task);
        write.tasks_removed.push(key.clone());
        // Recorded only while this attempt is the task's current one.
        write.fences.push((key.clone(), answering.attempt));
        if answering.task.item.is_some() {
            // A map item's tokens are summed on its map step: one write the size of the
            // models used, however many items there are.
            let map = map_of(run.workflow(), &answering.task.step_id);
            let counts = changed(&mut steps, loaded, map)
                .items
                .get_or_insert_with(Default::default);
            if let Some(entry) = loaded.tasks.get(&key) {
                counts.add_usage(
                    &entry
                        .usage
                        .iter()
                        .map(|u| u.usage.clone())
                        .collect::<Vec<_>>(),
                );
            }
            counts.add_usage(answering.usage);
        }
    }
    if let Some(answering) = applied.answering.filter(|a| a.task.item.is_none()) {
        let state = changed(&mut steps, loaded, &answering.task.step_id);
        if !answering.worker_id.is_empty() {
            state.worker_id = answering.worker_id.to_owned();
        }
        // The answer can overtake the bookkeeping of its own delivery.
        state.attempts = state.attempts.max(answering.attempt);
        // What the visit's failed attempts used and how they ended (carried by its task), then
        // this one.
        let entry = loaded.tasks.get(&task_key(answering.task));
        if let Some(entry) = entry {
            state.usage.extend(entry.usage.iter().cloned());
        }
        let visit = answering.task.visit;
        state
            .usage
            .extend(AttemptUsage::of(visit, answering.attempt, answering.usage));
        let error = match applied.event.map(|logged| &logged.event) {
            Some(StoredEvent::AgentFailed { error, .. }) => error.as_str(),
            _ => "",
        };
        let earlier = entry.map(|entry| entry.attempt_log.iter().cloned());
        keep_attempts(
            &mut state.attempt_log,
            earlier
                .into_iter()
                .flatten()
                .chain([answering.record(now, error)]),
        );
    }
    let mut settled = Vec::new();
    let mut encoded = Vec::new();
    for record in &run.history_since(applied.history_before) {
        settled.push(settled_timing(loaded, run, record));
        let key = record_key(record);
        // Agent and transform data is stored once here; parallel and map data is rebuilt from
        // its branches and items, conditions and approvals from the event log.
        if matches!(record.step_type, StepType::Agent | StepType::Transform)
            && let Some(data) = &record.data
        {
            let part = result_part(applied.answering, data);
            write.results.push((key.clone(), part.json.clone()));
            encoded.push((data.clone(), part));
        }
        let link = ChainLink::after(
            &head,
            &chain_step(record),
            record.visit,
            record.result_sha256(),
        );
        head = link.state_sha256.clone();
        write.links.push(json(&link));
        if record.item.is_some() {
            // An item's step visit: its map step's counts say how the items stand. A chain
            // step's own state shows its visits (over every item) and how the latest ended.
            if record.parent.as_deref() != Some(&*record.step_id) {
                let state = changed(&mut steps, loaded, &record.step_id);
                state.status = record.status.into();
                state.visits = run.visits(&record.step_id);
            }
            continue;
        }
        let state = changed(&mut steps, loaded, &record.step_id);
        state.status = record.status.into();
        state.visits = run.visits(&record.step_id);
        state.error = record.error.as_deref().unwrap_or_default().to_owned();
        // A decided (or timed out) approval's timer goes with it.
        if record.step_type == StepType::Approval && loaded.tasks.contains_key(&key) {
            write.tasks_removed.push(key);
        }
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
    // The log names an agent's answer by its result key, and a replay reads the data back from
    // there. An answer the engine took but whose step failed (its messages removed an id the
    // history does not have) settles with no data, so the loop above stored nothing: without
    // this, the chain would link a visit whose event cannot be read back, and every load of
    // the run would report tampering for what was the agent's own mistake.
    if let Some(LoggedEvent {
        event: StoredEvent::AgentSucceeded { result, .. },
        ..
    }) = applied.event
        && let Some(sent) = applied.answering.and_then(|answering| answering.sent)
        && !write.results.iter().any(|(key, _)| key == result)
    {
        write.results.push((result.clone(), sent.json.clone()));
    }
    // A replay reads each jq program's output back from its site instead of running it again.
    // A transform's is its step's result, stored above; a map step's items, or an output whose
    // step failed after all (the transition's transforms made too much data), are stored here.
    for evaluation in applied.computed {
        if let Ok(output) = &evaluation.outcome
            && !write.results.iter().any(|(key, _)| *key == evaluation.at)
        {
            write.results.push((
                evaluation.at.clone(),
                Bytes::copy_from_slice(output.as_bytes()),
            ));
        }
    }
    // The items of the maps under way, as this transition leaves them.
    for progress in run.map_progress() {
        let touched =
            steps.contains_key(progress.step_id.as_ref())
                || applied.transition.actions.iter().any(
                    |action| matches!(action, Action::Dispatch(task) if task.task.item.is_some()),
                );
        if !touched {
            continue;
        }
        let state = changed(&mut steps, loaded, &progress.step_id);
        if state.since_visit != progress.visit {
            // The map's visit starts: its items so far belong to the visit before.
            state.since_visit = progress.visit;
            state.since_ms = now;
            state.visits = progress.visit;
            state.error.clear();
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
    for action in &applied.transition.actions {
        match action {
            Action::Dispatch(task) => {
                let key = task_key(&task.task);
                let owner = (holder.serves)(&task.agent).then_some(holder.id);
                let entry = lease::dispatched(&task.agent, owner, now, holder.lease_ms);
                write.tasks_set.push((key.clone(), entry.encode()));
                tasks_set.push((key, entry));
                if task.task.item.is_some() {
                    // Items: their map step's counts, below.
                    continue;
                }
                let state = changed(&mut steps, loaded, &task.task.step_id);
                state.status = StepStatus::Queued;
                state.visits = run.visits(&task.task.step_id);
                state.error.clear();
                state.since_ms = now;
                state.since_visit = task.task.visit;
                // The attempt that reaches a worker is written here when it does.
                state.attempts = 0;
                // A parallel step's visit starts with its first branch.
                if let Some(parallel) = parallel_of(run.workflow(), &task.task.step_id) {
                    let visit = run.visits(parallel);
                    let state = changed(&mut steps, loaded, parallel);
                    if state.since_visit != visit {
                        state.since_ms = now;
                        state.since_visit = visit;
                        state.status = StepStatus::Running;
                        state.error.clear();
                    }
                }
            }
            Action::AwaitApproval {
                step_id,
                visit,
                timeout_ms,
                ..
            } => {
                let state = changed(&mut steps, loaded, step_id);
                state.status = StepStatus::Waiting;
                state.visits = run.visits(step_id);
                state.since_ms = now;
                state.since_visit = *visit;
                if let Some(timeout_ms) = timeout_ms {
                    let key = visit_key(step_id, *visit);
                    let entry = lease::approval_timer(now, *timeout_ms);
                    write.tasks_set.push((key.clone(), entry.encode()));
                    tasks_set.push((key, entry));
                }
            }
            Action::Abandon(task) => {
                write.tasks_removed.push(task_key(task));
                let step = match task.item {
                    Some(_) => map_of(run.workflow(), &task.step_id),
                    None => &task.step_id,
                };
                // A map given up on keeps its failed status; a cancelled run's is cancelled.
                if task.item.is_none() || run.status() == RunStatus::Cancelled {
                    changed(&mut steps, loaded, step).status = StepStatus::Cancelled;
                }
            }
            Action::Finished { .. } => {}
            Action::Continue { .. } => {
                // Held here for a lease, or (shutting down) due at once for another.
                let entry = match holder.continues {
                    true => lease::continuation(holder.id, now, holder.lease_ms),
                    false => lease::continuation("", now, 0),
                };
                write
                    .tasks_set
                    .push((lease::CONTINUATION.to_owned(), entry.encode()));
                tasks_set.push((lease::CONTINUATION.to_owned(), entry));
            }
        }
    }
    // A continuation taken up: its timer goes, unless the walk stopped again (set above).
    if matches!(
        applied.event.map(|logged| &logged.event),
        Some(StoredEvent::Continue)
    ) && !write
        .tasks_set
        .iter()
        .any(|(key, _)| key == lease::CONTINUATION)
    {
        write.tasks_removed.push(lease::CONTINUATION.to_owned());
    }
    write.steps = steps
        .iter()
        .map(|(id, state)| (id.clone(), json(state)))
        .collect();
    // `skip` on the vector, not its iterator: O(log n), not a walk over every decision so far.
    let new_decisions = run
        .decisions()
        .skip(loaded.run.decisions().len().min(run.decisions().len()));
    for (n, decision) in new_decisions.iter().enumerate() {
        let vector = applied
            .embedded
            .and_then(|e| e.vectors.get(n).map(|v| (e.model.clone(), v.clone())));
        let stored = StoredDecision {
            run_id: loaded.header.run_id.clone(),
            decision: DecisionRecord::clone(decision),
            model: vector.as_ref().map(|(model, _)| model.clone()),
            embedding: vector.map(|(_, v)| v),
        };
        write
            .decisions
            .push((decision.key.clone(), stored.encode()));
    }
    // A finished run keeps no task or timer (a cancelled run's approval timer, say).
    if run.status().is_terminal() {
        for key in loaded.tasks.keys() {
            if !write.tasks_removed.contains(key) {
                write.tasks_removed.push(key.clone());
            }
        }
    }
    write.status = run.status().as_str().into();
    write.error = run.error().map(str::to_owned);
    write.state_sha256 = head;
    write.updated_ms = now;
    Planned {
        write,
        encoded,
        steps: steps.into_iter().collect(),
        tasks_set,
        settled,
    }
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

/// The step's state as this transition changes it, starting from what `loaded` holds.
fn changed<'a>(
    steps: &'a mut BTreeMap<String, StepState>,
    loaded: &Loaded,
    id: &str,
) -> &'a mut StepState {
    steps
        .entry(id.to_owned())
        .or_insert_with(|| loaded.steps.get(id).cloned().unwrap_or_default())
}

#[cfg(test)]
mod tests;
