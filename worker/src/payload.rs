//! The payload an agent receives, rebuilt on the worker from a task's manifest and parts.
//!
//! A task names its payload's parts by SHA-256 and carries the bytes of only those this worker
//! does not hold ([`baton_core::payload::Manifest`]). The worker checks every part it is sent
//! against its digest, keeps recent parts in a bounded [`PartCache`], and splices the payload
//! together only when the agent first asks for it: an agent that reads the bytes (a `command`
//! agent writing them to stdin) never pays for parsing, and one that reads nothing pays for
//! nothing.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use baton_core::BlobLru;
use baton_core::payload::{Manifest, MissingPart, assemble};
use baton_proto::{DigestMismatch, Json};
use bytes::Bytes;
use serde_json::Value;

/// `{input, <reference>, context, error}`, as the spec describes; cheap to clone.
#[derive(Clone)]
pub struct Payload(Arc<Inner>);

struct Inner {
    /// The manifest and every part it names, when built from a task.
    parts: Option<(Manifest, HashMap<String, Bytes>)>,
    bytes: OnceLock<Vec<u8>>,
    value: OnceLock<Value>,
}

impl Payload {
    /// A payload that is already a JSON value (for tests and callers outside a worker).
    pub fn from_value(value: Value) -> Self {
        Self(Arc::new(Inner {
            parts: None,
            bytes: OnceLock::new(),
            value: OnceLock::from(value),
        }))
    }

    /// The payload's JSON, exactly as the coordinator's engine wrote it.
    pub fn bytes(&self) -> &[u8] {
        self.0.bytes.get_or_init(|| match &self.0.parts {
            Some((manifest, parts)) => {
                assemble(manifest, |digest| parts.get(digest).map(|b| &b[..]))
                    .expect("every part was resolved when the task arrived")
            }
            None => serde_json::to_vec(self.value()).expect("a JSON value serialises"),
        })
    }

    /// The payload as a JSON value, parsed on first use.
    ///
    /// Panics if it cannot be parsed, which the coordinator prevents for inputs and agent
    /// results (it refuses data nested deeper than parsers accept) but not for a transform that
    /// builds deeper data; [`Payload::try_value`] does not panic. In an SDK handler a panic
    /// fails the step.
    pub fn value(&self) -> &Value {
        self.try_value().unwrap_or_else(|error| panic!("{error}"))
    }

    fn part_count(&self) -> usize {
        self.0.parts.as_ref().map_or(0, |(_, parts)| parts.len())
    }

    /// The payload as a JSON value, parsed on first use, or why it cannot be.
    pub fn try_value(&self) -> Result<&Value, String> {
        if let Some(value) = self.0.value.get() {
            return Ok(value);
        }
        let value: Value = serde_json::from_slice(self.bytes())
            .map_err(|e| format!("the payload cannot be parsed: {e}"))?;
        Ok(self.0.value.get_or_init(|| value))
    }
}

impl std::ops::Index<&str> for Payload {
    type Output = Value;

    fn index(&self, key: &str) -> &Value {
        &self.value()[key]
    }
}

impl PartialEq<Value> for Payload {
    fn eq(&self, other: &Value) -> bool {
        self.value() == other
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.value.get() {
            Some(value) => write!(f, "Payload({value})"),
            None => write!(f, "Payload(<{} parts, not yet read>)", self.part_count()),
        }
    }
}

/// Why a task's payload could not be rebuilt. Any of these means this worker and the
/// coordinator no longer agree on what the worker holds, so the worker starts a new stream.
#[derive(Debug, thiserror::Error)]
pub enum PayloadError {
    #[error("the task carries no manifest")]
    NoManifest,
    #[error("the manifest is corrupt: {0}")]
    CorruptManifest(DigestMismatch),
    #[error("the manifest is not valid: {0}")]
    BadManifest(serde_json::Error),
    #[error("a payload part is corrupt: {0}")]
    CorruptPart(DigestMismatch),
    #[error(transparent)]
    Missing(#[from] MissingPart),
}

/// The parts this worker holds between the tasks of one stream, within a byte budget. Its
/// policy ([`BlobLru`]) is the one the coordinator mirrors; both start empty with the stream.
pub struct PartCache {
    lru: BlobLru,
    held: HashMap<String, Bytes>,
}

impl PartCache {
    pub fn new(budget: u64) -> Self {
        Self {
            lru: BlobLru::new(budget),
            held: HashMap::new(),
        }
    }

    /// Bytes held.
    pub fn used(&self) -> u64 {
        self.lru.used()
    }

    /// Checks a task's manifest and parts, resolves every part it names from the task or the
    /// cache, and then touches them in manifest order, as the coordinator did when it sent the
    /// task.
    pub fn receive(
        &mut self,
        manifest: Option<Json>,
        parts: Vec<Json>,
    ) -> Result<Payload, PayloadError> {
        let manifest = manifest.ok_or(PayloadError::NoManifest)?;
        let manifest: Manifest =
            serde_json::from_slice(manifest.verified().map_err(PayloadError::CorruptManifest)?)
                .map_err(PayloadError::BadManifest)?;
        let mut sent = HashMap::with_capacity(parts.len());
        for part in parts {
            part.verified().map_err(PayloadError::CorruptPart)?;
            sent.insert(part.sha256, part.json);
        }
        let mut resolved = HashMap::new();
        for (key, digest) in manifest.parts() {
            let bytes = sent
                .get(digest)
                .or_else(|| self.held.get(digest))
                .ok_or_else(|| MissingPart {
                    key: key.to_owned(),
                    digest: digest.to_owned(),
                })?;
            resolved.insert(digest.to_owned(), bytes.clone());
        }
        for (_, digest) in manifest.parts() {
            let bytes = &resolved[digest];
            self.held
                .entry(digest.to_owned())
                .or_insert_with(|| bytes.clone());
            for evicted in self.lru.touch(digest, bytes.len() as u64) {
                self.held.remove(&evicted);
            }
        }
        Ok(Payload(Arc::new(Inner {
            parts: Some((manifest, resolved)),
            bytes: OnceLock::new(),
            value: OnceLock::new(),
        })))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn part(value: Value) -> Json {
        Json::new(serde_json::to_vec(&value).unwrap())
    }

    fn manifest(input: &Json, context: &[(&str, &Json)]) -> Json {
        let manifest = Manifest {
            input: input.sha256.clone(),
            reference: None,
            context: context
                .iter()
                .map(|(key, part)| (key.to_string(), part.sha256.clone()))
                .collect(),
            error: None,
            messages: no_messages().sha256,
            handoff: None,
            map: None,
        };
        Json::new(serde_json::to_vec(&manifest).unwrap())
    }

    /// The message history of a run without messages: a part like any other.
    fn no_messages() -> Json {
        part(json!([]))
    }

    #[test]
    fn parts_sent_once_are_reused_from_the_cache() {
        let mut cache = PartCache::new(1 << 20);
        let input = part(json!("dark mode"));
        let plan = part(json!({"files": ["a.ts"]}));
        let first = cache
            .receive(
                Some(manifest(&input, &[("plan", &plan)])),
                vec![input.clone(), plan.clone(), no_messages()],
            )
            .unwrap();
        let second = cache
            .receive(Some(manifest(&input, &[("plan", &plan)])), vec![])
            .unwrap();
        let expected =
            json!({"input": "dark mode", "context": {"plan": {"files": ["a.ts"]}}, "messages": []});
        assert_eq!(first, expected);
        assert_eq!(second, expected);
        // Byte for byte the engine's order: input first, then context.
        assert_eq!(
            std::str::from_utf8(second.bytes()).unwrap(),
            r#"{"input":"dark mode","context":{"plan":{"files":["a.ts"]}},"messages":[]}"#
        );
    }

    #[test]
    fn a_part_neither_sent_nor_held_is_named() {
        let mut cache = PartCache::new(1 << 20);
        let input = part(json!("x"));
        let plan = part(json!(1));
        let error = cache
            .receive(Some(manifest(&input, &[("plan", &plan)])), vec![input])
            .unwrap_err();
        assert!(
            matches!(&error, PayloadError::Missing(m) if m.key == "plan"),
            "{error}"
        );
    }

    #[test]
    fn a_flipped_byte_in_a_part_is_rejected() {
        let mut cache = PartCache::new(1 << 20);
        let input = part(json!("x"));
        let mut plan = part(json!({"files": 1}));
        plan.flip(3, 1);
        let error = cache
            .receive(
                Some(manifest(&input, &[("plan", &plan)])),
                vec![input, plan, no_messages()],
            )
            .unwrap_err();
        assert!(matches!(error, PayloadError::CorruptPart(_)), "{error}");
        assert_eq!(cache.used(), 0, "nothing from a rejected task is kept");
    }

    #[test]
    fn the_payload_is_not_built_until_read() {
        let mut cache = PartCache::new(1 << 20);
        let input = part(json!("x"));
        let payload = cache
            .receive(Some(manifest(&input, &[])), vec![input, no_messages()])
            .unwrap();
        assert!(format!("{payload:?}").contains("not yet read"));
        assert_eq!(payload["input"], json!("x"));
        assert!(format!("{payload:?}").contains(r#""input":"x""#));
    }
}
