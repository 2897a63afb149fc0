//! Document text to a validated [`Workflow`], with every problem reported at once.
//!
//! Reading goes in three passes: the text to JSON (`json`: comments and trailing commas allowed,
//! since the spec's own examples carry them), each step to a `RawStep` on its own (`steps`: so
//! one malformed step does not hide the problems of the others), then the checks that need the
//! whole document (`validate`): ids, references, expressions, limits and reachability. Every
//! problem is kept with its step (`checker`) and reported in document order.

use serde_json::Value;

use super::Workflow;
use super::checker::{Checker, json_path};
use super::json::read_json;
use super::raw::{RawWorkflow, WORKFLOW_FIELDS};
use super::steps::Checked;
use crate::diagnostics::{Diagnostic, Diagnostics};
use crate::limits::{DEFAULT_MAX_VISITS, Limits};

/// A valid workflow and the warnings found on the way.
#[derive(Debug)]
pub struct Parsed {
    pub workflow: Workflow,
    pub warnings: Vec<Diagnostic>,
}

/// The document is not a valid workflow. Holds every problem found, warnings included.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid workflow:\n{diagnostics}")]
pub struct ParseError {
    pub diagnostics: Diagnostics,
}

/// Parses and validates workflow text with the default [`Limits`].
pub fn parse_workflow(text: &str) -> Result<Parsed, ParseError> {
    parse_workflow_with(text, &Limits::default())
}

/// Parses and validates workflow text.
pub fn parse_workflow_with(text: &str, limits: &Limits) -> Result<Parsed, ParseError> {
    let value = read_json(text, limits).map_err(|diagnostic| ParseError {
        diagnostics: Diagnostics(vec![diagnostic]),
    })?;
    parse_workflow_value(&value, limits)
}

/// Validates a workflow already read as JSON.
pub fn parse_workflow_value(document: &Value, limits: &Limits) -> Result<Parsed, ParseError> {
    let mut checker = Checker::new(limits);
    let workflow = checker.check(document);
    checker.sort_in_document_order();
    match workflow {
        Some(workflow) if !checker.diagnostics.has_errors() => Ok(Parsed {
            workflow,
            warnings: checker.diagnostics.0,
        }),
        _ => Err(ParseError {
            diagnostics: checker.diagnostics,
        }),
    }
}

impl Checker<'_> {
    /// The workflow's own fields, then every step read and checked, then the steps built and
    /// their reachability checked; `None` once anything is an error.
    fn check(&mut self, document: &Value) -> Option<Workflow> {
        if !document.is_object() {
            self.error(
                "$",
                None,
                "a workflow must be a JSON object with a \"steps\" array",
            );
            return None;
        }
        let raw: RawWorkflow = match serde_path_to_error::deserialize(document) {
            Ok(raw) => raw,
            Err(error) => {
                let path = json_path("$", &error.path().to_string());
                self.error(path, None, error.into_inner().to_string());
                return None;
            }
        };
        self.unknown_fields("$", None, &raw.unknown, WORKFLOW_FIELDS);
        let max_visits = self.check_max_visits("$.max_visits", None, raw.max_visits);
        let Some(steps) = raw.steps.as_ref() else {
            self.error("$", None, "a workflow needs a \"steps\" array");
            return None;
        };
        if steps.is_empty() {
            self.error("$.steps", None, "a workflow needs at least one step");
            return None;
        }
        self.collect(steps, "$.steps", None, 0);
        self.context_keys = self.context_keys().into_iter().map(str::to_owned).collect();
        let index = self.index_ids();
        let checked: Vec<Option<Checked>> = (0..self.nodes.len())
            .map(|n| self.check_node(n, max_visits.unwrap_or(DEFAULT_MAX_VISITS), &index))
            .collect();
        let top_level: Vec<usize> = (0..self.nodes.len())
            .filter(|n| self.nodes[*n].parent.is_none())
            .collect();
        if self.diagnostics.has_errors() {
            return None;
        }
        let steps = self.build_steps(checked, &index, &top_level)?;
        let by_id = steps
            .iter()
            .enumerate()
            .map(|(i, step)| (step.id.clone(), i))
            .collect();
        let workflow = Workflow {
            id: raw.id,
            description: raw.description,
            max_visits: max_visits.unwrap_or(DEFAULT_MAX_VISITS),
            steps,
            top_level,
            by_id,
        };
        self.warn_unreachable(&workflow);
        Some(workflow)
    }
}
