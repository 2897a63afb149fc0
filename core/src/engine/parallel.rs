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

/// How many failures a summary names; a map of thousands of items says how many more failed.
const NAMED_FAILURES: usize = 5;

/// The error a parallel or map step reports when one of its own branches or items failed
/// (to its parent, or as its own error): which ones, and why.
pub fn failure_summary(data: &Value) -> Arc<str> {
    let rejected: Vec<&Value> = data["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|entry| entry["status"] == "rejected")
        .collect();
    let named: Vec<String> = rejected
        .iter()
        .take(NAMED_FAILURES)
        .map(|entry| {
            let which = match entry.get("stepId").and_then(Value::as_str) {
                Some(step) => step.to_owned(),
                None => format!("item {}", entry["index"]),
            };
            format!("{which}: {}", entry["error"].as_str().unwrap_or_default())
        })
        .collect();
    let more = match rejected.len().saturating_sub(NAMED_FAILURES) {
        0 => String::new(),
        more => format!("; and {more} more"),
    };
    let what = if data["data"][0].get("index").is_some() {
        "items"
    } else {
        "branches"
    };
    format!("{what} failed: {}{more}", named.join("; ")).into()
}
