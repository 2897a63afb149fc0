//! `jq:` transforms under a budget: a program that would run for ever or allocate without end
//! fails its own step, naming the budget, and the coordinator goes on serving everyone else.
//!
//! The sandbox pool is driven directly (with the `baton` binary as its sandbox) for what each
//! kind of overrun says; a real coordinator process shows the rest.

#[path = "support/cluster.rs"]
mod harness;
#[path = "support/spec.rs"]
mod spec;

use std::time::Duration;

use baton_coordinator::jq_sandbox::{Budget, Launcher, Pool};
use baton_core::eval::JqOutputLimits;
use baton_proto::v1::GetRunRequest;
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
    let hostile = [submit(endless), submit(billion)];
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
    assert!(
        hostile.iter().all(|submit| !submit.is_finished()),
        "the benign run finished while both hostile programs were still running"
    );

    let [endless, billion] = hostile;
    let (endless, billion) = (endless.await.unwrap(), billion.await.unwrap());
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
