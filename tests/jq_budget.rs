//! `jq:` transforms under a budget: a program that would run for ever or allocate without end
//! fails its own step, naming the budget, and the coordinator goes on serving everyone else.
//!
//! The sandbox pool is driven directly (with the `baton` binary as its sandbox) for what each
//! kind of overrun says; a real coordinator process shows the rest.

#[path = "support/fleet.rs"]
mod fleet;
#[path = "support/cluster.rs"]
mod harness;
#[path = "support/spec.rs"]
mod spec;

use std::time::Duration;

use baton_coordinator::jq_sandbox::{Budget, Launcher, Pool};
use baton_core::eval::JqOutputLimits;
use baton_proto::v1::{GetRunRequest, run_event};
use fleet::{Fleet, Timing};
use harness::{Cluster, Watch, context, step};
use serde_json::json;

fn pool(budget: Budget) -> Pool {
    let launcher = Launcher {
        program: env!("CARGO_BIN_EXE_baton").into(),
        args: vec!["jq-sandbox".into()],
    };
    Pool::new(launcher, budget, 2)
}

fn small_budget() -> Budget {
    Budget {
        cpu: Duration::from_millis(500),
        memory_bytes: 64 << 20,
        output: JqOutputLimits {
            max_bytes: 1_000,
            max_depth: 10,
        },
    }
}

const DOCUMENT: &[u8] = br#"{"input": {"n": 3}, "context": {}}"#;

#[test]
fn each_overrun_fails_with_the_budget_it_broke() {
    let pool = pool(small_budget());
    let cases = [
        (
            "def f: f; f",
            "jq program exceeded its CPU budget of 500 ms",
        ),
        (
            r#"("abcdefgh" * 100000000) | length"#,
            "jq program exceeded its memory budget of 64 MiB",
        ),
        ("def f: [f]; f", "jq program recursed too deeply"),
        (
            r#""x" * 2000"#,
            "jq program produced 2002 bytes; a step's data may be at most 1000 bytes",
        ),
        (
            "reduce range(20) as $i (0; [.])",
            "jq program produced a value nested 20 levels deep; the limit is 10",
        ),
        ("error(\"no\")", "jq error: \"no\""),
    ];
    for (program, expected) in cases {
        let error = pool
            .evaluate(program, DOCUMENT)
            .expect_err(&format!("{program} should fail"));
        assert!(
            error.contains(expected),
            "{program}: expected {expected:?}, got {error:?}"
        );
    }
}

#[test]
fn a_sandbox_is_reused_until_a_program_kills_it() {
    let pool = pool(small_budget());
    for n in 0..5 {
        let document = format!(r#"{{"input": {{"n": {n}}}, "context": {{}}}}"#);
        let output = pool.evaluate(".input.n * 2", document.as_bytes());
        assert_eq!(output, Ok((n * 2).to_string()));
    }
    assert_eq!(pool.started(), 1, "one process served every transform");
    assert!(pool.evaluate("def f: f; f", DOCUMENT).is_err());
    assert_eq!(pool.evaluate(".input.n", DOCUMENT), Ok("3".to_owned()));
    assert_eq!(
        pool.started(),
        2,
        "the process that broke its budget was replaced"
    );
}

/// Children of every thread of process `pid`.
fn children(pid: u32) -> Vec<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("/proc is readable");
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|child| child.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// The most memory process `pid` has held (`VmHWM`), in bytes.
fn peak_memory(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kb: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kb * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_transforms_fail_their_steps_while_other_runs_go_on() {
    let cluster = Cluster::start_with_env(&[("BATON_JQ_CPU_MS", "2000")]).await;
    // An endless program, routed on failure to a step that recovers; and one that would
    // collect a billion numbers.
    let endless = json!({"steps": [
        {"id": "endless", "type": "transform", "transform": "jq: def f: f; f",
         "on_error": "recover"},
        {"id": "recover", "type": "transform", "transform": "input"}
    ]});
    let billion = json!({"steps": [
        {"id": "billion", "type": "transform", "transform": "jq: [range(1e9)]"}
    ]});
    let benign = json!({"steps": [
        {"id": "pick", "type": "transform", "transform": "input.n", "next": "check"},
        {"id": "check", "type": "condition", "condition": "context.pick === 3",
         "then": "done", "else": "done"},
        {"id": "done", "type": "transform", "transform": "context.pick"}
    ]});
    let submit = |workflow: serde_json::Value| {
        let url = cluster.url().to_owned();
        tokio::spawn(async move {
            let mut client = baton_proto::v1::run_service_client::RunServiceClient::connect(url)
                .await
                .expect("connect");
            harness::submit(&mut client, workflow.to_string(), &json!({"n": 3})).await
        })
    };
    // A submit returns once the run is stored: its programs run after, in turns.
    let hostile = [submit(endless), submit(billion)];
    let [endless, billion] = hostile;
    let (endless, billion) = (endless.await.unwrap(), billion.await.unwrap());
    // Both hostile programs get their sandbox before the benign run is submitted.
    let deadline = std::time::Instant::now() + harness::DEADLINE;
    while children(cluster.coordinator_pid()).len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "no sandbox processes started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let mut client = cluster.client().await;
    let run_id = harness::submit(&mut client, benign.to_string(), &json!({"n": 3})).await;
    let record = Watch::start(&mut client, &run_id).await.finished().await;
    assert_eq!(record.status, "succeeded", "{record:#?}");
    assert_eq!(context(&record)["done"], json!(3));
    for hostile in [&endless, &billion] {
        Watch::start(&mut client, hostile).await.finished().await;
    }
    let get = |run_id: String| {
        let mut client = client.clone();
        async move {
            client
                .get_run(GetRunRequest { run_id })
                .await
                .expect("GetRun")
                .into_inner()
        }
    };
    let endless = get(endless).await;
    assert_eq!(
        step(&endless, "endless").error,
        "jq program exceeded its CPU budget of 2000 ms"
    );
    assert_eq!(step(&endless, "recover").status, "succeeded");
    assert_eq!(endless.status, "succeeded", "on_error routed the failure");
    let billion = get(billion).await;
    assert_eq!(billion.status, "failed");
    assert!(
        billion
            .error
            .contains("step \"billion\" failed: jq program exceeded its"),
        "{}",
        billion.error
    );
    // Nothing of what the programs allocated came into the coordinator.
    let peak = peak_memory(cluster.coordinator_pid());
    assert!(
        peak < 200 << 20,
        "the coordinator peaked at {} MiB",
        peak >> 20
    );
}

/// The sandbox processes a coordinator has now.
async fn wait_for_sandboxes(pid: u32, count: usize) {
    let deadline = std::time::Instant::now() + harness::DEADLINE;
    while children(pid).len() != count {
        assert!(
            std::time::Instant::now() < deadline,
            "the coordinator has {} sandbox processes, not {count}",
            children(pid).len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Cancels `run_id` through `client`, which must answer within the harness's deadline (a
/// cancel that waited for the run's program would not); the run's record.
async fn cancel_at_once(
    client: &mut baton_proto::v1::run_service_client::RunServiceClient<tonic::transport::Channel>,
    run_id: &str,
) -> baton_proto::v1::RunRecord {
    tokio::time::timeout(
        harness::DEADLINE,
        client.cancel_run(baton_proto::v1::CancelRunRequest {
            run_id: run_id.to_owned(),
            reason: "enough".into(),
        }),
    )
    .await
    .expect("the cancel does not wait for the program")
    .expect("CancelRun")
    .into_inner()
}

/// A program that would run for ten minutes: with a budget that large, only a stop ends it.
const ENDLESS: &str = r#"{"id": "spin", "steps": [
    {"id": "spin", "type": "transform", "transform": "jq: def f: f; f"}
]}"#;

/// Issue 28, hole 3: a run's jq programs run in transitions of a run that already exists. A
/// submit returns once the run is stored; the run is listed, fetched and watched while its
/// program runs (the watch is told what settled before it, and ends with the run, cancelled); a
/// cancel stops the program at once (its sandbox is killed) instead of waiting the ten minutes
/// of its budget. Before, the submit itself ran the program, so no run id existed to cancel or
/// watch, and a client that gave up left it running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_computing_run_is_stored_listed_and_cancelled_at_once() {
    let cluster = Cluster::start_with_env(&[("BATON_JQ_CPU_MS", "600000")]).await;
    let mut client = cluster.client().await;
    // A step that settles before the endless program, for the watch to be told of.
    let computing = json!({"id": "spin", "steps": [
        {"id": "start", "type": "transform", "transform": "input", "next": "spin"},
        {"id": "spin", "type": "transform", "transform": "jq: def f: f; f"}
    ]});
    let run_id = tokio::time::timeout(
        harness::DEADLINE,
        harness::submit(&mut client, computing.to_string(), &json!({"n": 1})),
    )
    .await
    .expect("the submit returns before the program runs");
    wait_for_sandboxes(cluster.coordinator_pid(), 1).await;
    let spinning = children(cluster.coordinator_pid())[0];

    // Watched while the program runs: the watch is answered, not held until the program ends.
    let mut watch = Watch::start(&mut client, &run_id).await;
    match watch.event().await.and_then(|event| event.event) {
        Some(run_event::Event::StepFinished(finished)) => {
            assert_eq!(
                (finished.step_id.as_str(), finished.status.as_str()),
                ("start", "succeeded"),
                "{finished:#?}"
            );
        }
        other => panic!("the watch's first event is not start's StepFinished: {other:#?}"),
    }
    assert!(
        children(cluster.coordinator_pid()).contains(&spinning),
        "the program still runs while the watch is told"
    );

    let listed = client
        .list_runs(baton_proto::v1::ListRunsRequest {
            status: "running".into(),
            ..Default::default()
        })
        .await
        .expect("ListRuns")
        .into_inner();
    assert!(
        listed.runs.iter().any(|run| run.run_id == run_id),
        "{listed:?}"
    );
    let record = client
        .get_run(GetRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .expect("GetRun")
        .into_inner();
    assert_eq!(record.status, "running", "{record:#?}");

    // Another run's program takes its turn meanwhile (a sandbox is free), and it finishes.
    let benign = json!({"steps": [
        {"id": "double", "type": "transform", "transform": "jq: .input.n * 2"}
    ]});
    let other = harness::submit(&mut client, benign.to_string(), &json!({"n": 21})).await;
    let done = Watch::start(&mut client, &other).await.finished().await;
    assert_eq!(context(&done)["double"], json!(42));
    let still = client
        .get_run(GetRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .expect("GetRun")
        .into_inner();
    assert_eq!(still.status, "running", "the endless program runs on");

    let cancelled = cancel_at_once(&mut client, &run_id).await;
    assert_eq!(cancelled.status, "cancelled", "{cancelled:#?}");
    assert_ne!(step(&cancelled, "spin").status, "succeeded");
    // The watch, open all along, ends with the run: its last record says cancelled.
    let last = watch.finished().await;
    assert_eq!(last.status, "cancelled", "{last:#?}");
    assert_ne!(step(&last, "spin").status, "succeeded");
    assert!(
        watch.event().await.is_none(),
        "the watch goes on after the run ended: {:#?}",
        watch.events
    );
    // The sandbox running the program was killed (the other one, idle, stays in the pool).
    let deadline = std::time::Instant::now() + harness::DEADLINE;
    while children(cluster.coordinator_pid()).contains(&spinning) {
        assert!(
            std::time::Instant::now() < deadline,
            "the sandbox running the cancelled run's program is still there"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Issue 28, hole 3: a coordinator told to stop while a run's program runs stops at once (the
/// program is killed and its transition dropped, unwritten), and another coordinator takes
/// the run up where it was. Before, the program ran inside a submit that kept the coordinator
/// alive 80 s after SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_computing_coordinator_and_another_goes_on_with_the_run() {
    let timing = Timing {
        lease_ms: 3_000,
        worker_silence_ms: 2_000,
    };
    let mut fleet = Fleet::start_with_env(2, timing, &[("BATON_JQ_CPU_MS", "600000")]).await;
    let mut first = fleet.client(0).await.expect("coordinator-0 answers");
    let run_id = harness::submit(&mut first, ENDLESS, &json!({})).await;
    wait_for_sandboxes(fleet.coordinator_pid(0), 1).await;

    let status = fleet.terminate_coordinator(0).await;
    assert!(status.success(), "coordinator-0 exited with {status}");
    // Its continuation was released at once: coordinator-1 runs the program now.
    wait_for_sandboxes(fleet.coordinator_pid(1), 1).await;
    let mut second = fleet.client(1).await.expect("coordinator-1 answers");
    let cancelled = cancel_at_once(&mut second, &run_id).await;
    assert_eq!(cancelled.status, "cancelled");
}

/// Issue 28, hole 3: every jq program of a run counts against one budget
/// (`--jq-run-cpu-ms`): a loop of programs, each well within its own budget, fails once their
/// sum passes the run's, naming it. Before, the budget was per program, and `max_visits: 10000`
/// of a 0.75 s program ran for hours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_s_jq_programs_share_one_cpu_budget() {
    let cluster = Cluster::start_with_env(&[("BATON_JQ_RUN_CPU_MS", "300")]).await;
    let looping = json!({"id": "loop", "max_visits": 10000, "steps": [
        {"id": "work", "type": "transform", "transform": "jq: [range(100000)] | length"},
        {"id": "again", "type": "condition", "condition": "true", "then": "work"}
    ]});
    let mut client = cluster.client().await;
    let run_id = harness::submit(&mut client, looping.to_string(), &json!({})).await;
    let record = Watch::start(&mut client, &run_id).await.finished().await;
    assert_eq!(record.status, "failed", "{record:#?}");
    let work = step(&record, "work");
    assert!(
        work.error
            .contains("the run's jq CPU budget of 300 ms is spent"),
        "{}",
        work.error
    );
    assert!(work.visits > 1, "several programs ran before: {work:#?}");
    assert!(
        work.visits < 10_000,
        "the budget stopped the loop: {work:#?}"
    );
}

/// Issue 28, hole 3: reading a run back (another coordinator, or this one after a restart)
/// never runs its jq programs again: their outcomes are recorded with the events. Before, every
/// load of a run replayed its programs, at their full CPU cost, with the run locked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_a_run_back_runs_none_of_its_programs() {
    let mut cluster = Cluster::start().await;
    let workflow = json!({"steps": [
        {"id": "double", "type": "transform", "transform": "jq: .input.n * 2"},
        {"id": "each", "type": "map", "items": "jq: [range(.context.double)]",
         "steps": [{"id": "square", "type": "transform", "transform": "jq: .map.item * .map.item"}]}
    ]});
    let mut client = cluster.client().await;
    let run_id = harness::submit(&mut client, workflow.to_string(), &json!({"n": 2})).await;
    let record = Watch::start(&mut client, &run_id).await.finished().await;
    assert_eq!(record.status, "succeeded", "{record:#?}");
    let squares: Vec<serde_json::Value> = context(&record)["each"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["result"].clone())
        .collect();
    assert_eq!(squares, [json!(0), json!(1), json!(4), json!(9)]);

    cluster.restart_coordinator().await;
    let mut client = cluster.client().await;
    let read = client
        .get_run(GetRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .expect("GetRun")
        .into_inner();
    assert_eq!(context(&read), context(&record));
    let verified = client
        .verify_run(baton_proto::v1::VerifyRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .expect("VerifyRun")
        .into_inner();
    assert!(verified.ok, "{verified:?}");
    assert!(
        children(cluster.coordinator_pid()).is_empty(),
        "the restarted coordinator started a sandbox: it ran a program again"
    );
}

/// Issue 28, hole 3: a coordinator that dies (SIGKILL) while a run's program runs stops renewing
/// the run's continuation timer; when its lease runs out, another coordinator takes the run up
/// where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_computing_coordinator_s_run_is_taken_up_when_its_lease_runs_out() {
    let timing = Timing {
        lease_ms: 2_000,
        worker_silence_ms: 2_000,
    };
    let mut fleet = Fleet::start_with_env(2, timing, &[("BATON_JQ_CPU_MS", "600000")]).await;
    let mut first = fleet.client(0).await.expect("coordinator-0 answers");
    let run_id = harness::submit(&mut first, ENDLESS, &json!({})).await;
    wait_for_sandboxes(fleet.coordinator_pid(0), 1).await;
    let orphan = children(fleet.coordinator_pid(0))[0];
    fleet.kill_coordinator(0);
    // The dead coordinator's sandbox stops its program rather than spin on for ten minutes.
    let deadline = std::time::Instant::now() + harness::DEADLINE;
    while std::fs::read_to_string(format!("/proc/{orphan}/stat"))
        .is_ok_and(|stat| !stat.contains(") Z "))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the dead coordinator's sandbox still runs its program: {}",
            std::fs::read_to_string(format!("/proc/{orphan}/status")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait_for_sandboxes(fleet.coordinator_pid(1), 1).await;
    let mut second = fleet.client(1).await.expect("coordinator-1 answers");
    let record = second
        .get_run(GetRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .expect("GetRun")
        .into_inner();
    assert_eq!(record.status, "running", "{record:#?}");
    let cancelled = cancel_at_once(&mut second, &run_id).await;
    assert_eq!(cancelled.status, "cancelled");
}
