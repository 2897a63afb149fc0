//! A run record as JSON: what `baton runs get --json` prints and what the web UI reads, from
//! the wire record, with its JSON fields read and each wait explained.

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
                "items": s.items.as_ref().map(|items| json!({
                    "count": items.count,
                    "succeeded": items.succeeded,
                    "failed": items.failed,
                    "running": items.running,
                })),
            })
        })
        .collect();
    json!({
        "run_id": record.run_id,
        "workflow_id": record.workflow_id,
        "status": record.status,
        "error": (!record.error.is_empty()).then_some(&record.error),
        "context": context,
        "steps": steps,
        "waiting": waiting_to_json(&record.waiting),
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

/// What a running run waits for, each wait explained (`note`).
pub fn waiting_to_json(waiting: &[v1::Waiting]) -> Value {
    waiting
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
            "compute" => json!({
                "kind": "compute", "step_id": w.step_id,
                "note": format!("step \"{}\" waits for its turn to run its jq program", w.step_id),
            }),
            _ => json!({
                "kind": "approval", "step_id": w.step_id, "message": w.message,
                "note": format!("step \"{}\" waits for an approval: {}", w.step_id, w.message),
            }),
        })
        .collect()
}

/// A watch event as JSON: its kind (the SSE event name) and its fields.
pub fn event_to_json(event: &v1::RunEvent) -> Option<(&'static str, Value)> {
    use v1::run_event::Event;
    let data = |json: &Option<baton_proto::Json>| {
        json.as_ref()
            .and_then(|json| serde_json::from_slice::<Value>(&json.json).ok())
            .unwrap_or(Value::Null)
    };
    let text = |text: &str| (!text.is_empty()).then(|| text.to_owned());
    Some(match event.event.as_ref()? {
        Event::StepStarted(started) => (
            "step_started",
            json!({
                "step_id": started.step_id, "visit": started.visit,
                "agent": text(&started.agent), "worker_id": text(&started.worker_id),
            }),
        ),
        Event::StepFinished(finished) => (
            "step_finished",
            json!({
                "step_id": finished.step_id, "visit": finished.visit, "status": finished.status,
                "data": data(&finished.data), "error": text(&finished.error),
                "next": text(&finished.next), "parent": text(&finished.parent),
            }),
        ),
        Event::ApprovalRequested(requested) => (
            "approval_requested",
            json!({
                "step_id": requested.step_id, "visit": requested.visit,
                "message": requested.message,
            }),
        ),
        Event::RunFinished(finished) => (
            "run_finished",
            json!({ "record": finished.record.as_ref().map(record_to_json) }),
        ),
        Event::StepOutput(output) => (
            "step_output",
            json!({
                "step_id": output.step_id, "visit": output.visit, "attempt": output.attempt,
                "text": output.text, "restart": output.restart, "offset": output.offset,
            }),
        ),
        Event::OutputMissed(missed) => ("output_missed", json!({ "pieces": missed.pieces })),
        Event::MapProgress(progress) => (
            "map_progress",
            json!({
                "step_id": progress.step_id, "visit": progress.visit, "count": progress.count,
                "succeeded": progress.succeeded, "failed": progress.failed,
                "running": progress.running,
            }),
        ),
    })
}
