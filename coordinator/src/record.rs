//! What a client sees of a run: the run record, the step states, and the run's memory.

use std::collections::BTreeMap;

use baton_core::workflow::{StepKind, Workflow};
use baton_core::{Run, Waiting};
use baton_proto::v1;
use serde_json::{Value, json};

use crate::model::StepState;

/// The run's memory: its message history, the decisions its agents reported, and every
/// handoff into an agent step.
pub fn memory(run: &Run) -> Value {
    json!({
        "messages": run.messages().messages(),
        "decisions": run.decisions().iter().map(|d| d.as_ref()).collect::<Vec<_>>(),
        "handoffs": run.handoffs().iter().map(|h| h.as_ref()).collect::<Vec<_>>(),
    })
}

/// Every step in workflow order, with its state ("pending" if never entered).
pub fn step_states(workflow: &Workflow, steps: &BTreeMap<String, StepState>) -> Vec<v1::StepState> {
    workflow
        .steps()
        .iter()
        .map(|step| {
            let state = steps
                .get(step.id.as_ref())
                .cloned()
                .unwrap_or_else(|| StepState {
                    status: "pending".into(),
                    ..StepState::default()
                });
            v1::StepState {
                step_id: step.id.to_string(),
                r#type: step.step_type().as_str().into(),
                status: state.status,
                attempts: state.attempts,
                visits: state.visits,
                worker_id: state.worker_id,
                parent: step
                    .parent
                    .map(|p| workflow.step(p).id.to_string())
                    .unwrap_or_default(),
                agent: match &step.kind {
                    StepKind::Agent { agent } => agent.clone(),
                    _ => String::new(),
                },
                error: state.error,
            }
        })
        .collect()
}

/// What a running run waits for; `served` says whether a connected worker serves an agent.
pub fn waiting(run: &Run, served: impl Fn(&str) -> bool) -> Vec<v1::Waiting> {
    run.waiting()
        .into_iter()
        .map(|waiting| match waiting {
            Waiting::Agent { task, agent } => v1::Waiting {
                kind: "agent".into(),
                step_id: task.step_id.to_string(),
                served: served(&agent),
                agent,
                message: String::new(),
            },
            Waiting::Approval { step_id, message } => v1::Waiting {
                kind: "approval".into(),
                step_id: step_id.to_string(),
                agent: String::new(),
                served: false,
                message,
            },
        })
        .collect()
}

/// The run record as the CLI prints it with `--json`.
pub fn record_to_json(record: &v1::RunRecord) -> Value {
    let context: Value = record
        .context
        .as_ref()
        .and_then(|c| serde_json::from_slice(&c.json).ok())
        .unwrap_or(Value::Null);
    let memory: Value = record
        .memory
        .as_ref()
        .and_then(|m| serde_json::from_slice(&m.json).ok())
        .unwrap_or(Value::Null);
    let steps: Vec<Value> = record
        .steps
        .iter()
        .map(|s| {
            json!({
                "id": s.step_id,
                "type": s.r#type,
                "status": s.status,
                "attempts": s.attempts,
                "visits": s.visits,
                "worker_id": (!s.worker_id.is_empty()).then_some(&s.worker_id),
                "parent": (!s.parent.is_empty()).then_some(&s.parent),
                "agent": (!s.agent.is_empty()).then_some(&s.agent),
                "error": (!s.error.is_empty()).then_some(&s.error),
            })
        })
        .collect();
    let waiting: Vec<Value> = record
        .waiting
        .iter()
        .map(|w| match w.kind.as_str() {
            "agent" => json!({
                "kind": "agent", "step_id": w.step_id, "agent": w.agent, "served": w.served,
                "note": if w.served {
                    format!("step \"{}\" waits for a free worker serving agent \"{}\"", w.step_id, w.agent)
                } else {
                    format!("step \"{}\" waits for agent \"{}\": no connected worker serves it", w.step_id, w.agent)
                },
            }),
            _ => json!({
                "kind": "approval", "step_id": w.step_id, "message": w.message,
                "note": format!("step \"{}\" waits for an approval: {}", w.step_id, w.message),
            }),
        })
        .collect();
    json!({
        "run_id": record.run_id,
        "workflow_id": record.workflow_id,
        "status": record.status,
        "error": (!record.error.is_empty()).then_some(&record.error),
        "context": context,
        "steps": steps,
        "waiting": waiting,
        "state_sha256": record.state_sha256,
        "messages": memory["messages"],
        "decisions": memory["decisions"],
        "handoffs": memory["handoffs"],
        "created_ms": record.created_ms,
        "updated_ms": record.updated_ms,
        "trace_id": (!record.trace_id.is_empty()).then_some(&record.trace_id),
    })
}
