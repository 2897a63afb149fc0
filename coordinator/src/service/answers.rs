//! Workers' answers: a result settles its step (or goes through the retry policy), fenced by
//! the attempt the worker holds; a payload the worker could not rebuild is sent again.
//!
//! The edge has already read the answer ([`Answer`]): task id parsed, digests checked, sizes,
//! depth and the notes' limits enforced. A result that failed those checks still settles its
//! task: its attempt fails with the reason, rather than leaving the run waiting for an answer
//! that will never come.

use baton_core::Event;
use baton_core::handoff::AgentNotes;
use serde_json::Value;
use tracing::Instrument as _;

use super::plan::Answering;
use super::spans::Answered;
use super::{Coordinator, Error};
use crate::bounded;
use crate::decisions::Embedded;
use crate::hub::Sent;
use crate::metrics::Refused;
use crate::model::ModelUsage;
use crate::parts::Part;
use crate::store::{self, Store};
use crate::task_ref::TaskRef;
use crate::traces;

/// An outcome as recorded: the attempt's error when it failed, and its retry's delay.
type RecordedOutcome = Result<(Option<String>, Option<u64>), Error>;

/// A worker's answer to one attempt of a task.
#[derive(Debug)]
pub struct Answer {
    pub task: TaskRef,
    pub outcome: Outcome,
    /// The tokens the attempt used, one entry per call to a model.
    pub usage: Vec<ModelUsage>,
}

/// What the answer says.
#[derive(Debug)]
pub enum Outcome {
    /// The agent's data, and the messages and decisions it reported. `sent` is the data as
    /// the worker sent it, its digest checked: when it is also the coordinator's encoding of
    /// `data`, the step's result is stored and passed on as those bytes and that digest, with
    /// no second hash (issue 20, point 3).
    Data {
        data: Value,
        notes: AgentNotes,
        sent: Part,
    },
    /// The agent failed; `retryable` says whether another attempt can help.
    Failed { error: String, retryable: bool },
    /// The result cannot be taken as data (why is the error): the attempt fails with that
    /// reason, and the worker is told it.
    Refused { reason: Error, retryable: bool },
}

impl<S: Store> Coordinator<S> {
    /// A worker's answer to a task it holds, at the attempt it holds. An error goes through the
    /// step's retry policy; data settles the step, fenced by the attempt.
    pub async fn complete(&self, worker_id: &str, answer: Answer) -> Result<(), Error> {
        // Log lines about the answer name its trace and span, once known.
        let logs = tracing::info_span!(
            "task",
            task_id = %answer.task,
            trace_id = tracing::field::Empty,
            span_id = tracing::field::Empty,
        );
        self.complete_answer(worker_id, answer)
            .instrument(logs)
            .await
    }

    async fn complete_answer(&self, worker_id: &str, answer: Answer) -> Result<(), Error> {
        let task = &answer.task;
        let run_id = task.run_id.as_str();
        let key = task.key();
        self.check_held(worker_id, task, &key)?;
        let sent = self.inner.hub.sent(worker_id, run_id, &key);
        let lost_before = self.note_answer_arrived(task, &key, sent.as_ref());
        // The attempt's live output goes to the store before its answer is recorded, so that
        // watchers see all of it before the step's end.
        self.inner.output.flushed(run_id).await;
        let persisting = self.inner.config.clock.now();
        let answering = Answering {
            worker_id,
            task: &task.task,
            attempt: task.attempt,
            usage: &answer.usage,
            started_ms: sent.as_ref().map_or(0, |sent| self.sent_at_ms(sent)),
            sent: None,
        };
        let (applied, refusal) = self.record_outcome(task, answering, answer.outcome).await;
        if let (Some(sent), Ok((error, retry_after_ms))) = (&sent, &applied) {
            self.trace_attempt(&Answered {
                worker_id,
                attempt: task.attempt,
                sent,
                persisting,
                error: error.as_deref(),
                retry_after_ms: *retry_after_ms,
                lost_before,
                abandoned: None,
            });
        }
        let applied = applied.map(|_| ());
        self.release_answered(worker_id, run_id, &key, &applied)
            .await;
        match (applied, refusal) {
            (Err(Error::RunFinished { .. }), _) => Ok(()),
            (Err(error), _) => Err(error),
            (Ok(()), Some(refused)) => Err(refused),
            (Ok(()), None) => Ok(()),
        }
    }

    /// Refuses an answer from a worker that does not hold the task at that attempt.
    fn check_held(&self, worker_id: &str, task: &TaskRef, key: &str) -> Result<(), Error> {
        if self
            .inner
            .hub
            .holds(worker_id, &task.run_id, key, task.attempt)
        {
            return Ok(());
        }
        // Counted as fenced: most often the answer of an attempt that was given to another
        // worker after this one was taken for lost. Counted as refused too: it may also be a
        // worker answering a task it was never given.
        self.inner.metrics.fenced.inc();
        self.inner.metrics.worker_refused(Refused::Result);
        Err(Error::TaskNotHeld {
            worker_id: worker_id.to_owned(),
            task_id: task.to_string(),
        })
    }

    /// Metrics and log fields for an answer that arrived; how often its task was lost before
    /// (read before the outcome changes its entry), for its attempt's span.
    fn note_answer_arrived(&self, task: &TaskRef, key: &str, sent: Option<&Sent>) -> u32 {
        let Some(sent) = sent else {
            return 0;
        };
        self.inner
            .metrics
            .task_answered(&sent.agent, sent.started.elapsed());
        let Some(trace) = &sent.trace else {
            return 0;
        };
        if let Some((trace_id, span_id)) =
            traces::attempt_ids(&trace.run_traceparent, &task.to_string())
        {
            let logs = tracing::Span::current();
            logs.record("trace_id", trace_id);
            logs.record("span_id", span_id);
        }
        self.held_entry(&task.run_id, key)
            .map_or(0, |entry| entry.lost)
    }

    /// The answer's outcome applied to its run: data settles the step, an error goes through
    /// the retry policy. With the attempt's error and its retry's delay when it failed, and the
    /// refusal to tell the worker when its result was refused.
    async fn record_outcome(
        &self,
        task: &TaskRef,
        answering: Answering<'_>,
        outcome: Outcome,
    ) -> (RecordedOutcome, Option<Error>) {
        let run_id = task.run_id.as_str();
        match outcome {
            Outcome::Data {
                data,
                notes,
                sent: bytes,
            } => {
                let embedded = self.embed_decisions(&notes).await;
                let answering = Answering {
                    sent: Some(&bytes),
                    ..answering
                };
                let event = Event::AgentSucceeded {
                    task: task.task.clone(),
                    data: data.into(),
                    notes,
                };
                let applied = self
                    .apply_patiently(run_id, event, answering, embedded)
                    .await
                    .map(|()| (None, None));
                (applied, None)
            }
            Outcome::Failed { error, retryable } => {
                let applied = self.fail_attempt(run_id, answering, error.clone(), retryable);
                (applied.await.map(|retry| (Some(error), retry)), None)
            }
            Outcome::Refused { reason, retryable } => {
                // The reason may quote what the worker sent (a digest of any length): cut
                // like the agent's own errors.
                let error = bounded::cut(
                    &format!("the agent's result was refused: {reason}"),
                    self.inner.config.max_error_bytes,
                );
                let applied = self.fail_attempt(run_id, answering, error.clone(), retryable);
                (
                    applied.await.map(|retry| (Some(error), retry)),
                    Some(reason),
                )
            }
        }
    }

    /// The answering worker is done with the task, unless its answer could not be recorded: then
    /// the task goes back to the queue rather than being lost.
    async fn release_answered(
        &self,
        worker_id: &str,
        run_id: &str,
        key: &str,
        applied: &Result<(), Error>,
    ) {
        let hub = &self.inner.hub;
        let assignments = match applied {
            // Not recorded: the task goes back to the queue rather than being lost. (A
            // transition stopped mid-computation, by a cancel or a shutdown, is not recorded
            // either.)
            // A cancel on its way abandons the task anyway; should it fail, the task's lease
            // runs out and it is delivered again.
            Err(Error::ComputationStopped { .. }) if self.inner.aborts.stopped(run_id) => {
                hub.finish(worker_id, run_id, key).unwrap_or_default()
            }
            Err(Error::Store(store::Error::Unavailable(_)) | Error::ComputationStopped { .. }) => {
                hub.requeue(worker_id, run_id, key)
            }
            // Recorded, or refused (a stale answer): either way this worker is done with it.
            _ => hub.finish(worker_id, run_id, key).unwrap_or_default(),
        };
        self.assigned(assignments).await;
    }

    /// Vectors for a result's decisions. An embedder that fails does not hold the result
    /// back: the decisions are stored without vectors and embedded when they are queried.
    async fn embed_decisions(&self, notes: &AgentNotes) -> Option<Embedded> {
        if notes.decisions.is_empty() {
            return None;
        }
        let texts: Vec<String> = notes
            .decisions
            .iter()
            .map(|d| {
                if d.rationale.is_empty() {
                    d.summary.clone()
                } else {
                    format!("{}: {}", d.summary, d.rationale)
                }
            })
            .collect();
        let embedder = &self.inner.embedder;
        match embedder.embed(&texts).await {
            Ok(vectors) => Some(Embedded {
                model: embedder.model().to_owned(),
                vectors,
            }),
            Err(error) => {
                tracing::warn!(%error, "decisions stored without embeddings; they are embedded when queried");
                None
            }
        }
    }

    /// A worker could not rebuild a task's payload: the task goes to it again whole, or, after
    /// [`crate::hub::MAX_RESENDS`] tries, its step fails with the reason (it is logged either
    /// way).
    ///
    /// Only the stream holding that attempt of the task gets it again: a worker that names
    /// another's task is refused (and counted), and is sent nothing.
    pub async fn resend(&self, worker_id: &str, task: TaskRef, reason: &str) -> Result<(), Error> {
        let resent = self
            .inner
            .hub
            .resend(worker_id, &task.run_id, &task.key(), task.attempt);
        match resent {
            Err(crate::hub::Error::NotHeld { .. }) => {
                self.inner.metrics.worker_refused(Refused::Resend);
            }
            _ => self.inner.counters.resent(),
        }
        match resent {
            Ok(()) => {
                tracing::warn!(worker_id, task_id = %task, %reason, "payload did not arrive intact; sent again");
                Ok(())
            }
            Err(exhausted @ crate::hub::Error::ResendsExhausted { .. }) => {
                tracing::error!(worker_id, task_id = %task, %reason, "payload never arrived intact; failing the step");
                let failure = Answer {
                    task,
                    outcome: Outcome::Failed {
                        error: format!("{exhausted}: {reason}"),
                        retryable: true,
                    },
                    usage: Vec::new(),
                };
                self.complete(worker_id, failure).await
            }
            Err(_) => Err(Error::TaskNotHeld {
                worker_id: worker_id.to_owned(),
                task_id: task.to_string(),
            }),
        }
    }
}
