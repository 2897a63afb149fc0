//! Live output: the pieces agents stream while they run (an LLM's tokens), from the worker that
//! holds the task to the store, and from the store to every watcher of the run, on any
//! coordinator.
//!
//! - **In.** A piece is taken only from the worker holding that attempt of the task, and goes
//!   to one appender per coordinator, which writes whatever has piled up meanwhile in one
//!   store call: a burst costs a few round trips, not one per piece, and an idle stream adds no
//!   wait.
//! - **Out.** One reader per coordinator waits (`Store::wait_output`) on the runs that have
//!   watchers here, from where each was read up to, and hands what comes to that run's
//!   watchers through a broadcast channel. The store keeps the run's output (bounded) until the
//!   run ends, so a watcher that joins mid-step first reads what was streamed so far, then
//!   follows: it subscribes before it reads, and drops what it has already seen by offset.
//! - **Slow watchers** miss pieces and are told how many (`RunEvent::OutputMissed`); nothing
//!   waits for them: not the agent, not the reader, not the other watchers. The reader hands
//!   on what each read brought as one numbered [`Delivery`], so a burst is one message, and a
//!   watcher that missed some knows exactly how many pieces.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, broadcast, mpsc, oneshot};

use super::{Coordinator, Error, StopSignal};
use crate::metrics::Refused;
use crate::store::{LiveOutput, OutputOffset, OutputPiece, Store};
use crate::task_ref::TaskRef;
use baton_core::RunId;

/// How many deliveries (each what one read of the store brought, however many pieces) a
/// watcher may fall behind before it misses some. Tokio's broadcast channel allocates every
/// slot up front, per watched run, and most runs stream nothing: a slot is one pointer.
const WATCHER_BACKLOG: usize = 256;

/// How many runs the appender remembers having taken pieces for; past it, it forgets those with
/// nothing in flight, and watchers read the store at every step's end until they catch up.
const RUNS_REMEMBERED: usize = 65_536;

/// How long the reader waits in one store call; it takes on newly watched runs between calls.
const READ_BLOCK: Duration = Duration::from_millis(250);

/// The most pieces the appender writes in one store call.
const APPEND_BATCH: usize = 512;

/// The coordinator's part of live output: the appender's queue, and the runs watched here.
pub(super) struct OutputFeed {
    appender: mpsc::UnboundedSender<ToAppend>,
    /// Taken by the appender task when it starts.
    appended: Mutex<Option<mpsc::UnboundedReceiver<ToAppend>>>,
    /// What this coordinator has queued for the store, by run.
    queued: Mutex<Queued>,
    watched: Mutex<HashMap<String, Watched>>,
    /// Wakes the reader when a run gets its first watcher.
    wake: Arc<Notify>,
}

/// The pieces queued on this coordinator, numbered in order: whether a run's output may be in
/// the store and not yet read here (see [`OutputFeed::queued_since`]).
#[derive(Default)]
struct Queued {
    /// The number of the last piece queued.
    last: u64,
    runs: HashMap<RunId, QueuedFor>,
    /// Pieces up to this number may have been queued for runs no longer in `runs`.
    forgotten: u64,
}

#[derive(Default)]
struct QueuedFor {
    /// Queued and not written yet.
    in_flight: usize,
    /// The number of the run's last piece queued.
    last: u64,
}

/// What the appender is given.
enum ToAppend {
    Piece(RunId, OutputPiece),
    /// Say when everything queued before this is written.
    Flush(oneshot::Sender<()>),
}

/// A run watched on this coordinator.
struct Watched {
    sender: broadcast::Sender<Arc<Delivery>>,
    /// How many pieces of the run were delivered here.
    delivered: u64,
    /// Where the reader is in the run's output; `None` until a watcher has read the output so
    /// far and said where it ends.
    after: Option<OutputOffset>,
}

impl Default for OutputFeed {
    fn default() -> Self {
        let (appender, appended) = mpsc::unbounded_channel();
        OutputFeed {
            appender,
            appended: Mutex::new(Some(appended)),
            queued: Mutex::default(),
            watched: Mutex::default(),
            wake: Arc::default(),
        }
    }
}

impl OutputFeed {
    fn watched(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watched>> {
        self.watched.lock().expect("watched lock")
    }

    fn queued(&self) -> std::sync::MutexGuard<'_, Queued> {
        self.queued.lock().expect("queued lock")
    }

    /// Queues a piece for the store.
    fn push(&self, run_id: RunId, piece: OutputPiece) {
        {
            let mut queued = self.queued();
            if queued.runs.len() >= RUNS_REMEMBERED && !queued.runs.contains_key(&run_id) {
                queued.runs.retain(|_, run| run.in_flight > 0);
                queued.forgotten = queued.last;
            }
            queued.last += 1;
            let last = queued.last;
            let run = queued.runs.entry(run_id.clone()).or_default();
            run.in_flight += 1;
            run.last = last;
        }
        // Closed only once `run` has stopped: live output is then not stored.
        let _ = self.appender.send(ToAppend::Piece(run_id, piece));
    }

    /// A mark for [`Self::queued_since`]: every piece of `run_id` queued here up to it is in
    /// the store now, so a read of the store that starts after this call sees them all.
    /// `previous` is the mark of the reader's last read, kept while pieces are in flight.
    pub fn stored_mark(&self, run_id: &str, previous: u64) -> u64 {
        let queued = self.queued();
        match queued.runs.get(run_id) {
            Some(run) if run.in_flight > 0 => previous,
            _ => queued.last,
        }
    }

    /// Whether this coordinator may have queued pieces of `run_id` that a read of the store
    /// made after `mark` (a [`Self::stored_mark`]) did not see. A step whose answer this
    /// coordinator recorded streamed, if at all, through here, and its pieces were stored
    /// before its end was told: when this says no, a watcher has read them all already and
    /// need not read the store again before telling the step's end.
    pub fn queued_since(&self, run_id: &str, since: u64) -> bool {
        let queued = self.queued();
        match queued.runs.get(run_id) {
            Some(run) => run.last > since,
            None => queued.forgotten > since,
        }
    }

    /// Returns once every piece of `run_id` queued so far is in the store: a task's output
    /// goes there before its answer is recorded, so that watchers get it before the step's end.
    pub async fn flushed(&self, run_id: &str) {
        if self
            .queued()
            .runs
            .get(run_id)
            .is_none_or(|run| run.in_flight == 0)
        {
            return;
        }
        let (done, written) = oneshot::channel();
        if self.appender.send(ToAppend::Flush(done)).is_ok() {
            let _ = written.await;
        }
    }

    fn written(&self, pieces: &[(RunId, OutputPiece)]) {
        let mut queued = self.queued();
        for (run_id, _) in pieces {
            if let Some(run) = queued.runs.get_mut(run_id) {
                run.in_flight = run.in_flight.saturating_sub(1);
            }
        }
    }

    /// A watcher's receiver of the run's output from now on.
    pub fn subscribe(&self, run_id: &str) -> OutputReceiver {
        let mut watched = self.watched();
        let run = watched.entry(run_id.to_owned()).or_insert_with(|| Watched {
            sender: broadcast::channel(WATCHER_BACKLOG).0,
            delivered: 0,
            after: None,
        });
        OutputReceiver {
            receiver: run.sender.subscribe(),
            next: run.delivered,
        }
    }

    /// A watcher has read the run's output up to `after`: the reader follows from there (or
    /// from where it already is, if earlier).
    pub fn follow_after(&self, run_id: &str, after: OutputOffset) {
        if let Some(watched) = self.watched().get_mut(run_id) {
            watched.after = Some(watched.after.map_or(after, |current| current.min(after)));
        }
        self.wake.notify_one();
    }

    /// The runs to read, and where from; forgets those nobody watches any more.
    fn to_read(&self) -> Vec<(String, OutputOffset)> {
        let mut watched = self.watched();
        watched.retain(|_, run| run.sender.receiver_count() > 0);
        watched
            .iter()
            .filter_map(|(run_id, run)| Some((run_id.clone(), run.after?)))
            .collect()
    }

    /// Hands pieces the reader read to the watchers of their runs, one delivery a run.
    fn deliver(&self, pieces: Vec<(String, OutputOffset, OutputPiece)>) {
        let mut by_run: HashMap<String, Vec<(OutputOffset, OutputPiece)>> = HashMap::new();
        for (run_id, offset, piece) in pieces {
            by_run.entry(run_id).or_default().push((offset, piece));
        }
        let mut watched = self.watched();
        for (run_id, pieces) in by_run {
            let Some(run) = watched.get_mut(&run_id) else {
                continue;
            };
            let last = pieces.iter().map(|(offset, _)| *offset).max();
            run.after = run.after.max(last);
            let delivery = Delivery {
                first: run.delivered,
                pieces,
            };
            run.delivered += delivery.pieces.len() as u64;
            // No receiver left: the next read forgets the run.
            let _ = run.sender.send(Arc::new(delivery));
        }
    }
}

/// What one read of the store brought of a run's output, numbered: `first` is how many pieces
/// of the run were delivered on this coordinator before these.
pub(super) struct Delivery {
    first: u64,
    pub pieces: Vec<(OutputOffset, OutputPiece)>,
}

/// A watcher's end of a run's live output on this coordinator.
pub(super) struct OutputReceiver {
    receiver: broadcast::Receiver<Arc<Delivery>>,
    /// The number of the next piece this watcher expects.
    next: u64,
}

impl OutputReceiver {
    /// The next delivery, with how many pieces this watcher missed before it (it fell behind);
    /// `None` once nothing more can come. Cancel-safe.
    pub async fn recv(&mut self) -> Option<(u64, Arc<Delivery>)> {
        loop {
            match self.receiver.recv().await {
                Ok(delivery) => {
                    let missed = delivery.first.saturating_sub(self.next);
                    self.next = delivery.first + delivery.pieces.len() as u64;
                    return Some((missed, delivery));
                }
                // The next delivery's number says how many pieces were missed.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

impl<S: Store> Coordinator<S> {
    /// A piece of the live output of `task`, from `worker_id`, which must hold that attempt.
    pub fn live_output(
        &self,
        worker_id: &str,
        task: &TaskRef,
        text: String,
        restart: bool,
    ) -> Result<(), Error> {
        if !self
            .inner
            .hub
            .holds(worker_id, &task.run_id, &task.key(), task.attempt)
        {
            self.inner.metrics.worker_refused(Refused::Output);
            return Err(Error::TaskNotHeld {
                worker_id: worker_id.to_owned(),
                task_id: task.to_string(),
            });
        }
        let piece = OutputPiece {
            step_id: task.task.step_id.to_string(),
            visit: task.task.visit,
            attempt: task.attempt,
            text,
            restart,
            worker_id: Some(worker_id.into()),
        };
        self.inner.output.push(task.run_id.clone(), piece);
        Ok(())
    }
}

/// Writes the pieces workers send, whatever has piled up in one store call
/// ([`Coordinator::run`]). Asked to stop, it takes no more pieces and writes those already
/// queued (a flush among them is answered), then ends.
pub(super) async fn run_appender<S: Store>(coordinator: Coordinator<S>, mut stop: StopSignal) {
    let inner = &coordinator.inner;
    let Some(mut appended) = inner.output.appended.lock().expect("appender lock").take() else {
        return;
    };
    loop {
        let first = if stop.given() {
            // Closed: what comes now is dropped, and a flush no longer waits.
            appended.close();
            appended.recv().await
        } else {
            tokio::select! {
                biased;
                () = stop.wait() => continue,
                first = appended.recv() => first,
            }
        };
        // Every piece queued before the stop is written.
        let Some(first) = first else {
            return;
        };
        let mut batch = Vec::new();
        let mut flushes = Vec::new();
        let mut next = Some(first);
        // What piled up, up to a flush (which waits for what came before it) or the limit.
        while let Some(item) = next.take() {
            match item {
                ToAppend::Piece(run_id, piece) => batch.push((run_id, piece)),
                ToAppend::Flush(done) => {
                    flushes.push(done);
                    break;
                }
            }
            if batch.len() < APPEND_BATCH {
                next = appended.try_recv().ok();
            }
        }
        if !batch.is_empty() {
            if let Err(error) = inner.store.append_output(batch.clone()).await {
                // Live output is for watchers; the step's result does not depend on it.
                tracing::warn!(%error, "live output lost: cannot write it to the store");
            }
            inner.output.written(&batch);
        }
        for done in flushes {
            let _ = done.send(());
        }
    }
}

/// Reads the output of the runs watched here and hands it to their watchers
/// ([`Coordinator::run`]), until `run` is asked to stop; a read under way finishes first.
pub(super) async fn run_reader<S: Store>(coordinator: Coordinator<S>, mut stop: StopSignal) {
    let inner = &coordinator.inner;
    while !stop.given() {
        let to_read = inner.output.to_read();
        if to_read.is_empty() {
            let woken = inner.output.wake.notified();
            tokio::select! {
                biased;
                () = stop.wait() => return,
                _ = tokio::time::timeout(Duration::from_secs(1), woken) => continue,
            }
        }
        match inner.store.wait_output(to_read, READ_BLOCK).await {
            Ok(pieces) => inner.output.deliver(pieces),
            Err(error) => {
                tracing::warn!(%error, "cannot read live output; trying again");
                tokio::select! {
                    biased;
                    () = stop.wait() => return,
                    () = tokio::time::sleep(READ_BLOCK) => {}
                }
            }
        }
    }
}
