//! Integrity: JSON hashed in canonical form (RFC 8785, JCS) with SHA-256, and the per-run state
//! chain.
//!
//! Two questions are answered here. "Is this the same JSON?" is [`canonical_sha256`]: a hash of
//! the value, not of its spelling, so key order, whitespace and number spelling (`1.0`, `1`,
//! `10e-1`) do not change it. "Is this the run that happened?" is the state chain: each
//! completed step folds its step id, visit and result hash into a running state
//! ([`next_state`]), starting from a [`genesis`] state that names the run, its workflow and its
//! input. A stored chain is checked link by link with [`verify_chain`], which names the first
//! link that no longer holds.
//!
//! # Numbers
//!
//! JCS writes every number as an IEEE-754 double, formatted as ECMAScript does. An integer of
//! magnitude beyond 2^53 therefore hashes as its nearest double: `9007199254740993` and
//! `9007199254740992` have the same canonical hash of the plain value. The state chain does not
//! hash plain values: it wraps data in [`ExactNumbers`], which writes such integers as marked
//! strings, so a changed digit of a 64-bit id changes a step's `result_sha256`.
//!
//! # The chain's byte encoding
//!
//! A link's state is the lowercase hex SHA-256 of
//!
//! ```text
//! field("baton.chain.v1") || field(previous) || field(step_id) || visit || field(result_sha256)
//! ```
//!
//! where `field(s)` is the length of `s`'s UTF-8 bytes as an 8-byte big-endian integer followed
//! by those bytes, and `visit` is the visit number as a 4-byte big-endian integer. Every field
//! is either of fixed width or preceded by its length, so the byte string can be split back
//! into its fields in exactly one way: no two different `(previous, step_id, visit,
//! result_sha256)` give the same bytes, whatever characters (a NUL included) a step id holds.
//! The leading tag versions the encoding. A genesis state hashes JCS text, which begins with
//! `{`, while a link's bytes begin with a zero length byte, so a genesis state and a link state
//! can never be hashes of the same bytes.

use std::io;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Versions the link encoding: a different encoding gets a different tag.
const CHAIN_TAG: &str = "baton.chain.v1";

/// Lowercase hex SHA-256 of the JCS (RFC 8785) canonical form of `value`.
///
/// The canonical bytes go straight into the hasher; the canonicaliser buffers only the members
/// of each object while it sorts them, so memory follows the largest object, not the document.
///
/// Numbers are hashed as IEEE-754 doubles (see the module doc): integers beyond 2^53 hash as
/// their nearest double.
pub fn canonical_sha256(value: &Value) -> String {
    // A `serde_json::Value` holds only finite numbers and string keys without duplicates, so
    // this never meets what `canonical_sha256_of` panics on.
    canonical_sha256_of(value)
}

/// [`canonical_sha256`] of anything serde can serialise, as the JSON it serialises to, without
/// building a `serde_json::Value` first.
///
/// A NaN or infinite float inside `value` hashes as `null`, which is how serde_json writes it
/// and what `serde_json::to_value` turns it into, so this agrees with `canonical_sha256` of
/// `to_value(value)`.
///
/// # Panics
///
/// When `value` has no JSON form JCS can write: its `Serialize` fails, it is itself a NaN or
/// infinite float, or it serialises a map key serde_json cannot write as a string, or the same
/// key twice. A `serde_json::Value` never does, nor does a derived struct whose fields are
/// strings, integers, floats, options, string-keyed maps, `Value`s or such structs.
pub fn canonical_sha256_of<T: serde::Serialize>(value: &T) -> String {
    let mut hasher = HashWriter(Sha256::new());
    // The hasher accepts every write, so an error can only come from the value itself.
    if let Err(error) = serde_json_canonicalizer::to_writer(value, &mut hasher) {
        panic!("value has no canonical JSON form: {error}");
    }
    hex_of(&hasher.0.finalize())
}

/// [`canonical_sha256_of`] an object whose members `write` gives one by one, in the order RFC
/// 8785 sorts them: the same bytes, but only the values go through the canonicalizer, which
/// otherwise buffers every member of an object and parses each key back to sort them (a step's
/// outcome is hashed at every step, and that was a tenth of what settling one cost: issue 20).
///
/// # Panics
///
/// As [`canonical_sha256_of`] for a value; and if the keys are not plain ASCII (no character
/// JSON escapes) given in ascending order.
pub fn canonical_object_sha256(
    write: impl FnOnce(&mut Members<'_>) -> serde_json::Result<()>,
) -> String {
    let mut hasher = HashWriter(Sha256::new());
    hasher.0.update(b"{");
    let mut members = Members {
        writer: &mut hasher,
        last: None,
    };
    if let Err(error) = write(&mut members) {
        panic!("value has no canonical JSON form: {error}");
    }
    hasher.0.update(b"}");
    hex_of(&hasher.0.finalize())
}

/// The members of an object being hashed by [`canonical_object_sha256`].
pub struct Members<'a> {
    writer: &'a mut HashWriter,
    last: Option<&'static str>,
}

impl Members<'_> {
    /// `"key":` and `value` in canonical JSON. Keys come in ascending order, as RFC 8785 sorts
    /// them (for ASCII keys, byte order).
    pub fn member<T: serde::Serialize>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> serde_json::Result<()> {
        assert!(
            key.bytes()
                .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\'),
            "a member key written as it is must need no escape: {key:?}"
        );
        if let Some(last) = self.last {
            assert!(
                last < key,
                "members out of canonical order: {last:?} before {key:?}"
            );
            self.writer.0.update(b",");
        }
        self.last = Some(key);
        self.writer.0.update(b"\"");
        self.writer.0.update(key.as_bytes());
        self.writer.0.update(b"\":");
        serde_json_canonicalizer::to_writer(value, &mut *self.writer)
    }
}

/// A JSON value as the state chain hashes it: integers that an IEEE-754 double cannot hold
/// exactly (beyond 2^53 either way) are written as marked strings (`"\u0000integer:<digits>"`),
/// so that changing a digit of a 64-bit id changes the hash. Everything else is as it is.
pub struct ExactNumbers<'a>(pub &'a Value);

impl serde::Serialize for ExactNumbers<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        const EXACT: u64 = 1 << 53;
        match self.0 {
            Value::Number(n)
                if n.as_u64().is_some_and(|v| v > EXACT)
                    || n.as_i64().is_some_and(|v| v.unsigned_abs() > EXACT) =>
            {
                serializer.serialize_str(&format!("\u{0}integer:{n}"))
            }
            Value::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(&ExactNumbers(item))?;
                }
                seq.end()
            }
            Value::Object(members) => {
                let mut map = serializer.serialize_map(Some(members.len()))?;
                for (key, member) in members {
                    map.serialize_entry(key, &ExactNumbers(member))?;
                }
                map.end()
            }
            other => other.serialize(serializer),
        }
    }
}

/// The chain's first state, which ties the chain to its run.
///
/// It is `canonical_sha256` of the object `{"run_id": run_id, "workflow_sha256": sha256 of the
/// workflow text's UTF-8 bytes, "input_sha256": canonical_sha256(input)}`. The workflow is hashed
/// as the text that was submitted (a reformatted workflow is a different workflow document); the
/// input is hashed as a value.
pub fn genesis(run_id: &str, workflow_text: &str, input: &Value) -> String {
    let workflow_sha256 = hex_of(&Sha256::digest(workflow_text.as_bytes()));
    genesis_of_digest(run_id, &workflow_sha256, input)
}

/// [`genesis`] for a workflow text whose SHA-256 (lowercase hex) the caller has already.
pub fn genesis_of_digest(run_id: &str, workflow_sha256: &str, input: &Value) -> String {
    // Member by member, in canonical order: building the object as a `Value` and sorting it
    // was 3% of what a short run cost the coordinator (issue 20, W3).
    let input_sha256 = canonical_sha256(input);
    canonical_object_sha256(|members| {
        members.member("input_sha256", &input_sha256)?;
        members.member("run_id", &run_id)?;
        members.member("workflow_sha256", &workflow_sha256)
    })
}

/// The state after a step's visit completes with the result whose canonical hash is
/// `result_sha256`, given the `previous` state; the bytes hashed are described in the module
/// doc.
pub fn next_state(previous: &str, step_id: &str, visit: u32, result_sha256: &str) -> String {
    let mut hasher = Sha256::new();
    for field in [CHAIN_TAG, previous, step_id] {
        hash_field(&mut hasher, field);
    }
    hasher.update(visit.to_be_bytes());
    hash_field(&mut hasher, result_sha256);
    hex_of(&hasher.finalize())
}

/// One link of a run's chain, as stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChainLink {
    pub step_id: String,
    /// Which entry into the step this was, as the engine counts visits.
    pub visit: u32,
    /// `canonical_sha256` of the step's result.
    pub result_sha256: String,
    /// The chain's state after this link: `next_state` of the previous link's state (or
    /// genesis) and the fields above.
    pub state_sha256: String,
}

impl ChainLink {
    /// The link that follows the state `previous`.
    pub fn after(previous: &str, step_id: &str, visit: u32, result_sha256: String) -> ChainLink {
        ChainLink {
            state_sha256: next_state(previous, step_id, visit, &result_sha256),
            step_id: step_id.to_owned(),
            visit,
            result_sha256,
        }
    }
}

/// Where a stored chain stops holding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    /// A link's stored state is not what its fields and the state before it give: the link, or
    /// the result hash it records, was changed after it was written.
    #[error(
        "link {index} (step \"{step_id}\" visit {visit}): state is {stored}, recomputed {recomputed}"
    )]
    BrokenLink {
        /// Position of the link in the chain, from 0.
        index: usize,
        step_id: String,
        visit: u32,
        stored: String,
        recomputed: String,
    },
    /// Every link holds, but the run record claims a different head: links were added or
    /// dropped after the head was written, or the head itself was changed.
    #[error("run head is {head}, but the chain of {links} links ends at {chain_end}")]
    HeadMismatch {
        /// The state the run record claims.
        head: String,
        /// The last link's state, or genesis when there are no links.
        chain_end: String,
        links: usize,
    },
}

/// Recomputes each link's state from `genesis` and checks that the chain ends at `head`.
///
/// `head` is the state the run record claims: the last link's state, or `genesis` when there
/// are no links. The first link whose stored state differs from the recomputed one is named;
/// links after it are not looked at, since every later state depends on it.
pub fn verify_chain(genesis: &str, links: &[ChainLink], head: &str) -> Result<(), ChainError> {
    let mut state = genesis;
    for (index, link) in links.iter().enumerate() {
        let recomputed = next_state(state, &link.step_id, link.visit, &link.result_sha256);
        if recomputed != link.state_sha256 {
            return Err(ChainError::BrokenLink {
                index,
                step_id: link.step_id.clone(),
                visit: link.visit,
                stored: link.state_sha256.clone(),
                recomputed,
            });
        }
        state = &link.state_sha256;
    }
    if state != head {
        return Err(ChainError::HeadMismatch {
            head: head.to_owned(),
            chain_end: state.to_owned(),
            links: links.len(),
        });
    }
    Ok(())
}

/// A digest in lowercase hex. Into a buffer at once: `hex::encode` collects a String char by
/// char, which showed in profiles of every step (issue 20).
fn hex_of(digest: &[u8]) -> String {
    let mut hex = vec![0; digest.len() * 2];
    hex::encode_to_slice(digest, &mut hex).expect("twice as many hex digits as bytes");
    String::from_utf8(hex).expect("hex digits are ASCII")
}

/// Feeds `field` to the hasher preceded by its byte length, so fields cannot run into each
/// other.
fn hash_field(hasher: &mut Sha256, field: &str) {
    hasher.update((field.len() as u64).to_be_bytes());
    hasher.update(field.as_bytes());
}

/// Lets the JCS serialiser write into the hasher: sha2 0.11 no longer implements `io::Write`.
struct HashWriter(Sha256);

impl io::Write for HashWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
