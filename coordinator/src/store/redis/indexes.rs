//! The global indexes of the [module docs](super#indexes), which `list_runs`, `active_runs` and
//! `runs_of_workflow` read: a new run's entries written before the script that creates it, the
//! active runs updated after the scripts that change a status, and rebuilt from the run headers
//! when a crash left them behind.

use std::collections::HashSet;

use ::redis::{AsyncCommands, Cmd, RedisError};

use super::replies::unavailable;
use super::{RUNNING, RedisStore};
use crate::store::{Error, RunHeader, Runs, Settled};

/// Which index entries of a new run one call added (those it found there already belong to
/// another call's create of the same id, or to the run itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Indexed {
    runs: bool,
    workflow: bool,
    active: bool,
}

impl Indexed {
    /// Every entry a run may have.
    pub(super) const ALL: Indexed = Indexed {
        runs: true,
        workflow: true,
        active: true,
    };

    /// What the replies of [`RedisStore::index_commands`] say was added (1 each).
    pub(super) fn from_replies(added: &[i64]) -> Indexed {
        Indexed {
            runs: added.first() == Some(&1),
            workflow: added.get(1) == Some(&1),
            active: added.get(2) == Some(&1),
        }
    }

    /// These entries, and those of `other`.
    pub(super) fn and(self, other: Indexed) -> Indexed {
        Indexed {
            runs: self.runs || other.runs,
            workflow: self.workflow || other.workflow,
            active: self.active || other.active,
        }
    }
}

impl RedisStore {
    /// The commands that list a run about to be created, before it is (readers skip an entry
    /// whose run does not exist): `P:runs` and its workflow's runs, and the active runs if its
    /// first status is `running`. `NX`: an entry already there (a run of that id) keeps its
    /// time. Each answers 1 if it added the entry ([`Indexed::from_replies`]).
    pub(super) fn index_commands(&self, header: &RunHeader, status: &str) -> Vec<Cmd> {
        let run_id = header.run_id.as_str();
        let mut writes = vec![
            ::redis::cmd("ZADD")
                .arg(self.runs_key(run_id))
                .arg("NX")
                .arg(header.created_ms)
                .arg(run_id)
                .clone(),
            ::redis::cmd("ZADD")
                .arg(self.workflow_runs_key(&header.workflow_id, run_id))
                .arg("NX")
                .arg(header.created_ms)
                .arg(run_id)
                .clone(),
        ];
        if status == RUNNING {
            writes.push(
                ::redis::cmd("SADD")
                    .arg(self.active_key(run_id))
                    .arg(run_id)
                    .clone(),
            );
        }
        writes
    }

    /// [`RedisStore::index_commands`], sent (one per slot on a cluster); which entries this
    /// call added, for [`RedisStore::unindex`] when the create is refused.
    pub(super) async fn index_new_run(
        &self,
        header: &RunHeader,
        status: &str,
    ) -> Result<Indexed, RedisError> {
        let added: Vec<i64> = self.con.each(self.index_commands(header, status)).await?;
        Ok(Indexed::from_replies(&added))
    }

    /// Removes the entries `added` of a run that does not exist and never will (its create was
    /// refused, or voided). Best effort: an entry left names no run, readers skip it and
    /// `rebuild_indexes` removes it.
    pub(super) async fn unindex(&self, header: &RunHeader, added: Indexed) {
        let run_id = header.run_id.as_str();
        let mut removals = Vec::new();
        if added.runs {
            removals.push(
                ::redis::cmd("ZREM")
                    .arg(self.runs_key(run_id))
                    .arg(run_id)
                    .clone(),
            );
        }
        if added.workflow {
            removals.push(
                ::redis::cmd("ZREM")
                    .arg(self.workflow_runs_key(&header.workflow_id, run_id))
                    .arg(run_id)
                    .clone(),
            );
        }
        if added.active {
            removals.push(
                ::redis::cmd("SREM")
                    .arg(self.active_key(run_id))
                    .arg(run_id)
                    .clone(),
            );
        }
        if removals.is_empty() {
            return;
        }
        if let Err(err) = self.con.each::<i64>(removals).await {
            tracing::warn!(run_id, error = %err, "index entries of a run that was never created are left; rebuild_indexes removes them");
        }
    }

    /// Brings `active_runs`' set in line with a status this store just wrote for `run_id`.
    ///
    /// Two coordinators' updates may arrive out of order (an older "not running" after a newer
    /// "running"), so a removal is followed by a read of the header, and the id goes back if the
    /// run is running again by then: whichever update comes last, the set ends up right.
    pub(super) async fn update_active(&self, run_id: &str, status: &str) -> Result<(), RedisError> {
        let mut con = self.con.clone();
        if status == RUNNING {
            let _: i64 = con.sadd(self.active_key(run_id), run_id).await?;
            return Ok(());
        }
        let _: i64 = con.srem(self.active_key(run_id), run_id).await?;
        let now: Option<Vec<u8>> = con.hget(self.run_keys(run_id).run(), "status").await?;
        if now.as_deref() == Some(RUNNING.as_bytes()) {
            let _: i64 = con.sadd(self.active_key(run_id), run_id).await?;
        }
        Ok(())
    }

    /// Rebuilds the `list_runs` and `active_runs` indexes from the run headers: adds what is
    /// missing, removes ids whose header is gone and fixes each run's active membership. Safe to
    /// run while the store is in use; meant for after a crash between a script and its index
    /// update. Returns how many runs it found.
    pub async fn rebuild_indexes(&self) -> Result<usize, Error> {
        let mut con = self.con.clone();
        let pattern = format!("{}:run:{{*}}", glob_escape(&self.prefix));
        let header_prefix = format!("{}:run:{{", self.prefix);
        let mut found = HashSet::new();
        let keys = self.con.scan(&pattern).await.map_err(unavailable)?;
        for key in keys {
            let Some(run_id) = key
                .strip_prefix(&header_prefix)
                .and_then(|rest| rest.strip_suffix('}'))
            else {
                continue;
            };
            let (created_ms, status, workflow_id): (Option<i64>, Option<String>, Option<String>) =
                con.hmget(&key, &["created_ms", "status", "workflow_id"])
                    .await
                    .map_err(unavailable)?;
            let (Some(created_ms), Some(status)) = (created_ms, status) else {
                continue;
            };
            let _: i64 = con
                .zadd(self.runs_key(run_id), run_id, created_ms)
                .await
                .map_err(unavailable)?;
            let _: i64 = con
                .zadd(
                    self.workflow_runs_key(&workflow_id.unwrap_or_default(), run_id),
                    run_id,
                    created_ms,
                )
                .await
                .map_err(unavailable)?;
            self.update_active(run_id, &status)
                .await
                .map_err(unavailable)?;
            found.insert(run_id.to_owned());
        }
        let mut listed: Vec<String> = Vec::new();
        for key in self.runs_keys() {
            let ids: Vec<String> = con.zrange(key, 0, -1).await.map_err(unavailable)?;
            listed.extend(ids);
        }
        let mut active: Vec<String> = Vec::new();
        for key in self.active_keys() {
            let ids: Vec<String> = con.smembers(key).await.map_err(unavailable)?;
            active.extend(ids);
        }
        for run_id in listed.iter().chain(&active) {
            if found.contains(run_id) {
                continue;
            }
            // An entry is written before its run: one whose run is not there yet may be of a
            // create on its way, so it is settled (the run found, or its id voided) before the
            // entry goes.
            let header = RunHeader {
                run_id: run_id.clone(),
                workflow_id: String::new(),
                workflow: String::new(),
                input: Vec::new(),
                created_ms: 0,
                traceparent: String::new(),
                submitted_by: String::new(),
            };
            if self.settle_create(&header).await? == Settled::NotDone {
                let _: i64 = con
                    .zrem(self.runs_key(run_id), run_id)
                    .await
                    .map_err(unavailable)?;
                let _: i64 = con
                    .srem(self.active_key(run_id), run_id)
                    .await
                    .map_err(unavailable)?;
            }
        }
        Ok(found.len())
    }
}

/// Escapes the glob characters of `SCAN MATCH`.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// How many shards each global index has on a cluster (`P:runs`, `P:runs:active`, each
/// workflow's runs): its entries spread over that many keys, each on a slot of its own and so
/// over the masters, rather than on one master's one key. A run's entry goes to the shard of
/// its own slot (modulo the count); readers merge every shard. On a single server each index is
/// one key, as before.
pub(super) const INDEX_SHARDS: u16 = 256;

impl RedisStore {
    /// The suffix of `run_id`'s shard of a global index: `:{i<n>}` on a cluster, nothing on a
    /// single server.
    pub(super) fn index_shard(&self, run_id: &str) -> String {
        if self.con.is_cluster() {
            format!(":{{i{}}}", super::slots::slot_of_tag(run_id) % INDEX_SHARDS)
        } else {
            String::new()
        }
    }

    /// The suffixes of every shard of a global index.
    pub(super) fn index_shards(&self) -> impl Iterator<Item = String> {
        let shards = if self.con.is_cluster() {
            INDEX_SHARDS
        } else {
            0
        };
        let single = (shards == 0).then(String::new);
        single
            .into_iter()
            .chain((0..shards).map(|n| format!(":{{i{n}}}")))
    }

    /// The newest `limit` members over `keys` (sorted sets scored by creation time): newest
    /// first, equal times in reverse member order, as one sorted set gives them.
    pub(super) async fn newest(
        &self,
        keys: Vec<String>,
        limit: usize,
    ) -> Result<Vec<String>, Error> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let stop = isize::try_from(limit - 1).unwrap_or(isize::MAX);
        let reads = keys
            .into_iter()
            .map(|key| {
                let mut cmd = ::redis::cmd("ZREVRANGE");
                cmd.arg(key).arg(0).arg(stop).arg("WITHSCORES");
                cmd
            })
            .collect();
        let shards: Vec<Vec<(String, f64)>> = self.con.each(reads).await.map_err(unavailable)?;
        let mut all: Vec<(String, f64)> = shards.into_iter().flatten().collect();
        all.sort_by(|(a, a_at), (b, b_at)| b_at.total_cmp(a_at).then_with(|| b.cmp(a)));
        all.truncate(limit);
        Ok(all.into_iter().map(|(id, _)| id).collect())
    }
}
