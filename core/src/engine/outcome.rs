//! How a step settled ([`Outcome`]) and what its settling reports besides: a rejected
//! approval's error, and a parallel or map step's data, the spec's `Promise.allSettled` shape:
//!
//! ```json
//! {"success": true,
//!  "data": [{"stepId": "unit", "status": "fulfilled", "result": {...}, "error": null}, ...]}
//! ```
//! `success` is true when every branch succeeded; `data` keeps workflow order, whatever order the
//! branches finished in (a map step's entries carry their item's `index` instead of a `stepId`).
//! Pure functions, shared by the top-level steps ([`super::transition`]), the branches
//! ([`super::parallel`]) and the map items ([`super::map`]) that settle.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::events::Decision;
use crate::workflow::Step;

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

/// How one branch settled: its data, or its error.
pub(super) type BranchOutcome = Result<Arc<Value>, Arc<str>>;

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

/// The error of an approval that was turned down: who rejected it, and why, when they said.
pub(super) fn rejection_error(step: &Step, decision: &Decision) -> Arc<str> {
    let by = decision
        .approver
        .as_deref()
        .map(|approver| format!(" by {approver}"))
        .unwrap_or_default();
    let comment = decision
        .comment
        .as_deref()
        .map(|comment| format!(": {comment}"))
        .unwrap_or_default();
    format!("approval \"{}\" was rejected{by}{comment}", step.id).into()
}
