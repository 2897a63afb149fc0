//! A payload by reference: which stored results it is made of, named by their SHA-256.
//!
//! The spec's default injection hands every agent every earlier result, so sending payloads
//! whole costs time and bytes quadratic in the length of a run. Instead the coordinator sends a
//! [`Manifest`] (the payload's shape, with each part named by the SHA-256 of its JSON) and only
//! the parts the worker does not hold yet; the worker rebuilds the payload with [`assemble`],
//! byte for byte what [`AgentPayload::to_json`] would have produced.
//!
//! A part's JSON is `serde_json::to_vec` of its value: the same encoder writes the whole
//! payload, which is why splicing the parts together gives identical bytes.
//!
//! A small part (no more JSON than its digest, [`INLINE_MAX_BYTES`]) is carried in the manifest
//! itself rather than named: its reference is [`INLINE_MARK`] followed by its JSON (a digest is
//! lowercase hex, so never starts with it). It is not sent apart, cached or hashed on its own: a
//! chain's short results (`{"ok": true}`) cost each task a few bytes, not a digest, a part and a
//! cache entry on both ends.
//!
//! Even so, listing the whole context in every manifest made each task's manifest as long as the
//! run so far: the 200th task of a chain listed 199 results, and encoding, hashing and parsing
//! those lists was most of what a chain's step cost both ends (issue 20). So a worker of
//! `baton_proto::LISTING_PROTOCOL` keeps the context listings of its recent tasks in its cache,
//! each under a name, and a manifest gives the context as a change to one of them
//! ([`ListingChange`]): the 200th task names one new result and the listing it adds it to. The
//! coordinator knows which listings a worker holds as it knows which parts it holds (the same
//! least-recently-used policy over the same touches), and lists the context whole
//! ([`Manifest::context`]) to a worker of the protocol before.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use super::{AgentPayload, ErrorInfo};

/// What starts a reference to a part carried inline: the part's JSON follows.
pub const INLINE_MARK: char = '=';

/// Parts of at most this many bytes of JSON are carried inline: a digest is 64.
pub const INLINE_MAX_BYTES: usize = 64;

/// What one entry of a context listing counts for in a cache, beside its JSON: the listing keeps
/// its key and its part's bytes (so a listing held keeps its parts, even those the cache has
/// since let go of).
pub const LISTING_ENTRY_BYTES: u64 = 64;

/// The size a listing of entries of these JSON lengths counts for in a part cache: both ends
/// of a worker stream count it alike. An empty listing counts for one entry, so that a cache
/// of no bytes holds no listing either.
pub fn listing_bytes(json_lengths: impl IntoIterator<Item = usize>) -> u64 {
    LISTING_ENTRY_BYTES
        + json_lengths
            .into_iter()
            .map(|length| LISTING_ENTRY_BYTES + length as u64)
            .sum::<u64>()
}

/// The reference that carries `json` inline (`json` is the JSON text of a value).
pub fn inline_reference(json: &[u8]) -> String {
    let text = std::str::from_utf8(json).expect("JSON text is UTF-8");
    let mut reference = String::with_capacity(text.len() + 1);
    reference.push(INLINE_MARK);
    reference.push_str(text);
    reference
}

/// The JSON a reference carries inline; `None` for a digest.
pub fn inline_json(reference: &str) -> Option<&[u8]> {
    reference.strip_prefix(INLINE_MARK).map(str::as_bytes)
}

/// The shape of an agent payload, each part named by the SHA-256 (lowercase hex) of its JSON,
/// or carried inline ([`INLINE_MARK`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The run input.
    pub input: String,
    /// `step.input`'s key and the data it names (Method 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<(String, String)>,
    /// The visible context, `(key, digest)` in the payload's (sorted) order; empty when it is
    /// given as a change to a listing instead ([`Manifest::listing`]).
    #[serde(default)]
    pub context: Vec<(String, String)>,
    /// The visible context as a change to a listing the worker holds
    /// (`baton_proto::LISTING_PROTOCOL`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listing: Option<ListingChange>,
    /// Why the run came to an `on_error` step; small, so carried inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
    /// The run's message history: a part, because it is shared by every task until an agent
    /// adds to it and can grow long.
    pub messages: String,
    /// The handoff record: different for every task, so carried inline, as the JSON it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<RawJson>,
    /// A map item's `{"step", "item", "index", "count"}`: different for every task, so inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map: Option<RawJson>,
}

/// A task's context listing (`(key, reference)` sorted by key, as [`Manifest::context`]) as a
/// change to a listing the worker already holds, and the name it goes by from now on.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ListingChange {
    /// The name the caches keep this listing under: chosen by the coordinator, never reused,
    /// never a digest.
    pub name: String,
    /// The listing it changes; none for the empty listing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// The entries it sets (adds, or gives a new reference), sorted by key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<(String, String)>,
    /// The keys of the base it does not have.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
}

/// JSON kept as its text (a [`RawValue`]), compared by that text.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RawJson(pub Box<RawValue>);

impl RawJson {
    /// A payload's handoff record, as a manifest carries it: inline, as the JSON it is.
    pub fn handoff_of(payload: &AgentPayload) -> Option<RawJson> {
        payload
            .handoff
            .as_deref()
            .map(|raw| RawJson(raw.to_owned()))
    }

    /// A map item's `{"step", "item", "index", "count"}`, as a manifest carries it: inline.
    pub fn map_of(payload: &AgentPayload) -> Option<RawJson> {
        payload
            .map
            .as_deref()
            .map(|item| RawJson(serde_json::value::to_raw_value(item).expect("an item is JSON")))
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

/// A part the manifest names but that was neither sent nor held.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("payload part {digest} (\"{key}\") is neither in the task nor in the worker's cache")]
pub struct MissingPart {
    pub key: String,
    pub digest: String,
}

impl Manifest {
    /// The manifest of `payload`; `digest` names a part's value (and usually caches its JSON).
    pub fn of(payload: &AgentPayload, mut digest: impl FnMut(&Arc<Value>) -> String) -> Self {
        Self {
            input: digest(payload.context.input()),
            reference: payload
                .reference
                .as_ref()
                .map(|(key, data)| (key.to_string(), digest(data))),
            context: payload
                .context
                .visible()
                .map(|(key, data)| (key.to_string(), digest(data)))
                .collect(),
            listing: None,
            error: payload.error.clone(),
            messages: digest(&payload.messages),
            handoff: RawJson::handoff_of(payload),
            map: RawJson::map_of(payload),
        }
    }

    /// Every part named by a digest as `(key, digest)`, in payload order: input, reference,
    /// context (or the entries the listing change sets), messages (parts carried inline are not
    /// among them). Both ends of a worker stream walk the parts in this order, then touch the
    /// listing, which keeps their caches identical.
    pub fn parts(&self) -> impl Iterator<Item = (&str, &str)> {
        self.references()
            .filter(|(_, reference)| inline_json(reference).is_none())
    }

    /// Every reference as `(key, reference)`, in payload order, inline ones included.
    fn references(&self) -> impl Iterator<Item = (&str, &str)> {
        std::iter::once(("input", self.input.as_str()))
            .chain(
                self.reference
                    .iter()
                    .map(|(key, digest)| (key.as_str(), digest.as_str())),
            )
            .chain(
                self.context
                    .iter()
                    .chain(self.listing.iter().flat_map(|change| &change.set))
                    .map(|(key, digest)| (key.as_str(), digest.as_str())),
            )
            .chain(std::iter::once(("messages", self.messages.as_str())))
    }
}

/// The payload's JSON, from the manifest and each part's JSON bytes (looked up by digest). The
/// caller has checked every part against its digest.
pub fn assemble<'a>(
    manifest: &'a Manifest,
    part: impl Fn(&str) -> Option<&'a [u8]>,
) -> Result<Vec<u8>, MissingPart> {
    let context = manifest
        .context
        .iter()
        .map(|(key, digest)| Ok((key.as_str(), resolve(&part, key, digest)?)))
        .collect::<Result<Vec<_>, MissingPart>>()?;
    assemble_with_context(manifest, part, &context)
}

/// [`assemble`] with the context given as `(key, JSON)` in key order, the listing a worker
/// rebuilt from a [`ListingChange`], rather than from [`Manifest::context`].
pub fn assemble_with_context<'a>(
    manifest: &'a Manifest,
    part: impl Fn(&str) -> Option<&'a [u8]>,
    context: &[(&str, &[u8])],
) -> Result<Vec<u8>, MissingPart> {
    let input = resolve(&part, "input", &manifest.input)?;
    let reference = match &manifest.reference {
        Some((key, digest)) => Some((key, resolve(&part, key, digest)?)),
        None => None,
    };
    let messages = resolve(&part, "messages", &manifest.messages)?;
    let size = input.len()
        + reference.map_or(0, |(k, r)| k.len() + r.len() + 4)
        + context
            .iter()
            .map(|(k, c)| k.len() + c.len() + 4)
            .sum::<usize>()
        + messages.len()
        + 48;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(br#"{"input":"#);
    out.extend_from_slice(input);
    if let Some((key, data)) = reference {
        out.push(b',');
        write_key(&mut out, key);
        out.extend_from_slice(data);
    }
    out.extend_from_slice(br#","context":{"#);
    for (i, (key, data)) in context.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_key(&mut out, key);
        out.extend_from_slice(data);
    }
    out.push(b'}');
    if let Some(error) = &manifest.error {
        out.extend_from_slice(br#","error":"#);
        serde_json::to_writer(&mut out, error).expect("an error record serialises");
    }
    out.extend_from_slice(br#","messages":"#);
    out.extend_from_slice(messages);
    if let Some(handoff) = &manifest.handoff {
        out.extend_from_slice(br#","handoff":"#);
        out.extend_from_slice(handoff.0.get().as_bytes());
    }
    if let Some(item) = &manifest.map {
        out.extend_from_slice(br#","map":"#);
        out.extend_from_slice(item.0.get().as_bytes());
    }
    out.push(b'}');
    Ok(out)
}

/// The JSON a reference stands for: carried inline, or the part it names.
fn resolve<'a>(
    part: &impl Fn(&str) -> Option<&'a [u8]>,
    key: &str,
    reference: &'a str,
) -> Result<&'a [u8], MissingPart> {
    if let Some(json) = inline_json(reference) {
        return Ok(json);
    }
    part(reference).ok_or_else(|| MissingPart {
        key: key.to_owned(),
        digest: reference.to_owned(),
    })
}

/// `"key":`, escaped as serde_json escapes map keys.
fn write_key(out: &mut Vec<u8>, key: &str) {
    serde_json::to_writer(&mut *out, key).expect("a string serialises");
    out.push(b':');
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::json;

    use super::*;
    use crate::context::{Context, StepResult};

    fn digest_of(parts: &mut HashMap<String, Vec<u8>>) -> impl FnMut(&Arc<Value>) -> String {
        move |value| {
            let bytes = serde_json::to_vec(value.as_ref()).unwrap();
            // Any injective name will do for the test; the coordinator uses SHA-256.
            let name = format!("d{}", String::from_utf8_lossy(&bytes).len());
            let name = format!("{name}-{}", parts.len());
            parts.insert(name.clone(), bytes);
            name
        }
    }

    fn payload() -> AgentPayload {
        let context = Context::new(json!({"task": "dark \"mode\""}))
            .with_result(
                "plan".into(),
                StepResult::success("plan".into(), 1, Arc::new(json!({"files": ["a.ts"]}))),
            )
            .with_result(
                "odd \"key\"\n".into(),
                StepResult::success("x".into(), 1, Arc::new(json!("é"))),
            );
        AgentPayload {
            reference: Some(("plan".into(), context.data("plan").unwrap().clone())),
            context,
            error: Some(ErrorInfo {
                step: "test".into(),
                message: "boom".into(),
            }),
            messages: Arc::new(json!([{"id": "m1", "role": "user", "content": "dark mode"}])),
            handoff: Some(Arc::from(
                serde_json::value::to_raw_value(
                    &json!({"source_agent": "planner", "decisions": []}),
                )
                .unwrap(),
            )),
            map: Some(Arc::new(
                json!({"step": "each", "item": {"file": "a \"b\".ts"}, "index": 3, "count": 9}),
            )),
        }
    }

    #[test]
    fn assembling_gives_the_bytes_of_the_whole_payload() {
        let payload = payload();
        let mut parts = HashMap::new();
        let manifest = Manifest::of(&payload, digest_of(&mut parts));
        let assembled = assemble(&manifest, |d| parts.get(d).map(Vec::as_slice)).unwrap();
        assert_eq!(
            String::from_utf8(assembled).unwrap(),
            String::from_utf8(payload.to_json()).unwrap()
        );
    }

    /// Small values inline, the others named, as the coordinator encodes them.
    fn inline_or_digest(parts: &mut HashMap<String, Vec<u8>>) -> impl FnMut(&Arc<Value>) -> String {
        let mut named = digest_of(parts);
        move |value| {
            let bytes = serde_json::to_vec(value.as_ref()).unwrap();
            if bytes.len() <= INLINE_MAX_BYTES {
                inline_reference(&bytes)
            } else {
                named(value)
            }
        }
    }

    #[test]
    fn small_parts_travel_inline() {
        let mut payload = payload();
        payload.messages =
            Arc::new(json!([{"id": "m1", "role": "user", "content": "x".repeat(80)}]));
        let mut parts = HashMap::new();
        let manifest = Manifest::of(&payload, inline_or_digest(&mut parts));
        let whole = String::from_utf8(payload.to_json()).unwrap();
        // Only the message history (over 64 bytes) is a part of its own.
        assert_eq!(
            manifest.parts().map(|(key, _)| key).collect::<Vec<_>>(),
            ["messages"]
        );
        assert_eq!(manifest.context[1].1, r#"={"files":["a.ts"]}"#);
        let assembled = assemble(&manifest, |d| parts.get(d).map(Vec::as_slice)).unwrap();
        assert_eq!(String::from_utf8(assembled).unwrap(), whole);
        // Survives the wire.
        let sent: Manifest =
            serde_json::from_slice(&serde_json::to_vec(&manifest).unwrap()).unwrap();
        assert_eq!(sent, manifest);
    }

    #[test]
    fn a_listing_change_names_the_parts_it_sets_and_the_context_comes_from_the_listing() {
        let payload = payload();
        let mut parts = HashMap::new();
        let mut manifest = Manifest::of(&payload, digest_of(&mut parts));
        let whole = String::from_utf8(payload.to_json()).unwrap();
        // The worker already holds a listing with "odd" entry; the change sets "plan".
        let listed = std::mem::take(&mut manifest.context);
        manifest.listing = Some(ListingChange {
            name: "ctx-2".into(),
            base: Some("ctx-1".into()),
            set: vec![listed[1].clone()],
            removed: vec!["gone".into()],
        });
        assert_eq!(
            manifest.parts().map(|(key, _)| key).collect::<Vec<_>>(),
            ["input", "plan", "plan", "messages"],
            "input, reference, what the change sets, messages"
        );
        let sent: Manifest =
            serde_json::from_slice(&serde_json::to_vec(&manifest).unwrap()).unwrap();
        assert_eq!(sent, manifest);
        // The listing the worker rebuilt gives the context, in key order.
        let context: Vec<(&str, &[u8])> = listed
            .iter()
            .map(|(key, digest)| (key.as_str(), parts[digest].as_slice()))
            .collect();
        let assembled =
            assemble_with_context(&manifest, |d| parts.get(d).map(Vec::as_slice), &context)
                .unwrap();
        assert_eq!(String::from_utf8(assembled).unwrap(), whole);
    }

    #[test]
    fn a_listing_counts_a_fixed_size_per_entry_and_its_bytes() {
        assert_eq!(listing_bytes([]), LISTING_ENTRY_BYTES);
        assert_eq!(listing_bytes([10, 0]), 3 * LISTING_ENTRY_BYTES + 10);
    }

    #[test]
    fn a_missing_part_is_named() {
        let payload = payload();
        let mut parts = HashMap::new();
        let manifest = Manifest::of(&payload, digest_of(&mut parts));
        let plan_digest = manifest.context[1].1.clone();
        parts.remove(&plan_digest);
        let error = assemble(&manifest, |d| parts.get(d).map(Vec::as_slice)).unwrap_err();
        assert_eq!(error.key, "plan");
        assert_eq!(error.digest, plan_digest);
    }

    #[test]
    fn parts_walk_input_then_reference_then_context() {
        let payload = payload();
        let mut parts = HashMap::new();
        let manifest = Manifest::of(&payload, digest_of(&mut parts));
        let keys: Vec<&str> = manifest.parts().map(|(key, _)| key).collect();
        assert_eq!(keys, ["input", "plan", "odd \"key\"\n", "plan", "messages"]);
    }

    #[test]
    fn the_manifest_round_trips_through_json() {
        let payload = payload();
        let mut parts = HashMap::new();
        let manifest = Manifest::of(&payload, digest_of(&mut parts));
        let back: Manifest =
            serde_json::from_slice(&serde_json::to_vec(&manifest).unwrap()).unwrap();
        assert_eq!(back, manifest);
    }
}
