//! Redis Cluster's hash slots, as the store needs them: the slot of a run, and a hash tag that
//! lands on a given slot, so that a key which is not the run's (its timer sets) can still share
//! the run's slot and be written by the run's scripts.

use std::sync::LazyLock;

/// A cluster's number of hash slots: fixed by Redis, not by Baton.
pub(super) const SLOTS: u16 = 16384;

/// The slot of a key whose hash tag is `tag`: CRC16 (XMODEM) of the tag, modulo [`SLOTS`], as
/// Redis Cluster computes it.
pub(super) fn slot_of_tag(tag: &str) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % SLOTS
}

/// A short hash tag that lands on `slot` (the same one every time, in every process).
pub(super) fn tag_of_slot(slot: u16) -> &'static str {
    TAGS[usize::from(slot % SLOTS)].as_str()
}

/// For each slot, the first of the base-36 numerals 0, 1, 2, ... that lands on it. About
/// 160,000 CRCs fill all 16,384 (a coupon collector's count), a few milliseconds once.
static TAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut tags = vec![String::new(); usize::from(SLOTS)];
    let mut missing = usize::from(SLOTS);
    let mut n: u64 = 0;
    while missing > 0 {
        let tag = base36(n);
        let slot = usize::from(slot_of_tag(&tag));
        if tags[slot].is_empty() {
            tags[slot] = tag;
            missing -= 1;
        }
        n += 1;
    }
    tags
});

fn base36(mut n: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut digits = Vec::new();
    loop {
        digits.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    digits.reverse();
    String::from_utf8(digits).expect("ASCII digits")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_s() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot_of_tag("123456789"), 0x31C3 % SLOTS);
        assert_eq!(slot_of_tag("foo"), 12182);
        assert_eq!(slot_of_tag("bar"), 5061);
        assert_eq!(slot_of_tag(""), 0);
    }

    #[test]
    fn every_slot_has_a_tag_that_lands_on_it() {
        for slot in 0..SLOTS {
            let tag = tag_of_slot(slot);
            assert!(!tag.is_empty() && !tag.contains(['{', '}']));
            assert_eq!(slot_of_tag(tag), slot, "tag {tag:?}");
        }
    }
}
