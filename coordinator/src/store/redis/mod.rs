//! The Redis store: the production [`Store`], on one Redis server or on a Redis Cluster.
//!
//! - this file: [`RedisStore`]; below, the layout, the connections, waiting for replicas, the
//!   indexes, the timers and the scripts.
//! - `connect`: reaching Redis: the URL (or a cluster's URLs) with its credentials and TLS,
//!   whether it is a cluster, the checks made when connecting, the cluster client's timeouts,
//!   and [`redacted`], the URL as logs and errors show it (no password).
//! - `connection`: one connection type for both: a single server's connection manager, or
//!   redis-rs's cluster client, replaced by a fresh one when it keeps timing out.
//! - `keys`: the name of every key, built from the prefix; a run's keys carry its hash tag.
//! - `slots`: a cluster's hash slots: the slot of a run, and a hash tag that lands on each slot.
//! - `timers`: the timer sets on a cluster, one per agent and slot, and the slot registry that
//!   tells a sweep which slots to read.
//! - `scripts`: the Lua scripts, each joined from files of `lua/`; a transition as arguments.
//! - `runs`, `tasks`, `output`, `listing`, `coordination`: each trait of the [`Store`] (`Runs`,
//!   `Tasks`, `LiveOutput`, `Listing`, `Coordination`) implemented as commands and scripts on
//!   the layout below:
//!   - `runs`: a create, a transition and their settles, each one script; a run read back.
//!   - `tasks`: swaps and due tasks, each one script; a run's tasks read.
//!   - `output`: a run's live output appended to its stream, and read back from it.
//!   - `listing`: `list_runs`, a page walked over the indexes from a cursor, filtered by status;
//!     the active runs, a workflow's, a run's decisions.
//!   - `coordination`: idempotency keys, free slots, `ping`.
//! - `round_trips`: how writes and a run's reads go to Redis: a script and the `WAIT` behind it,
//!   a new run's index entries and its create in one pipeline, a read at one version or behind a
//!   replication barrier.
//! - `replies`: replies read back: refusals and failures as [`Error`], hashes and lists as bytes.
//! - `indexes`: the global indexes kept in line with the runs, and `rebuild_indexes`.
//! - `lua/`: the Lua source of the scripts ([Scripts](#scripts) says which file goes where).
//!
//! # Layout
//!
//! With the key prefix `P` (`baton` unless [`RedisStore::connect_with_prefix`] says otherwise), a
//! run `R` is eight keys (nine for a few seconds after a read under `--redis-wait-replicas`; a
//! run id whose create was settled as never done has only its void marker):
//!
//! | key                   | type | holds                                                          |
//! |-----------------------|------|----------------------------------------------------------------|
//! | `P:run:{R}`           | hash | `workflow`, `workflow_id`, `input`, `created_ms`, `traceparent`, `submitted_by`, `updated_ms`, `status`, `error` (absent when `None`), `state_sha256`, `version`, `writes` (the `write_id`s of the writes that made the last 8 versions, 16 characters each end to end), `output_bytes` (while the run has live output) |
//! | `P:run:{R}:events`    | list | the event log, `RPUSH`ed in order                              |
//! | `P:run:{R}:results`   | hash | `"<step>#<visit>"` -> result                                   |
//! | `P:run:{R}:steps`     | hash | step id -> step state                                          |
//! | `P:run:{R}:tasks`     | hash | task key -> task                                               |
//! | `P:run:{R}:chain`     | list | the state chain's links, `RPUSH`ed in order                    |
//! | `P:run:{R}:decisions` | hash | decision key -> decision with its embedding (`HSETNX`)         |
//! | `P:run:{R}:output`    | stream | live output while the run runs: fields `s` step, `v` visit, `a` attempt, `t` text, `r` restart; set to expire a minute after the transition that ends the run |
//! | `P:run:{R}:barrier`   | string | `1`, written behind a read of the run under `--redis-wait-replicas` so that a `WAIT` can back the read (never read; expires after 10 s) |
//! | `P:run:{R}:void`      | string | `1`, written by `settle_create` when it found the run not created: `create_run` refuses the id from then on (kept: a void is as rare as a create that went unanswered) |
//!
//! Every one of them carries the run id as a hash tag, `{R}`, so a Redis Cluster puts all of a
//! run on one slot. That is what lets a single Lua script read and write the whole run, and a
//! single `MULTI` read it back: atomicity per run is the one guarantee the [`Store`] contract
//! asks for, and a script over one slot gives it in a Cluster as well as on one server.
//!
//! - `create_run` and `apply_transition` are each one script (see [Scripts](#scripts)): the
//!   version check, the result check, then every write. Redis does not roll a failing script
//!   back, so all checks come before the first write and a refused call writes nothing. The
//!   scripts answer a refusal with an error reply (`EXISTS`, `NOTFOUND`, `CONFLICT <actual>`,
//!   `FENCED <task key> <current attempt>`, `CORRUPT <why>`) that `replies.rs` maps to [`Error`].
//! - `load_run` reads the run's keys but `decisions` in one pipeline with the header's
//!   `version` read again behind them, so it sees a run between two transitions, never in the
//!   middle of one: every script that changes the run's keys (but its tasks, each read whole by
//!   one command) raises the version, and a read that saw it move is made again (after three,
//!   in a `MULTI`). Not in a `MULTI` first: a Redis out of memory refuses every command queued
//!   in one, reads too, and reads must go on while writes are refused.
//! - `swap_tasks` is one script for a batch of compare-and-swaps, so a coordinator renews all
//!   the leases it holds in one round trip (on a cluster, one script per slot of the batch, sent
//!   at once); `due_tasks`, one script too, reads an agent's due timers and their tasks in one
//!   (on a cluster, one per slot read: see `timers.rs`).
//! - Values are bytes and travel as bytes; only keys (run ids, result keys, step ids, task keys)
//!   and the header's text fields must be UTF-8 when read back.
//!
//! A write whose answer never came (a reply that timed out on a busy Redis, a connection lost
//! after sending, replicas short of `WAIT`) is [`Error::Indeterminate`]: it may have happened,
//! and may still happen (a busy Redis runs it when it gets to it). A refusal Redis answered
//! (the scripts' own, `OOM`, `BUSY`, `LOADING`) and a connection refused are `Unavailable`, and
//! wrote nothing: the scripts check everything before their first write, and Redis refuses a
//! script's first write for memory before it writes. An indeterminate write is settled by a
//! script on the run's slot, which runs before or after the write, never during it:
//! `settle_create` finds the run's header, or writes its void marker (which `create_run.lua`
//! checks); `settle_transition` finds the write's `write_id` in the header's `writes` at the
//! version it made, or, when the run is still at the version the write expected, raises the
//! version by one (a fence: the write, should it come, is a `CONFLICT`). Both are safe to send
//! again, and find what the one before did. With `--redis-wait-replicas` they write (the
//! barrier) and wait, so that what they found is on the replicas too.
//!
//! # Connections
//!
//! On one server (or a primary behind a proxy): one connection manager for everything, plus a
//! second one for `wait_output` alone, whose `XREAD BLOCK` holds a connection until output
//! comes and would hold up every other command sent on a shared one.
//!
//! On a Redis Cluster, found by `connect.rs` (several comma-separated URLs, or one node whose
//! `INFO cluster` says `cluster_enabled:1`): redis-rs's cluster client, which sends each command
//! to the master of its key's slot, follows `MOVED` and `ASK` and refreshes the topology. A
//! request that cannot reach its slot's master fails within seconds (`connect.rs` bounds each try
//! and the retries) rather than hanging through a failover. A client that timed out 3 times
//! within 10 s is replaced by a new one (`connection.rs` says why). What the store sends suits
//! a cluster: every script and every pipeline touches one slot, and reads over many runs
//! (`list_runs`, the active runs' statuses, `wait_output`) are one command per run, sent
//! concurrently, where one server gets them in one pipeline. `wait_output` polls each run's
//! stream every 50 ms instead of blocking: one `XREAD` over several runs would span slots.
//!
//! # Waiting for replicas
//!
//! With [`WaitReplicas`] (`--redis-wait-replicas N`), a write that changes a run (`create_run`,
//! `apply_transition`) is its `EVALSHA` with `WAIT N timeout` right behind it, in one pipeline to
//! the master that runs the script, so the `WAIT` counts that write. Only that `WAIT` counts: one
//! sent apart could reach a connection made since (a reconnect, a replaced cluster client) that
//! wrote nothing, and it answers at once with the replicas connected, a false acknowledgement
//! (the minority-partition fault test caught one). A write short of `N` replicas within the
//! timeout is [`Error::Indeterminate`]: it is on the master, and may be lost if the master fails
//! over, so the caller must not act on it until a settle, backed by the replicas in turn, finds
//! it there.
//!
//! `load_run` is backed the same way: its reads in a `MULTI`, then a write of `P:run:{R}:barrier`
//! and the `WAIT`, all on one connection to the run's master. Replication is in order, so replicas
//! that have the barrier have everything the read saw; short of them, the read is `Unavailable`
//! too. A master cut off from its replicas still answers until the cluster's node timeout, and a
//! transition read from it could be lost by the failover: it must not reach a watcher, or a
//! coordinator that would act on it. The other reads (`version`, `task`, `due_tasks`, the
//! indexes) do not wait.
//!
//! `WAIT` blocks the connection it is sent on, so these writes and reads take turns on 8
//! connections of their own (8 cluster clients on a cluster), never the shared one. A pipeline
//! the cluster answered with `MOVED`, `ASK`, `TRYAGAIN` or `CLUSTERDOWN` did not run, and is sent
//! again (10 times at most, a little later each time).
//!
//! Run ids are expected to be non-empty and free of `{` and `}` (the coordinator makes UUIDs):
//! otherwise the hash tag would not be the whole run id and a Cluster could split a run.
//!
//! # Indexes
//!
//! Global keys, not part of any run:
//! - `P:runs`, a sorted set (score `created_ms`, member run id), for `list_runs`;
//! - `P:runs:active`, a set of run ids whose status is `running`, for `active_runs` and
//!   `list_runs` of running runs (intersected with `P:runs`, or a workflow's runs, for their
//!   order: `listing.rs`);
//! - `P:workflow:<workflow id>:runs`, a sorted set like `P:runs` per workflow id, for
//!   `runs_of_workflow` (decision queries over all runs of a workflow) and `list_runs` of one
//!   workflow — on a cluster each of these three is 256 shards (`P:runs:{i<n>}` and so on; a
//!   run's entry in shard `slot(run) mod 256`, the same shard number in each, so on the same
//!   slot) so that they spread over the masters, and readers merge the shards (`indexes.rs`);
//! - `P:idempotency:<key>`, a string `<run id> <request sha256>` that expires, for SubmitRun's
//!   idempotency keys (`SET NX EX`: the first submitter claims it; one whose run was voided is
//!   moved to a new run by `reclaim_idempotency_key.lua`);
//! - `P:principal:<name>:runs`, a set of the runs a principal with `max_running_runs` submitted
//!   that were running when last counted;
//! - `P:slots`, a hash: coordinator id -> `{"expires_ms", "free": {agent: slots}}`, the free
//!   worker slots each coordinator advertises (not an index: expired fields are dropped by the
//!   reader that finds them);
//! - `P:ready` (on a cluster `P:ready:{<slot tag>}`, one per master): the key `ping` writes, so
//!   that readiness fails when Redis refuses writes (out of memory) while it still answers reads.
//!
//! These keys live on other slots than the runs in a Cluster, so the run scripts cannot touch
//! them; they are written with separate commands, once per run (its creation, its status
//! changing) or per coordinator tick, never per step. A new run's entries (`P:runs`, its
//! workflow's, and `P:runs:active` if it starts running) go *before* the script that creates
//! it, with `ZADD NX` (an entry already there keeps its time): in the same pipeline on one
//! server, a round trip of their own first on a cluster or under `--redis-wait-replicas`. So no
//! crash and no lost answer leaves a created run unlisted; what they can leave is an entry
//! whose run never came, which readers skip, and which a refused or voided create removes.
//! Status changes are written after the script that made them. They are an index, not the
//! source of truth: the run headers are. [`RedisStore::rebuild_indexes`] rebuilds `P:runs` and
//! `P:runs:active` from the headers (scanning every master of a cluster), adds what the
//! workflow sets miss, and removes an entry whose run is not there only after settling its
//! create (voiding the id, should the create still come). Readers guard against a stale index
//! too: `list_runs` checks each run it lists against its header (gone, or another status, and it
//! is skipped) and `active_runs` keeps only the ids whose header says `running`.
//!
//! # Timers
//!
//! Each task with an agent and a due time (its lease's end, or its retry's) has a timer: member
//! `<run id>/<task key>` in a sorted set of its agent, scored `due_ms`, which the coordinators'
//! sweeps read. The run scripts write a timer together with its task (a task without its timer
//! would never be swept), so the timer set must be on the run's slot:
//! - on one server, one set per agent: `P:timers:<agent>`;
//! - on a cluster, one set per agent and slot, on that slot: `P:timers:{<slot tag>}:<agent>`,
//!   where the slot tag is a short string that hashes to the slot (`slots.rs`). A sweep finds the
//!   slots to read in the agent's slot registry, `P:timer-slots:{t:<agent>}` (a sorted set: slot
//!   -> at most its earliest timer) and its generations, `P:timer-slots:{t:<agent>}:gen` (a hash:
//!   slot -> a count of registrations). The registry is on another slot than the runs, so it is
//!   written by a second script after the run's (`register_timers`), raised by the sweep that
//!   read a slot only if no registration came in between (`raise_slots`), and rebuilt from the
//!   16,384 slots by [`RedisStore::repair_registry`], which each store runs for an agent when it
//!   first sweeps it and every 5 minutes after: a timer whose registration was lost is late,
//!   never lost. `timers.rs` has the details.
//!
//! Approval timeouts are timers of no agent (`P:timers:`, or `P:timers:{<slot tag>}:` and
//! `P:timer-slots:{t:}`): agent names are never blank.
//!
//! # Scripts
//!
//! Each script sent to Redis is files of `lua/` joined end to end, in this order, at compile
//! time (`scripts.rs`):
//!
//! | script             | made of                                   |
//! |--------------------|-------------------------------------------|
//! | `create_run`       | `transition.lua` + `create_run.lua`       |
//! | `apply_transition` | `transition.lua` + `apply_transition.lua` |
//! | `swap_tasks`       | `transition.lua` + `swap_tasks.lua`       |
//! | `due_tasks`        | `due_tasks.lua`                           |
//! | `append_output`    | `append_output.lua`                       |
//! | `settle_create`    | `settle_create.lua`                       |
//! | `settle_transition`| `transition.lua` + `settle_transition.lua`|
//! | `reclaim_idempotency_key` | `reclaim_idempotency_key.lua`      |
//! | `register_timers`  | `register_timers.lua` (a cluster's only)  |
//! | `due_slots`        | `due_slots.lua` (a cluster's only)        |
//! | `raise_slots`      | `raise_slots.lua` (a cluster's only)      |
//!
//! `transition.lua` is a prelude: it defines local functions (and a table) and calls nothing by
//! itself. The first two scripts use it to read, check and write a transition; `swap_tasks` only
//! for the timers of the tasks it swaps (`decode_task`, `check_timer_key`, `set_timer`,
//! `unset_timer`); `settle_transition` for the `writes` field (`remember_write`). A change to it
//! changes those four scripts.
//!
//! Scripts are sent as `EVALSHA` and loaded on `NOSCRIPT` (a restarted server, a flushed cache,
//! a new master that took over a slot).
//!
//! [`Store`]: super::Store

mod connect;
mod connection;
mod coordination;
mod indexes;
mod keys;
mod listing;
mod output;
mod replies;
mod round_trips;
mod runs;
mod scripts;
mod slots;
mod tasks;
mod timers;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Error;
pub use connect::{ConnectOptions, WaitReplicas, redacted};
use connection::Connection;

/// The key prefix of [`RedisStore::connect`].
pub const DEFAULT_PREFIX: &str = "baton";

/// The status that puts a run in `active_runs`.
const RUNNING: &str = baton_core::RunStatus::Running.as_str();

/// Runs in Redis, laid out as the [module docs](self) describe. Cheap to clone: clones share
/// one multiplexed connection that reconnects by itself.
#[derive(Clone)]
pub struct RedisStore {
    con: Connection,
    /// `wait_output`'s own connection on a single server: a blocking read holds it. (A cluster
    /// is polled instead: `XREAD` over several runs would span slots.)
    blocking: Connection,
    prefix: String,
    /// `P:timers:`, the prefix of the agents' timer sets on a single server, named once.
    timer_prefix: String,
    /// Whether each transition waits for replicas before it counts as written.
    wait: Option<WaitReplicas>,
    /// With `wait`: the connections writes that wait are sent on, in turn (`connect.rs` says
    /// why they are not `con`).
    writers: Arc<Vec<Connection>>,
    next_writer: Arc<std::sync::atomic::AtomicUsize>,
    /// When this store is next to repair each agent's timer slot registry (a cluster's;
    /// `timers`).
    next_repair: Arc<Mutex<HashMap<String, Instant>>>,
    /// (agent, slot) -> when a sweep of this store first found that registered slot empty
    /// (`timers`: a slot leaves the registry only when found empty twice).
    empty_seen: Arc<Mutex<HashMap<(String, u16), Instant>>>,
}

/// How often a cluster's `wait_output` polls the runs' streams.
const CLUSTER_OUTPUT_POLL: Duration = Duration::from_millis(50);

/// How long a reply may take on the blocking connection: longer than any `wait_output` blocks.
const BLOCKING_RESPONSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("cluster", &self.con.is_cluster())
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to `url` (`redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`, `rediss://` for TLS
    /// with the system's roots) with the key prefix [`DEFAULT_PREFIX`];
    /// [`RedisStore::connect_with`] says what is checked.
    pub async fn connect(url: &str) -> Result<RedisStore, Error> {
        Self::connect_with(url, ConnectOptions::default()).await
    }

    /// Connects to `url` and keeps every key under `prefix` (so that several stores can share a
    /// server). The prefix may not contain `{` or `}`: it would take the place of the run's hash
    /// tag.
    pub async fn connect_with_prefix(url: &str, prefix: &str) -> Result<RedisStore, Error> {
        let options = ConnectOptions {
            prefix: prefix.to_owned(),
            ..ConnectOptions::default()
        };
        Self::connect_with(url, options).await
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether the store talks to a Redis Cluster (else to one server).
    pub fn is_cluster(&self) -> bool {
        self.con.is_cluster()
    }

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
