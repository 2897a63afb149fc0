//! What the coordinators share besides runs: the [`Coordination`] trait, who holds an
//! idempotency key ([`Claim`]), and free worker slots summed over coordinators.

use std::collections::BTreeMap;

use super::Error;
use super::declare::store_trait;

store_trait! {
    /// What the coordinators sharing a store tell each other besides runs: SubmitRun's
    /// idempotency keys, the free worker slots each advertises, and whether the store takes
    /// writes at all (`ping`, readiness).
    pub trait Coordination {
        /// Atomically sets the key to `(run_id, request_sha256)` for `ttl_s` seconds if it is
        /// free, and otherwise returns what it holds (never changing it).
        async fn claim_idempotency_key(
            &self,
            key: &str,
            run_id: &str,
            request_sha256: &str,
            ttl_s: u64,
        ) -> Result<Claim, Error>;

        /// Sets the key to `(run_id, request_sha256)` for `ttl_s` seconds only if it holds
        /// `(voided_run_id, request_sha256)` or nothing (`Claimed`), and otherwise returns what
        /// it holds: a key whose run was voided names a new one.
        async fn reclaim_idempotency_key(
            &self,
            key: &str,
            voided_run_id: &str,
            run_id: &str,
            request_sha256: &str,
            ttl_s: u64,
        ) -> Result<Claim, Error>;

        /// Replaces what `coordinator` said before about its workers' free slots per agent,
        /// until `expires_ms`.
        async fn advertise_slots(
            &self,
            coordinator: &str,
            free: BTreeMap<String, usize>,
            expires_ms: i64,
        ) -> Result<(), Error>;

        /// Sums, per agent, what the coordinators other than `me` advertised that has not
        /// expired at `now_ms` (expired advertisements are ignored, and may be removed).
        async fn slots_elsewhere(
            &self,
            me: &str,
            now_ms: i64,
        ) -> Result<BTreeMap<String, usize>, Error>;

        /// Makes one round trip to where the state lives, with a write (a small key that
        /// expires), and fails if it does not answer or refuses writes (a Redis out of memory,
        /// whose reads still work: only a write tells), naming why: a coordinator is ready for
        /// work only while it passes.
        async fn ping(&self) -> Result<(), Error>;
    }
}

/// Who holds an idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key was free and now names the run id given.
    Claimed,
    /// The key already names a run, submitted with a request of this digest.
    Held {
        run_id: String,
        request_sha256: String,
    },
}

/// Free slots per agent, summed over several coordinators' advertisements.
pub(crate) fn sum_slots<'a>(
    advertised: impl IntoIterator<Item = &'a BTreeMap<String, usize>>,
) -> BTreeMap<String, usize> {
    let mut sum = BTreeMap::new();
    for free in advertised {
        for (agent, slots) in free {
            *sum.entry(agent.clone()).or_default() += slots;
        }
    }
    sum
}
