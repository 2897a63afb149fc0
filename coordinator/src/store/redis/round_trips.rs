//! How a write and a run's read go to Redis: a script with `WAIT` behind it on one of the
//! writers (`--redis-wait-replicas`), a new run's index entries and its create in one pipeline,
//! a run read at one version, or behind a replication barrier; and a write's verdict when
//! replicas are short.

use ::redis::{Cmd, FromRedisValue, RedisError, Script, Value};

use super::RedisStore;
use super::indexes::Indexed;
use super::replies::script_error;
use super::scripts::{CREATE_RUN, eval};
use crate::store::{Error, RunHeader};

impl RedisStore {
    /// Sends `cmd`, an `EVALSHA` of `script` that writes, and with `--redis-wait-replicas` a
    /// `WAIT` right behind it on the same connection, one of the `writers` (a pipeline goes to
    /// one node: the master that ran the script, so the `WAIT` counts that write). Returns the script's reply and, when
    /// waiting, how many replicas acknowledged.
    pub(super) async fn write<T: FromRedisValue>(
        &self,
        script: &Script,
        cmd: &Cmd,
    ) -> Result<(T, Option<u32>), RedisError> {
        if self.wait.is_none() {
            return Ok((eval(&mut self.con.clone(), script, cmd).await?, None));
        }
        let mut pipe = ::redis::pipe();
        pipe.add_command(cmd.clone());
        let (mut replies, acked) = self.send_waiting(pipe, Some(script)).await?;
        let reply = FromRedisValue::from_redis_value(replies.remove(0))?;
        Ok((reply, Some(acked)))
    }

    /// On one server without `WAIT`: a new run's index entries and its `create_run` (`cmd`) in
    /// one pipeline, so one round trip, the entries before the run. Which entries it added
    /// (all, when the answer was lost), and the script's reply; an entry that could not be
    /// written (a key of another type) is logged, the run is created all the same.
    pub(super) async fn index_and_create(
        &self,
        header: &RunHeader,
        status: &str,
        cmd: &Cmd,
    ) -> (Indexed, Result<(u64, Option<u32>), RedisError>) {
        let run_id = header.run_id.as_str();
        let index = self.index_commands(header, status);
        let mut pipe = ::redis::pipe();
        for command in &index {
            pipe.add_command(command.clone());
        }
        pipe.add_command(cmd.clone()).ignore_errors();
        let mut con = self.con.clone();
        let mut added = Indexed::from_replies(&[]);
        let mut loaded = false;
        loop {
            let replies: Vec<::redis::RedisResult<Value>> = match pipe.query_async(&mut con).await {
                Ok(replies) => replies,
                Err(err) => return (added, Err(err)),
            };
            let mut replies = replies
                .into_iter()
                .map(|reply| reply.and_then(Value::extract_error));
            let indexed: Vec<i64> = replies
                .by_ref()
                .take(index.len())
                .map(|reply| match reply.and_then(|value| Ok(i64::from_redis_value(value)?)) {
                    Ok(added) => added,
                    Err(err) => {
                        tracing::warn!(run_id, error = %err, "a new run's index entry was not written; rebuild_indexes repairs it");
                        0
                    }
                })
                .collect();
            added = added.and(Indexed::from_replies(&indexed));
            let created = replies
                .next()
                .unwrap_or_else(|| Err((::redis::ErrorKind::Parse, "no reply").into()));
            match created {
                Err(err)
                    if !loaded
                        && err.kind()
                            == ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoScript) =>
                {
                    // Sent again once the script is loaded: the entries are `NX`, the same.
                    if let Err(err) = CREATE_RUN.load_async(&mut con).await {
                        return (added, Err(err));
                    }
                    loaded = true;
                }
                other => {
                    return (
                        added,
                        other
                            .and_then(|value| Ok(u64::from_redis_value(value)?))
                            .map(|version| (version, None)),
                    );
                }
            }
        }
    }

    /// `reads` of a run's keys (the first the header's `HGETALL`), as they stood at one version
    /// of the run, without `MULTI`: a Redis out of memory refuses every command queued in a
    /// `MULTI`, reads too, and reads must not depend on writes. The reads go in one pipeline with
    /// the header's version read once more behind them: every change to a run's keys but its
    /// tasks raises the version in the same script, so the same version before and after means
    /// no transition came in between (a task swapped meanwhile changes the tasks hash alone,
    /// read by one command: as if it came before or after the read). A run that changed under
    /// the reads is read again; one that keeps changing, once in a `MULTI`.
    pub(super) async fn read_unchanging(
        &self,
        run_id: &str,
        keys: &super::keys::RunKeys,
        reads: ::redis::Pipeline,
    ) -> Result<Vec<Value>, Error> {
        let mut con = self.con.clone();
        for _ in 0..UNCHANGING_READS {
            let mut pipe = reads.clone();
            pipe.cmd("HGET").arg(keys.run()).arg("version");
            let mut replies: Vec<Value> = pipe
                .query_async(&mut con)
                .await
                .map_err(|err| script_error(err, run_id, 0))?;
            let after = replies.pop();
            let before = replies
                .first()
                .and_then(|header| hash_field(header, b"version"));
            if before == after.as_ref().and_then(bytes_of) {
                return Ok(replies);
            }
        }
        reads
            .clone()
            .atomic()
            .query_async(&mut con)
            .await
            .map_err(|err| script_error(err, run_id, 0))
    }

    /// A run read back under `--redis-wait-replicas`: the reads in a `MULTI`, then a write to
    /// the run's slot (`P:run:{R}:barrier`, expiring), then `WAIT`, all on one connection to one
    /// master. Replication is in order, so once replicas have the barrier they have everything
    /// the read saw; short of them, the read may show a transition that a failover will lose (a
    /// master cut off from its replicas still answers for a while), and it is refused rather than
    /// shown to a watcher or acted on.
    pub(super) async fn read_replicated<T: FromRedisValue>(
        &self,
        run_id: &str,
        keys: &super::keys::RunKeys,
        reads: ::redis::Pipeline,
    ) -> Result<T, Error> {
        let mut pipe = ::redis::pipe();
        pipe.cmd("MULTI");
        for read in reads.cmd_iter() {
            pipe.add_command(read.clone());
        }
        pipe.cmd("EXEC")
            .cmd("SET")
            .arg(keys.barrier())
            .arg(1)
            .arg("PX")
            .arg(BARRIER_TTL_MS);
        let (mut replies, acked) = self
            .send_waiting(pipe, None)
            .await
            .map_err(|err| script_error(err, run_id, 0))?;
        self.replicated(run_id, Some(acked))?;
        // MULTI, each read's QUEUED, EXEC's replies, the barrier's OK.
        let exec = replies.len().saturating_sub(2);
        FromRedisValue::from_redis_value(replies.swap_remove(exec))
            .map_err(|err| script_error(err.into(), run_id, 0))
    }

    /// Sends `pipe` and a `WAIT` behind it on one of the `writers`, loading `script` where Redis
    /// does not know it; returns every reply of `pipe` and how many replicas acknowledged.
    ///
    /// Every reply is looked at: on a cluster whose topology the client has not caught up with,
    /// the pipeline can reach a master that became a replica, which runs the reads, redirects the
    /// writes and refuses `WAIT`; nothing was written there, and the pipeline is sent again.
    pub(super) async fn send_waiting(
        &self,
        mut pipe: ::redis::Pipeline,
        script: Option<&Script>,
    ) -> Result<(Vec<Value>, u32), RedisError> {
        let wait = self.wait.expect("only called with --redis-wait-replicas");
        let turn = self
            .next_writer
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut con = self.writers[turn % self.writers.len()].clone();
        pipe.cmd("WAIT")
            .arg(wait.replicas)
            .arg(wait.timeout.as_millis().max(1) as u64)
            .ignore_errors();
        let mut loaded = false;
        let mut redirected = 0;
        loop {
            let replies: Vec<::redis::RedisResult<Value>> = pipe.query_async(&mut con).await?;
            // An error reply may also come as a value (`Value::ServerError`), at any depth.
            let replies: Vec<::redis::RedisResult<Value>> = replies
                .into_iter()
                .map(|reply| reply.and_then(Value::extract_error))
                .collect();
            let first_error = replies.iter().find_map(|reply| reply.as_ref().err());
            match first_error {
                Some(err)
                    if !loaded
                        && err.kind()
                            == ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoScript) =>
                {
                    if let Some(script) = script {
                        script.load_async(&mut con).await?;
                    }
                    loaded = true;
                }
                // The cluster client follows redirections of single commands, not of a pipeline;
                // the first error says nothing before it wrote, so sending it again is safe.
                Some(err) if redirected < PIPELINE_REDIRECTIONS && not_run_here(err) => {
                    redirected += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(50 * redirected)).await;
                }
                Some(err) => return Err(err.clone()),
                None => {
                    // Only a `WAIT` in the same pipeline as the write counts: one sent on its own
                    // could reach a connection made since (a reconnect, a replaced cluster
                    // client) that wrote nothing, and answer at once with the replicas connected.
                    let mut replies: Vec<Value> = replies.into_iter().flatten().collect();
                    let acked: u32 =
                        FromRedisValue::from_redis_value(replies.pop().unwrap_or(Value::Nil))?;
                    return Ok((replies, acked));
                }
            }
        }
    }

    /// A write's verdict under `--redis-wait-replicas`: short of the replicas asked for, it is
    /// not written as far as the caller knows.
    pub(super) fn replicated(&self, run_id: &str, acked: Option<u32>) -> Result<(), Error> {
        match (self.wait, acked) {
            (Some(wait), Some(acked)) if acked < wait.replicas => Err(Error::Unavailable(format!(
                "run {run_id}: {acked} of the {} replicas asked for had it within {} ms \
                 (--redis-wait-replicas); it may be lost if its master fails, so it is not \
                 acted on",
                wait.replicas,
                wait.timeout.as_millis()
            ))),
            _ => Ok(()),
        }
    }
}

/// How many times `load_run` reads a run that changed under its reads before it reads it in a
/// `MULTI`: on one server a pipeline's commands run back to back unless another client's
/// command comes between, so once is nearly always enough.
const UNCHANGING_READS: usize = 3;

/// The value of `field` in a hash reply (`HGETALL`), as bytes.
fn hash_field<'a>(hash: &'a Value, field: &[u8]) -> Option<&'a [u8]> {
    match hash {
        Value::Map(pairs) => pairs
            .iter()
            .find(|(name, _)| bytes_of(name) == Some(field))
            .and_then(|(_, value)| bytes_of(value)),
        Value::Array(items) => items
            .chunks(2)
            .find(|pair| pair.first().and_then(bytes_of) == Some(field))
            .and_then(|pair| pair.get(1).and_then(bytes_of)),
        _ => None,
    }
}

fn bytes_of(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.as_bytes()),
        _ => None,
    }
}

/// How long a read's replication barrier (`P:run:{R}:barrier`) is kept: long enough for its
/// `WAIT`, short enough that barriers of finished runs go by themselves.
const BARRIER_TTL_MS: u64 = 10_000;

/// How many times a waiting write is sent again after Redis answered that the script's slot is
/// elsewhere or not served right now.
const PIPELINE_REDIRECTIONS: u64 = 10;

/// Whether `err` says a command was not run because its slot is served elsewhere (`MOVED`,
/// `ASK`, or `READONLY` from a master that became a replica), is being migrated (`TRYAGAIN`) or
/// is not served at all right now (`CLUSTERDOWN`).
fn not_run_here(err: &RedisError) -> bool {
    use ::redis::ServerErrorKind::{Ask, ClusterDown, Moved, ReadOnly, TryAgain};
    matches!(
        err.kind(),
        ::redis::ErrorKind::Server(Moved | Ask | TryAgain | ClusterDown | ReadOnly)
    )
}
