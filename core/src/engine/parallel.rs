//! Parallel steps in a transition: an `impl Builder` that starts a parallel step's branches
//! against one snapshot, files their outcomes as they settle and settles the step when the last
//! does (at once, when more fail than its `tolerated_failures`), its data merged in the spec's
//! `Promise.allSettled` shape ([`super::outcome`]).

use std::sync::Arc;

use imbl::Vector;
use serde_json::json;

use super::build::{Builder, Settled};
use super::outcome::{BranchOutcome, Outcome, failure_summary, merge, rejection_error};
use super::pending::{ParallelRun, Pending};
use super::status::{StepRecord, StepStatus};
use crate::context::Context;
use crate::workflow::{Step, StepIndex, StepKind};

/// Parallel steps in a transition: starting the branches, filing their outcomes, settling.
impl Builder {
    /// Starts a parallel step: every branch against one snapshot (a redrive keeps the branches
    /// that succeeded). Returns its outcome when it settles at once.
    pub(super) fn begin_parallel(
        &mut self,
        index: StepIndex,
        visit: u32,
        snapshot: &Context,
    ) -> Option<Outcome> {
        let workflow = self.run.workflow.clone();
        let StepKind::Parallel { branches, .. } = &workflow.step(index).kind else {
            unreachable!("only parallel steps begin as parallel steps");
        };
        // A redrive keeps the branches that succeeded in the visit that failed.
        let kept = match self.kept.take() {
            Some((step, kept)) if step == index && kept.len() == branches.len() => Some(kept),
            other => {
                self.kept = other;
                None
            }
        };
        // Every branch starts from the same snapshot and none sees another's result.
        let mut outcomes = Vector::new();
        let handed = Vector::from(vec![None; branches.len()]);
        let mut remaining = 0;
        for (slot, &branch) in branches.iter().enumerate() {
            if let Some(Some(Ok(result))) = kept.as_ref().map(|kept| kept[slot].clone()) {
                outcomes.push_back(Some(Ok(result)));
                continue;
            }
            let branch_visit = self.bump_visit(branch);
            match self.begin(branch, branch_visit, snapshot, None) {
                Some(outcome) => {
                    let settled = self.record_branch(branch, branch_visit, outcome);
                    outcomes.push_back(Some(settled));
                }
                None => {
                    outcomes.push_back(None);
                    remaining += 1;
                }
            }
        }
        self.run.pending.insert(
            index,
            Pending::Parallel(Box::new(ParallelRun {
                visit,
                outcomes,
                handed,
                remaining,
            })),
        );
        self.parallel_settles(index).map(|(_, _, outcome)| outcome)
    }
    pub(super) fn merge(&self, step: &Step, outcomes: &Vector<Option<BranchOutcome>>) -> Outcome {
        let StepKind::Parallel { branches, .. } = &step.kind else {
            unreachable!("only parallel steps merge");
        };
        let workflow = &self.run.workflow;
        let (data, all_succeeded) = merge(branches.iter().zip(outcomes.iter()).filter_map(
            |(&branch, outcome)| Some((workflow.step(branch).id.as_ref(), outcome.as_ref()?)),
        ));
        Outcome::Merged {
            data: Arc::new(data),
            all_succeeded,
            failed: None,
        }
    }

    /// Files a branch's outcome into its parallel step; returns the parallel step once every
    /// branch has settled (or more have failed than it tolerates).
    pub(super) fn settle_branch(
        &mut self,
        parent: StepIndex,
        branch: StepIndex,
        visit: u32,
        outcome: Outcome,
    ) -> Option<Settled> {
        let settled = self.record_branch(branch, visit, outcome);
        let workflow = self.run.workflow.clone();
        let StepKind::Parallel { branches, .. } = &workflow.step(parent).kind else {
            unreachable!("a branch's parent is a parallel step");
        };
        let slot = branches.iter().position(|&b| b == branch)?;
        let Some(Pending::Parallel(waiting)) = self.run.pending.get_mut(&parent) else {
            return None;
        };
        waiting.outcomes.set(slot, Some(settled));
        waiting.remaining -= 1;
        self.parallel_settles(parent)
    }

    /// Whether the parallel step `index` (pending) has settled: every branch has, or more have
    /// failed than it tolerates (then the others are abandoned at once). Takes it out of
    /// `pending` and merges what its branches handed on if so.
    pub(super) fn parallel_settles(&mut self, index: StepIndex) -> Option<Settled> {
        let workflow = self.run.workflow.clone();
        let step = workflow.step(index);
        let Some(Pending::Parallel(waiting)) = self.run.pending.get(&index).cloned() else {
            return None;
        };
        let ParallelRun {
            visit,
            outcomes,
            handed,
            remaining,
        } = *waiting;
        let failed = outcomes
            .iter()
            .filter(|o| matches!(o, Some(Err(_))))
            .count();
        let given_up = step
            .tolerated_failures()
            .filter(|tolerance| tolerance.exceeded_by(failed, outcomes.len()))
            .map(|tolerance| {
                format!(
                    "{failed} of {} branches failed; tolerated_failures is {tolerance}",
                    outcomes.len()
                )
            });
        if remaining > 0 && given_up.is_none() {
            return None;
        }
        self.run.pending.remove(&index);
        let mut outcomes = outcomes;
        if let Some(why) = &given_up {
            let StepKind::Parallel { branches, .. } = &step.kind else {
                unreachable!("only parallel steps are pending as parallel");
            };
            for (slot, &branch) in branches.iter().enumerate() {
                if outcomes[slot].is_none() {
                    self.abandon(branch);
                    outcomes.set(slot, Some(Err(format!("abandoned: {why}").into())));
                }
            }
        }
        self.merge_handed(index, &handed);
        let outcome = match (self.merge(step, &outcomes), given_up) {
            (
                Outcome::Merged {
                    data,
                    all_succeeded,
                    ..
                },
                Some(why),
            ) => Outcome::Merged {
                data,
                all_succeeded,
                failed: Some(why.into()),
            },
            (merged, None) => merged,
            _ => unreachable!("a parallel step merges"),
        };
        Some((index, visit, outcome))
    }

    /// Turns a branch's outcome into the fulfilled/rejected form and keeps it in the history.
    pub(super) fn record_branch(
        &mut self,
        branch: StepIndex,
        visit: u32,
        outcome: Outcome,
    ) -> BranchOutcome {
        let workflow = self.run.workflow.clone();
        let step = workflow.step(branch);
        let (settled, status): (BranchOutcome, StepStatus) = match outcome {
            Outcome::Data(data) => (Ok(data), StepStatus::Succeeded),
            Outcome::Failed(error) => (Err(error), StepStatus::Failed),
            Outcome::Approval(decision) if decision.approved => {
                (Ok(Arc::new(decision.to_value())), StepStatus::Succeeded)
            }
            Outcome::Approval(decision) => {
                (Err(rejection_error(step, &decision)), StepStatus::Rejected)
            }
            Outcome::Merged {
                failed: Some(error),
                ..
            } => (Err(error), StepStatus::Failed),
            Outcome::Merged {
                data,
                all_succeeded: true,
                ..
            } => (Ok(data), StepStatus::Succeeded),
            // A step that tolerates its failures succeeded, as its route says.
            Outcome::Merged { data, .. } if step.tolerated_failures().is_some() => {
                (Ok(data), StepStatus::Succeeded)
            }
            Outcome::Merged { data, .. } => (Err(failure_summary(&data)), StepStatus::Failed),
            // Validation keeps conditions out of branches; a value is still the honest answer.
            Outcome::Condition(value) => (Ok(Arc::new(json!(value))), StepStatus::Succeeded),
        };
        let parent = step.parent.map(|p| workflow.step(p).id.clone());
        self.run.history.push_back(StepRecord {
            step_id: step.id.clone(),
            step_type: step.step_type(),
            visit,
            parent,
            item: None,
            status,
            data: settled.as_ref().ok().cloned(),
            error: settled.as_ref().err().cloned(),
            next: None,
            notes: self.notes.take(),
            at_ms: self.run.now_ms,
        });
        settled
    }
}
