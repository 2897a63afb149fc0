//! A task's payload as the hub sends it: a manifest and the parts it names, made for the worker
//! it goes to. A worker of [`baton_proto::LISTING_PROTOCOL`] gets the context as a change to the
//! newest of the run's listings it holds; one of the protocol before gets it listed whole (made
//! once per task, on first need), and so does every worker when the context is short.

use std::sync::{Arc, OnceLock};

use baton_core::payload::{ErrorInfo, ListingChange, RawJson};
use baton_core::{AgentPayload, Manifest};

use super::listing::{self, Listing};
use super::{Part, PartEncoder, reference};

/// A context of at most this many entries is listed whole: a change names two listings (some
/// 80 bytes) and makes the worker keep one, which a short listing does not repay (a 3-step
/// chain's or an empty fan-out's context).
const LISTED_WHOLE_UP_TO: usize = 8;

/// A task's payload, ready to be sent to any worker.
#[derive(Debug, Clone)]
pub struct TaskPayload(Arc<Form>);

#[derive(Debug)]
enum Form {
    /// A manifest made elsewhere (tests), sent as it is, with every part it names.
    Made {
        manifest: Arc<Part>,
        parts: Vec<Arc<Part>>,
    },
    /// Everything but the context, and the context as a listing.
    Listed {
        frame: Frame,
        listing: Arc<Listing>,
        /// The run's newest listings when the task was made, newest first: the bases a worker
        /// may hold.
        bases: Arc<[Arc<Listing>]>,
        /// The manifest with the context listed whole, and its named parts, for a worker of
        /// the protocol before.
        whole: OnceLock<(Arc<Part>, Vec<Arc<Part>>)>,
    },
}

/// The parts of a payload besides its context.
#[derive(Debug)]
struct Frame {
    input: Arc<Part>,
    reference: Option<(Arc<str>, Arc<Part>)>,
    error: Option<ErrorInfo>,
    messages: Arc<Part>,
    handoff: Option<RawJson>,
    map: Option<RawJson>,
}

/// What one worker is sent: the manifest, every part it names (in the order both ends touch
/// them; the caller sends those the worker does not hold), and the listing the worker holds
/// from then on, with what it counts for in the cache.
pub struct ForWorker<'a> {
    pub manifest: Arc<Part>,
    pub named: Vec<Arc<Part>>,
    pub listing: Option<(&'a str, u64)>,
}

impl PartEncoder {
    /// `payload`, ready to be sent: its parts encoded (each value once per run) and its context
    /// as a listing.
    pub fn payload(&mut self, payload: &AgentPayload) -> TaskPayload {
        let frame = Frame {
            input: self.part(payload.context.input()),
            reference: payload
                .reference
                .as_ref()
                .map(|(key, data)| (key.clone(), self.part(data))),
            error: payload.error.clone(),
            messages: self.part(&payload.messages),
            handoff: RawJson::handoff_of(payload),
            map: RawJson::map_of(payload),
        };
        let listing = self.listing(&payload.context);
        TaskPayload(Arc::new(Form::Listed {
            frame,
            listing,
            bases: self.listings.bases(),
            whole: OnceLock::new(),
        }))
    }
}

impl TaskPayload {
    /// A payload of a manifest made elsewhere and every part it names, sent as it is to any
    /// worker.
    pub fn made(manifest: Arc<Part>, parts: Vec<Arc<Part>>) -> Self {
        TaskPayload(Arc::new(Form::Made { manifest, parts }))
    }

    /// What a worker speaking `protocol` is sent, `holds` saying which parts and listings its
    /// cache holds.
    pub fn for_worker(&self, protocol: u32, holds: impl Fn(&str) -> bool) -> ForWorker<'_> {
        match &*self.0 {
            Form::Made { manifest, parts } => ForWorker {
                manifest: manifest.clone(),
                named: parts.clone(),
                listing: None,
            },
            Form::Listed {
                frame,
                listing,
                bases,
                ..
            } if protocol >= baton_proto::LISTING_PROTOCOL
                && listing.entries.len() > LISTED_WHOLE_UP_TO =>
            {
                let base = std::iter::once(listing)
                    .chain(bases.iter())
                    .find(|listed| holds(&listed.name));
                let (change, set) = listing::change(base.map(Arc::as_ref), listing);
                let manifest = frame.manifest(Vec::new(), Some(change));
                ForWorker {
                    manifest: Arc::new(Part::new(
                        serde_json::to_vec(&manifest).expect("a manifest serialises"),
                    )),
                    named: frame.named(set),
                    listing: Some((&listing.name, listing.bytes)),
                }
            }
            Form::Listed {
                frame,
                listing,
                whole,
                ..
            } => {
                let (manifest, named) = whole.get_or_init(|| {
                    let context = listing
                        .entries
                        .iter()
                        .map(|(key, _, part)| (key.to_string(), reference(part)))
                        .collect();
                    let manifest = frame.manifest(context, None);
                    let named =
                        frame.named(listing.entries.iter().map(|(_, _, part)| part.clone()));
                    let json = serde_json::to_vec(&manifest).expect("a manifest serialises");
                    (Arc::new(Part::new(json)), named)
                });
                ForWorker {
                    manifest: manifest.clone(),
                    named: named.clone(),
                    listing: None,
                }
            }
        }
    }
}

impl Frame {
    /// The manifest with the context listed as `context`, or given as `listing`.
    fn manifest(&self, context: Vec<(String, String)>, listing: Option<ListingChange>) -> Manifest {
        Manifest {
            input: reference(&self.input),
            reference: self
                .reference
                .as_ref()
                .map(|(key, part)| (key.to_string(), reference(part))),
            context,
            listing,
            error: self.error.clone(),
            messages: reference(&self.messages),
            handoff: self.handoff.clone(),
            map: self.map.clone(),
        }
    }

    /// The parts named by digest (not carried inline), in the order both ends touch them:
    /// input, reference, `context` (the listing's, or those its change sets), messages.
    fn named(&self, context: impl IntoIterator<Item = Arc<Part>>) -> Vec<Arc<Part>> {
        std::iter::once(self.input.clone())
            .chain(self.reference.iter().map(|(_, part)| part.clone()))
            .chain(context)
            .chain(std::iter::once(self.messages.clone()))
            .filter(|part| !part.inline())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use baton_core::{Context, StepResult};
    use serde_json::json;

    use super::*;

    /// A payload whose context has `n` results, the last one over 64 bytes of JSON.
    fn payload(n: usize) -> AgentPayload {
        let mut context = Context::new(json!("dark mode"));
        for i in 0..n {
            let data = if i + 1 == n {
                json!({"long": "x".repeat(80)})
            } else {
                json!(i)
            };
            context = context.with_result(
                format!("s{i:02}").into(),
                StepResult::success(format!("s{i:02}").into(), 1, Arc::new(data)),
            );
        }
        AgentPayload {
            reference: None,
            context,
            error: None,
            messages: Arc::new(json!([])),
            handoff: None,
            map: None,
        }
    }

    fn manifest(sending: &ForWorker<'_>) -> Manifest {
        serde_json::from_slice(&sending.manifest.json).unwrap()
    }

    #[test]
    fn a_long_context_goes_as_a_change_to_the_newest_listing_the_worker_holds() {
        let mut encoder = PartEncoder::default();
        let first = encoder.payload(&payload(LISTED_WHOLE_UP_TO + 1));
        let second = encoder.payload(&payload(LISTED_WHOLE_UP_TO + 2));
        let protocol = baton_proto::LISTING_PROTOCOL;

        // A worker that holds no listing: the whole listing, as a change from nothing.
        let fresh = second.for_worker(protocol, |_| false);
        let change = manifest(&fresh).listing.expect("a listing change");
        assert_eq!(change.base, None);
        assert_eq!(change.set.len(), LISTED_WHOLE_UP_TO + 2);
        assert!(manifest(&fresh).context.is_empty());
        let (name, bytes) = fresh.listing.expect("the listing it holds from then on");
        assert_eq!(name, change.name);
        let Form::Listed { listing, .. } = &*second.0 else {
            panic!("a listed payload")
        };
        assert_eq!(bytes, listing.bytes);
        // One long value (its last), named; the rest inline.
        assert_eq!(fresh.named.len(), 1);

        // One that ran the first task: only what the second added or changed.
        let Form::Listed { listing: held, .. } = &*first.0 else {
            panic!("a listed payload")
        };
        let after = second.for_worker(protocol, |name| name == held.name);
        let change = manifest(&after).listing.expect("a listing change");
        assert_eq!(change.base.as_deref(), Some(held.name.as_str()));
        let keys: Vec<&str> = change.set.iter().map(|(k, _)| k.as_str()).collect();
        let (last, before_last) = (
            format!("s{:02}", LISTED_WHOLE_UP_TO + 1),
            format!("s{:02}", LISTED_WHOLE_UP_TO),
        );
        assert_eq!(keys, [before_last.as_str(), last.as_str()]);
        // The one before last was long and is short now; the last is the new long value.
        assert_eq!(after.named.len(), 1, "the new long value");

        // A worker of the protocol before: listed whole.
        let older = second.for_worker(protocol - 1, |name| name == held.name);
        assert!(manifest(&older).listing.is_none());
        assert_eq!(manifest(&older).context.len(), LISTED_WHOLE_UP_TO + 2);
    }
}
