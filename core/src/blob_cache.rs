//! The bookkeeping of a worker's bounded cache of payload parts, shared by both ends.
//!
//! A worker keeps the parts (result JSON, by SHA-256) of recent payloads so the coordinator need
//! not send them again. Rather than have the worker report what it holds, both ends run this
//! same deterministic least-recently-used policy over the same sequence of touches (the tasks of
//! one stream, in the order they were sent): the coordinator's copy then says exactly what the
//! worker holds, and a task carries the bytes of just the parts missing from it. Both start
//! empty with each new stream.
//!
//! The policy only ever evicts the least recently used part, and only while over a limit, so
//! what it holds is always the longest run of most recently used parts that fits the limits.
//! Hence a cache with tighter limits holds a subset of what one with looser limits holds, over
//! the same touches: the coordinator may clamp its copy (it does, so that a worker cannot make it
//! keep unbounded bookkeeping) and still never believes the worker holds a part it does not.

use std::collections::{BTreeMap, HashMap};

/// Which parts are held, within a byte budget, evicting the least recently used.
#[derive(Debug, Clone)]
pub struct BlobLru {
    budget: u64,
    max_entries: usize,
    used: u64,
    clock: u64,
    /// digest -> (last touch, size)
    entries: HashMap<String, (u64, u64)>,
    /// last touch -> digest, oldest first
    order: BTreeMap<u64, String>,
}

impl BlobLru {
    /// An empty cache of at most `budget` bytes; 0 holds nothing.
    pub fn new(budget: u64) -> Self {
        Self::with_max_entries(budget, usize::MAX)
    }

    /// An empty cache of at most `budget` bytes and `max_entries` parts.
    pub fn with_max_entries(budget: u64, max_entries: usize) -> Self {
        Self {
            budget,
            max_entries,
            used: 0,
            clock: 0,
            entries: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    pub fn contains(&self, digest: &str) -> bool {
        self.entries.contains_key(digest)
    }

    /// Bytes held.
    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Marks `digest` (of `size` bytes) as just used, adding it if absent, then evicts the
    /// least recently used parts until the budget holds. Returns the evicted digests, which may
    /// include `digest` itself when it alone is larger than the budget.
    pub fn touch(&mut self, digest: &str, size: u64) -> Vec<String> {
        self.clock += 1;
        let name = match self.entries.get_mut(digest) {
            Some((last, _)) => {
                let name = self
                    .order
                    .remove(last)
                    .expect("every entry has a place in the order");
                *last = self.clock;
                name
            }
            None => {
                self.entries.insert(digest.to_owned(), (self.clock, size));
                self.used += size;
                digest.to_owned()
            }
        };
        self.order.insert(self.clock, name);
        let mut evicted = Vec::new();
        while self.used > self.budget || self.entries.len() > self.max_entries {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some((_, size)) = self.entries.remove(&oldest) {
                self.used -= size;
            }
            evicted.push(oldest);
        }
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used_first() {
        let mut cache = BlobLru::new(30);
        assert!(cache.touch("a", 10).is_empty());
        assert!(cache.touch("b", 10).is_empty());
        assert!(cache.touch("c", 10).is_empty());
        // "a" used again, so "b" is now the oldest.
        assert!(cache.touch("a", 10).is_empty());
        assert_eq!(cache.touch("d", 10), ["b"]);
        assert!(cache.contains("a") && cache.contains("c") && cache.contains("d"));
        assert!(!cache.contains("b"));
        assert_eq!(cache.used(), 30);
    }

    #[test]
    fn a_part_larger_than_the_budget_is_not_kept() {
        let mut cache = BlobLru::new(30);
        cache.touch("a", 10);
        assert_eq!(cache.touch("huge", 50), ["a", "huge"]);
        assert!(cache.is_empty());
        assert_eq!(cache.used(), 0);
    }

    #[test]
    fn tighter_limits_hold_a_subset_of_looser_ones() {
        let mut loose = BlobLru::new(100);
        let mut tight = BlobLru::with_max_entries(60, 2);
        let touches = [
            ("a", 30),
            ("b", 5),
            ("c", 50),
            ("a", 30),
            ("d", 10),
            ("b", 5),
            ("e", 40),
            ("c", 50),
            ("a", 30),
        ];
        for (i, (digest, size)) in touches.into_iter().enumerate() {
            loose.touch(digest, size);
            tight.touch(digest, size);
            assert!(tight.len() <= 2 && tight.used() <= 60);
            for held in tight.order.values() {
                assert!(loose.contains(held), "{held} after touch {i}");
            }
        }
    }

    #[test]
    fn a_zero_budget_keeps_nothing() {
        let mut cache = BlobLru::new(0);
        assert_eq!(cache.touch("a", 1), ["a"]);
        assert!(!cache.contains("a"));
    }
}
