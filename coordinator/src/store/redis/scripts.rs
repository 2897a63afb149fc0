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

use ::redis::{Script, ScriptInvocation};

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

/// Appends pieces of live output to a running run's output.
pub(super) static APPEND_OUTPUT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/append_output.lua")));

/// Reads an agent's due timers and their tasks.
pub(super) static DUE_TASKS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/due_tasks.lua")));

/// Appends a transition in the encoding `lua/transition.lua` reads.
pub(super) fn add_transition(
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
