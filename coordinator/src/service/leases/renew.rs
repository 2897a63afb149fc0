//! Renewing the leases this coordinator holds: one store call for all of them.

use tokio::sync::MutexGuard;

use crate::hub::TaskAsked;
use crate::lease;
use crate::model::{TaskEntry, TaskState};
use crate::service::Coordinator;
use crate::store::{Store, TaskSwap, Tasks};

impl<S: Store> Coordinator<S> {
    /// Pushes out the lease of every task this coordinator holds (one store call), writing down
    /// which worker runs it, and as which principal; gives up the queued ones no worker here can
    /// run; forgets (and stops) the ones another coordinator took over.
    pub(super) async fn renew_leases(&self) {
        let leases = self.inner.leases.writes.lock().await;
        self.renew_held(&leases).await;
    }

    /// [`Coordinator::renew_leases`] under the lease writes, which the caller holds (`_writes`
    /// says so): shutdown writes its workers down this way before it sends them away.
    pub(in crate::service) async fn renew_held(&self, _writes: &MutexGuard<'_, ()>) {
        let snapshot: Vec<(HeldKey, TaskEntry)> = self
            .inner
            .leases
            .held()
            .iter()
            .map(|(key, entry)| (key.clone(), entry.clone()))
            .collect();
        if snapshot.is_empty() {
            return;
        }
        let renewed = self.renewals(&snapshot);
        let swaps = snapshot
            .iter()
            .zip(&renewed)
            .map(|(((run_id, key), entry), next)| TaskSwap {
                run_id: run_id.clone(),
                task_key: key.clone(),
                expected: entry.encode(),
                new: Some(next.encode()),
            })
            .collect();
        let swapped = match self.inner.store.swap_tasks(swaps).await {
            Ok(swapped) => swapped,
            Err(error) => {
                // Nothing is known to be lost: try again at the next renewal.
                tracing::warn!(%error, "cannot renew leases");
                return;
            }
        };
        let mut outcome = self.take_renewals(snapshot, renewed, swapped);
        self.check_missed(&mut outcome).await;
        let mut assignments = Vec::new();
        for ((run_id, task_key), reason) in outcome.given_up {
            tracing::info!(%run_id, task = %task_key, reason, "lease given up");
            let forgotten = self.inner.hub.forget(&run_id, &task_key, reason);
            assignments.extend(forgotten.assignments);
        }
        for ((run_id, key), entry) in outcome.shown {
            self.show_task(&run_id, &key, &entry).await;
        }
        self.assigned(assignments).await;
    }

    /// Each held task's entry renewed as where it stands now says (held by a worker here,
    /// queued here, or nowhere here).
    fn renewals(&self, snapshot: &[(HeldKey, TaskEntry)]) -> Vec<TaskEntry> {
        let mut located = self.inner.hub.locate(
            &snapshot
                .iter()
                .map(|((run_id, task_key), entry)| TaskAsked {
                    run_id,
                    task_key,
                    agent: &entry.agent,
                })
                .collect::<Vec<_>>(),
        );
        // The hub knows nothing of continuations: a run waits for its turn here, or not.
        for (((run_id, _), entry), holding) in snapshot.iter().zip(located.iter_mut()) {
            if entry.state == TaskState::Continuing {
                *holding = match self.computes_here(run_id) {
                    true => lease::Holding::Queued,
                    false => lease::Holding::Nowhere,
                };
            }
        }
        let now = self.now_ms();
        snapshot
            .iter()
            .zip(&located)
            .map(|((_, entry), holding)| {
                lease::renewed(entry, holding, now, self.inner.config.lease_ms)
            })
            .collect()
    }

    /// The renewals the store took, noted: a task still this coordinator's is held at its new
    /// entry, one it renewed for nobody is given up, and one whose swap missed is checked.
    fn take_renewals(
        &self,
        snapshot: Vec<(HeldKey, TaskEntry)>,
        renewed: Vec<TaskEntry>,
        swapped: Vec<bool>,
    ) -> Renewals {
        let mut outcome = Renewals::default();
        let mut held = self.inner.leases.held();
        for ((key, entry), (next, ok)) in snapshot.into_iter().zip(renewed.into_iter().zip(swapped))
        {
            // Changed since the snapshot (a transition answered or removed it): that change
            // wins.
            if held.get(&key) != Some(&entry) {
                continue;
            }
            if ok && next.owner.as_ref() == Some(&self.inner.config.coordinator_id) {
                held.insert(key.clone(), next.clone());
                if next.worker_id != entry.worker_id {
                    outcome.shown.push((key, next));
                }
            } else if ok {
                held.remove(&key);
                let reason = match entry.state {
                    TaskState::Continuing => {
                        "the run's computation waits here no more; released to every coordinator"
                    }
                    _ => "no worker here serves its agent; released to the other coordinators",
                };
                outcome.given_up.push((key, reason));
            } else {
                outcome.missed.push((key, entry));
            }
        }
        outcome
    }

    /// A miss is another coordinator's claim, this coordinator's own renewal whose reply was
    /// lost (the store went away), or a transition of this coordinator's that wrote the task
    /// (answered it, so removed it) and has not noted that yet: it does so under the run's lock,
    /// after its write. So a task is let go only when it misses twice in a row with the same entry
    /// held; the stored entry tells a lost reply apart.
    async fn check_missed(&self, outcome: &mut Renewals) {
        let missed_before = std::mem::take(&mut *self.inner.leases.missed_once());
        for (key, entry) in std::mem::take(&mut outcome.missed) {
            let stored = self
                .inner
                .store
                .task(&key.0, &key.1)
                .await
                .ok()
                .flatten()
                .and_then(|bytes| serde_json::from_slice::<TaskEntry>(&bytes).ok());
            let mut held = self.inner.leases.held();
            if held.get(&key) != Some(&entry) {
                continue;
            }
            match stored {
                Some(stored)
                    if stored.owner.as_ref() == Some(&self.inner.config.coordinator_id)
                        && stored.attempt == entry.attempt =>
                {
                    held.insert(key, stored);
                }
                _ if missed_before.get(&key) == Some(&entry) => {
                    held.remove(&key);
                    outcome
                        .given_up
                        .push((key, "another coordinator took this task over"));
                }
                _ => {
                    self.inner.leases.missed_once().insert(key, entry);
                }
            }
        }
    }
}

/// A held task: its run id and task key.
type HeldKey = (String, String);

/// What a renewal came to.
#[derive(Default)]
struct Renewals {
    /// Tasks let go, and why.
    given_up: Vec<(HeldKey, &'static str)>,
    /// Tasks whose swap missed, with the entry expected.
    missed: Vec<(HeldKey, TaskEntry)>,
    /// Tasks now run by another worker: their step's state shows it.
    shown: Vec<(HeldKey, TaskEntry)>,
}
