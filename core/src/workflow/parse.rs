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
use crate::big_integers::{BigInteger, big_integers};
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

/// How many integers beyond 64 bits one document's errors name (a document of nothing else
/// would otherwise make a message larger than itself).
const MAX_BIG_INTEGERS_REPORTED: usize = 20;

/// Parses and validates workflow text.
pub fn parse_workflow_with(text: &str, limits: &Limits) -> Result<Parsed, ParseError> {
    let value = read_json(text, limits).map_err(|diagnostic| ParseError {
        diagnostics: Diagnostics(vec![diagnostic]),
    })?;
    // Only the text tells them: its JSON value holds them as the floats they were rounded to.
    let big: Vec<BigInteger> = big_integers(text.as_bytes())
        .take(MAX_BIG_INTEGERS_REPORTED + 1)
        .collect();
    check_document(&value, limits, &big)
}

/// Validates a workflow already read as JSON.
pub fn parse_workflow_value(document: &Value, limits: &Limits) -> Result<Parsed, ParseError> {
    check_document(document, limits, &[])
}

/// Validates `document`, whose text holds the integers beyond 64 bits of `big`.
fn check_document(
    document: &Value,
    limits: &Limits,
    big: &[BigInteger],
) -> Result<Parsed, ParseError> {
    let mut checker = Checker::new(limits);
    let workflow = checker.check(document);
    checker.report_big_integers(big);
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
        if let Some(id) = &raw.id {
            self.check_label("$.id", None, "workflow id", id);
        }
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

    /// Each integer beyond 64 bits, as an error of the step it is in (the deepest whose path
    /// starts its path); past [`MAX_BIG_INTEGERS_REPORTED`], one error says there are more.
    fn report_big_integers(&mut self, big: &[BigInteger]) {
        for found in big.iter().take(MAX_BIG_INTEGERS_REPORTED) {
            let owner = (0..self.nodes.len())
                .filter(|&n| {
                    let step = &self.nodes[n].path;
                    found.path.strip_prefix(step.as_str()).is_some_and(|rest| {
                        rest.is_empty() || rest.starts_with('.') || rest.starts_with('[')
                    })
                })
                .max_by_key(|&n| self.nodes[n].path.len());
            self.drop_errors_at(&found.path);
            self.error(found.path.clone(), owner, found.problem());
        }
        if big.len() > MAX_BIG_INTEGERS_REPORTED {
            self.error(
                "$",
                None,
                format!(
                    "more integers beyond 64 bits than the {MAX_BIG_INTEGERS_REPORTED} named; \
                     write each as a string"
                ),
            );
        }
    }
}
