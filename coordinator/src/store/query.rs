//! What [`Listing::list_runs`](super::Listing::list_runs) takes and gives: a [`RunQuery`] (filters,
//! a page size, where to start) and a [`RunPage`] (the runs, and where the next page starts);
//! and [`PageFill`], the walk over an index both stores share, so that they cut pages alike.

use baton_core::RunStatus;

use super::RunSummary;

/// One page of runs to list, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunQuery {
    /// At most this many runs; 0 gives an empty page.
    pub limit: usize,
    /// Start strictly after this position (the `next` of the page before); `None` starts with
    /// the newest run.
    pub after: Option<RunCursor>,
    /// Only runs whose status is this one.
    pub status: Option<RunStatus>,
    /// Only runs created with this workflow id.
    pub workflow_id: Option<String>,
}

impl RunQuery {
    /// The newest `limit` runs, whatever their status and workflow.
    pub fn newest(limit: usize) -> RunQuery {
        RunQuery {
            limit,
            ..RunQuery::default()
        }
    }
}

/// A position in the list of runs: a run's creation time and id. Runs are listed newest first,
/// equal times in descending run id order, so "after" a position means "less than it" in this
/// type's order (ascending `created_ms`, then `run_id`, compared as bytes).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunCursor {
    pub created_ms: i64,
    pub run_id: String,
}

/// How long a page token may be: a creation time, a dot and a run id (a UUID for the runs a
/// coordinator makes) fit many times over.
const MAX_TOKEN_BYTES: usize = 256;

impl RunCursor {
    /// The position of `run`.
    pub fn of(run: &RunSummary) -> RunCursor {
        RunCursor {
            created_ms: run.created_ms,
            run_id: run.run_id.clone(),
        }
    }

    /// Whether this position comes after `cursor` in the list (`None`: the list's start).
    pub fn is_after(&self, cursor: Option<&RunCursor>) -> bool {
        cursor.is_none_or(|cursor| self < cursor)
    }

    /// The position as a page token for clients: `<created_ms>.<run_id>`. Clients are told it
    /// is opaque, so its form may change; [`RunCursor::from_token`] reads it back.
    pub fn token(&self) -> String {
        format!("{}.{}", self.created_ms, self.run_id)
    }

    /// A token of [`RunCursor::token`]; `None` when it is not one. A well-formed token of a
    /// run that does not exist is still a position: the page starts after it.
    pub fn from_token(token: &str) -> Option<RunCursor> {
        if token.len() > MAX_TOKEN_BYTES {
            return None;
        }
        let (created_ms, run_id) = token.split_once('.')?;
        // `i64::from_str` takes a leading `+`, which `token` never writes.
        if run_id.is_empty() || created_ms.starts_with('+') {
            return None;
        }
        Some(RunCursor {
            created_ms: created_ms.parse().ok()?,
            run_id: run_id.to_owned(),
        })
    }
}

/// A page of runs, and where the next one starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunPage {
    /// Newest first.
    pub runs: Vec<RunSummary>,
    /// Where the next page starts (its [`RunQuery::after`]); `None` when the list is over.
    pub next: Option<RunCursor>,
}

/// The run status named `name` (`running`, `succeeded`, `failed`, `cancelled`), if any.
pub fn run_status(name: &str) -> Option<RunStatus> {
    [
        RunStatus::Running,
        RunStatus::Succeeded,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ]
    .into_iter()
    .find(|status| status.as_str() == name)
}

/// The fewest index entries a page that filters by status may look at before it stops (the
/// store contract's bound; [`scan_budget`]).
pub const MIN_SCAN_BUDGET: usize = 1_000;

/// How many index entries a page of `limit` runs looks at, at most, when the index it walks
/// holds runs that may not match: ten per run asked for, and at least [`MIN_SCAN_BUDGET`].
pub fn scan_budget(limit: usize) -> usize {
    limit.saturating_mul(10).max(MIN_SCAN_BUDGET)
}

/// A page being filled from an index, newest first: offered each entry in order, it keeps the
/// runs that match the query, and stops when the page is full or the entries it may look at
/// are used up.
pub(crate) struct PageFill<'q> {
    query: &'q RunQuery,
    runs: Vec<RunSummary>,
    /// How many more entries it may look at.
    budget: usize,
    /// The last entry looked at: where the next page starts if this one stops early.
    last: Option<RunCursor>,
}

impl<'q> PageFill<'q> {
    /// A page of `query` that looks at up to [`scan_budget`] entries when `bounded`, else at as
    /// many as it takes (an index that holds only matching runs, give or take a stale entry).
    pub(crate) fn new(query: &'q RunQuery, bounded: bool) -> PageFill<'q> {
        PageFill {
            query,
            runs: Vec::new(),
            budget: if bounded {
                scan_budget(query.limit)
            } else {
                usize::MAX
            },
            last: None,
        }
    }

    /// Whether it looks at another entry: the page has room and the budget is not spent.
    pub(crate) fn wants_more(&self) -> bool {
        self.runs.len() < self.query.limit && self.budget > 0
    }

    /// How many entries to read for the next batch: what would fill the page if they all
    /// matched, more (up to `filtered_batch`) when a status filter may skip most of them, never
    /// beyond the budget.
    pub(crate) fn batch_size(&self, filtered_batch: usize) -> usize {
        let room = self.query.limit.saturating_sub(self.runs.len());
        let batch = if self.query.status.is_some() {
            room.max(filtered_batch)
        } else {
            room
        };
        batch.min(self.budget)
    }

    /// The entry at `position`, and its run as the store has it (`None`: the index is behind
    /// and the run is gone). Call only while [`PageFill::wants_more`].
    pub(crate) fn offer(&mut self, position: RunCursor, run: Option<RunSummary>) {
        debug_assert!(self.wants_more());
        self.budget -= 1;
        if let Some(run) = run.filter(|run| self.matches(run, &position)) {
            self.runs.push(run);
        }
        self.last = Some(position);
    }

    /// The page, given whether the index holds entries after the last one offered.
    pub(crate) fn finish(self, more: bool) -> RunPage {
        RunPage {
            runs: self.runs,
            next: self.last.filter(|_| more),
        }
    }

    /// An index may lag the runs (a status that changed since, an id reused by another run),
    /// so the run itself is checked against every filter.
    fn matches(&self, run: &RunSummary, position: &RunCursor) -> bool {
        run.run_id == position.run_id
            && self.query.status.is_none_or(|status| run.status == status)
            && self
                .query
                .workflow_id
                .as_ref()
                .is_none_or(|workflow_id| &run.workflow_id == workflow_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(run_id: &str, created_ms: i64, status: &str) -> RunSummary {
        RunSummary {
            run_id: run_id.to_owned(),
            workflow_id: "wf".to_owned(),
            status: run_status(status).expect("a run status"),
            created_ms,
            updated_ms: created_ms,
        }
    }

    #[test]
    fn tokens_read_back_and_refuse_what_they_are_not() {
        for cursor in [
            RunCursor {
                created_ms: 1_795_428_000_000,
                run_id: "0b7f6a9e-2f1c-4c55-9d27-4ad1e6f5c001".to_owned(),
            },
            RunCursor {
                created_ms: -5,
                run_id: "a.b.c".to_owned(),
            },
        ] {
            assert_eq!(RunCursor::from_token(&cursor.token()), Some(cursor));
        }
        let too_long = format!("1.{}", "r".repeat(MAX_TOKEN_BYTES));
        for malformed in [
            "",
            "123",
            "123.",
            ".run",
            "x.run",
            "+1.run",
            "1e3.run",
            "99999999999999999999.run",
            too_long.as_str(),
        ] {
            assert_eq!(RunCursor::from_token(malformed), None, "{malformed:?}");
        }
    }

    #[test]
    fn positions_order_newest_first_with_ties_by_run_id() {
        let newer = RunCursor {
            created_ms: 2,
            run_id: "a".to_owned(),
        };
        let tie_high = RunCursor {
            created_ms: 1,
            run_id: "b".to_owned(),
        };
        let tie_low = RunCursor {
            created_ms: 1,
            run_id: "a".to_owned(),
        };
        assert!(tie_high.is_after(Some(&newer)));
        assert!(tie_low.is_after(Some(&tie_high)));
        assert!(!tie_high.is_after(Some(&tie_high)));
        assert!(!newer.is_after(Some(&tie_low)));
        assert!(newer.is_after(None));
    }

    #[test]
    fn statuses_are_named_as_stored() {
        for status in ["running", "succeeded", "failed", "cancelled"] {
            assert_eq!(run_status(status).map(RunStatus::as_str), Some(status));
        }
        assert_eq!(run_status("Running"), None);
        assert_eq!(run_status(""), None);
    }

    #[test]
    fn a_full_page_continues_after_its_last_run_only_if_more_follow() {
        let query = RunQuery::newest(2);
        let mut fill = PageFill::new(&query, true);
        for (id, at) in [("c", 3), ("b", 2)] {
            fill.offer(
                RunCursor::of(&run(id, at, "running")),
                Some(run(id, at, "running")),
            );
        }
        assert!(!fill.wants_more());
        let page = fill.finish(true);
        assert_eq!(page.runs.len(), 2);
        assert_eq!(page.next, Some(RunCursor::of(&run("b", 2, "running"))));

        let mut fill = PageFill::new(&query, true);
        fill.offer(
            RunCursor::of(&run("a", 1, "failed")),
            Some(run("a", 1, "failed")),
        );
        assert!(fill.wants_more());
        assert_eq!(fill.finish(false).next, None);
    }

    #[test]
    fn a_filtered_page_stops_at_its_budget_where_it_looked_last() {
        let query = RunQuery {
            limit: 5,
            status: Some(RunStatus::Failed),
            ..RunQuery::default()
        };
        let mut fill = PageFill::new(&query, true);
        assert_eq!(fill.batch_size(100), 100);
        let mut at = 1_000_000;
        while fill.wants_more() {
            at -= 1;
            let id = format!("{at}");
            let status = if at % 400 == 0 { "failed" } else { "succeeded" };
            fill.offer(
                RunCursor {
                    created_ms: at,
                    run_id: id.clone(),
                },
                Some(run(&id, at, status)),
            );
        }
        let page = fill.finish(true);
        assert_eq!(1_000_000 - at, MIN_SCAN_BUDGET as i64);
        assert_eq!(page.runs.len(), 2, "{page:?}");
        assert_eq!(page.next.map(|next| next.created_ms), Some(at));
    }

    #[test]
    fn a_stale_entry_is_skipped_but_counts_as_looked_at() {
        let query = RunQuery {
            limit: 3,
            status: Some(RunStatus::Running),
            workflow_id: Some("wf".to_owned()),
            ..RunQuery::default()
        };
        let mut fill = PageFill::new(&query, false);
        let position = RunCursor {
            created_ms: 9,
            run_id: "gone".to_owned(),
        };
        fill.offer(position.clone(), None);
        fill.offer(
            RunCursor::of(&run("ended", 8, "succeeded")),
            Some(run("ended", 8, "succeeded")),
        );
        let other_workflow = RunSummary {
            workflow_id: "other".to_owned(),
            ..run("other", 7, "running")
        };
        fill.offer(RunCursor::of(&other_workflow), Some(other_workflow));
        fill.offer(
            RunCursor::of(&run("kept", 6, "running")),
            Some(run("kept", 6, "running")),
        );
        let page = fill.finish(true);
        assert_eq!(page.runs, vec![run("kept", 6, "running")]);
        assert_eq!(page.next.map(|next| next.run_id).as_deref(), Some("kept"));
    }
}
