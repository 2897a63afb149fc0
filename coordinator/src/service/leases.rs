//! Leases, retries, timeouts, and the timers that drive them ([`crate::lease`] has the rules).
//!
//! Every task in flight has an entry in the store with a timer. The coordinator that holds a
//! task renews its lease every third of [`Config::lease_ms`]; every coordinator sweeps the timer
//! sets of the agents its workers serve every [`Config::sweep_interval_ms`] and claims what is
//! due: retries whose backoff is over, tasks nobody holds, and tasks whose holder stopped
//! renewing (it died). Every write of a lease is a compare-and-swap of the stored entry, so two
//! coordinators never both claim a task, and every new delivery raises the attempt, which fences
//! the answers of the old ones.

use std::sync::Weak;
use std::time::{Duration, Instant};

use super::*;
use crate::lease::{AfterFailure, Due};
use crate::store::{DueTask, TaskSwap};

/// How long an answer waits for an unreachable store (Redis restarting) before its task is put
/// back in the queue.
pub(super) const STORE_PATIENCE: Duration = Duration::from_secs(30);

/// The tasks a transition removed, and those it created for this coordinator.
pub(super) struct HeldChange {
    removed: Vec<String>,
    added: Vec<(String, TaskEntry)>,
}

/// How many approval timeouts one sweep takes on.
const APPROVAL_SWEEP: usize = 64;

/// The coordinator's clock: sweeps, timeouts, silent workers, renewals. Ends when the
/// coordinator is dropped or shuts down.
pub(super) async fn run_timers<S: Store>(inner: Weak<Inner<S>>) {
    let mut renewed = Instant::now();
    loop {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let coordinator = Coordinator { inner };
        let config = &coordinator.inner.config;
        if coordinator.inner.stopping.load(Ordering::SeqCst) {
            return;
        }
        let interval = Duration::from_millis(config.sweep_interval_ms.max(1));
        let renew_every = Duration::from_millis((config.lease_ms / 3).max(1));
        coordinator.check_silent_workers().await;
        coordinator.check_timeouts().await;
        if renewed.elapsed() >= renew_every {
            renewed = Instant::now();
            coordinator.renew_leases().await;
        }
        coordinator.sweep().await;
        // No strong handle across the sleep: dropping the last one stops the timers.
        drop(coordinator);
        tokio::time::sleep(interval).await;
    }
}

impl<S: Store> Coordinator<S> {
    /// Who takes the tasks a transition dispatches.
    pub(super) fn holder(&self) -> Holder<'_> {
        Holder {
            id: &self.inner.config.coordinator_id,
            lease_ms: self.inner.config.lease_ms,
            serves: Box::new(|agent| {
                !self.inner.stopping.load(Ordering::SeqCst) && self.inner.hub.serves(agent)
            }),
        }
    }

    /// What a written transition changes in the leases this coordinator holds: the tasks it
    /// removed are nobody's, the ones it created for this coordinator are held.
    pub(super) fn held_change(&self, planned: &Planned) -> HeldChange {
        let me = &self.inner.config.coordinator_id;
        HeldChange {
            removed: planned.write.tasks_removed.clone(),
            added: planned
                .tasks_set
                .iter()
                .filter(|(_, entry)| entry.owner == *me)
                .cloned()
                .collect(),
        }
    }

    /// Records a [`HeldChange`], once the transition's tasks are in the hub: a renewal in
    /// between would otherwise find a held task nowhere in the hub and give it up.
    pub(super) fn note_held(&self, run_id: &str, change: HeldChange) {
        let mut held = self.inner.held.lock().expect("held lock");
        for key in change.removed {
            held.remove(&(run_id.to_owned(), key));
        }
        for (key, entry) in change.added {
            held.insert((run_id.to_owned(), key), entry);
        }
    }

    pub(super) fn forget_held(&self, run_id: &str, task_key: &str) {
        self.inner
            .held
            .lock()
            .expect("held lock")
            .remove(&(run_id.to_owned(), task_key.to_owned()));
    }

    pub(super) fn held_entry(&self, run_id: &str, task_key: &str) -> Option<TaskEntry> {
        self.inner
            .held
            .lock()
            .expect("held lock")
            .get(&(run_id.to_owned(), task_key.to_owned()))
            .cloned()
    }

    /// Writes a lease change if the stored entry is still `expected`; records it as held when
    /// it names this coordinator.
    async fn swap(
        &self,
        run_id: &str,
        task_key: &str,
        expected: &TaskEntry,
        new: Option<&TaskEntry>,
    ) -> Result<bool, Error> {
        self.swap_bytes(run_id, task_key, expected.encode(), new)
            .await
    }

    async fn swap_bytes(
        &self,
        run_id: &str,
        task_key: &str,
        expected: Vec<u8>,
        new: Option<&TaskEntry>,
    ) -> Result<bool, Error> {
        let expected_copy = expected.clone();
        let swapped = self
            .inner
            .store
            .swap_tasks(vec![TaskSwap {
                run_id: run_id.to_owned(),
                task_key: task_key.to_owned(),
                expected,
                new: new.map(TaskEntry::encode),
            }])
            .await?;
        let swapped = swapped.first().copied().unwrap_or(false);
        let key = (run_id.to_owned(), task_key.to_owned());
        let mut held = self.inner.held.lock().expect("held lock");
        match new {
            Some(entry) if swapped && entry.owner == self.inner.config.coordinator_id => {
                held.insert(key, entry.clone());
            }
            _ if swapped => {
                held.remove(&key);
            }
            // Lost: what this coordinator believed it held (if it was this) is not so. A claim
            // that lost to another one of this coordinator's own leaves the winner's alone.
            _ => {
                if held.get(&key).map(TaskEntry::encode).as_ref() == Some(&expected_copy) {
                    held.remove(&key);
                }
            }
        }
        Ok(swapped)
    }

    /// The run's slot, reloaded if the store has moved on from this coordinator's copy.
    pub(super) async fn fresh_slot(
        &self,
        run_id: &str,
    ) -> Result<Arc<AsyncMutex<Option<Loaded>>>, Error> {
        let slot = self.slot(run_id).await?;
        let stored = self.inner.store.version(run_id).await?;
        {
            let mut guard = slot.lock().await;
            match guard.as_ref() {
                Some(loaded) if Some(loaded.version) == stored || loaded.finished_as.is_some() => {
                    return Ok(slot.clone());
                }
                _ => *guard = None,
            }
        }
        self.evict(run_id);
        self.slot(run_id).await
    }

    /// Shows a task's lease in this coordinator's copy of the run (GetRun, watchers).
    async fn show_task(&self, run_id: &str, task_key: &str, entry: &TaskEntry) {
        let Some(slot) = self.cached_slot(run_id) else {
            return;
        };
        let mut guard = slot.lock().await;
        let Some(loaded) = guard.as_mut() else {
            return;
        };
        if !loaded.tasks.contains_key(task_key) {
            return;
        }
        loaded.tasks.insert(task_key.to_owned(), entry.clone());
        if let Some((step_id, _)) = task_key.rsplit_once('#')
            && let Some(step) = loaded.steps.get_mut(step_id)
        {
            step.status = entry.state.clone();
            step.attempts = entry.attempt;
            step.error = entry.error.clone();
            if !entry.worker_id.is_empty() {
                step.worker_id = entry.worker_id.clone();
            }
        }
    }

    /// The retry policy of a run's step.
    async fn retry_policy(
        &self,
        run_id: &str,
        step_id: &str,
    ) -> Result<Option<baton_core::workflow::RetryPolicy>, Error> {
        let workflow = loop {
            let slot = self.slot(run_id).await?;
            let guard = slot.lock().await;
            // Emptied by a version conflict in between: load it again.
            if let Some(loaded) = guard.as_ref() {
                break loaded.run.workflow().clone();
            }
        };
        Ok(workflow
            .index_of(step_id)
            .and_then(|index| workflow.step(index).retry.clone()))
    }

    /// An attempt failed (the agent's error, a refused result, a timeout): it is retried after
    /// a backoff if the step's retry policy allows (the backoff is returned), and otherwise the
    /// step fails, fenced by the attempt.
    pub(super) async fn fail_attempt(
        &self,
        run_id: &str,
        task: &TaskId,
        attempt: u32,
        worker_id: &str,
        error: String,
        retryable: bool,
    ) -> Result<Option<u64>, Error> {
        let key = task_key(task);
        let policy = self.retry_policy(run_id, &task.step_id).await?;
        // Lease writes are one at a time: a renewal between reading the entry and swapping it
        // would make the swap miss.
        let leases = self.inner.lease_writes.lock().await;
        let entry = match self.held_entry(run_id, &key) {
            Some(entry) => Some(entry),
            // Not in this coordinator's book (it lost track of it): the store says.
            None => self
                .inner
                .store
                .task(run_id, &key)
                .await?
                .and_then(|bytes| serde_json::from_slice::<TaskEntry>(&bytes).ok()),
        };
        let decision = match entry {
            Some(entry) if entry.attempt == attempt && entry.state != lease::RETRYING => {
                let decision = lease::after_failure(
                    &entry,
                    policy.as_ref(),
                    &error,
                    retryable,
                    now_ms(),
                    fastrand::f64(),
                );
                Some((entry, decision))
            }
            // Not at this attempt: the fenced transition below refuses it.
            _ => None,
        };
        let error = match decision {
            Some((
                entry,
                AfterFailure::Retry {
                    entry: next,
                    backoff_ms,
                },
            )) => {
                let swapped = self.swap(run_id, &key, &entry, Some(&next)).await?;
                drop(leases);
                if !swapped {
                    self.inner.metrics.fenced.inc();
                    return Err(Error::Superseded {
                        task_id: task_id(run_id, task, attempt),
                        attempt,
                        current: "another holder's".into(),
                    });
                }
                self.inner.metrics.retries.inc();
                tracing::warn!(run_id, task = %key, attempt, failures = next.failures, backoff_ms, %error, "attempt failed; retrying after the backoff");
                self.show_task(run_id, &key, &next).await;
                return Ok(Some(backoff_ms));
            }
            Some((_, AfterFailure::Fail(error))) => error,
            None => error,
        };
        drop(leases);
        let event = Event::AgentFailed {
            task: task.clone(),
            error: error.clone(),
        };
        let stored = StoredEvent::AgentFailed {
            task: task.clone(),
            error,
            worker_id: worker_id.to_owned(),
        };
        self.apply_patiently(
            run_id,
            event,
            stored,
            Some((worker_id, task, attempt)),
            None,
        )
        .await
        .map(|()| None)
    }

    /// A task whose worker went away: delivered again as a new attempt (or, lost too often,
    /// its step fails). Only while this coordinator still holds it.
    pub(super) async fn redeliver_lost(&self, worker_id: &str, task: ReadyTask) {
        if self.inner.stopping.load(Ordering::SeqCst) {
            // Shutting down: the lease runs out, and another coordinator takes the task.
            return;
        }
        let (run_id, key) = (task.run_id.clone(), task.task_key.clone());
        let leases = self.inner.lease_writes.lock().await;
        let Some(entry) = self.held_entry(&run_id, &key) else {
            return;
        };
        // The lost attempt's span ends here, so that the worker's span (if it got out) and
        // the next attempt's link have it.
        if let Some(sent) = task.sent()
            && entry.attempt == task.attempt()
        {
            let now = SystemTime::now();
            self.trace_attempt(&Answered {
                worker_id,
                attempt: entry.attempt,
                sent: &sent,
                persisting: now,
                error: Some("its worker was lost"),
                retry_after_ms: None,
                lost_before: entry.lost,
                abandoned: None,
            });
        }
        let config = &self.inner.config;
        let due = lease::lost(
            &entry,
            now_ms(),
            config.lease_ms,
            config.max_lost_deliveries,
        );
        self.claimed(&run_id, &key, entry.encode(), due, Some(task), leases)
            .await;
    }

    /// Carries out a claim decision on a task stored as `expected`: writes it, then delivers the
    /// new attempt (reusing `ready`, the task as built for the last attempt, if there is one) or
    /// fails the step.
    async fn claimed(
        &self,
        run_id: &str,
        key: &str,
        expected: Vec<u8>,
        due: Due,
        ready: Option<ReadyTask>,
        leases: tokio::sync::MutexGuard<'_, ()>,
    ) {
        let (next, give_up) = match due {
            Due::NotYet => return,
            Due::Deliver(next) => (next, None),
            Due::GiveUp(next, error) => (next, Some(error)),
        };
        let lost_before = serde_json::from_slice::<TaskEntry>(&expected).map_or(0, |e| e.lost);
        match self.swap_bytes(run_id, key, expected, Some(&next)).await {
            Ok(true) => {}
            Ok(false) => return, // another coordinator got there first
            Err(error) => {
                tracing::warn!(run_id, task = key, %error, "cannot claim the task");
                return;
            }
        }
        if next.lost > lost_before {
            self.inner.metrics.redeliveries.inc();
        }
        let Some((step_id, visit)) = key.rsplit_once('#') else {
            return;
        };
        let task = TaskId {
            step_id: step_id.into(),
            visit: visit.parse().unwrap_or(0),
        };
        if let Some(error) = give_up {
            drop(leases);
            tracing::error!(
                run_id,
                task = key,
                lost = next.lost,
                "task lost too often; failing its step"
            );
            let event = Event::AgentFailed {
                task: task.clone(),
                error: error.clone(),
            };
            let stored = StoredEvent::AgentFailed {
                task: task.clone(),
                error,
                worker_id: String::new(),
            };
            if let Err(error) = self
                .apply_patiently(run_id, event, stored, Some(("", &task, next.attempt)), None)
                .await
            {
                tracing::warn!(run_id, task = key, %error, "cannot fail the step");
            }
            return;
        }
        tracing::info!(
            run_id,
            task = key,
            attempt = next.attempt,
            "delivering the task again"
        );
        self.deliver(run_id, &task, next, ready).await;
        drop(leases);
    }

    /// Sends a claimed attempt to a worker (or this coordinator's queue).
    async fn deliver(
        &self,
        run_id: &str,
        task: &TaskId,
        entry: TaskEntry,
        ready: Option<ReadyTask>,
    ) {
        let key = task_key(task);
        let ready = match ready {
            Some(mut ready) => {
                ready.message.attempt = entry.attempt;
                ready.message.task_id = task_id(run_id, task, entry.attempt);
                // The new attempt's span is the worker's parent, not the lost one's.
                if let Some(trace) = &ready.trace {
                    ready.message.traceparent =
                        self.inner.traces.task_traceparent(trace, entry.attempt);
                }
                ready.started = None;
                ready.ready_at = std::time::Instant::now();
                ready.resends = 0;
                Some(ready)
            }
            None => match self.build_ready(run_id, task, entry.attempt).await {
                Ok(ready) => ready,
                Err(error) => {
                    // Left as claimed: its lease runs out and the claim is tried again later.
                    tracing::error!(run_id, task = %key, %error, "cannot load the run of a claimed task");
                    return;
                }
            },
        };
        let Some(ready) = ready else {
            // The run no longer waits for it (finished, or moved on): nothing to deliver.
            if let Err(error) = self.swap(run_id, &key, &entry, None).await {
                tracing::warn!(run_id, task = %key, %error, "cannot drop a stale task");
            }
            return;
        };
        self.show_task(run_id, &key, &entry).await;
        if let Some(assignment) = self.inner.hub.submit(ready) {
            self.assigned(vec![assignment]).await;
        }
    }

    /// The task of a run's pending step visit, as a worker gets it, at `attempt`; `None` when
    /// the run does not wait for it (any more).
    async fn build_ready(
        &self,
        run_id: &str,
        task: &TaskId,
        attempt: u32,
    ) -> Result<Option<ReadyTask>, Error> {
        let mut guard = loop {
            let slot = match self.fresh_slot(run_id).await {
                Err(Error::RunNotFound(_)) => return Ok(None),
                other => other?,
            };
            let guard = slot.lock_owned().await;
            // Emptied by a version conflict in between: load it again.
            if guard.is_some() {
                break guard;
            }
        };
        let loaded = guard.as_mut().expect("just checked");
        let Some(pending) = loaded.run.pending_task(task) else {
            return Ok(None);
        };
        let key = task_key(task);
        loaded.tasks.entry(key).or_insert_with(|| TaskEntry {
            agent: pending.agent.clone(),
            ..TaskEntry::default()
        });
        Ok(Some(ready_task(
            &self.inner.traces,
            &loaded.header,
            &loaded.run,
            &pending,
            attempt,
            &mut loaded.parts,
        )))
    }

    /// A reconnected worker still runs `task_id`: take over its lease if that attempt is
    /// current, and otherwise tell the worker to stop it.
    pub(super) async fn adopt_running(&self, worker_id: &str, task_id_text: &str) {
        let stop = |reason: &str| self.inner.hub.cancel(worker_id, task_id_text, reason);
        let Some((run_id, task, attempt)) = parse_task_id(task_id_text) else {
            return stop("malformed task id");
        };
        let key = task_key(&task);
        let stored = match self.inner.store.task(run_id, &key).await {
            Ok(Some(stored)) => stored,
            Ok(None) => return stop("the task is no longer in flight"),
            Err(error) => {
                tracing::warn!(worker_id, task_id = task_id_text, %error, "cannot check a task the worker still runs");
                return stop("its lease could not be checked");
            }
        };
        let Ok(entry) = serde_json::from_slice::<TaskEntry>(&stored) else {
            return stop("its stored lease is unreadable");
        };
        let config = &self.inner.config;
        let Some(next) = lease::adopted(
            &entry,
            attempt,
            &config.coordinator_id,
            worker_id,
            now_ms(),
            config.lease_ms,
        ) else {
            self.inner.metrics.fenced.inc();
            return stop("superseded: the task was given to another worker");
        };
        let Ok(Some(ready)) = self.build_ready(run_id, &task, attempt).await else {
            return stop("the run no longer waits for it");
        };
        let _leases = self.inner.lease_writes.lock().await;
        match self.swap_bytes(run_id, &key, stored, Some(&next)).await {
            Ok(true) => {
                self.inner.hub.adopt(worker_id, ready);
                self.show_task(run_id, &key, &next).await;
                tracing::info!(
                    worker_id,
                    task_id = task_id_text,
                    "took over a task the worker still runs"
                );
            }
            _ => stop("its lease changed while it was taken over"),
        }
    }

    /// Every held task past its step's `timeout_ms` is stopped on its worker and fails its
    /// attempt (retried if the policy allows).
    async fn check_timeouts(&self) {
        let (overdue, assignments) = self.inner.hub.overdue();
        for (worker_id, ready) in overdue {
            self.inner.metrics.timeouts.inc();
            let Some((run_id, task, attempt)) = parse_task_id(&ready.message.task_id) else {
                continue;
            };
            let error = format!(
                "agent \"{}\" timed out after {} ms",
                ready.agent, ready.message.timeout_ms
            );
            tracing::warn!(run_id, task_id = %ready.message.task_id, %worker_id, "attempt timed out");
            let lost_before = self
                .held_entry(run_id, &ready.task_key)
                .map_or(0, |e| e.lost);
            let persisting = SystemTime::now();
            match self
                .fail_attempt(run_id, &task, attempt, &worker_id, error.clone(), true)
                .await
            {
                Ok(retry_after_ms) => {
                    if let Some(sent) = ready.sent() {
                        self.trace_attempt(&Answered {
                            worker_id: &worker_id,
                            attempt,
                            sent: &sent,
                            persisting,
                            error: Some(&error),
                            retry_after_ms,
                            lost_before,
                            abandoned: None,
                        });
                    }
                }
                Err(error) => tracing::warn!(run_id, %error, "cannot fail a timed-out attempt"),
            }
        }
        self.assigned(assignments).await;
    }

    /// A worker that said nothing for [`Config::worker_silence_ms`] is cut off: its stream may
    /// be dead behind a proxy without either end seeing it close.
    async fn check_silent_workers(&self) {
        let silence = Duration::from_millis(self.inner.config.worker_silence_ms);
        for (worker_id, connection) in self.inner.hub.silent(silence) {
            tracing::warn!(%worker_id, ?silence, "worker silent; taking its stream for dead");
            self.disconnect_worker(&worker_id, connection).await;
        }
    }

    /// Pushes out the lease of every task this coordinator holds (one store call), writing down
    /// which worker runs it; gives up the queued ones no worker here can run; forgets (and stops)
    /// the ones another coordinator took over.
    async fn renew_leases(&self) {
        let _leases = self.inner.lease_writes.lock().await;
        let snapshot: Vec<((String, String), TaskEntry)> = self
            .inner
            .held
            .lock()
            .expect("held lock")
            .iter()
            .map(|(key, entry)| (key.clone(), entry.clone()))
            .collect();
        if snapshot.is_empty() {
            return;
        }
        let located = self.inner.hub.locate(
            &snapshot
                .iter()
                .map(|((run, key), entry)| (run.clone(), key.clone(), entry.agent.clone()))
                .collect::<Vec<_>>(),
        );
        let now = now_ms();
        let renewed: Vec<TaskEntry> = snapshot
            .iter()
            .zip(&located)
            .map(|((_, entry), holding)| {
                lease::renewed(entry, holding, now, self.inner.config.lease_ms)
            })
            .collect();
        let swaps = snapshot
            .iter()
            .zip(&renewed)
            .map(|(((run_id, key), entry), next)| TaskSwap {
                run_id: run_id.clone(),
                task_key: key.clone(),
                expected: entry.encode(),
                new: Some(next.encode()),
            })
            .collect();
        let swapped = match self.inner.store.swap_tasks(swaps).await {
            Ok(swapped) => swapped,
            Err(error) => {
                // Nothing is known to be lost: try again at the next renewal.
                tracing::warn!(%error, "cannot renew leases");
                return;
            }
        };
        let mut given_up = Vec::new();
        let mut missed = Vec::new();
        let mut shown = Vec::new();
        {
            let mut held = self.inner.held.lock().expect("held lock");
            for ((key, entry), (next, ok)) in
                snapshot.into_iter().zip(renewed.into_iter().zip(swapped))
            {
                // Changed since the snapshot (a transition answered or removed it): that
                // change wins.
                if held.get(&key) != Some(&entry) {
                    continue;
                }
                if ok && next.owner == self.inner.config.coordinator_id {
                    held.insert(key.clone(), next.clone());
                    if next.worker_id != entry.worker_id {
                        shown.push((key, next));
                    }
                } else if ok {
                    held.remove(&key);
                    given_up.push((
                        key,
                        "no worker here serves its agent; released to the other coordinators",
                    ));
                } else {
                    missed.push((key, entry));
                }
            }
        }
        // A miss is another coordinator's claim, or this coordinator's own renewal whose reply
        // was lost (the store went away): the stored entry tells which.
        for (key, entry) in missed {
            let stored = self
                .inner
                .store
                .task(&key.0, &key.1)
                .await
                .ok()
                .flatten()
                .and_then(|bytes| serde_json::from_slice::<TaskEntry>(&bytes).ok());
            let mut held = self.inner.held.lock().expect("held lock");
            if held.get(&key) != Some(&entry) {
                continue;
            }
            match stored {
                Some(stored)
                    if stored.owner == self.inner.config.coordinator_id
                        && stored.attempt == entry.attempt =>
                {
                    held.insert(key, stored);
                }
                _ => {
                    held.remove(&key);
                    given_up.push((key, "another coordinator took this task over"));
                }
            }
        }
        let mut assignments = Vec::new();
        for ((run_id, task_key), reason) in given_up {
            tracing::info!(%run_id, task = %task_key, reason, "lease given up");
            let forgotten = self.inner.hub.forget(&run_id, &task_key, reason);
            assignments.extend(forgotten.assignments);
        }
        for ((run_id, key), entry) in shown {
            self.show_task(&run_id, &key, &entry).await;
        }
        self.assigned(assignments).await;
    }

    /// Claims the due tasks of the agents this coordinator's workers serve, as many as they
    /// have free slots for.
    pub(super) async fn sweep(&self) {
        if self.inner.stopping.load(Ordering::SeqCst) {
            return;
        }
        // Approval timeouts need no worker: every coordinator sweeps them.
        match self
            .inner
            .store
            .due_tasks(lease::APPROVAL_TIMERS, now_ms(), APPROVAL_SWEEP)
            .await
        {
            Ok(due) => {
                for timer in due {
                    self.time_out_approval(timer).await;
                }
            }
            Err(error) => tracing::warn!(%error, "cannot sweep approval timeouts"),
        }
        for (agent, free) in self.inner.hub.free_slots() {
            if free == 0 {
                continue;
            }
            let due = match self.inner.store.due_tasks(&agent, now_ms(), free).await {
                Ok(due) => due,
                Err(error) => {
                    tracing::warn!(%agent, %error, "cannot sweep due tasks");
                    continue;
                }
            };
            for task in due {
                self.claim_due(task).await;
            }
        }
    }

    /// Fails an approval step nobody decided within its `timeout_ms`: claims its timer (so that
    /// one coordinator does it), then applies the timeout. A decision that came first wins; the
    /// timer is dropped either way.
    async fn time_out_approval(&self, due: DueTask) {
        let Ok(entry) = serde_json::from_slice::<TaskEntry>(&due.task) else {
            tracing::error!(run_id = %due.run_id, task = %due.task_key, "unreadable approval timer; leaving it");
            return;
        };
        let Some(claimed) = lease::timing_out(&entry, now_ms(), self.inner.config.lease_ms) else {
            return;
        };
        if !matches!(
            self.swap_bytes(&due.run_id, &due.task_key, due.task.clone(), Some(&claimed))
                .await,
            Ok(true)
        ) {
            return;
        }
        let Some((step_id, visit)) = due.task_key.rsplit_once('#') else {
            return;
        };
        let (step_id, visit) = (step_id.to_owned(), visit.parse().unwrap_or(0));
        tracing::warn!(run_id = %due.run_id, %step_id, visit, "approval timed out");
        let event = Event::ApprovalTimedOut {
            step_id: step_id.clone(),
            visit,
        };
        let stored = StoredEvent::ApprovalTimedOut { step_id, visit };
        match self
            .apply(&due.run_id, event, stored, None, false, None)
            .await
        {
            // The transition removed the timer.
            Ok(_) => {}
            Err(
                Error::NotAwaitingApproval { .. }
                | Error::RunFinished { .. }
                | Error::RunNotFound(_),
            ) => {
                let _ = self.swap(&due.run_id, &due.task_key, &claimed, None).await;
            }
            Err(error) => {
                tracing::warn!(run_id = %due.run_id, %error, "cannot time the approval out; trying again later");
            }
        }
    }

    async fn claim_due(&self, due: DueTask) {
        let Ok(entry) = serde_json::from_slice::<TaskEntry>(&due.task) else {
            tracing::error!(run_id = %due.run_id, task = %due.task_key, "unreadable task entry; leaving it");
            return;
        };
        let leases = self.inner.lease_writes.lock().await;
        // One of this coordinator's own whose renewal is late (the store was unreachable): the
        // next renewal takes care of it, rather than delivering it a second time.
        if self
            .held_entry(&due.run_id, &due.task_key)
            .is_some_and(|held| held.attempt == entry.attempt)
        {
            return;
        }
        let config = &self.inner.config;
        let decision = lease::on_due(
            &entry,
            &config.coordinator_id,
            now_ms(),
            config.lease_ms,
            config.max_lost_deliveries,
        );
        self.claimed(&due.run_id, &due.task_key, due.task, decision, None, leases)
            .await;
    }

    /// Stops taking work before the process exits: workers are told to connect to another
    /// coordinator (where the tasks they run are taken over), and the queued tasks are released
    /// so that the other coordinators claim them at once instead of waiting for the leases.
    pub async fn shutdown(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        let _leases = self.inner.lease_writes.lock().await;
        let queued = self.inner.hub.goodbye();
        let now = now_ms();
        for task in queued {
            let Some(entry) = self.held_entry(&task.run_id, &task.task_key) else {
                continue;
            };
            let released = lease::released(&entry, now);
            if let Err(error) = self
                .swap(&task.run_id, &task.task_key, &entry, Some(&released))
                .await
            {
                tracing::warn!(run_id = %task.run_id, task = %task.task_key, %error, "cannot release a queued task; its lease runs out instead");
            }
        }
        tracing::info!("coordinator stopping: workers sent elsewhere, queued tasks released");
    }
}
