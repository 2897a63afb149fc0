//! Leases, retries, timeouts, and the timers that drive them ([`crate::lease`] has the rules).
//!
//! Every task in flight has an entry in the store with a timer. The coordinator that holds a
//! task renews its lease every third of [`Config::lease_ms`]; every coordinator sweeps the timer
//! sets of the agents its workers serve every [`Config::sweep_interval_ms`] and claims what is
//! due: retries whose backoff is over, tasks nobody holds, and tasks whose holder stopped
//! renewing (it died). Every write of a lease is a compare-and-swap of the stored entry, so two
//! coordinators never both claim a task, and every new delivery raises the attempt, which fences
//! the answers of the old ones.
//!
//! - this file: the book of leases this coordinator holds, their compare-and-swap, the timers.
//! - `renew`: renewing every held lease in one store call.
//! - `sweep`: claiming due tasks and approval timeouts, and delivering claimed attempts.
//! - `retries`: a failed attempt through the step's retry policy; timeouts.
//! - `rebalance`: free slots advertised, and tasks that waited too long here moved to
//!   coordinators whose workers have room.
//!
//! [`Config::lease_ms`]: super::Config::lease_ms
//! [`Config::sweep_interval_ms`]: super::Config::sweep_interval_ms

mod rebalance;
mod renew;
mod retries;
mod sweep;

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Mutex as AsyncMutex;

use super::plan::{Holder, Planned};
use super::{Coordinator, Error, StopSignal};
use crate::clock::Instant;
use crate::model::TaskEntry;
use crate::store::{Store, TaskSwap, Tasks};
use crate::task_ref::{TaskKey, TaskMap, parse_task_key};

/// The leases this coordinator holds, keyed by (run id, visit key).
type Held = HashMap<TaskKey, TaskEntry>;

#[derive(Default)]
pub(super) struct LeaseBook {
    /// The tasks this coordinator holds the lease of, as last written to the store: what the
    /// renewals compare against.
    held: Mutex<Held>,
    /// Held while a lease is read and written (renewals, claims, retries, takeovers), so that
    /// two of this coordinator's own lease writes never race each other's compare-and-swap.
    pub writes: AsyncMutex<()>,
    /// Shutting down: no more claims, no new workers.
    stopping: AtomicBool,
    /// The free slots this coordinator last advertised.
    advertised: rebalance::Advertised,
    /// When tasks of each agent last went to other coordinators' room.
    rebalanced: Mutex<HashMap<String, Instant>>,
    /// Held tasks whose last renewal missed, with the entry then held (`renew`: a second miss
    /// with the same entry lets the task go).
    missed_once: Mutex<Held>,
}

impl LeaseBook {
    fn missed_once(&self) -> std::sync::MutexGuard<'_, Held> {
        self.missed_once.lock().expect("missed leases lock")
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().expect("held lock")
    }

    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }
}

/// The tasks a transition removed, and those it created for this coordinator.
pub(super) struct HeldChange {
    removed: Vec<String>,
    added: Vec<(String, TaskEntry)>,
}

/// The coordinator's clock ([`Coordinator::run`]): sweeps, timeouts, silent workers,
/// renewals. Ends when `run` is asked to stop or the coordinator shuts down; a round under way
/// finishes first.
pub(super) async fn run_timers<S: Store>(coordinator: Coordinator<S>, mut stop: StopSignal) {
    let mut renewed = Instant::now();
    let mut forgot = Instant::now();
    let config = &coordinator.inner.config;
    let interval = Duration::from_millis(config.sweep_interval_ms.max(1));
    let renew_every = Duration::from_millis((config.lease_ms / 3).max(1));
    loop {
        if stop.given() || coordinator.inner.leases.stopping() {
            return;
        }
        coordinator.check_silent_workers().await;
        coordinator.check_timeouts().await;
        if renewed.elapsed() >= renew_every {
            renewed = Instant::now();
            coordinator.renew_leases().await;
        }
        coordinator.sweep().await;
        // A few times per idle period: a run is forgotten within 1.25 periods of its last use.
        if forgot.elapsed() >= Duration::from_millis((config.run_idle_ms / 4).max(1)) {
            forgot = Instant::now();
            coordinator.forget_idle_runs();
        }
        coordinator.advertise_slots().await;
        coordinator.rebalance_waiting().await;
        tokio::select! {
            biased;
            () = stop.wait() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

impl<S: Store> Coordinator<S> {
    /// Who takes the tasks a transition dispatches.
    pub(super) fn holder(&self) -> Holder<'_> {
        Holder {
            id: &self.inner.config.coordinator_id,
            lease_ms: self.inner.config.lease_ms,
            serves: Box::new(|agent| !self.inner.leases.stopping() && self.inner.hub.serves(agent)),
            continues: !self.inner.leases.stopping(),
        }
    }

    /// What a written transition changes in the leases this coordinator holds: the tasks it
    /// removed are nobody's, the ones it created for this coordinator are held.
    pub(super) fn held_change(&self, planned: &Planned) -> HeldChange {
        let me = &self.inner.config.coordinator_id;
        HeldChange {
            removed: planned.write.tasks_removed.clone(),
            added: planned
                .tasks_set
                .iter()
                .filter(|(_, entry)| entry.owner.as_ref() == Some(me))
                .cloned()
                .collect(),
        }
    }

    /// Records a [`HeldChange`], once the transition's tasks are in the hub: a renewal in
    /// between would otherwise find a held task nowhere in the hub and give it up.
    pub(super) fn note_held(&self, run_id: &str, change: HeldChange) {
        let mut held = self.inner.leases.held();
        for key in change.removed {
            held.remove_task(run_id, &key);
        }
        for (key, entry) in change.added {
            held.insert((run_id.to_owned(), key), entry);
        }
    }

    pub(super) fn forget_held(&self, run_id: &str, task_key: &str) {
        self.inner.leases.held().remove_task(run_id, task_key);
    }

    /// The continuation timers this coordinator holds, by run.
    pub(super) fn held_continuations(&self) -> Vec<(String, TaskEntry)> {
        self.inner
            .leases
            .held()
            .iter()
            .filter(|((_, key), entry)| {
                key == crate::lease::CONTINUATION
                    && entry.state == crate::model::TaskState::Continuing
            })
            .map(|((run_id, _), entry)| (run_id.clone(), entry.clone()))
            .collect()
    }

    pub(super) fn held_entry(&self, run_id: &str, task_key: &str) -> Option<TaskEntry> {
        self.inner.leases.held().get_task(run_id, task_key).cloned()
    }

    /// Writes a lease change if the stored entry is still `expected`; records it as held when
    /// it names this coordinator.
    pub(super) async fn swap(
        &self,
        run_id: &str,
        task_key: &str,
        expected: &TaskEntry,
        new: Option<&TaskEntry>,
    ) -> Result<bool, Error> {
        self.swap_bytes(run_id, task_key, expected.encode(), new)
            .await
    }

    pub(super) async fn swap_bytes(
        &self,
        run_id: &str,
        task_key: &str,
        expected: Vec<u8>,
        new: Option<&TaskEntry>,
    ) -> Result<bool, Error> {
        let expected_copy = expected.clone();
        let swapped = self
            .inner
            .store
            .swap_tasks(vec![TaskSwap {
                run_id: run_id.to_owned(),
                task_key: task_key.to_owned(),
                expected,
                new: new.map(TaskEntry::encode),
            }])
            .await?;
        let swapped = swapped.first().copied().unwrap_or(false);
        let key = (run_id.to_owned(), task_key.to_owned());
        let mut held = self.inner.leases.held();
        match new {
            Some(entry)
                if swapped && entry.owner.as_ref() == Some(&self.inner.config.coordinator_id) =>
            {
                held.insert(key, entry.clone());
            }
            _ if swapped => {
                held.remove(&key);
            }
            // Lost: what this coordinator believed it held (if it was this) is not so. A claim
            // that lost to another one of this coordinator's own leaves the winner's alone.
            _ => {
                if held.get(&key).map(TaskEntry::encode).as_ref() == Some(&expected_copy) {
                    held.remove(&key);
                }
            }
        }
        Ok(swapped)
    }

    /// Shows a task's lease in this coordinator's copy of the run (GetRun, watchers).
    pub(super) async fn show_task(&self, run_id: &str, task_key: &str, entry: &TaskEntry) {
        let Some(slot) = self.inner.runs.cached(run_id) else {
            return;
        };
        // Only what is shown: a run busy with a long transition (a map item's jq chain, say) is
        // not waited for while the lease writes are held (every renewal and claim here waits on
        // them); its next transition or read shows the store's entries.
        let Ok(mut guard) =
            tokio::time::timeout(std::time::Duration::from_millis(100), slot.lock()).await
        else {
            return;
        };
        let Some(loaded) = guard.as_mut() else {
            return;
        };
        if !loaded.tasks.contains_key(task_key) {
            return;
        }
        loaded.tasks.insert(task_key.to_owned(), entry.clone());
        // A map item's entry is not its step's state (its map step's counts are).
        if let Some(task) = parse_task_key(task_key).filter(|task| task.item.is_none())
            && let Some(step) = loaded.steps.get_mut(task.step_id.as_ref())
        {
            step.status = entry.state.into();
            step.attempts = entry.attempt;
            step.error = entry.error.clone();
            if entry.worker_id.is_some() {
                step.worker_id = entry.worker_id.clone();
            }
        }
    }
}
