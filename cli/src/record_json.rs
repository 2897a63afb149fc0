//! A run record as `--json` prints it: the record, with its JSON fields read and each wait
//! explained.

use baton_proto::v1;
use serde_json::{Value, json};

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
                "usage": (!s.usage.is_empty()).then(|| s.usage.iter().map(|used| {
                    let usage = used.usage.clone().unwrap_or_default();
                    json!({
                        "visit": used.visit,
                        "attempt": used.attempt,
                        "model": usage.model,
                        "prompt_tokens": usage.prompt_tokens,
                        "completion_tokens": usage.completion_tokens,
                    })
                }).collect::<Vec<_>>()),
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
        "submitted_by": (!record.submitted_by.is_empty()).then_some(&record.submitted_by),
        "usage": record.usage.iter().map(|usage| json!({
            "model": usage.model,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
        })).collect::<Vec<_>>(),
    })
}
