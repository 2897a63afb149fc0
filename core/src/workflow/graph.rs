//! Routing edges between steps, for reachability warnings (routes stay within the top level or
//! within one chain).

use super::{StepIndex, StepKind, Workflow};

/// Every step routing can go to from `index`, on any outcome.
pub fn successors(workflow: &Workflow, index: StepIndex) -> Vec<StepIndex> {
    let step = workflow.step(index);
    let mut out: Vec<StepIndex> = match &step.kind {
        StepKind::Condition {
            when_true,
            when_false,
            ..
        } => vec![*when_true, *when_false],
        StepKind::Approval {
            on_approve,
            on_reject,
            ..
        } => vec![*on_approve, *on_reject],
        StepKind::Agent { .. }
        | StepKind::Transform { .. }
        | StepKind::Parallel { .. }
        | StepKind::Map(_) => vec![step.on_success],
    }
    .into_iter()
    .flatten()
    .collect();
    out.extend(step.on_error);
    out
}

/// The steps of `scope` (the top level, or one chain; its first step is the entry) that no
/// route from the entry reaches, in document order.
pub fn unreachable(workflow: &Workflow, scope: &[StepIndex]) -> Vec<StepIndex> {
    let mut seen = vec![false; workflow.steps().len()];
    let mut stack = vec![scope[0]];
    while let Some(index) = stack.pop() {
        if std::mem::replace(&mut seen[index], true) {
            continue;
        }
        stack.extend(successors(workflow, index));
    }
    scope
        .iter()
        .copied()
        .filter(|index| !seen[*index])
        .collect()
}
