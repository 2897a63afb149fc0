//! What the passes after `json` share: each step as found in the document ([`Node`]), and every
//! problem found, kept with the step it belongs to so that all are reported in document order.
//!
//! One [`Checker`] is carried through the passes, and its methods live with the pass that uses
//! them: `parse` runs the passes in order, `steps` reads and checks each step, and `validate`
//! holds the rules that need the whole document.

use std::collections::HashSet;

use super::StepType;
use super::raw::RawStep;
use crate::diagnostics::{Diagnostic, Diagnostics};
use crate::limits::Limits;

/// One step as found in the document, before the whole-document checks.
pub(super) struct Node {
    /// JSON path of the step object, such as `$.steps[3].steps[0]`.
    pub(super) path: String,
    /// `None` when the step could not be read at all (already reported).
    pub(super) raw: Option<RawStep>,
    pub(super) id: Option<String>,
    pub(super) parent: Option<usize>,
    pub(super) children: Vec<usize>,
}

impl Node {
    pub(super) fn step_type(&self) -> Option<StepType> {
        self.raw
            .as_ref()
            .and_then(|raw| raw.step_type.as_deref())
            .and_then(StepType::from_name)
    }

    /// The key its data is stored under. A step that could not be read counts under its id, so
    /// that its own error is not followed by false ones wherever it is referenced.
    pub(super) fn context_key(&self) -> Option<&str> {
        match &self.raw {
            Some(raw) => raw.output.as_deref().or(self.id.as_deref()),
            None => self.id.as_deref(),
        }
    }
}

/// What the passes write to: the steps as found, and every problem with the step it concerns.
pub(super) struct Checker<'l> {
    pub(super) limits: &'l Limits,
    pub(super) diagnostics: Diagnostics,
    pub(super) nodes: Vec<Node>,
    /// Keys the context can hold, filled once every step is read.
    pub(super) context_keys: HashSet<String>,
    /// For each diagnostic, the step it belongs to, so they can be put in document order.
    owners: Vec<Option<usize>>,
}

impl<'l> Checker<'l> {
    pub(super) fn new(limits: &'l Limits) -> Self {
        Self {
            limits,
            diagnostics: Diagnostics::default(),
            nodes: Vec::new(),
            context_keys: HashSet::new(),
            owners: Vec::new(),
        }
    }

    /// Workflow-level problems first, then each step's in document order; a step's own problems
    /// keep the order they were found in.
    pub(super) fn sort_in_document_order(&mut self) {
        debug_assert_eq!(self.owners.len(), self.diagnostics.len());
        let mut keyed: Vec<(Option<usize>, Diagnostic)> = self
            .owners
            .drain(..)
            .zip(self.diagnostics.0.drain(..))
            .collect();
        keyed.sort_by_key(|(owner, _)| *owner);
        self.diagnostics.0 = keyed.into_iter().map(|(_, d)| d).collect();
    }

    pub(super) fn error(
        &mut self,
        path: impl Into<String>,
        node: Option<usize>,
        message: impl Into<String>,
    ) {
        self.push(node, |step_id| Diagnostic::error(path, step_id, message));
    }

    pub(super) fn warning(
        &mut self,
        path: impl Into<String>,
        node: Option<usize>,
        message: impl Into<String>,
    ) {
        self.push(node, |step_id| Diagnostic::warning(path, step_id, message));
    }

    /// Drops the errors found at `path`: serde's complaint about the float an integer beyond
    /// 64 bits was rounded to names a number the author never wrote.
    pub(super) fn drop_errors_at(&mut self, path: &str) {
        let mut keep = self
            .diagnostics
            .0
            .iter()
            .map(|d| !(d.is_error() && d.path == path))
            .collect::<Vec<_>>()
            .into_iter();
        self.owners.retain(|_| keep.next().unwrap_or(true));
        self.diagnostics
            .0
            .retain(|d| !(d.is_error() && d.path == path));
    }

    /// Keeps the diagnostic with the step it belongs to, named by that step's id.
    fn push(&mut self, node: Option<usize>, diagnostic: impl FnOnce(Option<&str>) -> Diagnostic) {
        self.owners.push(node);
        let step_id = node.and_then(|n| self.nodes[n].id.as_deref());
        self.diagnostics.push(diagnostic(step_id));
    }
}

/// Joins a JSON path prefix and a serde_path_to_error path (`steps[2].next` or `.`).
pub(super) fn json_path(base: &str, inner: &str) -> String {
    match inner {
        "" | "." => base.to_owned(),
        inner if inner.starts_with('[') => format!("{base}{inner}"),
        inner => format!("{base}.{inner}"),
    }
}
