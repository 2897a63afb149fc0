//! Timers on a Redis Cluster: a timer set per agent *and slot*, and a registry of the slots
//! that hold some, so that a sweep reads the slots with due work and nothing else.
//!
//! # Why per slot
//! A task and its timer are written by one script (a task without its timer would never be
//! swept), and a script touches one slot. So a run's timers live on the run's slot: the timer set
//! of agent `A` for slot `s` is `P:timers:{<tag of s>}:A`, where the tag is a short string that
//! lands on `s` (`slots.rs`). The slot count is Redis's 16,384, whatever the number of masters:
//! nothing is fixed at install, and resharding moves a slot's timers with its runs.
//!
//! # The registry
//! Reading 16,384 sets per agent per sweep would cost far more than the work it finds, so each
//! agent has a registry on its own slot: `P:timer-slots:{t:A}`, a sorted set of slot -> a score
//! that is at most the slot's earliest timer, and `P:timer-slots:{t:A}:gen`, a hash of slot ->
//! a generation. A sweep reads only the slots whose score is due ([`RedisStore::cluster_due_tasks`]).
//!
//! - Registering: when a script writes timers of `A` in slot `s`, the store lowers `s`'s score
//!   to the earliest of them and bumps its generation (`register_timers.lua`). The registry is
//!   on another slot, so this is another command, sent twice: *with* the script (at once, so that
//!   a coordinator killed before the script's answer came has registered what it wrote all the
//!   same) and *after* it (a sweep that read the slot between the first registration and the
//!   script did not see the timer and may raise the slot past it; the second registration's
//!   generation makes it keep the lower score). A script refused, or whose answer was lost (a
//!   timeout while a master fails over) and that may have been applied, leaves its slot
//!   registered for nothing, which costs a sweep one read.
//! - Raising: a sweep reads a slot's generation, then the slot, then sets the score to the slot's
//!   earliest timer (or drops the slot when it has none) *only if the generation is unchanged*
//!   (`raise_slots.lua`). A registration in between means the sweep may have missed a timer, and
//!   the lower score stays. A slot found empty is dropped only when found empty again 2 s later
//!   (a master restarted without its data answers for its old slots for a moment).
//! - Repair: a coordinator that dies between sending its first registration and its script, or
//!   whose first registration a sweep raised before the script landed and that dies before the
//!   second, leaves a timer unregistered. Every store re-registers each agent's slots from the timer sets themselves
//!   when it first sweeps that agent and every [`REPAIR_EVERY`] after: 16,384 reads per agent,
//!   in the background; and [`REPAIR_RETRY`] after one of its own registrations (or repairs)
//!   failed, as they do while a master fails over. Until then that timer is late, never lost.
//!
//! On a single server none of this exists: one timer set per agent, `P:timers:A`, as before.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::RedisStore;
use super::replies::unavailable;
use super::scripts::{DUE_SLOTS, DUE_TASKS, RAISE_SLOTS, REGISTER_TIMERS, eval, evalsha};
use super::slots::{SLOTS, slot_of_tag, tag_of_slot};
use crate::store::{DueTask, Error};

/// How often a store re-registers an agent's slots from the timer sets (see the module docs).
pub(super) const REPAIR_EVERY: Duration = Duration::from_secs(300);

/// How long after a sweep first found a registered slot empty it looks again before the slot
/// leaves the registry.
const EMPTY_CONFIRM: Duration = Duration::from_secs(2);

/// How soon after a failed registration or repair the next repair comes.
const REPAIR_RETRY: Duration = Duration::from_secs(2);

/// How many due slots one sweep of an agent considers at most.
const DUE_SLOTS_READ: usize = 512;

/// How many slots a sweep reads at once.
const SLOTS_AT_ONCE: usize = 16;

/// A timer as the scripts see it: a task with a string `agent` and an integral `due_ms`.
#[derive(serde::Deserialize)]
struct Timed {
    agent: Option<serde_json::Value>,
    due_ms: Option<serde_json::Value>,
}

/// The agent and due time of the timer a task stored as `bytes` has, if any (the rule of
/// `set_timer` in `transition.lua`).
fn timer_of(bytes: &[u8]) -> Option<(String, i64)> {
    let timed: Timed = serde_json::from_slice(bytes).ok()?;
    let agent = timed.agent?.as_str()?.to_owned();
    let due = timed.due_ms?;
    let due = match due.as_i64() {
        Some(due) => due,
        None => {
            let float = due.as_f64()?;
            if float.fract() != 0.0 {
                return None;
            }
            float as i64
        }
    };
    Some((agent, due))
}

impl RedisStore {
    /// Where the timer sets of `run_id`'s tasks are: `P:timers:` + agent on a single server;
    /// on a cluster `P:timers:{<tag of the run's slot>}:` + agent, on the run's own slot.
    pub(super) fn timer_prefix_of(&self, run_id: &str) -> std::borrow::Cow<'_, str> {
        if self.con.is_cluster() {
            self.slot_timer_prefix(slot_of_tag(run_id)).into()
        } else {
            self.timer_prefix().into()
        }
    }

    fn slot_timer_prefix(&self, slot: u16) -> String {
        format!("{}:timers:{{{}}}:", self.prefix, tag_of_slot(slot))
    }

    /// The slot registry of `agent` and its generations, on one slot of their own.
    fn registry_keys(&self, agent: &str) -> (String, String) {
        let registry = format!("{}:timer-slots:{{t:{agent}}}", self.prefix);
        let generations = format!("{registry}:gen");
        (registry, generations)
    }

    /// On a cluster, files the slots of the timers just written (`run_id`, task bytes) in their
    /// agents' registries. A failure is logged, not returned: the write it follows is done, and
    /// the next repair registers what it missed.
    pub(super) async fn register_timers<'a>(
        &self,
        written: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) {
        if !self.con.is_cluster() {
            return;
        }
        let mut earliest: BTreeMap<String, BTreeMap<u16, i64>> = BTreeMap::new();
        for (run_id, bytes) in written {
            if let Some((agent, due)) = timer_of(bytes) {
                let slot = slot_of_tag(run_id);
                let per_slot = earliest.entry(agent).or_default();
                let due_here = per_slot.entry(slot).or_insert(due);
                *due_here = (*due_here).min(due);
            }
        }
        for (agent, slots) in earliest {
            if let Err(error) = self.register(&agent, slots.into_iter()).await {
                tracing::warn!(%agent, %error, "timers written but their slots not registered; a repair soon registers them");
                self.repair_soon(&agent);
            }
        }
    }

    async fn register(
        &self,
        agent: &str,
        slots: impl Iterator<Item = (u16, i64)>,
    ) -> Result<(), Error> {
        let (registry, generations) = self.registry_keys(agent);
        let mut cmd = evalsha(&REGISTER_TIMERS, &[&registry, &generations]);
        for (slot, due) in slots {
            cmd.arg(slot).arg(due);
        }
        let mut con = self.con.clone();
        let _: i64 = eval(&mut con, &REGISTER_TIMERS, &cmd)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// Removes timers whose task is gone from the timer set `key` (`due_tasks.lua` only reads,
    /// so that a sweep is never held by a pause of writes; see the script).
    pub(super) async fn remove_gone_timers(
        &self,
        key: &str,
        gone: Vec<String>,
    ) -> Result<(), Error> {
        if gone.is_empty() {
            return Ok(());
        }
        let mut con = self.con.clone();
        let _: i64 = ::redis::cmd("ZREM")
            .arg(key)
            .arg(gone)
            .query_async(&mut con)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// `due_tasks` on a cluster: the registry's due slots, lowest score first, read a few at a
    /// time until `limit` tasks are found and no slot left could hold an earlier one; then what
    /// was read is filed back in the registry.
    pub(super) async fn cluster_due_tasks(
        &self,
        agent: &str,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<DueTask>, Error> {
        self.repair_when_due(agent);
        let (registry, generations) = self.registry_keys(agent);
        let mut con = self.con.clone();
        let mut cmd = evalsha(&DUE_SLOTS, &[&registry, &generations]);
        cmd.arg(now_ms).arg(DUE_SLOTS_READ);
        let rows: Vec<String> = eval(&mut con, &DUE_SLOTS, &cmd)
            .await
            .map_err(unavailable)?;
        let mut candidates = Vec::with_capacity(rows.len() / 3);
        let mut rows = rows.into_iter();
        while let (Some(slot), Some(score), Some(generation)) =
            (rows.next(), rows.next(), rows.next())
        {
            let (Ok(slot), Ok(score)) = (slot.parse::<u16>(), score.parse::<f64>()) else {
                return Err(Error::Corrupt(format!(
                    "the timer slot registry of agent {agent} holds {slot:?} scored {score:?}"
                )));
            };
            candidates.push((slot, score as i64, generation));
        }

        let mut found: Vec<(i64, String, Vec<u8>)> = Vec::new();
        let mut raises: Vec<(u16, String, String)> = Vec::new();
        for batch in candidates.chunks(SLOTS_AT_ONCE) {
            // Scores are at most each slot's earliest timer: once `limit` tasks are found, a slot
            // scored after the last of them cannot hold an earlier one.
            if found.len() >= limit && batch[0].1 > found[limit - 1].0 {
                break;
            }
            let reads = batch.iter().map(|(slot, _, _)| {
                let key = format!("{}{agent}", self.slot_timer_prefix(*slot));
                let mut cmd = evalsha(&DUE_TASKS, &[&key]);
                cmd.arg(now_ms)
                    .arg(limit.min(i64::MAX as usize))
                    .arg(self.run_key_prefix());
                let mut con = self.con.clone();
                async move { eval::<DueReply>(&mut con, &DUE_TASKS, &cmd).await }
            });
            let replies = futures::future::join_all(reads).await;
            for ((slot, _, generation), reply) in batch.iter().zip(replies) {
                let reply = reply.map_err(unavailable)?;
                let (earliest, due, gone) = read_due(agent, reply)?;
                let key = format!("{}{agent}", self.slot_timer_prefix(*slot));
                self.remove_gone_timers(&key, gone).await?;
                let earliest = self.confirm_empty(agent, *slot, earliest, now_ms);
                raises.push((*slot, generation.clone(), earliest));
                found.extend(due);
            }
            found.sort();
            found.truncate(limit);
        }
        if !raises.is_empty() {
            let mut cmd = evalsha(&RAISE_SLOTS, &[&registry, &generations]);
            for (slot, generation, earliest) in &raises {
                cmd.arg(*slot)
                    .arg(generation.as_str())
                    .arg(earliest.as_str());
            }
            let _: i64 = eval(&mut con, &RAISE_SLOTS, &cmd)
                .await
                .map_err(unavailable)?;
        }
        Ok(due_tasks(found))
    }

    /// What to file for a slot a sweep read, given its `earliest` timer ('' for none): a slot
    /// leaves the registry only when this store found it empty twice, [`EMPTY_CONFIRM`] apart;
    /// the first time it is filed for a second look then. A master that restarted without its
    /// data claims its slots for a moment before the cluster demotes it, and one read from it
    /// would otherwise drop a slot whose timers are all still there.
    fn confirm_empty(&self, agent: &str, slot: u16, earliest: String, now_ms: i64) -> String {
        let mut seen = self
            .empty_seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = (agent.to_owned(), slot);
        if !earliest.is_empty() {
            seen.remove(&key);
            return earliest;
        }
        match seen.get(&key) {
            Some(first) if first.elapsed() >= EMPTY_CONFIRM => {
                seen.remove(&key);
                earliest
            }
            Some(_) => now_ms
                .saturating_add(EMPTY_CONFIRM.as_millis() as i64)
                .to_string(),
            None => {
                seen.insert(key, Instant::now());
                now_ms
                    .saturating_add(EMPTY_CONFIRM.as_millis() as i64)
                    .to_string()
            }
        }
    }

    /// Starts a repair of `agent`'s registry in the background if this store has not made one
    /// for [`REPAIR_EVERY`].
    fn repair_when_due(&self, agent: &str) {
        let now = Instant::now();
        {
            let mut next = self
                .next_repair
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if next.get(agent).is_some_and(|at| *at > now) {
                return;
            }
            next.insert(agent.to_owned(), now + REPAIR_EVERY);
        }
        let store = self.clone();
        let agent = agent.to_owned();
        tokio::spawn(async move {
            if let Err(error) = store.repair_registry(&agent).await {
                tracing::warn!(%agent, %error, "cannot repair the timer slot registry; trying again soon");
                store.repair_soon(&agent);
            }
        });
    }

    /// Brings `agent`'s next repair forward to [`REPAIR_RETRY`] from now: a registration or a
    /// repair failed (the cluster was failing over, say), and a timer may be unregistered.
    fn repair_soon(&self, agent: &str) {
        let soon = Instant::now() + REPAIR_RETRY;
        let mut next = self
            .next_repair
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let at = next.entry(agent.to_owned()).or_insert(soon);
        *at = (*at).min(soon);
    }

    /// Registers every slot that holds a timer of `agent`, at its earliest one: what a
    /// coordinator that died between a script and its registration left out. Returns how many
    /// slots hold timers.
    pub async fn repair_registry(&self, agent: &str) -> Result<usize, Error> {
        if !self.con.is_cluster() {
            return Ok(0);
        }
        let reads = (0..SLOTS)
            .map(|slot| {
                let mut cmd = ::redis::cmd("ZRANGE");
                cmd.arg(format!("{}{agent}", self.slot_timer_prefix(slot)))
                    .arg(0)
                    .arg(0)
                    .arg("WITHSCORES");
                cmd
            })
            .collect();
        let firsts: Vec<Vec<String>> = self.con.each(reads).await.map_err(unavailable)?;
        let held: Vec<(u16, i64)> = (0..SLOTS)
            .zip(firsts)
            .filter_map(|(slot, first)| Some((slot, first.get(1)?.parse::<f64>().ok()? as i64)))
            .collect();
        for chunk in held.chunks(1024) {
            self.register(agent, chunk.iter().copied()).await?;
        }
        Ok(held.len())
    }
}

/// A `due_tasks.lua` reply: the set's earliest score ('' when empty), its due timers as
/// (member, score, task, ...), and the members of due timers whose task is gone.
pub(super) type DueReply = (Vec<u8>, Vec<Vec<u8>>, Vec<String>);

/// A `due_tasks.lua` reply read: the set's earliest score ('' when empty), the due timers as
/// (score, member, task), and the members of timers whose task is gone.
#[allow(clippy::type_complexity)]
pub(super) fn read_due(
    agent: &str,
    (earliest, found, gone): DueReply,
) -> Result<(String, Vec<(i64, String, Vec<u8>)>, Vec<String>), Error> {
    let not_utf8 = || Error::Corrupt(format!("a timer of agent {agent} is not UTF-8"));
    let earliest = String::from_utf8(earliest).map_err(|_| not_utf8())?;
    let mut items = found.into_iter();
    let mut due = Vec::new();
    while let (Some(member), Some(score), Some(task)) = (items.next(), items.next(), items.next()) {
        let member = String::from_utf8(member).map_err(|_| not_utf8())?;
        let score = std::str::from_utf8(&score)
            .ok()
            .and_then(|score| score.parse::<f64>().ok())
            .ok_or_else(not_utf8)? as i64;
        due.push((score, member, task));
    }
    Ok((earliest, due, gone))
}

/// Due timers as (score, member `<run id>/<task key>`, task) made [`DueTask`]s, in order; a
/// member without a `/` (not the store's) is skipped.
pub(super) fn due_tasks(due: Vec<(i64, String, Vec<u8>)>) -> Vec<DueTask> {
    due.into_iter()
        .filter_map(|(_, member, task)| {
            let (run_id, task_key) = member.split_once('/')?;
            Some(DueTask {
                run_id: run_id.to_owned(),
                task_key: task_key.to_owned(),
                task,
            })
        })
        .collect()
}
