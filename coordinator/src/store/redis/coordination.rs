//! [`Coordination`] on Redis: idempotency keys (`SET NX`, and a script to reclaim a voided
//! run's), the free slots hash `P:slots`, and `ping`, a write to each master.

use std::collections::{BTreeMap, HashMap};

use ::redis::{AsyncCommands, FromRedisValue, Value};

use super::RedisStore;
use super::replies::unavailable;
use super::scripts::RECLAIM_KEY;
use crate::store::{Claim, Coordination, Error};

impl Coordination for RedisStore {
    async fn claim_idempotency_key(
        &self,
        key: &str,
        run_id: &str,
        request_sha256: &str,
        ttl_s: u64,
    ) -> Result<Claim, Error> {
        let mut con = self.con.clone();
        let redis_key = self.idempotency_key(key);
        let value = format!("{run_id} {request_sha256}");
        // SET NX, else GET; a key that expires between the two is claimed on the next try.
        for _ in 0..3 {
            let set: Option<String> = ::redis::cmd("SET")
                .arg(&redis_key)
                .arg(&value)
                .arg("NX")
                .arg("EX")
                .arg(ttl_s.max(1))
                .query_async(&mut con)
                .await
                .map_err(unavailable)?;
            if set.is_some() {
                return Ok(Claim::Claimed);
            }
            let held: Option<String> = con.get(&redis_key).await.map_err(unavailable)?;
            if let Some(held) = held {
                let (run_id, request_sha256) = held.split_once(' ').ok_or_else(|| {
                    Error::Corrupt(format!("idempotency key {key:?} holds {held:?}"))
                })?;
                return Ok(Claim::Held {
                    run_id: run_id.to_owned(),
                    request_sha256: request_sha256.to_owned(),
                });
            }
        }
        Err(Error::Unavailable(format!(
            "idempotency key {key:?} kept expiring while it was claimed"
        )))
    }

    async fn reclaim_idempotency_key(
        &self,
        key: &str,
        voided_run_id: &str,
        run_id: &str,
        request_sha256: &str,
        ttl_s: u64,
    ) -> Result<Claim, Error> {
        let mut con = self.con.clone();
        let reply: Value = RECLAIM_KEY
            .key(self.idempotency_key(key))
            .arg(format!("{voided_run_id} {request_sha256}"))
            .arg(format!("{run_id} {request_sha256}"))
            .arg(ttl_s.max(1))
            .invoke_async(&mut con)
            .await
            .map_err(unavailable)?;
        let held: String = match reply {
            Value::Int(1) => return Ok(Claim::Claimed),
            other => FromRedisValue::from_redis_value(other)
                .map_err(|err| Error::Corrupt(format!("idempotency key {key:?}: {err}")))?,
        };
        let (run_id, request_sha256) = held
            .split_once(' ')
            .ok_or_else(|| Error::Corrupt(format!("idempotency key {key:?} holds {held:?}")))?;
        Ok(Claim::Held {
            run_id: run_id.to_owned(),
            request_sha256: request_sha256.to_owned(),
        })
    }

    async fn advertise_slots(
        &self,
        coordinator: &str,
        free: BTreeMap<String, usize>,
        expires_ms: i64,
    ) -> Result<(), Error> {
        let advertisement = serde_json::json!({"expires_ms": expires_ms, "free": free});
        let mut con = self.con.clone();
        let _: i64 = con
            .hset(self.slots_key(), coordinator, advertisement.to_string())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// Expired advertisements (of coordinators that stopped) are removed on the way.
    async fn slots_elsewhere(
        &self,
        me: &str,
        now_ms: i64,
    ) -> Result<BTreeMap<String, usize>, Error> {
        #[derive(serde::Deserialize)]
        struct Advertisement {
            expires_ms: i64,
            free: BTreeMap<String, usize>,
        }
        let mut con = self.con.clone();
        let all: HashMap<String, String> =
            con.hgetall(self.slots_key()).await.map_err(unavailable)?;
        let mut live = Vec::new();
        let mut expired = Vec::new();
        for (coordinator, text) in all {
            match serde_json::from_str::<Advertisement>(&text) {
                Ok(ad) if ad.expires_ms > now_ms => {
                    if coordinator != me {
                        live.push(ad.free);
                    }
                }
                _ => expired.push(coordinator),
            }
        }
        if !expired.is_empty() {
            let _: i64 = con
                .hdel(self.slots_key(), &expired)
                .await
                .map_err(unavailable)?;
        }
        Ok(crate::store::sum_slots(&live))
    }

    /// A write, not a `PING`: a Redis out of memory answers `PING` and every read, and refuses
    /// every write. On a cluster, one write to each master (the key of a slot it serves), since
    /// any of them may be the one that is full. Not retried: readiness wants to know whether
    /// Redis takes writes now.
    async fn ping(&self) -> Result<(), Error> {
        let slots = if self.con.is_cluster() {
            self.con
                .master_slots()
                .await
                .map_err(unavailable)?
                .into_iter()
                .map(Some)
                .collect()
        } else {
            vec![None]
        };
        let probes = slots
            .into_iter()
            .map(|slot| {
                let mut cmd = ::redis::cmd("SET");
                cmd.arg(self.probe_key(slot))
                    .arg(1)
                    .arg("PX")
                    .arg(PROBE_TTL_MS);
                cmd
            })
            .collect();
        let _: Vec<String> = self.con.each(probes).await.map_err(unavailable)?;
        Ok(())
    }
}

/// How long a readiness probe's key (`P:ready`) is kept: it is never read, only written.
const PROBE_TTL_MS: u64 = 60_000;
