//! `baton bench` at tiny sizes, so the benchmark harness cannot rot. No timing is asserted.

#[path = "support/recipes.rs"]
mod recipes;
mod support;

use support::{baton, stderr, stdout};

/// The book's quick check, as printed (docs/src/benchmark.md), with this run's binary standing in
/// for the release build its first line makes.
#[test]
fn bench_prints_one_line_per_workload_with_every_field() {
    let lines = recipes::block("docs/src/benchmark.md", "# The benchmark");
    assert_eq!(lines[0], "cargo build --release -p baton-cli", "{lines:#?}");
    let args: Vec<&str> = lines[1]
        .strip_prefix("./target/release/baton ")
        .expect("the block runs the release binary")
        .split_whitespace()
        .collect();
    assert_eq!(args[0], "bench", "{lines:#?}");
    let output = baton().args(&args).output().unwrap();
    assert!(output.status.success(), "stderr:\n{}", stderr(&output));
    let lines: Vec<serde_json::Value> = stdout(&output)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}")))
        .collect();
    let workloads: Vec<&str> = lines
        .iter()
        .map(|l| l["workload"].as_str().unwrap())
        .collect();
    assert_eq!(workloads, ["W1", "W2", "W3", "W4", "W5", "W6", "W7"]);
    for line in &lines {
        assert_eq!(line["redis"], "single", "{line}");
        assert_eq!(line["redis_masters"].as_u64(), Some(1), "{line}");
        assert_eq!(line["coordinators"].as_u64(), Some(1), "{line}");
    }
    let (steps, streaming) = lines.split_at(4);
    // W1-W4 and W7 (a map) share the fields of workloads timed by their steps.
    for line in steps.iter().chain(&lines[6..]) {
        for field in [
            "median_s",
            "min_s",
            "max_s",
            "steps_per_s",
            "per_step_ms",
            "p50_step_ms",
            "p99_step_ms",
            "redis_used_memory_mb",
            "bytes_to_workers",
        ] {
            assert!(line[field].is_number(), "{field} missing in {line}");
        }
        assert!(line["min_s"].as_f64() <= line["median_s"].as_f64());
        assert!(line["median_s"].as_f64() <= line["max_s"].as_f64());
        let spread = line["max_s"].as_f64().unwrap() / line["median_s"].as_f64().unwrap();
        let printed = line["max_over_median"].as_f64().expect("max_over_median");
        assert!(
            // max_s and median_s are rounded to 0.1 ms: the ratio of the printed ones may differ.
            (printed - spread).abs() <= 0.05 * spread && printed >= 1.0,
            "max_over_median {printed} is max_s / median_s ({spread}): {line}"
        );
        assert!(
            line["bytes_to_workers"].as_u64().unwrap() > 0,
            "agents received payloads: {line}"
        );
        // What a step costs, the capacity model's inputs: CPU (coarse, in /proc's hundredths
        // of a second, so possibly 0 at this size) and the Redis commands and bytes it took.
        for field in [
            "coordinator_cpu_ms_per_step",
            "workers_cpu_ms_per_step",
            "redis_cpu_ms_per_step",
        ] {
            assert!(line[field].as_f64().unwrap() >= 0.0, "{field} in {line}");
        }
        assert!(
            line["redis_commands_per_step"].as_f64().unwrap() >= 1.0,
            "every step is written to Redis: {line}"
        );
        assert!(
            line["redis_bytes_per_step"].as_f64().unwrap() > 0.0,
            "{line}"
        );
    }
    // W4 hands every step all earlier results: it sends far more than W1 of the same length.
    assert!(lines[3]["bytes_to_workers"].as_u64() > lines[0]["bytes_to_workers"].as_u64());

    // W5: the watcher on the other coordinator received what was streamed (or was told what
    // it missed), with its latency and the coordinators' CPU.
    let w5 = &streaming[0];
    for field in [
        "pieces_per_s",
        "p50_piece_latency_ms",
        "p99_piece_latency_ms",
        "worker_coordinator_cpu_ms_per_1000_pieces",
        "watcher_coordinator_cpu_ms_per_1000_pieces",
    ] {
        assert!(w5[field].is_number(), "{field} missing in {w5}");
    }
    let streamed = w5["pieces_streamed"].as_u64().unwrap();
    let received = w5["pieces_received"].as_u64().unwrap();
    let missed = w5["pieces_missed"].as_u64().unwrap();
    assert!(streamed > 0 && received + missed == streamed, "{w5}");

    // W6: jq transforms only, so no agent got a payload; each step is timed.
    let w6 = &streaming[1];
    assert!(w6["per_step_ms"].as_f64().unwrap() > 0.0, "{w6}");
    assert_eq!(w6["bytes_to_workers"].as_u64(), Some(0), "{w6}");

    // W7: one map of 10,000 x 0.02 = 200 no-op items, every one of which succeeded; its steps
    // are the items.
    let w7 = &lines[6];
    assert!(w7["items_per_s"].as_f64().unwrap() > 0.0, "{w7}");
    assert_eq!(w7["items"].as_u64(), Some(200), "{w7}");
    assert_eq!(w7["items_succeeded"].as_u64(), Some(200), "{w7}");
    assert_eq!(w7["items_per_s"], w7["steps_per_s"], "{w7}");
    // Every item's agent got a payload: more bytes than W1's 4 steps (at this scale) were sent.
    assert!(
        w7["bytes_to_workers"].as_u64() > lines[0]["bytes_to_workers"].as_u64(),
        "{w7}"
    );
}

/// `baton bench --secure` at a small scale, one repetition of `workloads`; it must succeed.
fn secured_bench(workloads: &str) -> std::process::Output {
    let output = baton()
        .args(["bench", "--secure", "--scale", "0.02", "--reps", "1"])
        .args(["--workloads", workloads])
        .output()
        .unwrap();
    assert!(output.status.success(), "stderr:\n{}", stderr(&output));
    output
}

#[test]
fn bench_runs_a_secured_cluster_too() {
    let output = secured_bench("W1,W3");
    let workloads: Vec<String> = stdout(&output)
        .lines()
        .map(|line| {
            let line: serde_json::Value = serde_json::from_str(line).unwrap();
            line["workload"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(workloads, ["W1", "W3"]);
    assert!(
        stderr(&output).contains("https://localhost:"),
        "{}",
        stderr(&output)
    );
}

/// W8, the web UI's runs list, only when asked for: 10,000 x 0.02 = 200 runs, a third waiting,
/// each page answered with its rows (secured: the list is asked for with the bench's token).
#[test]
fn bench_times_the_runs_list_pages_when_asked_for_w8() {
    let output = secured_bench("W8");
    let line: serde_json::Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    assert_eq!(line["workload"], "W8", "{line}");
    assert_eq!(line["runs"].as_u64(), Some(200), "{line}");
    assert_eq!(line["running"].as_u64(), Some(66), "{line}");
    // A sixth of the runs wait for an approval: the workflow's page is all of them.
    let rows = [
        ("first", 50),
        ("deep", 50),
        ("running", 50),
        ("workflow", 33),
        ("succeeded", 50),
    ];
    for (page, rows) in rows {
        let page = &line["pages"][page];
        assert_eq!(page["rows"].as_u64(), Some(rows), "{line}");
        for field in ["first_ms", "median_ms", "p90_ms", "cpu_ms"] {
            assert!(page[field].as_f64().is_some_and(|ms| ms >= 0.0), "{line}");
        }
    }
}

/// `--redis-cluster --coordinators 2 --redis-wait-replicas 1`: the bench starts a Redis Cluster
/// (3 masters, 3 replicas), runs W3 over two coordinators, each transition waiting for a
/// replica, and says what a step cost summed over the masters. Values are checked for sense
/// (positive, finite), never for speed.
#[test]
fn bench_runs_on_a_redis_cluster_with_two_coordinators() {
    let output = baton()
        .args([
            "bench",
            "--redis-cluster",
            "--coordinators",
            "2",
            "--redis-wait-replicas",
            "1",
            "--scale",
            "0.02",
            "--reps",
            "1",
            "--concurrency",
            "8",
            "--workloads",
            "W3,W1",
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "stderr:\n{}", stderr(&output));
    let lines: Vec<serde_json::Value> = stdout(&output)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}")))
        .collect();
    let workloads: Vec<&str> = lines
        .iter()
        .map(|l| l["workload"].as_str().unwrap())
        .collect();
    assert_eq!(workloads, ["W3", "W1"]);
    for line in &lines {
        assert_eq!(line["redis"], "cluster", "{line}");
        assert_eq!(line["redis_masters"].as_u64(), Some(3), "{line}");
        assert_eq!(line["redis_replicas"].as_u64(), Some(3), "{line}");
        assert_eq!(line["coordinators"].as_u64(), Some(2), "{line}");
        assert_eq!(line["redis_wait_replicas"].as_u64(), Some(1), "{line}");
        let value = |field: &str| {
            let value = line[field]
                .as_f64()
                .unwrap_or_else(|| panic!("{field} missing in {line}"));
            assert!(value.is_finite() && value >= 0.0, "{field} in {line}");
            value
        };
        // Every step is written to a master and replicated: commands, bytes, CPU (Redis counts
        // it in microseconds) and replication on the masters, CPU on the replicas. The
        // coordinators' and workers' CPU is counted in /proc's hundredths of a second, so at
        // this size it may be 0; it must still be there and sane.
        assert!(value("steps_per_s") > 0.0, "{line}");
        assert!(value("redis_cpu_ms_per_step") > 0.0, "{line}");
        assert!(value("redis_replica_cpu_ms_per_step") > 0.0, "{line}");
        assert!(
            value("redis_commands_per_step") >= 1.0,
            "every step is written to Redis: {line}"
        );
        assert!(value("redis_bytes_per_step") > 0.0, "{line}");
        assert!(
            value("redis_replication_bytes_per_step") > 0.0,
            "the masters' replicas got every step: {line}"
        );
        value("coordinator_cpu_ms_per_step");
        value("workers_cpu_ms_per_step");
        assert!(line["bytes_to_workers"].as_u64().unwrap() > 0, "{line}");
    }
    assert!(
        stderr(&output).contains("(cluster, 3 masters, 3 replicas), coordinators http://"),
        "{}",
        stderr(&output)
    );
}
