//! Map steps end to end on real processes: a private `redis-server`, the `baton coordinator`,
//! two `baton worker`s and `command` agents (`tests/agents/map-item.sh`) that log when each
//! item starts and ends. The items spread over both workers, never more than `max_concurrency`
//! run at once, and a run that failed at one item is retried with `baton runs retry`: that item
//! alone runs again, every other item ran exactly once.

#[path = "support/cluster.rs"]
mod harness;
#[path = "support/spec.rs"]
mod spec;

use std::collections::{BTreeMap, BTreeSet};

use baton_proto::v1::{GetRunRequest, RetryRunRequest};
use harness::{Cluster, Records, Watch, baton, context, output, step};
use redis::AsyncCommands;
use serde_json::{Value, json};
use tonic::Code;

const ITEMS: usize = 12;
const CAP: usize = 3;

/// One line of `items.log`.
#[derive(Debug, Clone)]
struct Logged {
    start: bool,
    run_id: String,
    item: usize,
    visit: u32,
    worker: String,
    at_ms: u64,
}

fn logged(records: &Records) -> Vec<Logged> {
    let text = std::fs::read_to_string(records.root().join("items.log")).unwrap_or_default();
    text.lines()
        .map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            Logged {
                start: fields[0] == "start",
                run_id: fields[1].to_owned(),
                item: fields[2].parse().unwrap(),
                visit: fields[3].parse().unwrap(),
                worker: fields[4].to_owned(),
                at_ms: fields[5].parse().unwrap(),
            }
        })
        .collect()
}

/// The most items that ran at once, from their start and end times.
fn most_at_once(lines: &[Logged]) -> usize {
    let mut moments: Vec<(u64, i32)> = lines
        .iter()
        .map(|l| (l.at_ms, if l.start { 1 } else { -1 }))
        .collect();
    // At the same millisecond, an end comes before a start: the next item is sent only once
    // the one before it has answered.
    moments.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, change) in moments {
        now += change;
        most = most.max(now);
    }
    most as usize
}

fn map_workflow() -> String {
    json!({"id": "map-e2e", "steps": [
        {"id": "test-each", "type": "map", "items": "input.files", "agent": "tester",
         "max_concurrency": CAP, "tolerated_failures": 0, "output": "file-tests"},
        {"id": "report", "type": "transform", "transform": "context.file-tests.success"}
    ]})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_spread_over_workers_under_the_cap_and_a_retry_runs_only_the_failed_item() {
    let mut cluster = Cluster::start().await;
    let records = Records::new(cluster.dir().join("records"));
    std::fs::write(records.root().join("expect-ends"), (ITEMS - 1).to_string()).unwrap();
    std::fs::write(records.root().join("fail-4"), "").unwrap();
    for worker in ["worker-1", "worker-2"] {
        let agents = records.agents_file(worker, &[("tester", vec!["map-item.sh", "0.2"])]);
        cluster.start_worker(worker, &agents, 2);
    }
    cluster.wait_for_workers(&["worker-1", "worker-2"]).await;
    let mut client = cluster.client().await;
    let files: Vec<String> = (0..ITEMS).map(|i| format!("src/f{i}.rs")).collect();
    let run_id = harness::submit(&mut client, map_workflow(), &json!({ "files": files })).await;

    // The run fails at the map: item 4 failed, and no failure is tolerated.
    let failed = Watch::start(&mut client, &run_id).await.finished().await;
    assert_eq!(failed.status, "failed", "{failed:#?}");
    assert!(
        failed
            .error
            .contains("1 of 12 items failed; tolerated_failures is 0"),
        "{}",
        failed.error
    );
    let map = step(&failed, "test-each");
    let items = map
        .items
        .as_ref()
        .expect("a map step's record counts its items");
    assert_eq!((items.count, items.succeeded, items.failed), (12, 11, 1));
    let data = &context(&failed)["file-tests"]["data"];
    assert_eq!(data[4]["status"], "rejected");
    assert!(
        data[4]["error"].as_str().unwrap().contains("told to fail"),
        "{data}"
    );

    let first = logged(&records);
    assert_eq!(
        first.len(),
        2 * ITEMS,
        "every item started and ended once: {first:#?}"
    );
    assert!(
        most_at_once(&first) <= CAP,
        "more than {CAP} items ran at once: {first:#?}"
    );
    let workers: BTreeSet<&str> = first.iter().map(|l| l.worker.as_str()).collect();
    assert_eq!(
        workers,
        BTreeSet::from(["worker-1", "worker-2"]),
        "the items spread over both workers"
    );

    // Retried from the command line, as the README shows: item 4 alone runs again.
    std::fs::remove_file(records.root().join("fail-4")).unwrap();
    let retried = output(
        baton().args([
            "runs",
            "retry",
            &run_id,
            "--watch",
            "--coordinator",
            cluster.url(),
        ]),
        None,
    );
    let printed = String::from_utf8_lossy(&retried.stdout).into_owned();
    assert!(
        retried.status.success(),
        "{printed}\n{}",
        String::from_utf8_lossy(&retried.stderr)
    );
    assert!(
        printed.contains("redriven"),
        "the redrive is told: {printed}"
    );
    assert!(printed.contains("(12 items, 0 failed)"), "{printed}");
    let record = client
        .get_run(GetRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(record.status, "succeeded", "{record:#?}");
    assert_eq!(step(&record, "test-each").visits, 2);
    let data = context(&record)["file-tests"].clone();
    assert_eq!(data["success"], true);
    let entries = data["data"].as_array().unwrap();
    assert_eq!(entries.len(), ITEMS);
    for (i, entry) in entries.iter().enumerate() {
        assert_eq!(entry["index"], i, "item order: {data}");
        assert_eq!(entry["result"]["item"], i, "{data}");
    }

    // Every item ran exactly once, except item 4: once in each visit of the map.
    let runs_of: BTreeMap<usize, Vec<u32>> = logged(&records)
        .iter()
        .filter(|l| l.start && l.run_id == run_id)
        .fold(BTreeMap::new(), |mut by_item, l| {
            by_item.entry(l.item).or_insert_with(Vec::new).push(l.visit);
            by_item
        });
    for item in 0..ITEMS {
        let expected = if item == 4 { vec![1, 2] } else { vec![1] };
        assert_eq!(runs_of[&item], expected, "item {item}: {runs_of:?}");
    }

    // The event log holds the redrive, and the state chain still holds.
    let mut redis = cluster.redis_connection().await;
    let events: Vec<String> = redis
        .lrange(format!("baton:run:{{{run_id}}}:events"), 0, -1)
        .await
        .unwrap();
    let redrives: Vec<Value> = events
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter(|e| e["event"] == "redrive")
        .collect();
    assert_eq!(redrives.len(), 1, "{events:#?}");
    let verified = output(
        baton().args(["runs", "verify", &run_id, "--coordinator", cluster.url()]),
        None,
    );
    assert!(
        verified.status.success(),
        "{}",
        String::from_utf8_lossy(&verified.stdout)
    );

    // A run that did not fail cannot be retried.
    let refused = client
        .retry_run(RetryRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("only a failed run can be retried"),
        "{}",
        refused.message()
    );
}
