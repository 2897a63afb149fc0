//! The spans the coordinator writes when an outcome is recorded: an agent step's attempts, and
//! the steps that settle without an agent ([`crate::traces`] builds them).

use std::time::SystemTime;

use baton_core::StepRecord;

use super::Coordinator;
use super::runs::Loaded;
use super::runs::SettledTiming;
use crate::hub::Sent;
use crate::store::Store;
use crate::traces::{self, AttemptSpan, RunSpan, SettledSpan, StepSpan};

/// How an attempt ended, for its span.
pub(super) struct Answered<'a> {
    pub worker_id: &'a str,
    pub attempt: u32,
    pub sent: &'a Sent,
    /// When the coordinator started recording the outcome.
    pub persisting: SystemTime,
    pub error: Option<&'a str>,
    pub retry_after_ms: Option<u64>,
    /// Earlier deliveries of the step visit lost with their worker or coordinator.
    pub lost_before: u32,
    /// Why the attempt was stopped, when the run no longer needed it.
    pub abandoned: Option<&'a str>,
}

impl<S: Store> Coordinator<S> {
    /// Writes the span of an attempt whose outcome (an answer, a timeout, its worker lost) was
    /// just recorded.
    pub(super) fn trace_attempt(&self, answered: &Answered<'_>) {
        let Some(trace) = &answered.sent.trace else {
            return;
        };
        let span = AttemptSpan {
            attempt: answered.attempt,
            worker_id: answered.worker_id,
            ready_at: traces::wall_clock(answered.sent.ready_at.into_std()),
            dispatched_at: traces::wall_clock(answered.sent.started.into_std()),
            persisted: (answered.persisting, self.inner.config.clock.now()),
            error: answered.error,
            retry_after_ms: answered.retry_after_ms,
            lost_before: answered.lost_before,
            abandoned: answered.abandoned,
        };
        self.inner.traces.attempt(trace, &span);
    }

    /// Writes the span of a step that settled without an agent, from when its visit started
    /// waiting (a transform or condition takes no time) to when it settled.
    pub(super) fn trace_settled(
        &self,
        loaded: &Loaded,
        record: &StepRecord,
        timing: SettledTiming,
    ) {
        let parallel = record.parent.as_deref().zip(timing.parallel_visit);
        let span = SettledSpan {
            step: StepSpan {
                step_id: &record.step_id,
                visit: record.visit,
                item: record.item,
                step_type: record.step_type.as_str(),
                parallel,
            },
            started: traces::from_ms(timing.started_ms),
            settled: traces::from_ms(record.at_ms),
            error: record.error.as_deref(),
        };
        let run = RunSpan {
            traceparent: &loaded.header.traceparent,
            run_id: &loaded.header.run_id,
            workflow_id: &loaded.header.workflow_id,
        };
        self.inner.traces.settled(run, &span);
    }
}
