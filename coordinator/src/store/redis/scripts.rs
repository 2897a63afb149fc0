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
    evalsha_sized(script, keys, (0, 0))
}

/// [`evalsha`] with room for `more` arguments and bytes after the keys (see
/// [`transition_size`]): a command grown argument by argument reallocates a dozen times.
pub(super) fn evalsha_sized(script: &Script, keys: &[&str], more: (usize, usize)) -> Cmd {
    let keys_bytes: usize = keys.iter().map(|key| key.len()).sum();
    let (args, bytes) = more;
    // EVALSHA, the 40-character digest, the key count, then the keys.
    let mut cmd = Cmd::with_capacity(3 + keys.len() + args, 7 + 40 + 4 + keys_bytes + bytes);
    cmd.arg("EVALSHA")
        .arg(script.get_hash())
        .arg(keys.len())
        .arg(keys);
    cmd
}

/// How many arguments [`add_transition`] adds after a script's own, and how many bytes at most
/// (a number counted at 20).
pub(super) fn transition_size(
    write: &TransitionWrite,
    timer_prefix: &str,
    run_id: &str,
) -> (usize, usize) {
    const NUMBER: usize = 20;
    fn pairs<V: AsRef<[u8]>>(list: &[(String, V)]) -> (usize, usize) {
        let bytes = list
            .iter()
            .map(|(key, value)| key.len() + value.as_ref().len())
            .sum();
        (2 * list.len(), bytes)
    }
    let lists = [
        (write.events.len(), write.events.iter().map(Vec::len).sum()),
        pairs(&write.results),
        pairs(&write.steps),
        pairs(&write.tasks_set),
        (
            write.tasks_removed.len(),
            write.tasks_removed.iter().map(String::len).sum(),
        ),
        (write.links.len(), write.links.iter().map(Vec::len).sum()),
        pairs(&write.decisions),
        (
            2 * write.fences.len(),
            write.fences.iter().map(|(key, _)| key.len() + NUMBER).sum(),
        ),
    ];
    let (args, bytes) = lists.iter().fold((0, 0), |(args, bytes), (a, b)| {
        (args + a + 1, bytes + b + NUMBER)
    });
    let tail = write.status.as_str().len()
        + 1
        + write.error.as_ref().map_or(0, String::len)
        + write.state_sha256.len()
        + NUMBER
        + timer_prefix.len()
        + run_id.len()
        + write.write_id.len();
    // The status, the error (a flag and its text), the digest, the time, the timer prefix, the
    // run id and the write id.
    (args + 8, bytes + tail)
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
        invocation.arg(key.as_str()).arg(*attempt);
    }
}

#[cfg(test)]
mod tests {
    use ::redis::{Arg, Cmd};

    use super::{add_transition, transition_size};
    use crate::store::TransitionWrite;

    fn bytes(text: &str) -> Vec<u8> {
        text.as_bytes().to_vec()
    }

    /// The size a transition's command is made with holds every argument it gets: the
    /// argument count exactly, the bytes at most.
    #[test]
    fn a_transition_command_is_sized_for_what_it_carries() {
        let write = TransitionWrite {
            events: vec![bytes(r#"{"event":"agent_succeeded"}"#)],
            results: vec![("plan#1".into(), bytes(r#"{"ok":true}"#).into())],
            steps: vec![("plan".into(), bytes("{}")), ("code".into(), bytes("{}"))],
            tasks_set: vec![("code#1".into(), bytes(r#"{"agent":"coder"}"#))],
            tasks_removed: vec!["plan#1".into()],
            links: vec![bytes("{}")],
            decisions: vec![("plan#1/0".into(), bytes("{}"))],
            error: Some("it broke".into()),
            state_sha256: "0".repeat(64),
            updated_ms: 1_700_000_000_000,
            write_id: "w-1".into(),
            fences: vec![("plan#1".into(), 4_000_000_000)],
            ..TransitionWrite::default()
        };
        let (args, most_bytes) = transition_size(&write, "baton:timers:", "run-1");
        let mut cmd = Cmd::new();
        add_transition(&mut cmd, &write, "baton:timers:", "run-1");
        let written: Vec<usize> = cmd
            .args_iter()
            .map(|arg| match arg {
                Arg::Simple(bytes) => bytes.len(),
                _ => 0,
            })
            .collect();
        assert_eq!(written.len(), args);
        let total: usize = written.iter().sum();
        assert!(total <= most_bytes, "{total} > {most_bytes}");
    }
}
