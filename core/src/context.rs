//! The run's context: the spec's immutable `WorkflowContext`.
//!
//! Adding a result returns a new context and leaves the old one untouched. Both share every
//! result they have in common (persistent maps and `Arc`ed values), so a context is cheap to
//! clone: the engine hands one to each parallel branch and keeps one per transition without
//! copying any step's data.

use std::sync::Arc;

use imbl::{OrdMap, Vector};
use serde::Serialize;
use serde::ser::SerializeMap;
use serde_json::Value;

use crate::eval::Scope;

/// One visit's result of a step, as stored under its context key.
#[derive(Debug, Clone, PartialEq)]
pub struct StepResult {
    pub step_id: Arc<str>,
    /// 1 for the first visit; a loop that comes back adds 2, 3, ...
    pub visit: u32,
    /// The step's data, or the error it failed with.
    pub outcome: Result<Arc<Value>, Arc<str>>,
}

impl StepResult {
    pub fn success(step_id: Arc<str>, visit: u32, data: Arc<Value>) -> Self {
        Self {
            step_id,
            visit,
            outcome: Ok(data),
        }
    }

    pub fn failure(step_id: Arc<str>, visit: u32, error: Arc<str>) -> Self {
        Self {
            step_id,
            visit,
            outcome: Err(error),
        }
    }

    pub fn data(&self) -> Option<&Arc<Value>> {
        self.outcome.as_ref().ok()
    }
}

/// Results of a run's steps by context key (step id or `output` alias), every version kept.
#[derive(Debug, Clone)]
pub struct Context {
    input: Arc<Value>,
    results: OrdMap<Arc<str>, Vector<StepResult>>,
}

impl Context {
    pub fn new(input: Value) -> Self {
        Self {
            input: Arc::new(input),
            results: OrdMap::new(),
        }
    }

    pub fn input(&self) -> &Arc<Value> {
        &self.input
    }

    /// A new context with `result` as the latest version under `key`.
    #[must_use]
    pub fn with_result(&self, key: Arc<str>, result: StepResult) -> Context {
        let mut results = self.results.clone();
        results.entry(key).or_default().push_back(result);
        Context {
            input: self.input.clone(),
            results,
        }
    }

    /// The latest version under `key`, successful or not.
    pub fn latest(&self, key: &str) -> Option<&StepResult> {
        self.results.get(key).and_then(Vector::last)
    }

    /// Every version under `key`, oldest first.
    pub fn versions(&self, key: &str) -> impl Iterator<Item = &StepResult> {
        self.results.get(key).into_iter().flatten()
    }

    /// The data agents see as `context.<key>`: the latest version, if it succeeded.
    pub fn data(&self, key: &str) -> Option<&Arc<Value>> {
        self.latest(key).and_then(StepResult::data)
    }

    /// Every visible entry, by key in sorted order.
    pub fn visible(&self) -> impl Iterator<Item = (&Arc<str>, &Arc<Value>)> {
        self.results
            .iter()
            .filter_map(|(key, versions)| versions.last()?.data().map(|data| (key, data)))
    }

    /// The `context` object agents receive.
    pub fn to_value(&self) -> Value {
        Value::Object(
            self.visible()
                .map(|(key, data)| (key.to_string(), Value::clone(data)))
                .collect(),
        )
    }

    /// Serialises as the `context` object without copying it first.
    pub fn visible_serializer(&self) -> VisibleContext<'_> {
        VisibleContext(self)
    }
}

/// The visible context, serialised as a JSON object.
pub struct VisibleContext<'a>(&'a Context);

impl Serialize for VisibleContext<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        for (key, data) in self.0.visible() {
            map.serialize_entry(key.as_ref(), data.as_ref())?;
        }
        map.end()
    }
}

impl Scope for Context {
    fn input(&self) -> &Value {
        &self.input
    }

    fn result(&self, key: &str) -> Option<&Value> {
        self.data(key).map(Arc::as_ref)
    }

    fn to_document(&self) -> Value {
        serde_json::json!({"input": Value::clone(&self.input), "context": self.to_value()})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(id: &str, visit: u32, data: Value) -> StepResult {
        StepResult::success(id.into(), visit, Arc::new(data))
    }

    #[test]
    fn adding_returns_a_new_context_and_leaves_the_old_one_alone() {
        let empty = Context::new(json!("Build a dark mode toggle"));
        let with_plan = empty.with_result("plan".into(), ok("plan", 1, json!({"files": []})));
        assert_eq!(empty.to_value(), json!({}));
        assert_eq!(with_plan.to_value(), json!({"plan": {"files": []}}));
    }

    #[test]
    fn clones_share_the_stored_data() {
        let context = Context::new(json!(null))
            .with_result("plan".into(), ok("plan", 1, json!({"big": "x"})));
        let clone = context.clone();
        assert!(Arc::ptr_eq(
            context.data("plan").unwrap(),
            clone.data("plan").unwrap()
        ));
        let later = context.with_result("code".into(), ok("code", 1, json!(1)));
        assert!(Arc::ptr_eq(
            context.data("plan").unwrap(),
            later.data("plan").unwrap()
        ));
    }

    #[test]
    fn revisits_add_versions_and_the_latest_wins() {
        let context = Context::new(json!(null))
            .with_result("plan".into(), ok("plan", 1, json!("first")))
            .with_result("plan".into(), ok("plan", 2, json!("second")));
        assert_eq!(
            context.data("plan").map(|d| d.as_ref().clone()),
            Some(json!("second"))
        );
        let visits: Vec<u32> = context.versions("plan").map(|r| r.visit).collect();
        assert_eq!(visits, [1, 2]);
    }

    #[test]
    fn a_failed_latest_version_hides_the_key_but_keeps_history() {
        let context = Context::new(json!(null))
            .with_result("code".into(), ok("code", 1, json!("v1")))
            .with_result(
                "code".into(),
                StepResult::failure("code".into(), 2, "boom".into()),
            );
        assert_eq!(context.data("code"), None);
        assert_eq!(context.to_value(), json!({}));
        assert_eq!(context.versions("code").count(), 2);
    }

    #[test]
    fn serialises_the_visible_context_like_to_value() {
        let context = Context::new(json!(null))
            .with_result("b".into(), ok("b", 1, json!([1])))
            .with_result("a".into(), ok("a", 1, json!({"x": true})));
        let streamed = serde_json::to_value(context.visible_serializer()).unwrap();
        assert_eq!(streamed, context.to_value());
    }
}
