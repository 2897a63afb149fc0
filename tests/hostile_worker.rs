//! Workers that do more than their role, against the real `baton` binaries (issue 28): a
//! `baton coordinator` on a private Redis with a tokens file, a real `baton worker` serving the
//! `coder` agent with a command agent that waits to be let go, and a hostile worker written here
//! over the real protocol (a tonic client of `WorkerService`) with a token whose principal may
//! serve only the planner. Also an agent whose error is 60 MiB, and what an agent process
//! finds in its environment.

#[path = "support/cluster.rs"]
mod harness;
#[path = "support/spec.rs"]
mod spec;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_proto::connection::{ClientSecurity, Connection};
use baton_proto::v1::run_service_client::RunServiceClient;
use baton_proto::v1::worker_service_client::WorkerServiceClient;
use baton_proto::v1::{
    CoordinatorMessage, GetRunRequest, Hello, ResendTask, RunRecord, TaskOutput, TaskResult,
    WorkerMessage, WorkerQueryDecisionsRequest, coordinator_message, task_result, worker_message,
};
use harness::{DEADLINE, RedisServer, baton, free_port, output};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Principals: `coders` may serve only `coder`, `planners` only `planner`, `envs` the agents of
/// the environment test; `ops` is an admin. Each one's token is `<name>-token`.
fn tokens_file() -> String {
    let mut text = String::new();
    for (name, roles, agents) in [
        ("coders", "\"worker\"", "agents = [\"coder\", \"loud\"]\n"),
        ("planners", "\"worker\"", "agents = [\"planner\"]\n"),
        ("envs", "\"worker\"", "agents = [\"bare\", \"explicit\"]\n"),
        ("ops", "\"admin\"", ""),
    ] {
        let sha = hex::encode(Sha256::digest(format!("{name}-token").as_bytes()));
        text.push_str(&format!(
            "[principals.{name}]\ntoken_sha256 = \"{sha}\"\nroles = [{roles}]\n{agents}\n"
        ));
    }
    text
}

/// A secured coordinator on a private Redis, and the workers started on it; all killed on
/// drop (their logs printed if the test failed).
struct Secured {
    dir: tempfile::TempDir,
    redis: RedisServer,
    port: u16,
    metrics_port: u16,
    children: Vec<(String, Child)>,
}

impl Secured {
    async fn start() -> Secured {
        let dir = tempfile::tempdir().unwrap();
        let redis = RedisServer::start();
        let tokens = dir.path().join("tokens.toml");
        std::fs::write(&tokens, tokens_file()).unwrap();
        let (port, metrics_port) = (free_port(), free_port());
        let mut command = baton();
        command
            .args(["coordinator", "--id", "c0", "--lease-ms", "1500"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
            .args(["--redis", &redis.url()])
            .arg("--auth-tokens")
            .arg(&tokens);
        let mut secured = Secured {
            dir,
            redis,
            port,
            metrics_port,
            children: Vec::new(),
        };
        secured.spawn("coordinator", command);
        let deadline = Instant::now() + DEADLINE;
        while http_get(metrics_port, "/readyz", None).is_none_or(|(status, _)| status != 200) {
            secured.check_alive();
            assert!(
                Instant::now() < deadline,
                "the coordinator never became ready"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        secured
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self, name: &str, mut command: std::process::Command) {
        let log = std::fs::File::create(self.log_path(name)).unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        self.children.push((name.to_owned(), child));
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.log_path(name)).unwrap_or_default()
    }

    fn check_alive(&mut self) {
        for (name, child) in &mut self.children {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("{name} exited with {status}");
            }
        }
    }

    /// Writes `script` as `<name>.sh` in the cluster's folder, where the agents files are
    /// (and so where agents run); the `command` of an agent that runs it.
    fn script(&self, name: &str, script: &str) -> String {
        let path = self.dir.path().join(format!("{name}.sh"));
        std::fs::write(&path, script).unwrap();
        format!(
            "command = [\"sh\", {}]",
            serde_json::to_string(&path.display().to_string()).unwrap()
        )
    }

    /// Starts `baton worker --id ID` with `agents` (TOML, written in the cluster's folder) and
    /// `token` in its environment, and waits until the coordinator has it.
    async fn start_worker(&mut self, id: &str, token: &str, agents: &str) {
        let file = self.dir.path().join(format!("{id}.agents.toml"));
        std::fs::write(&file, agents).unwrap();
        let mut command = baton();
        command
            .args(["worker", "--id", id, "--concurrency", "2", "--no-metrics"])
            .args(["--coordinator", &self.url()])
            .arg("--agents")
            .arg(&file)
            .env("BATON_TOKEN", token);
        self.spawn(id, command);
        let deadline = Instant::now() + DEADLINE;
        let quoted = format!("\"{id}\"");
        while !self
            .log("coordinator")
            .lines()
            .any(|line| line.contains("worker connected") && line.contains(&quoted))
        {
            self.check_alive();
            assert!(Instant::now() < deadline, "worker {id} never connected");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn client(&self, token: &str) -> RunServiceClient<Connection> {
        RunServiceClient::new(connection(&self.url(), token).await)
            .max_decoding_message_size(usize::MAX)
    }

    async fn submit(&self, workflow: Value) -> String {
        harness_submit(&mut self.client("ops-token").await, workflow).await
    }

    /// Polls GetRun until the run has finished.
    async fn finished(&self, run_id: &str) -> RunRecord {
        let mut client = self.client("ops-token").await;
        let deadline = Instant::now() + DEADLINE;
        loop {
            let record = client
                .get_run(GetRunRequest {
                    run_id: run_id.to_owned(),
                })
                .await
                .expect("GetRun")
                .into_inner();
            if record.status != "running" {
                return record;
            }
            assert!(Instant::now() < deadline, "run {run_id} never finished");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `baton_worker_messages_refused_total{message=...}` on the coordinator's `/metrics`.
    fn refusals(&self, message: &str) -> u64 {
        let (_, text) = http_get(self.metrics_port, "/metrics", None).expect("/metrics");
        let series = format!("baton_worker_messages_refused_total{{message=\"{message}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&series))
            .map_or(0, |count| count.trim().parse().unwrap())
    }

    /// `baton ARGS` as the admin, against this coordinator.
    fn baton_as_ops(&self, args: &[&str]) -> std::process::Output {
        let mut command = baton();
        command
            .args(args)
            .args(["--coordinator", &self.url()])
            .env("BATON_TOKEN", "ops-token");
        output(&mut command, None)
    }
}

impl Drop for Secured {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            for (name, _) in &self.children {
                eprintln!("──── {name}:\n{}", self.log(name));
            }
        }
    }
}

async fn connection(url: &str, token: &str) -> Connection {
    let security = ClientSecurity {
        token: Some(token.to_owned()),
        ..ClientSecurity::default()
    };
    let channel = security.endpoint(url).unwrap().connect().await.unwrap();
    security.authorize(channel).unwrap()
}

async fn harness_submit(client: &mut RunServiceClient<Connection>, workflow: Value) -> String {
    client
        .submit_run(baton_proto::v1::SubmitRunRequest {
            workflow: workflow.to_string().into_bytes(),
            input: Some(baton_proto::Json::new(b"\"go\"".to_vec())),
            idempotency_key: String::new(),
        })
        .await
        .expect("SubmitRun")
        .into_inner()
        .run_id
}

/// `GET path` on the coordinator's HTTP port, by hand, with a bearer token if given: the status
/// and the body, or `None` if nothing answers yet.
fn http_get(port: u16, path: &str, token: Option<&str>) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    let authorization = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n{authorization}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n")?.1.to_owned();
    Some((status, body))
}

/// Waits until `path` exists; its text.
async fn file_appears(path: &Path) -> String {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && !text.is_empty()
        {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the store's entry of `code#1` of the run names `worker`: a renewal wrote down
/// who runs it, so the hostile hello below is the strongest it can be.
async fn written_down(redis_url: &str, run_id: &str, worker: &str) {
    let mut redis = redis::Client::open(redis_url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let entry: Option<String> = redis::cmd("HGET")
            .arg(format!("baton:run:{{{run_id}}}:tasks"))
            .arg("code#1")
            .query_async(&mut redis)
            .await
            .unwrap();
        if entry
            .as_deref()
            .and_then(|e| serde_json::from_str::<Value>(e).ok())
            .is_some_and(|e| e["worker_id"] == worker && e["principal"] == "coders")
        {
            return;
        }
        assert!(Instant::now() < deadline, "never written down: {entry:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn worker_message(message: worker_message::Message) -> WorkerMessage {
    WorkerMessage {
        message: Some(message),
    }
}

/// The coder's script: saves the task id it runs, waits until `release` exists, answers.
const CODER: &str = r#"cat > /dev/null
echo "$BATON_RUN_ID/$BATON_STEP_ID#$BATON_VISIT@$BATON_ATTEMPT" >> started
while [ ! -e release ]; do sleep 0.05; done
echo '{"by": "real"}'
"#;

/// The attack of issue 28: a worker whose principal may serve only the planner names the coder
/// task a real worker runs in its hello, asks for it again, answers it with forged data,
/// streams output for it, and queries decisions naming the real worker; it also tries to
/// connect under the real worker's id. Each is refused and counted; it is sent nothing of the
/// task; the run finishes with the real worker's answer and its state chain holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planner_worker_cannot_take_answer_or_read_a_coder_task() {
    let mut cluster = Secured::start().await;
    let coder = cluster.script("coder", CODER);
    cluster
        .start_worker(
            "real",
            "coders-token",
            &format!("[agents.coder]\nkind = \"command\"\n{coder}\n"),
        )
        .await;
    let run_id = cluster
        .submit(
            json!({"id": "hostile", "steps": [{"id": "code", "type": "agent", "agent": "coder"}]}),
        )
        .await;
    let started = cluster.dir.path().join("started");
    let task_id = file_appears(&started).await.trim().to_owned();
    assert_eq!(task_id, format!("{run_id}/code#1@1"));
    written_down(&cluster.redis.url(), &run_id, "real").await;

    // The hostile worker: its own stream, naming the coder task as one it still runs.
    let mut hostile = WorkerServiceClient::new(connection(&cluster.url(), "planners-token").await);
    let (outbound, receiver) = mpsc::channel(16);
    outbound
        .send(worker_message(worker_message::Message::Hello(Hello {
            worker_id: "hostile".into(),
            agents: vec!["planner".into()],
            capacity: 1,
            protocol: baton_proto::WORKER_PROTOCOL,
            held: vec![task_id.clone()],
            ..Hello::default()
        })))
        .await
        .unwrap();
    let mut inbound = hostile
        .task_stream(ReceiverStream::new(receiver))
        .await
        .expect("a planner worker may connect")
        .into_inner();
    let received: Arc<Mutex<Vec<CoordinatorMessage>>> = Arc::default();
    let collecting = {
        let received = received.clone();
        tokio::spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                received.lock().unwrap().push(message);
            }
        })
    };
    let data = baton_proto::Json::new(br#"{"by": "hostile"}"#.to_vec());
    for message in [
        worker_message::Message::Resend(ResendTask {
            task_id: task_id.clone(),
            reason: "send me the payload".into(),
        }),
        worker_message::Message::Result(TaskResult {
            task_id: task_id.clone(),
            outcome: Some(task_result::Outcome::Data(data)),
            ..TaskResult::default()
        }),
        worker_message::Message::Output(TaskOutput {
            task_id: task_id.clone(),
            text: "forged output".into(),
            restart: false,
        }),
    ] {
        outbound.send(worker_message(message)).await.unwrap();
    }
    let query = hostile
        .query_decisions(WorkerQueryDecisionsRequest {
            worker_id: "real".into(),
            task_id: task_id.clone(),
            text: "the plan".into(),
            ..WorkerQueryDecisionsRequest::default()
        })
        .await
        .expect_err("a query through another principal's worker");
    assert_eq!(query.code(), tonic::Code::PermissionDenied, "{query:?}");

    // Its id squatting: the real worker's id, under the planners' principal.
    let (squatting, receiver) = mpsc::channel(1);
    squatting
        .send(worker_message(worker_message::Message::Hello(Hello {
            worker_id: "real".into(),
            agents: vec!["planner".into()],
            capacity: 1,
            protocol: baton_proto::WORKER_PROTOCOL,
            held: vec![task_id.clone()],
            ..Hello::default()
        })))
        .await
        .unwrap();
    let mut squatter = WorkerServiceClient::new(connection(&cluster.url(), "planners-token").await);
    let refused = squatter
        .task_stream(ReceiverStream::new(receiver))
        .await
        .expect_err("the id is another principal's worker's");
    assert_eq!(refused.code(), tonic::Code::AlreadyExists, "{refused:?}");
    assert!(
        refused.message().contains("another principal"),
        "{refused:?}"
    );

    // Each refusal is counted on /metrics.
    let deadline = Instant::now() + DEADLINE;
    for message in ["held", "resend", "result", "output", "query", "hello"] {
        while cluster.refusals(message) < 1 {
            assert!(
                Instant::now() < deadline,
                "no {message} refusal counted\n{}",
                cluster.log("coordinator")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Told to drop the task and that its answer was refused; sent nothing of the task.
    let deadline = Instant::now() + DEADLINE;
    let kinds = loop {
        let kinds: Vec<&'static str> = received
            .lock()
            .unwrap()
            .iter()
            .map(|m| match &m.message {
                Some(coordinator_message::Message::Task(_)) => "task",
                Some(coordinator_message::Message::Cancel(_)) => "cancel",
                Some(coordinator_message::Message::Rejected(_)) => "rejected",
                Some(coordinator_message::Message::ResetPartCache(_)) => "reset",
                _ => "other",
            })
            .collect();
        if kinds.contains(&"cancel") && kinds.contains(&"rejected") {
            break kinds;
        }
        assert!(
            Instant::now() < deadline,
            "the hostile worker got {kinds:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        !kinds.contains(&"task") && !kinds.contains(&"reset"),
        "the hostile worker was sent {kinds:?}"
    );

    // The real worker answers; its answer is the one recorded, once.
    std::fs::write(cluster.dir.path().join("release"), "").unwrap();
    let record = cluster.finished(&run_id).await;
    assert_eq!(record.status, "succeeded", "{}", record.error);
    let context: Value = serde_json::from_slice(&record.context.unwrap().json).unwrap();
    assert_eq!(context["code"], json!({"by": "real"}));
    assert_eq!(record.steps[0].worker_id, "real");
    assert_eq!(
        std::fs::read_to_string(&started).unwrap().lines().count(),
        1,
        "the real worker ran it once"
    );
    let verified = cluster.baton_as_ops(&["runs", "verify", &run_id]);
    assert!(
        verified.status.success(),
        "{}{}",
        String::from_utf8_lossy(&verified.stdout),
        String::from_utf8_lossy(&verified.stderr)
    );
    assert!(String::from_utf8_lossy(&verified.stdout).contains("state chain holds"));
    drop(outbound);
    collecting.abort();
}

/// An envelope with an unknown member named by 60 MiB of `x`: the worker's error names it.
const LOUD: &str = r#"cat > /dev/null
printf '{"data": 1, "'
head -c 62914560 /dev/zero | tr '\0' x
printf '": 0}'
"#;

/// The attack of issue 28: an agent's 60 MiB error was stored on the step and on the run, the
/// record grew to 125 MB and `baton runs get` failed with OUT_OF_RANGE for good. The error is
/// cut (its start and end kept, a marker naming its length and the limit), and the record reads
/// through gRPC, the CLI and the web API, small.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_60_mib_agent_error_is_cut_and_the_run_stays_readable() {
    let mut cluster = Secured::start().await;
    let loud = cluster.script("loud", LOUD);
    let agents = format!("[agents.loud]\nkind = \"command\"\n{loud}\noutput = \"envelope\"\n");
    cluster.start_worker("real", "coders-token", &agents).await;
    let run_id = cluster
        .submit(json!({"id": "loud", "steps": [{"id": "shout", "type": "agent", "agent": "loud"}]}))
        .await;
    let record = cluster.finished(&run_id).await;
    assert_eq!(record.status, "failed");
    let error = &record.steps[0].error;
    let marker = format!(
        "cut: {} bytes in all, past the limit of 16384",
        "agent \"loud\" returned bad output: the envelope has an unknown member \"\" (it takes data, messages and decisions)".len()
            + (60 << 20)
    );
    assert!(
        error.starts_with(
            "agent \"loud\" returned bad output: the envelope has an unknown member \"xxx"
        ),
        "{error:.200}"
    );
    assert!(error.contains(&marker), "{}", &error[8_000..8_300]);
    assert!(
        error.ends_with("\" (it takes data, messages and decisions)"),
        "{}",
        &error[error.len() - 100..]
    );
    assert!(error.len() <= 16 << 10, "{}", error.len());
    assert!(record.error.len() < 17 << 10, "{}", record.error.len());

    let got = cluster.baton_as_ops(&["runs", "get", &run_id, "--json"]);
    assert!(
        got.status.success(),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    assert!(got.stdout.len() < 64 << 10, "{} bytes", got.stdout.len());
    let printed: Value = serde_json::from_slice(&got.stdout).unwrap();
    assert!(
        printed["steps"][0]["error"]
            .as_str()
            .unwrap()
            .contains(&marker)
    );

    for (path, limit) in [
        (format!("/api/runs/{run_id}"), 64 << 10),
        (format!("/api/runs/{run_id}/steps/shout"), 128 << 10),
    ] {
        let (status, body) = http_get(cluster.metrics_port, &path, Some("ops-token")).unwrap();
        assert_eq!(status, 200, "{path}: {body:.300}");
        assert!(body.len() < limit, "{path}: {} bytes", body.len());
        assert!(body.contains(&marker), "{path}: {body:.300}");
    }
}

/// Prints the token (and client key) it finds in its environment.
const ENV_PROBE: &str = r#"cat > /dev/null
printf '{"token": "%s", "key": "%s"}' "${BATON_TOKEN:-}" "${BATON_TLS_CLIENT_KEY:-}"
"#;

/// The weak point of issue 28: command agents inherited the worker's `BATON_TOKEN`, so any
/// agent process could connect as the worker. The worker connects with its token; its agent
/// finds none, unless the agents file passes one in the agent's `env`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_process_gets_no_baton_credential_unless_its_agents_file_passes_one() {
    let mut cluster = Secured::start().await;
    let probe = cluster.script("probe", ENV_PROBE);
    let agents = format!(
        "[agents.bare]\nkind = \"command\"\n{probe}\n\n\
         [agents.explicit]\nkind = \"command\"\n{probe}\nenv = {{ BATON_TOKEN = \"agent-own-token\" }}\n"
    );
    cluster.start_worker("envs", "envs-token", &agents).await;
    let run_id = cluster
        .submit(json!({"id": "envs", "steps": [
            {"id": "bare", "type": "agent", "agent": "bare", "next": "explicit"},
            {"id": "explicit", "type": "agent", "agent": "explicit"}
        ]}))
        .await;
    let record = cluster.finished(&run_id).await;
    assert_eq!(record.status, "succeeded", "{}", record.error);
    let context: Value = serde_json::from_slice(&record.context.unwrap().json).unwrap();
    assert_eq!(context["bare"], json!({"token": "", "key": ""}));
    assert_eq!(
        context["explicit"],
        json!({"token": "agent-own-token", "key": ""})
    );
}
