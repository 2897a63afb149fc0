//! Claiming what is due: tasks whose lease ran out or that nobody holds, retries whose backoff
//! is over, and approvals nobody decided in time; then delivering each claimed task as a new
//! attempt.

use baton_core::{Event, TaskId};
use tokio::sync::MutexGuard;

use crate::clock::Instant;
use crate::hub::ReadyTask;
use crate::lease::{self, Due};
use crate::model::{TaskEntry, TaskState};
use crate::service::plan::Answering;
use crate::service::tasks::ready_task;
use crate::service::{Coordinator, Error};
use crate::store::{DueTask, Store, Tasks};
use crate::task_ref::{TaskRef, parse_task_key, task_key};

/// How many approval timeouts one sweep takes on.
const APPROVAL_SWEEP: usize = 64;

impl<S: Store> Coordinator<S> {
    /// Claims the due tasks of the agents this coordinator's workers serve, as many as they
    /// have free slots for.
    pub(in crate::service) async fn sweep(&self) {
        if self.inner.leases.stopping() {
            return;
        }
        // Approval timeouts and runs' continuations need no worker: every coordinator sweeps
        // them.
        match self
            .inner
            .store
            .due_tasks(lease::APPROVAL_TIMERS, self.now_ms(), APPROVAL_SWEEP)
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
            let due = match self
                .inner
                .store
                .due_tasks(&agent, self.now_ms(), free)
                .await
            {
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
        // The same timers hold runs' continuations.
        if entry.state == TaskState::Continuing {
            return self.claim_continuation(&due.run_id, due.task, &entry).await;
        }
        let config = &self.inner.config;
        let Some(claimed) = lease::timing_out(&entry, self.now_ms(), config.lease_ms) else {
            return;
        };
        if !matches!(
            self.swap_bytes(&due.run_id, &due.task_key, due.task.clone(), Some(&claimed))
                .await,
            Ok(true)
        ) {
            return;
        }
        let Some(TaskId { step_id, visit, .. }) = parse_task_key(&due.task_key) else {
            return;
        };
        tracing::warn!(run_id = %due.run_id, %step_id, visit, "approval timed out");
        let event = Event::ApprovalTimedOut {
            step_id: step_id.to_string(),
            visit,
        };
        match self.apply(&due.run_id, event, None, false, None).await {
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
        let leases = self.inner.leases.writes.lock().await;
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
            self.now_ms(),
            config.lease_ms,
            config.max_lost_deliveries,
        );
        self.claimed(&due.run_id, &due.task_key, due.task, decision, None, leases)
            .await;
    }

    /// Carries out a claim decision on a task stored as `expected`: writes it, then delivers the
    /// new attempt (reusing `ready`, the task as built for the last attempt, if there is one) or
    /// fails the step.
    pub(in crate::service) async fn claimed(
        &self,
        run_id: &str,
        key: &str,
        expected: Vec<u8>,
        due: Due,
        ready: Option<ReadyTask>,
        leases: MutexGuard<'_, ()>,
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
        let Some(task) = parse_task_key(key) else {
            return;
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
                error,
            };
            // Nobody answered: the failure is this coordinator's, fenced by the claimed attempt.
            let failed = Answering {
                worker_id: "",
                task: &task,
                attempt: next.attempt,
                usage: &[],
                started_ms: 0,
                sent: None,
            };
            if let Err(error) = self.apply_patiently(run_id, event, failed, None).await {
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
                ready.task = TaskRef::new(run_id, task, entry.attempt);
                // The new attempt's span is the worker's parent, not the lost one's.
                if let Some(trace) = &ready.trace {
                    ready.traceparent = self.inner.traces.task_traceparent(trace, entry.attempt);
                }
                ready.started = None;
                ready.ready_at = Instant::now();
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
        let assignments = self.inner.hub.submit(ready);
        self.assigned(assignments).await;
    }

    /// The task of a run's pending step visit, as a worker gets it, at `attempt`; `None` when
    /// the run does not wait for it (any more).
    pub(in crate::service) async fn build_ready(
        &self,
        run_id: &str,
        task: &TaskId,
        attempt: u32,
    ) -> Result<Option<ReadyTask>, Error> {
        let mut guard = match self.fresh(run_id).await {
            Err(Error::RunNotFound(_)) => return Ok(None),
            other => other?,
        };
        let loaded = guard.as_mut().expect("fresh loads the run");
        let Some(pending) = loaded.run.pending_task(task) else {
            return Ok(None);
        };
        let key = task_key(task);
        loaded.tasks.entry(key).or_insert_with(|| TaskEntry {
            agent: pending.agent.as_str().into(),
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
}
