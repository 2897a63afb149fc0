//! The routings of one step, each with the kind of edge it becomes. The targets are what the
//! engine follows: a condition's `then`/`else` and an approval's `on_approve` already fall back
//! to where success would go, so those steps draw no separate "next" edge.

use baton_core::workflow::{StepIndex, StepKind, Workflow};

use super::EdgeKind;

/// Where `index` can go, in a fixed order per step (its success routings, then `on_error`).
pub(super) fn routes(workflow: &Workflow, index: StepIndex) -> Vec<(EdgeKind, StepIndex)> {
    let step = workflow.step(index);
    let success: [(EdgeKind, Option<StepIndex>); 2] = match &step.kind {
        StepKind::Condition {
            when_true,
            when_false,
            ..
        } => [(EdgeKind::Then, *when_true), (EdgeKind::Else, *when_false)],
        StepKind::Approval {
            on_approve,
            on_reject,
            ..
        } => [
            (EdgeKind::OnApprove, *on_approve),
            (EdgeKind::OnReject, *on_reject),
        ],
        StepKind::Agent { .. }
        | StepKind::Transform { .. }
        | StepKind::Parallel { .. }
        | StepKind::Map(_) => [(EdgeKind::Next, step.on_success), (EdgeKind::Next, None)],
    };
    success
        .into_iter()
        .chain([(EdgeKind::OnError, step.on_error)])
        .filter_map(|(kind, target)| Some((kind, target?)))
        .collect()
}
