//! A run's live output read back from its stream: `XRANGE` and `XREAD` replies as pieces.

use ::redis::Value;

use super::replies::corrupt;
use crate::store::{Error, OutputOffset, OutputPiece};

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
