//! The big-integer target: JSON text scanned for integer literals beyond 64 bits, as every
//! input, result and workflow is, checked against what serde_json reads of the same text.

use serde_json::Value;

use crate::big_integers::{big_integers, first_big_integer};

/// JSON text scanned for integer literals beyond 64 bits ([`crate::big_integers`]).
///
/// Invariants: every literal found is an integer that fits in no 64-bit integer and its path
/// starts at `$`; text serde_json reads holds one exactly when the scan of it, guarded by the
/// value read, finds one, and the value at that path is the float it was rounded to.
pub fn big_integers_in(data: &[u8]) {
    for found in big_integers(data).take(1_000) {
        let digits = found.literal.strip_prefix('-').unwrap_or(found.literal);
        assert!(digits.bytes().all(|b| b.is_ascii_digit()), "{found:?}");
        assert!(
            found.literal.parse::<i64>().is_err() && found.literal.parse::<u64>().is_err(),
            "{found:?}"
        );
        assert!(found.path.starts_with('$'), "{found:?}");
        let _ = found.problem();
    }
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    // With a key repeated, the value keeps the last member, so a literal of an earlier one
    // may be gone from it (and nothing was rounded that anyone reads).
    if serde_json::from_slice::<UniqueKeys>(data).is_err() {
        return;
    }
    // The guard (no float in the value, so no scan) skips nothing the scan would find.
    assert_eq!(first_big_integer(data, &value), big_integers(data).next());
}

/// JSON whose objects repeat no key; reading anything else fails.
struct UniqueKeys;

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueKeysVisitor)
    }
}

struct UniqueKeysVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueKeysVisitor {
    type Value = UniqueKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON without repeated keys")
    }

    fn visit_bool<E>(self, _: bool) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_i64<E>(self, _: i64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_u64<E>(self, _: u64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_f64<E>(self, _: f64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_str<E>(self, _: &str) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_unit<E>(self) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueKeys, A::Error> {
        while seq.next_element::<UniqueKeys>()?.is_some() {}
        Ok(UniqueKeys)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<UniqueKeys, A::Error> {
        let mut keys = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !keys.insert(key) {
                return Err(serde::de::Error::custom("a repeated key"));
            }
            map.next_value::<UniqueKeys>()?;
        }
        Ok(UniqueKeys)
    }
}
