//! Rebalancing waiting tasks. A task waits in the queue of the coordinator that dispatched it,
//! for that coordinator's workers; workers spread over coordinators, so another coordinator's
//! workers may sit idle meanwhile. Each coordinator therefore advertises its workers' free slots
//! per agent in the store (less what it has queued itself), renewed while they last; and a task
//! that waited [`Config::rebalance_after_ms`] here is released (due now, nobody's) when other
//! coordinators advertise room for its agent, as many tasks as they have room for. Their sweep
//! claims only as many due tasks as their workers have free slots, so a released task goes
//! where it runs at once.
//!
//! [`Config::rebalance_after_ms`]: crate::Config::rebalance_after_ms

use std::collections::BTreeMap;
use std::time::Duration;

use crate::clock::Instant;
use crate::hub::ReadyTask;
use crate::lease;
use crate::service::{Coordinator, Error};
use crate::store::{Coordination, Store};

/// What this coordinator last advertised, and when.
#[derive(Default)]
pub(in crate::service) struct Advertised(
    std::sync::Mutex<Option<(BTreeMap<String, usize>, Instant)>>,
);

impl<S: Store> Coordinator<S> {
    /// Advertises the free slots of this coordinator's workers, per agent they serve, when they
    /// changed, and again every third of a lease while any worker is connected (an
    /// advertisement lasts one lease, so a coordinator that died stops being counted).
    pub(in crate::service) async fn advertise_slots(&self) {
        // Agents with no free slot too: that they are served at all is what other
        // coordinators tell their clients ([`Coordinator::record`]'s `served`).
        let free: BTreeMap<String, usize> = self.inner.hub.free_slots().into_iter().collect();
        let refresh = Duration::from_millis((self.inner.config.lease_ms / 3).max(1));
        {
            let said = self
                .inner
                .leases
                .advertised
                .0
                .lock()
                .expect("advertised lock");
            let unchanged = match &*said {
                // Nothing said yet: nothing to say while no worker is connected.
                None => free.is_empty(),
                Some((said, at)) => *said == free && (free.is_empty() || at.elapsed() < refresh),
            };
            if unchanged {
                return;
            }
        }
        // Under the lease writes, which shutdown holds while it says there is no room: slots
        // counted before a shutdown are never advertised after it.
        let _leases = self.inner.leases.writes.lock().await;
        if self.inner.leases.stopping() {
            return;
        }
        self.write_advertisement(free).await;
    }

    /// Says this coordinator has no room (it is shutting down, and holds the lease writes).
    pub(in crate::service) async fn advertise_no_slots(&self) {
        self.write_advertisement(BTreeMap::new()).await;
    }

    async fn write_advertisement(&self, free: BTreeMap<String, usize>) {
        let config = &self.inner.config;
        let expires_ms = self.now_ms() + config.lease_ms as i64;
        match self
            .inner
            .store
            .advertise_slots(&config.coordinator_id, free.clone(), expires_ms)
            .await
        {
            Ok(()) => {
                *self
                    .inner
                    .leases
                    .advertised
                    .0
                    .lock()
                    .expect("advertised lock") = Some((free, Instant::now()));
            }
            Err(error) => tracing::warn!(%error, "cannot advertise this coordinator's free slots"),
        }
    }

    /// Releases the tasks that waited too long here, as many per agent as other coordinators
    /// have room for.
    pub(in crate::service) async fn rebalance_waiting(&self) {
        let patience_ms = self.inner.config.rebalance_after_ms;
        if patience_ms == 0 || self.inner.leases.stopping() {
            return;
        }
        let patience = Duration::from_millis(patience_ms);
        let waiting = self.inner.hub.waiting_longer_than(patience);
        if waiting.is_empty() {
            return;
        }
        let me = &self.inner.config.coordinator_id;
        let elsewhere = match self.inner.store.slots_elsewhere(me, self.now_ms()).await {
            Ok(elsewhere) => elsewhere,
            Err(error) => {
                tracing::debug!(%error, "cannot read other coordinators' free slots");
                return;
            }
        };
        // Advertisements are renewed every sweep at best: once tasks of an agent went to the
        // room advertised, none go again until `patience` has passed, so that one advertisement
        // is not spent twice.
        let take: BTreeMap<String, usize> = {
            let mut last = self
                .inner
                .leases
                .rebalanced
                .lock()
                .expect("rebalanced lock");
            last.retain(|_, at: &mut Instant| at.elapsed() < patience);
            waiting
                .into_iter()
                .filter(|(agent, _)| !last.contains_key(agent))
                .filter_map(|(agent, waited)| {
                    let room = elsewhere.get(&agent).copied().unwrap_or(0);
                    (room > 0).then(|| (agent, waited.min(room)))
                })
                .collect()
        };
        if take.is_empty() {
            return;
        }
        let _leases = self.inner.leases.writes.lock().await;
        let tasks = self.inner.hub.waited_out(patience, &take);
        {
            let mut last = self
                .inner
                .leases
                .rebalanced
                .lock()
                .expect("rebalanced lock");
            for task in &tasks {
                last.insert(task.agent.to_string(), Instant::now());
            }
        }
        let (released, failed) = self.release_queued(tasks).await;
        self.inner.metrics.rebalanced.inc_by(released as u64);
        if released > 0 {
            tracing::info!(
                released,
                "tasks that waited here moved to coordinators whose workers have room"
            );
        }
        // The write may have been applied all the same (only its answer lost): queued here
        // again, such a task could run on two coordinators' workers. Left out of the hub, it is
        // still held here, so the next renewal finds it nowhere and releases it (or learns that
        // it was released): it is delivered once either way.
        for (task, error) in failed {
            tracing::warn!(run_id = %task.run_id(), task = %task.key, %error, "cannot move a waiting task; the next lease renewal releases it");
        }
    }

    /// Gives up queued tasks: each is written due now and nobody's, for whichever coordinator
    /// claims it first. Needs the lease writes held. Returns how many were released, and the
    /// tasks whose release could not be written, with why.
    pub(in crate::service) async fn release_queued(
        &self,
        tasks: Vec<ReadyTask>,
    ) -> (usize, Vec<(ReadyTask, Error)>) {
        let now = self.now_ms();
        let mut released = 0;
        let mut failed = Vec::new();
        for task in tasks {
            let Some(entry) = self.held_entry(task.run_id(), &task.key) else {
                continue;
            };
            let given_up = lease::released(&entry, now);
            match self
                .swap(task.run_id(), &task.key, &entry, Some(&given_up))
                .await
            {
                Ok(true) => released += 1,
                // Changed meanwhile (answered, cancelled, claimed): not this coordinator's to give.
                Ok(false) => {}
                Err(error) => failed.push((task, error)),
            }
        }
        (released, failed)
    }
}
