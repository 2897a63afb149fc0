//! The coordinator's half of dispatch: an engine `Dispatch` becomes a task ready for a worker
//! (its payload by reference, its span's parent) and goes to the hub, which chooses the worker
//! ([`crate::dispatch`]); an `Abandon` stops it wherever it is; and once a worker takes a
//! task, the run's copy and its watchers learn who runs it.

use std::sync::Arc;

use baton_core::{AgentTask, Run, TaskId};

use super::Coordinator;
use super::plan::{map_of, parallel_of};
use super::runs::Loaded;
use super::spans::Answered;
use super::watch::RunEvent;
use crate::hub::{Assignment, ReadyTask};
use crate::model::{StepStatus, TaskState};
use crate::parts::PartEncoder;
use crate::store::{RunHeader, Store};
use crate::task_ref::{TaskRef, task_key};
use crate::traces::{TaskTrace, Traces};

impl<S: Store> Coordinator<S> {
    /// A task the engine dispatched goes to the hub, if this coordinator holds its lease. A
    /// task nobody here can run was left unowned in the store, due now: a coordinator with a
    /// worker for its agent claims it.
    pub(super) fn hand_out(&self, loaded: &mut Loaded, task: &AgentTask) -> Vec<Assignment> {
        let me = &self.inner.config.coordinator_id;
        let Some(entry) = loaded
            .tasks
            .get(&task_key(&task.task))
            .filter(|entry| entry.owner.as_ref() == Some(me))
        else {
            return Vec::new();
        };
        let ready = ready_task(
            &self.inner.traces,
            &loaded.header,
            &loaded.run,
            task,
            entry.attempt,
            &mut loaded.parts,
        );
        self.inner.hub.submit(ready)
    }

    /// A task the run no longer needs is dropped wherever it is, and stopped on its worker; the
    /// attempt that was running ends there, in its span too. Returns what the freed slot took.
    pub(super) fn abandon(&self, run_id: &str, task: &TaskId) -> Vec<Assignment> {
        let reason = "its run no longer needs it";
        let forgotten = self.inner.hub.forget(run_id, &task_key(task), reason);
        if let Some((worker_id, ready)) = forgotten.held
            && let Some(sent) = ready.sent()
        {
            let now = self.inner.config.clock.now();
            self.trace_attempt(&Answered {
                worker_id: &worker_id,
                attempt: ready.attempt(),
                sent: &sent,
                persisting: now,
                error: None,
                retry_after_ms: None,
                lost_before: 0,
                abandoned: Some(reason),
            });
        }
        forgotten.assignments
    }

    /// Records which worker took each task, and tells watchers the step started.
    pub(super) async fn assigned(&self, assignments: Vec<Assignment>) {
        for assignment in assignments {
            self.inner
                .metrics
                .task_sent(&assignment.agent, assignment.waited);
            // Only runs in memory: a run that is not has finished, or will queue its tasks
            // again when it is loaded.
            let Some(slot) = self.inner.runs.cached(&assignment.run_id) else {
                continue;
            };
            let mut guard = slot.lock().await;
            if let Some(loaded) = guard.as_mut() {
                self.mark_assigned(loaded, &assignment);
            }
        }
    }

    /// Notes which worker took a task. The store learns it with the next lease renewal (a write
    /// per dispatch would cost a round trip per step); the result's transition records the
    /// worker for good.
    fn mark_assigned(&self, loaded: &mut Loaded, assignment: &Assignment) {
        let Some(entry) = loaded.tasks.get_mut(&assignment.task_key) else {
            return;
        };
        entry.state = TaskState::Running;
        entry.worker_id = Some(assignment.worker_id.clone());
        let entry = entry.clone();
        let task = &assignment.task;
        // A map item is one of many: its map step's counts tell how they stand, and watchers
        // see progress, not a line per item.
        if task.item.is_some() {
            return;
        }
        let (step_id, visit) = (task.step_id.as_ref(), task.visit);
        if let Some(step) = loaded.steps.get_mut(step_id) {
            step.status = StepStatus::Running;
            step.worker_id = Some(assignment.worker_id.clone());
            step.attempts = entry.attempt;
        }
        self.notify(&assignment.run_id, || {
            RunEvent::step_started(step_id, visit, &entry)
        });
    }
}

/// Attempt `attempt` of `task`, ready for a worker, with what its spans need when traces are
/// on (the worker gets its `traceparent`, in the run's trace).
pub(super) fn ready_task(
    traces: &Traces,
    header: &RunHeader,
    run: &Run,
    task: &AgentTask,
    attempt: u32,
    encoder: &mut PartEncoder,
) -> ReadyTask {
    let run_id = header.run_id.as_str();
    let trace = traces.enabled().then(|| {
        Arc::new(TaskTrace {
            run_traceparent: header.traceparent.clone(),
            run_id: run_id.to_owned(),
            workflow_id: header.workflow_id.clone(),
            step_id: task.task.step_id.to_string(),
            visit: task.task.visit,
            item: task.task.item,
            agent: task.agent.clone(),
            parallel: match task.task.item {
                Some(_) => Some(map_of(run.workflow(), &task.task.step_id)),
                None => parallel_of(run.workflow(), &task.task.step_id),
            }
            .map(|group| (group.to_owned(), run.visits(group))),
        })
    });
    let traceparent = trace
        .as_ref()
        .map(|trace| traces.task_traceparent(trace, attempt))
        .unwrap_or_default();
    let payload = encoder.payload(&task.payload);
    let id = TaskRef::new(run_id, &task.task, attempt);
    let mut ready = ReadyTask::new(id, &task.agent, payload);
    ready.timeout_ms = task.timeout_ms.unwrap_or_default();
    ready.traceparent = traceparent;
    ready.trace = trace;
    ready
}
