//! `VerifyRun`: a run's state chain recomputed from a fresh read of the store, and its decision
//! index held against the decisions the chain holds.

use baton_core::Run;
use baton_core::handoff::DecisionRecord;

use super::{Coordinator, Error};
use crate::chain::{self, Mismatch};
use crate::decisions::StoredDecision;
use crate::store::{Listing, Store};

/// What verifying a run found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    pub ok: bool,
    /// How many links of the state chain were checked.
    pub links: u32,
    /// The chain's head as stored.
    pub state_sha256: String,
    /// The first problem, empty when there is none.
    pub problem: String,
    /// The step visit it is about, if any (empty, 0 otherwise).
    pub step_id: String,
    pub visit: u32,
}

impl<S: Store> Coordinator<S> {
    /// Recomputes a run's state chain from the store (not from this coordinator's memory).
    pub async fn verify(&self, run_id: &str) -> Result<Verification, Error> {
        let stored = self.stored_run(run_id).await?;
        let state_sha256 = stored.state_sha256.clone();
        let checked = match chain::replay_checked(&stored, &self.inner.workflows) {
            Ok(checked) => checked,
            Err(unreadable) => {
                return Ok(Verification {
                    ok: false,
                    links: 0,
                    state_sha256,
                    problem: unreadable.0,
                    step_id: String::new(),
                    visit: 0,
                });
            }
        };
        // A stored transform copy that does not match is reported here too, though a replay
        // does not depend on it: whichever comes first in the chain.
        let mut problems: Vec<Mismatch> = checked.repaired;
        problems.extend(checked.mismatch);
        if problems.is_empty() {
            problems.extend(self.check_decision_index(run_id, &checked.run).await?);
        }
        let problem = problems.into_iter().min_by_key(|m| m.link);
        let (step_id, visit) = problem
            .as_ref()
            .and_then(|m| m.step.clone())
            .unwrap_or_default();
        Ok(Verification {
            ok: problem.is_none(),
            links: checked.links as u32,
            state_sha256,
            problem: problem.map(|m| m.problem).unwrap_or_default(),
            step_id,
            visit,
        })
    }

    /// The decision index (the run's decisions as stored for search, with their embeddings)
    /// against the decisions the verified replay rebuilt: the first that differs, is missing or
    /// is extra.
    async fn check_decision_index(
        &self,
        run_id: &str,
        run: &Run,
    ) -> Result<Option<Mismatch>, Error> {
        let mut stored = self.inner.store.decisions(run_id).await?;
        let mismatch = |decision: &DecisionRecord, problem: String| Mismatch {
            step: Some((decision.step_id.clone(), decision.visit)),
            problem,
            link: usize::MAX,
        };
        for decision in run.decisions() {
            let Some(bytes) = stored.remove(&decision.key) else {
                return Ok(Some(mismatch(
                    decision,
                    format!(
                        "decision {} is missing from the decision index",
                        decision.key
                    ),
                )));
            };
            let indexed: Option<StoredDecision> = serde_json::from_slice(&bytes).ok();
            if indexed.as_ref().map(|d| &d.decision) != Some(decision.as_ref()) {
                return Ok(Some(mismatch(
                    decision,
                    format!(
                        "decision {} in the decision index differs from the one its step reported",
                        decision.key
                    ),
                )));
            }
        }
        Ok(stored.into_keys().next().map(|key| Mismatch {
            step: None,
            problem: format!("the decision index holds {key}, which no step reported"),
            link: usize::MAX,
        }))
    }
}
