//! Connected workers and the tasks waiting for them.
//!
//! A task goes at once to the least-loaded connected worker that serves its agent and has a free
//! slot, over that worker's open stream; otherwise it waits in its agent's queue until a slot
//! frees up or a worker that serves the agent connects. Handing out branches to the least loaded
//! worker is what spreads a parallel step across workers.
//!
//! The hub also mirrors each worker's cache of payload parts ([`BlobLru`]), so a task carries
//! the bytes of only the parts that worker does not hold yet.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_core::BlobLru;
use baton_proto::Json;
use baton_proto::v1::{CoordinatorMessage, Task, coordinator_message};
use tokio::sync::mpsc;

/// A task ready for a worker.
#[derive(Debug, Clone)]
pub struct ReadyTask {
    pub run_id: String,
    pub task_key: String,
    pub agent: String,
    /// The task with its manifest and without parts; the hub adds the parts a worker lacks.
    pub message: Task,
    /// Every part the manifest names, in [`baton_core::Manifest::parts`] order.
    pub parts: Vec<Arc<Json>>,
    /// How many times a worker asked for it again because it could not rebuild the payload.
    pub resends: u32,
    /// When it went to the worker holding it: its `timeout_ms` runs from there.
    pub started: Option<Instant>,
    /// When it became ready (dispatched, or delivered again): its queue wait runs from there.
    pub ready_at: Instant,
    /// What its span needs to know about its run; `None` when traces are off.
    pub trace: Option<Arc<crate::traces::TaskTrace>>,
}

impl ReadyTask {
    pub fn attempt(&self) -> u32 {
        self.message.attempt
    }

    /// What a span needs of a task sent to a worker; `None` if it was never sent.
    pub fn sent(&self) -> Option<Sent> {
        Some(Sent {
            agent: self.agent.clone(),
            ready_at: self.ready_at,
            started: self.started?,
            trace: self.trace.clone(),
        })
    }
}

/// What [`Hub::forget`] did: the worker that held the task (and the task), and what its freed
/// slot took next.
#[derive(Debug, Default)]
pub struct Forgotten {
    pub assignments: Vec<Assignment>,
    pub held: Option<(String, ReadyTask)>,
}

/// A task a worker holds, as [`Hub::sent`] tells it.
#[derive(Debug, Clone)]
pub struct Sent {
    pub agent: String,
    /// When it became ready (queued, or delivered again).
    pub ready_at: Instant,
    /// When it went to the worker.
    pub started: Instant,
    pub trace: Option<Arc<crate::traces::TaskTrace>>,
}

/// Where a task is in the hub ([`Hub::locate`]).
pub use crate::lease::Holding;

/// A task handed to a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub worker_id: String,
    pub run_id: String,
    pub task_key: String,
    pub agent: String,
    /// How long it waited for a worker.
    pub waited: Duration,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("a worker with id {0} is already connected")]
    DuplicateWorker(String),
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

struct Worker {
    /// Which connection of this worker id it is: a stream that ends late must not remove the
    /// connection that replaced it.
    connection: u64,
    /// Dropped with the worker: ends its stream, even while the worker still writes to it (it
    /// was cut off for silence), so that it reconnects instead of being ignored.
    _closer: tokio::sync::oneshot::Sender<()>,
    /// When the worker last said anything (heartbeats included).
    last_seen: Instant,
    agents: HashSet<String>,
    capacity: usize,
    /// Tasks it holds, kept whole so they can be sent again if it goes away.
    holding: HashMap<(String, String), ReadyTask>,
    stream: mpsc::UnboundedSender<CoordinatorMessage>,
    /// What the worker's part cache holds, by the same policy the worker runs.
    cache: BlobLru,
    /// Its limits, to start afresh after a reset.
    cache_bytes: u64,
}

impl Worker {
    /// The task as this worker gets it: the parts it does not hold, each once, and the cache
    /// touched as the worker will touch it on arrival.
    fn message_for(&mut self, task: &ReadyTask) -> CoordinatorMessage {
        let mut sent = HashSet::new();
        let parts = task
            .parts
            .iter()
            .filter(|part| !self.cache.contains(&part.sha256) && sent.insert(&part.sha256))
            .map(|part| Json::clone(part))
            .collect();
        CoordinatorMessage {
            message: Some(coordinator_message::Message::Task(Task {
                parts,
                ..task.message.clone()
            })),
        }
    }

    fn touch_parts(&mut self, task: &ReadyTask) {
        for part in &task.parts {
            self.cache.touch(&part.sha256, part.json.len() as u64);
        }
    }
}

fn cancel_message(task_id: &str, reason: &str) -> CoordinatorMessage {
    CoordinatorMessage {
        message: Some(coordinator_message::Message::Cancel(
            baton_proto::v1::CancelTask {
                task_id: task_id.to_owned(),
                reason: reason.to_owned(),
            },
        )),
    }
}

/// The bytes a task message carries to a worker: its manifest and parts.
fn payload_bytes(message: &CoordinatorMessage) -> u64 {
    match &message.message {
        Some(coordinator_message::Message::Task(task)) => {
            let manifest = task.manifest.as_ref().map_or(0, |m| m.json.len());
            let parts: usize = task.parts.iter().map(|part| part.json.len()).sum();
            (manifest + parts) as u64
        }
        _ => 0,
    }
}

#[derive(Default)]
struct State {
    workers: HashMap<String, Worker>,
    queues: HashMap<String, VecDeque<ReadyTask>>,
    tasks_dispatched: u64,
    bytes_to_workers: u64,
    connections: u64,
    /// Test hook: how many more task messages with parts get one byte flipped on the wire.
    corrupt_remaining: u64,
}

impl State {
    /// Flips one byte of the first part of `message` while the test hook asks for it: the
    /// copy on the wire only, never the part the run keeps.
    fn maybe_corrupt(&mut self, message: &mut CoordinatorMessage) {
        if self.corrupt_remaining == 0 {
            return;
        }
        if let Some(coordinator_message::Message::Task(task)) = &mut message.message
            && let Some(part) = task.parts.first_mut()
            && let Some(byte) = part.json.last_mut()
        {
            *byte ^= 0x01;
            self.corrupt_remaining -= 1;
        }
    }
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

/// The coordinator's copy of a worker's part cache holds at most this many bytes' worth and this
/// many parts, whatever the worker asks for, so a worker cannot make it keep unbounded
/// bookkeeping. A worker with a larger cache then holds more than the copy says (see
/// [`BlobLru`]), and at worst gets some parts it already has.
pub const MIRROR_MAX_BYTES: u64 = 16 << 30;
pub const MIRROR_MAX_PARTS: usize = 1 << 16;

/// How many times a task is sent again to a worker that could not rebuild its payload before
/// its step fails.
pub const MAX_RESENDS: u32 = 3;

fn mirror(cache_bytes: u64) -> BlobLru {
    BlobLru::with_max_entries(cache_bytes.min(MIRROR_MAX_BYTES), MIRROR_MAX_PARTS)
}

impl Hub {
    /// Adds a worker, whose part cache starts empty. It gets nothing yet: the tasks it still
    /// runs from an earlier stream are taken over first ([`Hub::adopt`]), then
    /// [`Hub::fill_worker`] gives it what is waiting, up to its capacity.
    /// Returns the connection's number, for [`Hub::disconnect`], and a receiver that completes
    /// when the hub lets the worker go: its stream must end then.
    pub fn connect(
        &self,
        worker_id: &str,
        agents: impl IntoIterator<Item = String>,
        capacity: usize,
        cache_bytes: u64,
        stream: mpsc::UnboundedSender<CoordinatorMessage>,
    ) -> Result<(u64, tokio::sync::oneshot::Receiver<()>), Error> {
        let mut state = self.state.lock().expect("hub lock");
        if state.workers.contains_key(worker_id) {
            return Err(Error::DuplicateWorker(worker_id.to_owned()));
        }
        state.connections += 1;
        let connection = state.connections;
        let (closer, closed) = tokio::sync::oneshot::channel();
        let worker = Worker {
            connection,
            _closer: closer,
            last_seen: Instant::now(),
            agents: agents.into_iter().collect(),
            capacity: capacity.max(1),
            holding: HashMap::new(),
            stream,
            cache: mirror(cache_bytes),
            cache_bytes,
        };
        state.workers.insert(worker_id.to_owned(), worker);
        Ok((connection, closed))
    }

    /// Gives the worker queued tasks for its agents until it is full.
    pub fn fill_worker(&self, worker_id: &str) -> Vec<Assignment> {
        self.state.lock().expect("hub lock").fill(worker_id)
    }

    /// Removes connection `connection` of a worker (its stream ended, or it fell silent) and
    /// returns the tasks it held: they are delivered again as new attempts by the caller. A
    /// connection that was already replaced by a newer one removes nothing.
    pub fn disconnect(&self, worker_id: &str, connection: u64) -> Vec<ReadyTask> {
        let mut state = self.state.lock().expect("hub lock");
        if state
            .workers
            .get(worker_id)
            .is_none_or(|worker| worker.connection != connection)
        {
            return Vec::new();
        }
        let worker = state.workers.remove(worker_id).expect("just checked");
        worker.holding.into_values().collect()
    }

    /// The worker said something: it is alive.
    pub fn seen(&self, worker_id: &str) {
        let mut state = self.state.lock().expect("hub lock");
        if let Some(worker) = state.workers.get_mut(worker_id) {
            worker.last_seen = Instant::now();
        }
    }

    /// Workers (and their connection numbers) that said nothing for `silence`: their streams
    /// are taken for dead, whatever TCP says.
    pub fn silent(&self, silence: Duration) -> Vec<(String, u64)> {
        let state = self.state.lock().expect("hub lock");
        state
            .workers
            .iter()
            .filter(|(_, worker)| worker.last_seen.elapsed() >= silence)
            .map(|(id, worker)| (id.clone(), worker.connection))
            .collect()
    }

    /// Takes back every task held longer than its `timeout_ms` and tells its worker to stop it.
    /// Returns the tasks, each with the worker that held it, and the tasks the freed slots took.
    pub fn overdue(&self) -> (Vec<(String, ReadyTask)>, Vec<Assignment>) {
        let mut state = self.state.lock().expect("hub lock");
        let mut overdue = Vec::new();
        for (worker_id, worker) in &mut state.workers {
            let late: Vec<(String, String)> = worker
                .holding
                .iter()
                .filter(|(_, task)| {
                    let timeout = task.message.timeout_ms;
                    timeout > 0
                        && task
                            .started
                            .is_some_and(|at| at.elapsed() >= Duration::from_millis(timeout))
                })
                .map(|(key, _)| key.clone())
                .collect();
            for key in late {
                let task = worker.holding.remove(&key).expect("just found");
                let _ = worker.stream.send(cancel_message(
                    &task.message.task_id,
                    &format!("timed out after {} ms", task.message.timeout_ms),
                ));
                overdue.push((worker_id.clone(), task));
            }
        }
        let holders: HashSet<String> = overdue.iter().map(|(id, _)| id.clone()).collect();
        let assignments = holders.iter().flat_map(|id| state.fill(id)).collect();
        (overdue, assignments)
    }

    /// Takes over a task a reconnected worker still runs (its attempt is current): the worker
    /// holds it, in a slot of its own, without being sent it again.
    pub fn adopt(&self, worker_id: &str, mut task: ReadyTask) -> bool {
        let mut state = self.state.lock().expect("hub lock");
        let Some(worker) = state.workers.get_mut(worker_id) else {
            return false;
        };
        // It fills one of the slots the hello announced, like any task sent on this stream.
        task.started = Some(Instant::now());
        worker
            .holding
            .insert((task.run_id.clone(), task.task_key.clone()), task);
        true
    }

    /// Tells a worker to stop a task (one it runs that is no longer current).
    pub fn cancel(&self, worker_id: &str, task_id: &str, reason: &str) {
        let state = self.state.lock().expect("hub lock");
        if let Some(worker) = state.workers.get(worker_id) {
            let _ = worker.stream.send(cancel_message(task_id, reason));
        }
    }

    /// Where each task (run id, task key, agent) is: on a worker's stream, or queued while a
    /// worker that serves its agent is connected. One pass over the workers and queues, whatever
    /// the number of tasks asked about.
    pub fn locate(&self, tasks: &[(String, String, String)]) -> Vec<Holding> {
        let state = self.state.lock().expect("hub lock");
        let mut holders: HashMap<(&str, &str), &str> = HashMap::new();
        let mut served: HashSet<&str> = HashSet::new();
        for (id, worker) in &state.workers {
            for (run_id, task_key) in worker.holding.keys() {
                holders.insert((run_id, task_key), id);
            }
            served.extend(worker.agents.iter().map(String::as_str));
        }
        let queued: HashSet<(&str, &str)> = state
            .queues
            .values()
            .flatten()
            .map(|task| (task.run_id.as_str(), task.task_key.as_str()))
            .collect();
        tasks
            .iter()
            .map(|(run_id, task_key, agent)| {
                let key = (run_id.as_str(), task_key.as_str());
                if let Some(id) = holders.get(&key) {
                    Holding::Worker((*id).to_owned())
                } else if queued.contains(&key) && served.contains(agent.as_str()) {
                    Holding::Queued
                } else {
                    // In no queue and on no worker: dropped on an error path. Given up, so
                    // that a sweep delivers it again.
                    Holding::Nowhere
                }
            })
            .collect()
    }

    /// Free slots per agent over the connected workers (a worker serving two agents counts for
    /// both): how many due tasks of each agent this coordinator should claim.
    pub fn free_slots(&self) -> HashMap<String, usize> {
        let state = self.state.lock().expect("hub lock");
        let mut free: HashMap<String, usize> = HashMap::new();
        for worker in state.workers.values() {
            let slots = worker.capacity.saturating_sub(worker.holding.len());
            for agent in &worker.agents {
                *free.entry(agent.clone()).or_default() += slots;
            }
        }
        for (agent, queue) in &state.queues {
            if let Some(slots) = free.get_mut(agent) {
                *slots = slots.saturating_sub(queue.len());
            }
        }
        free
    }

    /// The coordinator is going away: every worker is told to connect to another one, and the
    /// queues are emptied (their tasks are released to the other coordinators). Returns the
    /// queued tasks.
    pub fn goodbye(&self) -> Vec<ReadyTask> {
        let mut state = self.state.lock().expect("hub lock");
        for worker in state.workers.values_mut() {
            worker.capacity = 0;
            let _ = worker.stream.send(CoordinatorMessage {
                message: Some(coordinator_message::Message::Goodbye(
                    baton_proto::v1::Goodbye {},
                )),
            });
        }
        state.queues.drain().flat_map(|(_, queue)| queue).collect()
    }

    /// Sends a task to a worker now, or queues it.
    pub fn submit(&self, task: ReadyTask) -> Option<Assignment> {
        let mut state = self.state.lock().expect("hub lock");
        match state.assign(task) {
            Ok(assignment) => Some(assignment),
            Err(task) => {
                state
                    .queues
                    .entry(task.agent.clone())
                    .or_default()
                    .push_back(*task);
                None
            }
        }
    }

    /// The worker could not rebuild the task's payload (it lacked a part, or one was corrupt):
    /// tells it to empty its part cache, empties the copy here, and sends the task again with
    /// every part. Tasks sent after the reset assume the empty cache, so the two agree again
    /// from there. Fails when the worker does not hold the task or it was resent
    /// [`MAX_RESENDS`] times already.
    pub fn resend(&self, worker_id: &str, run_id: &str, task_key: &str) -> Result<(), Error> {
        let mut state = self.state.lock().expect("hub lock");
        let not_held = || Error::NotHeld {
            worker_id: worker_id.to_owned(),
            run_id: run_id.to_owned(),
            task_key: task_key.to_owned(),
        };
        let worker = state.workers.get_mut(worker_id).ok_or_else(not_held)?;
        let key = (run_id.to_owned(), task_key.to_owned());
        let task = worker.holding.get_mut(&key).ok_or_else(not_held)?;
        if task.resends >= MAX_RESENDS {
            return Err(Error::ResendsExhausted {
                run_id: run_id.to_owned(),
                task_key: task_key.to_owned(),
                resends: task.resends,
            });
        }
        task.resends += 1;
        let task = task.clone();
        worker.cache = mirror(worker.cache_bytes);
        let reset = CoordinatorMessage {
            message: Some(coordinator_message::Message::ResetPartCache(
                baton_proto::v1::ResetPartCache {},
            )),
        };
        let mut message = worker.message_for(&task);
        let bytes = payload_bytes(&message);
        state.maybe_corrupt(&mut message);
        let worker = state.workers.get_mut(worker_id).ok_or_else(not_held)?;
        // A closed stream: the disconnect that follows requeues the task.
        if worker.stream.send(reset).is_ok() && worker.stream.send(message).is_ok() {
            worker.touch_parts(&task);
            state.bytes_to_workers += bytes;
        }
        Ok(())
    }

    /// A test hook (`BATON_TEST_CORRUPT_PARTS` on the coordinator): the next `tasks` task
    /// messages that carry parts get one byte of their first part flipped on the wire, to show
    /// that workers refuse such a payload and ask for it again.
    pub fn corrupt_next_parts(&self, tasks: u64) {
        self.state.lock().expect("hub lock").corrupt_remaining = tasks;
    }

    /// The worker takes no new tasks (it is shutting down); those it holds stay with it until
    /// it answers them or its stream ends.
    pub fn drain(&self, worker_id: &str) {
        let mut state = self.state.lock().expect("hub lock");
        if let Some(worker) = state.workers.get_mut(worker_id) {
            worker.capacity = 0;
        }
    }

    /// A task `worker_id` holds: its agent, and when it became ready and was sent.
    pub fn sent(&self, worker_id: &str, run_id: &str, task_key: &str) -> Option<Sent> {
        let state = self.state.lock().expect("hub lock");
        let task = state
            .workers
            .get(worker_id)?
            .holding
            .get(&(run_id.to_owned(), task_key.to_owned()))?;
        task.sent()
    }

    /// Per agent with tasks waiting: how many, and how long the oldest has waited.
    pub fn queue_stats(&self) -> Vec<(String, usize, Duration)> {
        let state = self.state.lock().expect("hub lock");
        state
            .queues
            .iter()
            .filter(|(_, queue)| !queue.is_empty())
            .map(|(agent, queue)| {
                let oldest = queue
                    .iter()
                    .map(|task| task.ready_at.elapsed())
                    .max()
                    .unwrap_or_default();
                (agent.clone(), queue.len(), oldest)
            })
            .collect()
    }

    /// Free slots per agent of the connected workers, and how many workers there are.
    pub fn capacity(&self) -> (usize, Vec<(String, usize)>) {
        let state = self.state.lock().expect("hub lock");
        let mut free: HashMap<String, usize> = HashMap::new();
        for worker in state.workers.values() {
            for agent in &worker.agents {
                *free.entry(agent.clone()).or_default() +=
                    worker.capacity.saturating_sub(worker.holding.len());
            }
        }
        (state.workers.len(), free.into_iter().collect())
    }

    /// Whether `worker_id` holds this attempt of the task.
    pub fn holds(&self, worker_id: &str, run_id: &str, task_key: &str, attempt: u32) -> bool {
        let state = self.state.lock().expect("hub lock");
        state.workers.get(worker_id).is_some_and(|worker| {
            worker
                .holding
                .get(&(run_id.to_owned(), task_key.to_owned()))
                .is_some_and(|task| task.attempt() == attempt)
        })
    }

    /// The worker is done with the task: its slot takes the next waiting task.
    pub fn finish(
        &self,
        worker_id: &str,
        run_id: &str,
        task_key: &str,
    ) -> Result<Vec<Assignment>, Error> {
        let mut state = self.state.lock().expect("hub lock");
        let released = state.workers.get_mut(worker_id).and_then(|worker| {
            worker
                .holding
                .remove(&(run_id.to_owned(), task_key.to_owned()))
        });
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
        let mut state = self.state.lock().expect("hub lock");
        for queue in state.queues.values_mut() {
            queue.retain(|task| !(task.run_id == run_id && task.task_key == task_key));
        }
        let key = (run_id.to_owned(), task_key.to_owned());
        let held = state.workers.iter_mut().find_map(|(id, worker)| {
            let task = worker.holding.remove(&key)?;
            // Its agent is stopped at once rather than left to finish for nothing. A closed
            // stream needs no message: the worker is gone or going.
            let _ = worker
                .stream
                .send(cancel_message(&task.message.task_id, reason));
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
        let mut state = self.state.lock().expect("hub lock");
        let key = (run_id.to_owned(), task_key.to_owned());
        let Some(task) = state
            .workers
            .get_mut(worker_id)
            .and_then(|worker| worker.holding.remove(&key))
        else {
            return Vec::new();
        };
        let agent = task.agent.clone();
        state
            .queues
            .entry(agent.clone())
            .or_default()
            .push_front(task);
        let serving: Vec<String> = state
            .workers
            .iter()
            .filter(|(_, worker)| worker.agents.contains(&agent))
            .map(|(id, _)| id.clone())
            .collect();
        serving.iter().flat_map(|id| state.fill(id)).collect()
    }

    /// Whether any connected worker serves `agent`.
    pub fn serves(&self, agent: &str) -> bool {
        let state = self.state.lock().expect("hub lock");
        state
            .workers
            .values()
            .any(|worker| worker.agents.contains(agent))
    }

    pub fn counters(&self) -> Counters {
        let state = self.state.lock().expect("hub lock");
        Counters {
            workers: state.workers.len(),
            tasks_dispatched: state.tasks_dispatched,
            bytes_to_workers: state.bytes_to_workers,
        }
    }

    /// Connected workers and their free slots.
    pub fn workers(&self) -> Vec<(String, usize)> {
        let state = self.state.lock().expect("hub lock");
        state
            .workers
            .iter()
            .map(|(id, worker)| {
                (
                    id.clone(),
                    worker.capacity.saturating_sub(worker.holding.len()),
                )
            })
            .collect()
    }
}

impl State {
    /// Hands `task` to the least-loaded worker that can take it. A worker whose stream turns
    /// out to be closed is skipped (its disconnect follows), so it cannot hold up dispatch.
    fn assign(&mut self, task: ReadyTask) -> Result<Assignment, Box<ReadyTask>> {
        let mut candidates: Vec<(usize, String)> = self
            .workers
            .iter()
            .filter(|(_, worker)| {
                worker.agents.contains(&task.agent) && worker.holding.len() < worker.capacity
            })
            .map(|(id, worker)| (worker.holding.len(), id.clone()))
            .collect();
        candidates.sort();
        for (_, worker_id) in candidates {
            let worker = self
                .workers
                .get_mut(&worker_id)
                .expect("a candidate exists");
            let mut message = worker.message_for(&task);
            let bytes = payload_bytes(&message);
            self.maybe_corrupt(&mut message);
            let worker = self
                .workers
                .get_mut(&worker_id)
                .expect("a candidate exists");
            if worker.stream.send(message).is_err() {
                // A closed stream: its disconnect follows; the next worker gets the task.
                worker.capacity = 0;
                continue;
            }
            worker.touch_parts(&task);
            self.tasks_dispatched += 1;
            self.bytes_to_workers += bytes;
            let mut task = task;
            let now = Instant::now();
            task.started = Some(now);
            let assignment = Assignment {
                worker_id,
                run_id: task.run_id.clone(),
                task_key: task.task_key.clone(),
                agent: task.agent.clone(),
                waited: now.saturating_duration_since(task.ready_at),
            };
            worker
                .holding
                .insert((task.run_id.clone(), task.task_key.clone()), task);
            return Ok(assignment);
        }
        Err(Box::new(task))
    }

    /// Gives `worker_id` queued tasks until it is full.
    fn fill(&mut self, worker_id: &str) -> Vec<Assignment> {
        let Some(agents) = self.workers.get(worker_id).map(|w| w.agents.clone()) else {
            return Vec::new();
        };
        let mut assignments = Vec::new();
        for agent in agents {
            loop {
                let has_room = self
                    .workers
                    .get(worker_id)
                    .is_some_and(|w| w.holding.len() < w.capacity);
                if !has_room {
                    return assignments;
                }
                let Some(task) = self.queues.get_mut(&agent).and_then(VecDeque::pop_front) else {
                    break;
                };
                match self.assign(task) {
                    Ok(assignment) => assignments.push(assignment),
                    Err(task) => {
                        self.queues
                            .entry(agent.clone())
                            .or_default()
                            .push_front(*task);
                        break;
                    }
                }
            }
        }
        assignments
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(run: &str, key: &str, agent: &str) -> ReadyTask {
        ReadyTask {
            run_id: run.into(),
            task_key: key.into(),
            agent: agent.into(),
            message: Task::default(),
            parts: Vec::new(),
            resends: 0,
            started: None,
            ready_at: Instant::now(),
            trace: None,
        }
    }

    fn worker(
        hub: &Hub,
        id: &str,
        agents: &[&str],
        capacity: usize,
    ) -> mpsc::UnboundedReceiver<CoordinatorMessage> {
        let (tx, rx) = mpsc::unbounded_channel();
        hub.connect(id, agents.iter().map(|a| a.to_string()), capacity, 0, tx)
            .unwrap();
        hub.fill_worker(id);
        rx
    }

    #[test]
    fn branches_spread_over_the_least_loaded_workers() {
        let hub = Hub::default();
        let _a = worker(&hub, "a", &["test"], 4);
        let _b = worker(&hub, "b", &["test"], 4);
        let holders: Vec<String> = (0..4)
            .map(|i| {
                hub.submit(task("r", &format!("t{i}#1"), "test"))
                    .unwrap()
                    .worker_id
            })
            .collect();
        assert_eq!(holders, ["a", "b", "a", "b"]);
    }

    #[test]
    fn tasks_wait_for_a_worker_that_serves_their_agent() {
        let hub = Hub::default();
        let _a = worker(&hub, "a", &["planner"], 1);
        assert!(hub.submit(task("r", "code#1", "coder")).is_none());
        assert!(!hub.serves("coder"));
        let _b = worker(&hub, "b", &["coder"], 1);
        assert!(hub.holds("b", "r", "code#1", 0));
    }

    #[test]
    fn a_full_worker_takes_the_next_task_when_it_finishes_one() {
        let hub = Hub::default();
        let _a = worker(&hub, "a", &["x"], 1);
        hub.submit(task("r", "one#1", "x")).unwrap();
        assert!(hub.submit(task("r", "two#1", "x")).is_none());
        let next = hub.finish("a", "r", "one#1").unwrap();
        assert_eq!(next[0].task_key, "two#1");
        assert_eq!(
            hub.finish("a", "r", "one#1"),
            Err(Error::NotHeld {
                worker_id: "a".into(),
                run_id: "r".into(),
                task_key: "one#1".into()
            })
        );
    }

    #[test]
    fn a_departing_worker_gives_back_its_tasks_once() {
        let hub = Hub::default();
        let (tx, _rx) = mpsc::unbounded_channel();
        let (first, _closed) = hub.connect("a", ["x".to_string()], 2, 0, tx).unwrap();
        hub.submit(task("r", "one#1", "x")).unwrap();
        let returned = hub.disconnect("a", first);
        assert_eq!(returned.len(), 1);
        assert_eq!(returned[0].task_key, "one#1");
        assert!(!hub.holds("a", "r", "one#1", 0));
        // The same worker back on a new stream; the old stream ending late removes nothing.
        let (tx, _rx) = mpsc::unbounded_channel();
        let (second, _closed) = hub.connect("a", ["x".to_string()], 2, 0, tx).unwrap();
        hub.submit(task("r", "two#1", "x")).unwrap();
        assert!(hub.disconnect("a", first).is_empty());
        assert!(hub.holds("a", "r", "two#1", 0));
        assert_eq!(hub.disconnect("a", second).len(), 1);
    }

    #[test]
    fn a_task_past_its_timeout_is_taken_back_and_stopped() {
        let hub = Hub::default();
        let mut rx = worker(&hub, "a", &["x"], 1);
        let mut slow = task("r", "slow#1", "x");
        slow.message.timeout_ms = 1;
        slow.message.task_id = "r/slow#1@1".into();
        hub.submit(slow).unwrap();
        assert!(
            hub.submit(task("r", "next#1", "x")).is_none(),
            "the slot is full"
        );
        rx.try_recv().unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let (overdue, assignments) = hub.overdue();
        assert_eq!(overdue.len(), 1);
        assert_eq!(overdue[0].0, "a");
        match rx.try_recv().unwrap().message {
            Some(coordinator_message::Message::Cancel(cancel)) => {
                assert_eq!(cancel.task_id, "r/slow#1@1");
                assert!(cancel.reason.contains("timed out"), "{}", cancel.reason);
            }
            other => panic!("expected a cancel, got {other:?}"),
        }
        assert_eq!(
            assignments[0].task_key, "next#1",
            "the freed slot took the next task"
        );
    }

    fn with_parts(mut task: ReadyTask, parts: &[&str]) -> ReadyTask {
        task.parts = parts
            .iter()
            .map(|json| Arc::new(Json::new(json.as_bytes().to_vec())))
            .collect();
        task
    }

    fn sent_parts(rx: &mut mpsc::UnboundedReceiver<CoordinatorMessage>) -> Vec<String> {
        match rx.try_recv().unwrap().message {
            Some(coordinator_message::Message::Task(task)) => task
                .parts
                .into_iter()
                .map(|part| String::from_utf8(part.json).unwrap())
                .collect(),
            other => panic!("expected a task, got {other:?}"),
        }
    }

    #[test]
    fn a_worker_gets_each_part_once_while_its_cache_holds_it() {
        let hub = Hub::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        // Room for the input and two 10-byte results.
        hub.connect("a", ["x".to_string()], 1, 26, tx).unwrap();
        let input = r#""input""#;
        let steps = [r#""result 1""#, r#""result 2""#, r#""result 3""#];
        let mut sent = Vec::new();
        for n in 0..3 {
            let mut parts = vec![input];
            parts.extend(&steps[..n]);
            let key = format!("s{n}#1");
            hub.submit(with_parts(task("r", &key, "x"), &parts))
                .unwrap();
            sent.push(sent_parts(&mut rx));
            hub.finish("a", "r", &key).unwrap();
        }
        assert_eq!(sent[0], [input]);
        assert_eq!(sent[1], [steps[0]], "the input is cached");
        assert_eq!(sent[2], [steps[1]]);
        // The cache holds 26 bytes: input (7) + result 1 (10) + result 2 (10) is over, so the
        // least recently used part (the input, touched before result 1) went.
        hub.submit(with_parts(
            task("r", "s3#1", "x"),
            &[input, steps[0], steps[1]],
        ))
        .unwrap();
        assert_eq!(sent_parts(&mut rx), [input]);
        let counters = hub.counters();
        assert_eq!(counters.bytes_to_workers, 7 + 10 + 10 + 7);
    }

    #[test]
    fn without_a_cache_every_part_goes_with_every_task_once() {
        let hub = Hub::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        hub.connect("a", ["x".to_string()], 2, 0, tx).unwrap();
        let parts = [r#""in""#, r#"{"plan":1}"#, r#"{"plan":1}"#];
        hub.submit(with_parts(task("r", "a#1", "x"), &parts))
            .unwrap();
        hub.submit(with_parts(task("r", "b#1", "x"), &parts))
            .unwrap();
        assert_eq!(sent_parts(&mut rx), [parts[0], parts[1]]);
        assert_eq!(sent_parts(&mut rx), [parts[0], parts[1]]);
    }

    #[test]
    fn a_resend_resets_the_cache_and_sends_every_part_again() {
        let hub = Hub::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        hub.connect("a", ["x".to_string()], 2, 1 << 20, tx).unwrap();
        let parts = [r#""in""#, r#"{"plan":1}"#];
        hub.submit(with_parts(task("r", "a#1", "x"), &parts))
            .unwrap();
        assert_eq!(sent_parts(&mut rx), parts);
        hub.submit(with_parts(task("r", "b#1", "x"), &parts))
            .unwrap();
        assert!(sent_parts(&mut rx).is_empty(), "cached");

        hub.resend("a", "r", "b#1").unwrap();
        assert!(matches!(
            rx.try_recv().unwrap().message,
            Some(coordinator_message::Message::ResetPartCache(_))
        ));
        assert_eq!(sent_parts(&mut rx), parts, "whole, after the reset");
        // Tasks after the reset build on the resent one.
        assert!(
            hub.submit(with_parts(task("r", "c#1", "x"), &parts))
                .is_none()
        );
        hub.finish("a", "r", "a#1").unwrap();
        assert!(sent_parts(&mut rx).is_empty());

        for _ in 1..MAX_RESENDS {
            hub.resend("a", "r", "b#1").unwrap();
        }
        assert!(matches!(
            hub.resend("a", "r", "b#1"),
            Err(Error::ResendsExhausted {
                resends: MAX_RESENDS,
                ..
            })
        ));
        assert!(matches!(
            hub.resend("a", "r", "nope#1"),
            Err(Error::NotHeld { .. })
        ));
    }

    #[test]
    fn locate_says_where_each_held_task_is() {
        let hub = Hub::default();
        let _a = worker(&hub, "a", &["x"], 1);
        hub.submit(task("r", "running#1", "x")).unwrap();
        assert!(hub.submit(task("r", "queued#1", "x")).is_none());
        assert!(hub.submit(task("r", "unserved#1", "y")).is_none());
        let ask = |key: &str, agent: &str| ("r".to_owned(), key.to_owned(), agent.to_owned());
        assert_eq!(
            hub.locate(&[
                ask("running#1", "x"),
                ask("queued#1", "x"),
                ask("unserved#1", "y"),
                ask("dropped#1", "x"),
            ]),
            [
                Holding::Worker("a".into()),
                Holding::Queued,
                Holding::Nowhere,
                Holding::Nowhere
            ]
        );
    }

    #[test]
    fn worker_ids_are_unique() {
        let hub = Hub::default();
        let _a = worker(&hub, "a", &["x"], 1);
        let (tx, _rx) = mpsc::unbounded_channel();
        assert_eq!(
            hub.connect("a", ["x".to_string()], 1, 0, tx).map(|_| ()),
            Err(Error::DuplicateWorker("a".into()))
        );
    }
}
