//! Principals and roles at the gRPC surface: every RPC against every role, workers limited to
//! their agents, who did what recorded as the principal, limits, and the tokens file reloaded;
//! whose runs a principal may change: its own, or anyone's as an operator, over gRPC and the
//! web API alike; and who may decide a run's approval: an approver, whoever submitted the run.
//!
//! The coordinator runs in this process (memory store, gRPC on loopback) with a tokens file,
//! exactly as `baton coordinator --auth-tokens FILE` serves; clients are real gRPC clients.
//! Who owns a run is checked against the real `baton coordinator` process, on both its ports.

#[path = "support/cluster.rs"]
mod harness;
#[path = "../coordinator/tests/support/running.rs"]
mod running;
#[path = "support/spec.rs"]
mod spec;

use std::path::Path;
use std::time::Duration;

use baton_coordinator::auth::Gate;
use baton_coordinator::grpc::{Faults, Security};
use baton_coordinator::store::memory::MemoryStore;
use baton_coordinator::{Config, Coordinator};
use baton_proto::connection::{ClientSecurity, Connection};
use baton_proto::v1::run_service_client::RunServiceClient;
use baton_proto::v1::worker_service_client::WorkerServiceClient;
use baton_proto::v1::{
    CancelRunRequest, DecideApprovalRequest, GetRunRequest, GetStatsRequest, ListRunsRequest,
    QueryDecisionsRequest, RetryRunRequest, SubmitRunRequest, VerifyRunRequest, WatchRunRequest,
    WorkerQueryDecisionsRequest,
};
use baton_worker::Worker;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tonic::Code;

fn sha(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// One principal per role, each with the token `<name>-token`.
fn tokens_file(extra: &str) -> String {
    let mut text = String::new();
    for (name, roles, more) in [
        ("reader", "\"read\"", ""),
        ("submitter", "\"submit\"", ""),
        ("approver", "\"approve\", \"read\"", ""),
        ("operator", "\"operate\"", ""),
        ("pool", "\"worker\"", "agents = [\"planner\"]\n"),
        ("root", "\"admin\"", ""),
        ("slow", "\"submit\"", "submits_per_second = 0.01\n"),
        ("capped", "\"submit\", \"read\"", "max_running_runs = 1\n"),
    ] {
        text.push_str(&format!(
            "[principals.{name}]\ntoken_sha256 = \"{}\"\nroles = [{roles}]\n{more}\n",
            sha(&format!("{name}-token"))
        ));
    }
    text.push_str(extra);
    text
}

struct Server {
    url: String,
    _dir: tempfile::TempDir,
    tokens: std::path::PathBuf,
    _coordinator: running::Running<MemoryStore>,
}

async fn server() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, tokens_file("")).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let coordinator = running::running(Coordinator::new(MemoryStore::new(), Config::default()));
    let security = Security {
        gate: Gate::configure(Some(tokens.clone()), false, false).unwrap(),
        tls: None,
    };
    tokio::spawn(baton_coordinator::grpc::serve_with(
        listener,
        coordinator.clone(),
        std::future::pending(),
        security,
        Faults::none(),
    ));
    Server {
        url,
        _dir: dir,
        tokens,
        _coordinator: coordinator,
    }
}

async fn connection(url: &str, token: Option<&str>) -> Connection {
    let security = ClientSecurity {
        token: token.map(str::to_owned),
        ..ClientSecurity::default()
    };
    let channel = security.endpoint(url).unwrap().connect().await.unwrap();
    security.authorize(channel).unwrap()
}

async fn runs(url: &str, token: Option<&str>) -> RunServiceClient<Connection> {
    RunServiceClient::new(connection(url, token).await)
}

fn submit_request(workflow: &Value) -> SubmitRunRequest {
    SubmitRunRequest {
        workflow: workflow.to_string().into_bytes(),
        input: Some(baton_proto::Json::new(b"\"x\"".to_vec())),
        idempotency_key: String::new(),
    }
}

/// Calls `rpc` as the holder of `token`; the status code (`Ok` when it succeeded).
async fn call(url: &str, token: Option<&str>, rpc: &str) -> Code {
    let mut client = runs(url, token).await;
    let mut worker = WorkerServiceClient::new(connection(url, token).await);
    // Well formed, so that a call the gate lets through reaches the service (and is not found).
    let missing = "0191d2a4-7b1c-7def-8abc-0123456789ab".to_owned();
    let code = |result: Result<(), tonic::Status>| result.err().map_or(Code::Ok, |s| s.code());
    match rpc {
        "SubmitRun" => code(
            client
                .submit_run(submit_request(
                    &json!({"steps": [{"id": "t", "type": "transform", "transform": "input"}]}),
                ))
                .await
                .map(drop),
        ),
        "GetRun" => code(
            client
                .get_run(GetRunRequest { run_id: missing })
                .await
                .map(drop),
        ),
        "ListRuns" => code(
            client
                .list_runs(ListRunsRequest {
                    limit: 1,
                    ..Default::default()
                })
                .await
                .map(drop),
        ),
        "WatchRun" => code(
            client
                .watch_run(WatchRunRequest { run_id: missing })
                .await
                .map(drop),
        ),
        "CancelRun" => code(
            client
                .cancel_run(CancelRunRequest {
                    run_id: missing,
                    reason: String::new(),
                })
                .await
                .map(drop),
        ),
        "RetryRun" => code(
            client
                .retry_run(RetryRunRequest { run_id: missing })
                .await
                .map(drop),
        ),
        "DecideApproval" => code(
            client
                .decide_approval(DecideApprovalRequest {
                    run_id: missing,
                    step_id: "a".into(),
                    approved: true,
                    ..Default::default()
                })
                .await
                .map(drop),
        ),
        "GetStats" => code(client.get_stats(GetStatsRequest {}).await.map(drop)),
        "QueryDecisions" => code(
            client
                .query_decisions(QueryDecisionsRequest {
                    run_id: missing,
                    text: "x".into(),
                    ..Default::default()
                })
                .await
                .map(drop),
        ),
        "VerifyRun" => code(
            client
                .verify_run(VerifyRunRequest { run_id: missing })
                .await
                .map(drop),
        ),
        "TaskStream" => code(
            worker
                .task_stream(tokio_stream::iter(Vec::new()))
                .await
                .map(drop),
        ),
        "WorkerQueryDecisions" => code(
            worker
                .query_decisions(WorkerQueryDecisionsRequest::default())
                .await
                .map(drop),
        ),
        other => panic!("no such RPC in the table: {other}"),
    }
}

/// Each RPC and the roles that let a principal call it (CancelRun and RetryRun: of its own runs
/// with `submit`, of anyone's with `operate`; the service checks whose the run is).
const RPCS: [(&str, &[&str]); 12] = [
    ("SubmitRun", &["submit"]),
    ("GetRun", &["read"]),
    ("ListRuns", &["read"]),
    ("WatchRun", &["read"]),
    ("CancelRun", &["submit", "operate"]),
    ("RetryRun", &["submit", "operate"]),
    ("DecideApproval", &["approve"]),
    ("GetStats", &["read"]),
    ("QueryDecisions", &["read"]),
    ("VerifyRun", &["read"]),
    ("TaskStream", &["worker"]),
    ("WorkerQueryDecisions", &["worker"]),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_answers_each_role_as_the_table_says() {
    let server = server().await;
    let roles_of = |principal: &str| -> &'static [&'static str] {
        match principal {
            "reader" => &["read"],
            "submitter" => &["submit"],
            "approver" => &["approve", "read"],
            "operator" => &["operate"],
            "pool" => &["worker"],
            "root" => &["read", "submit", "approve", "operate", "worker"],
            _ => unreachable!(),
        }
    };
    let mut checked = 0;
    for (rpc, roles) in RPCS {
        for principal in [
            "reader",
            "submitter",
            "approver",
            "operator",
            "pool",
            "root",
        ] {
            let token = format!("{principal}-token");
            let code = call(&server.url, Some(&token), rpc).await;
            if roles.iter().any(|role| roles_of(principal).contains(role)) {
                assert!(
                    !matches!(code, Code::PermissionDenied | Code::Unauthenticated),
                    "{principal} may call {rpc}, got {code:?}"
                );
            } else {
                assert_eq!(code, Code::PermissionDenied, "{principal} calling {rpc}");
            }
            checked += 1;
        }
        assert_eq!(
            call(&server.url, None, rpc).await,
            Code::Unauthenticated,
            "{rpc} without a token"
        );
        assert_eq!(
            call(&server.url, Some("guess"), rpc).await,
            Code::Unauthenticated,
            "{rpc} with an unknown token"
        );
    }
    assert_eq!(checked, 72);

    // The refusal names the role that is missing.
    let refused = runs(&server.url, Some("reader-token"))
        .await
        .decide_approval(DecideApprovalRequest::default())
        .await
        .unwrap_err();
    assert_eq!(
        refused.message(),
        "principal `reader` may not call DecideApproval: that needs the `approve` role, and it has `read`"
    );
    let refused = runs(&server.url, Some("approver-token"))
        .await
        .retry_run(RetryRunRequest::default())
        .await
        .unwrap_err();
    assert_eq!(
        refused.message(),
        "principal `approver` may not call RetryRun: that needs the `submit` or `operate` role, and it has `read`, `approve`"
    );
    // Health checking stays open for probes.
    let channel = tonic::transport::Endpoint::from_shared(server.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let health = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await;
    assert!(health.is_ok(), "{health:?}");
}

async fn wait_for_status(
    url: &str,
    token: &str,
    run_id: &str,
    status: &str,
) -> baton_proto::v1::RunRecord {
    let mut client = runs(url, Some(token)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let record = client
            .get_run(GetRunRequest {
                run_id: run_id.into(),
            })
            .await
            .unwrap()
            .into_inner();
        if record.status == status {
            return record;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{run_id} never {status}: {record:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn context(record: &baton_proto::v1::RunRecord) -> Value {
    serde_json::from_slice(&record.context.as_ref().unwrap().json).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approver_and_the_canceller_recorded_are_the_principals() {
    let server = server().await;
    let workflow = json!({"steps": [
        {"id": "gate", "type": "approval", "message": "ship it?", "next": "done"},
        {"id": "done", "type": "transform", "transform": "input"}
    ]});
    let mut submitter = runs(&server.url, Some("submitter-token")).await;
    let run_id = submitter
        .submit_run(submit_request(&workflow))
        .await
        .unwrap()
        .into_inner()
        .run_id;
    runs(&server.url, Some("approver-token"))
        .await
        .decide_approval(DecideApprovalRequest {
            run_id: run_id.clone(),
            step_id: "gate".into(),
            approved: true,
            approver: "somebody-else".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let record = wait_for_status(&server.url, "root-token", &run_id, "succeeded").await;
    assert_eq!(context(&record)["gate"]["approver"], json!("approver"));

    let second = submitter
        .submit_run(submit_request(&workflow))
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let cancelled = submitter
        .cancel_run(CancelRunRequest {
            run_id: second,
            reason: "not today".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cancelled.status, "cancelled");
    assert_eq!(cancelled.error, "cancelled by `submitter`: not today");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_is_refused_for_an_agent_outside_its_principal_s_list() {
    let server = server().await;
    let worker = |agents: &[&'static str]| {
        let mut builder =
            Worker::builder()
                .coordinator(server.url.clone())
                .security(ClientSecurity {
                    token: Some("pool-token".into()),
                    ..Default::default()
                });
        for &agent in agents {
            builder = builder.agent(agent, |_| async { Ok(json!({"ok": true})) });
        }
        builder.build()
    };
    let refused = tokio::time::timeout(
        Duration::from_secs(20),
        worker(&["planner", "coder"]).run(std::future::pending()),
    )
    .await
    .expect("a refused worker stops at once")
    .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("principal `pool` may not serve agent `coder` (its agents: planner)"),
        "{refused}"
    );

    // Within its list, it works.
    tokio::spawn(worker(&["planner"]).run(std::future::pending()));
    let workflow = json!({"steps": [{"id": "plan", "type": "agent", "agent": "planner"}]});
    let run_id = runs(&server.url, Some("submitter-token"))
        .await
        .submit_run(submit_request(&workflow))
        .await
        .unwrap()
        .into_inner()
        .run_id;
    wait_for_status(&server.url, "reader-token", &run_id, "succeeded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_past_its_submit_rate_is_told_resource_exhausted() {
    let server = server().await;
    let workflow = json!({"steps": [{"id": "t", "type": "transform", "transform": "input"}]});
    let mut slow = runs(&server.url, Some("slow-token")).await;
    slow.submit_run(submit_request(&workflow)).await.unwrap();
    let refused = slow
        .submit_run(submit_request(&workflow))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused
            .message()
            .contains("`slow` may submit 0.01 runs a second"),
        "{}",
        refused.message()
    );
    // Others are not held back by it.
    runs(&server.url, Some("submitter-token"))
        .await
        .submit_run(submit_request(&workflow))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_at_its_running_runs_limit_is_told_resource_exhausted_until_one_ends() {
    let server = server().await;
    let waits = json!({"steps": [{"id": "gate", "type": "approval", "message": "go?"}]});
    let mut capped = runs(&server.url, Some("capped-token")).await;
    let first = capped
        .submit_run(submit_request(&waits))
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let refused = capped.submit_run(submit_request(&waits)).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(
        refused.message(),
        "principal `capped` has 1 runs running; it may have 1 at once (max_running_runs)"
    );
    // The run records who submitted it.
    let record = capped
        .get_run(GetRunRequest {
            run_id: first.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(record.submitted_by, "capped");
    // Once it ends, there is room again.
    capped
        .cancel_run(CancelRunRequest {
            run_id: first,
            reason: String::new(),
        })
        .await
        .unwrap();
    capped.submit_run(submit_request(&waits)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tokens_file_is_read_again_when_it_changes() {
    let server = server().await;
    let newcomer = "[principals.newcomer]\ntoken_sha256 = \"".to_owned()
        + &sha("new-token")
        + "\"\nroles = [\"read\"]\n";
    assert_eq!(
        call(&server.url, Some("new-token"), "ListRuns").await,
        Code::Unauthenticated
    );
    rewrite(&server.tokens, &tokens_file(&newcomer));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while call(&server.url, Some("new-token"), "ListRuns").await != Code::Ok {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new principal never got in"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A file that no longer parses changes nothing: everyone keeps their access.
    rewrite(&server.tokens, "[principals.broken\n");
    tokio::time::sleep(baton_coordinator::auth::RELOAD_INTERVAL * 2).await;
    assert_eq!(
        call(&server.url, Some("new-token"), "ListRuns").await,
        Code::Ok
    );
}

/// Replaces a file the way Kubernetes updates a mounted secret: a new file renamed over it.
fn rewrite(path: &Path, text: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, path).unwrap();
}

/// A `baton coordinator --memory --auth-tokens FILE` process, on a gRPC port and an HTTP port
/// (web UI and API) of its own; killed on drop.
struct Secured {
    child: std::process::Child,
    grpc: String,
    http: String,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Secured {
    async fn start(tokens: &str) -> Secured {
        // reqwest is built without a TLS provider of its own; plain HTTP needs one all the same.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens.toml");
        std::fs::write(&file, tokens).unwrap();
        let log = dir.path().join("coordinator.log");
        let (grpc_port, http_port) = (harness::free_port(), harness::free_port());
        let child = harness::baton()
            .args(["coordinator", "--memory", "--listen"])
            .arg(format!("127.0.0.1:{grpc_port}"))
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{http_port}"))
            .arg("--auth-tokens")
            .arg(&file)
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(dir.path().join("stderr.log")).unwrap())
            .spawn()
            .expect("start baton coordinator");
        let mut secured = Secured {
            child,
            grpc: format!("http://127.0.0.1:{grpc_port}"),
            http: format!("http://127.0.0.1:{http_port}"),
            log,
            _dir: dir,
        };
        let deadline = tokio::time::Instant::now() + harness::DEADLINE;
        let http = reqwest::Client::new();
        loop {
            if let Some(status) = secured.child.try_wait().unwrap() {
                panic!("the coordinator exited with {status}:\n{}", secured.logs());
            }
            let ready = http.get(format!("{}/readyz", secured.http)).send().await;
            if ready.is_ok_and(|response| response.status().is_success())
                && std::net::TcpStream::connect(("127.0.0.1", grpc_port)).is_ok()
            {
                return secured;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the coordinator never got ready:\n{}",
                secured.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn logs(&self) -> String {
        let stderr = self.log.with_file_name("stderr.log");
        format!(
            "{}{}",
            std::fs::read_to_string(&self.log).unwrap_or_default(),
            std::fs::read_to_string(stderr).unwrap_or_default()
        )
    }

    /// `POST /api/<path>` with a JSON body as the holder of `token`, as the run's page sends
    /// it: the status and the JSON answer.
    async fn post(&self, path: &str, body: Value, token: &str) -> (u16, Value) {
        let response = reqwest::Client::new()
            .post(format!("{}/api/{path}", self.http))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }
}

impl Drop for Secured {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("the coordinator's log:\n{}", self.logs());
        }
    }
}

/// Two submitters, an operator, an approver, an admin: each may read.
fn owners_tokens() -> String {
    [
        ("alice", "\"submit\", \"read\""),
        ("bob", "\"submit\", \"read\""),
        ("ops", "\"operate\", \"read\""),
        ("carol", "\"approve\", \"read\""),
        ("root", "\"admin\""),
    ]
    .iter()
    .map(|(name, roles)| {
        format!(
            "[principals.{name}]\ntoken_sha256 = \"{}\"\nroles = [{roles}]\n\n",
            sha(&format!("{name}-token"))
        )
    })
    .collect()
}

async fn submit_as(url: &str, token: &str, workflow: &Value) -> String {
    runs(url, Some(token))
        .await
        .submit_run(submit_request(workflow))
        .await
        .unwrap()
        .into_inner()
        .run_id
}

async fn status_of(url: &str, run_id: &str) -> String {
    runs(url, Some("root-token"))
        .await
        .get_run(GetRunRequest {
            run_id: run_id.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
}

fn not_owner(principal: &str, change: &str, run_id: &str) -> String {
    format!(
        "principal `{principal}` may not {change} run {run_id}: it belongs to `alice`, who \
         submitted it; changing another principal's run needs the `operate` role (or `admin`)"
    )
}

/// The attack: any principal with `submit` cancelled (and retried) anyone's run. Now `bob`
/// is refused on alice's runs over gRPC and the web API, naming himself, the owner and the
/// role that would do, and the run is untouched; alice, an operator and an admin may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bob_may_not_cancel_or_retry_alices_run_an_operator_or_admin_may() {
    let server = Secured::start(&owners_tokens()).await;
    let url = server.grpc.as_str();
    let waits = json!({"id": "waits", "steps": [
        {"id": "gate", "type": "approval", "message": "go?"}
    ]});
    // A path into a string: the step fails, and so does the run.
    let fails = json!({"id": "fails", "steps": [
        {"id": "t", "type": "transform", "transform": "input.no.such.field"}
    ]});

    // Cancel, over gRPC.
    let first = submit_as(url, "alice-token", &waits).await;
    let refused = runs(url, Some("bob-token"))
        .await
        .cancel_run(CancelRunRequest {
            run_id: first.clone(),
            reason: "mine now".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert_eq!(refused.message(), not_owner("bob", "cancel", &first));
    assert_eq!(status_of(url, &first).await, "running");
    // Over the web API, as the run's page sends it.
    let (status, body) = server
        .post(
            &format!("runs/{first}/cancel"),
            json!({"reason": "mine now"}),
            "bob-token",
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"], not_owner("bob", "cancel", &first));
    assert_eq!(status_of(url, &first).await, "running");
    // An operator may, over gRPC; the run records who.
    let cancelled = runs(url, Some("ops-token"))
        .await
        .cancel_run(CancelRunRequest {
            run_id: first.clone(),
            reason: "stuck".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cancelled.status, "cancelled");
    assert_eq!(cancelled.error, "cancelled by `ops`: stuck");
    // An admin may, over the web API; and the owner may.
    let second = submit_as(url, "alice-token", &waits).await;
    let (status, body) = server
        .post(&format!("runs/{second}/cancel"), json!({}), "root-token")
        .await;
    assert_eq!(
        (status, &body["status"]),
        (200, &json!("cancelled")),
        "{body}"
    );
    let third = submit_as(url, "alice-token", &waits).await;
    let (status, body) = server
        .post(&format!("runs/{third}/cancel"), json!({}), "alice-token")
        .await;
    assert_eq!(
        (status, &body["error"]),
        (200, &json!("cancelled by `alice`")),
        "{body}"
    );

    // Retry, over gRPC and the web API.
    let failed = submit_as(url, "alice-token", &fails).await;
    wait_for_status(url, "root-token", &failed, "failed").await;
    let refused = runs(url, Some("bob-token"))
        .await
        .retry_run(RetryRunRequest {
            run_id: failed.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert_eq!(refused.message(), not_owner("bob", "retry", &failed));
    let (status, body) = server
        .post(&format!("runs/{failed}/retry"), json!({}), "bob-token")
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"], not_owner("bob", "retry", &failed));
    assert_eq!(
        status_of(url, &failed).await,
        "failed",
        "bob's retry changed nothing"
    );
    // The owner may over gRPC, an operator over the web API: each is a redrive (the step
    // fails again, as a new visit).
    runs(url, Some("alice-token"))
        .await
        .retry_run(RetryRunRequest {
            run_id: failed.clone(),
        })
        .await
        .unwrap();
    let record = wait_for_status(url, "root-token", &failed, "failed").await;
    assert_eq!(record.steps[0].visits, 2, "{record:?}");
    let (status, body) = server
        .post(&format!("runs/{failed}/retry"), json!({}), "ops-token")
        .await;
    assert_eq!(status, 200, "{body}");
    let record = wait_for_status(url, "root-token", &failed, "failed").await;
    assert_eq!(record.steps[0].visits, 3, "{record:?}");
}

/// What the gate tells a principal without `approve` that decides an approval.
fn needs_approve(principal: &str, roles: &str) -> String {
    format!(
        "principal `{principal}` may not call DecideApproval: that needs the `approve` role, \
         and it has {roles}"
    )
}

/// Issue 28, point 6, for approvals: deciding an approval of another principal's run takes
/// `approve` (or `admin`), the role SECURITY.md defines for whoever lets runs go on. `bob`,
/// with `submit`, is refused on alice's run over gRPC and the web API, naming the role; so is
/// alice herself (an approval gate is not its submitter's to pass) and an operator (`operate`
/// stops and resumes runs, it does not let them through). The run still waits; `carol`, with
/// `approve`, decides it over either port and is recorded as the approver, whatever the
/// request names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bob_may_not_decide_alices_approval_an_approver_may() {
    let server = Secured::start(&owners_tokens()).await;
    let url = server.grpc.as_str();
    let waits = json!({"id": "waits", "steps": [
        {"id": "gate", "type": "approval", "message": "ship it?", "next": "done"},
        {"id": "done", "type": "transform", "transform": "input"}
    ]});
    let decide = |run_id: &str| DecideApprovalRequest {
        run_id: run_id.to_owned(),
        step_id: "gate".into(),
        approved: true,
        approver: "somebody-else".into(),
        ..Default::default()
    };

    let first = submit_as(url, "alice-token", &waits).await;
    for (token, principal, roles) in [
        ("bob-token", "bob", "`read`, `submit`"),
        ("alice-token", "alice", "`read`, `submit`"),
        ("ops-token", "ops", "`read`, `operate`"),
    ] {
        let refused = runs(url, Some(token))
            .await
            .decide_approval(decide(&first))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::PermissionDenied, "{principal}");
        assert_eq!(refused.message(), needs_approve(principal, roles));
    }
    // Over the web API, as the run's page sends it.
    let (status, body) = server
        .post(
            &format!("runs/{first}/approvals/gate"),
            json!({"approved": true}),
            "bob-token",
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"], needs_approve("bob", "`read`, `submit`"));
    let record = wait_for_status(url, "root-token", &first, "running").await;
    assert!(
        context(&record).get("gate").is_none(),
        "no decision was recorded: {record:?}"
    );

    // An approver may, over gRPC; the run records who, not the name the request gave.
    runs(url, Some("carol-token"))
        .await
        .decide_approval(decide(&first))
        .await
        .unwrap();
    let record = wait_for_status(url, "root-token", &first, "succeeded").await;
    assert_eq!(context(&record)["gate"]["approver"], json!("carol"));
    // And over the web API.
    let second = submit_as(url, "alice-token", &waits).await;
    let (status, body) = server
        .post(
            &format!("runs/{second}/approvals/gate"),
            json!({"approved": true, "comment": "looks right"}),
            "carol-token",
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let record = wait_for_status(url, "root-token", &second, "succeeded").await;
    assert_eq!(context(&record)["gate"]["approver"], json!("carol"));
}

/// A reason or comment is kept with the run for good: a 10 MiB one made every read of the run
/// carry it. Refused, naming the field and the limit, and the run is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_mebibyte_cancel_reason_or_comment_is_refused_naming_the_field_and_the_limit() {
    let server = server().await;
    let waits = json!({"steps": [{"id": "gate", "type": "approval", "message": "go?"}]});
    let run_id = submit_as(&server.url, "root-token", &waits).await;
    let mut client = runs(&server.url, Some("root-token")).await;
    let huge = "x".repeat(10 << 20);
    let refused = client
        .cancel_run(CancelRunRequest {
            run_id: run_id.clone(),
            reason: huge.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(
        refused.message(),
        "reason is 10485760 bytes; the limit is 4096"
    );
    let refused = client
        .decide_approval(DecideApprovalRequest {
            run_id: run_id.clone(),
            step_id: "gate".into(),
            approved: true,
            comment: huge,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(
        refused.message(),
        "comment is 10485760 bytes; the limit is 16384"
    );
    let record = wait_for_status(&server.url, "root-token", &run_id, "running").await;
    assert!(record.error.is_empty(), "{record:?}");
}

/// Ids a client names reach the store's keys only as ids could be: a run id that is no UUID,
/// a workflow filter with a brace or an escape, are refused as invalid arguments, and a
/// well-formed id of no run is not found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_and_filters_that_could_name_nothing_are_invalid_arguments() {
    let server = server().await;
    let mut client = runs(&server.url, Some("root-token")).await;
    let refused = client
        .get_run(GetRunRequest {
            run_id: "{x}".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused
            .message()
            .starts_with("run_id: \"{x}\" is not a run id"),
        "{}",
        refused.message()
    );
    let missing = client
        .get_run(GetRunRequest {
            run_id: "0191d2a4-7b1c-7def-8abc-0123456789ab".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    let refused = client
        .list_runs(ListRunsRequest {
            workflow_id: "x}:runs\u{1b}[2J".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused
            .message()
            .starts_with("workflow_id: a workflow id \"x}:runs\\u{1b}[2J\" holds an unprintable"),
        "{}",
        refused.message()
    );
}
