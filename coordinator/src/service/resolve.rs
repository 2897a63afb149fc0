//! Writes whose answer was lost, settled before anyone is answered: a caller is told a write was
//! done only if it was, and that it failed only if it never will be done.
//!
//! A create or a transition whose answer never came (it timed out on a busy Redis, the
//! connection dropped, replicas fell short of `--redis-wait-replicas`) may have been done, or may
//! still be done later. Telling the client it failed would be a lie half the time (a run told
//! failed still ran, and a retry started it twice); telling it it succeeded, the other half.
//! So the store is asked, on the run's own slot and in order with the write itself, which it was
//! ([`Runs::settle_create`], [`Runs::settle_transition`]), for up to [`SETTLE_PATIENCE`]:
//! - done: the caller goes on as if the answer had come (the transition's actions are carried
//!   out, the new run started);
//! - not done: the settle made sure it never will be (the run id voided, the version fenced),
//!   and the caller gets an error that says so, and that retrying is safe;
//! - still unknown (the store did not answer the settles either, or too many writes of others
//!   came since): an error that says the write may have been done, naming the run and how to
//!   look at it.
//!
//! Both errors are [`store::Error::Unavailable`] with those words, so that whatever retries an
//! unavailable store (an answer waits for it, then its task is queued again) goes on doing so.

use std::time::Duration;

use tokio::time::Instant;

use super::{Coordinator, Error};
use crate::store::{self, RunHeader, Runs, Settled, Store, TransitionWrite};

/// How long a write whose answer was lost is settled for before the caller is told it may have
/// been done: a client waits this much longer than the store's own timeout, at worst.
pub(super) const SETTLE_PATIENCE: Duration = Duration::from_secs(5);

/// The first pause between two settles; it doubles up to [`SETTLE_PAUSE_MAX`].
const SETTLE_PAUSE: Duration = Duration::from_millis(50);
const SETTLE_PAUSE_MAX: Duration = Duration::from_millis(500);

impl<S: Store> Coordinator<S> {
    /// `create_run`, settled: `Ok` once the run exists, whether its create answered or a settle
    /// found it.
    pub(super) async fn create_settled(
        &self,
        header: &RunHeader,
        first: TransitionWrite,
    ) -> Result<(), Error> {
        let why = match self.inner.store.create_run(header.clone(), first).await {
            Err(store::Error::Indeterminate(why)) => why,
            other => return Ok(other?),
        };
        let run_id = &header.run_id;
        tracing::warn!(run_id, %why, "a run's create went unanswered; settling it");
        match self.settle(|| self.inner.store.settle_create(header)).await {
            Some(Settled::Done) => Ok(()),
            Some(Settled::NotDone) => Err(unavailable(format!(
                "run {run_id} was not created, and never will be: its create went unanswered \
                 ({why}) and was voided; submitting again is safe"
            ))),
            Some(Settled::Unknown) | None => Err(unavailable(format!(
                "run {run_id} may exist: its create went unanswered ({why}) and could not be \
                 settled within {} s; check with `baton runs get {run_id}` before submitting \
                 again",
                SETTLE_PATIENCE.as_secs()
            ))),
        }
    }

    /// `apply_transition`, settled: the run's new version once the write is done, whether it
    /// answered or a settle found it. The write is given its `write_id` here.
    pub(super) async fn apply_settled(
        &self,
        run_id: &str,
        expected_version: u64,
        mut write: TransitionWrite,
    ) -> Result<u64, Error> {
        write.write_id = store::new_write_id();
        let write_id = write.write_id.clone();
        let why = match self
            .inner
            .store
            .apply_transition(run_id, expected_version, write)
            .await
        {
            Err(store::Error::Indeterminate(why)) => why,
            other => return Ok(other?),
        };
        tracing::warn!(run_id, %why, "a transition went unanswered; settling it");
        let settled = self
            .settle(|| {
                self.inner
                    .store
                    .settle_transition(run_id, expected_version, &write_id)
            })
            .await;
        match settled {
            Some(Settled::Done) => Ok(expected_version + 1),
            Some(Settled::NotDone) => Err(unavailable(format!(
                "the change to run {run_id} was not made, and never will be: it went unanswered \
                 ({why}) and was fenced; trying again is safe"
            ))),
            Some(Settled::Unknown) => Err(unavailable(format!(
                "the change to run {run_id} may have been made: it went unanswered ({why}) and \
                 the run moved on since; check with `baton runs get {run_id}` before trying again"
            ))),
            None => Err(unavailable(format!(
                "the change to run {run_id} may have been made: it went unanswered ({why}) and \
                 could not be settled within {} s; check with `baton runs get {run_id}` before \
                 trying again",
                SETTLE_PATIENCE.as_secs()
            ))),
        }
    }

    /// What `settle` answers, asked again while its own answer is lost or the store cannot be
    /// reached, for up to [`SETTLE_PATIENCE`]; `None` if it never answered. Settles are safe to
    /// repeat: each finds what the one before did.
    async fn settle<F, Fut>(&self, settle: F) -> Option<Settled>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Settled, store::Error>>,
    {
        let give_up = Instant::now() + SETTLE_PATIENCE;
        let mut pause = SETTLE_PAUSE;
        loop {
            match settle().await {
                Ok(settled) => return Some(settled),
                Err(error) if Instant::now() >= give_up => {
                    tracing::warn!(%error, "a lost write could not be settled");
                    return None;
                }
                Err(error) => {
                    tracing::debug!(%error, "a settle failed; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(SETTLE_PAUSE_MAX);
                }
            }
        }
    }
}

fn unavailable(why: String) -> Error {
    Error::Store(store::Error::Unavailable(why))
}
