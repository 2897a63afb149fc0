//! What clients read: a run's record, as the store has it now, and the list of runs.

use std::collections::BTreeMap;

use baton_core::{RunStatus, TaskId};
use futures::StreamExt;
use tokio::sync::OnceCell;

use super::runs::Loaded;
use super::{Coordinator, Error, json};
use crate::hub::{Holding, TaskAsked};
use crate::model::{StepStatus, TaskEntry, TaskState};
use crate::record::{self, RunRecord, StepView, WaitingFor};
use crate::store::{Coordination, Listing, RunPage, RunQuery, Store, Tasks};
use crate::task_ref::parse_task_key;
use crate::traces;

/// How many runs a list returns when the client names no limit, and at most.
const DEFAULT_LIST: usize = 50;
const MAX_LIST: usize = 1_000;
/// How many runs [`Coordinator::waits_live`] reads at once.
const WAITS_AT_ONCE: usize = 8;

/// The agents the workers of other coordinators serve (their free slots, by agent): read from
/// the store when first needed, then shared by every run of one read.
type Elsewhere = OnceCell<BTreeMap<String, usize>>;

fn unserved(waiting: &WaitingFor) -> bool {
    matches!(waiting, WaitingFor::Agent { served: false, .. })
}

/// Whether `waiting` is an agent of `step` that seems unserved.
fn unserved_at(waiting: &WaitingFor, step: &StepView) -> bool {
    matches!(waiting, WaitingFor::Agent { step_id, served: false, .. } if *step_id == step.step_id)
}

impl<S: Store> Coordinator<S> {
    /// The run record of `run_id`, as the store has it now (another coordinator may have moved
    /// the run on since this one last touched it).
    pub async fn record(&self, run_id: &str) -> Result<RunRecord, Error> {
        self.read_fresh(run_id, |loaded| self.record_of(loaded))
            .await
    }

    /// [`Coordinator::record`], with where its steps in flight stand wherever they are held:
    /// what the web UI shows, from any coordinator. It costs two more reads of the store for
    /// a running run (its tasks, and the agents other coordinators serve when one seems
    /// unserved), so `GetRun`, which clients poll, does without.
    pub async fn record_live(&self, run_id: &str) -> Result<RunRecord, Error> {
        let mut record = self.record(run_id).await?;
        if record.status == RunStatus::Running
            && self
                .show_tasks_in_flight(&record.run_id, &mut record.steps)
                .await
        {
            self.show_served(&mut record.waiting, &record.steps, &Elsewhere::new())
                .await;
        }
        Ok(record)
    }

    /// What each of `run_ids` waits for, in order, as [`Coordinator::record_live`]'s `waiting`
    /// says it, without building their records: the list of runs shows it for every running
    /// run of a page, and a record is the run's whole context and memory, as JSON. The store's
    /// tasks are read only for a run with a wait no worker here serves, and the agents other
    /// coordinators serve once for all the runs.
    pub async fn waits_live(&self, run_ids: &[String]) -> Vec<Result<Vec<WaitingFor>, Error>> {
        let elsewhere = &Elsewhere::new();
        // Owned ids: a future borrowing the slice's items would not be provably `Send` for
        // the HTTP handler.
        futures::stream::iter(run_ids.iter().cloned())
            .map(|run_id| async move { self.run_waits_live(&run_id, elsewhere).await })
            .buffered(WAITS_AT_ONCE)
            .collect()
            .await
    }

    async fn run_waits_live(
        &self,
        run_id: &str,
        elsewhere: &Elsewhere,
    ) -> Result<Vec<WaitingFor>, Error> {
        let (running, mut waiting, mut steps) = self
            .read_fresh(run_id, |loaded| {
                let status = loaded.finished_as.unwrap_or(loaded.run.status());
                let waiting = record::waiting(&loaded.run, |agent| self.inner.hub.serves(agent));
                // Only the steps of waits that seem unserved can change what is shown.
                let steps: Vec<StepView> = if waiting.iter().any(unserved) {
                    record::step_states(loaded.run.workflow(), &loaded.steps)
                        .into_iter()
                        .filter(|step| waiting.iter().any(|wait| unserved_at(wait, step)))
                        .collect()
                } else {
                    Vec::new()
                };
                (status == RunStatus::Running, waiting, steps)
            })
            .await?;
        if running && !steps.is_empty() && self.show_tasks_in_flight(run_id, &mut steps).await {
            self.show_served(&mut waiting, &steps, elsewhere).await;
        }
        Ok(waiting)
    }

    /// Where the run's steps in flight stand, wherever they are held; `false` when the
    /// store's tasks cannot be read. A coordinator knows the tasks of its own workers as they
    /// move, but another's move by compare-and-swap without a new version of the run (a worker
    /// took it, its attempt was given out again), so its copy of the run does not show them;
    /// the store's tasks do.
    async fn show_tasks_in_flight(&self, run_id: &str, steps: &mut [StepView]) -> bool {
        let tasks = match self.inner.store.tasks(run_id).await {
            Ok(tasks) => tasks,
            Err(error) => {
                tracing::debug!(%run_id, %error, "cannot read the run's tasks");
                return false;
            }
        };
        let mut in_flight: Vec<(TaskId, TaskEntry, &str)> = tasks
            .iter()
            .filter_map(|(key, bytes)| {
                let task = parse_task_key(key)?;
                let entry = serde_json::from_slice::<TaskEntry>(bytes).ok()?;
                (task.item.is_none() && entry.state != TaskState::Waiting).then_some((
                    task,
                    entry,
                    key.as_str(),
                ))
            })
            .collect();
        self.show_sent_here(run_id, &mut in_flight);
        for (task, entry, _) in in_flight {
            let Some(step) = steps
                .iter_mut()
                .find(|step| step.step_id == *task.step_id && step.visits == task.visit)
            else {
                continue;
            };
            let in_flight = matches!(
                step.status,
                StepStatus::Queued | StepStatus::Running | StepStatus::Retrying
            );
            // This coordinator's own copy may be ahead of the store for its workers' tasks
            // (a task sent is written down at the next lease renewal): never back.
            let behind = entry.attempt < step.attempts
                || (entry.attempt == step.attempts
                    && step.status == StepStatus::Running
                    && entry.state == TaskState::Queued);
            if in_flight && !behind {
                step.status = entry.state.into();
                step.attempts = entry.attempt;
                if entry.worker_id.is_some() {
                    step.worker_id = entry.worker_id.clone();
                }
            }
        }
        true
    }

    /// A task sent to a worker here is written down at the next lease renewal: until then the
    /// store says queued, and a record read from the store's copy (the run busy past the read's
    /// patience) would show a running step queued again. The hub knows which of its workers
    /// holds it.
    fn show_sent_here(&self, run_id: &str, tasks: &mut [(TaskId, TaskEntry, &str)]) {
        let queued: Vec<usize> = (0..tasks.len())
            .filter(|&n| tasks[n].1.state == TaskState::Queued)
            .collect();
        if queued.is_empty() {
            return;
        }
        let asked: Vec<TaskAsked<'_>> = queued
            .iter()
            .map(|&n| TaskAsked {
                run_id,
                task_key: tasks[n].2,
                agent: &tasks[n].1.agent,
            })
            .collect();
        let located = self.inner.hub.locate(&asked);
        for (n, holding) in queued.into_iter().zip(located) {
            if let Holding::Worker(worker) = holding {
                let entry = &mut tasks[n].1;
                entry.state = TaskState::Running;
                entry.worker_id = Some(worker.id);
            }
        }
    }

    /// Whether each agent waited for is served: by a worker of any coordinator (another's
    /// advertised its agents), or by the worker that holds its task (a running step).
    async fn show_served(
        &self,
        waiting: &mut [WaitingFor],
        steps: &[StepView],
        elsewhere: &Elsewhere,
    ) {
        if !waiting.iter().any(unserved) {
            return;
        }
        let elsewhere = elsewhere
            .get_or_init(|| async {
                let me = &self.inner.config.coordinator_id;
                self.inner
                    .store
                    .slots_elsewhere(me, self.now_ms())
                    .await
                    .unwrap_or_default()
            })
            .await;
        for waiting in waiting {
            if let WaitingFor::Agent {
                step_id,
                agent,
                served,
            } = waiting
            {
                let running = steps
                    .iter()
                    .any(|step| step.step_id == *step_id && step.status == StepStatus::Running);
                *served = *served || running || elsewhere.contains_key(agent.as_str());
            }
        }
    }

    /// A page of runs, newest first, as the store's `list_runs` cuts it; a `limit` of 0 means
    /// the default, and no page is longer than the most.
    pub async fn list(&self, query: RunQuery) -> Result<RunPage, Error> {
        let limit = match query.limit {
            0 => DEFAULT_LIST,
            limit => limit.min(MAX_LIST),
        };
        Ok(self
            .inner
            .store
            .list_runs(RunQuery { limit, ..query })
            .await?)
    }

    pub(super) fn record_of(&self, loaded: &Loaded) -> RunRecord {
        let workflow = loaded.run.workflow();
        let (context, memory) = record::fit(
            json(&loaded.run.context().visible_serializer()),
            json(&record::memory(&loaded.run)),
            self.inner.config.max_record_bytes,
        );
        RunRecord {
            run_id: loaded.header.run_id.clone(),
            workflow_id: loaded.header.workflow_id.clone(),
            status: loaded.finished_as.unwrap_or(loaded.run.status()),
            error: loaded.run.error().unwrap_or_default().into(),
            context,
            steps: record::step_states(workflow, &loaded.steps),
            waiting: record::waiting(&loaded.run, |agent| self.inner.hub.serves(agent)),
            state_sha256: loaded.state_sha256.clone(),
            created_ms: loaded.header.created_ms,
            updated_ms: loaded.updated_ms,
            memory,
            trace_id: traces::trace_id_of(&loaded.header.traceparent),
            submitted_by: loaded.header.submitted_by.clone(),
            usage: record::usage_totals(loaded.steps.values()),
        }
    }
}
