//! How the branches of a parallel step merge: the spec's `Promise.allSettled` shape.
//!
//! ```json
//! {"success": true,
//!  "data": [{"stepId": "unit", "status": "fulfilled", "result": {...}, "error": null}, ...]}
//! ```
//! `success` is true when every branch succeeded; `data` keeps workflow order, whatever order the
//! branches finished in.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::BranchOutcome;

/// Builds the parallel step's data from its branches' ids and outcomes, in workflow order.
pub fn merge<'a>(
    branches: impl IntoIterator<Item = (&'a str, &'a BranchOutcome)>,
) -> (Value, bool) {
    let mut all_succeeded = true;
    let data: Vec<Value> = branches
        .into_iter()
        .map(|(step_id, outcome)| {
            let mut entry = Map::with_capacity(4);
            entry.insert("stepId".into(), json!(step_id));
            match outcome {
                Ok(result) => {
                    entry.insert("status".into(), json!("fulfilled"));
                    entry.insert("result".into(), Value::clone(result));
                    entry.insert("error".into(), Value::Null);
                }
                Err(error) => {
                    all_succeeded = false;
                    entry.insert("status".into(), json!("rejected"));
                    entry.insert("result".into(), Value::Null);
                    entry.insert("error".into(), json!(error.as_ref()));
                }
            }
            Value::Object(entry)
        })
        .collect();
    (
        json!({"success": all_succeeded, "data": data}),
        all_succeeded,
    )
}

/// The error a parallel step that is itself a branch reports to its parent when one of its own
/// branches failed: which ones, and why.
pub fn failure_summary(data: &Value) -> Arc<str> {
    let failed: Vec<String> = data["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|entry| entry["status"] == "rejected")
        .map(|entry| {
            format!(
                "{}: {}",
                entry["stepId"].as_str().unwrap_or_default(),
                entry["error"].as_str().unwrap_or_default()
            )
        })
        .collect();
    format!("branches failed: {}", failed.join("; ")).into()
}
