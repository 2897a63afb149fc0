//! Watching a run: its events, built here, told to watchers as they happen, and caught up from
//! the store when another coordinator is the one moving the run on; told in the same order
//! wherever the watcher is connected ([`order`]).

mod order;

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_core::workflow::StepType;
use baton_core::{AgentName, StepRecord, StepStatus, Waiting, WorkerId};
use futures::Stream;
use serde_json::Value;
use tokio::sync::broadcast::{self, error::RecvError};

use self::order::{Sequence, agent_steps};
use super::output::{Delivery, OutputReceiver};
use super::runs::Loaded;
use super::{Coordinator, Error};
use crate::clock::Instant;
use crate::model::{TaskEntry, TaskState};
use crate::parts::Part;
use crate::record::RunRecord;
use crate::store::{LiveOutput, OutputOffset, OutputPiece, Store, Tasks};
use crate::task_ref::parse_task_key;

/// Something a watcher of a run is told.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEvent {
    /// A worker took an agent step.
    StepStarted {
        step_id: String,
        visit: u32,
        agent: AgentName,
        /// `None` while no worker has it (it waits in a queue).
        worker_id: Option<WorkerId>,
        /// Which delivery of the visit this is (not told to clients): a later one is told
        /// started again.
        attempt: u32,
    },
    /// A step visit settled.
    StepFinished {
        step_id: String,
        visit: u32,
        status: baton_core::StepStatus,
        data: Option<Arc<Value>>,
        /// `data` as its payload part, when the run's encoder holds it (a new result always):
        /// every watcher is sent those bytes, encoded and hashed once.
        encoded: Option<Arc<Part>>,
        error: String,
        /// Where routing went next, empty for none (a branch, or the end).
        next: String,
        /// The parallel step it is a branch of, empty for none.
        parent: String,
        /// Where it is in the run's history (not told to clients): a watch that catches up
        /// from the store starts after the last visit it told.
        position: usize,
        /// For an agent step's visit, the attempt whose answer settled it and its worker (not
        /// told to clients): a watcher never told the visit started is told so first.
        answered_by: Option<(u32, WorkerId)>,
    },
    /// How a map step's items stand; told as they settle (at most about 200 times per map
    /// visit), never one event per item.
    MapProgress(baton_core::MapProgress),
    /// An approval step waits for a decision.
    ApprovalRequested {
        step_id: String,
        visit: u32,
        message: String,
    },
    /// The run ended; its final record.
    RunFinished(Box<RunRecord>),
    /// A piece of a running step's live output, at `offset` in the run's output.
    StepOutput {
        step_id: String,
        visit: u32,
        attempt: u32,
        text: String,
        /// What this attempt streamed before is void: `text` starts its output again.
        restart: bool,
        offset: OutputOffset,
        /// The worker that streamed it (not told to clients): a watcher not yet told the step
        /// started is told so, naming it.
        worker_id: Option<WorkerId>,
    },
    /// This watcher fell behind the live output and missed this many pieces of it.
    OutputMissed { pieces: u64 },
}

impl RunEvent {
    pub(super) fn step_finished(loaded: &Loaded, record: &StepRecord, position: usize) -> Self {
        // The visit's last attempt, from the step's attempt log: a redriven record is no run.
        let answered_by = (record.step_type == StepType::Agent
            && record.item.is_none()
            && record.status != StepStatus::Redriven)
            .then(|| loaded.steps.get(record.step_id.as_ref()))
            .flatten()
            .and_then(|step| {
                let mut log = step.attempt_log.iter().rev();
                let attempt = log.find(|a| a.visit == record.visit)?;
                Some((attempt.attempt, attempt.worker_id.clone()?))
            });
        RunEvent::StepFinished {
            position,
            answered_by,
            step_id: record.step_id.to_string(),
            visit: record.visit,
            status: record.status,
            data: record.data.clone(),
            encoded: record
                .data
                .as_ref()
                .and_then(|data| loaded.parts.cached(data)),
            error: record.error.as_deref().unwrap_or_default().to_owned(),
            next: record.next.as_deref().unwrap_or_default().to_owned(),
            parent: record.parent.as_deref().unwrap_or_default().to_owned(),
        }
    }

    pub(super) fn step_started(step_id: &str, visit: u32, entry: &TaskEntry) -> Self {
        RunEvent::StepStarted {
            step_id: step_id.to_owned(),
            visit,
            agent: entry.agent.clone(),
            worker_id: entry.worker_id.clone(),
            attempt: entry.attempt,
        }
    }

    pub(super) fn approval_requested(step_id: &str, visit: u32, message: &str) -> Self {
        RunEvent::ApprovalRequested {
            step_id: step_id.to_owned(),
            visit,
            message: message.to_owned(),
        }
    }

    pub(super) fn finished(record: RunRecord) -> Self {
        RunEvent::RunFinished(Box::new(record))
    }

    fn output(offset: OutputOffset, piece: OutputPiece) -> Self {
        RunEvent::StepOutput {
            step_id: piece.step_id,
            visit: piece.visit,
            attempt: piece.attempt,
            text: piece.text,
            restart: piece.restart,
            offset,
            worker_id: piece.worker_id,
        }
    }
}

/// A run's events: what happened so far, then the rest as it happens, until the run ends.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<RunEvent, Error>> + Send>>;

/// How long a watch waits for this coordinator's own events before it asks the store whether
/// another coordinator moved the run on.
const CATCH_UP_EVERY: Duration = Duration::from_secs(1);

/// How many of this coordinator's events a watcher may fall behind before it reads what it
/// missed from the store instead. Each watched run's channel holds this many slots from its first
/// watcher on: 1,024 was about 160 KB per watched run (1.6 GB for 10,000 of them), whose
/// allocation and release were 3–4% of a coordinator's profile when every run is watched (W3).
const WATCH_BACKLOG: usize = 64;

/// The watchers of each run, by the channel their events go out on.
#[derive(Default)]
pub(super) struct Watchers {
    channels: Mutex<HashMap<String, broadcast::Sender<RunEvent>>>,
    /// Watches open now, of any run ([`WatchPermit`]s).
    open: Arc<AtomicUsize>,
}

/// One open watch, counted against `max_watchers` until it is dropped with its stream.
struct WatchPermit(Arc<AtomicUsize>);

impl Drop for WatchPermit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Watchers {
    /// A permit for one more watch, unless `limit` are open.
    fn permit(&self, limit: usize) -> Result<WatchPermit, Error> {
        self.open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |open| {
                (open < limit).then_some(open + 1)
            })
            .map_err(|_| Error::TooManyWatchers { limit })?;
        Ok(WatchPermit(self.open.clone()))
    }

    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, broadcast::Sender<RunEvent>>> {
        self.channels.lock().expect("watchers lock")
    }

    fn subscribe(&self, run_id: &str) -> broadcast::Receiver<RunEvent> {
        self.channels()
            .entry(run_id.to_owned())
            .or_insert_with(|| broadcast::channel(WATCH_BACKLOG).0)
            .subscribe()
    }

    /// Whether anyone watches the run: its events are built only then.
    fn sender(&self, run_id: &str) -> Option<broadcast::Sender<RunEvent>> {
        self.channels().get(run_id).cloned()
    }

    /// The run ended: its watchers hear nothing more from here.
    pub fn close(&self, run_id: &str) {
        self.channels().remove(run_id);
    }
}

impl<S: Store> Coordinator<S> {
    /// Tells the run's watchers an event, built only if someone watches.
    pub(super) fn notify(&self, run_id: &str, event: impl FnOnce() -> RunEvent) {
        if let Some(sender) = self.inner.watchers.sender(run_id) {
            let _ = sender.send(event());
        }
    }

    /// What has happened so far, then this coordinator's events as they come, and, whenever
    /// it hears nothing for a second, what the store says happened meanwhile (another
    /// coordinator may be the one moving the run on). Each settled step visit and each
    /// approval request is told once; the stream ends with the run. Live output comes
    /// in between: first what the steps still running have streamed so far, then as it comes,
    /// each piece after its step's start ([`order`]).
    pub async fn watch(&self, run_id: &str) -> Result<EventStream, Error> {
        let permit = self.inner.watchers.permit(self.inner.config.max_watchers)?;
        // Subscribed to before anything is read, so no piece slips between what is read and
        // what comes; what comes twice is dropped by offset.
        let live = self.inner.output.subscribe(run_id);
        // Subscribing under the run's lock: no event can slip between the past and the rest.
        let (past, receiver, settled, agents) = self
            .read_fresh(run_id, |loaded| {
                let past = self.run_events(loaded, 0);
                let receiver = (!loaded.run.status().is_terminal())
                    .then(|| self.inner.watchers.subscribe(run_id));
                let settled: HashSet<(String, u32)> = loaded
                    .run
                    .history()
                    .iter()
                    .map(|record| (record.step_id.to_string(), record.visit))
                    .collect();
                (past, receiver, settled, agent_steps(loaded.run.workflow()))
            })
            .await?;
        let mut sequence = Sequence::new(agents);
        for event in past {
            sequence.push(event);
        }
        let mut output_after = OutputOffset::default();
        let output_mark = self.inner.output.stored_mark(run_id, 0);
        let live = match receiver {
            None => None,
            Some(_) => {
                let streamed = match self.inner.store.read_output(run_id, None).await {
                    Ok(streamed) => streamed,
                    Err(error) => {
                        tracing::warn!(run_id, %error, "cannot read the live output so far");
                        Vec::new()
                    }
                };
                if let Some((last, _)) = streamed.last() {
                    output_after = *last;
                }
                // Only what the steps still running streamed: the others have their result.
                for (offset, piece) in streamed {
                    if !settled.contains(&(piece.step_id.clone(), piece.visit)) {
                        sequence.push(RunEvent::output(offset, piece));
                    }
                }
                self.inner.output.follow_after(run_id, output_after);
                Some(live)
            }
        };
        let watch = Watch {
            coordinator: self.clone(),
            run_id: run_id.to_owned(),
            sequence,
            failed: false,
            receiver,
            live,
            output_after,
            output_mark,
            catch_up_at: Instant::now() + CATCH_UP_EVERY,
            _permit: permit,
        };
        Ok(Box::pin(futures::stream::unfold(watch, Watch::next)))
    }

    /// What a watcher has not been told of a run that another coordinator may have moved on,
    /// read from the store: the step visits settled after those `sequence` told, the steps
    /// running, the approvals awaited, and the end.
    async fn catch_up(&self, run_id: &str, sequence: &Sequence) -> Result<Vec<RunEvent>, Error> {
        let me = &self.inner.config.coordinator_id;
        let (mut events, unknown) = self
            .read_fresh(run_id, |loaded| {
                // Steps in flight whose worker this copy does not know, and the watcher was not
                // told: the coordinator handing them out writes its workers down in the store at
                // its lease renewals, which change no version (this copy is not reloaded).
                let unknown: Vec<String> = loaded
                    .tasks
                    .iter()
                    .filter(|(_, entry)| {
                        matches!(entry.state, TaskState::Queued | TaskState::Running)
                            && entry.worker_id.is_none()
                            && entry.owner.as_ref() != Some(me)
                    })
                    .filter(|(key, _)| {
                        parse_task_key(key).is_some_and(|task| {
                            task.item.is_none() && !sequence.told_started(&task.step_id, task.visit)
                        })
                    })
                    .map(|(key, _)| key.clone())
                    .collect();
                (self.run_events(loaded, sequence.settled()), unknown)
            })
            .await?;
        // After what settled and what runs, before approvals and the end.
        let mut at = events
            .iter()
            .position(|event| {
                !matches!(
                    event,
                    RunEvent::StepFinished { .. } | RunEvent::StepStarted { .. }
                )
            })
            .unwrap_or(events.len());
        for key in unknown {
            let stored = self.inner.store.task(run_id, &key).await?;
            let Some(entry) =
                stored.and_then(|bytes| serde_json::from_slice::<TaskEntry>(&bytes).ok())
            else {
                continue;
            };
            if let Some(task) = parse_task_key(&key)
                && entry.state == TaskState::Running
                && entry.worker_id.is_some()
            {
                events.insert(
                    at,
                    RunEvent::step_started(&task.step_id, task.visit, &entry),
                );
                at += 1;
            }
        }
        Ok(events)
    }

    /// A run's state as watch events: the step visits settled after the first `settled`, the
    /// steps a worker runs now, the approvals awaited, and the end if it is over.
    fn run_events(&self, loaded: &Loaded, settled: usize) -> Vec<RunEvent> {
        // A map's items are told as its progress, below, not one by one.
        let mut events: Vec<RunEvent> = loaded
            .run
            .history_since(settled)
            .iter()
            .enumerate()
            .filter(|(_, record)| record.item.is_none())
            .map(|(n, record)| RunEvent::step_finished(loaded, record, settled + n))
            .collect();
        for (key, entry) in &loaded.tasks {
            if entry.state == TaskState::Running
                && entry.worker_id.is_some()
                && let Some(task) = parse_task_key(key).filter(|task| task.item.is_none())
            {
                events.push(RunEvent::step_started(&task.step_id, task.visit, entry));
            }
        }
        events.extend(
            loaded
                .run
                .map_progress()
                .into_iter()
                .map(RunEvent::MapProgress),
        );
        for waiting in loaded.run.waiting() {
            if let Waiting::Approval { step_id, message } = waiting {
                let visit = loaded.run.visits(&step_id);
                events.push(RunEvent::approval_requested(&step_id, visit, &message));
            }
        }
        if loaded.run.status().is_terminal() {
            events.push(RunEvent::finished(self.record_of(loaded)));
        }
        events
    }
}

/// What one watch has told and what it still has to.
struct Watch<S: Store> {
    coordinator: Coordinator<S>,
    run_id: String,
    /// What was told, what is held back, what to tell next.
    sequence: Sequence,
    /// A catch-up failed that the watch cannot go on without: it ends.
    failed: bool,
    receiver: Option<broadcast::Receiver<RunEvent>>,
    /// The run's live output as it comes, while the run runs.
    live: Option<OutputReceiver>,
    /// The last piece of live output taken in: anything up to it is not taken again.
    output_after: OutputOffset,
    /// What this watch last read from the store covers of the pieces queued on this
    /// coordinator (an [`OutputFeed::stored_mark`](super::output::OutputFeed::stored_mark)).
    output_mark: u64,
    /// When the next catch-up from the store is due: a second after this watch last heard a
    /// run event (not output), or its last catch-up.
    catch_up_at: Instant,
    _permit: WatchPermit,
}

/// Whether `event` settles a step or ends the run: the step's output is told before it.
fn ends_a_step(event: &RunEvent) -> bool {
    matches!(
        event,
        RunEvent::StepFinished { .. } | RunEvent::RunFinished(_)
    )
}

/// What a watch heard while it waited.
enum Heard {
    Event(Result<RunEvent, RecvError>),
    Output(Option<(u64, Arc<Delivery>)>),
    Nothing,
}

impl<S: Store> Watch<S> {
    /// The next event to tell, waiting for it if need be; `None` once the run has ended.
    async fn next(mut self) -> Option<(Result<RunEvent, Error>, Self)> {
        loop {
            if let Some(event) = self.sequence.pop() {
                return Some((Ok(event), self));
            }
            if self.sequence.done() || self.failed {
                return None;
            }
            // Output waits for its step's start: what came before it is read now, not after
            // a second of silence.
            if self.sequence.wants_catch_up() {
                if let Err(error) = self.catch_up().await {
                    tracing::debug!(run_id = %self.run_id, %error, "watch cannot catch up yet");
                }
                continue;
            }
            match self.hear().await {
                Heard::Event(Ok(event)) => {
                    self.catch_up_at = Instant::now() + CATCH_UP_EVERY;
                    if self.may_have_unread_output(&event) {
                        self.drain_output().await;
                    }
                    self.sequence.push(event);
                }
                // Fell more than the backlog behind (a batch of 256 answers is as many events at
                // once): what it missed is in the store, and the events still in the channel
                // that repeat it are dropped as told.
                Heard::Event(Err(RecvError::Lagged(_))) => {
                    if let Err(error) = self.catch_up().await {
                        self.failed = true;
                        return Some((Err(error), self));
                    }
                }
                // Closed: this coordinator will tell nothing more; the store still can.
                Heard::Event(Err(RecvError::Closed)) => self.receiver = None,
                Heard::Output(Some((missed, delivery))) => {
                    // Fell behind the output: told, and it goes on with what comes next.
                    if missed > 0 {
                        self.sequence
                            .push(RunEvent::OutputMissed { pieces: missed });
                    }
                    for (offset, piece) in &delivery.pieces {
                        if *offset > self.output_after {
                            self.output_after = *offset;
                            self.sequence.push(RunEvent::output(*offset, piece.clone()));
                        }
                    }
                }
                Heard::Output(None) => self.live = None,
                // Nothing heard for a while: ask the store.
                Heard::Nothing => {
                    if let Err(error) = self.catch_up().await {
                        tracing::debug!(run_id = %self.run_id, %error, "watch cannot catch up yet")
                    }
                }
            }
        }
    }

    /// Takes in what the store says happened that this watch was not told, with the output
    /// written before the steps that settled; then the output held for a catch-up begun after
    /// it came is told. A catch-up that fails is tried again a second later.
    async fn catch_up(&mut self) -> Result<(), Error> {
        self.catch_up_at = Instant::now() + CATCH_UP_EVERY;
        self.sequence.catching_up();
        let events = self
            .coordinator
            .catch_up(&self.run_id, &self.sequence)
            .await?;
        if events.iter().any(ends_a_step) {
            self.drain_output().await;
        }
        for event in events {
            self.sequence.push(event);
        }
        self.sequence.caught_up();
        Ok(())
    }

    /// Whether, before telling `event`, heard from this coordinator, the store must be read for
    /// output that may not have reached this watch yet: before the run's end, always; before a
    /// step's end, only if pieces of the run were queued here since the last read (the step's
    /// answer was recorded here, so its output came through here). Most steps stream nothing,
    /// and they cost no read.
    fn may_have_unread_output(&self, event: &RunEvent) -> bool {
        match event {
            RunEvent::RunFinished(_) => true,
            RunEvent::StepFinished { .. } => self
                .coordinator
                .inner
                .output
                .queued_since(&self.run_id, self.output_mark),
            _ => false,
        }
    }

    /// Takes in the output in the store that this watch has not taken yet: before a step's
    /// end, its output (written before its answer was recorded) may still be on its way here.
    async fn drain_output(&mut self) {
        if self.live.is_none() {
            return;
        }
        let inner = &self.coordinator.inner;
        let mark = inner.output.stored_mark(&self.run_id, self.output_mark);
        match inner
            .store
            .read_output(&self.run_id, Some(self.output_after))
            .await
        {
            Ok(pieces) => {
                self.output_mark = mark;
                for (offset, piece) in pieces {
                    self.output_after = self.output_after.max(offset);
                    self.sequence.push(RunEvent::output(offset, piece));
                }
            }
            Err(error) => {
                tracing::debug!(run_id = %self.run_id, %error, "cannot read the last of the output")
            }
        }
    }

    /// Waits for a run event, a piece of output, or the time to catch up.
    async fn hear(&mut self) -> Heard {
        let catch_up = tokio::time::sleep_until(self.catch_up_at);
        let event = async {
            match self.receiver.as_mut() {
                Some(receiver) => receiver.recv().await,
                None => std::future::pending().await,
            }
        };
        let output = async {
            match self.live.as_mut() {
                Some(live) => live.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // Events first: a step's end goes out before more of its output.
            biased;
            event = event => Heard::Event(event),
            output = output => Heard::Output(output),
            _ = catch_up => Heard::Nothing,
        }
    }
}
