//! A real Baton cluster for one test: a private `redis-server` on a free port, the `baton
//! coordinator` binary on another, and `baton worker` processes, all children of the test and
//! all killed when the [`Cluster`] is dropped. Every child's stdout and stderr go to a log file
//! in the cluster's temporary folder; a failing test prints them.
//!
//! Also here: agents files of `command` agents (POSIX `sh` scripts in `tests/agents/`) that save
//! every payload they receive under a per-worker folder, so that a test can read back what each
//! agent received and which worker ran it ([`Records`]), and [`output`], which runs a command
//! with a deadline.

#![allow(dead_code)]

#[path = "process.rs"]
mod process;
#[path = "../../coordinator/tests/support/redis_cluster.rs"]
pub mod redis_cluster;
#[path = "../../coordinator/tests/support/redis_server.rs"]
mod redis_server;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use baton_proto::v1::run_service_client::RunServiceClient;
use baton_proto::v1::{
    ListRunsRequest, RunEvent, RunRecord, SubmitRunRequest, WatchRunRequest, run_event,
    worker_message,
};
use serde_json::Value;
use tonic::Streaming;
use tonic::transport::Channel;

pub use redis_server::{RedisServer, free_port};

/// How long a process gets to come up, and a run or a command to finish.
pub const DEADLINE: Duration = Duration::from_secs(30);
/// How often a condition is polled while waiting for it.
const POLL: Duration = Duration::from_millis(10);
/// How many coordinator ports to try when another process takes the one picked first.
const PORT_ATTEMPTS: usize = 5;

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository root exists")
}

/// `PATH` with the folder of the `baton` binary cargo built for this run first: what a recipe
/// that runs `baton` (installed by `cargo install`, say) finds.
pub fn path_with_baton() -> String {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_baton"))
        .parent()
        .expect("the binary's folder")
        .to_owned();
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Submits `workflow` (JSON text) with `input`; the new run's id.
pub async fn submit(
    client: &mut RunServiceClient<Channel>,
    workflow: impl Into<Vec<u8>>,
    input: &Value,
) -> String {
    client
        .submit_run(SubmitRunRequest {
            workflow: workflow.into(),
            input: Some(baton_proto::Json::new(
                serde_json::to_vec(input).expect("JSON"),
            )),
            idempotency_key: String::new(),
        })
        .await
        .expect("SubmitRun")
        .into_inner()
        .run_id
}

/// `file` prints, in its first `sh` block after `anchor`, `cargo run --release -p baton-cli --
/// ARGS` (continuation lines joined): the command a test then runs with the binary that
/// `cargo run` builds. tests/docs.rs checks that every command block is read by a test.
pub fn assert_doc_runs(file: &str, anchor: &str, args: &[&str]) {
    let text = std::fs::read_to_string(root().join(file)).expect("a document");
    let after = &text[text
        .find(anchor)
        .unwrap_or_else(|| panic!("{file} has no {anchor:?}"))..];
    let start = after.find("```sh\n").expect("a sh block") + "```sh\n".len();
    let block = &after[start..start + after[start..].find("```").expect("the block ends")];
    let collapsed: Vec<String> = block
        .replace("\\\n", " ")
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    let quoted: Vec<String> = args
        .iter()
        .map(|arg| {
            if arg.contains(' ') {
                format!("\"{arg}\"")
            } else {
                (*arg).to_owned()
            }
        })
        .collect();
    let recipe = format!("cargo run --release -p baton-cli -- {}", quoted.join(" "));
    assert!(
        collapsed.contains(&recipe),
        "{file}'s block after {anchor:?} does not print the recipe this test runs:\n{recipe}"
    );
}

/// The `baton` binary cargo built for this test run.
pub fn baton() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_baton"));
    // Nothing from the caller's environment may point the CLI elsewhere or colour its logs.
    command
        .env_remove("BATON_COORDINATOR")
        // Nor secure it in ways the test did not ask for.
        .env_remove("BATON_TOKEN")
        .env_remove("BATON_TLS_CA")
        .env_remove("BATON_TLS_CERT")
        .env_remove("BATON_TLS_KEY")
        .env_remove("BATON_TLS_CLIENT_CA")
        .env_remove("BATON_TLS_CLIENT_CERT")
        .env_remove("BATON_TLS_CLIENT_KEY")
        .env_remove("BATON_AUTH_TOKENS")
        .env_remove("BATON_REDIS")
        .env_remove("BATON_REDIS_URL")
        .env_remove("BATON_REDIS_CA")
        // Nor export its spans anywhere, or put its runs in the caller's trace.
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        .env_remove("TRACEPARENT")
        // Nor send its llm agents to another server or model than their agents file names.
        .env_remove("BATON_LLM_BASE_URL")
        .env_remove("BATON_LLM_MODEL")
        .env_remove("BATON_LLM_API_KEY_ENV")
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info");
    command
}

/// A child process of the cluster and the file its output goes to.
struct Process {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Process {
    fn spawn(name: &str, mut command: Command, log: PathBuf) -> Process {
        let file = File::create(&log).expect("create a log file");
        command
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("clone the log file"))
            .stderr(file);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {name}: {e}"));
        Process {
            name: name.to_owned(),
            child,
            log,
        }
    }

    fn log(&self) -> String {
        strip_ansi(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    /// Panics with the log if the process has exited.
    fn check_alive(&mut self) {
        if let Some(status) = self.child.try_wait().expect("poll a child") {
            panic!(
                "{} exited with {status}; its output:\n{}",
                self.name,
                self.log()
            );
        }
    }
}

/// A running cluster. Dropping it kills and reaps every process.
pub struct Cluster {
    dir: tempfile::TempDir,
    /// Extra environment of the coordinator (kept for restarts).
    coordinator_env: Vec<(String, String)>,
    /// `None` for a coordinator with `--memory`.
    redis: Option<RedisServer>,
    coordinator: Process,
    /// Coordinators stopped by [`Cluster::restart_coordinator`], kept for their logs.
    retired: Vec<Process>,
    workers: Vec<Process>,
    port: u16,
    url: String,
}

impl Cluster {
    /// Starts Redis and a coordinator on it, and waits until the coordinator answers
    /// `ListRuns`.
    pub async fn start() -> Cluster {
        Self::start_with(Some(RedisServer::start()), &[]).await
    }

    /// Starts a coordinator with `--memory` (no Redis).
    pub async fn start_memory() -> Cluster {
        Self::start_with(None, &[]).await
    }

    /// Starts Redis and a coordinator with these extra environment variables.
    pub async fn start_with_env(env: &[(&str, &str)]) -> Cluster {
        Self::start_with(Some(RedisServer::start()), env).await
    }

    async fn start_with(redis: Option<RedisServer>, env: &[(&str, &str)]) -> Cluster {
        let dir = tempfile::tempdir().expect("create the cluster's folder");
        let store = store_args(redis.as_ref());
        let coordinator_env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (coordinator, port) = start_on_free_port(dir.path(), &store, &coordinator_env).await;
        Cluster {
            dir,
            coordinator_env,
            redis,
            coordinator,
            retired: Vec::new(),
            workers: Vec::new(),
            port,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Kills the coordinator (SIGKILL: no goodbye to anyone) and starts a new one on the same
    /// port and store; waits until it answers. Workers reconnect by themselves.
    pub async fn restart_coordinator(&mut self) {
        let _ = self.coordinator.child.kill();
        let _ = self.coordinator.child.wait();
        let log = self.dir.path().join(format!(
            "coordinator-restart-{}.log",
            self.retired.len() + 1
        ));
        let new = start_coordinator(
            self.port,
            &store_args(self.redis.as_ref()),
            &self.coordinator_env,
            log,
        )
        .await
        .unwrap_or_else(|log| panic!("the restarted coordinator exited; its output:\n{log}"));
        self.retired
            .push(std::mem::replace(&mut self.coordinator, new));
    }

    /// Starts `baton worker --id ID --agents AGENTS --concurrency N` (not waiting for it).
    pub fn start_worker(&mut self, id: &str, agents: &Path, concurrency: usize) {
        let mut command = baton();
        command
            .arg("worker")
            .arg("--coordinator")
            .arg(&self.url)
            .arg("--agents")
            .arg(agents)
            .arg("--concurrency")
            .arg(concurrency.to_string())
            .arg("--id")
            .arg(id)
            .arg("--metrics-listen")
            .arg("127.0.0.1:0");
        let log = self.dir.path().join(format!("{id}.log"));
        self.workers
            .push(Process::spawn(&format!("baton worker {id}"), command, log));
    }

    /// Starts one worker per id, each serving the spec's agents (`spec-agent.sh`) and saving
    /// payloads under `records`, and waits until the coordinator has them all.
    pub async fn start_spec_workers(&mut self, records: &Records, ids: &[&str]) {
        for id in ids {
            let agents = records.spec_agents_file(id);
            self.start_worker(id, &agents, 4);
        }
        self.wait_for_workers(ids).await;
    }

    /// Waits until the coordinator logged the connection of every worker in `ids`.
    pub async fn wait_for_workers(&mut self, ids: &[&str]) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let log = self.coordinator.log();
            let connected = |id: &&str| {
                log.lines().any(|line| {
                    line.contains("worker connected") && line.contains(&format!("\"{id}\""))
                })
            };
            if ids.iter().all(connected) {
                return;
            }
            self.coordinator.check_alive();
            for worker in &mut self.workers {
                worker.check_alive();
            }
            if Instant::now() > deadline {
                panic!(
                    "workers {ids:?} did not all connect within {DEADLINE:?}\n{}",
                    self.logs()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The coordinator's gRPC URL, `http://127.0.0.1:<port>`.
    /// The coordinator's process id.
    pub fn coordinator_pid(&self) -> u32 {
        self.coordinator.child.id()
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn redis(&self) -> &RedisServer {
        self.redis
            .as_ref()
            .expect("this cluster's coordinator has no Redis")
    }

    /// A folder that lives as long as the cluster.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub async fn client(&self) -> RunServiceClient<Channel> {
        RunServiceClient::connect(self.url.clone())
            .await
            .expect("connect to the coordinator")
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX)
    }

    /// A connection to the cluster's private Redis.
    pub async fn redis_connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.redis().url())
            .expect("a Redis URL")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the private Redis")
    }

    /// Sends SIGTERM to the worker started with `id` (as Kubernetes does to a pod it stops).
    pub fn terminate_worker(&mut self, id: &str) {
        let name = format!("baton worker {id}");
        let worker = self
            .workers
            .iter()
            .find(|w| w.name == name)
            .unwrap_or_else(|| panic!("no worker {id}"));
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(worker.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM {id}");
    }

    /// Waits (bounded) for the worker `id` to exit, and returns its exit status.
    pub async fn worker_exit(&mut self, id: &str) -> std::process::ExitStatus {
        let name = format!("baton worker {id}");
        let deadline = Instant::now() + DEADLINE;
        loop {
            let worker = self
                .workers
                .iter_mut()
                .find(|w| w.name == name)
                .unwrap_or_else(|| panic!("no worker {id}"));
            if let Some(status) = worker.child.try_wait().expect("poll a worker") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "worker {id} did not exit within {DEADLINE:?}; its output:\n{}",
                worker.log()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// What the coordinator running now has logged.
    pub fn coordinator_log(&self) -> String {
        self.coordinator.log()
    }

    /// Every process's output, for a failure message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for process in self
            .retired
            .iter()
            .chain([&self.coordinator])
            .chain(&self.workers)
        {
            out.push_str(&format!(
                "──── {} ({}):\n{}\n",
                process.name,
                process.log.display(),
                process.log()
            ));
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for process in self.workers.iter_mut().chain([&mut self.coordinator]) {
            let _ = process.child.kill();
            let _ = process.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("the cluster's logs:\n{}", self.logs());
        }
    }
}

/// A coordinator started on its own, with the store arguments and environment a test gives (for
/// a Redis the test set up itself), and no workers. Killed and reaped on drop.
pub struct LoneCoordinator {
    /// Holds its log.
    _dir: tempfile::TempDir,
    process: Process,
    url: String,
}

impl LoneCoordinator {
    /// Starts `baton coordinator --listen 127.0.0.1:PORT --metrics-listen 127.0.0.1:0 ARGS...`
    /// with `env` added to its environment, and waits until it answers `ListRuns`; panics with
    /// its output if it exits first.
    pub async fn start(args: &[&str], env: &[(&str, &str)]) -> LoneCoordinator {
        let dir = tempfile::tempdir().expect("create the coordinator's folder");
        let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (process, port) = start_on_free_port(dir.path(), &args, &env).await;
        LoneCoordinator {
            _dir: dir,
            process,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Its gRPC URL, `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn pid(&self) -> u32 {
        self.process.child.id()
    }

    /// What it has logged (stdout and stderr).
    pub fn log(&self) -> String {
        self.process.log()
    }

    pub async fn client(&self) -> RunServiceClient<Channel> {
        RunServiceClient::connect(self.url.clone())
            .await
            .expect("connect to the coordinator")
    }
}

impl Drop for LoneCoordinator {
    fn drop(&mut self) {
        let _ = self.process.child.kill();
        let _ = self.process.child.wait();
        if std::thread::panicking() {
            eprintln!("the coordinator's log:\n{}", self.process.log());
        }
    }
}

/// `--redis URL`, or `--memory`.
fn store_args(redis: Option<&RedisServer>) -> Vec<String> {
    match redis {
        Some(redis) => vec!["--redis".to_owned(), redis.url()],
        None => vec!["--memory".to_owned()],
    }
}

/// Starts a coordinator with `args` and `env` on a free port (another one if the port was taken
/// in between), logging into `dir`; its process and port once it answers.
async fn start_on_free_port(
    dir: &Path,
    args: &[String],
    env: &[(String, String)],
) -> (Process, u16) {
    for attempt in 1..=PORT_ATTEMPTS {
        let port = free_port();
        let log = dir.join(format!("coordinator-{attempt}.log"));
        match start_coordinator(port, args, env, log).await {
            Ok(process) => return (process, port),
            Err(log) if log.contains("cannot listen") && attempt < PORT_ATTEMPTS => {}
            Err(log) => panic!("baton coordinator exited; its output:\n{log}"),
        }
    }
    unreachable!("every attempt either returned or panicked")
}

/// Starts `baton coordinator --listen 127.0.0.1:PORT STORE...` and waits until it answers
/// `ListRuns`; if it exits first, returns its output.
async fn start_coordinator(
    port: u16,
    store: &[String],
    env: &[(String, String)],
    log: PathBuf,
) -> Result<Process, String> {
    let url = format!("http://127.0.0.1:{port}");
    let mut command = baton();
    command
        .arg("coordinator")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--metrics-listen")
        .arg("127.0.0.1:0")
        .args(store)
        .envs(env.iter().map(|(k, v)| (k, v)));
    let mut coordinator = Process::spawn("baton coordinator", command, log);
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(status) = coordinator.child.try_wait().expect("poll the coordinator") {
            return Err(format!("(exit status {status})\n{}", coordinator.log()));
        }
        if answers(&url).await {
            return Ok(coordinator);
        }
        if Instant::now() > deadline {
            panic!(
                "baton coordinator did not answer within {DEADLINE:?}; its output:\n{}",
                coordinator.log()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Whether a coordinator answers `ListRuns` at `url`.
async fn answers(url: &str) -> bool {
    let Ok(mut client) = RunServiceClient::connect(url.to_owned()).await else {
        return false;
    };
    client
        .list_runs(ListRunsRequest {
            limit: 1,
            ..Default::default()
        })
        .await
        .is_ok()
}

/// Logs without terminal colour codes (in case a logger ignores `NO_COLOR`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Where the test agents save the payloads they receive: one folder per worker under one root.
pub struct Records {
    root: PathBuf,
}

/// One payload an agent received.
#[derive(Debug, Clone)]
pub struct Record {
    pub worker: String,
    pub run_id: String,
    pub step_id: String,
    /// 1 for the first payload this step of this run received, 2 for the second...
    pub n: u32,
    /// The payload as the spec shows it (see `spec::spec_view`).
    pub payload: Value,
    /// The payload as received, with the message history and the handoff record.
    pub full: Value,
}

impl Records {
    /// Records under `root` (created).
    pub fn new(root: PathBuf) -> Records {
        std::fs::create_dir_all(&root).expect("create the records folder");
        Records { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Writes `<root>/<worker>.agents.toml`: the spec's five agents (planner, coder, test-unit,
    /// test-integration, reviewer) as `spec-agent.sh` commands that save payloads under
    /// `<root>/<worker>/`.
    pub fn spec_agents_file(&self, worker: &str) -> PathBuf {
        let agents = [
            "planner",
            "coder",
            "test-unit",
            "test-integration",
            "reviewer",
        ]
        .map(|agent| (agent, vec!["spec-agent.sh", agent]));
        self.agents_file(worker, &agents)
    }

    /// Like [`Records::spec_agents_file`], with agents that answer an envelope
    /// (`output = "envelope"`): the spec's data plus one message and one decision each
    /// (`memory-agent.sh`). The reviewer also asks the coordinator for the run's decisions
    /// about theming mid-step, with `baton decisions`, and saves the answer.
    pub fn memory_agents_file(&self, worker: &str) -> PathBuf {
        let agents = [
            "planner",
            "coder",
            "test-unit",
            "test-integration",
            "reviewer",
        ]
        .map(|agent| (agent, vec!["memory-agent.sh", agent]));
        self.agents_file_with(
            worker,
            &agents,
            &format!(
                "output = \"envelope\"\nenv = {{ RECORD_ROOT = {}, WORKER = {}, BATON_BIN = {} }}\n",
                serde_json::to_string(&self.root.display().to_string()).unwrap(),
                serde_json::to_string(worker).unwrap(),
                serde_json::to_string(env!("CARGO_BIN_EXE_baton")).unwrap(),
            ),
        )
    }

    /// Writes `<root>/<worker>.agents.toml` with one `command` agent per entry: `name` runs
    /// `sh tests/agents/<script> <args>...` with `RECORD_ROOT` and `WORKER` set.
    pub fn agents_file(&self, worker: &str, agents: &[(&str, Vec<&str>)]) -> PathBuf {
        let env = format!(
            "env = {{ RECORD_ROOT = {}, WORKER = {} }}\n",
            serde_json::to_string(&self.root.display().to_string()).unwrap(),
            serde_json::to_string(worker).unwrap(),
        );
        self.agents_file_with(worker, agents, &env)
    }

    /// An agents file whose every agent also has the TOML lines `extra`.
    pub fn agents_file_with(
        &self,
        worker: &str,
        agents: &[(&str, Vec<&str>)],
        extra: &str,
    ) -> PathBuf {
        let quote = |s: &str| serde_json::to_string(s).expect("a string is JSON");
        let scripts = root().join("tests").join("agents");
        let mut toml = String::new();
        for (name, command) in agents {
            let (script, args) = command.split_first().expect("a script");
            let mut argv = vec![
                quote("sh"),
                quote(&scripts.join(script).display().to_string()),
            ];
            argv.extend(args.iter().map(|a| quote(a)));
            toml.push_str(&format!(
                "[agents.{name}]\nkind = \"command\"\ncommand = [{}]\n{extra}\n",
                argv.join(", "),
            ));
        }
        let path = self.root.join(format!("{worker}.agents.toml"));
        std::fs::write(&path, toml).expect("write an agents file");
        path
    }

    /// Every payload saved for `run_id`, ordered by step and `n`.
    pub fn of_run(&self, run_id: &str) -> Vec<Record> {
        let mut records = Vec::new();
        for worker in std::fs::read_dir(&self.root).expect("read the records folder") {
            let worker = worker.expect("a folder entry");
            if !worker.file_type().expect("a file type").is_dir() {
                continue;
            }
            let worker_name = worker.file_name().to_string_lossy().into_owned();
            for file in std::fs::read_dir(worker.path()).expect("read a worker's records") {
                let path = file.expect("a folder entry").path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                let Some(rest) = name
                    .strip_prefix(&format!("{run_id}."))
                    .and_then(|rest| rest.strip_suffix(".json"))
                else {
                    continue;
                };
                let (step_id, n) = rest.rsplit_once('.').expect("<step>.<n>");
                let text = std::fs::read_to_string(&path).expect("read a record");
                let full: Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{} is not JSON ({e}): {text}", path.display()));
                records.push(Record {
                    worker: worker_name.clone(),
                    run_id: run_id.to_owned(),
                    step_id: step_id.to_owned(),
                    n: n.parse().expect("a number"),
                    payload: super::spec::spec_view(full.clone()),
                    full,
                });
            }
        }
        records.sort_by(|a, b| (&a.step_id, a.n).cmp(&(&b.step_id, b.n)));
        records
    }

    /// The payloads of `run_id` by `(step, n)`.
    pub fn by_step(&self, run_id: &str) -> BTreeMap<(String, u32), Record> {
        self.of_run(run_id)
            .into_iter()
            .map(|r| ((r.step_id.clone(), r.n), r))
            .collect()
    }
}

/// A run's event stream with a deadline on every wait.
pub struct Watch {
    run_id: String,
    stream: Streaming<RunEvent>,
    /// Every event received so far.
    pub events: Vec<RunEvent>,
}

impl Watch {
    pub async fn start(client: &mut RunServiceClient<Channel>, run_id: &str) -> Watch {
        let stream = client
            .watch_run(WatchRunRequest {
                run_id: run_id.to_owned(),
            })
            .await
            .expect("WatchRun")
            .into_inner();
        Watch {
            run_id: run_id.to_owned(),
            stream,
            events: Vec::new(),
        }
    }

    async fn next(&mut self) -> Option<RunEvent> {
        let event = tokio::time::timeout(DEADLINE, self.stream.message())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "run {}: no event within {DEADLINE:?}; so far: {:#?}",
                    self.run_id, self.events
                )
            })
            .expect("the watch stream broke");
        if let Some(event) = &event {
            self.events.push(event.clone());
        }
        event
    }

    /// The next event, or `None` once the stream has ended (the run is over).
    pub async fn event(&mut self) -> Option<RunEvent> {
        self.next().await
    }

    /// Waits for the approval request of `step_id`; returns its visit.
    pub async fn approval(&mut self, step_id: &str) -> u32 {
        loop {
            match self.next().await.map(|e| e.event) {
                Some(Some(run_event::Event::ApprovalRequested(a))) if a.step_id == step_id => {
                    return a.visit;
                }
                Some(Some(run_event::Event::RunFinished(f))) => {
                    panic!("run finished before {step_id} asked for approval: {f:#?}")
                }
                Some(_) => {}
                None => panic!("the watch ended before {step_id} asked for approval"),
            }
        }
    }

    /// Waits for the end of the run; returns its final record.
    pub async fn finished(&mut self) -> RunRecord {
        loop {
            match self.next().await.map(|e| e.event) {
                Some(Some(run_event::Event::RunFinished(f))) => {
                    return f.record.expect("RunFinished carries the record");
                }
                Some(_) => {}
                None => panic!(
                    "the watch of run {} ended without RunFinished: {:#?}",
                    self.run_id, self.events
                ),
            }
        }
    }

    /// The workers StepStarted named for `step_id`, in order.
    pub fn started_on(&self, step_id: &str) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|e| match &e.event {
                Some(run_event::Event::StepStarted(s)) if s.step_id == step_id => {
                    Some(s.worker_id.clone())
                }
                _ => None,
            })
            .collect()
    }
}

/// The run's context as JSON.
pub fn context(record: &RunRecord) -> Value {
    let context = record.context.as_ref().expect("a record has a context");
    serde_json::from_slice(context.verified().expect("the context matches its SHA-256"))
        .expect("the context is JSON")
}

/// A step of a record, by id.
pub fn step<'a>(record: &'a RunRecord, step_id: &str) -> &'a baton_proto::v1::StepState {
    record
        .steps
        .iter()
        .find(|s| s.step_id == step_id)
        .unwrap_or_else(|| panic!("no step {step_id} in {record:#?}"))
}

/// A `WorkerMessage` carrying `message`.
pub fn worker_message(message: worker_message::Message) -> baton_proto::v1::WorkerMessage {
    baton_proto::v1::WorkerMessage {
        message: Some(message),
    }
}

/// Runs `command` to its end, feeding it `stdin`; kills it and panics if it takes longer than
/// [`DEADLINE`].
pub fn output(command: &mut Command, stdin: Option<&str>) -> Output {
    output_within(command, stdin, DEADLINE)
}

/// [`output`] with another deadline.
pub fn output_within(command: &mut Command, stdin: Option<&str>, deadline: Duration) -> Output {
    process::run_within(command, stdin.map(str::as_bytes), deadline)
        .unwrap_or_else(|error| panic!("{error}"))
}
