//! The hub's state: each agent's queue of waiting tasks, the connected workers, and the
//! placing of the one on the other ([`dispatch::assign`], a pure policy).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use baton_core::{AgentName, WorkerId};

use super::session::Session;
use super::task::{Assignment, ReadyTask};
use crate::clock::Instant;
use crate::dispatch::{self, WorkerLoad};

/// What the hub's lock guards.
#[derive(Default)]
pub(super) struct State {
    pub workers: HashMap<WorkerId, Session>,
    pub queues: HashMap<AgentName, VecDeque<ReadyTask>>,
    pub tasks_dispatched: u64,
    pub bytes_to_workers: u64,
    pub connections: u64,
}

/// Where a task joins its agent's queue.
pub(super) enum Place {
    /// A new task waits behind the others.
    Back,
    /// A task that was in a worker's hands already goes out before the ones that never were.
    Front,
}

impl State {
    /// Queues `task` and sends what its agent's queue can place now.
    pub fn enqueue(&mut self, task: ReadyTask, place: Place) -> Vec<Assignment> {
        let agent = task.agent.clone();
        let queue = self.queues.entry(agent.clone()).or_default();
        match place {
            Place::Back => queue.push_back(task),
            Place::Front => queue.push_front(task),
        }
        self.dispatch(&[agent])
    }

    /// Gives `worker_id` queued tasks for its agents until it is full (or the queues are
    /// empty).
    pub fn fill(&mut self, worker_id: &str) -> Vec<Assignment> {
        // Only the agents with tasks waiting: a slot freed with nothing queued (a chain's step,
        // every time) costs a lookup per agent, not a placement.
        let Some(agents) = self.workers.get(worker_id).map(|worker| {
            worker
                .agents
                .iter()
                .filter_map(|agent| {
                    let (name, queue) = self.queues.get_key_value(agent.as_str())?;
                    (!queue.is_empty()).then(|| name.clone())
                })
                .collect::<Vec<AgentName>>()
        }) else {
            return Vec::new();
        };
        if agents.is_empty() {
            return Vec::new();
        }
        self.dispatch(&agents)
    }

    /// Sends the queued tasks of `agents` that [`dispatch::assign`] places. A worker whose
    /// stream turns out to be closed takes nothing more (its disconnect follows), and the
    /// placement is made again without it, so a dead stream cannot hold up dispatch.
    pub fn dispatch(&mut self, agents: &[AgentName]) -> Vec<Assignment> {
        let mut assignments = Vec::new();
        loop {
            let placed = self.placements(agents);
            if placed.is_empty() {
                return assignments;
            }
            let mut closed = false;
            for (agent, worker_id, waited) in placed {
                let task = self
                    .queues
                    .get_mut(&agent)
                    .and_then(VecDeque::pop_front)
                    .expect("placed from this queue");
                let worker = self.workers.get_mut(&worker_id).expect("placed on it");
                let Some(bytes) = worker.send_task(&task) else {
                    worker.capacity = 0;
                    self.queues.entry(agent).or_default().push_front(task);
                    closed = true;
                    break;
                };
                self.tasks_dispatched += 1;
                self.bytes_to_workers += bytes;
                assignments.push(Assignment {
                    worker_id,
                    run_id: task.task.run_id.clone(),
                    task_key: task.key.clone(),
                    task: task.task.task.clone(),
                    agent: task.agent.clone(),
                    waited,
                });
                let mut task = task;
                task.started = Some(Instant::now());
                worker
                    .holding
                    .insert((task.run_id().to_owned(), task.key.clone()), task);
            }
            if !closed {
                return assignments;
            }
        }
    }

    /// Where the policy puts the waiting tasks of `agents`: (agent, worker id, time waited),
    /// in the order they are to be sent.
    fn placements(&self, agents: &[AgentName]) -> Vec<(AgentName, WorkerId, Duration)> {
        let waiting: Vec<&AgentName> = agents
            .iter()
            .filter(|agent| {
                self.queues
                    .get(*agent)
                    .is_some_and(|queue| !queue.is_empty())
            })
            .collect();
        let queues: Vec<(&str, &VecDeque<ReadyTask>)> = waiting
            .iter()
            .map(|agent| (agent.as_str(), &self.queues[*agent]))
            .collect();
        if queues.is_empty() {
            return Vec::new();
        }
        let ids: Vec<&WorkerId> = self.workers.keys().collect();
        let loads: Vec<WorkerLoad<'_>> = self
            .workers
            .iter()
            .map(|(id, worker)| WorkerLoad {
                id,
                agents: &worker.agents,
                capacity: worker.capacity,
                load: worker.holding.len(),
                protocol: worker.protocol,
            })
            .collect();
        dispatch::assign(&loads, &queues, Instant::now())
            .into_iter()
            .map(|placement| {
                (
                    waiting[placement.queue].clone(),
                    ids[placement.worker].clone(),
                    placement.waited,
                )
            })
            .collect()
    }

    /// Free slots per agent (a worker serving two agents counts for both).
    pub fn slots_per_agent(&self) -> HashMap<String, usize> {
        let mut free: HashMap<String, usize> = HashMap::new();
        for worker in self.workers.values() {
            for agent in &worker.agents {
                *free.entry(agent.clone()).or_default() += worker.free_slots();
            }
        }
        free
    }
}

impl dispatch::Waiting for ReadyTask {
    fn ready_at(&self) -> Instant {
        self.ready_at
    }

    fn needs_protocol(&self) -> u32 {
        ReadyTask::needs_protocol(self)
    }
}
