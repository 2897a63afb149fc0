//! [`Listing`](baton_coordinator::store::Listing): pages of runs newest first, walked from a
//! cursor, filtered by status and workflow; the running runs; a workflow's runs.

use std::sync::Arc;

use baton_coordinator::store::{
    MIN_SCAN_BUDGET, RunCursor, RunHeader, RunQuery, RunSummary, Store, TransitionWrite,
    scan_budget,
};
use baton_core::RunStatus;

use super::redis_cluster;
use super::support::*;

/// Creates a run of `workflow_id` with `status` from its first transition on.
async fn create_in<S: Store>(
    store: &S,
    run_id: &str,
    created_ms: i64,
    workflow_id: &str,
    status: &str,
) {
    let header = RunHeader {
        workflow_id: workflow_id.to_owned(),
        ..header(run_id, created_ms)
    };
    let first = TransitionWrite {
        status: baton_coordinator::store::run_status(status).expect("a run status"),
        ..start(created_ms)
    };
    store
        .create_run(header, first)
        .await
        .unwrap_or_else(|err| panic!("create {run_id}: {err}"));
}

pub(crate) async fn list_runs_newest_first_and_limited<S: Store>(store: Arc<S>) {
    assert!(newest(&*store, 10).await.is_empty());
    for (run_id, created_ms) in [
        ("run-a", 100),
        ("run-b", 300),
        ("run-c", 200),
        ("run-d", 50),
        ("run-e", 400),
    ] {
        create(&*store, run_id, created_ms, start(created_ms)).await;
    }
    store
        .apply_transition("run-c", 1, status_write("succeeded", "done", 900))
        .await
        .unwrap();

    let ids = |summaries: Vec<RunSummary>| {
        summaries
            .into_iter()
            .map(|summary| summary.run_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ids(newest(&*store, 3).await),
        strings(&["run-e", "run-b", "run-c"])
    );
    assert_eq!(
        ids(newest(&*store, 100).await),
        strings(&["run-e", "run-b", "run-c", "run-a", "run-d"])
    );
    assert_eq!(
        ids(newest(&*store, 5).await),
        strings(&["run-e", "run-b", "run-c", "run-a", "run-d"])
    );
    assert_eq!(newest(&*store, usize::MAX).await.len(), 5);
    assert!(newest(&*store, 0).await.is_empty());

    let summaries = newest(&*store, 3).await;
    assert_eq!(
        summaries[2],
        RunSummary {
            run_id: "run-c".to_owned(),
            workflow_id: "wf-run-c".to_owned(),
            status: baton_core::RunStatus::Succeeded.to_owned(),
            created_ms: 200,
            updated_ms: 900,
        }
    );
    assert_eq!(summaries[0].status, baton_core::RunStatus::Running);
    assert_eq!(summaries[0].updated_ms, 400);
}

pub(crate) async fn list_runs_pages_walk_every_run_once_in_order<S: Store>(store: Arc<S>) {
    // 23 runs, three to a millisecond, whose ids do not sort as they were created: ties are
    // broken by run id, and on a cluster they sit in different shards of the index.
    let mut runs: Vec<Listed> = Vec::new();
    for n in 0..23i64 {
        let run_id = format!("run-{:02}", (n * 7) % 23);
        let created_ms = T + n / 3;
        create(&*store, &run_id, created_ms, start(created_ms)).await;
        runs.push((
            run_id.clone(),
            format!("wf-{run_id}"),
            "running".into(),
            created_ms,
        ));
    }
    let all = expected(&runs, None, None);
    for limit in [1, 2, 3, 5, 7, 23, 50] {
        let mut query = RunQuery::newest(limit);
        let mut walked = Vec::new();
        loop {
            let page = store.list_runs(query.clone()).await.unwrap();
            let left = all.len() - walked.len();
            // No filter: every page is full but the last, which ends the list.
            assert_eq!(page.runs.len(), limit.min(left), "limit {limit}");
            walked.extend(listed(&page.runs));
            match page.next {
                Some(next) => {
                    assert!(
                        walked.len() < all.len(),
                        "limit {limit}: a next after the end"
                    );
                    assert_eq!(next, RunCursor::of(page.runs.last().unwrap()));
                    query.after = Some(next);
                }
                None => break,
            }
        }
        assert_eq!(walked, all, "limit {limit}");
    }

    // A cursor is a position: from a run in the middle of a tie, the rest of the tie follows.
    let middle = &all[10];
    let rest = every_page(
        &*store,
        RunQuery {
            after: Some(RunCursor {
                created_ms: middle.3,
                run_id: middle.0.clone(),
            }),
            ..RunQuery::newest(4)
        },
    )
    .await;
    assert_eq!(listed(&rest), all[11..]);
}

pub(crate) async fn list_runs_pages_through_runs_crowded_in_one_index_shard<S: Store>(
    store: Arc<S>,
) {
    // On a cluster an index is 256 shards, and a page reads a few entries of each at a time: 60
    // runs in one shard (by their slot) among 20 elsewhere make a page read that shard again
    // and again, with ties on the way. On one server or in memory it is just 80 runs.
    let mut crowded = Vec::new();
    for n in 0.. {
        let run_id = format!("crowd-{n}");
        if redis_cluster::slot_of(&format!("{{{run_id}}}")).is_multiple_of(256) {
            crowded.push(run_id);
            if crowded.len() == 60 {
                break;
            }
        }
    }
    let spread = (0..20).map(|n| format!("spread-{n}"));
    let mut runs: Vec<Listed> = Vec::new();
    for (n, run_id) in crowded.into_iter().chain(spread).enumerate() {
        let created_ms = T + (n as i64 * 7) % 30;
        let status = ["failed", "succeeded"][n % 2];
        create_in(&*store, &run_id, created_ms, "wf", status).await;
        runs.push((run_id, "wf".into(), status.into(), created_ms));
    }
    for limit in [7, 25] {
        for status in [None, Some(RunStatus::Failed)] {
            let query = RunQuery {
                status,
                ..RunQuery::newest(limit)
            };
            let got = every_page(&*store, query).await;
            assert_eq!(
                listed(&got),
                expected(&runs, status, None),
                "{status:?} {limit}"
            );
        }
    }
}

pub(crate) async fn list_runs_filter_by_status_and_workflow<S: Store>(store: Arc<S>) {
    // 24 runs over two workflows and the four statuses (three of each pair), two of a
    // workflow to a millisecond. Every run starts running and reaches its status by
    // transitions; some running ones fail and are retried, so the status filter follows the
    // status a run has now, not one it had.
    let statuses = ["running", "succeeded", "failed", "cancelled"];
    let mut runs: Vec<Listed> = Vec::new();
    for n in 0..24i64 {
        let run_id = format!("run-{:02}", (n * 5) % 24);
        let workflow_id = ["wf-a", "wf-b"][(n % 2) as usize];
        let status = statuses[((n / 2) % 4) as usize];
        let created_ms = T + n / 4;
        create_in(&*store, &run_id, created_ms, workflow_id, "running").await;
        let mut version = 1;
        let mut path = vec![status];
        if status == "running" && n % 3 == 0 {
            path = vec!["failed", "running"];
        }
        for (step, status) in path.into_iter().enumerate() {
            if status == "running" && step == 0 {
                continue;
            }
            version = store
                .apply_transition(
                    &run_id,
                    version,
                    status_write(status, status, created_ms + 10),
                )
                .await
                .unwrap();
        }
        runs.push((run_id, workflow_id.into(), status.into(), created_ms));
    }
    let status_filters = [
        None,
        Some(RunStatus::Running),
        Some(RunStatus::Succeeded),
        Some(RunStatus::Failed),
        Some(RunStatus::Cancelled),
    ];
    for status in status_filters {
        for workflow_id in [None, Some("wf-a"), Some("wf-b"), Some("wf-none")] {
            let want = expected(&runs, status, workflow_id);
            if workflow_id != Some("wf-none") {
                assert!(!want.is_empty(), "{status:?} {workflow_id:?}");
            }
            for limit in [2, 5] {
                let query = RunQuery {
                    limit,
                    after: None,
                    status,
                    workflow_id: workflow_id.map(str::to_owned),
                };
                let got = every_page(&*store, query).await;
                assert_eq!(
                    listed(&got),
                    want,
                    "{status:?} {workflow_id:?} limit {limit}"
                );
            }
        }
    }
}

pub(crate) async fn a_status_filter_over_many_other_runs_gives_a_short_page_that_goes_on<
    S: Store,
>(
    store: Arc<S>,
) {
    // A failed run, then more succeeded runs than a page looks at, then another failed run:
    // the first page stops where its budget ends, with only the first, and the next goes on.
    let limit = 5;
    let budget = scan_budget(limit);
    assert_eq!(budget, MIN_SCAN_BUDGET);
    let between = budget + 100;
    let count = between + 2;
    let mut creating = tokio::task::JoinSet::new();
    let mut runs: Vec<Listed> = Vec::new();
    for n in 0..count {
        let status = if n == 0 || n == count - 1 {
            "failed"
        } else {
            "succeeded"
        };
        // Newest first: run n is created at T - n.
        let created_ms = T - n as i64;
        let run_id = format!("run-{n:05}");
        runs.push((run_id.clone(), "bulk".into(), status.into(), created_ms));
        let store = store.clone();
        creating.spawn(async move {
            create_in(&*store, &run_id, created_ms, "bulk", status).await;
        });
        if creating.len() >= 32 {
            creating.join_next().await.unwrap().unwrap();
        }
    }
    creating.join_all().await;
    create_in(&*store, "other-failed", T - 5, "other", "failed").await;

    for workflow_id in [None, Some("bulk")] {
        let query = RunQuery {
            limit,
            status: Some(RunStatus::Failed),
            workflow_id: workflow_id.map(str::to_owned),
            after: None,
        };
        let first = store.list_runs(query.clone()).await.unwrap();
        let mut failed_first = vec!["run-00000"];
        if workflow_id.is_none() {
            failed_first.push("other-failed");
        }
        assert_eq!(
            first
                .runs
                .iter()
                .map(|run| run.run_id.as_str())
                .collect::<Vec<_>>(),
            failed_first,
            "{workflow_id:?}"
        );
        // It looked at `budget` runs, newest first (the other workflow's one among them when
        // unfiltered), and goes on after the last of them.
        let looked_at = if workflow_id.is_none() {
            budget - 1
        } else {
            budget
        };
        let last_looked_at = &runs[looked_at - 1];
        assert_eq!(
            first.next,
            Some(RunCursor {
                created_ms: last_looked_at.3,
                run_id: last_looked_at.0.clone(),
            }),
            "{workflow_id:?}"
        );
        let second = store
            .list_runs(RunQuery {
                after: first.next.clone(),
                ..query.clone()
            })
            .await
            .unwrap();
        assert_eq!(
            second
                .runs
                .iter()
                .map(|run| run.run_id.as_str())
                .collect::<Vec<_>>(),
            [format!("run-{:05}", count - 1)],
            "{workflow_id:?}"
        );
        assert_eq!(second.next, None, "{workflow_id:?}");
    }
}

pub(crate) async fn an_unknown_cursor_or_workflow_gives_an_empty_page<S: Store>(store: Arc<S>) {
    for (run_id, created_ms) in [("run-a", T), ("run-b", T + 10), ("run-c", T + 20)] {
        create(&*store, run_id, created_ms, start(created_ms)).await;
    }
    let from = |created_ms: i64, run_id: &str| RunQuery {
        after: Some(RunCursor {
            created_ms,
            run_id: run_id.to_owned(),
        }),
        ..RunQuery::newest(10)
    };
    let ids = |runs: Vec<RunSummary>| runs.into_iter().map(|run| run.run_id).collect::<Vec<_>>();

    // A cursor older than every run, of a run that never was: an empty page that ends.
    let page = store.list_runs(from(T - 1, "no-such-run")).await.unwrap();
    assert!(page.runs.is_empty() && page.next.is_none(), "{page:?}");
    // Between two runs, it is still a position.
    let page = store.list_runs(from(T + 15, "no-such-run")).await.unwrap();
    assert_eq!(ids(page.runs), ["run-b", "run-a"]);
    assert_eq!(page.next, None);
    // Newer than every run: all of them.
    let page = store.list_runs(from(i64::MAX, "")).await.unwrap();
    assert_eq!(ids(page.runs), ["run-c", "run-b", "run-a"]);

    // A workflow no run has, with every status filter.
    for status in [None, Some(RunStatus::Running), Some(RunStatus::Failed)] {
        let page = store
            .list_runs(RunQuery {
                status,
                workflow_id: Some("no-such-workflow".into()),
                ..RunQuery::newest(10)
            })
            .await
            .unwrap();
        assert!(
            page.runs.is_empty() && page.next.is_none(),
            "{status:?}: {page:?}"
        );
    }
    // A page of no runs.
    let page = store.list_runs(RunQuery::newest(0)).await.unwrap();
    assert!(page.runs.is_empty() && page.next.is_none(), "{page:?}");
}

pub(crate) async fn active_runs_follow_status<S: Store>(store: Arc<S>) {
    assert!(store.active_runs().await.unwrap().is_empty());
    create(&*store, "run-a", 1, start(1)).await;
    create(&*store, "run-b", 2, start(2)).await;
    create(
        &*store,
        "run-c",
        3,
        TransitionWrite {
            status: baton_core::RunStatus::Succeeded.to_owned(),
            ..start(3)
        },
    )
    .await;
    create(&*store, "run-d", 4, start(4)).await;
    assert_eq!(
        sorted(store.active_runs().await.unwrap()),
        strings(&["run-a", "run-b", "run-d"])
    );

    // run-b ends.
    store
        .apply_transition("run-b", 1, status_write("succeeded", "done", 10))
        .await
        .unwrap();
    assert_eq!(
        sorted(store.active_runs().await.unwrap()),
        strings(&["run-a", "run-d"])
    );

    // run-a stays running through a transition, then pauses and resumes.
    store
        .apply_transition("run-a", 1, status_write("running", "step", 11))
        .await
        .unwrap();
    assert_eq!(
        sorted(store.active_runs().await.unwrap()),
        strings(&["run-a", "run-d"])
    );
    store
        .apply_transition("run-a", 2, status_write("failed", "fail", 12))
        .await
        .unwrap();
    assert_eq!(
        sorted(store.active_runs().await.unwrap()),
        strings(&["run-d"])
    );
    store
        .apply_transition("run-a", 3, status_write("running", "retry", 13))
        .await
        .unwrap();
    assert_eq!(
        sorted(store.active_runs().await.unwrap()),
        strings(&["run-a", "run-d"])
    );

    // run-d fails; a refused transition changes nothing.
    let failed = TransitionWrite {
        error: Some("boom".to_owned()),
        ..status_write("failed", "failed", 14)
    };
    store.apply_transition("run-d", 1, failed).await.unwrap();
    assert!(
        store
            .apply_transition("run-a", 1, status_write("failed", "stale", 15))
            .await
            .is_err()
    );
    assert_eq!(store.active_runs().await.unwrap(), strings(&["run-a"]));
}

pub(crate) async fn runs_of_workflow_newest_first_and_limited<S: Store>(store: Arc<S>) {
    for (run_id, created_ms) in [("a", 1), ("b", 3), ("c", 2)] {
        let mut header = header(run_id, created_ms);
        header.workflow_id = "review".to_owned();
        store.create_run(header, start(created_ms)).await.unwrap();
    }
    create(&*store, "other", 4, start(4)).await;
    assert_eq!(
        store.runs_of_workflow("review", 10).await.unwrap(),
        strings(&["b", "c", "a"])
    );
    assert_eq!(
        store.runs_of_workflow("review", 2).await.unwrap(),
        strings(&["b", "c"])
    );
    assert!(
        store
            .runs_of_workflow("nothing", 10)
            .await
            .unwrap()
            .is_empty()
    );
}
