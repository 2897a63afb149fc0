//! Redis's replies, read back: a refusal of a script or a failure to reach Redis becomes the
//! store's [`Error`]; hash and list replies become bytes; the run header's fields are taken out of
//! its hash one by one, each missing or malformed one named as corruption.

use std::collections::HashMap;

use ::redis::{ErrorKind, RedisError, Value};

use crate::store::{Error, TransitionWrite};

/// A `Fenced` refusal with the attempt the write asked for (the script names only the task and
/// its current attempt).
pub(super) fn with_fence_attempt(error: Error, write: &TransitionWrite) -> Error {
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

/// A failure to reach Redis, or any error that says nothing about the run's data. An `OOM`
/// refusal is named as what it is: an operator reads it in `/readyz` and in clients' errors.
pub(super) fn unavailable(err: RedisError) -> Error {
    if out_of_memory(&err) {
        return Error::Unavailable(format!(
            "Redis is out of memory and refuses writes (its maxmemory is reached, and its \
             maxmemory-policy evicts nothing): {err}"
        ));
    }
    Error::Unavailable(err.to_string())
}

/// Whether Redis refused a command for memory (`OOM command not allowed when used memory >
/// 'maxmemory'`), as it refuses every write once `maxmemory` is reached under `noeviction`.
fn out_of_memory(err: &RedisError) -> bool {
    err.clone()
        .into_server_errors()
        .is_some_and(|errors| errors.iter().any(|(_, error)| error.code() == "OOM"))
}

/// A failure of a write (`create_run`, `apply_transition`, their settles) of `run_id`. When
/// Redis answered (a script's refusal, an error reply, a reply that does not read), it is what
/// the answer says: the scripts check everything before their first write, and Redis refuses a
/// script's first write for memory before it writes anything, so nothing was written. When no
/// answer came (a timeout, a connection lost after sending), the write may have been done:
/// [`Error::Indeterminate`]. A connection refused sent nothing.
pub(super) fn write_error(err: RedisError, run_id: &str, expected: u64, cluster: bool) -> Error {
    let answered = err.clone().into_server_errors().is_some()
        || matches!(
            err.kind(),
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType
        );
    if answered || err.is_connection_refusal() {
        return match script_error(err, run_id, expected) {
            // A cluster client tries a request again (on another node, or a new connection)
            // before it gives up, and the error of its last try says nothing of an earlier one
            // that reached a master and ran: only the scripts' own refusals are certain there.
            // (A run's timers written by such a try went unregistered, and it stayed stuck
            // until the registry's repair, minutes later, in the cluster chaos test.)
            Error::Unavailable(why) if cluster => {
                Error::Indeterminate(format!("Redis Cluster gave up on the write: {why}"))
            }
            error => error,
        };
    }
    Error::Indeterminate(format!("Redis did not answer: {err}"))
}

/// Maps an error from a script or a command on one run's keys; `expected` is the version
/// `apply_transition` expected. The scripts' own refusals come back as server errors whose code
/// names them; errors from inside a `MULTI` arrive as a list of server errors.
pub(super) fn script_error(err: RedisError, run_id: &str, expected: u64) -> Error {
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
        "VOIDED" => Error::Voided(run_id.to_owned()),
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

pub(super) fn corrupt(run_id: &str, what: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!("run {run_id}: {what}"))
}

/// Hash fields (as Redis returns them in `HGETALL`) with UTF-8 names.
pub(super) fn fields<M: FromIterator<(String, Vec<u8>)>>(
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

/// The items of a list reply.
pub(super) fn list(run_id: &str, what: &str, reply: Value) -> Result<Vec<Vec<u8>>, Error> {
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

fn bytes(run_id: &str, what: &str, value: Value) -> Result<Vec<u8>, Error> {
    match value {
        Value::BulkString(bytes) => Ok(bytes),
        Value::SimpleString(text) => Ok(text.into_bytes()),
        Value::Int(n) => Ok(n.to_string().into_bytes()),
        other => Err(corrupt(run_id, format!("{what} holds {other:?}"))),
    }
}

/// Takes a header field out of the run hash.
pub(super) fn take(
    run_id: &str,
    hash: &mut HashMap<String, Vec<u8>>,
    field: &str,
) -> Result<Vec<u8>, Error> {
    hash.remove(field)
        .ok_or_else(|| corrupt(run_id, format!("its header has no {field}")))
}

pub(super) fn take_text(
    run_id: &str,
    hash: &mut HashMap<String, Vec<u8>>,
    field: &str,
) -> Result<String, Error> {
    String::from_utf8(take(run_id, hash, field)?)
        .map_err(|_| corrupt(run_id, format!("its {field} is not UTF-8")))
}

pub(super) fn take_number<T: std::str::FromStr>(
    run_id: &str,
    hash: &mut HashMap<String, Vec<u8>>,
    field: &str,
) -> Result<T, Error> {
    let text = take_text(run_id, hash, field)?;
    text.parse()
        .map_err(|_| corrupt(run_id, format!("its {field} is not a number: {text:?}")))
}
