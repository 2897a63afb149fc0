//! Integer literals that fit in no 64-bit integer, found in JSON text so that they can be
//! refused rather than changed.
//!
//! serde_json (without `arbitrary_precision`, which Baton does not turn on: it would change every
//! number it reads) reads an integer that fits neither `i64` nor `u64` as the nearest `f64`:
//! an id of 123456789012345678901234567890 becomes 1.2345678901234568e29, silently, before any
//! visitor can tell the two apart. Every later reader (the engine, jq, agents, the state
//! chain) would see the changed number. So whoever takes JSON from outside (a workflow, a
//! run's input, an agent's result) asks [`first_big_integer`], and refuses the text naming the
//! literal's JSON path; such a number travels as a string. Floats with a fraction or an
//! exponent are not integers and are read as floats, as their writer meant.
//!
//! The scan is a small state machine over the bytes: strings and comments skipped, a stack of
//! the objects and arrays it is in (byte ranges of keys, indexes of items), and each number
//! literal checked. It never allocates until it finds one, and it takes any text (text that is
//! not JSON yields whatever it yields, and never panics), so it is fuzzed as is.

use serde_json::Value;

use crate::text::is_unprintable;

/// An integer literal of the text that no 64-bit integer holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BigInteger<'t> {
    /// Where it is, as a JSON path: `$.order.ids[2]`, `$["odd key"]`, `$` for the whole text.
    pub path: String,
    /// The literal as written.
    pub literal: &'t str,
}

impl BigInteger<'_> {
    /// What is wrong with it, for a message that names where it is: `integer 123...890 is
    /// beyond 64 bits, which JSON readers round to a float; write it as a string
    /// ("123...890")`.
    pub fn problem(&self) -> String {
        let suggestion = if self.literal.len() <= SHOWN_DIGITS {
            format!(" (\"{}\")", self.literal)
        } else {
            String::new()
        };
        format!(
            "integer {} is beyond 64 bits, which JSON readers round to a float; write it as a \
             string{suggestion}",
            shown(self.literal)
        )
    }
}

/// The first integer literal in `text` that fits in no 64-bit integer, if `value` (`text` as
/// serde_json read it) may hold one: serde_json reads such a literal as a float, so a value
/// with no float holds none, and most data is not scanned at all.
pub fn first_big_integer<'t>(text: &'t [u8], value: &Value) -> Option<BigInteger<'t>> {
    if !holds_float(value) {
        return None;
    }
    big_integers(text).next()
}

/// Every integer literal in `text` (JSON, with `//` and `/* */` comments allowed) that fits in
/// no 64-bit integer, in the order they are written.
pub fn big_integers(text: &[u8]) -> BigIntegers<'_> {
    BigIntegers {
        text,
        at: 0,
        stack: Vec::new(),
    }
}

/// Whether any number in `value` is a float.
pub fn holds_float(value: &Value) -> bool {
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::Number(number) if number.is_f64() => return true,
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => stack.extend(fields.values()),
            _ => {}
        }
    }
    false
}

/// The scan of [`big_integers`]: where it is, and the objects and arrays it is in.
pub struct BigIntegers<'t> {
    text: &'t [u8],
    at: usize,
    stack: Vec<Frame>,
}

/// An object or array the scan is in.
#[derive(Debug, Clone, Copy)]
enum Frame {
    /// `key`: the byte range of the current member's key, quotes included, once read;
    /// `awaiting_key`: a string read now is a key.
    Object {
        key: Option<(usize, usize)>,
        awaiting_key: bool,
    },
    Array {
        index: usize,
    },
}

impl<'t> Iterator for BigIntegers<'t> {
    type Item = BigInteger<'t>;

    fn next(&mut self) -> Option<BigInteger<'t>> {
        let text = self.text;
        while self.at < text.len() {
            let start = self.at;
            match text[start] {
                b'"' => {
                    let end = string_end(text, start);
                    if let Some(Frame::Object {
                        key,
                        awaiting_key: awaiting @ true,
                    }) = self.stack.last_mut()
                    {
                        *key = Some((start, end));
                        *awaiting = false;
                    }
                    self.at = end;
                }
                b'/' if text.get(start + 1) == Some(&b'/') => {
                    self.at = text[start..]
                        .iter()
                        .position(|&b| b == b'\n')
                        .map_or(text.len(), |n| start + n + 1);
                }
                b'/' if text.get(start + 1) == Some(&b'*') => {
                    self.at = text[start + 2..]
                        .windows(2)
                        .position(|pair| pair == b"*/")
                        .map_or(text.len(), |n| start + 2 + n + 2);
                }
                b'{' => {
                    self.stack.push(Frame::Object {
                        key: None,
                        awaiting_key: true,
                    });
                    self.at += 1;
                }
                b'[' => {
                    self.stack.push(Frame::Array { index: 0 });
                    self.at += 1;
                }
                b'}' | b']' => {
                    self.stack.pop();
                    self.at += 1;
                }
                b',' => {
                    match self.stack.last_mut() {
                        Some(Frame::Object { key, awaiting_key }) => {
                            *key = None;
                            *awaiting_key = true;
                        }
                        Some(Frame::Array { index }) => *index += 1,
                        None => {}
                    }
                    self.at += 1;
                }
                b'-' | b'0'..=b'9' => {
                    let end = text[start..]
                        .iter()
                        .position(|b| !matches!(b, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'))
                        .map_or(text.len(), |n| start + n);
                    self.at = end;
                    // Only digits (after an optional minus) are ASCII, so this is UTF-8.
                    let literal = std::str::from_utf8(&text[start..end]).unwrap_or_default();
                    if beyond_64_bits(literal) {
                        return Some(BigInteger {
                            path: self.path(),
                            literal,
                        });
                    }
                }
                _ => self.at += 1,
            }
        }
        None
    }
}

impl BigIntegers<'_> {
    /// The JSON path of the value the scan is at.
    fn path(&self) -> String {
        let mut path = String::from("$");
        for frame in &self.stack {
            match *frame {
                Frame::Array { index } => path.push_str(&format!("[{index}]")),
                Frame::Object {
                    key: Some((start, end)),
                    ..
                } => push_key(&mut path, &self.text[start..end]),
                // A value where a key should be: text that is not JSON.
                Frame::Object { key: None, .. } => path.push_str("[?]"),
            }
        }
        path
    }
}

/// Whether `literal` is an integer (digits, an optional minus, no fraction or exponent) that
/// neither `i64` nor `u64` holds.
fn beyond_64_bits(literal: &str) -> bool {
    let digits = literal.strip_prefix('-').unwrap_or(literal);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    if literal.starts_with('-') {
        literal.parse::<i64>().is_err()
    } else {
        literal.parse::<u64>().is_err()
    }
}

/// The byte after the string that starts at `start` (its closing quote's next), or the end of
/// the text if it never closes.
fn string_end(text: &[u8], start: usize) -> usize {
    let mut at = start + 1;
    while at < text.len() {
        match text[at] {
            b'\\' => at += 2,
            b'"' => return at + 1,
            _ => at += 1,
        }
    }
    text.len()
}

/// Appends `.key`, or `["key"]` when the key is not a plain word (or is not JSON at all).
fn push_key(path: &mut String, quoted: &[u8]) {
    let key: Option<String> = std::str::from_utf8(quoted)
        .ok()
        .and_then(|quoted| serde_json::from_str(quoted).ok());
    match key {
        Some(key)
            if !key.is_empty()
                && !key.starts_with(|c: char| c.is_ascii_digit())
                && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
        {
            path.push('.');
            path.push_str(&key);
        }
        Some(key) => {
            path.push('[');
            push_printable(path, &Value::String(key).to_string());
            path.push(']');
        }
        None => {
            path.push('[');
            push_printable(path, &String::from_utf8_lossy(quoted));
            path.push(']');
        }
    }
}

/// Appends `text` with what a terminal would act on escaped (`\u202e`): a key can hold
/// anything, and a path ends up in messages people read.
fn push_printable(path: &mut String, text: &str) {
    for c in text.chars() {
        if is_unprintable(c) {
            path.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            path.push(c);
        }
    }
}

/// How long a literal a message shows whole.
const SHOWN_DIGITS: usize = 40;

/// A literal as a message shows it: whole up to [`SHOWN_DIGITS`], else its first 20
/// characters, an ellipsis and how long it is.
fn shown(literal: &str) -> String {
    if literal.len() <= SHOWN_DIGITS {
        return literal.to_owned();
    }
    // Digits and a minus only: any byte is a character boundary.
    format!("{}... ({} characters)", &literal[..20], literal.len())
}

#[cfg(test)]
mod tests;
