//! Where a settled top-level step leads: a pure function of the step and its outcome.

use std::sync::Arc;

use serde_json::Value;

use super::Decision;
use crate::workflow::{Step, StepIndex, StepKind};

/// How a step settled.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// An agent or transform produced data.
    Data(Arc<Value>),
    /// The step failed with this error.
    Failed(Arc<str>),
    /// A condition evaluated to this.
    Condition(bool),
    /// A person decided.
    Approval(Decision),
    /// Every branch (or map item) settled; `data` is `{"success", "data": [...]}`. `failed`
    /// says why the step itself failed: more map items failed than it tolerates.
    Merged {
        data: Arc<Value>,
        all_succeeded: bool,
        failed: Option<Arc<str>>,
    },
}

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
