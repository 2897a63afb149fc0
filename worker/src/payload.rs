//! The payload an agent receives, rebuilt on the worker from a task's manifest and parts.
//!
//! A task names its payload's parts by SHA-256 and carries the bytes of only those this worker
//! does not hold ([`baton_core::payload::Manifest`]). The worker checks every part it is sent
//! against its digest, keeps recent parts in a bounded [`PartCache`], and splices the payload
//! together only when the agent first asks for it: an agent that reads the bytes (a `command`
//! agent writing them to stdin) never pays for parsing, and one that reads nothing pays for
//! nothing.
//!
//! The cache also keeps the context listings of recent tasks, by the name the coordinator gave
//! each, so that a task can give its context as a change to one of them
//! ([`baton_core::payload::ListingChange`]) rather than list it whole. A listing keeps the bytes
//! of its entries, and counts them in the budget.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use baton_core::BlobLru;
use baton_core::payload::{
    LISTING_ENTRY_BYTES, ListingChange, Manifest, MissingPart, assemble, assemble_with_context,
    inline_json, listing_bytes,
};
use baton_proto::{DigestMismatch, Json};
use bytes::Bytes;
use serde_json::Value;

/// `{input, <reference>, context, error}`, as the spec describes; cheap to clone.
#[derive(Clone)]
pub struct Payload(Arc<Inner>);

struct Inner {
    /// What it is built from, when built from a task.
    parts: Option<Received>,
    bytes: OnceLock<Vec<u8>>,
    value: OnceLock<Value>,
}

/// A task's manifest, every part it names, and the context listing its change made, if it gave
/// its context as a change.
struct Received {
    manifest: Manifest,
    parts: HashMap<String, Bytes>,
    listing: Option<Arc<Listing>>,
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
            Some(Received {
                manifest,
                parts,
                listing,
            }) => {
                let part = |digest: &str| parts.get(digest).map(|b| &b[..]);
                match listing {
                    None => assemble(manifest, part),
                    Some(listing) => {
                        let context: Vec<(&str, &[u8])> = listing
                            .entries
                            .iter()
                            .map(|(key, json)| (key.as_ref(), &json[..]))
                            .collect();
                        assemble_with_context(manifest, part, &context)
                    }
                }
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
        self.0
            .parts
            .as_ref()
            .map_or(0, |received| received.parts.len())
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
    #[error("the context listing {0} the task changes is not in the worker's cache")]
    MissingListing(String),
    #[error("the manifest both lists its context and changes a listing")]
    ContextTwice,
}

/// A context listing: each key's JSON, in key order (the payload's). Persistent, so a listing
/// made by a change shares with its base what the change left alone.
struct Listing {
    entries: imbl::OrdMap<Arc<str>, Bytes>,
    /// What it counts for in the cache ([`baton_core::payload::listing_bytes`]).
    bytes: u64,
}

impl Listing {
    /// `base` changed as `change` says, each entry's JSON carried inline or found in
    /// `resolved` (the parts the task names).
    fn changed(
        base: Option<&Listing>,
        change: &ListingChange,
        resolved: &HashMap<String, Bytes>,
    ) -> Listing {
        let (mut entries, mut bytes) = match base {
            Some(base) => (base.entries.clone(), base.bytes),
            None => (imbl::OrdMap::new(), listing_bytes([])),
        };
        let size = |json: &Bytes| LISTING_ENTRY_BYTES + json.len() as u64;
        for key in &change.removed {
            if let Some(json) = entries.remove(key.as_str()) {
                bytes -= size(&json);
            }
        }
        for (key, reference) in &change.set {
            let json = match inline_json(reference) {
                Some(json) => Bytes::copy_from_slice(json),
                None => resolved[reference].clone(),
            };
            bytes += size(&json);
            if let Some(json) = entries.insert(Arc::from(key.as_str()), json) {
                bytes -= size(&json);
            }
        }
        Listing { entries, bytes }
    }
}

/// The parts and context listings this worker holds between the tasks of one stream, within a
/// byte budget. Its policy ([`BlobLru`]) is the one the coordinator mirrors; both start empty
/// with the stream.
pub struct PartCache {
    lru: BlobLru,
    held: HashMap<String, Bytes>,
    listings: HashMap<String, Arc<Listing>>,
}

impl PartCache {
    pub fn new(budget: u64) -> Self {
        Self {
            lru: BlobLru::new(budget),
            held: HashMap::new(),
            listings: HashMap::new(),
        }
    }

    /// Marks `name` (a part's digest or a listing's name) as just used, and lets go of what
    /// that evicts.
    fn touch(&mut self, name: &str, size: u64) {
        for evicted in self.lru.touch(name, size) {
            self.held.remove(&evicted);
            self.listings.remove(&evicted);
        }
    }

    /// Bytes held.
    pub fn used(&self) -> u64 {
        self.lru.used()
    }

    /// Checks a task's manifest and parts, resolves every part it names from the task or the
    /// cache (and the listing its context changes), then touches them in manifest order and
    /// then its listing, as the coordinator did when it sent the task.
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
        let listing = match &manifest.listing {
            None => None,
            Some(_) if !manifest.context.is_empty() => return Err(PayloadError::ContextTwice),
            Some(change) => {
                let base = match &change.base {
                    None => None,
                    Some(name) => Some(
                        self.listings
                            .get(name)
                            .ok_or_else(|| PayloadError::MissingListing(name.clone()))?,
                    ),
                };
                Some(Arc::new(Listing::changed(
                    base.map(Arc::as_ref),
                    change,
                    &resolved,
                )))
            }
        };
        for (_, digest) in manifest.parts() {
            let bytes = resolved[digest].clone();
            let size = bytes.len() as u64;
            self.held.entry(digest.to_owned()).or_insert(bytes);
            self.touch(digest, size);
        }
        if let (Some(change), Some(listing)) = (&manifest.listing, &listing) {
            self.listings.insert(change.name.clone(), listing.clone());
            self.touch(&change.name, listing.bytes);
        }
        Ok(Payload(Arc::new(Inner {
            parts: Some(Received {
                manifest,
                parts: resolved,
                listing,
            }),
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
            listing: None,
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

    /// A manifest whose context is a change to the listing `base`.
    fn changing(input: &Json, base: Option<&str>, name: &str, set: &[(&str, &Json)]) -> Json {
        let manifest = Manifest {
            input: input.sha256.clone(),
            reference: None,
            context: Vec::new(),
            listing: Some(ListingChange {
                name: name.into(),
                base: base.map(str::to_owned),
                set: set
                    .iter()
                    .map(|(key, part)| (key.to_string(), part.sha256.clone()))
                    .collect(),
                removed: Vec::new(),
            }),
            error: None,
            messages: no_messages().sha256,
            handoff: None,
            map: None,
        };
        Json::new(serde_json::to_vec(&manifest).unwrap())
    }

    #[test]
    fn a_context_changed_from_a_listing_held_keeps_what_the_change_leaves_alone() {
        let mut cache = PartCache::new(1 << 20);
        let input = part(json!("x"));
        let plan = part(json!({"files": ["a.ts"]}));
        let code = part(json!({"built": true}));
        cache
            .receive(
                Some(changing(&input, None, "ctx-1", &[("plan", &plan)])),
                vec![input.clone(), plan, no_messages()],
            )
            .unwrap();
        let second = cache
            .receive(
                Some(changing(&input, Some("ctx-1"), "ctx-2", &[("code", &code)])),
                vec![code],
            )
            .unwrap();
        assert_eq!(
            std::str::from_utf8(second.bytes()).unwrap(),
            r#"{"input":"x","context":{"code":{"built":true},"plan":{"files":["a.ts"]}},"messages":[]}"#
        );
    }

    #[test]
    fn a_change_to_a_listing_not_held_or_a_context_given_twice_is_refused() {
        let mut cache = PartCache::new(1 << 20);
        let input = part(json!("x"));
        let error = cache
            .receive(
                Some(changing(&input, Some("ctx-9"), "ctx-10", &[])),
                vec![input.clone(), no_messages()],
            )
            .unwrap_err();
        assert!(
            matches!(&error, PayloadError::MissingListing(name) if name == "ctx-9"),
            "{error}"
        );
        let mut twice: Manifest =
            serde_json::from_slice(&changing(&input, None, "ctx-1", &[]).json).unwrap();
        twice.context = vec![("plan".into(), input.sha256.clone())];
        let twice = Json::new(serde_json::to_vec(&twice).unwrap());
        let error = cache
            .receive(Some(twice), vec![input, no_messages()])
            .unwrap_err();
        assert!(matches!(error, PayloadError::ContextTwice), "{error}");
        assert_eq!(cache.used(), 0, "nothing from a refused task is kept");
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
