//! The coordinator's `/metrics`, scraped from a real `baton coordinator` process while real
//! workers run real runs, and parsed as Prometheus text; and the same metrics as an OTLP
//! collector receives them.

#[path = "support/executions.rs"]
mod executions;
#[path = "support/fleet.rs"]
mod fleet;
#[path = "support/cluster.rs"]
mod harness;
#[path = "support/spec.rs"]
mod spec;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use baton_proto::v1::GetRunRequest;
use fleet::{Fleet, Timing};
use harness::Records;
use serde_json::json;

/// `GET /metrics`, by hand: the samples, `name{labels}` -> value.
fn scrape(url: &str) -> BTreeMap<String, f64> {
    let address = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .expect("host:port");
    let mut stream = std::net::TcpStream::connect(address).expect("connect to /metrics");
    write!(
        stream,
        "GET /metrics HTTP/1.0\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    parse(body)
}

/// Prometheus text: every line not a comment is `name{labels} value`.
fn parse(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let (name, value) = line.rsplit_once(' ').expect("a sample line");
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("a number in {line:?}"));
            (name.to_owned(), value)
        })
        .collect()
}

fn sample(samples: &BTreeMap<String, f64>, name: &str) -> f64 {
    *samples
        .get(name)
        .unwrap_or_else(|| panic!("no sample {name}; have: {:#?}", samples.keys()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_runs_steps_and_the_queue_workers_scale_on() {
    let mut fleet = Fleet::start(
        1,
        Timing {
            lease_ms: 2_000,
            worker_silence_ms: 3_000,
        },
    )
    .await;
    let records = Records::new(fleet.dir().join("records"));
    // One slot: of three runs, one runs and two wait in the queue.
    fleet.start_logged_worker(&records, "w1", "1", 1);
    fleet.wait_for_workers(1).await;
    let workflow = json!({"steps": [{"id": "work", "type": "agent", "agent": "slow"}]})
        .to_string()
        .into_bytes();
    let mut client = fleet.client(0).await.unwrap();
    let mut runs = Vec::new();
    for n in 0..3 {
        let run = harness::submit(&mut client, workflow.clone(), &json!(n)).await;
        runs.push(run);
    }

    let during = scrape(&fleet.metrics_url(0));
    assert_eq!(sample(&during, "baton_runs_started_total"), 3.0);
    assert_eq!(sample(&during, r#"baton_queue_depth{agent="slow"}"#), 2.0);
    assert!(sample(&during, r#"baton_queue_oldest_age_seconds{agent="slow"}"#) > 0.0);
    assert_eq!(sample(&during, "baton_workers_connected"), 1.0);
    assert_eq!(
        sample(&during, r#"baton_worker_free_slots{agent="slow"}"#),
        0.0
    );

    let deadline = Instant::now() + harness::DEADLINE;
    for run_id in &runs {
        loop {
            let record = client
                .get_run(GetRunRequest {
                    run_id: run_id.clone(),
                })
                .await
                .unwrap()
                .into_inner();
            if record.status != "running" {
                assert_eq!(record.status, "succeeded", "{}", record.error);
                break;
            }
            assert!(Instant::now() < deadline, "{run_id} did not finish");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    let after = scrape(&fleet.metrics_url(0));
    assert_eq!(
        sample(&after, r#"baton_runs_finished_total{status="succeeded"}"#),
        3.0
    );
    assert_eq!(
        sample(
            &after,
            r#"baton_steps_total{type="agent",outcome="succeeded"}"#
        ),
        3.0
    );
    assert_eq!(
        sample(&after, r#"baton_task_duration_seconds_count{agent="slow"}"#),
        3.0
    );
    // Each took about the agent's one second.
    assert!(sample(&after, r#"baton_task_duration_seconds_sum{agent="slow"}"#) >= 3.0);
    assert_eq!(
        sample(
            &after,
            r#"baton_task_queue_wait_seconds_count{agent="slow"}"#
        ),
        3.0
    );
    assert!(
        !after.keys().any(|k| k.starts_with("baton_queue_depth")),
        "no queue left"
    );
    // Redis's latency, per operation: one run created per submission, a transition per answer.
    assert_eq!(
        sample(
            &after,
            r#"baton_store_request_seconds_count{operation="create_run"}"#
        ),
        3.0
    );
    assert!(
        sample(
            &after,
            r#"baton_store_request_seconds_count{operation="apply_transition"}"#
        ) >= 3.0
    );
    assert_eq!(sample(&after, "baton_retries_total"), 0.0);
    assert_eq!(executions::read(records.root()).len(), 3);

    // The worker's own.
    let worker = scrape(&fleet.worker_metrics_url("w1"));
    assert_eq!(
        sample(
            &worker,
            r#"baton_worker_tasks_total{agent="slow",outcome="succeeded"}"#
        ),
        3.0
    );
    assert_eq!(
        sample(
            &worker,
            r#"baton_worker_task_duration_seconds_count{agent="slow"}"#
        ),
        3.0
    );
    assert_eq!(sample(&worker, "baton_worker_running_tasks"), 0.0);
    assert_eq!(sample(&worker, "baton_worker_slots"), 1.0);
    assert_eq!(sample(&worker, "baton_worker_sessions_total"), 1.0);
}

/// An OTLP collector's metrics service, in this test: the last value of each data point it was
/// sent, by `<service> <metric>{<labels>}` (a histogram's value is its count).
#[derive(Clone, Default)]
struct MetricsReceiver {
    points: std::sync::Arc<std::sync::Mutex<BTreeMap<String, f64>>>,
}

#[tonic::async_trait]
impl opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::MetricsService
    for MetricsReceiver
{
    async fn export(
        &self,
        request: tonic::Request<
            opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest,
        >,
    ) -> Result<
        tonic::Response<
            opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse,
        >,
        tonic::Status,
    > {
        use opentelemetry_proto::tonic::common::v1::any_value::Value;
        use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point};
        let text = |kv: &opentelemetry_proto::tonic::common::v1::KeyValue| match kv
            .value
            .as_ref()
            .and_then(|v| v.value.as_ref())
        {
            Some(Value::StringValue(s)) => s.clone(),
            other => format!("{other:?}"),
        };
        let key = |service: &str,
                   name: &str,
                   labels: &[opentelemetry_proto::tonic::common::v1::KeyValue]| {
            let labels: Vec<String> = labels
                .iter()
                .map(|kv| format!("{}=\"{}\"", kv.key, text(kv)))
                .collect();
            format!("{service} {name}{{{}}}", labels.join(","))
        };
        let mut points = self.points.lock().unwrap();
        for resource_metrics in request.into_inner().resource_metrics {
            let service = resource_metrics
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .map(text)
                .unwrap_or_default();
            for metric in resource_metrics
                .scope_metrics
                .iter()
                .flat_map(|s| &s.metrics)
            {
                let number =
                    |point: &opentelemetry_proto::tonic::metrics::v1::NumberDataPoint| match point
                        .value
                    {
                        Some(number_data_point::Value::AsDouble(x)) => x,
                        Some(number_data_point::Value::AsInt(n)) => n as f64,
                        None => f64::NAN,
                    };
                match &metric.data {
                    Some(Data::Sum(sum)) => {
                        assert!(sum.is_monotonic, "{} is a counter", metric.name);
                        for point in &sum.data_points {
                            points.insert(
                                key(&service, &metric.name, &point.attributes),
                                number(point),
                            );
                        }
                    }
                    Some(Data::Gauge(gauge)) => {
                        for point in &gauge.data_points {
                            points.insert(
                                key(&service, &metric.name, &point.attributes),
                                number(point),
                            );
                        }
                    }
                    Some(Data::Histogram(histogram)) => {
                        for point in &histogram.data_points {
                            assert_eq!(
                                point.bucket_counts.iter().sum::<u64>(),
                                point.count,
                                "{}: the buckets hold every sample",
                                metric.name
                            );
                            points.insert(
                                key(&service, &metric.name, &point.attributes),
                                point.count as f64,
                            );
                        }
                    }
                    other => panic!("unexpected data for {}: {other:?}", metric.name),
                }
            }
        }
        Ok(tonic::Response::new(Default::default()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_metrics_go_to_an_otlp_collector() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let receiver = MetricsReceiver::default();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::MetricsServiceServer::new(
                    receiver.clone(),
                ),
            )
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut fleet = Fleet::start_with_env(
        1,
        Timing {
            lease_ms: 2_000,
            worker_silence_ms: 3_000,
        },
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
            // This receiver takes metrics only.
            ("OTEL_TRACES_EXPORTER", "none"),
        ],
    )
    .await;
    let records = Records::new(fleet.dir().join("records"));
    fleet.start_logged_worker(&records, "w1", "0", 2);
    fleet.wait_for_workers(1).await;
    let workflow = json!({"steps": [{"id": "work", "type": "agent", "agent": "slow"}]})
        .to_string()
        .into_bytes();
    let mut client = fleet.client(0).await.unwrap();
    for n in 0..2 {
        harness::submit(&mut client, workflow.clone(), &json!(n)).await;
    }

    // Exported every 200 ms: wait for the batch that has both runs done.
    let expected = [
        ("baton-coordinator baton_runs_started{}", 2.0),
        (
            r#"baton-coordinator baton_runs_finished{status="succeeded"}"#,
            2.0,
        ),
        (
            r#"baton-coordinator baton_steps{type="agent",outcome="succeeded"}"#,
            2.0,
        ),
        (
            r#"baton-coordinator baton_task_duration_seconds{agent="slow"}"#,
            2.0,
        ),
        ("baton-coordinator baton_workers_connected{}", 1.0),
        (
            r#"baton-worker baton_worker_tasks{agent="slow",outcome="succeeded"}"#,
            2.0,
        ),
        ("baton-worker baton_worker_slots{}", 2.0),
    ];
    let deadline = Instant::now() + harness::DEADLINE;
    loop {
        let points = receiver.points.lock().unwrap().clone();
        let missing: Vec<_> = expected
            .iter()
            .filter(|(key, value)| points.get(*key) != Some(value))
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never received {missing:?}; got {points:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `GET url` with a one-second budget, as kubelet probes: the status code and the body, or
/// `None` when nothing answers.
fn probe(url: &str) -> Option<(u16, String)> {
    let rest = url.trim_start_matches("http://");
    let (address, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let address: std::net::SocketAddr = address.parse().expect("ip:port");
    let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {address}\r\nUser-Agent: kube-probe/1.32\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// Polls `url` until its answer satisfies `want`.
async fn until_probe(
    fleet: &Fleet,
    url: &str,
    what: &str,
    want: impl Fn(u16, &str) -> bool,
) -> (u16, String) {
    let deadline = Instant::now() + harness::DEADLINE;
    loop {
        let answer = probe(url);
        if let Some((status, body)) = &answer
            && want(*status, body)
        {
            return (*status, body.clone());
        }
        assert!(
            Instant::now() < deadline,
            "{url}: never {what}; last answer {answer:?}\n{}",
            fleet.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_and_readyz_follow_redis_and_the_worker_s_connection() {
    let mut fleet = Fleet::start(
        1,
        Timing {
            lease_ms: 2_000,
            worker_silence_ms: 3_000,
        },
    )
    .await;
    let base = fleet.metrics_url(0).trim_end_matches("/metrics").to_owned();
    let (healthz, readyz) = (format!("{base}/healthz"), format!("{base}/readyz"));
    assert_eq!(probe(&healthz).unwrap().0, 200);
    assert_eq!(probe(&readyz).unwrap(), (200, "ready\n".to_owned()));

    let records = Records::new(fleet.dir().join("records"));
    fleet.start_logged_worker(&records, "w1", "0", 1);
    let worker = fleet
        .worker_metrics_url("w1")
        .trim_end_matches("/metrics")
        .to_owned();
    let ready = |status: u16, _: &str| status == 200;
    until_probe(&fleet, &format!("{worker}/readyz"), "ready", ready).await;
    assert_eq!(probe(&format!("{worker}/healthz")).unwrap().0, 200);
    let metrics = scrape(&format!("{worker}/metrics"));
    assert_eq!(sample(&metrics, "baton_worker_connected"), 1.0);

    // Redis goes away: the coordinator is alive but must not be sent work.
    fleet.redis().stop();
    let (_, reason) = until_probe(&fleet, &readyz, "unready", |status, _| status == 503).await;
    assert!(reason.contains("store"), "{reason}");
    assert_eq!(probe(&healthz).unwrap().0, 200, "alive all the same");
    fleet.redis().start_again();
    until_probe(&fleet, &readyz, "ready again", ready).await;

    // Its coordinator gone, the worker is alive and unready.
    let status = fleet.terminate_coordinator(0).await;
    assert!(status.success(), "{status}");
    let (_, reason) = until_probe(
        &fleet,
        &format!("{worker}/readyz"),
        "unready",
        |status, _| status == 503,
    )
    .await;
    assert!(reason.contains("not connected"), "{reason}");
    assert_eq!(probe(&format!("{worker}/healthz")).unwrap().0, 200);
}

/// Attack: Redis reaches its `maxmemory` (under `noeviction`, its default) and refuses every
/// write. `/readyz` still said ready while no run could move, and reads failed too. Now
/// `/readyz` is 503 naming the memory, `baton runs get` and `runs list` still answer, and once
/// `maxmemory` is raised the coordinator is ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_memory_while_redis_refuses_writes_and_runs_stay_readable() {
    let fleet = Fleet::start(
        1,
        Timing {
            lease_ms: 2_000,
            worker_silence_ms: 3_000,
        },
    )
    .await;
    let readyz = fleet.metrics_url(0).replace("/metrics", "/readyz");
    let ready = |status: u16, _: &str| status == 200;
    until_probe(&fleet, &readyz, "ready", ready).await;
    let workflow = harness::root().join("examples/feature-development/workflow.json");
    let cli = |args: &[&str]| {
        let mut command = harness::baton();
        command.args(args).arg("--coordinator").arg(fleet.url(0));
        harness::output(&mut command, None)
    };
    let submitted = cli(&["submit", workflow.to_str().unwrap()]);
    assert!(submitted.status.success(), "{submitted:?}");
    let run_id = String::from_utf8_lossy(&submitted.stdout).trim().to_owned();

    let mut redis = fleet.redis_connection().await;
    let maxmemory = |bytes: u64| {
        let mut command = redis::cmd("CONFIG");
        command.arg("SET").arg("maxmemory").arg(bytes);
        command
    };
    let _: () = maxmemory(1).query_async(&mut redis).await.unwrap();

    let (_, reason) = until_probe(&fleet, &readyz, "unready", |status, _| status == 503).await;
    assert!(reason.contains("out of memory"), "{reason}");
    let got = cli(&["runs", "get", &run_id]);
    assert!(got.status.success(), "{got:?}");
    assert!(String::from_utf8_lossy(&got.stdout).contains(&run_id));
    let listed = cli(&["runs", "list"]);
    assert!(listed.status.success(), "{listed:?}");
    assert!(String::from_utf8_lossy(&listed.stdout).contains(&run_id));

    let _: () = maxmemory(0).query_async(&mut redis).await.unwrap();
    until_probe(&fleet, &readyz, "ready again", ready).await;
}

/// `baton coordinator --memory --listen 127.0.0.1:0` with `args`, run in `dir`, which must
/// refuse to start; what it said on stderr.
fn refused_start(dir: &std::path::Path, args: &[&str]) -> String {
    let mut command = harness::baton();
    command
        .current_dir(dir)
        .args(["coordinator", "--memory", "--listen", "127.0.0.1:0"])
        .args(args);
    let out = harness::output_within(&mut command, None, harness::DEADLINE);
    assert!(!out.status.success(), "started with {args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metrics_address_given_and_taken_is_an_error_naming_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let stderr = refused_start(dir.path(), &["--metrics-listen", &address]);
    assert!(
        stderr.contains(&format!("cannot serve metrics on {address}"))
            && stderr.contains("is already in use")
            && stderr.contains("--metrics-listen"),
        "{stderr}"
    );
}

/// `--trace-url` is checked when the coordinator starts, not found broken in the web UI's
/// links: an http(s) URL with `{trace_id}` in it, or the coordinator exits naming the flag and
/// what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_url_without_trace_id_or_not_http_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let refused = |trace_url: &str| {
        let args = ["--metrics-listen", "127.0.0.1:0", "--trace-url", trace_url];
        refused_start(dir.path(), &args)
    };
    let no_id = refused("https://jaeger.example/trace");
    assert!(no_id.contains("--trace-url"), "{no_id}");
    assert!(no_id.contains("{trace_id}"), "{no_id}");
    let script = refused("javascript:alert('{trace_id}')");
    assert!(script.contains("--trace-url"), "{script}");
    assert!(script.contains("http(s)"), "{script}");
    let relative = refused("/trace/{trace_id}");
    assert!(relative.contains("not a URL"), "{relative}");
}
