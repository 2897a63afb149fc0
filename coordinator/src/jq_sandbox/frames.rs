//! The sandbox protocol: length-prefixed frames on the process's stdin and stdout.
//!
//! A request is two frames: a JSON header ([`Request`]) and the document as JSON text. A reply
//! is one frame whose first byte says `O` (the output's JSON text follows) or `E` (the error
//! that fails the step follows), then the CPU time the program used, in microseconds (8 bytes,
//! little-endian), then that text. The pool and its sandboxes are one binary, so both ends
//! always speak the same version.

use std::io::{self, Read, Write};

use baton_core::eval::JqOutputLimits;
use serde::{Deserialize, Serialize};

/// The largest frame either side accepts: far above any document a coordinator admits.
pub const MAX_FRAME_BYTES: usize = 1 << 30;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    pub program: String,
    pub cpu_ms: u64,
    pub output: JqOutputLimits,
}

pub fn write_frame(out: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    let length = u32::try_from(bytes.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    out.write_all(&length.to_le_bytes())?;
    out.write_all(bytes)
}

/// The next frame, or `None` at a clean end of the stream.
pub fn read_frame(input: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut length = [0u8; 4];
    match input.read_exact(&mut length) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(error) => return Err(error),
    }
    let length = u32::from_le_bytes(length) as usize;
    if length > MAX_FRAME_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {length} bytes; the limit is {MAX_FRAME_BYTES}"),
        ));
    }
    let mut bytes = vec![0; length];
    input.read_exact(&mut bytes)?;
    Ok(Some(bytes))
}

/// A reply frame's payload: the output or the error, and the CPU time the program used.
pub fn reply(result: &Result<String, String>, cpu_us: u64) -> Vec<u8> {
    let (tag, text) = match result {
        Ok(output) => (b'O', output),
        Err(error) => (b'E', error),
    };
    let mut bytes = Vec::with_capacity(text.len() + 9);
    bytes.push(tag);
    bytes.extend_from_slice(&cpu_us.to_le_bytes());
    bytes.extend_from_slice(text.as_bytes());
    bytes
}

/// What a reply frame says, and the CPU time (microseconds) the program used.
pub fn read_reply(bytes: &[u8]) -> (Result<String, String>, u64) {
    let malformed = || (Err("the jq sandbox sent a malformed reply".to_owned()), 0);
    let Some((&tag, rest)) = bytes.split_first() else {
        return malformed();
    };
    let Some((cpu, text)) = rest.split_first_chunk::<8>() else {
        return malformed();
    };
    let cpu_us = u64::from_le_bytes(*cpu);
    let text = String::from_utf8_lossy(text).into_owned();
    match tag {
        b'O' => (Ok(text), cpu_us),
        b'E' => (Err(text), cpu_us),
        _ => malformed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_a_clean_end_is_none() {
        let mut wire = Vec::new();
        write_frame(&mut wire, b"hello").unwrap();
        write_frame(&mut wire, b"").unwrap();
        let mut input = wire.as_slice();
        assert_eq!(read_frame(&mut input).unwrap(), Some(b"hello".to_vec()));
        assert_eq!(read_frame(&mut input).unwrap(), Some(Vec::new()));
        assert_eq!(read_frame(&mut input).unwrap(), None);
    }

    #[test]
    fn an_oversized_length_is_refused_before_allocating() {
        let wire = u32::MAX.to_le_bytes();
        let error = read_frame(&mut wire.as_slice()).unwrap_err();
        assert!(error.to_string().contains("the limit is"), "{error}");
    }

    #[test]
    fn replies_carry_output_or_error_and_the_cpu_time() {
        assert_eq!(
            read_reply(&reply(&Ok("[1]".into()), 7)),
            (Ok("[1]".into()), 7)
        );
        assert_eq!(
            read_reply(&reply(&Err("boom".into()), 1 << 40)),
            (Err("boom".into()), 1 << 40)
        );
        assert!(read_reply(b"").0.is_err());
        assert!(read_reply(b"O123").0.is_err(), "too short for its CPU time");
    }
}
