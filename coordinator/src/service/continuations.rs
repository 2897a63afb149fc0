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
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::{Coordinator, Error, StopSignal};
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

    /// The run whose turn it is, left waiting.
    pub fn peek(&self) -> Option<String> {
        self.queue
            .peek()
            .map(|Reverse((_, _, run_id))| run_id.clone())
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

/// The runs waiting here, those whose turn is under way, and the signal that one arrived.
#[derive(Default)]
pub(super) struct Continuations {
    turns: Mutex<Turns>,
    /// Runs whose turn is under way here (a run may wait again meanwhile).
    in_turn: Mutex<HashMap<String, usize>>,
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

    fn in_turn(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.in_turn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether `run_id` waits for its turn here, or its turn is under way.
    fn here(&self, run_id: &str) -> bool {
        // One lock at a time: `take` holds the queue's while it marks a turn under way.
        let waiting = self.turns().waiting.contains(run_id);
        waiting || self.in_turn().contains_key(run_id)
    }

    /// The next run whose turn it is (under way until the [`Turn`] is dropped), waiting for one
    /// to arrive.
    async fn next(self: &Arc<Self>) -> Turn {
        loop {
            let arrived = self.arrived.notified();
            if let Some(turn) = self.take() {
                return turn;
            }
            arrived.await;
        }
    }

    /// The run whose turn it is now, if any: marked under way before it leaves the queue, so
    /// that it is never in neither.
    fn take(self: &Arc<Self>) -> Option<Turn> {
        let mut turns = self.turns();
        let run_id = turns.peek()?;
        *self.in_turn().entry(run_id.clone()).or_default() += 1;
        turns.pop();
        Some(Turn {
            continuations: self.clone(),
            run_id,
        })
    }
}

/// A run's turn under way; over when dropped (a panic included).
struct Turn {
    continuations: Arc<Continuations>,
    run_id: String,
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut in_turn = self.continuations.in_turn();
        if let Some(count) = in_turn.get_mut(&self.run_id) {
            *count -= 1;
            if *count == 0 {
                in_turn.remove(&self.run_id);
            }
        }
    }
}

/// One of the coordinator's computers ([`Coordinator::run`]): takes runs in turn until `run`
/// is asked to stop or the coordinator shuts down; a turn under way finishes first.
pub(super) async fn run_turns<S: Store>(coordinator: Coordinator<S>, mut stop: StopSignal) {
    let continuations = coordinator.inner.continuations.clone();
    loop {
        let turn = tokio::select! {
            biased;
            () = stop.wait() => return,
            turn = continuations.next() => turn,
        };
        if coordinator.inner.leases.stopping() {
            return;
        }
        // On a task of its own: a turn that panics ends there (its run's timer is released at
        // the next renewal, for any coordinator), not this computer.
        let taking = coordinator.clone();
        let taken = tokio::spawn(async move {
            taking.take_turn(&turn.run_id).await;
            drop(turn);
        });
        if let Err(panicked) = taken.await {
            tracing::error!(error = %panicked, "a run's turn of computation panicked");
        }
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

    /// Whether `run_id` waits for its turn here or has its turn under way: what keeps its
    /// continuation timer renewed.
    pub(super) fn computes_here(&self, run_id: &str) -> bool {
        self.inner.continuations.here(run_id)
    }

    async fn take_turn(&self, run_id: &str) {
        // Only the holder of the run's continuation takes its turn, fenced by the timer's
        // attempt: a coordinator whose lease lapsed (a store that stalled) and was claimed by
        // another must not go on computing the same run beside it.
        let Some(timer) = self.held_entry(run_id, lease::CONTINUATION) else {
            return;
        };
        match self
            .apply_turn(run_id, (lease::CONTINUATION, timer.attempt))
            .await
        {
            Ok(_) => {}
            // Taken up already (here, or by a coordinator that claimed its timer), or over.
            Err(
                Error::NotContinuing { .. } | Error::RunFinished { .. } | Error::RunNotFound(_),
            ) => {}
            Err(Error::Store(store::Error::Fenced { .. })) => {
                self.forget_held(run_id, lease::CONTINUATION);
            }
            // Shutting down: its timer is released for another coordinator.
            Err(Error::ComputationStopped { .. }) if self.inner.leases.stopping() => {}
            Err(error) => {
                // A cancel stopped it (whose transition ends the run, or, should it fail, the
                // run's turn comes again), or the store did not answer, or the run could not be
                // read: its timer is still this coordinator's, so it tries again in a while.
                // (Meanwhile the run waits nowhere here, and a renewal may leave its timer to
                // every coordinator: then whichever sweeps it first goes on with it.)
                match error {
                    Error::ComputationStopped { .. } => {
                        tracing::debug!(run_id, "a run's turn was stopped by a cancel")
                    }
                    error => {
                        tracing::warn!(run_id, %error, "cannot go on with the run's computation; trying again")
                    }
                }
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
        // This coordinator's own, whose renewal is late (the store was unreachable): it goes on
        // here as it was.
        if self
            .held_entry(run_id, lease::CONTINUATION)
            .is_some_and(|held| held.attempt == entry.attempt)
        {
            return;
        }
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
                owner: None,
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
