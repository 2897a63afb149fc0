//! The coordinator's port, secured, with the real `baton` binaries: protected mode (loopback
//! clients only until something is configured); TLS and mTLS: plaintext refused, `https://`
//! clients and workers served, client certificates required and naming principals, and a
//! certificate replaced on disk served to the next connection while open streams go on. Every
//! certificate is made here, with rcgen.

#[path = "support/certs.rs"]
mod certs;
#[path = "support/coordinator_process.rs"]
mod coordinator_process;
#[path = "support/cluster.rs"]
mod harness;
#[path = "support/otlp.rs"]
mod otlp;
#[path = "support/recipes.rs"]
mod recipes;
#[path = "support/spec.rs"]
mod spec;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use baton_proto::connection::{ClientSecurity, Connection};
use baton_proto::v1::run_service_client::RunServiceClient;
use baton_proto::v1::{
    DecideApprovalRequest, ListRunsRequest, SubmitRunRequest, WatchRunRequest, run_event,
};
use certs::{Ca, replace};
use coordinator_process::{
    Coordinator, assert_listed, free_port, run_baton, runs_list, text, write,
};
use harness::{DEADLINE, baton, output};
use serde_json::json;

/// An address of this machine that is not a loopback one (from the kernel's table of local
/// addresses), to reach the coordinator as a client from elsewhere would.
fn non_loopback_address() -> String {
    let table = std::fs::read_to_string("/proc/net/fib_trie").expect("/proc/net/fib_trie");
    let lines: Vec<&str> = table.lines().collect();
    lines
        .windows(2)
        .filter(|pair| pair[1].trim() == "/32 host LOCAL")
        .filter_map(|pair| pair[0].trim().strip_prefix("|-- "))
        .find(|address| !address.starts_with("127."))
        .expect("this machine has an address besides loopback")
        .to_owned()
}

#[test]
fn protected_mode_answers_only_loopback_clients_until_told_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let address = non_loopback_address();
    let start = |extra: &[&str]| {
        let port = free_port();
        let mut args = vec!["--listen".to_owned(), format!("0.0.0.0:{port}")];
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        (Coordinator::start_on(dir.path(), port, &args), port)
    };
    let list = |host: &str, port: u16| runs_list(&format!("http://{host}:{port}"), &[], &[]);

    let (coordinator, port) = start(&[]);
    let local = list("127.0.0.1", port);
    assert!(local.status.success(), "{}", text(&local.stderr));
    let remote = list(&address, port);
    assert!(!remote.status.success(), "a client from {address} got in");
    let said = text(&remote.stderr);
    assert!(
        said.contains("answers only clients on its own machine")
            && said.contains("--auth-tokens")
            && said.contains("Unauthenticated"),
        "{said}"
    );
    assert!(
        coordinator
            .log()
            .contains("loopback clients only (protected mode)"),
        "{}",
        coordinator.log()
    );
    drop(coordinator);

    let (_open, port) = start(&["--allow-unauthenticated"]);
    let remote = list(&address, port);
    assert!(remote.status.success(), "{}", text(&remote.stderr));
}

#[test]
fn a_tls_coordinator_refuses_plaintext_and_answers_https_clients() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("server");
    let (cert, key) = ca
        .leaf(&["localhost", "127.0.0.1"])
        .write(dir.path(), "server");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem);
    let coordinator = Coordinator::start(
        dir.path(),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );

    let plaintext = runs_list(&coordinator.url("http", "127.0.0.1"), &[], &[]);
    assert!(
        !plaintext.status.success(),
        "a plaintext client got an answer"
    );

    let url = coordinator.url("https", "localhost");
    let unknown_ca = runs_list(&url, &[], &[]);
    assert!(!unknown_ca.status.success());
    assert!(
        text(&unknown_ca.stderr).contains("UnknownIssuer"),
        "{}",
        text(&unknown_ca.stderr)
    );

    for (args, env) in [
        (vec!["--tls-ca", ca_file.to_str().unwrap()], vec![]),
        (vec![], vec![("BATON_TLS_CA", ca_file.to_str().unwrap())]),
    ] {
        assert_listed(&coordinator, &url, &args, &env);
    }
}

#[test]
fn mtls_lets_in_only_clients_whose_certificate_the_client_ca_signed() {
    let dir = tempfile::tempdir().unwrap();
    let server_ca = Ca::new("server");
    let client_ca = Ca::new("clients");
    let (cert, key) = server_ca.leaf(&["localhost"]).write(dir.path(), "server");
    let server_ca_file = write(dir.path(), "server-ca.pem", &server_ca.pem);
    let client_ca_file = write(dir.path(), "client-ca.pem", &client_ca.pem);
    let (ops_cert, ops_key) = client_ca
        .leaf(&["ops.clients.example"])
        .write(dir.path(), "ops");
    let (pool_cert, pool_key) = client_ca
        .leaf(&["pool.workers.example"])
        .write(dir.path(), "pool");
    let (stranger_cert, stranger_key) = Ca::new("elsewhere")
        .leaf(&["ops.clients.example"])
        .write(dir.path(), "stranger");
    // Principals named by their certificates, no tokens at all.
    let tokens = write(
        dir.path(),
        "principals.toml",
        "[principals.ops]\nclient_cert_names = [\"ops.clients.example\"]\nroles = [\"submit\", \"read\"]\n\
         [principals.pool]\nclient_cert_names = [\"pool.workers.example\"]\nroles = [\"worker\"]\nagents = [\"noop\", \"blob64k\"]\n",
    );
    let coordinator = Coordinator::start(
        dir.path(),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--tls-client-ca",
            client_ca_file.to_str().unwrap(),
            "--auth-tokens",
            tokens.to_str().unwrap(),
        ],
    );
    let url = coordinator.url("https", "localhost");
    let trust = ("BATON_TLS_CA", server_ca_file.to_str().unwrap());

    let anonymous = runs_list(&url, &[], &[trust]);
    assert!(
        !anonymous.status.success(),
        "a client without a certificate got in"
    );
    let stranger = runs_list(
        &url,
        &[
            "--tls-cert",
            stranger_cert.to_str().unwrap(),
            "--tls-key",
            stranger_key.to_str().unwrap(),
        ],
        &[trust],
    );
    assert!(
        !stranger.status.success(),
        "a certificate of another CA got in"
    );

    // A worker with its own certificate, and a client with another: a run goes through.
    let worker_log = std::fs::File::create(dir.path().join("worker.log")).unwrap();
    let mut worker = baton()
        .args([
            "worker",
            "--bench-agents",
            "--no-metrics",
            "--coordinator",
            &url,
        ])
        .envs([
            trust,
            ("BATON_TLS_CLIENT_CERT", pool_cert.to_str().unwrap()),
            ("BATON_TLS_CLIENT_KEY", pool_key.to_str().unwrap()),
        ])
        .stdout(Stdio::from(worker_log.try_clone().unwrap()))
        .stderr(Stdio::from(worker_log))
        .spawn()
        .unwrap();
    let workflow = write(
        dir.path(),
        "workflow.json",
        &json!({"steps": [{"id": "s", "type": "agent", "agent": "noop"}]}).to_string(),
    );
    let submitted = run_baton(
        &[
            "submit",
            workflow.to_str().unwrap(),
            "--watch",
            "--coordinator",
            &url,
        ],
        &[
            trust,
            ("BATON_TLS_CLIENT_CERT", ops_cert.to_str().unwrap()),
            ("BATON_TLS_CLIENT_KEY", ops_key.to_str().unwrap()),
        ],
    );
    let _ = worker.kill();
    let _ = worker.wait();
    assert!(
        submitted.status.success(),
        "{}\n{}\nworker:\n{}",
        text(&submitted.stdout),
        text(&submitted.stderr),
        std::fs::read_to_string(dir.path().join("worker.log")).unwrap_or_default()
    );
    assert!(
        text(&submitted.stdout).contains("succeeded"),
        "{}",
        text(&submitted.stdout)
    );

    // The ops certificate names a principal without the worker role: as a worker, it is refused
    // at once, and the worker exits naming why.
    let refused = run_baton(
        &[
            "worker",
            "--bench-agents",
            "--no-metrics",
            "--coordinator",
            &url,
        ],
        &[
            trust,
            ("BATON_TLS_CLIENT_CERT", ops_cert.to_str().unwrap()),
            ("BATON_TLS_CLIENT_KEY", ops_key.to_str().unwrap()),
        ],
    );
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr)
            .contains("principal `ops` may not call TaskStream: that needs the `worker` role"),
        "{}",
        text(&refused.stderr)
    );
}

async fn client(url: &str, ca: &str) -> RunServiceClient<Connection> {
    let security = ClientSecurity {
        ca_pem: Some(ca.as_bytes().to_vec()),
        ..ClientSecurity::default()
    };
    let channel = security.endpoint(url).unwrap().connect().await.unwrap();
    RunServiceClient::new(security.authorize(channel).unwrap())
}

async fn reachable_with(url: &str, ca: &str) -> bool {
    let security = ClientSecurity {
        ca_pem: Some(ca.as_bytes().to_vec()),
        ..ClientSecurity::default()
    };
    let Ok(channel) = security.endpoint(url).unwrap().connect().await else {
        return false;
    };
    let mut client = RunServiceClient::new(security.authorize(channel).unwrap());
    client
        .list_runs(ListRunsRequest {
            limit: 1,
            ..Default::default()
        })
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_certificate_is_served_to_the_next_connection_and_open_streams_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let (old_ca, new_ca) = (Ca::new("old"), Ca::new("new"));
    let (cert, key) = old_ca.leaf(&["localhost"]).write(dir.path(), "server");
    let coordinator = Coordinator::start(
        dir.path(),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let url = coordinator.url("https", "localhost");

    // A run waits for approval; a watch of it is open on a connection of the old certificate.
    let mut old = client(&url, &old_ca.pem).await;
    let workflow = json!({"steps": [
        {"id": "gate", "type": "approval", "message": "go?", "next": "done"},
        {"id": "done", "type": "transform", "transform": "input"}
    ]});
    let run_id = old
        .submit_run(SubmitRunRequest {
            workflow: workflow.to_string().into_bytes(),
            input: Some(baton_proto::Json::new(b"1".to_vec())),
            idempotency_key: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let mut watch = old
        .watch_run(WatchRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();

    // cert-manager writes a certificate of another CA over the files.
    let renewed = new_ca.leaf(&["localhost"]);
    replace(&key, &renewed.key);
    replace(&cert, &renewed.cert);
    let deadline = Instant::now() + DEADLINE;
    while !reachable_with(&url, &new_ca.pem).await {
        assert!(
            Instant::now() < deadline,
            "the new certificate was never served:\n{}",
            coordinator.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !reachable_with(&url, &old_ca.pem).await,
        "a new connection still got the old certificate"
    );

    // The old connection and its watch go on.
    old.decide_approval(DecideApprovalRequest {
        run_id: run_id.clone(),
        step_id: "gate".into(),
        approved: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let finished = tokio::time::timeout(DEADLINE, async {
        while let Some(event) = watch.message().await.unwrap() {
            if let Some(run_event::Event::RunFinished(finished)) = event.event {
                return finished;
            }
        }
        panic!("the watch ended without RunFinished");
    })
    .await
    .expect("the open watch saw the run finish");
    assert_eq!(finished.record.unwrap().status, "succeeded");
    assert!(
        coordinator.log().contains("TLS certificate reloaded"),
        "{}",
        coordinator.log()
    );
}

/// Background processes of a recipe, killed on drop.
struct Background(Vec<Child>);

impl Drop for Background {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn the_readme_s_secured_cluster_recipe_runs_as_printed() {
    let lines = recipes::block(
        "docs/src/security.md",
        "## Security: TLS, principals, protected mode",
    );
    assert_eq!(lines.len(), 7, "{lines:#?}");
    // What the recipe expects in its folder: the repository's examples. It makes its
    // certificates and tokens itself.
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        harness::root().join("examples"),
        dir.path().join("examples"),
    )
    .unwrap();
    let path = harness::path_with_baton();

    let mut env: Vec<(String, String)> = Vec::new();
    let mut background = Background(Vec::new());
    let mut last = None;
    for line in &lines {
        if let Some(exports) = line.strip_prefix("export ") {
            for assignment in exports.split_whitespace() {
                let (name, value) = assignment.split_once('=').unwrap();
                env.push((name.to_owned(), value.to_owned()));
            }
            continue;
        }
        let mut command = Command::new("bash");
        command
            .arg("-c")
            .arg(line.trim_end_matches('&').trim())
            .current_dir(dir.path())
            .env("PATH", &path)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env_remove("BATON_REDIS")
            .env("NO_COLOR", "1");
        if line.ends_with('&') {
            let log =
                std::fs::File::create(dir.path().join(format!("bg-{}.log", background.0.len())))
                    .unwrap();
            command
                .stdout(Stdio::from(log.try_clone().unwrap()))
                .stderr(Stdio::from(log));
            background.0.push(command.spawn().unwrap());
            if line.starts_with("baton coordinator") {
                let deadline = Instant::now() + DEADLINE;
                while std::net::TcpStream::connect(("127.0.0.1", 50061)).is_err() {
                    assert!(
                        Instant::now() < deadline,
                        "the recipe's coordinator never listened"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        } else {
            last = Some(output(&mut command, None));
        }
    }
    let submitted = last.expect("the recipe ends with a submit");
    let logs = || {
        (0..background.0.len())
            .map(|i| {
                std::fs::read_to_string(dir.path().join(format!("bg-{i}.log"))).unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    assert!(
        submitted.status.success(),
        "{}\n{}\n{}",
        text(&submitted.stdout),
        text(&submitted.stderr),
        logs()
    );
    let run_id = text(&submitted.stdout).trim().to_owned();
    assert!(!run_id.is_empty());
    // The worker got in with its token, and the run reached its approval step through it.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let mut command = baton();
        command
            .args([
                "runs",
                "get",
                &run_id,
                "--json",
                "--coordinator",
                "https://localhost:50061",
            ])
            .env("BATON_TLS_CA", dir.path().join("pki/ca.pem"))
            .env("BATON_TOKEN_FILE", dir.path().join("ci-token"));
        let record = output(&mut command, None);
        assert!(record.status.success(), "{}", text(&record.stderr));
        let record: serde_json::Value = serde_json::from_slice(&record.stdout).unwrap();
        if record["waiting"].to_string().contains("approve-plan") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the run never reached its approval: {record:#}\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_name_the_principal_and_never_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let (receiver, endpoint) = otlp::Receiver::start().await;
    let token = "ci-secret-token-0123456789";
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(token.as_bytes()));
    let tokens = write(
        dir.path(),
        "principals.toml",
        &format!("[principals.ci]\ntoken_sha256 = \"{sha}\"\nroles = [\"submit\", \"read\"]\n"),
    );
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let coordinator = Coordinator::start_with_env(
        dir.path(),
        port,
        &[
            "--listen",
            &listen,
            "--auth-tokens",
            tokens.to_str().unwrap(),
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    let security = ClientSecurity {
        token: Some(token.to_owned()),
        ..ClientSecurity::default()
    };
    let url = coordinator.url("http", "127.0.0.1");
    let channel = security.endpoint(&url).unwrap().connect().await.unwrap();
    let mut client = RunServiceClient::new(security.authorize(channel).unwrap());
    let workflow = json!({"steps": [{"id": "t", "type": "transform", "transform": "input"}]});
    client
        .submit_run(SubmitRunRequest {
            workflow: workflow.to_string().into_bytes(),
            input: Some(baton_proto::Json::new(b"1".to_vec())),
            idempotency_key: String::new(),
        })
        .await
        .unwrap();
    let spans = receiver
        .wait_for("the SubmitRun span", |spans| {
            spans
                .iter()
                .any(|span| span.name == "baton.v1.RunService/SubmitRun")
        })
        .await;
    let submit = spans
        .iter()
        .find(|span| span.name == "baton.v1.RunService/SubmitRun")
        .unwrap();
    assert_eq!(submit.attribute("baton.principal"), "ci");
    for span in &spans {
        for value in span.attributes.values().chain(span.resource.values()) {
            assert!(
                !value.contains(token),
                "span {} carries the token",
                span.name
            );
        }
    }
    assert!(
        !coordinator.log().contains(token),
        "the log shows the token"
    );
}
