//! The Lua scripts the store sends to Redis, and the arguments a transition travels in.
//!
//! A script is one or more files of `lua/` joined by `concat!` at compile time; the
//! [module docs](super#scripts) list the files of each. `transition.lua` goes first where it is
//! used: it only defines local functions (reading a transition from `ARGV`, the checks, the
//! writes, the timers of tasks), so the file after it is the script's body, and what that file
//! returns is the script's reply.
//!
//! Loading is redis-rs's: a [`Script`] is sent as `EVALSHA` of its SHA1 and, when Redis answers
//! `NOSCRIPT` (it restarted, or its script cache was flushed), loaded with `SCRIPT LOAD` and sent
//! once more. The store has no code of its own for it.

use std::sync::LazyLock;

use ::redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind};

use super::connection::Connection;
use crate::store::TransitionWrite;

/// Writes a run's header and its first transition, unless the run exists.
pub(super) static CREATE_RUN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("lua/transition.lua"),
        include_str!("lua/create_run.lua")
    ))
});

/// Applies a transition if the run is at the expected version.
pub(super) static APPLY_TRANSITION: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("lua/transition.lua"),
        include_str!("lua/apply_transition.lua")
    ))
});

/// Compare-and-swaps a batch of tasks, each with its timer.
pub(super) static SWAP_TASKS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("lua/transition.lua"),
        include_str!("lua/swap_tasks.lua")
    ))
});

/// Settles a `create_run` whose answer was lost: finds the run, or voids its id.
pub(super) static SETTLE_CREATE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/settle_create.lua")));

/// Settles an `apply_transition` whose answer was lost: finds its write id, or fences it.
pub(super) static SETTLE_TRANSITION: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("lua/transition.lua"),
        include_str!("lua/settle_transition.lua")
    ))
});

/// Moves an idempotency key from a voided run to a new one.
pub(super) static RECLAIM_KEY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/reclaim_idempotency_key.lua")));

/// Appends pieces of live output to a running run's output.
pub(super) static APPEND_OUTPUT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/append_output.lua")));

/// Reads an agent's due timers and their tasks.
pub(super) static DUE_TASKS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/due_tasks.lua")));

/// Files slots that hold an agent's timers in its slot registry (a cluster's; `timers.rs`).
pub(super) static REGISTER_TIMERS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/register_timers.lua")));

/// The slots whose earliest timer of an agent may be due, with their generations.
pub(super) static DUE_SLOTS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/due_slots.lua")));

/// Files what a sweep found in the slots it read.
pub(super) static RAISE_SLOTS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/raise_slots.lua")));

/// `EVALSHA` of `script` on `keys`, for arguments to be added to: a command of its own, so that
/// it can go in a pipeline (with `WAIT`, say), which a `ScriptInvocation` cannot.
pub(super) fn evalsha(script: &Script, keys: &[&str]) -> Cmd {
    let mut cmd = ::redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
    cmd
}

/// Sends `cmd`, an [`evalsha`] of `script`, loading the script first where Redis answers
/// `NOSCRIPT` (it restarted, its cache was flushed, a new master took over its slots).
pub(super) async fn eval<T: FromRedisValue>(
    con: &mut Connection,
    script: &Script,
    cmd: &Cmd,
) -> RedisResult<T> {
    match cmd.query_async(con).await {
        Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(con).await?;
            cmd.query_async(con).await
        }
        other => other,
    }
}

/// Appends a transition in the encoding `lua/transition.lua` reads.
pub(super) fn add_transition(
    invocation: &mut Cmd,
    write: &TransitionWrite,
    timer_prefix: &str,
    run_id: &str,
) {
    invocation.arg(write.events.len());
    for event in &write.events {
        invocation.arg(event.as_slice());
    }
    invocation.arg(write.results.len());
    for (key, bytes) in &write.results {
        invocation.arg(key.as_str()).arg(&bytes[..]);
    }
    for list in [&write.steps, &write.tasks_set] {
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
        .arg(write.write_id.as_str())
        .arg(write.fences.len());
    for (key, attempt) in &write.fences {
        invocation.arg(key.as_str()).arg(attempt.to_string());
    }
}
