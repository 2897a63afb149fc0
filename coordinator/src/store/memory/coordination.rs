//! [`Coordination`] in memory: idempotency keys with their expiry, each coordinator's last
//! advertisement of free slots, and a `ping` that always answers (the state is right here).

use std::collections::BTreeMap;

use super::MemoryStore;
use crate::store::{Claim, Coordination, Error, sum_slots};

/// Free slots per agent a coordinator advertised, and until when.
#[derive(Debug)]
pub(super) struct Advertisement {
    expires_ms: i64,
    free: BTreeMap<String, usize>,
}

impl MemoryStore {
    /// Claims `key` for `run_id` unless a live claim holds it, which `taken_over` may give up
    /// (by its run id and request digest): a reclaim of a voided run's key.
    fn claim_key(
        &self,
        key: &str,
        run_id: &str,
        request_sha256: &str,
        ttl_s: u64,
        taken_over: impl Fn(&str, &str) -> bool,
    ) -> Claim {
        let mut keys = self.keys.lock().expect("keys lock");
        let now = std::time::Instant::now();
        if let Some((held, digest, expires)) = keys.get(key)
            && *expires > now
            && !taken_over(held, digest)
        {
            return Claim::Held {
                run_id: held.clone(),
                request_sha256: digest.clone(),
            };
        }
        keys.insert(
            key.to_owned(),
            (
                run_id.to_owned(),
                request_sha256.to_owned(),
                now + std::time::Duration::from_secs(ttl_s),
            ),
        );
        Claim::Claimed
    }
}

impl Coordination for MemoryStore {
    async fn claim_idempotency_key(
        &self,
        key: &str,
        run_id: &str,
        request_sha256: &str,
        ttl_s: u64,
    ) -> Result<Claim, Error> {
        Ok(self.claim_key(key, run_id, request_sha256, ttl_s, |_, _| false))
    }

    async fn reclaim_idempotency_key(
        &self,
        key: &str,
        voided_run_id: &str,
        run_id: &str,
        request_sha256: &str,
        ttl_s: u64,
    ) -> Result<Claim, Error> {
        Ok(
            self.claim_key(key, run_id, request_sha256, ttl_s, |held, digest| {
                held == voided_run_id && digest == request_sha256
            }),
        )
    }

    async fn advertise_slots(
        &self,
        coordinator: &str,
        free: BTreeMap<String, usize>,
        expires_ms: i64,
    ) -> Result<(), Error> {
        self.slots
            .lock()
            .expect("store lock")
            .insert(coordinator.to_owned(), Advertisement { expires_ms, free });
        Ok(())
    }

    async fn slots_elsewhere(
        &self,
        me: &str,
        now_ms: i64,
    ) -> Result<BTreeMap<String, usize>, Error> {
        let mut slots = self.slots.lock().expect("store lock");
        slots.retain(|_, advertised| advertised.expires_ms > now_ms);
        Ok(sum_slots(
            slots
                .iter()
                .filter(|(coordinator, _)| coordinator.as_str() != me)
                .map(|(_, advertised)| &advertised.free),
        ))
    }

    async fn ping(&self) -> Result<(), Error> {
        Ok(())
    }
}
