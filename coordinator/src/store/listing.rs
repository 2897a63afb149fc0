//! Runs listed and looked up across runs: the [`Listing`] trait and a line of a listing
//! ([`RunSummary`]). What `list_runs` takes and gives is in `query.rs`.

use std::collections::BTreeMap;

use baton_core::RunStatus;

use super::declare::store_trait;
use super::{Error, RunPage, RunQuery};

store_trait! {
    /// Reads over many runs (the list of runs, the running ones, a workflow's) and a run's
    /// decisions, which decision queries read over a workflow's runs.
    ///
    /// Contract, for every implementation:
    /// - A run is listed from its creation on ([`Runs::create_run`] says how a store makes
    ///   sure of it).
    /// - A store may keep indexes apart from its runs, as Redis does; they are not the source
    ///   of truth, and readers never list what the runs themselves contradict (an entry whose
    ///   run does not exist, or no longer matches).
    ///
    /// [`Runs::create_run`]: super::Runs::create_run
    pub trait Listing {
        /// One page of runs ([`RunQuery`] -> [`RunPage`]), newest first: descending
        /// `created_ms`, equal times in descending `run_id` (compared as bytes). The page holds
        /// up to `limit` runs that match every filter given (`status`, `workflow_id`), strictly
        /// after `after` in that order. `next` is where the next page starts: the position of
        /// the last entry the page looked at, given only while entries follow it; `None` when
        /// the list is over. Following `next` from the start lists every run that matches
        /// exactly once, in order, whatever the page size, as long as runs are not created
        /// meanwhile with times older than the position reached (the coordinator stamps runs
        /// with the time they are submitted). A position is a creation time and a run id, not
        /// a reference to a run: a cursor naming a run that does not exist (or no longer
        /// matches) is still a place in the order, and a workflow id no run has gives an empty
        /// page; neither is an error.
        ///
        /// How far a page looks: with no status filter it costs what it returns; with
        /// `running` it looks at the runs that are running only (as many as the workers run at
        /// once, never the finished ones that pile up), and fills its page. With another status
        /// it walks the runs (of the workflow, with a `workflow_id`) and reads their statuses,
        /// and stops after [`scan_budget`]`(limit)` entries (ten per run asked for, at least
        /// [`MIN_SCAN_BUDGET`]) even with the page short, `next` at the last entry it looked
        /// at: a page may be short, or empty, with a `next` that goes on, but never slow. A run
        /// whose status changes while it is listed may be missed or listed on two pages. In a
        /// Redis store the `running` filter reads the active-runs index, which may lag a status
        /// change by one index update (`rebuild_indexes` repairs it); each run listed is
        /// checked against its own status and workflow, so a stale index entry is never listed.
        ///
        /// [`scan_budget`]: super::scan_budget
        /// [`MIN_SCAN_BUDGET`]: super::MIN_SCAN_BUDGET
        async fn list_runs(&self, query: RunQuery) -> Result<RunPage, Error>;

        /// The ids of the runs whose status is `running`.
        async fn active_runs(&self) -> Result<Vec<String>, Error>;

        /// Every decision of a run by key, as first written (empty for an unknown run).
        async fn decisions(&self, run_id: &str) -> Result<BTreeMap<String, Vec<u8>>, Error>;

        /// The ids of the newest `limit` runs created with that workflow id.
        async fn runs_of_workflow(
            &self,
            workflow_id: &str,
            limit: usize,
        ) -> Result<Vec<String>, Error>;
    }
}

/// A line of `ListRuns`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSummary {
    pub run_id: String,
    pub workflow_id: String,
    pub status: RunStatus,
    pub created_ms: i64,
    pub updated_ms: i64,
}
