//! What a transform step evaluates: a safe path (the spec's Method 3) or a `jq:` program.

use serde_json::Value;

use super::Scope;
use super::jq::{JqProgram, JqSite};
use super::path::Path;

/// The prefix that marks a transform as a jq program.
pub const JQ_PREFIX: &str = "jq:";

#[derive(Debug, Clone, PartialEq)]
pub enum Transform {
    /// `context.plan.files`: the value at that path, failing with the spec's messages.
    Path(Path),
    /// `jq: [.context.plan.files[] | ascii_upcase]`.
    Jq(JqProgram),
}

impl Transform {
    /// Parses `text`; `max_path_len` and `max_jq_len` bound the two forms.
    pub fn parse(text: &str, max_path_len: usize, max_jq_len: usize) -> Result<Self, String> {
        match text.trim_start().strip_prefix(JQ_PREFIX) {
            Some(program) => {
                let length = program.chars().count();
                if length > max_jq_len {
                    return Err(format!(
                        "jq program is {length} characters long; the limit is {max_jq_len}"
                    ));
                }
                JqProgram::compile(program.trim()).map(Transform::Jq)
            }
            None => {
                let length = text.chars().count();
                if length > max_path_len {
                    return Err(format!(
                        "path is {length} characters long; the limit is {max_path_len}"
                    ));
                }
                Path::parse(text).map(Transform::Path)
            }
        }
    }

    /// Produces the step's data, or the error that fails the step. `site` names the
    /// evaluation for the jq runner.
    pub fn evaluate(&self, scope: &impl Scope, site: &JqSite<'_>) -> Result<Value, String> {
        match self {
            Transform::Path(path) => path
                .resolve_strict(scope)
                .cloned()
                .map_err(|error| error.to_string()),
            Transform::Jq(program) => super::jq::run_installed(site, program, &scope.to_document()),
        }
    }

    /// Whether evaluating it runs a jq program (a path costs next to nothing).
    pub fn is_jq(&self) -> bool {
        matches!(self, Transform::Jq(_))
    }
}
