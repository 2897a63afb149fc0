//! The order a watch tells a run's events in, the same whichever coordinator it watches from
//! (pure): each event once; an agent step visit's start, naming its worker, before its output,
//! its output before its end, and its end before whatever the run did after it.
//!
//! A watch hears from three sources that race each other: this coordinator's own events (only
//! for what it moved on itself), catch-ups from the store (for what another coordinator did),
//! and the live output, which every coordinator reads from the store on a path of its own. So a
//! piece of output can come before the start of its step, or before the end of the step before
//! it. Such a piece is held back until its start is told, or until a catch-up that began after
//! it came (so it tells everything the run did before the piece) has been taken in: its start
//! is then told as the piece names it, the worker holding the attempt that streamed it.

use std::collections::{HashMap, HashSet, VecDeque};

use baton_core::workflow::StepKind;
use baton_core::{AgentName, MapProgress, WorkerId, Workflow};

use super::RunEvent;

/// A step visit: step id and visit.
type Visit = (String, u32);

/// The agent steps whose output waits for their start, with their agent: every agent step but
/// those of a map (whose items are told as the map's progress, never started one by one).
pub(in crate::service) fn agent_steps(workflow: &Workflow) -> HashMap<String, AgentName> {
    let in_a_map = |mut parent| {
        while let Some(index) = parent {
            let step = workflow.step(index);
            if matches!(step.kind, StepKind::Map(_)) {
                return true;
            }
            parent = step.parent;
        }
        false
    };
    workflow
        .steps()
        .iter()
        .filter_map(|step| match &step.kind {
            StepKind::Agent { agent } if !in_a_map(step.parent) => {
                Some((step.id.to_string(), AgentName::from(agent.as_str())))
            }
            _ => None,
        })
        .collect()
}

/// What one watch has told, what it holds back, and what it may tell now.
pub(super) struct Sequence {
    /// Events to tell now, in order.
    ready: VecDeque<RunEvent>,
    agents: HashMap<String, AgentName>,
    /// Agent step visits told started and not settled: the attempt and worker last told.
    started: HashMap<Visit, (u32, Option<WorkerId>)>,
    /// Step visits told settled: a start or output of theirs that comes after is stale.
    ended: HashSet<Visit>,
    /// Step visits settled, by their place in the history: a redrive settles the same visit
    /// twice (failed, then redriven).
    positions: HashSet<usize>,
    /// Approvals requested, by step and visit.
    approvals: HashSet<Visit>,
    /// The last progress told of each map step: the same counts are not told twice.
    progress: HashMap<String, MapProgress>,
    /// How many step visits were told settled: where a catch-up starts.
    settled: usize,
    /// The run's end was told: nothing comes after it.
    done: bool,
    /// Output of agent step visits not told started, in the order it came.
    held: Vec<Held>,
}

struct Held {
    visit: Visit,
    output: RunEvent,
    /// A catch-up began after it came.
    covered: bool,
}

impl Sequence {
    /// A watch of a run of `agents` ([`agent_steps`]) that has told nothing yet.
    pub fn new(agents: HashMap<String, AgentName>) -> Self {
        Sequence {
            ready: VecDeque::new(),
            agents,
            started: HashMap::new(),
            ended: HashSet::new(),
            positions: HashSet::new(),
            approvals: HashSet::new(),
            progress: HashMap::new(),
            settled: 0,
            done: false,
            held: Vec::new(),
        }
    }

    /// The next event to tell.
    pub fn pop(&mut self) -> Option<RunEvent> {
        self.ready.pop_front()
    }

    /// The run's end is told (or ready): the watch ends once `pop` has nothing more.
    pub fn done(&self) -> bool {
        self.done
    }

    /// How many step visits were told settled: where a catch-up from the store starts.
    pub fn settled(&self) -> usize {
        self.settled
    }

    /// Whether a step visit's start was told (or it settled): a catch-up need not look for
    /// who runs it.
    pub fn told_started(&self, step_id: &str, visit: u32) -> bool {
        let visit = (step_id.to_owned(), visit);
        self.started.contains_key(&visit) || self.ended.contains(&visit)
    }

    /// Whether output waits for a catch-up from the store that began after it came.
    pub fn wants_catch_up(&self) -> bool {
        self.held.iter().any(|held| !held.covered)
    }

    /// A catch-up from the store begins: it covers the output held so far.
    pub fn catching_up(&mut self) {
        for held in &mut self.held {
            held.covered = true;
        }
    }

    /// The events of a catch-up that began at the last [`Sequence::catching_up`] were taken in:
    /// the output it covered is told, its step started as the output says.
    pub fn caught_up(&mut self) {
        let mut visits: Vec<Visit> = Vec::new();
        for held in self.held.iter().filter(|held| held.covered) {
            if !visits.contains(&held.visit) {
                visits.push(held.visit.clone());
            }
        }
        for visit in visits {
            self.release(&visit);
        }
    }

    /// Takes in an event heard (from this coordinator, a catch-up or the live output), in the
    /// order heard; what may be told now is made ready, in the run's order.
    pub fn push(&mut self, event: RunEvent) {
        if self.done {
            return;
        }
        match &event {
            RunEvent::StepStarted { .. } => self.start(event),
            RunEvent::StepFinished { .. } => self.finish(event),
            RunEvent::StepOutput { .. } => self.output(event),
            RunEvent::MapProgress(progress) => {
                if self.progress.get(progress.step_id.as_ref()) != Some(progress) {
                    self.progress
                        .insert(progress.step_id.to_string(), progress.clone());
                    self.ready.push_back(event);
                }
            }
            RunEvent::ApprovalRequested { step_id, visit, .. } => {
                if self.approvals.insert((step_id.clone(), *visit)) {
                    self.ready.push_back(event);
                }
            }
            RunEvent::RunFinished(_) => {
                // What is still held (a step cancelled mid-stream) goes before the end.
                let held: Vec<Visit> = self.held.iter().map(|held| held.visit.clone()).collect();
                for visit in held {
                    self.release(&visit);
                }
                self.done = true;
                self.ready.push_back(event);
            }
            RunEvent::OutputMissed { .. } => self.ready.push_back(event),
        }
    }

    /// A step started: told unless its visit settled or this attempt's start was told; then
    /// the output it held back.
    fn start(&mut self, event: RunEvent) {
        let RunEvent::StepStarted {
            step_id,
            visit,
            worker_id,
            attempt,
            ..
        } = &event
        else {
            return;
        };
        let key = (step_id.clone(), *visit);
        if self.ended.contains(&key) {
            return;
        }
        if let Some((told, told_worker)) = self.started.get(&key) {
            let known_now = told == attempt && told_worker.is_none() && worker_id.is_some();
            if *attempt < *told || (told == attempt && !known_now) {
                return;
            }
        }
        self.started
            .insert(key.clone(), (*attempt, worker_id.clone()));
        self.ready.push_back(event);
        self.release(&key);
    }

    /// A step visit settled: first its start if it was never told (the attempt that answered,
    /// or the output held), then its output, then its end.
    fn finish(&mut self, event: RunEvent) {
        let RunEvent::StepFinished {
            step_id,
            visit,
            position,
            answered_by,
            ..
        } = &event
        else {
            return;
        };
        if !self.positions.insert(*position) {
            return;
        }
        self.settled = self.settled.max(position + 1);
        let key = (step_id.clone(), *visit);
        self.release(&key);
        if let (Some((attempt, worker_id)), Some(agent)) = (answered_by, self.agents.get(step_id)) {
            let started = RunEvent::StepStarted {
                step_id: step_id.clone(),
                visit: *visit,
                agent: agent.clone(),
                worker_id: Some(worker_id.clone()),
                attempt: *attempt,
            };
            self.start(started);
        }
        self.started.remove(&key);
        self.ended.insert(key);
        self.ready.push_back(event);
    }

    /// A piece of output: told if its step visit was told started (after the start of its
    /// attempt, if that is a new one), held back if not, dropped if the visit settled (its
    /// output was told before its end).
    fn output(&mut self, event: RunEvent) {
        let RunEvent::StepOutput {
            step_id,
            visit,
            attempt,
            worker_id,
            ..
        } = &event
        else {
            return;
        };
        let Some(agent) = self.agents.get(step_id) else {
            // A map's items: the map was told started as its progress.
            self.ready.push_back(event);
            return;
        };
        let key = (step_id.clone(), *visit);
        if self.ended.contains(&key) {
            return;
        }
        match self.started.get(&key) {
            Some((told, _)) if *attempt > *told && worker_id.is_some() => {
                // Another attempt (on another worker, perhaps), started before its output.
                let started = RunEvent::StepStarted {
                    step_id: step_id.clone(),
                    visit: *visit,
                    agent: agent.clone(),
                    worker_id: worker_id.clone(),
                    attempt: *attempt,
                };
                self.start(started);
                self.ready.push_back(event);
            }
            Some(_) => self.ready.push_back(event),
            None => self.held.push(Held {
                visit: key,
                output: event,
                covered: false,
            }),
        }
    }

    /// Tells the output held back of `visit`, after its start (as its first piece names it,
    /// when the start was not told).
    fn release(&mut self, visit: &Visit) {
        if !self.held.iter().any(|held| held.visit == *visit) {
            return;
        }
        let (released, kept) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|held| held.visit == *visit);
        self.held = kept;
        for held in released {
            if !self.started.contains_key(visit)
                && let RunEvent::StepOutput {
                    attempt, worker_id, ..
                } = &held.output
                && let Some(agent) = self.agents.get(&visit.0)
            {
                // Not through `start`, which would release this again.
                self.started
                    .insert(visit.clone(), (*attempt, worker_id.clone()));
                self.ready.push_back(RunEvent::StepStarted {
                    step_id: visit.0.clone(),
                    visit: visit.1,
                    agent: agent.clone(),
                    worker_id: worker_id.clone(),
                    attempt: *attempt,
                });
            }
            self.output(held.output);
        }
    }
}

#[cfg(test)]
mod tests;
