//! Agent payloads by reference: each part of a run's payloads is encoded and hashed once.
//!
//! Every task of a run names the same run input and, through the default injection, the same
//! earlier results. Encoding and hashing them for each task made a 200-step run's payload work
//! quadratic; here each value is encoded once, when a task first names it, and its bytes and
//! SHA-256 are shared by every later task (the hub then sends the bytes to a worker only if that
//! worker's cache does not hold them).
//!
//! - `listing`: a task's context as a listing, and the change from one listing to another.
//! - `payload`: a task's payload, and the manifest and parts one worker is sent.

mod listing;
mod payload;

use std::collections::HashMap;
use std::sync::Arc;

use baton_core::payload::{INLINE_MAX_BYTES, inline_reference};
use bytes::Bytes;
use serde_json::Value;

pub use self::listing::Listing;
pub use self::payload::{ForWorker, TaskPayload};

/// One part of a payload: JSON bytes, named by their SHA-256 (lowercase hex). The bytes are
/// shared: with the store write that recorded a result, and with every worker sent the part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub json: Bytes,
    pub sha256: String,
}

impl Part {
    pub fn new(json: impl Into<Bytes>) -> Self {
        let json = json.into();
        let sha256 = baton_proto::sha256_hex(&json);
        Self { json, sha256 }
    }

    /// Whether a manifest carries it inline ([`INLINE_MAX_BYTES`] of JSON at most: no more than
    /// its digest) rather than naming it.
    pub fn inline(&self) -> bool {
        self.json.len() <= INLINE_MAX_BYTES
    }
}

/// How a manifest refers to `part`: its JSON inline, or its digest.
fn reference(part: &Part) -> String {
    if part.inline() {
        inline_reference(&part.json)
    } else {
        part.sha256.clone()
    }
}

/// The encoded parts of one run's payloads, by the identity of the shared value, and the run's
/// newest context listings.
///
/// Keyed by the address of the `Arc`'d value, which the map keeps alive, so an address cannot
/// be reused by another value while its entry exists. The engine shares one `Arc` per result
/// across every context that holds it, so each result is encoded once per coordinator.
#[derive(Default)]
pub struct PartEncoder {
    encoded: HashMap<usize, (Arc<Value>, Arc<Part>)>,
    listings: listing::Listings,
}

impl PartEncoder {
    /// The part of a shared value, encoded and hashed the first time it is asked for.
    pub fn part(&mut self, value: &Arc<Value>) -> Arc<Part> {
        let key = Arc::as_ptr(value) as usize;
        self.encoded
            .entry(key)
            .or_insert_with(|| {
                let bytes = serde_json::to_vec(value.as_ref()).expect("a JSON value serialises");
                (value.clone(), Arc::new(Part::new(bytes)))
            })
            .1
            .clone()
    }

    /// The part of a value already encoded, if it was.
    pub fn cached(&self, value: &Arc<Value>) -> Option<Arc<Part>> {
        let key = Arc::as_ptr(value) as usize;
        self.encoded.get(&key).map(|(_, part)| part.clone())
    }

    /// Takes `part`, the encoding of `value` made for the store (a new result), as its part:
    /// the tasks that name the result then send those bytes rather than encoding it again.
    pub fn encoded(&mut self, value: &Arc<Value>, part: Part) {
        let key = Arc::as_ptr(value) as usize;
        self.encoded
            .entry(key)
            .or_insert_with(|| (value.clone(), Arc::new(part)));
    }
}

#[cfg(test)]
mod tests {
    use baton_core::{AgentPayload, Context, Manifest, StepResult};
    use serde_json::json;

    use super::*;

    #[test]
    fn each_shared_value_is_encoded_once_and_the_parts_rebuild_the_payload() {
        // Over 64 bytes of JSON, so named by digest rather than carried inline.
        let plan = Arc::new(json!({"files": ["a.ts", "b.ts", "c.ts"], "why": "x".repeat(40)}));
        let plan_json = serde_json::to_vec(plan.as_ref()).unwrap();
        let context = Context::new(json!("dark mode"))
            .with_result("plan".into(), StepResult::success("plan".into(), 1, plan));
        let payload = AgentPayload {
            reference: Some(("plan".into(), context.data("plan").unwrap().clone())),
            context,
            error: None,
            messages: Arc::new(json!([])),
            handoff: None,
            map: None,
        };
        let mut encoder = PartEncoder::default();
        let first = encoder.payload(&payload);
        let again = encoder.payload(&payload);
        assert_eq!(
            encoder.encoded.len(),
            3,
            "input, plan and the message history, once each"
        );

        // A worker of the protocol before: the context listed whole. The input and the (empty)
        // message history are small: inline in the manifest.
        let whole = first.for_worker(baton_proto::LISTING_PROTOCOL - 1, |_| false);
        assert_eq!(
            whole.named.len(),
            2,
            "plan, as the reference and in the context"
        );
        assert!(
            Arc::ptr_eq(&whole.named[0], &whole.named[1]),
            "reference is plan"
        );
        assert!(whole.listing.is_none());
        let manifest: Manifest = serde_json::from_slice(&whole.manifest.json).unwrap();
        let by_digest: HashMap<&str, &[u8]> = whole
            .named
            .iter()
            .map(|part| (part.sha256.as_str(), &part.json[..]))
            .collect();
        let assembled =
            baton_core::payload::assemble(&manifest, |d| by_digest.get(d).copied()).unwrap();
        assert_eq!(assembled, payload.to_json());
        assert_eq!(manifest.input, r#"="dark mode""#);
        assert_eq!(manifest.messages, "=[]");
        assert_eq!(manifest.context[0].1, Part::new(plan_json.clone()).sha256);
        let again_whole = again.for_worker(baton_proto::LISTING_PROTOCOL - 1, |_| false);
        assert!(Arc::ptr_eq(&whole.named[0], &again_whole.named[0]));

        // A context this short goes whole to this version's workers too.
        let short = first.for_worker(baton_proto::LISTING_PROTOCOL, |_| false);
        assert!(Arc::ptr_eq(&short.manifest, &whole.manifest));
        assert!(short.listing.is_none());
        assert_eq!(
            Part::new(b"abc".to_vec()).sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
