//! Baton's gRPC contract, `baton.v1`, as generated Rust.
//!
//! - [`v1`]: messages, clients and servers.
//! - [`FILE_DESCRIPTOR_SET`]: for gRPC server reflection.
//! - [`Json`] helpers: wrap bytes with their SHA-256 and check it on arrival.
//! - [`trace_context`]: W3C `traceparent`, as requests and tasks carry it.
//! - [`connection`]: how clients and workers reach a coordinator: TLS, client certificates,
//!   bearer tokens.
//! - [`diagnose`]: why a connection failed (TLS against plaintext, an unknown CA, a name the
//!   certificate lacks, a client certificate missing), found by a probe after the failure.

pub mod v1 {
    tonic::include_proto!("baton.v1");
}

pub mod connection;
pub mod diagnose;
pub mod trace_context;

pub use v1::Json;

/// The version of the worker stream's protocol, sent in `Hello.protocol`. 2: payloads by
/// reference (a manifest and parts), `ResendTask` and `ResetPartCache`. 3: the manifest names
/// the message history and carries the handoff record; results may carry notes. 4: attempts
/// (fencing tokens) in task ids, `Hello.held`, `Goodbye`, non-retryable errors. 5: live output
/// (`TaskOutput`) and the tokens a result used (`TaskResult.usage`). 6: a map item's manifest
/// carries the item (`map`); item tasks go only to workers of protocol 6 or later. 7: the
/// manifest carries small parts inline (`baton_core::payload::INLINE_MARK`). 8: the worker keeps
/// its recent tasks' context listings, and a manifest gives the context as a change to one of
/// them (`baton_core::payload::ListingChange`); a worker of protocol 7 gets it listed whole.
pub const WORKER_PROTOCOL: u32 = 8;

/// The oldest worker protocol that keeps context listings ([`WORKER_PROTOCOL`], 8).
pub const LISTING_PROTOCOL: u32 = 8;

/// The oldest worker protocol that can run a map item: an older worker would ignore the
/// manifest's `map` and run the item without it.
pub const MAP_ITEMS_PROTOCOL: u32 = 6;

/// The oldest worker protocol a coordinator of this version accepts: its own and the one
/// before. A rolling upgrade therefore goes coordinators first, then workers: while it rolls,
/// old workers are served by new coordinators, and a new worker that reaches an old coordinator
/// is refused (`FAILED_PRECONDITION`) and tries again until a new one answers. A change to the
/// worker protocol keeps that promise: a coordinator still serves a worker of the protocol
/// before, which never sends the new messages and ignores fields it does not know.
pub const OLDEST_WORKER_PROTOCOL: u32 = WORKER_PROTOCOL - 1;

/// Whether a coordinator of this version serves a worker speaking `protocol`.
pub fn serves_worker_protocol(protocol: u32) -> bool {
    (OLDEST_WORKER_PROTOCOL..=WORKER_PROTOCOL).contains(&protocol)
}

/// The encoded descriptors of `baton.v1`, served by reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("baton_descriptor");

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    // Into a buffer at once: `hex::encode` collects a String char by char, which showed in
    // profiles of every step (issue 20).
    let mut hex = [0u8; 64];
    hex::encode_to_slice(sha2::Sha256::digest(bytes), &mut hex).expect("64 hex digits");
    String::from_utf8(hex.to_vec()).expect("hex digits are ASCII")
}

impl Json {
    /// Wraps JSON bytes with their digest.
    pub fn new(json: impl Into<bytes::Bytes>) -> Self {
        let json = json.into();
        let sha256 = sha256_hex(&json);
        Self { json, sha256 }
    }

    /// Flips the bits of `mask` in byte `at`, keeping the digest: corrupted bytes, for fault
    /// injection and tests. The bytes may be shared, so they are copied first.
    pub fn flip(&mut self, at: usize, mask: u8) {
        let mut bytes = self.json.to_vec();
        bytes[at] ^= mask;
        self.json = bytes.into();
    }

    /// The bytes, if they match their digest.
    pub fn verified(&self) -> Result<&[u8], DigestMismatch> {
        let actual = sha256_hex(&self.json);
        if actual == self.sha256 {
            Ok(&self.json)
        } else {
            Err(DigestMismatch {
                expected: self.sha256.clone(),
                actual,
            })
        }
    }
}

/// JSON bytes that do not match the SHA-256 sent with them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestMismatch {
    pub expected: String,
    pub actual: String,
}

impl std::fmt::Display for DigestMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "JSON bytes have SHA-256 {} but were sent with {}",
            self.actual, self.expected
        )
    }
}

impl std::error::Error for DigestMismatch {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_byte_is_caught() {
        let mut json = Json::new(br#"{"plan":1}"#.to_vec());
        assert_eq!(json.verified(), Ok(&br#"{"plan":1}"#[..]));
        json.flip(9, b'1' ^ b'2');
        assert!(json.verified().is_err());
    }
}
