//! Runs waiting to go on with a computation: their walk stopped before a step that runs jq
//! ([`baton_core::Action::Continue`]), and they take turns to apply [`Event::Continue`], one
//! such step a turn. The run whose jq programs have used the least CPU goes first, so a run
//! that computes for minutes never holds up one that needs milliseconds, and a cancel or a
//! shutdown finds the run between two of its programs (or stops the one running).
//!
//! Each waiting run has a continuation timer in the store ([`crate::lease::continuation`]),
//! held by this coordinator while the run waits here: if it dies, the timer comes due and
//! another coordinator's sweep takes the run up.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use baton_core::Event;
use tokio::sync::Notify;

use super::{Coordinator, Error, Inner};
use crate::lease;
use crate::model::TaskEntry;
use crate::store::{self, Store};

/// How long a run whose turn failed (the store did not answer) waits before its next.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The runs waiting for a turn, least CPU used first (then first come): a pure queue.
#[derive(Debug, Default)]
pub struct Turns {
    queue: BinaryHeap<Reverse<(Duration, u64, String)>>,
    waiting: HashSet<String>,
    arrivals: u64,
}

impl Turns {
    /// `run_id`, whose jq programs have used `spent`, waits for a turn; `false` if it already
    /// did (a run waits once).
    pub fn push(&mut self, run_id: &str, spent: Duration) -> bool {
        if !self.waiting.insert(run_id.to_owned()) {
            return false;
        }
        self.arrivals += 1;
        self.queue
            .push(Reverse((spent, self.arrivals, run_id.to_owned())));
        true
    }

    /// The run whose turn it is.
    pub fn pop(&mut self) -> Option<String> {
        let Reverse((_, _, run_id)) = self.queue.pop()?;
        self.waiting.remove(&run_id);
        Some(run_id)
    }

    /// Every run still waiting, emptied.
    pub fn drain(&mut self) -> Vec<String> {
        self.waiting.clear();
        std::mem::take(&mut self.queue)
            .into_iter()
            .map(|Reverse((_, _, run_id))| run_id)
            .collect()
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// The runs waiting here, and the signal that one arrived.
#[derive(Default)]
pub(super) struct Continuations {
    turns: Mutex<Turns>,
    arrived: Notify,
}

impl Continuations {
    fn turns(&self) -> std::sync::MutexGuard<'_, Turns> {
        self.turns
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn push(&self, run_id: &str, spent: Duration) {
        if self.turns().push(run_id, spent) {
            self.arrived.notify_one();
        }
    }

    /// The next run whose turn it is, waiting for one to arrive.
    async fn next(&self) -> String {
        loop {
            let arrived = self.arrived.notified();
            if let Some(run_id) = self.turns().pop() {
                return run_id;
            }
            arrived.await;
        }
    }
}

/// One of the coordinator's computers: takes runs in turn until the coordinator stops. Holds
/// no strong handle while it waits, so that dropping the coordinator stops it.
pub(super) async fn run_turns<S: Store>(inner: Weak<Inner<S>>, continuations: Arc<Continuations>) {
    loop {
        let run_id = continuations.next().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let coordinator = Coordinator { inner };
        if coordinator.inner.leases.stopping() {
            return;
        }
        coordinator.take_turn(&run_id).await;
    }
}

impl<S: Store> Coordinator<S> {
    /// `run_id`'s walk stopped before a step that runs jq, and this coordinator holds its
    /// continuation timer: it goes on when its turn comes.
    pub(super) fn continue_later(&self, run_id: &str, spent: Duration) {
        if !self.inner.leases.stopping() {
            self.inner.continuations.push(run_id, spent);
        }
    }

    /// Runs waiting here for their turn (for `/metrics`).
    pub(super) fn computations_waiting(&self) -> usize {
        self.inner.continuations.turns().len()
    }

    async fn take_turn(&self, run_id: &str) {
        match self.apply(run_id, Event::Continue, None, false, None).await {
            Ok(_) => {}
            // Taken up already (here, or by a coordinator that claimed its timer), or over.
            Err(
                Error::NotContinuing { .. } | Error::RunFinished { .. } | Error::RunNotFound(_),
            ) => {}
            // A cancel stopped it (the cancel's transition follows), or this coordinator is
            // shutting down (its timer is released for another).
            Err(Error::ComputationStopped { .. }) => {}
            Err(error) => {
                // The store did not answer, or the run could not be read: its timer is still
                // this coordinator's, so it tries again in a while.
                tracing::warn!(run_id, %error, "cannot go on with the run's computation; trying again");
                let coordinator = self.clone();
                let run_id = run_id.to_owned();
                tokio::spawn(async move {
                    tokio::time::sleep(RETRY_AFTER).await;
                    coordinator.continue_later(&run_id, Duration::ZERO);
                });
            }
        }
    }

    /// A continuation timer came due (its holder died, or released it): take the run up here.
    pub(super) async fn claim_continuation(
        &self,
        run_id: &str,
        stored: Vec<u8>,
        entry: &TaskEntry,
    ) {
        let config = &self.inner.config;
        let Some(claimed) = lease::continuation_claimed(
            entry,
            &config.coordinator_id,
            self.now_ms(),
            config.lease_ms,
        ) else {
            return;
        };
        let _leases = self.inner.leases.writes.lock().await;
        if matches!(
            self.swap_bytes(run_id, lease::CONTINUATION, stored, Some(&claimed))
                .await,
            Ok(true)
        ) {
            tracing::info!(
                run_id,
                "took up a run's computation whose coordinator went away"
            );
            self.continue_later(run_id, Duration::ZERO);
        }
    }

    /// Shutting down: the runs waiting here (or whose turn was stopped) are left to the other
    /// coordinators at once.
    pub(super) async fn release_continuations(&self) {
        self.inner.continuations.turns().drain();
        let now = self.now_ms();
        for (run_id, entry) in self.held_continuations() {
            let released = TaskEntry {
                owner: String::new(),
                due_ms: now,
                ..entry.clone()
            };
            match self
                .swap(&run_id, lease::CONTINUATION, &entry, Some(&released))
                .await
            {
                Ok(_) => {}
                Err(Error::Store(store::Error::Unavailable(error))) => {
                    tracing::warn!(%run_id, %error, "cannot release a run's computation; its lease runs out instead");
                }
                Err(error) => {
                    tracing::warn!(%run_id, %error, "cannot release a run's computation");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_that_used_the_least_cpu_goes_first_then_the_first_come() {
        let mut turns = Turns::default();
        assert!(turns.push("heavy", Duration::from_secs(40)));
        assert!(turns.push("light-1", Duration::from_millis(3)));
        assert!(turns.push("light-2", Duration::from_millis(3)));
        assert!(turns.push("new", Duration::ZERO));
        assert!(!turns.push("heavy", Duration::ZERO), "a run waits once");
        assert_eq!(turns.len(), 4);
        let order: Vec<String> = std::iter::from_fn(|| turns.pop()).collect();
        assert_eq!(order, ["new", "light-1", "light-2", "heavy"]);
        assert!(turns.is_empty());
        assert!(
            turns.push("heavy", Duration::ZERO),
            "it may wait again once taken"
        );
        assert_eq!(turns.drain(), ["heavy"]);
        assert_eq!(turns.pop(), None);
    }
}
