//! The payload target: a payload sent by reference (its manifest and parts) and spliced back
//! together, as a worker does; and [`spliced`], which the engine's run checks every dispatched
//! payload with.

use std::collections::HashMap;
use std::sync::Arc;

use arbitrary::Unstructured;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::generate::{json_value, string};
use crate::payload::{AgentPayload, ErrorInfo, Manifest, assemble};
use crate::text::text_nesting_depth;
use crate::{Context, StepResult};

/// A payload by reference: an arbitrary payload's manifest and parts, spliced back together;
/// then the rest of the input read as a manifest off the wire.
///
/// Invariants: splicing gives the bytes of the whole payload; the manifest survives its JSON; a
/// part missing is named, never spliced around; any manifest that reads splices into JSON.
pub fn manifest(data: &[u8]) {
    let mut u = Unstructured::new(data);
    if let Ok((payload, missing)) = arbitrary_payload(&mut u) {
        let mut parts: HashMap<String, Vec<u8>> = HashMap::new();
        let made = Manifest::of(&payload, |value| {
            let bytes = serde_json::to_vec(value.as_ref()).expect("a part serialises");
            let digest = hex::encode(Sha256::digest(&bytes));
            parts.insert(digest.clone(), bytes);
            digest
        });
        assert_eq!(spliced(&payload), payload.to_json());
        let count = made.parts().count();
        let (key, digest) = made
            .parts()
            .nth(missing % count)
            .map(|(key, digest)| (key.to_owned(), digest.to_owned()))
            .expect("a manifest names at least its input and messages");
        parts.remove(&digest);
        let error = assemble(&made, |d| parts.get(d).map(Vec::as_slice))
            .expect_err("a payload with a part missing is not spliced");
        assert_eq!(error.digest, digest, "the missing part ({key}) is named");
    }
    let rest = u.take_rest();
    let Ok(received) = serde_json::from_slice::<Manifest>(rest) else {
        return;
    };
    let spliced = assemble(&received, |_| Some(b"null".as_slice()))
        .expect("every part is found when every part is null");
    // The handoff nests as deep as the manifest allowed, and one level more in the payload:
    // deeper than serde_json reads.
    if text_nesting_depth(&String::from_utf8_lossy(rest)) < 100 {
        let payload: Value = serde_json::from_slice(&spliced).expect("a spliced payload is JSON");
        assert!(payload.is_object());
    }
}

/// A payload drawn from `u` (and which of its parts to drop).
fn arbitrary_payload(u: &mut Unstructured) -> arbitrary::Result<(AgentPayload, usize)> {
    let mut context = Context::new(json_value(u, 3)?);
    for visit in 0..u.int_in_range(0..=6)? {
        let key: Arc<str> = string(u, 12)?.into();
        let result = if u.ratio(1, 5)? {
            StepResult::failure(key.clone(), visit, string(u, 20)?.into())
        } else {
            StepResult::success(key.clone(), visit, Arc::new(json_value(u, 3)?))
        };
        context = context.with_result(key, result);
    }
    let reference = if u.arbitrary()? {
        Some((string(u, 12)?.into(), Arc::new(json_value(u, 3)?)))
    } else {
        None
    };
    let error = if u.arbitrary()? {
        Some(ErrorInfo {
            step: string(u, 12)?.into(),
            message: string(u, 40)?.into(),
        })
    } else {
        None
    };
    let messages = Arc::new(json_value(u, 3)?);
    // The engine's handoff record is an object: a `null` one would not survive the manifest's
    // JSON (`"handoff": null` reads back as no handoff).
    let handoff = if u.arbitrary()? {
        let mut value = json_value(u, 3)?;
        if !value.is_object() {
            value = json!({ "record": value });
        }
        Some(Arc::from(
            serde_json::value::to_raw_value(&value).expect("a value serialises"),
        ))
    } else {
        None
    };
    let map = if u.arbitrary()? {
        Some(Arc::new(serde_json::json!({
            "step": "each",
            "item": json_value(u, 3)?,
            "index": u.int_in_range(0..=99_999u32)?,
            "count": 100_000,
        })))
    } else {
        None
    };
    let payload = AgentPayload {
        context,
        reference,
        error,
        messages,
        handoff,
        map,
    };
    Ok((payload, u.arbitrary()?))
}

/// `payload` sent by reference and rebuilt as a worker rebuilds it.
pub(super) fn spliced(payload: &AgentPayload) -> Vec<u8> {
    let mut parts: HashMap<String, Vec<u8>> = HashMap::new();
    let manifest = Manifest::of(payload, |value| {
        let bytes = serde_json::to_vec(value.as_ref()).expect("a part serialises");
        let digest = hex::encode(Sha256::digest(&bytes));
        parts.insert(digest.clone(), bytes);
        digest
    });
    let wire = serde_json::to_vec(&manifest).expect("a manifest serialises");
    let received: Manifest = serde_json::from_slice(&wire).expect("a manifest reads back");
    assert_eq!(received, manifest, "a manifest survives the wire");
    assemble(&received, |digest| parts.get(digest).map(Vec::as_slice))
        .expect("every part the manifest names was made")
}
