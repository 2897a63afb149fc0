//! Watching a run from anywhere, with the real `baton` binaries: one Redis, two coordinators, a
//! worker connected to the first only, and a run of two `llm` agent steps that stream and a command
//! that does not (against the stand-in model of `support/llm_server.rs`). A watcher on each coordinator
//! is told the same events in the same order: each step's start naming its worker, its live
//! output, its end, and the next step's start and output only after the previous step's end.

#[path = "support/fleet.rs"]
mod fleet;
#[path = "support/cluster.rs"]
mod harness;
#[path = "support/llm_server.rs"]
mod llm_server;
#[path = "support/spec.rs"]
mod spec;

use baton_proto::v1::run_service_client::RunServiceClient;
use baton_proto::v1::{RunEvent, WatchRunRequest, run_event};
use fleet::{Fleet, Timing};
use harness::DEADLINE;
use llm_server::{Gate, LlmServer, Reply};
use serde_json::{Value, json};
use tonic::Streaming;
use tonic::transport::Channel;

/// `draft`, then `polish` (agent `talker`, which streams), then `sign` (agent `quiet`, which does
/// not: a watcher on another coordinator learns who ran it from the store).
fn workflow() -> Value {
    json!({"id": "two-streams", "steps": [
        {"id": "draft", "type": "agent", "agent": "talker", "next": "polish"},
        {"id": "polish", "type": "agent", "agent": "talker", "next": "sign"},
        {"id": "sign", "type": "agent", "agent": "quiet"}
    ]})
}

/// An agents file: `talker`, an `llm` agent on `server`, streams; `quiet`, a command, does not.
fn talker_agents(fleet: &Fleet, server: &LlmServer) -> std::path::PathBuf {
    let path = fleet.dir().join("talker.toml");
    let agents = format!(
        r#"[agents.talker]
kind = "llm"
base_url = "{url}"
model = "small"
api_key_env = "BATON_TEST_LLM_KEY"
prompt = "Say something about {{{{input}}}}."

[agents.quiet]
kind = "command"
command = ["sh", "-c", "cat >/dev/null; echo '{{\"signed\": true}}'"]
"#,
        url = server.base_url()
    );
    std::fs::write(&path, agents).unwrap();
    path
}

/// A run event as two watchers are compared on, as JSON.
///
/// Normalised only where two watchers may differ in bytes, not in meaning: a step's data is
/// compared as JSON (the coordinator that wrote it sends the part it encoded, another one the
/// value it read back, serialised anew). The run's end carries the whole record.
fn comparable(event: &run_event::Event) -> Value {
    use run_event::Event;
    match event {
        Event::StepStarted(started) => json!({"started": started.step_id, "visit": started.visit,
            "agent": started.agent, "worker": started.worker_id}),
        Event::StepOutput(output) => json!({"output": output.step_id, "visit": output.visit,
            "attempt": output.attempt, "text": output.text, "restart": output.restart,
            "offset": output.offset}),
        Event::StepFinished(done) => {
            let data = done
                .data
                .as_ref()
                .map(|data| serde_json::from_slice::<Value>(&data.json).unwrap());
            json!({"finished": done.step_id, "visit": done.visit, "status": done.status,
                "data": data, "error": done.error, "next": done.next, "parent": done.parent})
        }
        Event::RunFinished(finished) => {
            let record = finished
                .record
                .as_ref()
                .expect("the end carries the record");
            json!({"run_finished": record.status, "context": harness::context(record),
                "record": format!("{record:?}")})
        }
        other => json!({"other": format!("{other:?}")}),
    }
}

/// Every event of a watch, until the run's end.
async fn watch_to_the_end(mut events: Streaming<RunEvent>) -> Vec<Value> {
    let mut told = Vec::new();
    loop {
        let event = tokio::time::timeout(DEADLINE, events.message())
            .await
            .expect("an event within the deadline")
            .expect("the watch goes on")
            .expect("the watch ends with the run, not before")
            .event
            .expect("an event");
        told.push(comparable(&event));
        if matches!(event, run_event::Event::RunFinished(_)) {
            return told;
        }
    }
}

async fn watch(client: &mut RunServiceClient<Channel>, run_id: &str) -> Streaming<RunEvent> {
    // The coordinator answers once the watch is set up: nothing that happens after is missed.
    client
        .watch_run(WatchRunRequest {
            run_id: run_id.to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// Where the first event matching `wanted` is in `events`.
fn position(events: &[Value], wanted: impl Fn(&Value) -> bool) -> usize {
    events
        .iter()
        .position(wanted)
        .unwrap_or_else(|| panic!("not told: {events:#?}"))
}

/// The order every watcher must see: a step's start (naming the worker) before its output, its
/// output before its end, the previous step's end before the next step's start and output.
fn check_the_order(events: &[Value], worker: &str) {
    let mut previous_end = None;
    let steps = [
        ("draft", "talker", "{\"draft\": 1}"),
        ("polish", "talker", "{\"polish\": 2}"),
        ("sign", "quiet", ""),
    ];
    for (step, agent, text) in steps {
        let starts: Vec<&Value> = events.iter().filter(|e| e["started"] == step).collect();
        assert_eq!(
            starts,
            [&json!({"started": step, "visit": 1, "agent": agent, "worker": worker})],
            "{step} started once, on its worker: {events:#?}"
        );
        let start = position(events, |e| e["started"] == step);
        let end = position(events, |e| e["finished"] == step);
        let outputs: Vec<usize> = (0..events.len())
            .filter(|&n| events[n]["output"] == step)
            .collect();
        let streamed: String = outputs
            .iter()
            .map(|&n| events[n]["text"].as_str().unwrap())
            .collect();
        assert_eq!(streamed, text, "all of {step}'s output: {events:#?}");
        assert!(
            outputs.iter().all(|&n| start < n && n < end),
            "{step}'s output between its start and its end: {events:#?}"
        );
        if let Some(previous_end) = previous_end {
            assert!(
                previous_end < start,
                "{step} starts after the previous step's end: {events:#?}"
            );
        }
        previous_end = Some(end);
    }
}

/// The worker is connected to coordinator 0 only, which dispatches both steps; a watcher on
/// coordinator 1 hears of them only through the store. Both watch before the model says a word
/// (its first reply waits for the gate), and both are told the same events, in the run's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_on_two_coordinators_are_told_the_same_events_in_the_run_s_order() {
    let server = LlmServer::start().await;
    let gate = Gate::new();
    server.push(Reply::stream(["{\"draft\":", " 1}"]).hold_before(0, &gate));
    server.push(Reply::stream(["{\"pol", "ish\":", " 2}"]));
    let timing = Timing {
        lease_ms: 2_000,
        worker_silence_ms: 3_000,
    };
    let mut fleet = Fleet::start_with_env(2, timing, &[("BATON_TEST_LLM_KEY", "sk-test")]).await;
    let agents = talker_agents(&fleet, &server);
    fleet.start_worker_on("w1", &agents, 2, 0);
    fleet.wait_for_workers(1).await;
    let mut near = fleet.client(0).await.unwrap();
    let mut far = fleet.client(1).await.unwrap();
    let run_id = harness::submit(&mut far, workflow().to_string(), &json!("go")).await;
    let near_events = watch(&mut near, &run_id).await;
    let far_events = watch(&mut far, &run_id).await;
    gate.open();
    let (near_told, far_told) =
        tokio::join!(watch_to_the_end(near_events), watch_to_the_end(far_events));

    check_the_order(&near_told, "w1");
    assert_eq!(
        far_told, near_told,
        "the watcher on the other coordinator is told what the dispatching one's is, in order"
    );
    assert_eq!(
        near_told.last().unwrap()["run_finished"],
        json!("succeeded"),
        "{near_told:#?}"
    );
    drop(fleet);
}
