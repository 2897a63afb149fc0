//! Connected workers and the tasks waiting for them.
//!
//! A task waits in its agent's queue until `dispatch` places it on a worker that
//! serves the agent, speaks a worker protocol that can run it (a map item needs
//! [`baton_proto::MAP_ITEMS_PROTOCOL`]) and has a free slot; the hub then sends it down that
//! worker's open stream. Placement runs whenever a task arrives or a worker connects or a slot
//! frees up, for the agents concerned.
//!
//! The hub also mirrors each worker's cache of payload parts, so a task carries the bytes of
//! only the parts that worker does not hold yet.
//!
//! - [`task`]: tasks ready for a worker, the messages on a worker's stream, assignments.
//! - `holding`: who holds which task: located for lease renewals, checked for a worker's
//!   answer.
//! - `queues`: the hub's state: the queues of waiting tasks, and placing them on workers.
//! - `session`: one connected worker: its stream, its tasks, its part-cache mirror.

mod holding;
mod queues;
mod session;
pub mod task;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::oneshot;

pub use self::holding::TaskAsked;
use self::queues::{Place, State};
pub use self::session::{MIRROR_MAX_BYTES, MIRROR_MAX_PARTS, WorkerStream};
use self::session::{Session, cancel};
pub use self::task::{Assignment, Forgotten, ReadyTask, Sent, TaskMessage, ToWorker};
use crate::clock::Instant;
/// Where a task is in the hub ([`Hub::locate`]), and a worker as a task entry names it.
pub use crate::lease::{Holding, Worker};
use crate::task_ref::TaskMap;
use baton_core::WorkerId;

/// How many times a task is sent again to a worker that could not rebuild its payload before
/// its step fails.
pub const MAX_RESENDS: u32 = 3;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("a worker with id {0} is already connected")]
    DuplicateWorker(String),
    /// The id is taken by a worker of another principal: the id is refused rather than shared,
    /// so that nothing said under it can be mistaken for the other worker's.
    #[error(
        "a worker with id {0} is already connected under another principal; give this worker an id of its own (--id)"
    )]
    WorkerIdTaken(String),
    #[error("task {run_id}/{task_key} was sent {resends} times and never arrived intact")]
    ResendsExhausted {
        run_id: String,
        task_key: String,
        resends: u32,
    },
    #[error("worker {worker_id} does not hold task {run_id}/{task_key}")]
    NotHeld {
        worker_id: String,
        run_id: String,
        task_key: String,
    },
}

/// What the hub has done since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    pub workers: usize,
    pub tasks_dispatched: u64,
    /// Payload bytes sent to workers.
    pub bytes_to_workers: u64,
}

#[derive(Default)]
pub struct Hub {
    state: Mutex<State>,
}

impl Hub {
    /// Adds a worker, whose part cache starts empty. It gets nothing yet, not even a task
    /// submitted meanwhile: the tasks it still runs from an earlier stream are taken over first
    /// ([`Hub::adopt`]), so that they take their slots, then [`Hub::open`] gives it what is
    /// waiting, up to its capacity.
    /// Returns the connection's number, for [`Hub::disconnect`], and a receiver that completes
    /// when the hub lets the worker go: its stream must end then.
    ///
    /// The worker speaks this version's protocol, [`baton_proto::WORKER_PROTOCOL`]; see
    /// [`Hub::connect_speaking`] for one that says otherwise.
    pub fn connect(
        &self,
        worker_id: &str,
        agents: impl IntoIterator<Item = String>,
        capacity: usize,
        cache_bytes: u64,
        stream: WorkerStream,
    ) -> Result<(u64, oneshot::Receiver<()>), Error> {
        let protocol = baton_proto::WORKER_PROTOCOL;
        self.connect_speaking(worker_id, protocol, agents, capacity, cache_bytes, stream)
    }

    /// [`Hub::connect`] for a worker that speaks worker protocol `protocol` (its hello's): it
    /// gets only the tasks that protocol can run.
    pub fn connect_speaking(
        &self,
        worker_id: &str,
        protocol: u32,
        agents: impl IntoIterator<Item = String>,
        capacity: usize,
        cache_bytes: u64,
        stream: WorkerStream,
    ) -> Result<(u64, oneshot::Receiver<()>), Error> {
        let worker = Worker::new(worker_id, "");
        self.connect_as(&worker, protocol, agents, capacity, cache_bytes, stream)
    }

    /// [`Hub::connect_speaking`] for a worker that authenticated as `worker.principal`: the hub
    /// remembers it, so that what is asked in the name of this worker id (a decision query names
    /// it in a field) is answered only to the same principal, and it is written down with the
    /// tasks the worker runs. An id already connected is refused, and named as taken when the
    /// connection holding it is another principal's.
    pub fn connect_as(
        &self,
        worker: &Worker,
        protocol: u32,
        agents: impl IntoIterator<Item = String>,
        capacity: usize,
        cache_bytes: u64,
        stream: WorkerStream,
    ) -> Result<(u64, oneshot::Receiver<()>), Error> {
        let mut state = self.lock();
        if let Some(connected) = state.workers.get(&worker.id) {
            return Err(if connected.principal == worker.principal {
                Error::DuplicateWorker(worker.id.to_string())
            } else {
                Error::WorkerIdTaken(worker.id.to_string())
            });
        }
        state.connections += 1;
        let connection = state.connections;
        let (closer, closed) = oneshot::channel();
        let agents = agents.into_iter().collect();
        let mut session = Session::new(
            connection,
            closer,
            agents,
            protocol,
            capacity,
            cache_bytes,
            stream,
        );
        session.principal = worker.principal.clone();
        state.workers.insert(worker.id.clone(), session);
        Ok((connection, closed))
    }

    /// The worker's held tasks are taken over: it takes tasks from now on, and gets queued
    /// ones for its agents until it is full.
    pub fn open(&self, worker_id: &str) -> Vec<Assignment> {
        let mut state = self.lock();
        let Some(worker) = state.workers.get_mut(worker_id) else {
            return Vec::new();
        };
        worker.open();
        state.fill(worker_id)
    }

    /// Removes connection `connection` of a worker (its stream ended, or it fell silent) and
    /// returns the tasks it held: they are delivered again as new attempts by the caller. A
    /// connection that was already replaced by a newer one removes nothing.
    pub fn disconnect(&self, worker_id: &str, connection: u64) -> Vec<ReadyTask> {
        let mut state = self.lock();
        if state
            .workers
            .get(worker_id)
            .is_none_or(|worker| worker.connection != connection)
        {
            return Vec::new();
        }
        let worker = state.workers.remove(worker_id).expect("just checked");
        // An agent's queue lives on only while it holds tasks: a worker that offered many
        // agents leaves none behind (nor their series on `/metrics`).
        state.queues.retain(|_, queue| !queue.is_empty());
        worker.holding.into_values().collect()
    }

    /// The worker said something: it is alive.
    pub fn seen(&self, worker_id: &str) {
        if let Some(worker) = self.lock().workers.get_mut(worker_id) {
            worker.last_seen = Instant::now();
        }
    }

    /// Workers (and their connection numbers) that said nothing for `silence`: their streams
    /// are taken for dead, whatever TCP says.
    pub fn silent(&self, silence: Duration) -> Vec<(WorkerId, u64)> {
        self.lock()
            .workers
            .iter()
            .filter(|(_, worker)| worker.last_seen.elapsed() >= silence)
            .map(|(id, worker)| (id.clone(), worker.connection))
            .collect()
    }

    /// Takes back every task held longer than its `timeout_ms` and tells its worker to stop it.
    /// Returns the tasks, each with the worker that held it, and the tasks the freed slots took.
    pub fn overdue(&self) -> (Vec<(WorkerId, ReadyTask)>, Vec<Assignment>) {
        let mut state = self.lock();
        let mut overdue = Vec::new();
        for (worker_id, worker) in &mut state.workers {
            let late: Vec<(String, String)> = worker
                .holding
                .iter()
                .filter(|(_, task)| {
                    task.timeout_ms > 0
                        && task.started.is_some_and(|at| {
                            at.elapsed() >= Duration::from_millis(task.timeout_ms)
                        })
                })
                .map(|(key, _)| key.clone())
                .collect();
            for key in late {
                let task = worker.holding.remove(&key).expect("just found");
                let reason = format!("timed out after {} ms", task.timeout_ms);
                worker.tell(cancel(&task, &reason));
                overdue.push((worker_id.clone(), task));
            }
        }
        let holders: HashSet<WorkerId> = overdue.iter().map(|(id, _)| id.clone()).collect();
        let assignments = holders.iter().flat_map(|id| state.fill(id)).collect();
        (overdue, assignments)
    }

    /// Takes over a task a reconnected worker still runs (its attempt is current): the worker
    /// holds it, in a slot of its own, without being sent it again.
    pub fn adopt(&self, worker_id: &str, mut task: ReadyTask) -> bool {
        let mut state = self.lock();
        let Some(worker) = state.workers.get_mut(worker_id) else {
            return false;
        };
        // It fills one of the slots the hello announced, like any task sent on this stream.
        task.started = Some(Instant::now());
        worker
            .holding
            .insert((task.run_id().to_owned(), task.key.clone()), task);
        true
    }

    /// The principal `worker_id` connected as, if it is connected (`Some(None)` without
    /// authentication).
    pub fn principal_of(&self, worker_id: &str) -> Option<Option<String>> {
        let state = self.lock();
        Some(state.workers.get(worker_id)?.principal.clone())
    }

    /// Tells a worker to stop a task (one it runs that is no longer current).
    pub fn cancel(&self, worker_id: &str, task_id: &str, reason: &str) {
        if let Some(worker) = self.lock().workers.get(worker_id) {
            worker.tell(ToWorker::Cancel {
                task_id: task_id.to_owned(),
                reason: reason.to_owned(),
            });
        }
    }

    /// Free slots per agent over the connected workers (a worker serving two agents counts for
    /// both), less the tasks already queued for it: how many due tasks of each agent this
    /// coordinator should claim.
    pub fn free_slots(&self) -> HashMap<String, usize> {
        let state = self.lock();
        let mut free = state.slots_per_agent();
        for (agent, queue) in &state.queues {
            if let Some(slots) = free.get_mut(agent.as_str()) {
                *slots = slots.saturating_sub(queue.len());
            }
        }
        free
    }

    /// The coordinator is going away: every worker is told to connect to another one, and the
    /// queues are emptied (their tasks are released to the other coordinators). Returns the
    /// queued tasks.
    pub fn goodbye(&self) -> Vec<ReadyTask> {
        let mut state = self.lock();
        for worker in state.workers.values_mut() {
            worker.capacity = 0;
            worker.tell(ToWorker::Goodbye);
        }
        state.queues.drain().flat_map(|(_, queue)| queue).collect()
    }

    /// Queues a task behind the others of its agent; it goes out at once if a worker has room.
    /// Returns what was sent: this task, or none when its agent's queue waits for a slot.
    pub fn submit(&self, task: ReadyTask) -> Vec<Assignment> {
        self.lock().enqueue(task, Place::Back)
    }

    /// The worker could not rebuild the task's payload (it lacked a part, or one was corrupt):
    /// tells it to empty its part cache, empties the copy here, and sends the task again with
    /// every part. Tasks sent after the reset assume the empty cache, so the two agree again
    /// from there. Fails when the worker does not hold this attempt of the task (nothing of
    /// the payload goes out then) or it was resent [`MAX_RESENDS`] times already.
    pub fn resend(
        &self,
        worker_id: &str,
        run_id: &str,
        task_key: &str,
        attempt: u32,
    ) -> Result<(), Error> {
        let mut state = self.lock();
        let not_held = || Error::NotHeld {
            worker_id: worker_id.to_owned(),
            run_id: run_id.to_owned(),
            task_key: task_key.to_owned(),
        };
        let worker = state.workers.get_mut(worker_id).ok_or_else(not_held)?;
        let task = worker
            .holding
            .get_task_mut(run_id, task_key)
            .filter(|task| task.attempt() == attempt)
            .ok_or_else(not_held)?;
        if task.resends >= MAX_RESENDS {
            return Err(Error::ResendsExhausted {
                run_id: run_id.to_owned(),
                task_key: task_key.to_owned(),
                resends: task.resends,
            });
        }
        task.resends += 1;
        let task = task.clone();
        // A closed stream: the disconnect that follows requeues the task.
        if let Some(bytes) = worker.resend_task(&task) {
            state.bytes_to_workers += bytes;
        }
        Ok(())
    }

    /// The worker takes no new tasks (it is shutting down); those it holds stay with it until
    /// it answers them or its stream ends.
    pub fn drain(&self, worker_id: &str) {
        if let Some(worker) = self.lock().workers.get_mut(worker_id) {
            worker.capacity = 0;
        }
    }

    /// A task `worker_id` holds: its agent, and when it became ready and was sent.
    pub fn sent(&self, worker_id: &str, run_id: &str, task_key: &str) -> Option<Sent> {
        let state = self.lock();
        state
            .workers
            .get(worker_id)?
            .holding
            .get_task(run_id, task_key)?
            .sent()
    }

    /// Takes out of the queues up to `take[agent]` tasks of each agent that have waited
    /// `patience` or longer, oldest first: released, they go to a coordinator whose workers have
    /// room. A task that was in a worker's hands already (requeued at the front) goes too.
    pub fn waited_out(
        &self,
        patience: Duration,
        take: &std::collections::BTreeMap<String, usize>,
    ) -> Vec<ReadyTask> {
        let mut state = self.lock();
        let mut out = Vec::new();
        for (agent, queue) in &mut state.queues {
            let Some(&limit) = take.get(agent.as_str()) else {
                continue;
            };
            let mut waited: Vec<usize> = (0..queue.len())
                .filter(|&at| queue[at].ready_at.elapsed() >= patience)
                .collect();
            // By the instant each became ready (a total order; elapsed times move while sorting).
            waited.sort_by_key(|&at| queue[at].ready_at);
            waited.truncate(limit);
            // Highest index first, so that the others stay where they are.
            waited.sort_unstable_by(|a, b| b.cmp(a));
            for at in waited {
                out.extend(queue.remove(at));
            }
        }
        out
    }

    /// Per agent, how many tasks have waited `patience` or longer.
    pub fn waiting_longer_than(&self, patience: Duration) -> Vec<(String, usize)> {
        self.lock()
            .queues
            .iter()
            .map(|(agent, queue)| {
                let waited = queue
                    .iter()
                    .filter(|task| task.ready_at.elapsed() >= patience)
                    .count();
                (agent.to_string(), waited)
            })
            .filter(|(_, waited)| *waited > 0)
            .collect()
    }

    /// Per agent with tasks waiting: how many, and how long the oldest has waited.
    pub fn queue_stats(&self) -> Vec<(String, usize, Duration)> {
        self.lock()
            .queues
            .iter()
            .filter(|(_, queue)| !queue.is_empty())
            .map(|(agent, queue)| {
                let oldest = queue
                    .iter()
                    .map(|task| task.ready_at.elapsed())
                    .max()
                    .unwrap_or_default();
                (agent.to_string(), queue.len(), oldest)
            })
            .collect()
    }

    /// Free slots per agent of the connected workers, and how many workers there are.
    pub fn capacity(&self) -> (usize, Vec<(String, usize)>) {
        let state = self.lock();
        let free = state.slots_per_agent();
        (state.workers.len(), free.into_iter().collect())
    }

    /// The worker is done with the task: its slot takes the next waiting task.
    pub fn finish(
        &self,
        worker_id: &str,
        run_id: &str,
        task_key: &str,
    ) -> Result<Vec<Assignment>, Error> {
        let mut state = self.lock();
        let released = state
            .workers
            .get_mut(worker_id)
            .and_then(|worker| worker.holding.remove_task(run_id, task_key));
        if released.is_none() {
            return Err(Error::NotHeld {
                worker_id: worker_id.to_owned(),
                run_id: run_id.to_owned(),
                task_key: task_key.to_owned(),
            });
        }
        Ok(state.fill(worker_id))
    }

    /// Forgets a task wherever it is (its run ended, or another coordinator took it over) and
    /// stops it on its worker, telling it `reason`; the slot it held takes the next task.
    pub fn forget(&self, run_id: &str, task_key: &str, reason: &str) -> Forgotten {
        let mut state = self.lock();
        for queue in state.queues.values_mut() {
            queue.retain(|task| !(task.run_id() == run_id && task.key == task_key));
        }
        let held = state.workers.iter_mut().find_map(|(id, worker)| {
            let task = worker.holding.remove_task(run_id, task_key)?;
            // Its agent is stopped at once rather than left to finish for nothing.
            worker.tell(cancel(&task, reason));
            Some((id.clone(), task))
        });
        match held {
            Some((holder, task)) => Forgotten {
                assignments: state.fill(&holder),
                held: Some((holder, task)),
            },
            None => Forgotten::default(),
        }
    }

    /// Takes a task back from a worker and queues it again at the front (its result could not
    /// be recorded); it goes out again at once if a worker has room.
    pub fn requeue(&self, worker_id: &str, run_id: &str, task_key: &str) -> Vec<Assignment> {
        let mut state = self.lock();
        let Some(task) = state
            .workers
            .get_mut(worker_id)
            .and_then(|worker| worker.holding.remove_task(run_id, task_key))
        else {
            return Vec::new();
        };
        state.enqueue(task, Place::Front)
    }

    /// Whether any connected worker serves `agent`.
    pub fn serves(&self, agent: &str) -> bool {
        self.lock()
            .workers
            .values()
            .any(|worker| worker.agents.contains(agent))
    }

    pub fn counters(&self) -> Counters {
        let state = self.lock();
        Counters {
            workers: state.workers.len(),
            tasks_dispatched: state.tasks_dispatched,
            bytes_to_workers: state.bytes_to_workers,
        }
    }

    /// Connected workers and their free slots.
    pub fn workers(&self) -> Vec<(WorkerId, usize)> {
        self.lock()
            .workers
            .iter()
            .map(|(id, worker)| (id.clone(), worker.free_slots()))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("hub lock")
    }
}

#[cfg(test)]
mod tests;
