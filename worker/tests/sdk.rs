//! The Rust SDK against a real coordinator (in-memory store, gRPC on loopback).

#[path = "../../coordinator/tests/support/running.rs"]
mod running;

use std::time::Duration;

use baton_coordinator::record::RunRecord;
use baton_coordinator::service::Submission;
use baton_coordinator::store::memory::MemoryStore;
use baton_coordinator::{Config, Coordinator};
use baton_worker::Worker;
use running::{Running, running};
use serde_json::json;

async fn coordinator() -> (Running<MemoryStore>, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let coordinator = running(Coordinator::new(MemoryStore::new(), Config::default()));
    tokio::spawn(baton_coordinator::grpc::serve(
        listener,
        coordinator.clone(),
        std::future::pending(),
    ));
    (coordinator, url)
}

/// Submits a one-step workflow and waits (bounded) for the run to end; returns its record.
async fn run_one_step(
    coordinator: &Coordinator<MemoryStore>,
    step: serde_json::Value,
) -> RunRecord {
    let workflow = json!({"steps": [step]}).to_string();
    let run_id = coordinator
        .submit(Submission::new(workflow.as_bytes(), &json!("x")))
        .await
        .unwrap()
        .run_id;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let record = coordinator.record(&run_id).await.unwrap();
        if record.status != baton_core::RunStatus::Running {
            return record;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "run {run_id} did not end"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_gets_the_payload_and_its_answer_is_the_steps_data() {
    let (coordinator, url) = coordinator().await;
    let worker = Worker::builder()
        .coordinator(url)
        .id("sdk")
        .agent("echo", |task| async move {
            Ok(json!({"saw": task.payload["input"], "step": task.step_id}))
        })
        .build();
    tokio::spawn(worker.run(std::future::pending()));
    let record = run_one_step(
        &coordinator,
        json!({"id": "e", "type": "agent", "agent": "echo"}),
    )
    .await;
    assert_eq!(record.status, baton_core::RunStatus::Succeeded);
    let context: serde_json::Value = serde_json::from_slice(&record.context).unwrap();
    assert_eq!(context, json!({"e": {"saw": "x", "step": "e"}}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_fails_its_step_instead_of_leaving_it_unanswered() {
    let (coordinator, url) = coordinator().await;
    let worker = Worker::builder()
        .coordinator(url)
        .agent("boom", |_task| async move {
            if true {
                panic!("handler bug");
            }
            Ok(json!(null))
        })
        .build();
    tokio::spawn(worker.run(std::future::pending()));
    let record = run_one_step(
        &coordinator,
        json!({"id": "b", "type": "agent", "agent": "boom"}),
    )
    .await;
    assert_eq!(record.status, baton_core::RunStatus::Failed);
    assert!(
        record.error.contains("agent \"boom\" panicked"),
        "{}",
        record.error
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steps_timeout_stops_a_handler_that_hangs() {
    let (coordinator, url) = coordinator().await;
    let worker = Worker::builder()
        .coordinator(url)
        .agent("hang", |_task| async move {
            tokio::time::sleep(Duration::from_secs(3_600)).await;
            Ok(json!(null))
        })
        .build();
    tokio::spawn(worker.run(std::future::pending()));
    let step = json!({"id": "h", "type": "agent", "agent": "hang", "timeout_ms": 200});
    let record = run_one_step(&coordinator, step).await;
    assert_eq!(record.status, baton_core::RunStatus::Failed);
    assert!(
        record.error.contains("timed out after 200 ms"),
        "{}",
        record.error
    );
}

/// Runs a chain of `steps` agent steps, each returning 10 kB and counting the earlier results
/// its payload holds, on one worker with `cache_bytes` of part cache. Returns the final context
/// and the bytes the coordinator sent to the worker, having checked that each task was sent
/// once (no task was asked for again, no stream restarted).
async fn accumulate(steps: usize, cache_bytes: u64) -> (serde_json::Value, u64) {
    let (coordinator, url) = coordinator().await;
    let worker = Worker::builder()
        .coordinator(url)
        .part_cache_bytes(cache_bytes)
        .agent("grow", |task| async move {
            let seen = task.payload["context"].as_object().map_or(0, |c| c.len());
            Ok(json!({"seen": seen, "blob": "x".repeat(10_000)}))
        })
        .build();
    tokio::spawn(worker.run(std::future::pending()));
    let chain: Vec<_> = (0..steps)
        .map(|i| json!({"id": format!("s{i:02}"), "type": "agent", "agent": "grow"}))
        .collect();
    let workflow = json!({"steps": chain}).to_string();
    let run_id = coordinator
        .submit(Submission::new(workflow.as_bytes(), &json!("x")))
        .await
        .unwrap()
        .run_id;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let record = loop {
        let record = coordinator.record(&run_id).await.unwrap();
        if record.status != baton_core::RunStatus::Running {
            break record;
        }
        assert!(tokio::time::Instant::now() < deadline, "run did not end");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        record.status,
        baton_core::RunStatus::Succeeded,
        "{record:?}"
    );
    let context = serde_json::from_slice(&record.context).unwrap();
    let stats = coordinator.stats();
    assert_eq!(stats.tasks_dispatched, steps as u64);
    (context, stats.bytes_to_workers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_earlier_result_crosses_to_a_caching_worker_once() {
    const STEPS: usize = 12;
    let (cached, cached_bytes) = accumulate(STEPS, 1 << 20).await;
    let (uncached, uncached_bytes) = accumulate(STEPS, 0).await;
    // Every agent saw every earlier result, with or without the cache.
    assert_eq!(cached, uncached);
    for i in 0..STEPS {
        assert_eq!(cached[format!("s{i:02}")]["seen"], json!(i), "{i}");
    }
    // With the cache each 10 kB result goes once (plus manifests of 65-byte digests); without
    // it, step n receives all n earlier results again: 66 results for 12 steps.
    let results_once = STEPS as u64 * 10_030;
    assert!(
        cached_bytes < results_once + 20_000,
        "cached: {cached_bytes} bytes"
    );
    assert!(
        uncached_bytes > 66 * 10_000,
        "uncached: {uncached_bytes} bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_smaller_than_the_context_still_gives_every_agent_everything() {
    // Room for about three results: older ones are evicted and sent again when needed.
    let (context, bytes) = accumulate(10, 35_000).await;
    for i in 0..10 {
        assert_eq!(context[format!("s{i:02}")]["seen"], json!(i), "{i}");
    }
    // Evicted results were sent again (more than the 9 read later, once each), yet fewer than
    // the 45 an uncached worker gets.
    assert!((15 * 10_000..45 * 10_000).contains(&bytes), "{bytes} bytes");
}

/// An SDK agent hands on messages and decisions; the next one finds them in its payload, and
/// asks the coordinator mid-step for the run's decisions by meaning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_hand_on_messages_and_decisions_and_can_query_them_mid_step() {
    let (coordinator, url) = coordinator().await;
    let worker = Worker::builder()
        .coordinator(url)
        .agent("planner", |_task| async move {
            Ok(baton_worker::Output::new(json!({"files": ["src/theme.ts"]}))
                .message("assistant", "Plan: a theme context")
                .decision_about(
                    "Use CSS variables for the theme",
                    "no reload needed",
                    &["src/theme.ts"],
                ))
        })
        .agent("coder", |task| async move {
            let found = task
                .query_decisions("CSS variables theme", None, 5, false)
                .await
                .map_err(|status| status.to_string())?;
            Ok(json!({
                "handoff_from": task.payload["handoff"]["source_agent"],
                "handed_decisions": task.payload["handoff"]["decisions"].as_array().map(Vec::len),
                "history": task.payload["messages"].as_array().map(Vec::len),
                "found": found.iter().map(|m| (m.summary.clone(), m.agent.clone())).collect::<Vec<_>>(),
            }))
        })
        .build();
    tokio::spawn(worker.run(std::future::pending()));
    let workflow = json!({"steps": [
        {"id": "plan", "type": "agent", "agent": "planner", "next": "code"},
        {"id": "code", "type": "agent", "agent": "coder"}
    ]})
    .to_string();
    let run_id = coordinator
        .submit(Submission::new(workflow.as_bytes(), &json!("x")))
        .await
        .unwrap()
        .run_id;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let record = loop {
        let record = coordinator.record(&run_id).await.unwrap();
        if record.status != baton_core::RunStatus::Running {
            break record;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run did not end"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        record.status,
        baton_core::RunStatus::Succeeded,
        "{}",
        record.error
    );
    let context: serde_json::Value = serde_json::from_slice(&record.context).unwrap();
    assert_eq!(
        context["code"],
        json!({
            "handoff_from": "planner",
            "handed_decisions": 1,
            "history": 1,
            "found": [["Use CSS variables for the theme", "planner"]]
        })
    );
    // Plain data stays plain: the planner's data is only its data.
    assert_eq!(context["plan"], json!({"files": ["src/theme.ts"]}));
}

/// Waits (bounded) until `ready` holds.
async fn eventually(what: &str, ready: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !ready() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} never happened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Cancelling a run stops the handler running its task at once (its future is dropped) and
/// frees the worker's slot for the next task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_run_stops_its_running_handler_and_frees_the_slot() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    struct SetOnDrop(Arc<AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let (coordinator, url) = coordinator().await;
    let (started, stopped) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let worker = Worker::builder()
        .coordinator(url)
        .concurrency(1)
        .agent("hang", {
            let (started, stopped) = (started.clone(), stopped.clone());
            move |_task| {
                let (started, stopped) = (started.clone(), stopped.clone());
                async move {
                    let _guard = SetOnDrop(stopped);
                    started.store(true, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(3_600)).await;
                    Ok(json!(null))
                }
            }
        })
        .agent("quick", |_task| async move { Ok(json!("done")) })
        .build();
    tokio::spawn(worker.run(std::future::pending()));
    let workflow = json!({"steps": [{"id": "h", "type": "agent", "agent": "hang"}]}).to_string();
    let run_id = coordinator
        .submit(Submission::new(workflow.as_bytes(), &json!("x")))
        .await
        .unwrap()
        .run_id;
    eventually("the handler starting", || started.load(Ordering::SeqCst)).await;
    assert!(!stopped.load(Ordering::SeqCst));
    let record = coordinator
        .cancel(&run_id, "not needed", None)
        .await
        .unwrap();
    assert_eq!(record.status, baton_core::RunStatus::Cancelled);
    eventually("the handler stopping", || stopped.load(Ordering::SeqCst)).await;
    // The only slot is free again: the next task runs.
    let record = run_one_step(
        &coordinator,
        json!({"id": "q", "type": "agent", "agent": "quick"}),
    )
    .await;
    assert_eq!(record.status, baton_core::RunStatus::Succeeded);
}

/// A command agent's process is killed when its run is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_run_kills_its_command_agents_process() {
    let (coordinator, url) = coordinator().await;
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let agents = baton_worker::agents::AgentsFile::parse(
        &format!(
            "[agents.slow]\nkind = \"command\"\ncommand = [\"sh\", \"-c\", \"echo $$ > {}; exec sleep 3600\"]\n",
            pid_file.display()
        ),
        dir.path(),
    )
    .unwrap();
    let worker =
        baton_worker::agents_into(Worker::builder().coordinator(url.clone()), agents).build();
    tokio::spawn(worker.run(std::future::pending()));
    let workflow = json!({"steps": [{"id": "s", "type": "agent", "agent": "slow"}]}).to_string();
    let run_id = coordinator
        .submit(Submission::new(workflow.as_bytes(), &json!("x")))
        .await
        .unwrap()
        .run_id;
    eventually("the agent writing its pid", || {
        std::fs::read_to_string(&pid_file).is_ok_and(|pid| pid.ends_with('\n'))
    })
    .await;
    let pid = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .to_owned();
    let alive = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            // A killed child not yet reaped is a zombie ("Z"): it no longer runs.
            .is_ok_and(|stat| stat.split_whitespace().nth(2) != Some("Z"))
    };
    assert!(alive(), "the agent runs");
    coordinator
        .cancel(&run_id, "not needed", None)
        .await
        .unwrap();
    eventually("the agent's process ending", || !alive()).await;
}

/// A worker told to shut down takes no new task, finishes and answers the one it runs, then
/// stops; the task it was not given waits for another worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_shutting_down_finishes_its_task_and_takes_no_new_one() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (coordinator, url) = coordinator().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let worker = Worker::builder()
        .coordinator(url)
        .id("leaving")
        .concurrency(4)
        .agent("slow", {
            let calls = calls.clone();
            move |_task| {
                let calls = calls.clone();
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    Ok(json!("finished"))
                }
            }
        })
        .build();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    let workflow = json!({"steps": [{"id": "s", "type": "agent", "agent": "slow"}]}).to_string();
    let submit = || coordinator.submit(Submission::new(workflow.as_bytes(), &json!("x")));
    let first = submit().await.unwrap().run_id;
    eventually("the first task starting", || {
        calls.load(Ordering::SeqCst) == 1
    })
    .await;
    stop.send(()).unwrap();
    // Give the drain message time to arrive, then offer the worker another run.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = submit().await.unwrap().run_id;
    tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the worker stops once its task is answered")
        .unwrap()
        .expect("a worker that was let in stops without an error");
    // The worker stops once its answer is on the wire; the coordinator records it a moment
    // later (it is not refused: a refused answer would leave the run running).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let record = coordinator.record(&first).await.unwrap();
        if record.status == baton_core::RunStatus::Succeeded {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the running task finished but its answer was not recorded: {} {:?}",
            record.status,
            record.steps[0]
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "no new task after the drain"
    );
    let waiting = coordinator.record(&second).await.unwrap();
    assert_eq!(waiting.status, baton_core::RunStatus::Running);
    assert_eq!(
        waiting.steps[0].status.as_str(),
        "queued",
        "it waits for another worker"
    );
}

/// An SDK handler streams live output with `task.stream`: a watcher sees it while the handler
/// still runs, in order, and the step's data is the handler's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_streams_live_output_that_watchers_see_while_it_runs() {
    use baton_coordinator::service::RunEvent;
    use futures::StreamExt;

    let (coordinator, url) = coordinator().await;
    let (go, gate) = tokio::sync::watch::channel(false);
    let worker = Worker::builder()
        .coordinator(url)
        .id("sdk")
        .agent("talker", move |task| {
            let mut gate = gate.clone();
            async move {
                task.stream("Thinking");
                task.stream(" about it");
                // Held until the test saw the first words.
                let _ = gate.wait_for(|open| *open).await;
                task.stream("... done");
                Ok(json!({"answer": 42}))
            }
        })
        .build();
    tokio::spawn(worker.run(std::future::pending()));
    let workflow = json!({"steps": [{"id": "talk", "type": "agent", "agent": "talker"}]});
    let run_id = coordinator
        .submit(Submission::new(workflow.to_string(), &json!("x")))
        .await
        .unwrap()
        .run_id;
    let mut events = coordinator.watch(&run_id).await.unwrap();
    let mut streamed = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while let Ok(Some(event)) = tokio::time::timeout_at(deadline, events.next()).await {
        match event.unwrap() {
            RunEvent::StepOutput { text, step_id, .. } => {
                assert_eq!(step_id, "talk");
                streamed.push_str(&text);
                if streamed == "Thinking about it" {
                    go.send(true).unwrap();
                }
            }
            RunEvent::RunFinished(record) => {
                assert_eq!(record.status, baton_core::RunStatus::Succeeded);
                let context: serde_json::Value = serde_json::from_slice(&record.context).unwrap();
                assert_eq!(context["talk"], json!({"answer": 42}));
                break;
            }
            _ => {}
        }
    }
    assert_eq!(streamed, "Thinking about it... done");
}
