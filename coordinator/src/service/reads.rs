//! What clients read: a run's record, as the store has it now, and the list of runs.

use super::runs::Loaded;
use super::{Coordinator, Error, json};
use crate::record::{self, RunRecord};
use crate::store::{RunSummary, Store};
use crate::traces;

/// How many runs a list returns when the client names no limit, and at most.
const DEFAULT_LIST: usize = 50;
const MAX_LIST: usize = 1_000;

impl<S: Store> Coordinator<S> {
    /// The run record of `run_id`, as the store has it now (another coordinator may have moved
    /// the run on since this one last touched it).
    pub async fn record(&self, run_id: &str) -> Result<RunRecord, Error> {
        self.read_fresh(run_id, |loaded| self.record_of(loaded))
            .await
    }

    /// The newest runs first; `limit` 0 means the default.
    pub async fn list(&self, limit: usize) -> Result<Vec<RunSummary>, Error> {
        let limit = if limit == 0 {
            DEFAULT_LIST
        } else {
            limit.min(MAX_LIST)
        };
        Ok(self.inner.store.list_runs(limit).await?)
    }

    pub(super) fn record_of(&self, loaded: &Loaded) -> RunRecord {
        let workflow = loaded.run.workflow();
        RunRecord {
            run_id: loaded.header.run_id.clone(),
            workflow_id: loaded.header.workflow_id.clone(),
            status: loaded
                .finished_as
                .clone()
                .unwrap_or_else(|| loaded.run.status().as_str().into()),
            error: loaded.run.error().unwrap_or_default().into(),
            context: json(&loaded.run.context().visible_serializer()),
            steps: record::step_states(workflow, &loaded.steps),
            waiting: record::waiting(&loaded.run, |agent| self.inner.hub.serves(agent)),
            state_sha256: loaded.state_sha256.clone(),
            created_ms: loaded.header.created_ms,
            updated_ms: loaded.updated_ms,
            memory: json(&record::memory(&loaded.run)),
            trace_id: traces::trace_id_of(&loaded.header.traceparent),
            submitted_by: loaded.header.submitted_by.clone(),
            usage: record::usage_totals(loaded.steps.values()),
        }
    }
}
