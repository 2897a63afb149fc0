//! One connected worker: its stream, the tasks it holds, and the mirror of its part cache.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use baton_core::BlobLru;
use tokio::sync::{mpsc, oneshot};

use super::task::{ReadyTask, TaskMessage, ToWorker};
use crate::clock::Instant;
use crate::parts::{ForWorker, Part};
use crate::task_ref::TaskKey;

/// The coordinator's copy of a worker's part cache holds at most this many bytes' worth and this
/// many parts, whatever the worker asks for, so a worker cannot make it keep unbounded
/// bookkeeping. A worker with a larger cache then holds more than the copy says (see
/// [`BlobLru`]), and at worst gets some parts it already has.
pub const MIRROR_MAX_BYTES: u64 = 16 << 30;
pub const MIRROR_MAX_PARTS: usize = 1 << 16;

/// What a worker's stream carries from the coordinator.
pub type WorkerStream = mpsc::UnboundedSender<ToWorker>;

pub(super) struct Session {
    /// Which connection of this worker id it is: a stream that ends late must not remove the
    /// connection that replaced it.
    pub connection: u64,
    /// Dropped with the session: ends its stream, even while the worker still writes to it (it
    /// was cut off for silence), so that it reconnects instead of being ignored.
    _closer: oneshot::Sender<()>,
    /// When the worker last said anything (heartbeats included).
    pub last_seen: Instant,
    /// The principal it authenticated as; `None` without authentication.
    pub principal: Option<String>,
    pub agents: HashSet<String>,
    /// The worker protocol it speaks (`Hello.protocol`): a task that needs a later one never
    /// goes to it.
    pub protocol: u32,
    /// How many tasks it takes at once; 0 until it is opened, and again once it drains or its
    /// stream turned out closed.
    pub capacity: usize,
    /// The capacity it announced, which opening it gives it.
    announced: usize,
    /// Tasks it holds, by (run id, visit key), kept whole so they can be sent again if it goes
    /// away.
    pub holding: HashMap<TaskKey, ReadyTask>,
    stream: WorkerStream,
    /// What the worker's part cache holds, by the same policy the worker runs.
    cache: BlobLru,
    /// Its limits, to start afresh after a reset.
    cache_bytes: u64,
}

impl Session {
    pub fn new(
        connection: u64,
        closer: oneshot::Sender<()>,
        agents: HashSet<String>,
        protocol: u32,
        capacity: usize,
        cache_bytes: u64,
        stream: WorkerStream,
    ) -> Self {
        Session {
            connection,
            _closer: closer,
            last_seen: Instant::now(),
            principal: None,
            agents,
            protocol,
            capacity: 0,
            announced: capacity.max(1),
            holding: HashMap::new(),
            stream,
            cache: mirror(cache_bytes),
            cache_bytes,
        }
    }

    /// Takes tasks from now on, up to the capacity it announced.
    pub fn open(&mut self) {
        self.capacity = self.announced;
    }

    pub fn free_slots(&self) -> usize {
        self.capacity.saturating_sub(self.holding.len())
    }

    /// Sends `task` with the parts this worker does not hold, each once, and touches the
    /// mirror as the worker will touch its cache on arrival. Returns the payload bytes sent,
    /// or `None` if the stream is closed (the worker is gone or going).
    pub fn send_task(&mut self, task: &ReadyTask) -> Option<u64> {
        let cache = &self.cache;
        let sending = task
            .payload
            .for_worker(self.protocol, |name| cache.contains(name));
        let message = self.message_for(task, &sending);
        let bytes = message.payload_bytes();
        self.stream.send(ToWorker::Task(message)).ok()?;
        for part in &sending.named {
            self.cache.touch(&part.sha256, part.json.len() as u64);
        }
        if let Some((name, size)) = sending.listing {
            self.cache.touch(name, size);
        }
        Some(bytes)
    }

    /// Empties the part cache on both sides, then sends `task` whole. `None`: the stream is
    /// closed.
    pub fn resend_task(&mut self, task: &ReadyTask) -> Option<u64> {
        self.cache = mirror(self.cache_bytes);
        self.stream.send(ToWorker::ResetPartCache).ok()?;
        self.send_task(task)
    }

    /// Sends a message that is not a task; a closed stream needs none.
    pub fn tell(&self, message: ToWorker) {
        let _ = self.stream.send(message);
    }

    /// The task with the parts of `sending` this worker does not hold, each once.
    fn message_for(&self, task: &ReadyTask, sending: &ForWorker<'_>) -> TaskMessage {
        let mut sent = HashSet::new();
        let parts: Vec<Arc<Part>> = sending
            .named
            .iter()
            .filter(|part| !self.cache.contains(&part.sha256) && sent.insert(&part.sha256))
            .cloned()
            .collect();
        task.message(&sending.manifest, parts)
    }
}

/// "Stop this task", with the id the worker knows it by.
pub(super) fn cancel(task: &ReadyTask, reason: &str) -> ToWorker {
    ToWorker::Cancel {
        task_id: task.task.to_string(),
        reason: reason.to_owned(),
    }
}

fn mirror(cache_bytes: u64) -> BlobLru {
    BlobLru::with_max_entries(cache_bytes.min(MIRROR_MAX_BYTES), MIRROR_MAX_PARTS)
}
