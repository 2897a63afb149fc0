//! [`Listing`] on Redis. `list_runs` on the indexes: a page of runs walked from `P:runs` (or a workflow's runs) from
//! a cursor, their statuses read from the run headers; the running ones from `P:runs:active`.
//!
//! On a cluster each index is [`INDEX_SHARDS`](super::indexes::INDEX_SHARDS) sorted sets, and a
//! walk merges them as `newest` does, each shard read from its own position. A shard is read a
//! few entries at a time and only again once the walk has used what it read, so a page costs
//! about one round of reads, not one per entry.

use std::collections::{BTreeMap, VecDeque};

use ::redis::{Cmd, Value};
use baton_core::RunStatus;

use super::RedisStore;
use super::replies::{fields, script_error, unavailable};
use crate::store::query::{PageFill, run_status};
use crate::store::{Error, Listing, RunCursor, RunPage, RunQuery, RunSummary};

/// How many entries a batch of a status-filtered walk reads at least (a page of 10 over runs
/// that mostly do not match would otherwise read them 10 at a time).
const FILTERED_BATCH: usize = 200;

/// How many entries a cluster shard is read for at least, beyond its share of what the walk
/// wants: a shard whose buffer runs dry costs the walk another round trip.
const SHARD_READ_MIN: usize = 16;

/// How many entries one read of a shard asks for at most: a walk that wants more reads again
/// (and Redis takes no range beyond a signed 64-bit number).
const SHARD_READ_MAX: usize = 5_000;

impl Listing for RedisStore {
    async fn list_runs(&self, query: RunQuery) -> Result<RunPage, Error> {
        self.read_retrying(|| self.list_page(&query)).await
    }

    async fn active_runs(&self) -> Result<Vec<String>, Error> {
        self.read_retrying(|| async {
            let reads = self
                .active_keys()
                .into_iter()
                .map(|key| {
                    let mut cmd = ::redis::cmd("SMEMBERS");
                    cmd.arg(key);
                    cmd
                })
                .collect();
            let shards: Vec<Vec<String>> = self.con.each(reads).await.map_err(unavailable)?;
            let mut ids: Vec<String> = shards.into_iter().flatten().collect();
            if ids.is_empty() {
                return Ok(ids);
            }
            let mut running = self.running(&ids).await?.into_iter();
            ids.retain(|_| running.next().unwrap_or(false));
            ids.sort();
            Ok(ids)
        })
        .await
    }

    async fn decisions(&self, run_id: &str) -> Result<BTreeMap<String, Vec<u8>>, Error> {
        self.read_retrying(|| async {
            let mut con = self.con.clone();
            let reply: Value = ::redis::cmd("HGETALL")
                .arg(self.run_keys(run_id).decisions())
                .query_async(&mut con)
                .await
                .map_err(|err| script_error(err, run_id, 0))?;
            fields(run_id, "decisions", reply)
        })
        .await
    }

    async fn runs_of_workflow(
        &self,
        workflow_id: &str,
        limit: usize,
    ) -> Result<Vec<String>, Error> {
        self.newest(self.workflow_runs_keys(workflow_id), limit)
            .await
    }
}

impl RedisStore {
    /// One page of `query` ([`Listing::list_runs`]).
    pub(super) async fn list_page(&self, query: &RunQuery) -> Result<RunPage, Error> {
        if query.limit == 0 {
            return Ok(RunPage::default());
        }
        if query.status == Some(RunStatus::Running) && self.can_intersect(query) {
            return self.running_page(query).await;
        }
        let mut walk = IndexWalk::new(self.index_keys(query), query.after.clone());
        let mut fill = PageFill::new(query, true);
        let mut left_in_batch = false;
        'batches: while fill.wants_more() {
            let batch = walk.next(self, fill.batch_size(FILTERED_BATCH)).await?;
            if batch.is_empty() {
                break;
            }
            let runs = self.summaries(&batch).await?;
            let mut entries = batch.into_iter().zip(runs);
            while fill.wants_more() {
                let Some((position, run)) = entries.next() else {
                    continue 'batches;
                };
                fill.offer(position, run);
            }
            left_in_batch = entries.next().is_some();
        }
        let more = left_in_batch || walk.has_more(self).await?;
        Ok(fill.finish(more))
    }

    /// The running runs of `query`: the active-runs set is not ordered, so each shard of it is
    /// intersected with the same shard of the ordered index (`ZINTER` weighs the set's score
    /// 0, so each run keeps its creation time), then merged and cut here. That reads every
    /// running run of the index, however far the page is: running runs are bounded by the
    /// workers' capacity, and unlike finished ones they do not pile up. Redis walks the
    /// smaller of the two sets, so a workflow with few runs is cheap whatever else runs.
    async fn running_page(&self, query: &RunQuery) -> Result<RunPage, Error> {
        let reads = self
            .index_keys(query)
            .into_iter()
            .zip(self.active_keys())
            .map(|(ordered, active)| {
                let mut cmd = ::redis::cmd("ZINTER");
                cmd.arg(2)
                    .arg(ordered)
                    .arg(active)
                    .arg("WEIGHTS")
                    .arg(1)
                    .arg(0)
                    .arg("WITHSCORES");
                cmd
            })
            .collect();
        let shards: Vec<Vec<(String, f64)>> = self.con.each(reads).await.map_err(unavailable)?;
        let mut running: Vec<RunCursor> = shards
            .into_iter()
            .flatten()
            .map(position)
            .filter(|position| position.is_after(query.after.as_ref()))
            .collect();
        running.sort_unstable_by(|a, b| b.cmp(a));

        // The set may lag a status change: each run's own status decides.
        let mut fill = PageFill::new(query, false);
        let mut rest = running.into_iter().peekable();
        while fill.wants_more() && rest.peek().is_some() {
            let batch: Vec<RunCursor> = rest.by_ref().take(fill.batch_size(0)).collect();
            let runs = self.summaries(&batch).await?;
            for (position, run) in batch.into_iter().zip(runs) {
                fill.offer(position, run);
            }
        }
        Ok(fill.finish(rest.peek().is_some()))
    }

    /// Whether the ordered index of `query` shares each shard's slot with the active-runs
    /// index, as `ZINTER` needs on a cluster: always, but for a workflow id with a `{`, which
    /// would make the hash tag of its index keys.
    fn can_intersect(&self, query: &RunQuery) -> bool {
        !self.con.is_cluster()
            || query
                .workflow_id
                .as_ref()
                .is_none_or(|workflow_id| !workflow_id.contains('{'))
    }

    /// The shards of the index `query` walks: its workflow's runs, or all runs.
    fn index_keys(&self, query: &RunQuery) -> Vec<String> {
        match &query.workflow_id {
            Some(workflow_id) => self.workflow_runs_keys(workflow_id),
            None => self.runs_keys(),
        }
    }

    /// Each run's summary from its header, in one round trip (concurrent reads on a cluster);
    /// `None` for a run whose header is gone (the index is behind the runs).
    async fn summaries(&self, positions: &[RunCursor]) -> Result<Vec<Option<RunSummary>>, Error> {
        let reads = positions
            .iter()
            .map(|position| {
                let mut cmd = ::redis::cmd("HMGET");
                cmd.arg(self.run_keys(&position.run_id).run())
                    .arg("workflow_id")
                    .arg("status")
                    .arg("created_ms")
                    .arg("updated_ms");
                cmd
            })
            .collect();
        type Fields = (Option<String>, Option<String>, Option<i64>, Option<i64>);
        let rows: Vec<Fields> = self.con.each(reads).await.map_err(unavailable)?;
        Ok(positions
            .iter()
            .zip(rows)
            .map(|(position, row)| match row {
                (Some(workflow_id), Some(status), Some(created_ms), Some(updated_ms)) => {
                    let Some(status) = run_status(&status) else {
                        tracing::warn!(run_id = %position.run_id, status, "a run's stored status is not a run status: not listed");
                        return None;
                    };
                    Some(RunSummary {
                        run_id: position.run_id.clone(),
                        workflow_id,
                        status,
                        created_ms,
                        updated_ms,
                    })
                }
                _ => None,
            })
            .collect())
    }
}

/// An index entry as a position: scores are creation times, whole milliseconds (exact in a
/// double up to 2^53 ms, some 285,000 years).
fn position((run_id, score): (String, f64)) -> RunCursor {
    RunCursor {
        created_ms: score as i64,
        run_id,
    }
}

/// A walk over one index's shards, newest first, from a cursor: a k-way merge of what each
/// shard read, each shard read again only when the walk has used what it had.
struct IndexWalk {
    shards: Vec<Shard>,
}

struct Shard {
    key: String,
    /// The last entry read from this shard (the walk's cursor before the first read): the
    /// next read starts after it.
    after: Option<RunCursor>,
    /// Read and not yet taken by the walk, newest first.
    buffered: VecDeque<RunCursor>,
    /// The shard has nothing after `after`.
    exhausted: bool,
}

impl Shard {
    fn needs_read(&self) -> bool {
        self.buffered.is_empty() && !self.exhausted
    }

    /// The commands that read up to `count` entries after `self.after`: sorted-set order is
    /// the list's reversed, but a cursor's ties (its time, smaller run ids) cannot be cut by
    /// score, so they are read whole (runs created in the same millisecond) and cut here, then
    /// the older entries after them.
    fn reads(&self, count: usize) -> Vec<Cmd> {
        let Some(after) = &self.after else {
            let mut cmd = ::redis::cmd("ZREVRANGE");
            cmd.arg(&self.key)
                .arg(0)
                .arg(count.saturating_sub(1))
                .arg("WITHSCORES");
            return vec![cmd];
        };
        let mut ties = ::redis::cmd("ZREVRANGEBYSCORE");
        ties.arg(&self.key)
            .arg(after.created_ms)
            .arg(after.created_ms)
            .arg("WITHSCORES");
        let mut older = ::redis::cmd("ZREVRANGEBYSCORE");
        older
            .arg(&self.key)
            .arg(format!("({}", after.created_ms))
            .arg("-inf")
            .arg("WITHSCORES")
            .arg("LIMIT")
            .arg(0)
            .arg(count);
        vec![ties, older]
    }

    /// Takes the replies of [`Shard::reads`] for `count` entries.
    fn take(&mut self, count: usize, replies: Vec<Vec<(String, f64)>>) {
        let read: Vec<RunCursor> = replies
            .into_iter()
            .flatten()
            .map(position)
            .filter(|entry| entry.is_after(self.after.as_ref()))
            .take(count)
            .collect();
        // Fewer than asked for: the shard has nothing more. Exactly as many: it may.
        self.exhausted = read.len() < count;
        if let Some(last) = read.last() {
            self.after = Some(last.clone());
        }
        self.buffered.extend(read);
    }
}

impl IndexWalk {
    fn new(keys: Vec<String>, after: Option<RunCursor>) -> IndexWalk {
        let shards = keys
            .into_iter()
            .map(|key| Shard {
                key,
                after: after.clone(),
                buffered: VecDeque::new(),
                exhausted: false,
            })
            .collect();
        IndexWalk { shards }
    }

    /// The next `count` entries of the index, fewer only at its end.
    async fn next(&mut self, store: &RedisStore, count: usize) -> Result<Vec<RunCursor>, Error> {
        let mut entries = Vec::with_capacity(count.min(1024));
        while entries.len() < count {
            self.read(store, count - entries.len()).await?;
            // Merge until a shard that may hold the next entry has nothing read.
            while entries.len() < count && !self.shards.iter().any(Shard::needs_read) {
                let newest = self
                    .shards
                    .iter_mut()
                    .filter(|shard| !shard.buffered.is_empty())
                    .max_by(|a, b| a.buffered[0].cmp(&b.buffered[0]));
                let Some(shard) = newest else {
                    return Ok(entries);
                };
                entries.extend(shard.buffered.pop_front());
            }
        }
        Ok(entries)
    }

    /// Whether the index holds entries after the last one [`IndexWalk::next`] gave.
    async fn has_more(&mut self, store: &RedisStore) -> Result<bool, Error> {
        self.read(store, 1).await?;
        Ok(self.shards.iter().any(|shard| !shard.buffered.is_empty()))
    }

    /// Reads each shard that has nothing buffered and may have more, in one round: on one
    /// server `wanted` entries and one more (so that the end is seen without another read);
    /// on a cluster a shard's share of them, generously.
    async fn read(&mut self, store: &RedisStore, wanted: usize) -> Result<(), Error> {
        let count = match self.shards.len() {
            1 => wanted.saturating_add(1),
            shards => (2 * wanted.div_ceil(shards))
                .max(SHARD_READ_MIN)
                .min(wanted.saturating_add(1)),
        }
        .min(SHARD_READ_MAX);
        let reading: Vec<usize> = (0..self.shards.len())
            .filter(|&i| self.shards[i].needs_read())
            .collect();
        if reading.is_empty() {
            return Ok(());
        }
        let mut commands = Vec::new();
        let mut per_shard = Vec::new();
        for &i in &reading {
            let reads = self.shards[i].reads(count);
            per_shard.push(reads.len());
            commands.extend(reads);
        }
        let mut replies: std::vec::IntoIter<Vec<(String, f64)>> = store
            .con
            .each(commands)
            .await
            .map_err(unavailable)?
            .into_iter();
        for (&i, n) in reading.iter().zip(per_shard) {
            let shard_replies = replies.by_ref().take(n).collect();
            self.shards[i].take(count, shard_replies);
        }
        Ok(())
    }
}
