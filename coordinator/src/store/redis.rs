//! The Redis store: the production [`Store`].
//!
//! # Layout
//!
//! With the key prefix `P` (`baton` unless [`RedisStore::connect_with_prefix`] says otherwise), a
//! run `R` is seven keys:
//!
//! | key                   | type | holds                                                          |
//! |-----------------------|------|----------------------------------------------------------------|
//! | `P:run:{R}`           | hash | `workflow`, `workflow_id`, `input`, `created_ms`, `traceparent`, `updated_ms`, `status`, `error` (absent when `None`), `state_sha256`, `version` |
//! | `P:run:{R}:events`    | list | the event log, `RPUSH`ed in order                              |
//! | `P:run:{R}:results`   | hash | `"<step>#<visit>"` -> result                                   |
//! | `P:run:{R}:steps`     | hash | step id -> step state                                          |
//! | `P:run:{R}:tasks`     | hash | task key -> task                                               |
//! | `P:run:{R}:chain`     | list | the state chain's links, `RPUSH`ed in order                    |
//! | `P:run:{R}:decisions` | hash | decision key -> decision with its embedding (`HSETNX`)         |
//!
//! Every one of them carries the run id as a hash tag, `{R}`, so a Redis Cluster puts all of a
//! run on one slot. That is what lets a single Lua script read and write the whole run, and a
//! single `MULTI` read it back: atomicity per run is the one guarantee the [`Store`] contract
//! asks for, and a script over one slot gives it in a Cluster as well as on one server.
//!
//! - `create_run` and `apply_transition` are each one script (`lua/create_run.lua`,
//!   `lua/apply_transition.lua`, both behind the shared `lua/transition.lua`): the version check,
//!   the result check, then every write. Redis does not roll a failing script back, so all checks
//!   come before the first write and a refused call writes nothing. The scripts answer a refusal
//!   with an error reply (`EXISTS`, `NOTFOUND`, `CONFLICT <actual>`, `CORRUPT <why>`) that is
//!   mapped to [`Error`] here.
//! - `load_run` reads the run's keys but `decisions` in one `MULTI`/`EXEC`, so it sees a run between two
//!   transitions, never in the middle of one.
//! - `swap_tasks` is one script for a batch of compare-and-swaps (`lua/swap_tasks.lua`), so a
//!   coordinator renews all the leases it holds in one round trip; `due_tasks`
//!   (`lua/due_tasks.lua`) reads an agent's due timers and their tasks in one.
//! - Values are bytes and travel as bytes; only keys (run ids, result keys, step ids, task keys)
//!   and the header's text fields must be UTF-8 when read back.
//!
//! `Unavailable` covers every failure to reach Redis, including a reply that timed out: the
//! write may then have happened or not. Retrying is safe, because a transition is guarded by its
//! version (a retry that already landed gets `Conflict`, so reload) and a creation by the run id
//! (`AlreadyExists`).
//!
//! The connection is one [`ConnectionManager`], i.e. one server (or a primary behind a proxy).
//! The layout is Cluster-ready; a Cluster client is not wired in yet.
//!
//! Run ids are expected to be non-empty and free of `{` and `}` (the coordinator makes UUIDs):
//! otherwise the hash tag would not be the whole run id and a Cluster could split a run.
//!
//! # Indexes
//!
//! Global keys, not part of any run:
//! - `P:runs`, a sorted set (score `created_ms`, member run id), for `list_runs`;
//! - `P:runs:active`, a set of run ids whose status is `running`, for `active_runs`;
//! - `P:workflow:<workflow id>:runs`, a sorted set like `P:runs` per workflow id, for
//!   `runs_of_workflow` (decision queries over all runs of a workflow);
//! - `P:idempotency:<key>`, a string `<run id> <request sha256>` that expires, for SubmitRun's
//!   idempotency keys (`SET NX EX`: the first submitter claims it);
//! - `P:timers:<agent>`, a sorted set per agent (member `<run id>/<task key>`, score the task's
//!   `due_ms`): lease deadlines and retry times, which the coordinators' sweeps read.
//!
//! The timer sets are the exception to the rule below: the run scripts write them together
//! with the task they time (a task without its timer would never be swept), which is atomic on
//! one server. On a Redis Cluster they would have to be split per hash slot.
//!
//! They live on other slots than the runs in a Cluster, so the run scripts cannot touch them;
//! they are updated with separate commands after a script succeeded. They are an index, not the
//! source of truth: the run headers are. A crash between a script and its index update leaves the
//! index behind, never the run, and [`RedisStore::rebuild_indexes`] rebuilds both from the
//! headers. Readers guard against a stale index too: `list_runs` skips ids whose header is gone
//! and `active_runs` keeps only the ids whose header says `running`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::LazyLock;

use ::redis::aio::ConnectionManager;
use ::redis::{AsyncCommands, Client, ErrorKind, RedisError, Script, ScriptInvocation, Value};

use super::{
    Claim, DueTask, Error, RunHeader, RunSummary, Store, StoredRun, TaskSwap, TransitionWrite,
};

/// The key prefix of [`RedisStore::connect`].
pub const DEFAULT_PREFIX: &str = "baton";

/// The status that puts a run in `active_runs`.
const RUNNING: &str = "running";

static CREATE_RUN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("lua/transition.lua"),
        include_str!("lua/create_run.lua")
    ))
});

static APPLY_TRANSITION: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("lua/transition.lua"),
        include_str!("lua/apply_transition.lua")
    ))
});

static SWAP_TASKS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("lua/transition.lua"),
        include_str!("lua/swap_tasks.lua")
    ))
});

static DUE_TASKS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/due_tasks.lua")));

/// Runs in Redis, laid out as the [module docs](self) describe. Cheap to clone: clones share
/// one multiplexed connection that reconnects by itself.
#[derive(Clone)]
pub struct RedisStore {
    con: ConnectionManager,
    prefix: String,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// The keys of one run, each with the run's hash tag.
struct RunKeys {
    run: String,
    events: String,
    results: String,
    steps: String,
    tasks: String,
    chain: String,
    decisions: String,
}

impl RunKeys {
    fn add_to(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation
            .key(&self.run)
            .key(&self.events)
            .key(&self.results)
            .key(&self.steps)
            .key(&self.tasks)
            .key(&self.chain)
            .key(&self.decisions);
    }
}

impl RedisStore {
    /// Connects to `url` (`redis://host:port/db`, `rediss://` for TLS) with the key prefix
    /// [`DEFAULT_PREFIX`].
    pub async fn connect(url: &str) -> Result<RedisStore, Error> {
        Self::connect_with_prefix(url, DEFAULT_PREFIX).await
    }

    /// Connects to `url` and keeps every key under `prefix` (so that several stores can share a
    /// server). The prefix may not contain `{` or `}`: it would take the place of the run's hash
    /// tag.
    pub async fn connect_with_prefix(url: &str, prefix: &str) -> Result<RedisStore, Error> {
        if prefix.contains(['{', '}']) {
            return Err(Error::Unavailable(format!(
                "invalid Redis key prefix {prefix:?}: it may not contain '{{' or '}}'"
            )));
        }
        let client = Client::open(url).map_err(unavailable)?;
        let con = ConnectionManager::new(client).await.map_err(unavailable)?;
        Ok(RedisStore {
            con,
            prefix: prefix.to_owned(),
        })
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn run_keys(&self, run_id: &str) -> RunKeys {
        let run = format!("{}:run:{{{run_id}}}", self.prefix);
        RunKeys {
            events: format!("{run}:events"),
            results: format!("{run}:results"),
            steps: format!("{run}:steps"),
            tasks: format!("{run}:tasks"),
            chain: format!("{run}:chain"),
            decisions: format!("{run}:decisions"),
            run,
        }
    }

    /// The prefix of the agents' timer sets: `P:timers:<agent>`.
    fn timer_prefix(&self) -> String {
        format!("{}:timers:", self.prefix)
    }

    fn runs_key(&self) -> String {
        format!("{}:runs", self.prefix)
    }

    fn workflow_runs_key(&self, workflow_id: &str) -> String {
        format!("{}:workflow:{workflow_id}:runs", self.prefix)
    }

    fn active_key(&self) -> String {
        format!("{}:runs:active", self.prefix)
    }

    /// Brings `active_runs`' set in line with a status this store just wrote for `run_id`.
    ///
    /// Two coordinators' updates may arrive out of order (an older "not running" after a newer
    /// "running"), so a removal is followed by a read of the header, and the id goes back if the
    /// run is running again by then: whichever update comes last, the set ends up right.
    async fn update_active(&self, run_id: &str, status: &str) -> Result<(), RedisError> {
        let mut con = self.con.clone();
        if status == RUNNING {
            let _: i64 = con.sadd(self.active_key(), run_id).await?;
            return Ok(());
        }
        let _: i64 = con.srem(self.active_key(), run_id).await?;
        let now: Option<Vec<u8>> = con.hget(self.run_keys(run_id).run, "status").await?;
        if now.as_deref() == Some(RUNNING.as_bytes()) {
            let _: i64 = con.sadd(self.active_key(), run_id).await?;
        }
        Ok(())
    }

    /// Rebuilds the `list_runs` and `active_runs` indexes from the run headers: adds what is
    /// missing, removes ids whose header is gone and fixes each run's active membership. Safe to
    /// run while the store is in use; meant for after a crash between a script and its index
    /// update. Returns how many runs it found.
    pub async fn rebuild_indexes(&self) -> Result<usize, Error> {
        let mut con = self.con.clone();
        let pattern = format!("{}:run:{{*}}", glob_escape(&self.prefix));
        let header_prefix = format!("{}:run:{{", self.prefix);
        let mut found = HashSet::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = ::redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(500)
                .query_async(&mut con)
                .await
                .map_err(unavailable)?;
            for key in keys {
                let Some(run_id) = key
                    .strip_prefix(&header_prefix)
                    .and_then(|rest| rest.strip_suffix('}'))
                else {
                    continue;
                };
                let (created_ms, status, workflow_id): (
                    Option<i64>,
                    Option<String>,
                    Option<String>,
                ) = con
                    .hmget(&key, &["created_ms", "status", "workflow_id"])
                    .await
                    .map_err(unavailable)?;
                let (Some(created_ms), Some(status)) = (created_ms, status) else {
                    continue;
                };
                let _: i64 = con
                    .zadd(self.runs_key(), run_id, created_ms)
                    .await
                    .map_err(unavailable)?;
                let _: i64 = con
                    .zadd(
                        self.workflow_runs_key(&workflow_id.unwrap_or_default()),
                        run_id,
                        created_ms,
                    )
                    .await
                    .map_err(unavailable)?;
                self.update_active(run_id, &status)
                    .await
                    .map_err(unavailable)?;
                found.insert(run_id.to_owned());
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        // Ids in the indexes without a header: check again right before removing, a run may have
        // been created since the scan.
        let listed: Vec<String> = con
            .zrange(self.runs_key(), 0, -1)
            .await
            .map_err(unavailable)?;
        let active: Vec<String> = con.smembers(self.active_key()).await.map_err(unavailable)?;
        for run_id in listed.iter().chain(&active) {
            if found.contains(run_id) {
                continue;
            }
            let exists: bool = con
                .exists(self.run_keys(run_id).run)
                .await
                .map_err(unavailable)?;
            if !exists {
                let _: i64 = con
                    .zrem(self.runs_key(), run_id)
                    .await
                    .map_err(unavailable)?;
                let _: i64 = con
                    .srem(self.active_key(), run_id)
                    .await
                    .map_err(unavailable)?;
            }
        }
        Ok(found.len())
    }
}

/// Appends a transition in the encoding `lua/transition.lua` reads.
fn add_transition(
    invocation: &mut ScriptInvocation<'_>,
    write: &TransitionWrite,
    timer_prefix: &str,
    run_id: &str,
) {
    match &write.event {
        Some(event) => invocation.arg("1").arg(event.as_slice()),
        None => invocation.arg("0").arg(""),
    };
    for list in [&write.results, &write.steps, &write.tasks_set] {
        invocation.arg(list.len());
        for (key, bytes) in list {
            invocation.arg(key.as_str()).arg(bytes.as_slice());
        }
    }
    invocation.arg(write.tasks_removed.len());
    for key in &write.tasks_removed {
        invocation.arg(key.as_str());
    }
    invocation.arg(write.links.len());
    for link in &write.links {
        invocation.arg(link.as_slice());
    }
    invocation.arg(write.decisions.len());
    for (key, bytes) in &write.decisions {
        invocation.arg(key.as_str()).arg(bytes.as_slice());
    }
    invocation.arg(write.status.as_str());
    match &write.error {
        Some(error) => invocation.arg("1").arg(error.as_str()),
        None => invocation.arg("0").arg(""),
    };
    invocation
        .arg(write.state_sha256.as_str())
        .arg(write.updated_ms)
        .arg(timer_prefix)
        .arg(run_id)
        .arg(write.fences.len());
    for (key, attempt) in &write.fences {
        invocation.arg(key.as_str()).arg(attempt.to_string());
    }
}

/// A `Fenced` refusal with the attempt the write asked for (the script names only the task and
/// its current attempt).
fn with_fence_attempt(error: Error, write: &TransitionWrite) -> Error {
    match error {
        Error::Fenced {
            run_id,
            task_key,
            current,
            ..
        } => Error::Fenced {
            attempt: write
                .fences
                .iter()
                .find(|(key, _)| *key == task_key)
                .map_or(0, |(_, attempt)| *attempt),
            run_id,
            task_key,
            current,
        },
        other => other,
    }
}

/// A failure to reach Redis, or any error that says nothing about the run's data.
fn unavailable(err: RedisError) -> Error {
    Error::Unavailable(err.to_string())
}

/// Maps an error from a script or a command on one run's keys; `expected` is the version
/// `apply_transition` expected. The scripts' own refusals come back as server errors whose code
/// names them; errors from inside a `MULTI` arrive as a list of server errors.
fn script_error(err: RedisError, run_id: &str, expected: u64) -> Error {
    if matches!(
        err.kind(),
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType
    ) {
        return Error::Corrupt(format!(
            "unexpected reply from Redis for run {run_id}: {err}"
        ));
    }
    let Some(server_errors) = err.clone().into_server_errors() else {
        return unavailable(err);
    };
    let Some((_, first)) = server_errors.first() else {
        return unavailable(err);
    };
    let detail = first.details().unwrap_or_default();
    match first.code() {
        "EXISTS" => Error::AlreadyExists(run_id.to_owned()),
        "NOTFOUND" => Error::NotFound(run_id.to_owned()),
        "CONFLICT" => match detail.trim().parse() {
            Ok(actual) => Error::Conflict {
                run_id: run_id.to_owned(),
                expected,
                actual,
            },
            Err(_) => Error::Corrupt(format!("run {run_id} has a bad version: {detail:?}")),
        },
        "CORRUPT" => Error::Corrupt(format!("run {run_id}: {detail}")),
        "FENCED" => {
            let (task_key, current) = detail.trim().rsplit_once(' ').unwrap_or((detail, "none"));
            Error::Fenced {
                run_id: run_id.to_owned(),
                task_key: task_key.to_owned(),
                attempt: 0,
                current: current.to_owned(),
            }
        }
        "WRONGTYPE" => Error::Corrupt(format!("run {run_id}: {err}")),
        _ => unavailable(err),
    }
}

fn corrupt(run_id: &str, what: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!("run {run_id}: {what}"))
}

/// Hash fields (as Redis returns them in `HGETALL`) with UTF-8 names.
fn fields<M: FromIterator<(String, Vec<u8>)>>(
    run_id: &str,
    what: &str,
    value: Value,
) -> Result<M, Error> {
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = match value {
        Value::Map(pairs) => pairs
            .into_iter()
            .map(|(k, v)| Ok((bytes(run_id, what, k)?, bytes(run_id, what, v)?)))
            .collect::<Result<_, Error>>()?,
        Value::Array(items) => {
            if items.len() % 2 != 0 {
                return Err(corrupt(run_id, format!("odd reply for its {what}")));
            }
            let mut items = items.into_iter();
            let mut pairs = Vec::new();
            while let (Some(k), Some(v)) = (items.next(), items.next()) {
                pairs.push((bytes(run_id, what, k)?, bytes(run_id, what, v)?));
            }
            pairs
        }
        Value::Nil => Vec::new(),
        other => return Err(corrupt(run_id, format!("{what} is not a hash: {other:?}"))),
    };
    pairs
        .into_iter()
        .map(|(k, v)| {
            String::from_utf8(k)
                .map(|k| (k, v))
                .map_err(|_| corrupt(run_id, format!("a key of its {what} is not UTF-8")))
        })
        .collect()
}

fn bytes(run_id: &str, what: &str, value: Value) -> Result<Vec<u8>, Error> {
    match value {
        Value::BulkString(bytes) => Ok(bytes),
        Value::SimpleString(text) => Ok(text.into_bytes()),
        Value::Int(n) => Ok(n.to_string().into_bytes()),
        other => Err(corrupt(run_id, format!("{what} holds {other:?}"))),
    }
}

/// Takes a header field out of the run hash.
fn take(run_id: &str, hash: &mut HashMap<String, Vec<u8>>, field: &str) -> Result<Vec<u8>, Error> {
    hash.remove(field)
        .ok_or_else(|| corrupt(run_id, format!("its header has no {field}")))
}

fn take_text(
    run_id: &str,
    hash: &mut HashMap<String, Vec<u8>>,
    field: &str,
) -> Result<String, Error> {
    String::from_utf8(take(run_id, hash, field)?)
        .map_err(|_| corrupt(run_id, format!("its {field} is not UTF-8")))
}

fn take_number<T: std::str::FromStr>(
    run_id: &str,
    hash: &mut HashMap<String, Vec<u8>>,
    field: &str,
) -> Result<T, Error> {
    let text = take_text(run_id, hash, field)?;
    text.parse()
        .map_err(|_| corrupt(run_id, format!("its {field} is not a number: {text:?}")))
}

/// Escapes the glob characters of `SCAN MATCH`.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

impl RedisStore {
    /// Runs a read once more after a short pause if Redis was unreachable: the connection
    /// manager reconnects by itself, but fails the first command after the connection dropped
    /// (Redis restarted, a proxy cut it). Reads are safe to repeat; writes are not retried here,
    /// their callers know whether repeating them is safe.
    async fn read_retrying<T, F, Fut>(&self, read: F) -> Result<T, Error>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, Error>>,
    {
        match read().await {
            Err(Error::Unavailable(_)) => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                read().await
            }
            other => other,
        }
    }
}

impl Store for RedisStore {
    async fn create_run(&self, header: RunHeader, first: TransitionWrite) -> Result<(), Error> {
        let run_id = header.run_id.as_str();
        let keys = self.run_keys(run_id);
        let mut invocation = CREATE_RUN.prepare_invoke();
        keys.add_to(&mut invocation);
        invocation
            .arg(header.workflow.as_str())
            .arg(header.workflow_id.as_str())
            .arg(header.input.as_slice())
            .arg(header.created_ms)
            .arg(header.traceparent.as_str());
        add_transition(&mut invocation, &first, &self.timer_prefix(), run_id);
        let mut con = self.con.clone();
        let _version: u64 = invocation
            .invoke_async(&mut con)
            .await
            .map_err(|err| with_fence_attempt(script_error(err, run_id, 0), &first))?;

        // The run exists now: a failure to index it must not turn into an error the caller would
        // retry (the retry would find the run). `rebuild_indexes` repairs what is left behind.
        let indexed: Result<(), RedisError> = async {
            let _: i64 = con.zadd(self.runs_key(), run_id, header.created_ms).await?;
            let _: i64 = con
                .zadd(
                    self.workflow_runs_key(&header.workflow_id),
                    run_id,
                    header.created_ms,
                )
                .await?;
            self.update_active(run_id, &first.status).await
        }
        .await;
        if let Err(err) = indexed {
            tracing::warn!(run_id, error = %err, "run created but not indexed; rebuild_indexes repairs it");
        }
        Ok(())
    }

    async fn apply_transition(
        &self,
        run_id: &str,
        expected_version: u64,
        write: TransitionWrite,
    ) -> Result<u64, Error> {
        let keys = self.run_keys(run_id);
        let mut invocation = APPLY_TRANSITION.prepare_invoke();
        keys.add_to(&mut invocation);
        invocation.arg(expected_version);
        add_transition(&mut invocation, &write, &self.timer_prefix(), run_id);
        let mut con = self.con.clone();
        let (version, before): (u64, String) =
            invocation.invoke_async(&mut con).await.map_err(|err| {
                with_fence_attempt(script_error(err, run_id, expected_version), &write)
            })?;

        // Most transitions leave a running run running: its index entry is already there, and
        // skipping the update keeps a transition at one round trip.
        if !(before == RUNNING && write.status == RUNNING)
            && let Err(err) = self.update_active(run_id, &write.status).await
        {
            tracing::warn!(run_id, error = %err, "transition applied but active index not updated; rebuild_indexes repairs it");
        }
        Ok(version)
    }

    async fn load_run(&self, run_id: &str) -> Result<Option<StoredRun>, Error> {
        self.read_retrying(|| async {
            let keys = self.run_keys(run_id);
            let mut con = self.con.clone();
            type Reply = (Value, Value, Value, Value, Value, Value);
            let (run, events, results, steps, tasks, chain): Reply = ::redis::pipe()
                .atomic()
                .cmd("HGETALL")
                .arg(&keys.run)
                .cmd("LRANGE")
                .arg(&keys.events)
                .arg(0)
                .arg(-1)
                .cmd("HGETALL")
                .arg(&keys.results)
                .cmd("HGETALL")
                .arg(&keys.steps)
                .cmd("HGETALL")
                .arg(&keys.tasks)
                .cmd("LRANGE")
                .arg(&keys.chain)
                .arg(0)
                .arg(-1)
                .query_async(&mut con)
                .await
                .map_err(|err| script_error(err, run_id, 0))?;

            let mut hash: HashMap<String, Vec<u8>> = fields(run_id, "header", run)?;
            if hash.is_empty() {
                return Ok(None);
            }
            let header = RunHeader {
                run_id: run_id.to_owned(),
                workflow_id: take_text(run_id, &mut hash, "workflow_id")?,
                workflow: take_text(run_id, &mut hash, "workflow")?,
                input: take(run_id, &mut hash, "input")?,
                created_ms: take_number(run_id, &mut hash, "created_ms")?,
                // Absent in runs created before runs were traced.
                traceparent: hash
                    .remove("traceparent")
                    .and_then(|bytes| String::from_utf8(bytes).ok())
                    .unwrap_or_default(),
            };
            let error = match hash.remove("error") {
                Some(error) => Some(
                    String::from_utf8(error)
                        .map_err(|_| corrupt(run_id, "its error is not UTF-8"))?,
                ),
                None => None,
            };
            let events = list(run_id, "events", events)?;
            let links = list(run_id, "chain", chain)?;
            Ok(Some(StoredRun {
                version: take_number(run_id, &mut hash, "version")?,
                status: take_text(run_id, &mut hash, "status")?,
                error,
                state_sha256: take_text(run_id, &mut hash, "state_sha256")?,
                updated_ms: take_number(run_id, &mut hash, "updated_ms")?,
                events,
                results: fields(run_id, "results", results)?,
                steps: fields::<BTreeMap<_, _>>(run_id, "steps", steps)?,
                tasks: fields::<BTreeMap<_, _>>(run_id, "tasks", tasks)?,
                links,
                header,
            }))
        })
        .await
    }

    async fn swap_tasks(&self, swaps: Vec<TaskSwap>) -> Result<Vec<bool>, Error> {
        if swaps.is_empty() {
            return Ok(Vec::new());
        }
        let mut invocation = SWAP_TASKS.prepare_invoke();
        invocation.arg(self.timer_prefix());
        for swap in &swaps {
            invocation
                .key(self.run_keys(&swap.run_id).tasks)
                .arg(format!("{}/{}", swap.run_id, swap.task_key))
                .arg(swap.task_key.as_str())
                .arg(swap.expected.as_slice());
            match &swap.new {
                Some(bytes) => invocation.arg("1").arg(bytes.as_slice()),
                None => invocation.arg("0").arg(""),
            };
        }
        let mut con = self.con.clone();
        let swapped: Vec<i64> = invocation
            .invoke_async(&mut con)
            .await
            .map_err(|err| script_error(err, &swaps[0].run_id, 0))?;
        Ok(swapped.into_iter().map(|s| s == 1).collect())
    }

    async fn due_tasks(
        &self,
        agent: &str,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<DueTask>, Error> {
        self.read_retrying(|| async {
            if limit == 0 {
                return Ok(Vec::new());
            }
            let mut con = self.con.clone();
            let reply: Vec<Vec<u8>> = DUE_TASKS
                .key(format!("{}{agent}", self.timer_prefix()))
                .arg(now_ms)
                .arg(limit.min(i64::MAX as usize))
                .arg(format!("{}:run:", self.prefix))
                .invoke_async(&mut con)
                .await
                .map_err(unavailable)?;
            let mut due = Vec::with_capacity(reply.len() / 2);
            let mut items = reply.into_iter();
            while let (Some(member), Some(task)) = (items.next(), items.next()) {
                let member = String::from_utf8(member).map_err(|_| {
                    Error::Corrupt(format!("a timer of agent {agent} is not UTF-8"))
                })?;
                let Some((run_id, task_key)) = member.split_once('/') else {
                    continue;
                };
                due.push(DueTask {
                    run_id: run_id.to_owned(),
                    task_key: task_key.to_owned(),
                    task,
                });
            }
            Ok(due)
        })
        .await
    }

    async fn task(&self, run_id: &str, task_key: &str) -> Result<Option<Vec<u8>>, Error> {
        self.read_retrying(|| async {
            let mut con = self.con.clone();
            con.hget(self.run_keys(run_id).tasks, task_key)
                .await
                .map_err(|err| script_error(err, run_id, 0))
        })
        .await
    }

    async fn version(&self, run_id: &str) -> Result<Option<u64>, Error> {
        self.read_retrying(|| async {
            let mut con = self.con.clone();
            con.hget(self.run_keys(run_id).run, "version")
                .await
                .map_err(|err| script_error(err, run_id, 0))
        })
        .await
    }

    async fn list_runs(&self, limit: usize) -> Result<Vec<RunSummary>, Error> {
        self.read_retrying(|| async {
            if limit == 0 {
                return Ok(Vec::new());
            }
            let mut con = self.con.clone();
            // Equal scores come back in reverse member order: (created_ms, run_id) descending, the
            // memory store's order.
            let stop = isize::try_from(limit - 1).unwrap_or(isize::MAX);
            let ids: Vec<String> = con
                .zrevrange(self.runs_key(), 0, stop)
                .await
                .map_err(unavailable)?;
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            let mut pipe = ::redis::pipe();
            for run_id in &ids {
                pipe.cmd("HMGET")
                    .arg(self.run_keys(run_id).run)
                    .arg("workflow_id")
                    .arg("status")
                    .arg("created_ms")
                    .arg("updated_ms");
            }
            type Fields = (Option<String>, Option<String>, Option<i64>, Option<i64>);
            let rows: Vec<Fields> = pipe.query_async(&mut con).await.map_err(unavailable)?;
            Ok(ids
                .into_iter()
                .zip(rows)
                .filter_map(|(run_id, row)| match row {
                    (Some(workflow_id), Some(status), Some(created_ms), Some(updated_ms)) => {
                        Some(RunSummary {
                            run_id,
                            workflow_id,
                            status,
                            created_ms,
                            updated_ms,
                        })
                    }
                    // Indexed but gone: the index is behind the runs.
                    _ => None,
                })
                .collect())
        })
        .await
    }

    async fn active_runs(&self) -> Result<Vec<String>, Error> {
        self.read_retrying(|| async {
            let mut con = self.con.clone();
            let mut ids: Vec<String> =
                con.smembers(self.active_key()).await.map_err(unavailable)?;
            if ids.is_empty() {
                return Ok(ids);
            }
            let mut pipe = ::redis::pipe();
            for run_id in &ids {
                pipe.cmd("HGET")
                    .arg(self.run_keys(run_id).run)
                    .arg("status");
            }
            let statuses: Vec<Option<Vec<u8>>> =
                pipe.query_async(&mut con).await.map_err(unavailable)?;
            let mut statuses = statuses.into_iter();
            ids.retain(|_| statuses.next().flatten().as_deref() == Some(RUNNING.as_bytes()));
            ids.sort();
            Ok(ids)
        })
        .await
    }

    async fn decisions(&self, run_id: &str) -> Result<BTreeMap<String, Vec<u8>>, Error> {
        self.read_retrying(|| async {
            let mut con = self.con.clone();
            let reply: Value = ::redis::cmd("HGETALL")
                .arg(self.run_keys(run_id).decisions)
                .query_async(&mut con)
                .await
                .map_err(|err| script_error(err, run_id, 0))?;
            fields(run_id, "decisions", reply)
        })
        .await
    }

    async fn claim_idempotency_key(
        &self,
        key: &str,
        run_id: &str,
        request_sha256: &str,
        ttl_s: u64,
    ) -> Result<Claim, Error> {
        let mut con = self.con.clone();
        let redis_key = format!("{}:idempotency:{key}", self.prefix);
        let value = format!("{run_id} {request_sha256}");
        // SET NX, else GET; a key that expires between the two is claimed on the next try.
        for _ in 0..3 {
            let set: Option<String> = ::redis::cmd("SET")
                .arg(&redis_key)
                .arg(&value)
                .arg("NX")
                .arg("EX")
                .arg(ttl_s.max(1))
                .query_async(&mut con)
                .await
                .map_err(unavailable)?;
            if set.is_some() {
                return Ok(Claim::Claimed);
            }
            let held: Option<String> = con.get(&redis_key).await.map_err(unavailable)?;
            if let Some(held) = held {
                let (run_id, request_sha256) = held.split_once(' ').ok_or_else(|| {
                    Error::Corrupt(format!("idempotency key {key:?} holds {held:?}"))
                })?;
                return Ok(Claim::Held {
                    run_id: run_id.to_owned(),
                    request_sha256: request_sha256.to_owned(),
                });
            }
        }
        Err(Error::Unavailable(format!(
            "idempotency key {key:?} kept expiring while it was claimed"
        )))
    }

    async fn runs_of_workflow(
        &self,
        workflow_id: &str,
        limit: usize,
    ) -> Result<Vec<String>, Error> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut con = self.con.clone();
        let stop = isize::try_from(limit - 1).unwrap_or(isize::MAX);
        con.zrevrange(self.workflow_runs_key(workflow_id), 0, stop)
            .await
            .map_err(unavailable)
    }
}

/// The items of a list reply.
fn list(run_id: &str, what: &str, reply: Value) -> Result<Vec<Vec<u8>>, Error> {
    match reply {
        Value::Array(items) => items
            .into_iter()
            .map(|item| bytes(run_id, what, item))
            .collect(),
        Value::Nil => Ok(Vec::new()),
        other => Err(corrupt(
            run_id,
            format!("its {what} is not a list: {other:?}"),
        )),
    }
}
