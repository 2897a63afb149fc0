//! [`LiveOutput`] on Redis: a run's live output in its stream, appended by a script that
//! checks the run runs, read with `XRANGE`, waited for with `XREAD` (polled on a cluster), and
//! the replies read back as pieces.

use baton_core::RunId;
use std::collections::HashMap;

use ::redis::Value;

use super::replies::{corrupt, unavailable};
use super::scripts::APPEND_OUTPUT;
use super::{BLOCKING_RESPONSE_TIMEOUT, CLUSTER_OUTPUT_POLL, RedisStore};
use crate::store::{Error, LiveOutput, OUTPUT_MAX_BYTES, OutputOffset, OutputPiece};

impl LiveOutput for RedisStore {
    async fn append_output(&self, pieces: Vec<(RunId, OutputPiece)>) -> Result<(), Error> {
        // One script call per run's consecutive pieces: each run's stay in order.
        let mut by_run: Vec<(RunId, Vec<OutputPiece>)> = Vec::new();
        for (run_id, piece) in pieces {
            match by_run.last_mut() {
                Some((last, run_pieces)) if *last == run_id => run_pieces.push(piece),
                _ => by_run.push((run_id, vec![piece])),
            }
        }
        let mut con = self.con.clone();
        for (run_id, pieces) in &by_run {
            let keys = self.run_keys(run_id);
            let mut invocation = APPEND_OUTPUT.prepare_invoke();
            invocation
                .key(keys.run())
                .key(keys.output())
                .arg(OUTPUT_MAX_BYTES);
            for piece in pieces {
                invocation
                    .arg(piece.step_id.as_str())
                    .arg(piece.visit)
                    .arg(piece.attempt)
                    .arg(piece.text.as_str())
                    .arg(if piece.restart { "1" } else { "0" })
                    .arg(piece.worker_id.as_deref().unwrap_or_default());
            }
            let _appended: u64 = invocation
                .invoke_async(&mut con)
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }

    async fn read_output(
        &self,
        run_id: &str,
        after: Option<OutputOffset>,
    ) -> Result<Vec<(OutputOffset, OutputPiece)>, Error> {
        self.read_retrying(|| async {
            let start = match after {
                Some(offset) => format!("({offset}"),
                None => "-".to_owned(),
            };
            let mut con = self.con.clone();
            let reply: Value = ::redis::cmd("XRANGE")
                .arg(self.run_keys(run_id).output())
                .arg(start)
                .arg("+")
                .query_async(&mut con)
                .await
                .map_err(unavailable)?;
            read_entries(run_id, reply)
        })
        .await
    }

    async fn wait_output(
        &self,
        after: Vec<(String, OutputOffset)>,
        block: std::time::Duration,
    ) -> Result<Vec<(String, OutputOffset, OutputPiece)>, Error> {
        if after.is_empty() {
            tokio::time::sleep(block).await;
            return Ok(Vec::new());
        }
        let block = block.min(BLOCKING_RESPONSE_TIMEOUT / 2);
        let by_key: HashMap<String, &str> = after
            .iter()
            .map(|(run_id, _)| (self.run_keys(run_id).output().to_owned(), run_id.as_str()))
            .collect();
        let lookup = |key: &str| by_key.get(key).map(|run_id| run_id.to_string());
        if self.con.is_cluster() {
            // The runs' streams are on many slots, and a blocking read would hold a node's one
            // connection: read each stream without blocking, every CLUSTER_OUTPUT_POLL.
            let deadline = tokio::time::Instant::now() + block;
            loop {
                let reads = after
                    .iter()
                    .map(|(run_id, offset)| {
                        let mut cmd = ::redis::cmd("XREAD");
                        cmd.arg("STREAMS")
                            .arg(self.run_keys(run_id).output())
                            .arg(offset.to_string());
                        cmd
                    })
                    .collect();
                let replies: Vec<Value> = self.con.each(reads).await.map_err(unavailable)?;
                let mut pieces = Vec::new();
                for reply in replies {
                    pieces.extend(read_streams(reply, lookup)?);
                }
                if !pieces.is_empty() || tokio::time::Instant::now() >= deadline {
                    return Ok(pieces);
                }
                tokio::time::sleep_until(
                    deadline.min(tokio::time::Instant::now() + CLUSTER_OUTPUT_POLL),
                )
                .await;
            }
        }
        let mut command = ::redis::cmd("XREAD");
        command
            .arg("BLOCK")
            .arg(block.as_millis().max(1) as u64)
            .arg("STREAMS");
        for (run_id, _) in &after {
            command.arg(self.run_keys(run_id).output());
        }
        for (_, offset) in &after {
            command.arg(offset.to_string());
        }
        let mut con = self.blocking.clone();
        let reply: Value = command.query_async(&mut con).await.map_err(unavailable)?;
        read_streams(reply, lookup)
    }
}

/// The entries of one stream (`XRANGE`'s reply, or one stream of `XREAD`'s).
pub(super) fn read_entries(
    run_id: &str,
    reply: Value,
) -> Result<Vec<(OutputOffset, OutputPiece)>, Error> {
    let entries = match reply {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(entries) => entries,
        other => return Err(corrupt(run_id, format!("output: unexpected {other:?}"))),
    };
    entries
        .into_iter()
        .map(|entry| read_entry(run_id, entry))
        .collect()
}

/// `XREAD`'s reply: pieces by stream, each stream named back to its run by `run_of`.
pub(super) fn read_streams(
    reply: Value,
    run_of: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, OutputOffset, OutputPiece)>, Error> {
    let streams: Vec<(Value, Value)> = match reply {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(streams) => streams
            .into_iter()
            .map(|stream| match stream {
                Value::Array(mut pair) if pair.len() == 2 => {
                    let entries = pair.pop().expect("two");
                    Ok((pair.pop().expect("two"), entries))
                }
                other => Err(other),
            })
            .collect::<Result<_, _>>()
            .map_err(|other| Error::Corrupt(format!("output: unexpected {other:?}")))?,
        Value::Map(streams) => streams,
        other => return Err(Error::Corrupt(format!("output: unexpected {other:?}"))),
    };
    let mut pieces = Vec::new();
    for (key, entries) in streams {
        let key = text(key).ok_or_else(|| Error::Corrupt("output: a stream name".into()))?;
        let Some(run_id) = run_of(&key) else {
            continue;
        };
        for (offset, piece) in read_entries(&run_id, entries)? {
            pieces.push((run_id.clone(), offset, piece));
        }
    }
    Ok(pieces)
}

/// One entry: `[id, [field, value, ...]]` with the fields `append_output.lua` writes.
fn read_entry(run_id: &str, entry: Value) -> Result<(OutputOffset, OutputPiece), Error> {
    let bad = |what: &str| corrupt(run_id, format!("output entry: {what}"));
    let Value::Array(mut parts) = entry else {
        return Err(bad("not an array"));
    };
    if parts.len() != 2 {
        return Err(bad("not [id, fields]"));
    }
    let fields = parts.pop().expect("two");
    let id = text(parts.pop().expect("two")).ok_or_else(|| bad("its id"))?;
    let offset: OutputOffset = id.parse().map_err(|e: String| bad(&e))?;
    let Value::Array(fields) = fields else {
        return Err(bad("its fields"));
    };
    let mut piece = OutputPiece {
        step_id: String::new(),
        visit: 0,
        attempt: 0,
        text: String::new(),
        restart: false,
        worker_id: None,
    };
    let mut fields = fields.into_iter();
    while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
        let name = text(name).ok_or_else(|| bad("a field name"))?;
        let value = text(value).ok_or_else(|| bad("a field value"))?;
        match name.as_str() {
            "s" => piece.step_id = value,
            "v" => piece.visit = value.parse().map_err(|_| bad("its visit"))?,
            "a" => piece.attempt = value.parse().map_err(|_| bad("its attempt"))?,
            "t" => piece.text = value,
            "r" => piece.restart = value == "1",
            // Absent from pieces an older coordinator wrote.
            "w" if !value.is_empty() => piece.worker_id = Some(value.into()),
            _ => {}
        }
    }
    Ok((offset, piece))
}

fn text(value: Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
        Value::SimpleString(text) => Some(text),
        _ => None,
    }
}
