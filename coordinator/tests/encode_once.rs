//! A result is encoded and hashed once (issue 20, point 3): the bytes the transition stores are
//! the bytes every watcher is sent and the bytes of the payload part the next task carries,
//! shared rather than encoded again or copied per receiver.

#[path = "support/client.rs"]
mod client;
#[path = "support/fake_worker.rs"]
mod fake_worker;

use std::time::Duration;

use baton_coordinator::service::RunEvent;
use baton_coordinator::store::Store;
use baton_coordinator::store::memory::MemoryStore;
use baton_coordinator::{Config, Coordinator};
use baton_proto::v1;
use fake_worker::{FakeWorker, json_bytes};
use futures::StreamExt;
use serde_json::json;

#[tokio::test]
async fn a_result_s_bytes_are_shared_by_the_store_write_its_watchers_and_the_next_task() {
    let coordinator = Coordinator::new(MemoryStore::new(), Config::default());
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
    worker
        .complete(&coordinator, &a, &data, None)
        .await
        .unwrap();

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

/// Small parts travel inline in the manifest (issue 20, point 4): a chain's short results are
/// not sent, hashed or cached as parts of their own. A worker of the protocol before, which does
/// not read them, gets every part named and sent, and rebuilds the same payload.
#[tokio::test]
async fn small_parts_travel_inline_and_an_older_worker_gets_them_named() {
    let coordinator = Coordinator::new(MemoryStore::new(), Config::default());
    let speaking = |id: &'static str, agents: &'static [&'static str], protocol: u32| {
        FakeWorker::hello_speaking(&coordinator, id, agents, 8, Vec::new(), protocol)
    };
    let mut new = speaking("new", &["now"], baton_proto::WORKER_PROTOCOL)
        .await
        .unwrap();
    let old_protocol = baton_proto::INLINE_PARTS_PROTOCOL - 1;
    assert!(baton_proto::serves_worker_protocol(old_protocol));
    let mut old = speaking("old", &["before"], old_protocol).await.unwrap();
    let mut second_tasks = Vec::new();
    for (worker, agent) in [(&mut new, "now"), (&mut old, "before")] {
        let workflow = json!({"id": "two", "steps": [
            {"id": "a", "type": "agent", "agent": agent, "next": "b"},
            {"id": "b", "type": "agent", "agent": agent}
        ]});
        client::submit(
            &coordinator,
            workflow.to_string().as_bytes(),
            &json_bytes(&json!({"task": "dark mode"})),
        )
        .await
        .unwrap();
        let a = worker.wait_task().await;
        let data = json!({"ok": true, "i": 1});
        worker
            .complete(&coordinator, &a, &data, None)
            .await
            .unwrap();
        second_tasks.push(worker.wait_task().await);
    }
    let [inline, named] = <[v1::Task; 2]>::try_from(second_tasks).unwrap();

    let manifest = |task: &v1::Task| -> baton_core::Manifest {
        serde_json::from_slice(&task.manifest.as_ref().unwrap().json).unwrap()
    };
    // Every part of b's payload is small: the input, a's result, the empty message history.
    let carried = manifest(&inline);
    assert_eq!(carried.parts().count(), 0, "{carried:?}");
    assert!(inline.parts.is_empty());
    assert_eq!(carried.context[0].1, r#"={"i":1,"ok":true}"#);
    let listed = manifest(&named);
    assert_eq!(
        listed.parts().count(),
        3,
        "input, a's result, messages: {listed:?}"
    );
    assert!(
        listed.parts().all(|(_, digest)| digest.len() == 64),
        "{listed:?}"
    );
    assert_eq!(named.parts.len(), 3);

    let (inline, named) = (fake_worker::payload(&inline), fake_worker::payload(&named));
    assert_eq!(inline["context"], named["context"]);
    assert_eq!(inline["context"]["a"], json!({"ok": true, "i": 1}));
    assert_eq!(inline["input"], json!({"task": "dark mode"}));
    assert_eq!(inline["input"], named["input"]);
}
