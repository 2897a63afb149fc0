//! JSON and text drawn from [`Unstructured`] data: what these targets and those of the other
//! crates build their structured inputs from.

use arbitrary::Unstructured;
use serde_json::{Map, Number, Value};

/// A JSON value drawn from `u`, nesting at most `depth` levels below it.
pub fn json_value(u: &mut Unstructured, depth: u32) -> arbitrary::Result<Value> {
    let kinds = if depth == 0 { 5 } else { 7 };
    Ok(match u.choose_index(kinds)? {
        0 => Value::Null,
        1 => Value::Bool(u.arbitrary()?),
        2 => {
            if u.arbitrary()? {
                Value::from(u.arbitrary::<i64>()?)
            } else {
                Value::from(u.arbitrary::<u64>()?)
            }
        }
        3 => Number::from_f64(u.arbitrary()?).map_or(Value::Null, Value::Number),
        4 => Value::String(string(u, 24)?),
        5 => {
            let len = u.int_in_range(0..=4)?;
            Value::Array(
                (0..len)
                    .map(|_| json_value(u, depth - 1))
                    .collect::<arbitrary::Result<_>>()?,
            )
        }
        _ => {
            let mut object = Map::new();
            for _ in 0..u.int_in_range(0..=4)? {
                object.insert(string(u, 12)?, json_value(u, depth - 1)?);
            }
            Value::Object(object)
        }
    })
}

/// A string drawn from `u`, at most `max_chars` characters long.
pub fn string(u: &mut Unstructured, max_chars: usize) -> arbitrary::Result<String> {
    let text: String = u.arbitrary()?;
    Ok(text.chars().take(max_chars).collect())
}
