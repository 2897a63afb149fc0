//! Document text to a validated [`Workflow`], with every problem reported at once.
//!
//! Reading goes in three passes: the text to JSON (comments and trailing commas allowed, since
//! the spec's own examples carry them), each step to a [`RawStep`] on its own (so one malformed
//! step does not hide the problems of the others), then the checks that need the whole document:
//! ids, references, expressions, limits and reachability.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde_json::Value;

use super::raw::{RETRY_FIELDS, RawRetry, RawStep, RawWorkflow, STEP_FIELDS, WORKFLOW_FIELDS};
use super::{RetryPolicy, Step, StepIndex, StepKind, StepType, Workflow, graph};
use crate::diagnostics::{Diagnostic, Diagnostics, did_you_mean};
use crate::eval::expr::Expr;
use crate::eval::transform::Transform;
use crate::limits::{DEFAULT_MAX_VISITS, Limits};
use crate::payload::RESERVED_KEYS;

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
    let mut checker = Checker {
        limits,
        diagnostics: Diagnostics::default(),
        nodes: Vec::new(),
        context_keys: HashSet::new(),
        owners: Vec::new(),
    };
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

/// Reads JSON, allowing `//` and `/* */` comments and trailing commas.
fn read_json(text: &str, limits: &Limits) -> Result<Value, Diagnostic> {
    let too_deep = |depth: usize| {
        Diagnostic::error(
            "$",
            None,
            format!(
                "the document nests {depth} levels deep; the limit is {}",
                limits.max_json_depth
            ),
        )
    };
    // Checked on the text first, so that neither reader recurses deeper than we allow.
    let depth = text_nesting_depth(text);
    if depth > limits.max_json_depth {
        return Err(too_deep(depth));
    }
    match serde_json::from_str(text) {
        Ok(value) => Ok(value),
        Err(strict_error) => {
            let options = jsonc_parser::ParseOptions {
                allow_comments: true,
                allow_trailing_commas: true,
                allow_loose_object_property_names: false,
                allow_missing_commas: false,
                allow_single_quoted_strings: false,
                allow_hexadecimal_numbers: false,
                ..Default::default()
            };
            // Without comments the strict reader's message is the familiar one; with them, only
            // the comment-tolerant reader knows where the real mistake is.
            let has_comments = text.contains("//") || text.contains("/*");
            jsonc_parser::parse_to_serde_value::<Value>(text, &options).map_err(|jsonc_error| {
                let reason = if has_comments {
                    jsonc_error.to_string()
                } else {
                    strict_error.to_string()
                };
                Diagnostic::error(
                    "$",
                    None,
                    format!("the document is not valid JSON: {reason}"),
                )
            })
        }
    }
}

/// Deepest bracket nesting outside strings and comments.
fn text_nesting_depth(text: &str) -> usize {
    #[derive(PartialEq)]
    enum In {
        Code,
        String { escaped: bool },
        LineComment,
        BlockComment,
    }
    let (mut depth, mut deepest, mut state) = (0usize, 0usize, In::Code);
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        let next = bytes.get(i + 1).copied();
        match state {
            In::String { escaped: true } => state = In::String { escaped: false },
            In::String { escaped: false } => match byte {
                b'\\' => state = In::String { escaped: true },
                b'"' => state = In::Code,
                _ => {}
            },
            In::LineComment if byte == b'\n' => state = In::Code,
            In::LineComment => {}
            In::BlockComment if byte == b'*' && next == Some(b'/') => {
                state = In::Code;
                i += 1;
            }
            In::BlockComment => {}
            In::Code => match (byte, next) {
                (b'"', _) => state = In::String { escaped: false },
                (b'/', Some(b'/')) => state = In::LineComment,
                (b'/', Some(b'*')) => {
                    state = In::BlockComment;
                    i += 1;
                }
                (b'[' | b'{', _) => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                (b']' | b'}', _) => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
        i += 1;
    }
    deepest
}

/// One step as found in the document, before the whole-document checks.
struct Node {
    /// JSON path of the step object, such as `$.steps[3].steps[0]`.
    path: String,
    /// `None` when the step could not be read at all (already reported).
    raw: Option<RawStep>,
    id: Option<String>,
    parent: Option<usize>,
    children: Vec<usize>,
}

impl Node {
    fn step_type(&self) -> Option<StepType> {
        self.raw
            .as_ref()
            .and_then(|raw| raw.step_type.as_deref())
            .and_then(StepType::from_name)
    }

    /// The key its data is stored under. A step that could not be read counts under its id, so
    /// that its own error is not followed by false ones wherever it is referenced.
    fn context_key(&self) -> Option<&str> {
        match &self.raw {
            Some(raw) => raw.output.as_deref().or(self.id.as_deref()),
            None => self.id.as_deref(),
        }
    }
}

struct Checker<'l> {
    limits: &'l Limits,
    diagnostics: Diagnostics,
    nodes: Vec<Node>,
    /// Keys the context can hold, filled once every step is read.
    context_keys: HashSet<String>,
    /// For each diagnostic, the step it belongs to, so they can be put in document order.
    owners: Vec<Option<usize>>,
}

/// What a step was checked to be, before indexes are final.
struct Checked {
    kind: StepKind,
    retry: Option<RetryPolicy>,
    timeout_ms: Option<u64>,
    max_visits: u32,
}

impl Checker<'_> {
    /// Workflow-level problems first, then each step's in document order; a step's own problems
    /// keep the order they were found in.
    fn sort_in_document_order(&mut self) {
        debug_assert_eq!(self.owners.len(), self.diagnostics.len());
        let mut keyed: Vec<(Option<usize>, Diagnostic)> = self
            .owners
            .drain(..)
            .zip(self.diagnostics.0.drain(..))
            .collect();
        keyed.sort_by_key(|(owner, _)| *owner);
        self.diagnostics.0 = keyed.into_iter().map(|(_, d)| d).collect();
    }

    fn error(&mut self, path: impl Into<String>, node: Option<usize>, message: impl Into<String>) {
        self.owners.push(node);
        let step_id = node.and_then(|n| self.nodes[n].id.clone());
        self.diagnostics
            .push(Diagnostic::error(path, step_id.as_deref(), message));
    }

    fn warning(
        &mut self,
        path: impl Into<String>,
        node: Option<usize>,
        message: impl Into<String>,
    ) {
        self.owners.push(node);
        let step_id = node.and_then(|n| self.nodes[n].id.clone());
        self.diagnostics
            .push(Diagnostic::warning(path, step_id.as_deref(), message));
    }

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
        let entry_id = workflow.step(workflow.entry()).id.clone();
        for unreachable in graph::unreachable(&workflow) {
            self.warning(
                self.nodes[unreachable].path.clone(),
                Some(unreachable),
                format!("step is unreachable from the entry step \"{entry_id}\""),
            );
        }
        Some(workflow)
    }

    /// Reads each step by itself, depth first, so that indexes are in document order.
    fn collect(&mut self, values: &[Value], base: &str, parent: Option<usize>, depth: usize) {
        for (i, value) in values.iter().enumerate() {
            if self.nodes.len() >= self.limits.max_steps {
                self.error(
                    base.to_owned(),
                    parent,
                    format!(
                        "a workflow may have at most {} steps",
                        self.limits.max_steps
                    ),
                );
                return;
            }
            let path = format!("{base}[{i}]");
            let index = self.nodes.len();
            let loose_id = value.get("id").and_then(Value::as_str).map(str::to_owned);
            let raw = if value.is_object() {
                match serde_path_to_error::deserialize::<_, RawStep>(value) {
                    Ok(raw) => Some(raw),
                    Err(error) => {
                        let at = json_path(&path, &error.path().to_string());
                        self.nodes.push(Node {
                            path: path.clone(),
                            raw: None,
                            id: loose_id.clone(),
                            parent,
                            children: Vec::new(),
                        });
                        self.error(at, Some(index), error.into_inner().to_string());
                        continue;
                    }
                }
            } else {
                None
            };
            let id = raw.as_ref().and_then(|raw| raw.id.clone()).or(loose_id);
            self.nodes.push(Node {
                path: path.clone(),
                raw,
                id,
                parent,
                children: Vec::new(),
            });
            if !value.is_object() {
                self.error(path, Some(index), "a step must be a JSON object");
                continue;
            }
            if let Some(parent) = parent {
                self.nodes[parent].children.push(index);
            }
            if self.nodes[index].step_type() != Some(StepType::Parallel) {
                continue;
            }
            if let Some(branches) = value.get("steps").and_then(Value::as_array) {
                if depth + 1 > self.limits.max_parallel_depth {
                    self.error(
                        format!("{path}.steps"),
                        Some(index),
                        format!(
                            "parallel steps may nest at most {} deep",
                            self.limits.max_parallel_depth
                        ),
                    );
                    continue;
                }
                self.collect(branches, &format!("{path}.steps"), Some(index), depth + 1);
            }
        }
    }

    /// First occurrence of each id; later ones are reported as duplicates.
    fn index_ids(&mut self) -> HashMap<String, usize> {
        let mut index: HashMap<String, usize> = HashMap::new();
        for n in 0..self.nodes.len() {
            let Some(id) = self.nodes[n].id.clone() else {
                continue;
            };
            match index.get(&id) {
                Some(&first) => {
                    let first_path = self.nodes[first].path.clone();
                    self.error(
                        format!("{}.id", self.nodes[n].path),
                        Some(n),
                        format!("duplicate step id \"{id}\"; it is first used at {first_path}"),
                    );
                }
                None => {
                    index.insert(id, n);
                }
            }
        }
        index
    }

    fn check_node(
        &mut self,
        n: usize,
        workflow_max_visits: u32,
        index: &HashMap<String, usize>,
    ) -> Option<Checked> {
        let path = self.nodes[n].path.clone();
        let raw = self.nodes[n].raw.clone()?;
        self.check_raw(n, &path, &raw, workflow_max_visits, index)
    }

    fn check_raw(
        &mut self,
        n: usize,
        path: &str,
        raw: &RawStep,
        workflow_max_visits: u32,
        index: &HashMap<String, usize>,
    ) -> Option<Checked> {
        let is_branch = self.nodes[n].parent.is_some();
        self.unknown_fields(path, Some(n), &raw.unknown, STEP_FIELDS);
        match &raw.id {
            None => self.error(path.to_owned(), Some(n), "a step needs an \"id\""),
            Some(id) => self.check_name(&format!("{path}.id"), n, "step id", id),
        }
        if let Some(output) = &raw.output {
            self.check_name(&format!("{path}.output"), n, "output", output);
            let collides = index.get(output).is_some_and(|&other| other != n);
            if collides {
                self.error(
                    format!("{path}.output"),
                    Some(n),
                    format!("output \"{output}\" is also the id of another step; the context could not tell them apart"),
                );
            }
        }
        let Some(type_name) = raw.step_type.as_deref() else {
            self.error(
                path.to_owned(),
                Some(n),
                "a step needs a \"type\": agent, transform, parallel, condition or approval",
            );
            return None;
        };
        let Some(step_type) = StepType::from_name(type_name) else {
            let hint = did_you_mean(type_name, StepType::ALL.iter().map(|t| t.as_str()));
            self.error(
                format!("{path}.type"),
                Some(n),
                format!(
                    "unknown step type \"{type_name}\"; expected agent, transform, parallel, condition or approval{hint}"
                ),
            );
            return None;
        };
        self.check_fields_apply(n, path, raw, step_type, is_branch);
        for (field, target) in [
            ("next", &raw.next),
            ("on_error", &raw.on_error),
            ("then", &raw.then),
            ("else", &raw.otherwise),
            ("on_approve", &raw.on_approve),
            ("on_reject", &raw.on_reject),
        ] {
            if let Some(target) = target {
                self.check_target(n, &format!("{path}.{field}"), field, target, index);
            }
        }
        if raw.next.is_some() && raw.end == Some(true) {
            self.error(
                format!("{path}.end"),
                Some(n),
                "\"end\": true and \"next\" contradict each other; keep one",
            );
        }
        if let Some(reference) = &raw.input {
            self.check_input_reference(n, &format!("{path}.input"), reference, index);
        }
        let retry = raw
            .retry
            .as_ref()
            .and_then(|retry| self.check_retry(n, &format!("{path}.retry"), retry));
        if raw.timeout_ms == Some(0) {
            self.error(
                format!("{path}.timeout_ms"),
                Some(n),
                "timeout_ms must be at least 1",
            );
        }
        let max_visits = self
            .check_max_visits(&format!("{path}.max_visits"), Some(n), raw.max_visits)
            .unwrap_or(workflow_max_visits);
        let kind = self.check_kind(n, path, raw, step_type, index)?;
        Some(Checked {
            kind,
            retry,
            timeout_ms: raw.timeout_ms,
            max_visits,
        })
    }

    /// The fields each type needs, parsed; placeholders for indexes are filled in later.
    fn check_kind(
        &mut self,
        n: usize,
        path: &str,
        raw: &RawStep,
        step_type: StepType,
        index: &HashMap<String, usize>,
    ) -> Option<StepKind> {
        let missing = |field: &str| format!("{} step needs \"{field}\"", with_article(step_type));
        match step_type {
            StepType::Agent => match &raw.agent {
                Some(agent) if !agent.trim().is_empty() => Some(StepKind::Agent {
                    agent: agent.clone(),
                }),
                Some(_) => {
                    self.error(format!("{path}.agent"), Some(n), "agent name is empty");
                    None
                }
                None => {
                    self.error(path.to_owned(), Some(n), missing("agent"));
                    None
                }
            },
            StepType::Transform => {
                let Some(source) = &raw.transform else {
                    self.error(path.to_owned(), Some(n), missing("transform"));
                    return None;
                };
                match Transform::parse(
                    source,
                    self.limits.max_expression_len,
                    self.limits.max_jq_len,
                ) {
                    Ok(transform) => {
                        if let Transform::Path(p) = &transform
                            && let Some(key) = p.first_context_key()
                        {
                            self.check_context_key(
                                n,
                                &format!("{path}.transform"),
                                &key,
                                index,
                                true,
                            );
                        }
                        Some(StepKind::Transform {
                            transform,
                            source: source.clone(),
                        })
                    }
                    Err(error) => {
                        self.error(format!("{path}.transform"), Some(n), error);
                        None
                    }
                }
            }
            StepType::Parallel => {
                match &raw.steps {
                    None => {
                        self.error(path.to_owned(), Some(n), missing("steps"));
                        return None;
                    }
                    Some(branches) if branches.is_empty() => {
                        self.error(
                            format!("{path}.steps"),
                            Some(n),
                            "a parallel step needs at least one branch",
                        );
                        return None;
                    }
                    Some(_) => {}
                }
                Some(StepKind::Parallel {
                    branches: self.nodes[n].children.clone(),
                })
            }
            StepType::Condition => {
                let Some(source) = &raw.condition else {
                    self.error(path.to_owned(), Some(n), missing("condition"));
                    return None;
                };
                if raw.then.is_none() && raw.otherwise.is_none() {
                    self.error(
                        path.to_owned(),
                        Some(n),
                        "a condition step needs \"then\", \"else\" or both",
                    );
                }
                if source.chars().count() > self.limits.max_expression_len {
                    self.error(
                        format!("{path}.condition"),
                        Some(n),
                        format!(
                            "condition is {} characters long; the limit is {}",
                            source.chars().count(),
                            self.limits.max_expression_len
                        ),
                    );
                    return None;
                }
                match Expr::parse(source, self.limits.max_expression_depth) {
                    Ok(condition) => {
                        for p in condition.paths() {
                            if let Some(key) = p.first_context_key() {
                                self.check_context_key(
                                    n,
                                    &format!("{path}.condition"),
                                    &key,
                                    index,
                                    false,
                                );
                            }
                        }
                        Some(StepKind::Condition {
                            condition,
                            source: source.clone(),
                            when_true: None,
                            when_false: None,
                        })
                    }
                    Err(error) => {
                        self.error(format!("{path}.condition"), Some(n), error);
                        None
                    }
                }
            }
            StepType::Approval => Some(StepKind::Approval {
                message: raw.message.clone().unwrap_or_else(|| {
                    format!(
                        "Approve step \"{}\"?",
                        raw.id.as_deref().unwrap_or_default()
                    )
                }),
                on_approve: None,
                on_reject: None,
            }),
        }
    }

    /// Routing fields on branches are errors (branches do not route); other fields a type does
    /// not use are warnings, since they are harmless but probably a mistake.
    fn check_fields_apply(
        &mut self,
        n: usize,
        path: &str,
        raw: &RawStep,
        step_type: StepType,
        is_branch: bool,
    ) {
        let present: [(&str, bool); 13] = [
            ("agent", raw.agent.is_some()),
            ("input", raw.input.is_some()),
            ("transform", raw.transform.is_some()),
            ("steps", raw.steps.is_some()),
            ("condition", raw.condition.is_some()),
            ("then", raw.then.is_some()),
            ("else", raw.otherwise.is_some()),
            ("message", raw.message.is_some()),
            ("on_approve", raw.on_approve.is_some()),
            ("on_reject", raw.on_reject.is_some()),
            ("retry", raw.retry.is_some()),
            ("timeout_ms", raw.timeout_ms.is_some()),
            ("output", raw.output.is_some()),
        ];
        let applies: &[&str] = match step_type {
            StepType::Agent => &["agent", "input", "retry", "timeout_ms", "output"],
            StepType::Transform => &["transform", "output"],
            StepType::Parallel => &["steps", "output"],
            StepType::Condition => &["condition", "then", "else"],
            StepType::Approval => &["message", "on_approve", "on_reject", "timeout_ms", "output"],
        };
        for (field, is_present) in present {
            if is_present && !applies.contains(&field) {
                self.warning(
                    format!("{path}.{field}"),
                    Some(n),
                    format!(
                        "\"{field}\" has no effect on {} step",
                        with_article(step_type)
                    ),
                );
            }
        }
        if is_branch {
            if step_type == StepType::Condition {
                self.error(
                    format!("{path}.type"),
                    Some(n),
                    "a parallel branch cannot be a condition: branches run side by side and do not route",
                );
            }
            for (field, is_present) in [
                ("next", raw.next.is_some()),
                ("end", raw.end.is_some()),
                ("on_error", raw.on_error.is_some()),
                ("on_approve", raw.on_approve.is_some()),
                ("on_reject", raw.on_reject.is_some()),
                ("output", raw.output.is_some()),
            ] {
                if is_present {
                    self.error(
                        format!("{path}.{field}"),
                        Some(n),
                        format!(
                            "a parallel branch cannot set \"{field}\": its result is collected into the parallel step's data, which routes and is stored for it"
                        ),
                    );
                }
            }
        }
    }

    fn check_name(&mut self, path: &str, n: usize, what: &str, name: &str) {
        let valid_chars = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if name.is_empty() {
            self.error(path.to_owned(), Some(n), format!("{what} is empty"));
        } else if !valid_chars || name.starts_with('-') {
            let shown: String = name.chars().take(40).collect();
            self.error(
                path.to_owned(),
                Some(n),
                format!("{what} \"{shown}\" may only contain ASCII letters, digits, \"_\" and \"-\" (not first)"),
            );
        } else if name.len() > self.limits.max_id_len {
            // Only ASCII is left here, so bytes are characters.
            self.error(
                path.to_owned(),
                Some(n),
                format!(
                    "{what} is {} characters long; the limit is {}",
                    name.len(),
                    self.limits.max_id_len
                ),
            );
        } else if RESERVED_KEYS.contains(&name) {
            self.error(
                path.to_owned(),
                Some(n),
                format!(
                    "{what} \"{name}\" is reserved: agents receive \"{}\" as payload keys",
                    RESERVED_KEYS.join("\", \"")
                ),
            );
        }
    }

    /// `next`, `then`, ... must name a top-level step.
    fn check_target(
        &mut self,
        n: usize,
        path: &str,
        field: &str,
        target: &str,
        index: &HashMap<String, usize>,
    ) {
        match index.get(target) {
            Some(&t) if self.nodes[t].parent.is_some() => {
                let parent = self.nodes[t].parent.and_then(|p| self.nodes[p].id.clone());
                self.error(
                    path.to_owned(),
                    Some(n),
                    format!(
                        "{field} names \"{target}\", a branch of parallel step \"{}\"; only top-level steps can be routed to",
                        parent.unwrap_or_default()
                    ),
                );
            }
            Some(_) => {}
            None => {
                let hint = did_you_mean(target, self.top_level_ids());
                self.error(
                    path.to_owned(),
                    Some(n),
                    format!("{field} names no step: \"{target}\"{hint}"),
                );
            }
        }
    }

    fn top_level_ids(&self) -> Vec<&str> {
        self.nodes
            .iter()
            .filter(|node| node.parent.is_none())
            .filter_map(|node| node.id.as_deref())
            .collect()
    }

    /// Keys the context can hold: top-level steps that produce data, by alias or id.
    fn context_keys(&self) -> Vec<&str> {
        self.nodes
            .iter()
            .filter(|node| node.parent.is_none() && node.step_type() != Some(StepType::Condition))
            .filter_map(Node::context_key)
            .collect()
    }

    /// `input` must name a context key: a step id, or an output alias.
    fn check_input_reference(
        &mut self,
        n: usize,
        path: &str,
        reference: &str,
        index: &HashMap<String, usize>,
    ) {
        if RESERVED_KEYS.contains(&reference) {
            self.error(
                path.to_owned(),
                Some(n),
                format!("input \"{reference}\" is a reserved payload key, not a step"),
            );
            return;
        }
        self.check_context_key(n, path, reference, index, true);
    }

    /// Whether `key` can ever be in the context. Transforms and `input` fail on unknown keys,
    /// so those are errors; in conditions a missing key is `undefined`, so only a warning.
    fn check_context_key(
        &mut self,
        n: usize,
        path: &str,
        key: &str,
        index: &HashMap<String, usize>,
        strict: bool,
    ) {
        if self.context_keys.contains(key) {
            return;
        }
        let problem = match index.get(key).map(|&t| &self.nodes[t]) {
            Some(target) if target.parent.is_some() => format!(
                "\"{key}\" is a parallel branch; branch results are in the parallel step's data, not in the context by their own id"
            ),
            Some(target) if target.step_type() == Some(StepType::Condition) => {
                format!("\"{key}\" is a condition step, which stores no data")
            }
            Some(target) => format!(
                "step \"{key}\" stores its data under its output \"{}\"; refer to that instead",
                target.context_key().unwrap_or_default()
            ),
            None => {
                let hint = did_you_mean(key, self.context_keys());
                format!("\"{key}\" names no step or output{hint}")
            }
        };
        if strict {
            self.error(path.to_owned(), Some(n), problem);
        } else {
            self.warning(
                path.to_owned(),
                Some(n),
                format!("{problem}; the path will always be undefined"),
            );
        }
    }

    fn check_retry(&mut self, n: usize, path: &str, retry: &RawRetry) -> Option<RetryPolicy> {
        self.unknown_fields(path, Some(n), &retry.unknown, RETRY_FIELDS);
        let defaults = RetryPolicy::default();
        let policy = RetryPolicy {
            max_attempts: retry.max_attempts.unwrap_or(3),
            initial_interval_ms: retry
                .initial_interval_ms
                .unwrap_or(defaults.initial_interval_ms),
            backoff_coefficient: retry
                .backoff_coefficient
                .unwrap_or(defaults.backoff_coefficient),
            max_interval_ms: retry.max_interval_ms,
        };
        let before = self.diagnostics.errors().count();
        if policy.max_attempts == 0 {
            self.error(
                format!("{path}.max_attempts"),
                Some(n),
                "max_attempts must be at least 1",
            );
        }
        if policy.initial_interval_ms == 0 {
            self.error(
                format!("{path}.initial_interval_ms"),
                Some(n),
                "initial_interval_ms must be at least 1",
            );
        }
        if !(policy.backoff_coefficient.is_finite() && policy.backoff_coefficient >= 1.0) {
            self.error(
                format!("{path}.backoff_coefficient"),
                Some(n),
                "backoff_coefficient must be a number of at least 1",
            );
        }
        if let Some(max) = policy.max_interval_ms
            && max < policy.initial_interval_ms
        {
            self.error(
                format!("{path}.max_interval_ms"),
                Some(n),
                "max_interval_ms must be at least initial_interval_ms",
            );
        }
        (self.diagnostics.errors().count() == before).then_some(policy)
    }

    fn check_max_visits(
        &mut self,
        path: &str,
        n: Option<usize>,
        value: Option<u32>,
    ) -> Option<u32> {
        let value = value?;
        if value == 0 || value > self.limits.max_visits_ceiling {
            self.error(
                path.to_owned(),
                n,
                format!(
                    "max_visits must be between 1 and {}",
                    self.limits.max_visits_ceiling
                ),
            );
            return None;
        }
        Some(value)
    }

    fn unknown_fields(
        &mut self,
        path: &str,
        n: Option<usize>,
        unknown: &BTreeMap<String, Value>,
        known: &[&str],
    ) {
        for field in unknown.keys() {
            let hint = did_you_mean(field, known.iter().copied());
            self.error(
                format!("{path}.{field}"),
                n,
                format!("unknown field \"{field}\"{hint}"),
            );
        }
    }

    /// Resolves names to indexes once every check has passed.
    fn build_steps(
        &self,
        checked: Vec<Option<Checked>>,
        index: &HashMap<String, usize>,
        top_level: &[usize],
    ) -> Option<Vec<Step>> {
        let resolve =
            |name: &Option<String>| name.as_ref().and_then(|name| index.get(name).copied());
        let mut steps = Vec::with_capacity(checked.len());
        for (n, checked) in checked.into_iter().enumerate() {
            let checked = checked?;
            let node = &self.nodes[n];
            let raw = node.raw.as_ref()?;
            let on_success: Option<StepIndex> = if node.parent.is_some() {
                None
            } else if raw.next.is_some() {
                resolve(&raw.next)
            } else if raw.end == Some(true) {
                None
            } else {
                let position = top_level.iter().position(|&t| t == n)?;
                top_level.get(position + 1).copied()
            };
            let kind = match checked.kind {
                StepKind::Condition {
                    condition, source, ..
                } => StepKind::Condition {
                    condition,
                    source,
                    when_true: resolve(&raw.then).or(on_success),
                    when_false: resolve(&raw.otherwise).or(on_success),
                },
                StepKind::Approval { message, .. } => StepKind::Approval {
                    message,
                    on_approve: resolve(&raw.on_approve).or(on_success),
                    on_reject: resolve(&raw.on_reject),
                },
                other => other,
            };
            let id: Arc<str> = node.id.as_deref()?.into();
            steps.push(Step {
                context_key: raw
                    .output
                    .as_deref()
                    .map(Arc::from)
                    .unwrap_or_else(|| id.clone()),
                id,
                kind,
                input: raw.input.as_deref().map(Arc::from),
                on_success,
                on_error: resolve(&raw.on_error),
                parent: node.parent,
                max_visits: checked.max_visits,
                retry: checked.retry,
                timeout_ms: checked.timeout_ms,
            });
        }
        Some(steps)
    }
}

/// "an agent", "a transform", ...
fn with_article(step_type: StepType) -> String {
    let article = match step_type {
        StepType::Agent | StepType::Approval => "an",
        StepType::Transform | StepType::Parallel | StepType::Condition => "a",
    };
    format!("{article} {}", step_type.as_str())
}

/// Joins a JSON path prefix and a serde_path_to_error path (`steps[2].next` or `.`).
fn json_path(base: &str, inner: &str) -> String {
    match inner {
        "" | "." => base.to_owned(),
        inner if inner.starts_with('[') => format!("{base}{inner}"),
        inner => format!("{base}.{inner}"),
    }
}
