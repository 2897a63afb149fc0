//! What people decide about a run: an approval step's decision, cancelling the run, and retrying
//! a failed one.

use baton_core::{Decision, Event};

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

    /// Stops a run now; tasks queued or running for it are dropped.
    pub async fn cancel(&self, run_id: &str, reason: &str) -> Result<RunRecord, Error> {
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

    /// Resumes a failed run from the step that failed ([`Event::Redrive`]), at `requested_by`'s
    /// request (empty without authentication): logged with the run's events, a `redriven`
    /// link on its state chain, and the run running again.
    pub async fn retry(&self, run_id: &str, requested_by: &str) -> Result<RunRecord, Error> {
        let stored = StoredEvent::Redrive {
            requested_by: requested_by.to_owned(),
        };
        let record = self
            .apply_logged(run_id, Event::Redrive, stored, None, true, None)
            .await?;
        tracing::info!(
            run_id,
            requested_by,
            "run retried from the step that failed"
        );
        Ok(record.expect("asked for"))
    }
}
