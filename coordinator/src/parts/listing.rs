//! Context listings: a task's visible context as `(key, part)` in key order, under a name the
//! worker caches it by, so that the next task can give its context as a change to it.
//!
//! A chain's context grows by one result a step, and a fan-out's branches (or a map's items) all
//! see one context: listing each task's context whole made every manifest as long as the run so
//! far. A run's encoder keeps its newest listings; a task's listing is the newest one when the
//! context is unchanged, and otherwise a new one whose unchanged entries are the newest one's
//! (a pointer compare each, nothing encoded again). What a worker is sent is then the change
//! from a listing it holds ([`change`]).

use std::collections::VecDeque;
use std::sync::Arc;

use baton_core::Context;
use baton_core::payload::{ListingChange, listing_bytes};
use serde_json::Value;

use super::{Part, PartEncoder, reference};

/// How many of a run's newest listings are kept as bases a worker may hold: a worker that ran
/// one of the run's last few tasks gets the change from it.
const BASES: usize = 4;

/// A context as a task lists it.
#[derive(Debug)]
pub struct Listing {
    /// What the caches know it by: random, so never reused, and never a digest.
    pub name: String,
    /// Each visible entry: its key, the shared value (which keeps its address unique while the
    /// listing lives) and the value's part, in key order.
    pub entries: Vec<(Arc<str>, Arc<Value>, Arc<Part>)>,
    /// What it counts for in a part cache ([`listing_bytes`]).
    pub bytes: u64,
}

impl Listing {
    fn new(entries: Vec<(Arc<str>, Arc<Value>, Arc<Part>)>) -> Self {
        let bytes = listing_bytes(entries.iter().map(|(_, _, part)| part.json.len()));
        Listing {
            name: format!("ctx-{:032x}", fastrand::u128(..)),
            entries,
            bytes,
        }
    }
}

/// A run's newest listings, newest first.
#[derive(Debug, Default)]
pub(super) struct Listings {
    newest: VecDeque<Arc<Listing>>,
    /// `newest` as shared with the tasks, made again only when a listing is added.
    shared: Arc<[Arc<Listing>]>,
}

impl Listings {
    /// The bases a task's worker may hold, newest first.
    pub fn bases(&self) -> Arc<[Arc<Listing>]> {
        self.shared.clone()
    }
}

impl PartEncoder {
    /// The listing of `context`: the newest one if the context has not changed since, else a
    /// new one, which becomes the newest.
    pub(super) fn listing(&mut self, context: &Context) -> Arc<Listing> {
        let newest = self.listings.newest.front().cloned();
        let previous = newest.as_deref().map_or(&[][..], |l| &l.entries[..]);
        let mut entries = Vec::with_capacity(previous.len() + 1);
        let mut unchanged = true;
        let mut at = 0;
        for (key, value) in context.visible() {
            // Both in key order: walk the newest listing alongside.
            while previous.get(at).is_some_and(|(k, _, _)| k < key) {
                unchanged = false;
                at += 1;
            }
            let part = match previous.get(at) {
                Some((k, v, part)) if k == key && Arc::ptr_eq(v, value) => {
                    at += 1;
                    part.clone()
                }
                _ => {
                    unchanged = false;
                    self.part(value)
                }
            };
            entries.push((key.clone(), value.clone(), part));
        }
        if unchanged
            && at == previous.len()
            && let Some(newest) = &newest
        {
            return newest.clone();
        }
        let listing = Arc::new(Listing::new(entries));
        let listings = &mut self.listings;
        listings.newest.push_front(listing.clone());
        listings.newest.truncate(BASES);
        listings.shared = listings.newest.iter().cloned().collect();
        listing
    }
}

/// The change that makes `listing` from `base` (the empty listing if none): the entries whose
/// part differs or that `base` lacks, and the keys only `base` has; and the parts it sets.
pub fn change(base: Option<&Listing>, listing: &Listing) -> (ListingChange, Vec<Arc<Part>>) {
    let from = base.map_or(&[][..], |base| &base.entries[..]);
    let mut set = Vec::new();
    let mut parts = Vec::new();
    let mut removed = Vec::new();
    let mut at = 0;
    for (key, _, part) in &listing.entries {
        while let Some((k, _, _)) = from.get(at).filter(|(k, _, _)| k < key) {
            removed.push(k.to_string());
            at += 1;
        }
        match from.get(at) {
            Some((k, _, was)) if k == key => {
                at += 1;
                if Arc::ptr_eq(was, part) || was.sha256 == part.sha256 {
                    continue;
                }
            }
            _ => {}
        }
        set.push((key.to_string(), reference(part)));
        parts.push(part.clone());
    }
    removed.extend(from[at..].iter().map(|(k, _, _)| k.to_string()));
    let change = ListingChange {
        name: listing.name.clone(),
        base: base.map(|base| base.name.clone()),
        set,
        removed,
    };
    (change, parts)
}

#[cfg(test)]
mod tests {
    use baton_core::StepResult;
    use serde_json::json;

    use super::*;

    fn with(context: Context, key: &str, value: Value) -> Context {
        context.with_result(
            key.into(),
            StepResult::success(key.into(), 1, Arc::new(value)),
        )
    }

    #[test]
    fn an_unchanged_context_keeps_its_listing_and_a_change_lists_only_what_changed() {
        let mut encoder = PartEncoder::default();
        let one = with(Context::new(json!("x")), "b", json!({"i": 1}));
        let first = encoder.listing(&one);
        assert!(Arc::ptr_eq(&first, &encoder.listing(&one.clone())));
        assert_eq!(
            change(None, &first).0.set,
            [("b".into(), r#"={"i":1}"#.into())]
        );

        // A result before and one after "b": "b" keeps its part, encoded once.
        let three = with(with(one, "a", json!(2)), "c", json!("x".repeat(100)));
        let second = encoder.listing(&three);
        assert_eq!(second.entries.len(), 3);
        assert!(Arc::ptr_eq(&second.entries[1].2, &first.entries[0].2));
        let (delta, parts) = change(Some(&first), &second);
        assert!(Arc::ptr_eq(&parts[1], &second.entries[2].2));
        assert_eq!(delta.base.as_deref(), Some(first.name.as_str()));
        assert_eq!(delta.name, second.name);
        let keys: Vec<&str> = delta.set.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "c"]);
        // Over 64 bytes: named by digest, not inline.
        assert_eq!(delta.set[1].1, second.entries[2].2.sha256);
        assert!(delta.removed.is_empty());
        assert_ne!(first.name, second.name);

        // Back to a context without "a" and "c": they are removed.
        let (back, parts) = change(Some(&second), &first);
        assert!(parts.is_empty());
        assert!(back.set.is_empty());
        assert_eq!(back.removed, ["a", "c"]);
        assert_eq!(encoder.listings.bases().len(), 2);
    }

    #[test]
    fn only_the_newest_few_listings_are_kept_as_bases() {
        let mut encoder = PartEncoder::default();
        let mut context = Context::new(json!(null));
        for i in 0..10 {
            context = with(context, &format!("s{i}"), json!(i));
            encoder.listing(&context);
        }
        let bases = encoder.listings.bases();
        assert_eq!(bases.len(), BASES);
        assert_eq!(bases[0].entries.len(), 10, "newest first");
        assert_eq!(
            bases[0].bytes,
            listing_bytes(bases[0].entries.iter().map(|(_, _, p)| p.json.len()))
        );
    }

    #[test]
    fn a_value_replaced_under_its_key_is_set_again() {
        let mut encoder = PartEncoder::default();
        let before = encoder.listing(&with(Context::new(json!(0)), "loop", json!(1)));
        let after = encoder.listing(&with(Context::new(json!(0)), "loop", json!(2)));
        let (delta, _) = change(Some(&before), &after);
        assert_eq!(delta.set, [("loop".into(), "=2".into())]);
        assert!(delta.removed.is_empty());
    }
}
