//! A result is encoded and hashed once (issue 20, point 3): the bytes the transition stores are
//! the bytes every watcher is sent and the bytes of the payload part the next task carries,
//! shared rather than encoded again or copied per receiver; and when the worker sent them as
//! the coordinator encodes them, they are the very bytes it sent, under the digest it sent.

#[path = "support/client.rs"]
mod client;
#[path = "support/fake_worker.rs"]
mod fake_worker;
#[path = "support/running.rs"]
mod running;

use std::time::Duration;

use baton_coordinator::service::RunEvent;
use baton_coordinator::store::Runs;
use baton_coordinator::store::memory::MemoryStore;
use baton_coordinator::{Config, Coordinator};
use baton_proto::v1;
use fake_worker::{FakeWorker, json_bytes};
use futures::StreamExt;
use running::running;
use serde_json::json;

#[tokio::test]
async fn a_result_s_bytes_are_shared_by_the_store_write_its_watchers_and_the_next_task() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["noop"]).await;
    let workflow = json!({"id": "two", "steps": [
        {"id": "a", "type": "agent", "agent": "noop", "next": "b"},
        {"id": "b", "type": "agent", "agent": "noop"}
    ]});
    let run_id = client::submit(
        &coordinator,
        workflow.to_string().as_bytes(),
        &json_bytes(&json!({})),
    )
    .await
    .unwrap();
    let mut events = coordinator.watch(&run_id).await.unwrap();
    let a = worker.wait_task().await;
    let data = json!({"blob": "x".repeat(64 * 1024)});
    let answered = json_bytes(&data);
    let result = v1::TaskResult {
        task_id: a.task_id.clone(),
        outcome: Some(v1::task_result::Outcome::Data(answered.clone())),
        ..Default::default()
    };
    worker.send(&coordinator, result).await.unwrap();

    // The watcher is told a's end with the result as a part: the bytes the store holds.
    let encoded = loop {
        let event = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("a's end within 10 s")
            .expect("the watch goes on")
            .expect("no error");
        if let RunEvent::StepFinished {
            step_id, encoded, ..
        } = &event
            && step_id == "a"
        {
            let told = v1::RunEvent::from(event.clone());
            let Some(v1::run_event::Event::StepFinished(finished)) = told.event else {
                panic!("{told:?}");
            };
            let part = encoded.clone().expect("a new result's part");
            let sent = finished.data.expect("the data");
            assert_eq!(sent.json.as_ptr(), part.json.as_ptr(), "not a copy");
            assert_eq!(sent.sha256, part.sha256);
            break part;
        }
    };
    let stored = coordinator
        .store()
        .load_run(&run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.results["a#1"], encoded.json);
    assert_eq!(
        (encoded.json.as_ptr(), &encoded.sha256),
        (answered.json.as_ptr(), &answered.sha256),
        "the bytes and digest the worker sent"
    );
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&encoded.json).unwrap(),
        data
    );

    // b's payload names a's result by that part, and the task carries those very bytes.
    let b = worker.wait_task().await;
    let part = b
        .parts
        .iter()
        .find(|part| part.sha256 == encoded.sha256)
        .expect("b's task carries a's result");
    assert_eq!(part.json.as_ptr(), encoded.json.as_ptr(), "not a copy");
}

/// Small parts travel inline in the manifest (issue 20, point 4), and a long context comes as a
/// change to a listing the worker holds: a chain's 12th task names the one result the 11th
/// added, not eleven. A worker of the protocol before gets the context listed whole.
#[tokio::test]
async fn a_context_is_a_change_to_the_listing_a_worker_holds_and_whole_to_an_older_worker() {
    const STEPS: usize = 12;
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let mut new = FakeWorker::hello_caching(
        &coordinator,
        "new",
        &["now"],
        8,
        Vec::new(),
        baton_proto::WORKER_PROTOCOL,
        1 << 20,
    )
    .await
    .unwrap();
    let old_protocol = baton_proto::LISTING_PROTOCOL - 1;
    assert!(baton_proto::serves_worker_protocol(old_protocol));
    let mut old = FakeWorker::hello_speaking(
        &coordinator,
        "old",
        &["before"],
        8,
        Vec::new(),
        old_protocol,
    )
    .await
    .unwrap();
    let mut tasks = Vec::new();
    for (worker, agent) in [(&mut new, "now"), (&mut old, "before")] {
        let steps: Vec<serde_json::Value> = (0..STEPS)
            .map(|i| json!({"id": format!("s{i:02}"), "type": "agent", "agent": agent}))
            .collect();
        let workflow = json!({"id": "chain", "steps": steps});
        client::submit(
            &coordinator,
            workflow.to_string().as_bytes(),
            &json_bytes(&json!({"task": "dark mode"})),
        )
        .await
        .unwrap();
        let mut seen = Vec::new();
        for i in 1..STEPS {
            let task = worker.wait_task().await;
            worker
                .complete(&coordinator, &task, &json!({"ok": true, "i": i}), None)
                .await
                .unwrap();
            seen.push(task);
        }
        seen.push(worker.wait_task().await);
        tasks.push(seen);
    }
    let manifest = |task: &v1::Task| -> baton_core::Manifest {
        serde_json::from_slice(&task.manifest.as_ref().unwrap().json).unwrap()
    };

    // This version's worker: short contexts listed whole, then the first long one as a change
    // from nothing, and each after it as a change from the one before, setting one result.
    let new_tasks = tasks.remove(0);
    let changes: Vec<Option<baton_core::payload::ListingChange>> = new_tasks
        .iter()
        .map(|task| manifest(task).listing)
        .collect();
    assert!(changes[..9].iter().all(Option::is_none), "{changes:?}");
    let tenth = changes[9].clone().expect("a listing change");
    assert_eq!((tenth.base, tenth.set.len()), (None, 9));
    let last = manifest(new_tasks.last().unwrap());
    let change = last.listing.clone().expect("a listing change");
    assert_eq!(
        change.base.as_deref(),
        Some(changes[10].as_ref().unwrap().name.as_str())
    );
    assert_eq!(
        change.set,
        [("s10".into(), r#"={"i":11,"ok":true}"#.into())]
    );
    assert!(last.context.is_empty());
    assert_eq!(
        last.parts().count(),
        0,
        "every part small, so inline: {last:?}"
    );

    // The worker before: the last task's context listed whole, and the same payload.
    let whole = tasks.remove(0).pop().unwrap();
    let listed = manifest(&whole);
    assert!(listed.listing.is_none());
    assert_eq!(listed.context.len(), STEPS - 1);
    assert_eq!(
        listed.context[10],
        ("s10".into(), r#"={"i":11,"ok":true}"#.into())
    );
    let payload = fake_worker::payload(&whole);
    assert_eq!(payload["context"]["s10"], json!({"ok": true, "i": 11}));
    assert_eq!(payload["input"], json!({"task": "dark mode"}));
}
