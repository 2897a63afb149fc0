//! Where a settled top-level step leads: a pure function of the step and its outcome.

use super::outcome::Outcome;
use crate::workflow::{Step, StepIndex, StepKind};

/// Where to go next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Continue at this step.
    Goto(StepIndex),
    /// The step failed (or a branch did) and `on_error` takes over.
    Recover(StepIndex),
    /// Nothing follows: the run succeeded.
    End,
    /// The step failed and nothing handles it: the run fails.
    Fail,
}

/// The route for a settled top-level step.
pub fn route(step: &Step, outcome: &Outcome) -> Route {
    let goto = |target: Option<StepIndex>| target.map_or(Route::End, Route::Goto);
    let recover = || step.on_error.map_or(Route::Fail, Route::Recover);
    match (outcome, &step.kind) {
        (Outcome::Failed(_), _) => recover(),
        (
            Outcome::Condition(value),
            StepKind::Condition {
                when_true,
                when_false,
                ..
            },
        ) => goto(if *value { *when_true } else { *when_false }),
        (
            Outcome::Approval(decision),
            StepKind::Approval {
                on_approve,
                on_reject,
                ..
            },
        ) => match (decision.approved, on_reject) {
            (true, _) => goto(*on_approve),
            (false, Some(target)) => Route::Goto(*target),
            (false, None) => recover(),
        },
        (
            Outcome::Merged {
                failed: Some(_), ..
            },
            _,
        ) => recover(),
        // A failed branch does not fail the parallel step: its data says which failed, and
        // `on_error`, when set, is where the workflow wants to handle that. The same goes for
        // a map step's items. With `tolerated_failures`, the failures it tolerates go on; more
        // fail it (above).
        (
            Outcome::Merged {
                all_succeeded: false,
                ..
            },
            _,
        ) if step.tolerated_failures().is_some() => goto(step.on_success),
        (
            Outcome::Merged {
                all_succeeded: false,
                ..
            },
            _,
        ) if step.on_error.is_some() => recover(),
        _ => goto(step.on_success),
    }
}
