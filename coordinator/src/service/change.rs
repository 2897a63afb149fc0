//! The one path of every change to a run: lock the run, let the engine compute the transition,
//! [`plan`] its store write, write it in one atomic call checked against the run's version, and
//! only then act on it: hand tasks to the hub, tell watchers, write spans.

use std::time::{Duration, Instant};

use baton_core::workflow::StepType;
use baton_core::{Action, EngineError, Event, Transition};

use super::leases::HeldChange;
use super::plan::{Answering, Applied, plan};
use super::runs::{Loaded, LoadedGuard, Slot};
use super::stats::add_elapsed;
use super::watch::RunEvent;
use super::{Coordinator, Error};
use crate::decisions::Embedded;
use crate::hub::Assignment;
use crate::jq_runs::{Computed, Evaluation, Live, Running};
use crate::model::{LoggedEvent, StoredEvent};
use crate::record::RunRecord;
use crate::store::{self, Runs, Store, TransitionWrite};
use crate::task_ref::TaskRef;
use crate::traces;

/// How long an answer waits for an unreachable store (Redis restarting) before its task is put
/// back in the queue.
pub(super) const STORE_PATIENCE: Duration = Duration::from_secs(30);

/// One event for [`Coordinator::apply_changes`], logged as `stored`, and the answer it records
/// (with the vectors of the decisions it reports).
#[derive(Clone, Copy)]
pub(super) struct Change<'a> {
    pub event: &'a Event,
    pub stored: &'a StoredEvent,
    pub answering: Option<Answering<'a>>,
    pub embedded: Option<&'a Embedded>,
    /// A task entry (key, attempt) the write applies only while current, besides an answer's.
    pub fence: Option<(&'a str, u32)>,
}

impl<S: Store> Coordinator<S> {
    /// Applies one event to a run: engine, store, then effects. Returns the run record when
    /// `want_record` (built before a finished run leaves memory).
    pub(super) async fn apply(
        &self,
        run_id: &str,
        event: Event,
        answering: Option<Answering<'_>>,
        want_record: bool,
        embedded: Option<&Embedded>,
    ) -> Result<Option<RunRecord>, Error> {
        let worker_id = answering.map_or("", |answering| answering.worker_id);
        let stored = StoredEvent::of(&event, worker_id).expect("only a halt is never logged");
        self.apply_logged(run_id, event, stored, answering, want_record, embedded)
            .await
    }

    /// A turn of the run's computation ([`Event::Continue`]), written only while the run's
    /// continuation timer is at `fence`'s attempt (this coordinator holds it).
    pub(super) async fn apply_turn(&self, run_id: &str, fence: (&str, u32)) -> Result<(), Error> {
        let change = Change {
            event: &Event::Continue,
            stored: &StoredEvent::Continue,
            answering: None,
            embedded: None,
            fence: Some(fence),
        };
        let (mut outcomes, _) = self.apply_changes(run_id, &[change], false).await?;
        outcomes.pop().expect("one outcome per change")
    }

    /// [`Coordinator::apply`] of an event logged as `stored`.
    pub(super) async fn apply_logged(
        &self,
        run_id: &str,
        event: Event,
        stored: StoredEvent,
        answering: Option<Answering<'_>>,
        want_record: bool,
        embedded: Option<&Embedded>,
    ) -> Result<Option<RunRecord>, Error> {
        let change = Change {
            event: &event,
            stored: &stored,
            answering,
            embedded,
            fence: None,
        };
        let (mut outcomes, record) = self.apply_changes(run_id, &[change], want_record).await?;
        outcomes.pop().expect("one outcome per change")?;
        Ok(record)
    }

    /// Applies changes to a run in order, in one transition: one store write for all of them
    /// (answers that arrived together, [`super::group_commit`]). Each change's outcome is the
    /// engine's refusal of its event, if it refused it; the others are written. An error is
    /// the write's, for every change: nothing was written (or, `Unavailable`, perhaps all).
    pub(super) async fn apply_changes(
        &self,
        run_id: &str,
        changes: &[Change<'_>],
        want_record: bool,
    ) -> Result<(Vec<Result<(), Error>>, Option<RunRecord>), Error> {
        // A conflict means another coordinator moved the run on: reload it and try again.
        let mut conflicts = 0;
        let mut stale_refusals = 0;
        loop {
            let (slot, mut guard) = self.locked(run_id).await?;
            let loaded = guard.as_mut().expect("locked loads the run");
            let version = loaded.version;
            let history_before = loaded.run.history().len();
            // A cancel, or this coordinator shutting down, stops a jq program the engine runs
            // here rather than waiting for it; the transition is then dropped, unwritten.
            let running = self.inner.aborts.begin(run_id);
            let computed = self
                .compute_changes(run_id, loaded, changes, &running, stale_refusals < 2)
                .await;
            let batch = match computed {
                Ok(Some(batch)) => batch,
                // Refused on a copy of the run the store has moved past: reload it and compute
                // again.
                Ok(None) => {
                    stale_refusals += 1;
                    *guard = None;
                    continue;
                }
                Err(stopped) => {
                    *guard = None;
                    return Err(stopped);
                }
            };
            // Under way until written: a read meanwhile does not wait for the write either.
            let Some(write) = batch.write else {
                // Every event was refused: nothing to write.
                return Ok((batch.outcomes, None));
            };
            // A write whose answer is lost is settled (done, or never to be) before this goes on.
            let written = self.apply_settled(run_id, version, write).await;
            let started = add_elapsed(&self.inner.counters.profile.store_us, batch.started);
            match written {
                Ok(version) => {
                    self.inner.counters.transition_written();
                    loaded.version = version;
                }
                Err(Error::Store(store::Error::Conflict { .. })) if conflicts < 3 => {
                    conflicts += 1;
                    *guard = None;
                    continue;
                }
                // Whatever else failed, the cached run may be behind the store now (a write that
                // timed out, or one short of its replicas, may have landed), and this copy has
                // taken on the changes: the next call reloads it rather than acting on a guess.
                Err(other) => {
                    *guard = None;
                    return Err(other);
                }
            }
            let written = Written {
                actions: batch.actions,
                held: batch.held,
                history_before,
                started,
            };
            let record = self
                .act_on_written(run_id, (slot, guard), written, changes, want_record)
                .await;
            return Ok((batch.outcomes, record));
        }
    }

    /// The engine's transitions for `changes`, each planned on the run as the one before left
    /// it and taken on by `loaded` before the write. A refusal made on a copy of the run the
    /// store has moved past is given back (when `may_reload`) as `None`, to be made again on a
    /// fresh one.
    async fn compute_changes(
        &self,
        run_id: &str,
        loaded: &mut Loaded,
        changes: &[Change<'_>],
        running: &Running<'_>,
        may_reload: bool,
    ) -> Result<Option<Batch>, Error> {
        let profile = &self.inner.counters.profile;
        let now = self.now_ms();
        let mut batch = Batch {
            outcomes: Vec::with_capacity(changes.len()),
            write: None,
            actions: Vec::new(),
            held: Vec::new(),
            started: std::time::Instant::now(),
        };
        for change in changes {
            let live = Live::enter(
                self.inner.config.jq_run_cpu,
                loaded.jq_cpu,
                running.abort().clone(),
            );
            let applied = loaded.run.apply_at(change.event.clone(), now);
            let computed = live.finish();
            if computed.stopped {
                return Err(Error::ComputationStopped {
                    run_id: run_id.to_owned(),
                });
            }
            let transition = match applied {
                Ok(transition) => transition,
                Err(error) => {
                    // A refusal is only as good as the copy of the run it was made on: if
                    // the store has moved on (another coordinator's transition, or a copy
                    // loaded while this one's write was landing), the event may apply to
                    // the run as it is now. An approval decided right after it was
                    // requested was refused as "not waiting" by a copy from before the
                    // request. A store that cannot say leaves the refusal as it is.
                    let moved_on = matches!(
                        self.inner.store.version(run_id).await,
                        Ok(stored) if stored != Some(loaded.version)
                    );
                    if may_reload && moved_on {
                        return Ok(None);
                    }
                    batch
                        .outcomes
                        .push(Err(refused(run_id, error, change.answering)));
                    continue;
                }
            };
            batch.started = add_elapsed(&profile.engine_us, batch.started);
            self.take_on_change(loaded, change, transition, computed, now, &mut batch);
            batch.outcomes.push(Ok(()));
            batch.started = add_elapsed(&profile.plan_us, batch.started);
        }
        Ok(Some(batch))
    }

    /// Plans one change's transition, takes it on (so that the next change is planned on it; a
    /// write that fails drops this copy of the run) and adds it to the batch's write.
    fn take_on_change(
        &self,
        loaded: &mut Loaded,
        change: &Change<'_>,
        transition: Transition,
        computed: Computed,
        now: i64,
        batch: &mut Batch,
    ) {
        let Computed {
            evaluations: computed,
            went_on,
            ..
        } = computed;
        let logged = LoggedEvent {
            jq: computed.iter().map(Evaluation::record).collect(),
            went_on,
            ..LoggedEvent::new(now, change.stored.clone())
        };
        let applied = Applied {
            event: Some(&logged),
            answering: change.answering,
            transition: &transition,
            history_before: loaded.run.history().len(),
            now_ms: now,
            embedded: change.embedded,
            computed: &computed,
            fence: change.fence,
        };
        let planned = plan(loaded, &applied, &self.holder());
        batch.held.push(self.held_change(&planned));
        let Transition { run, actions } = transition;
        let next = loaded.take_on(run, planned);
        let jq_cpu = computed.iter().map(|c| c.cpu).sum::<Duration>();
        loaded.jq_cpu += jq_cpu;
        if !jq_cpu.is_zero() {
            self.inner.metrics.jq_ran(jq_cpu);
        }
        match &mut batch.write {
            Some(write) => write.then(next),
            None => batch.write = Some(next),
        }
        batch.actions.extend(actions);
    }

    /// After the write: the actions carried out, the leases noted, the record built (when
    /// wanted) before a finished run leaves memory, and the tasks handed out once the run's
    /// lock is let go.
    async fn act_on_written(
        &self,
        run_id: &str,
        (slot, mut guard): (Slot, LoadedGuard),
        written: Written,
        changes: &[Change<'_>],
        want_record: bool,
    ) -> Option<RunRecord> {
        let loaded = guard.as_mut().expect("locked loads the run");
        let assignments = self.act(run_id, loaded, &written.actions, written.history_before);
        for held in written.held {
            self.note_held(run_id, held);
        }
        add_elapsed(&self.inner.counters.profile.act_us, written.started);
        let record = want_record.then(|| self.record_of(loaded));
        let finished = loaded.run.status().is_terminal();
        drop(guard);
        if finished {
            self.inner.runs.evict(run_id);
        } else if changes
            .iter()
            .any(|change| matches!(change.event, Event::Redrive))
        {
            // A finished run is not kept in memory; a retried one runs again here.
            self.inner.runs.insert(run_id, slot.clone());
        }
        self.assigned(assignments).await;
        record
    }

    /// Carries out stored transitions (their actions, in order, and the steps they settled since
    /// `history_before`): tasks to the hub, events to watchers, spans of the
    /// steps that settled without an agent.
    pub(super) fn act(
        &self,
        run_id: &str,
        loaded: &mut Loaded,
        actions: &[Action],
        history_before: usize,
    ) -> Vec<Assignment> {
        let settled = std::mem::take(&mut loaded.settled);
        let mut items_moved = false;
        let added = loaded.run.history_since(history_before);
        for (n, record) in added.iter().enumerate() {
            self.inner
                .metrics
                .step_settled(record.step_type.as_str(), record.status.as_str());
            if record.item.is_some() {
                items_moved = true;
            } else {
                self.notify(run_id, || {
                    RunEvent::step_finished(loaded, record, history_before + n)
                });
            }
            // An agent step's spans are its attempts', written as their answers come.
            if self.inner.traces.enabled()
                && record.step_type != StepType::Agent
                && let Some(timing) = settled.get(n)
            {
                self.trace_settled(loaded, record, *timing);
            }
        }
        if items_moved
            || actions
                .iter()
                .any(|action| matches!(action, Action::Dispatch(task) if task.task.item.is_some()))
        {
            self.tell_map_progress(run_id, &loaded.run);
        }
        let mut assignments = Vec::new();
        for action in actions {
            match action {
                Action::Dispatch(task) => assignments.extend(self.hand_out(loaded, task)),
                Action::AwaitApproval {
                    step_id,
                    visit,
                    message,
                    ..
                } => self.notify(run_id, || {
                    RunEvent::approval_requested(step_id, *visit, message)
                }),
                Action::Abandon(task) => assignments.extend(self.abandon(run_id, task)),
                Action::Continue { .. } => self.continue_later(run_id, loaded.jq_cpu),
                Action::Finished { status, .. } => {
                    let trace_id = traces::trace_id_of(&loaded.header.traceparent);
                    tracing::info!(run_id, status = %status, %trace_id, "run finished");
                    self.inner.metrics.run_finished(status.as_str());
                    self.notify(run_id, || RunEvent::finished(self.record_of(loaded)));
                    self.inner.watchers.close(run_id);
                }
            }
        }
        assignments
    }
}

impl<S: Store> Coordinator<S> {
    /// Tells watchers how the run's maps stand, about every half percent of their items (and
    /// at their start), so that a map of 100,000 items is not 100,000 events per watcher.
    fn tell_map_progress(&self, run_id: &str, run: &baton_core::Run) {
        for progress in run.map_progress() {
            let settled = progress.succeeded + progress.failed;
            let every = (progress.count / 200).max(1);
            if settled % every == 0 {
                self.notify(run_id, || RunEvent::MapProgress(progress.clone()));
            }
        }
    }
}

/// A batch of changes computed, before its write.
struct Batch {
    outcomes: Vec<Result<(), Error>>,
    /// `None` when the engine refused every change.
    write: Option<TransitionWrite>,
    actions: Vec<Action>,
    held: Vec<HeldChange>,
    /// Where the profile's clock stands.
    started: Instant,
}

/// A batch written, to act on.
struct Written {
    actions: Vec<Action>,
    held: Vec<HeldChange>,
    history_before: usize,
    started: Instant,
}

/// Why the engine refused an event, as the coordinator reports it.
fn refused(run_id: &str, error: EngineError, answering: Option<Answering<'_>>) -> Error {
    match error {
        EngineError::NotRunning(status) => Error::RunFinished {
            run_id: run_id.to_owned(),
            status,
        },
        EngineError::NotAwaitingApproval(step_id) => Error::NotAwaitingApproval {
            run_id: run_id.to_owned(),
            step_id,
        },
        EngineError::NotFailed(status) => Error::NotRetryable {
            run_id: run_id.to_owned(),
            why: format!("it has {status}; only a failed run can be retried"),
        },
        EngineError::NothingToRedrive(error) => Error::NotRetryable {
            run_id: run_id.to_owned(),
            why: format!("it did not fail at a step ({error})"),
        },
        EngineError::NotContinuing => Error::NotContinuing {
            run_id: run_id.to_owned(),
        },
        EngineError::UnknownTask(task) => Error::TaskNotHeld {
            worker_id: answering
                .map(|answering| answering.worker_id.to_owned())
                .unwrap_or_default(),
            task_id: TaskRef::new(run_id, &task, answering.map_or(0, |a| a.attempt)).to_string(),
        },
    }
}
