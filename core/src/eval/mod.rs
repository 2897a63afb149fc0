//! The workflow's small languages, all evaluated without `eval`.
//!
//! - [`path`]: `context.<step>.<field>[0]`, the spec's safe path syntax (transforms).
//! - [`expr`]: JavaScript-like conditions over paths (`context.parallel-tests.success === true`).
//! - `jq`: `jq:` transforms, run by the jaq interpreter for reshaping paths cannot do
//!   ([`JqProgram`]).
//! - `transform`: what a transform step evaluates, a path or a jq program ([`Transform`]).

pub mod expr;
mod jq;
pub mod path;
mod transform;

pub(crate) use jq::go_on_installed;
pub use jq::{JqOutputLimits, JqProgram, JqRunner, JqSite, install_jq_runner, parse_output};
pub use transform::Transform;

use serde_json::Value;

/// What paths and expressions are evaluated against: the run's input and the visible results.
///
/// The engine's [`crate::Context`] implements it; tests can use any map.
pub trait Scope {
    /// The run's original input.
    fn input(&self) -> &Value;
    /// The latest successful data stored under `key` (a step id or an `output` alias).
    fn result(&self, key: &str) -> Option<&Value>;
    /// The whole scope as `{"input": ..., "context": {...}}`, the document jq programs see
    /// (with `"map"` inside a map step's chain).
    fn to_document(&self) -> Value;
    /// Inside a map step's chain, the item being run: `{"step", "item", "index", "count"}`.
    fn map_item(&self) -> Option<&Value> {
        None
    }
}
