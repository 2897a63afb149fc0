//! Answers to one run that arrive together settle in one transition (group commit).
//!
//! Every answer that changes a run (a result, a failed attempt given no retry, a task given up
//! after being lost too often) is queued on its run. The first one to find no drain of its run
//! under way starts one, and the drain writes everything queued in one store call
//! ([`Coordinator::apply_changes`]), then whatever was queued meanwhile, until the queue is
//! empty. 500 branches finishing together were 500 writes behind the run's lock, each waiting
//! for the one before; now they are as many writes as the store's round trips let pile up
//! between them. An answer alone (a chain's next step) is written alone, as before.
//!
//! The answer that finds its run's queue empty writes the first batch in its own call (alone,
//! when it is: a chain's next step pays for no hand-over between tasks); the answers queued
//! meanwhile are written by a drain on a task of its own, so that the first answerer hears back
//! at once. A drain dropped mid-way hands what is still queued to a new one: no answer waits
//! for a drain that no longer runs.
//!
//! Each answer gets its own outcome. A fence that fails (a late answer to an attempt given to
//! another worker) refuses that answer alone and the rest are written without it; an answer the
//! engine refuses is refused alone; a store briefly unreachable (Redis restarting) is waited
//! out for [`STORE_PATIENCE`], as for a single answer.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use baton_core::{Event, TaskId};
use tokio::sync::oneshot;
use tracing::Instrument as _;

use super::change::{Change, STORE_PATIENCE};
use super::plan::Answering;
use super::{Coordinator, Error};
use crate::clock::Instant;
use crate::decisions::Embedded;
use crate::model::{ModelUsage, StoredEvent};
use crate::parts::Part;
use crate::store::{self, Store};
use crate::task_ref::{TaskRef, task_key};

/// At most this many answers go in one transition: a map of 100,000 items must not make one
/// store call so large that it holds Redis up for everyone else.
pub(super) const MAX_BATCH: usize = 256;

/// The answers queued on each run, while a drain of that run is under way.
#[derive(Default)]
pub(super) struct AnswerQueues {
    /// A run is here exactly while a drain of it runs; its list is what that drain has not
    /// taken yet.
    queues: Mutex<HashMap<String, Vec<Queued>>>,
}

impl AnswerQueues {
    /// Queues `answer`; true when no drain of the run is under way, so the caller starts one.
    fn push(&self, run_id: &str, answer: Queued) -> bool {
        let mut queues = self.queues.lock().expect("answer queues poisoned");
        match queues.get_mut(run_id) {
            Some(queued) => {
                queued.push(answer);
                false
            }
            None => {
                queues.insert(run_id.to_owned(), vec![answer]);
                true
            }
        }
    }

    /// Up to [`MAX_BATCH`] of the answers queued on the run, oldest first. Empty ends the drain:
    /// the next answer queued starts another.
    fn take(&self, run_id: &str) -> Vec<Queued> {
        let mut queues = self.queues.lock().expect("answer queues poisoned");
        let Some(queued) = queues.get_mut(run_id) else {
            return Vec::new();
        };
        if queued.is_empty() {
            queues.remove(run_id);
            return Vec::new();
        }
        let rest = queued.split_off(queued.len().min(MAX_BATCH));
        std::mem::replace(queued, rest)
    }
}

/// A drain under way in an answerer's own call. Dropped before it is done (the call cancelled
/// mid-write), it hands the answers still queued to a drain of their own, so that none waits
/// for a drain that no longer runs.
struct Draining<'a, S: Store> {
    coordinator: &'a Coordinator<S>,
    run_id: &'a str,
    done: bool,
}

impl<S: Store> Drop for Draining<'_, S> {
    fn drop(&mut self) {
        if !self.done && tokio::runtime::Handle::try_current().is_ok() {
            let rest = self.coordinator.inner.answers.take(self.run_id);
            if !rest.is_empty() {
                self.coordinator.spawn_drain(self.run_id, rest);
            }
        }
    }
}

/// An answer waiting for its drain, owned (it crosses into the drain's task).
struct Queued {
    event: Event,
    stored: StoredEvent,
    worker_id: String,
    task: TaskId,
    attempt: u32,
    usage: Vec<ModelUsage>,
    started_ms: i64,
    sent: Option<Part>,
    embedded: Option<Embedded>,
    reply: oneshot::Sender<Result<(), Error>>,
}

impl Queued {
    fn change(&self) -> Change<'_> {
        Change {
            event: &self.event,
            stored: &self.stored,
            answering: Some(Answering {
                worker_id: &self.worker_id,
                task: &self.task,
                attempt: self.attempt,
                usage: &self.usage,
                started_ms: self.started_ms,
                sent: self.sent.as_ref(),
            }),
            embedded: self.embedded.as_ref(),
            fence: None,
        }
    }
}

impl<S: Store> Coordinator<S> {
    /// Records a worker's answer to a run: settled with the answers to the same run that arrive
    /// with it, in one transition. A store that is briefly unreachable (Redis restarting) is
    /// waited out for a while rather than losing the answer, which is safe since the write is
    /// fenced by the run's version and each task's attempt. A superseded attempt is counted and
    /// refused.
    pub(super) async fn apply_patiently(
        &self,
        run_id: &str,
        event: Event,
        answering: Answering<'_>,
        embedded: Option<Embedded>,
    ) -> Result<(), Error> {
        let stored =
            StoredEvent::of(&event, answering.worker_id).expect("only a halt is never logged");
        let (reply, outcome) = oneshot::channel();
        let answer = Queued {
            event,
            stored,
            worker_id: answering.worker_id.to_owned(),
            task: answering.task.clone(),
            attempt: answering.attempt,
            usage: answering.usage.to_vec(),
            started_ms: answering.started_ms,
            sent: answering.sent.cloned(),
            embedded,
            reply,
        };
        if self.inner.answers.push(run_id, answer) {
            // This answer found the queue empty: it writes the first batch itself, which is
            // all there is when it is alone (a chain's next step), with no task to hand over to.
            let mut draining = Draining {
                coordinator: self,
                run_id,
                done: false,
            };
            let batch = self.inner.answers.take(run_id);
            self.settle_batch(run_id, batch).await;
            let rest = self.inner.answers.take(run_id);
            draining.done = true;
            if !rest.is_empty() {
                // Answers queued while that batch was written: this answerer hears back now,
                // and a drain of their own writes them.
                self.spawn_drain(run_id, rest);
            }
        }
        // No outcome: the drain that held this answer was dropped mid-write (the runtime
        // shutting down), so whether it was recorded is unknown, as for a store that did not
        // answer; its task goes back to the queue.
        outcome.await.unwrap_or_else(|_| {
            Err(store::Error::Unavailable("the answer's write was abandoned".into()).into())
        })
    }

    /// Writes `batch`, then the run's queued answers, a batch at a time until none are left,
    /// on a task of its own.
    fn spawn_drain(&self, run_id: &str, batch: Vec<Queued>) {
        let coordinator = self.clone();
        let run_id = run_id.to_owned();
        let logs = tracing::info_span!("answers", run_id = %run_id);
        let drain = async move {
            let mut batch = batch;
            while !batch.is_empty() {
                coordinator.settle_batch(&run_id, batch).await;
                batch = coordinator.inner.answers.take(&run_id);
            }
        };
        tokio::spawn(drain.instrument(logs));
    }

    /// Writes a batch of the run's answers and tells each its outcome.
    async fn settle_batch(&self, run_id: &str, batch: Vec<Queued>) {
        let outcomes = self.settle_patiently(run_id, &batch).await;
        for (answer, outcome) in batch.into_iter().zip(outcomes) {
            // An answerer that is gone no longer needs its outcome.
            let _ = answer.reply.send(outcome);
        }
    }

    /// The outcome of each answer of `batch`, in order.
    async fn settle_patiently(&self, run_id: &str, batch: &[Queued]) -> Vec<Result<(), Error>> {
        let mut outcomes: Vec<Option<Result<(), Error>>> = batch.iter().map(|_| None).collect();
        // The answers not settled yet, by index in `batch`.
        let mut pending: Vec<usize> = (0..batch.len()).collect();
        // After an error no answer explains, each is written alone, so that each gets its own.
        let mut alone = false;
        let mut wait = Duration::from_millis(50);
        let give_up = Instant::now() + STORE_PATIENCE;
        while !pending.is_empty() {
            let taking = if alone { 1 } else { pending.len() };
            let changes: Vec<Change<'_>> = pending[..taking]
                .iter()
                .map(|&i| batch[i].change())
                .collect();
            match self.apply_changes(run_id, &changes, false).await {
                Ok((settled, _)) => {
                    for (i, outcome) in pending.drain(..taking).zip(settled) {
                        outcomes[i] = Some(outcome);
                    }
                }
                Err(Error::Store(store::Error::Unavailable(reason)))
                    if Instant::now() < give_up =>
                {
                    tracing::warn!(run_id, %reason, "store unavailable; the answer waits");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(1));
                }
                Err(Error::Store(store::Error::Fenced {
                    task_key: fenced,
                    attempt,
                    current,
                    ..
                })) => {
                    self.inner.metrics.fenced.inc();
                    self.forget_held(run_id, &fenced);
                    // The fence is one answer's: it alone is refused, the others go on.
                    let late = pending[..taking].iter().position(|&i| {
                        task_key(&batch[i].task) == fenced && batch[i].attempt == attempt
                    });
                    let Some(late) = late else {
                        alone = true;
                        continue;
                    };
                    let i = pending.remove(late);
                    let task = TaskRef::new(run_id, &batch[i].task, attempt);
                    outcomes[i] = Some(Err(Error::Superseded {
                        task_id: task.to_string(),
                        attempt,
                        current,
                    }));
                }
                Err(error) if taking == 1 => {
                    outcomes[pending.remove(0)] = Some(Err(error));
                }
                Err(_) => alone = true,
            }
        }
        outcomes
            .into_iter()
            .map(|outcome| outcome.expect("every answer settled"))
            .collect()
    }
}
