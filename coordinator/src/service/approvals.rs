//! What people decide about a run: an approval step's decision, cancelling the run, and retrying
//! a failed one. Cancelling and retrying are for the run's owner or an operator
//! ([`super::ownership`]); deciding an approval is for any approver, as the gate checks.

use baton_core::{Decision, Event};

use super::ownership::{Requester, RunChange, may_change};
use super::{Coordinator, Error};
use crate::model::StoredEvent;
use crate::record::RunRecord;
use crate::store::Store;

/// The reason a cancel without one gives.
const CANCELLED: &str = "cancelled";

impl<S: Store> Coordinator<S> {
    /// A person decided an approval step.
    pub async fn decide(
        &self,
        run_id: &str,
        step_id: &str,
        decision: Decision,
    ) -> Result<RunRecord, Error> {
        let event = Event::ApprovalDecided {
            step_id: step_id.to_owned(),
            decision,
        };
        let record = self
            .apply(run_id, event, None, true, None)
            .await
            .map_err(|e| match e {
                Error::NotAwaitingApproval { .. } => Error::NotAwaitingApproval {
                    run_id: run_id.to_owned(),
                    step_id: step_id.to_owned(),
                },
                other => other,
            })?;
        Ok(record.expect("asked for"))
    }

    /// Stops a run now; tasks queued or running for it are dropped. `by` must own the run or
    /// operate ([`may_change`]); `None` when the coordinator does not authenticate.
    pub async fn cancel(
        &self,
        run_id: &str,
        reason: &str,
        by: Option<&Requester>,
    ) -> Result<RunRecord, Error> {
        self.check_owner(run_id, by, RunChange::Cancel).await?;
        let reason = if reason.is_empty() { CANCELLED } else { reason };
        let event = Event::Cancel {
            reason: reason.to_owned(),
        };
        // A jq program the run is running here stops now, its transition dropped, so that the
        // cancel does not wait for it (the run is locked while it runs); so does any other
        // transition of the run that would run jq before the cancel is applied.
        let _stopped = self.inner.aborts.stop(run_id);
        let record = self.apply(run_id, event, None, true, None).await?;
        Ok(record.expect("asked for"))
    }

    /// Resumes a failed run from the step that failed ([`Event::Redrive`]), at `by`'s request
    /// (`None` without authentication; it must own the run or operate, [`may_change`]): logged
    /// with the run's events, a `redriven` link on its state chain, and the run running again.
    pub async fn retry(&self, run_id: &str, by: Option<&Requester>) -> Result<RunRecord, Error> {
        self.check_owner(run_id, by, RunChange::Retry).await?;
        let requested_by = by.map(|by| by.name.as_str());
        let stored = StoredEvent::Redrive {
            requested_by: requested_by.map(str::to_owned),
        };
        let record = self
            .apply_logged(run_id, Event::Redrive, stored, None, true, None)
            .await?;
        tracing::info!(
            run_id,
            requested_by = requested_by.unwrap_or_default(),
            "run retried from the step that failed"
        );
        Ok(record.expect("asked for"))
    }

    /// Refuses `change` of `run_id` unless `by` may ask for it, judged against the principal
    /// stored as the run's submitter. Read before the change, apart from it: who submitted a
    /// run never changes.
    async fn check_owner(
        &self,
        run_id: &str,
        by: Option<&Requester>,
        change: RunChange,
    ) -> Result<(), Error> {
        if by.is_none() {
            return Ok(());
        }
        // Read as any read is: a run whose jq program runs here holds its lock meanwhile, and
        // a cancel must not wait for it (the submitter never changes, so any copy will do).
        let owner = self
            .read_fresh(run_id, |loaded| loaded.header.submitted_by.clone())
            .await?;
        may_change(by, &owner, run_id, change)
    }
}
