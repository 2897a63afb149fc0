//! Live output and model usage through the coordinator, in process: workers played by channels
//! stream pieces of their agents' output, watchers on the same or another coordinator (one
//! shared store) read them, and results report the tokens their attempts used.

#[path = "support/client.rs"]
mod client;
#[path = "support/fake_worker.rs"]
mod fake_worker;
#[path = "support/running.rs"]
mod running;

use std::sync::Arc;
use std::time::Duration;

use baton_coordinator::service::{EventStream, RunEvent};
use baton_coordinator::store::memory::MemoryStore;
use baton_coordinator::store::{LiveOutput, Store};
use baton_coordinator::{Config, Coordinator, Error};
use fake_worker::{FakeWorker, json_bytes};
use futures::StreamExt;
use running::running;
use serde_json::json;
use tokio::time::Instant;

/// One agent step, `code`, then the end.
const ONE_STEP: &str = r#"{"id": "live", "steps": [
    {"id": "code", "type": "agent", "agent": "coder",
     "retry": {"max_attempts": 2, "initial_interval_ms": 1}}
]}"#;

async fn start<S: Store>(coordinator: &Coordinator<S>) -> String {
    client::submit(coordinator, ONE_STEP.as_bytes(), &json_bytes(&json!("go")))
        .await
        .unwrap()
}

/// The next event that is live output (or a note of what was missed), waiting up to 10 s.
async fn next_output(events: &mut EventStream) -> RunEvent {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let event = tokio::time::timeout_at(deadline, events.next())
            .await
            .expect("live output within 10 s")
            .expect("the watch goes on")
            .expect("no error");
        if matches!(
            event,
            RunEvent::StepOutput { .. } | RunEvent::OutputMissed { .. }
        ) {
            return event;
        }
    }
}

fn text(event: &RunEvent) -> &str {
    match event {
        RunEvent::StepOutput { text, .. } => text,
        other => panic!("expected output, got {other:?}"),
    }
}

#[tokio::test]
async fn a_watcher_on_another_coordinator_sees_the_output_as_it_comes_and_a_late_one_what_came() {
    let store = Arc::new(MemoryStore::new());
    let near = running(Coordinator::new(store.clone(), Config::default()));
    let far = running(Coordinator::new(store.clone(), Config::default()));
    let mut worker = FakeWorker::connect(&near, "w1", &["coder"]).await;
    let run_id = start(&near).await;
    let task = worker.next_task();
    let mut early = far.watch(&run_id).await.unwrap();

    worker.stream(&near, &task, "Writing ", false).unwrap();
    let first = next_output(&mut early).await;
    assert_eq!(text(&first), "Writing ");
    assert!(
        matches!(&first, RunEvent::StepOutput { step_id, visit: 1, attempt: 1, restart: false, .. } if step_id == "code"),
        "{first:?}"
    );
    worker.stream(&near, &task, "the theme", false).unwrap();
    assert_eq!(text(&next_output(&mut early).await), "the theme");

    // A watcher that joins now gets what was streamed so far, then what comes.
    let mut late = far.watch(&run_id).await.unwrap();
    assert_eq!(text(&next_output(&mut late).await), "Writing ");
    assert_eq!(text(&next_output(&mut late).await), "the theme");
    worker.stream(&near, &task, "Again", true).unwrap();
    for watch in [&mut early, &mut late] {
        let again = next_output(watch).await;
        assert!(matches!(again, RunEvent::StepOutput { restart: true, .. }));
        assert_eq!(text(&again), "Again");
    }

    // Only the worker holding the attempt may stream it.
    let stranger = FakeWorker::connect(&near, "w2", &["coder"]).await;
    assert!(matches!(
        stranger.stream(&near, &task, "not mine", false),
        Err(Error::TaskNotHeld { .. })
    ));

    // What the agent streams just before it answers reaches every watcher before the end.
    worker.stream(&near, &task, " done", false).unwrap();
    worker
        .complete(&near, &task, &json!({"files": 1}), None)
        .await
        .unwrap();
    for watch in [&mut early, &mut late] {
        assert_eq!(text(&next_output(watch).await), " done");
    }
    // The result is the answer, never the output; nothing streams once the task is answered.
    let record = near.record(&run_id).await.unwrap();
    assert_eq!(record.status, baton_core::RunStatus::Succeeded);
    let context: serde_json::Value = serde_json::from_slice(&record.context).unwrap();
    assert_eq!(context["code"], json!({"files": 1}));
    assert!(worker.stream(&near, &task, "late", false).is_err());
    let output = store.read_output(&run_id, None).await.unwrap();
    assert_eq!(output.last().unwrap().1.text, " done");
}

/// `code`, which streams, then `review`, which does not.
const TWO_STEPS: &str = r#"{"id": "live", "steps": [
    {"id": "code", "type": "agent", "agent": "coder", "next": "review"},
    {"id": "review", "type": "agent", "agent": "reviewer"}
]}"#;

/// The texts of the output a watch tells until `step_id` ends.
async fn output_until_the_end_of(events: &mut EventStream, step_id: &str) -> Vec<String> {
    let mut texts = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("an event within 10 s")
            .expect("the watch goes on")
            .expect("no error");
        match event {
            RunEvent::StepOutput { text, .. } => texts.push(text),
            RunEvent::StepFinished { step_id: ended, .. } if ended == step_id => return texts,
            _ => {}
        }
    }
}

#[tokio::test]
async fn a_step_s_output_is_told_before_its_end_on_every_coordinator() {
    let store = Arc::new(MemoryStore::new());
    let near = running(Coordinator::new(store.clone(), Config::default()));
    let far = running(Coordinator::new(store.clone(), Config::default()));
    let mut worker = FakeWorker::connect(&near, "w1", &["coder", "reviewer"]).await;
    let run_id = client::submit(&near, TWO_STEPS.as_bytes(), &json_bytes(&json!("go")))
        .await
        .unwrap();
    let task = worker.next_task();
    let mut here = near.watch(&run_id).await.unwrap();
    let mut there = far.watch(&run_id).await.unwrap();
    // A burst right before the answer: most of it is still on its way to the watchers when
    // the step ends.
    let pieces: Vec<String> = (0..300).map(|n| format!("{n} ")).collect();
    for piece in &pieces {
        worker.stream(&near, &task, piece, false).unwrap();
    }
    worker
        .complete(&near, &task, &json!({"files": 1}), None)
        .await
        .unwrap();
    assert_eq!(output_until_the_end_of(&mut here, "code").await, pieces);
    assert_eq!(output_until_the_end_of(&mut there, "code").await, pieces);

    // A step that streams nothing ends without a word of output, and the run with it.
    let review = worker.wait_task().await;
    worker
        .complete(&near, &review, &json!({"approved": true}), None)
        .await
        .unwrap();
    assert!(
        output_until_the_end_of(&mut here, "review")
            .await
            .is_empty()
    );
    assert!(
        output_until_the_end_of(&mut there, "review")
            .await
            .is_empty()
    );
}

#[tokio::test]
async fn a_watcher_that_falls_behind_misses_pieces_is_told_and_the_run_goes_on() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["coder"]).await;
    let run_id = start(&coordinator).await;
    let task = worker.next_task();
    let mut slow = coordinator.watch(&run_id).await.unwrap();
    let mut keeping_up = coordinator.watch(&run_id).await.unwrap();
    // The watcher that keeps up reads every piece as it comes; the slow one reads nothing.
    // Pieces streamed one at a time reach the watchers one delivery each, far more deliveries
    // than a watcher may fall behind by.
    let pieces = 2_000;
    let reader = tokio::spawn(async move {
        let mut seen = 0;
        while seen < pieces {
            match next_output(&mut keeping_up).await {
                RunEvent::StepOutput { .. } => seen += 1,
                other => panic!("the reader kept up, yet {other:?}"),
            }
        }
    });
    for n in 0..pieces {
        worker
            .stream(&coordinator, &task, &format!("{n} "), false)
            .unwrap();
        tokio::task::yield_now().await;
    }
    tokio::time::timeout(Duration::from_secs(30), reader)
        .await
        .expect("the reader that keeps up sees every piece")
        .unwrap();
    // The slow one learns it missed pieces, then goes on.
    let mut missed = 0;
    let mut told = 0;
    loop {
        match next_output(&mut slow).await {
            RunEvent::OutputMissed { pieces } => missed += pieces,
            RunEvent::StepOutput { .. } => told += 1,
            other => panic!("{other:?}"),
        }
        if missed + told == pieces as u64 {
            break;
        }
    }
    assert!(missed > 0, "it fell behind");
    worker
        .complete(&coordinator, &task, &json!({}), None)
        .await
        .unwrap();
    assert_eq!(
        coordinator.record(&run_id).await.unwrap().status,
        baton_core::RunStatus::Succeeded
    );
}

#[tokio::test]
async fn the_tokens_of_every_attempt_are_on_the_step_and_summed_for_the_run() {
    let store = Arc::new(MemoryStore::new());
    let coordinator = running(Coordinator::new(store.clone(), Config::default()));
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["coder"]).await;
    let run_id = start(&coordinator).await;
    let first = worker.next_task();
    worker
        .fail_with_usage(&coordinator, &first, "broken JSON", &[("small", 100, 20)])
        .await
        .unwrap();
    let second = worker.wait_task().await;
    assert_eq!(second.attempt, 2);
    worker
        .complete_with_usage(
            &coordinator,
            &second,
            &json!({"ok": true}),
            &[("small", 110, 30), ("large", 5, 1)],
        )
        .await
        .unwrap();
    let record = coordinator.record(&run_id).await.unwrap();
    assert_eq!(record.status, baton_core::RunStatus::Succeeded);
    let used: Vec<(u32, &str, u64, u64)> = record.steps[0]
        .usage
        .iter()
        .map(|used| {
            (
                used.attempt,
                used.usage.model.as_str(),
                used.usage.prompt_tokens,
                used.usage.completion_tokens,
            )
        })
        .collect();
    assert_eq!(
        used,
        [
            (1, "small", 100, 20),
            (2, "small", 110, 30),
            (2, "large", 5, 1)
        ]
    );
    let totals: Vec<(&str, u64, u64)> = record
        .usage
        .iter()
        .map(|total| {
            (
                total.model.as_str(),
                total.prompt_tokens,
                total.completion_tokens,
            )
        })
        .collect();
    assert_eq!(totals, [("small", 210, 50), ("large", 5, 1)]);

    // A fresh coordinator reads the same from the store.
    let again = running(Coordinator::new(store, Config::default()));
    drop(coordinator);
    assert_eq!(again.record(&run_id).await.unwrap().usage, record.usage);
}

#[tokio::test]
async fn usage_over_its_limits_refuses_the_result_naming_it() {
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    let mut worker = FakeWorker::connect(&coordinator, "w1", &["coder"]).await;
    let run_id = start(&coordinator).await;
    let task = worker.next_task();
    let long = "m".repeat(300);
    let refused = worker
        .complete_with_usage(&coordinator, &task, &json!({}), &[(&long, 1, 1)])
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("usage[0].model is 300 bytes"),
        "{refused}"
    );
    let record = coordinator.record(&run_id).await.unwrap();
    assert_eq!(record.steps[0].status.as_str(), "retrying");
}
