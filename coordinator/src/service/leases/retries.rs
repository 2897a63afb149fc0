//! A failed attempt (the agent's error, a refused result, a timeout) goes through its step's
//! retry policy: retried after a backoff, or the step fails, fenced by the attempt.

use baton_core::Event;
use baton_core::workflow::RetryPolicy;

use crate::lease::{self, AfterFailure};
use crate::model::{AttemptUsage, TaskEntry, TaskState, keep_attempts};
use crate::service::plan::Answering;
use crate::service::spans::Answered;
use crate::service::{Coordinator, Error};
use crate::store::{Store, Tasks};
use crate::task_ref::TaskRef;

impl<S: Store> Coordinator<S> {
    /// The retry policy of a run's step.
    async fn retry_policy(
        &self,
        run_id: &str,
        step_id: &str,
    ) -> Result<Option<RetryPolicy>, Error> {
        let workflow = self.workflow_of(run_id).await?;
        Ok(workflow
            .index_of(step_id)
            .and_then(|index| workflow.step(index).retry.clone()))
    }

    /// An attempt failed (the agent's error, a refused result, a timeout): it is retried after
    /// a backoff if the step's retry policy allows (the backoff is returned), and otherwise the
    /// step fails, fenced by the attempt.
    pub(in crate::service) async fn fail_attempt(
        &self,
        run_id: &str,
        failed: Answering<'_>,
        error: String,
        retryable: bool,
    ) -> Result<Option<u64>, Error> {
        let task = TaskRef::new(run_id, failed.task, failed.attempt);
        let key = task.key();
        let policy = self.retry_policy(run_id, &failed.task.step_id).await?;
        // Lease writes are one at a time: a renewal between reading the entry and swapping it
        // would make the swap miss.
        let leases = self.inner.leases.writes.lock().await;
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
            Some(entry)
                if entry.attempt == failed.attempt && entry.state != TaskState::Retrying =>
            {
                let decision = lease::after_failure(
                    &entry,
                    policy.as_ref(),
                    &error,
                    retryable,
                    self.now_ms(),
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
                    entry: mut next,
                    backoff_ms,
                },
            )) => {
                // Counted when the visit settles, with the attempt that settles it.
                let visit = failed.task.visit;
                next.usage
                    .extend(AttemptUsage::of(visit, failed.attempt, failed.usage));
                keep_attempts(
                    &mut next.attempt_log,
                    [failed.record(self.now_ms(), &error)],
                );
                let swapped = self.swap(run_id, &key, &entry, Some(&next)).await?;
                drop(leases);
                if !swapped {
                    self.inner.metrics.fenced.inc();
                    return Err(Error::Superseded {
                        task_id: task.to_string(),
                        attempt: failed.attempt,
                        current: "another holder's".into(),
                    });
                }
                self.inner.metrics.retries.inc();
                tracing::warn!(run_id, task = %key, attempt = failed.attempt, failures = next.failures, backoff_ms, %error, "attempt failed; retrying after the backoff");
                self.show_task(run_id, &key, &next).await;
                return Ok(Some(backoff_ms));
            }
            Some((_, AfterFailure::Fail(error))) => error,
            None => error,
        };
        drop(leases);
        let event = Event::AgentFailed {
            task: failed.task.clone(),
            error,
        };
        self.apply_patiently(run_id, event, failed, None)
            .await
            .map(|()| None)
    }

    /// Every held task past its step's `timeout_ms` is stopped on its worker and fails its
    /// attempt (retried if the policy allows).
    pub(super) async fn check_timeouts(&self) {
        let (overdue, assignments) = self.inner.hub.overdue();
        for (worker_id, ready) in overdue {
            self.inner.metrics.timeouts.inc();
            let task = &ready.task;
            let run_id = task.run_id.as_str();
            let error = format!(
                "agent \"{}\" timed out after {} ms",
                ready.agent, ready.timeout_ms
            );
            tracing::warn!(run_id, task_id = %task, %worker_id, "attempt timed out");
            let lost_before = self.held_entry(run_id, &ready.key).map_or(0, |e| e.lost);
            let persisting = self.inner.config.clock.now();
            let failed = Answering {
                worker_id: &worker_id,
                task: &task.task,
                attempt: task.attempt,
                usage: &[],
                started_ms: ready.sent().map_or(0, |sent| self.sent_at_ms(&sent)),
                sent: None,
            };
            match self.fail_attempt(run_id, failed, error.clone(), true).await {
                Ok(retry_after_ms) => {
                    if let Some(sent) = ready.sent() {
                        self.trace_attempt(&Answered {
                            worker_id: &worker_id,
                            attempt: task.attempt,
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
}
