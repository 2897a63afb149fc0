//! [`Listing`] in memory: the runs walked as the Redis store walks its indexes, so that both
//! cut pages alike.

use std::collections::BTreeMap;

use baton_core::RunStatus;

use super::MemoryStore;
use crate::store::query::PageFill;
use crate::store::{Error, Listing, RunCursor, RunPage, RunQuery, RunSummary, StoredRun};

fn summary(run: &StoredRun) -> RunSummary {
    RunSummary {
        run_id: run.header.run_id.clone(),
        workflow_id: run.header.workflow_id.clone(),
        status: run.status,
        created_ms: run.header.created_ms,
        updated_ms: run.updated_ms,
    }
}

impl Listing for MemoryStore {
    /// Walks the runs as the Redis store walks its indexes, so that both cut pages alike: the
    /// runs of the workflow (or all), the running ones alone for `running` (the active index,
    /// exact here), and with another status a walk bounded by the scan budget.
    async fn list_runs(&self, query: RunQuery) -> Result<RunPage, Error> {
        let runs = self.runs.lock().expect("store lock");
        let running_only = query.status == Some(RunStatus::Running);
        let mut index: Vec<(RunCursor, &StoredRun)> = runs
            .values()
            .map(|entry| &entry.run)
            .filter(|run| {
                query
                    .workflow_id
                    .as_ref()
                    .is_none_or(|workflow_id| &run.header.workflow_id == workflow_id)
            })
            .filter(|run| !running_only || run.status == RunStatus::Running)
            .map(|run| {
                let position = RunCursor {
                    created_ms: run.header.created_ms,
                    run_id: run.header.run_id.clone(),
                };
                (position, run)
            })
            .filter(|(position, _)| position.is_after(query.after.as_ref()))
            .collect();
        index.sort_by(|(a, _), (b, _)| b.cmp(a));
        let mut fill = PageFill::new(&query, !running_only);
        let mut entries = index.into_iter().peekable();
        while fill.wants_more()
            && let Some((position, run)) = entries.next()
        {
            fill.offer(position, Some(summary(run)));
        }
        Ok(fill.finish(entries.peek().is_some()))
    }

    async fn active_runs(&self) -> Result<Vec<String>, Error> {
        let runs = self.runs.lock().expect("store lock");
        Ok(runs
            .values()
            .filter(|entry| entry.run.status == RunStatus::Running)
            .map(|entry| entry.run.header.run_id.clone())
            .collect())
    }

    async fn decisions(&self, run_id: &str) -> Result<BTreeMap<String, Vec<u8>>, Error> {
        let runs = self.runs.lock().expect("store lock");
        Ok(runs
            .get(run_id)
            .map(|entry| entry.decisions.clone())
            .unwrap_or_default())
    }

    async fn runs_of_workflow(
        &self,
        workflow_id: &str,
        limit: usize,
    ) -> Result<Vec<String>, Error> {
        let runs = self.runs.lock().expect("store lock");
        let mut matching: Vec<(i64, &String)> = runs
            .values()
            .filter(|entry| entry.run.header.workflow_id == workflow_id)
            .map(|entry| (entry.run.header.created_ms, &entry.run.header.run_id))
            .collect();
        matching.sort_by(|a, b| b.cmp(a));
        Ok(matching
            .into_iter()
            .take(limit)
            .map(|(_, id)| id.clone())
            .collect())
    }
}
