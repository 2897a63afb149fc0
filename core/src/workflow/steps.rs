//! Each step, read by itself and checked against its type: the second pass of [`super::parse`].
//!
//! A step is read on its own, so one malformed step does not hide the problems of the others.
//! What a step is checked to be ([`Checked`]) becomes a model [`Step`] only once every check has
//! passed and names can be resolved to indexes.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::checker::{Checker, Node, json_path};
use super::raw::{RETRY_FIELDS, RawRetry, RawStep, STEP_FIELDS};
use super::{RetryPolicy, Step, StepIndex, StepKind, StepType};
use crate::diagnostics::did_you_mean;

/// What a step was checked to be, before indexes are final.
pub(super) struct Checked {
    kind: StepKind,
    retry: Option<RetryPolicy>,
    timeout_ms: Option<u64>,
    max_visits: u32,
}

impl Checker<'_> {
    /// Reads each step by itself, depth first, so that indexes are in document order.
    pub(super) fn collect(
        &mut self,
        values: &[Value],
        base: &str,
        parent: Option<usize>,
        depth: usize,
    ) {
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
            match self.nodes[index].step_type() {
                Some(StepType::Parallel) => {}
                // A chain's steps are read like branches; only one level: a chain holds no map.
                Some(StepType::Map) if self.chain_of(index).is_none() => {
                    if let Some(chain) = value.get("steps").and_then(Value::as_array) {
                        self.collect(chain, &format!("{path}.steps"), Some(index), depth);
                    }
                    continue;
                }
                _ => continue,
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

    pub(super) fn check_node(
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
        let is_branch = self.parallel_of(n).is_some();
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
                "a step needs a \"type\": agent, transform, parallel, condition, approval or map",
            );
            return None;
        };
        let Some(step_type) = StepType::from_name(type_name) else {
            let hint = did_you_mean(type_name, StepType::ALL.iter().map(|t| t.as_str()));
            self.error(
                format!("{path}.type"),
                Some(n),
                format!(
                    "unknown step type \"{type_name}\"; expected agent, transform, parallel, condition, approval or map{hint}"
                ),
            );
            return None;
        };
        self.check_fields_apply(n, path, raw, step_type, is_branch);
        self.check_chain_step(n, path, step_type);
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
                Some(agent) => self
                    .check_agent_name(&format!("{path}.agent"), n, agent)
                    .then(|| StepKind::Agent {
                        agent: agent.clone(),
                    }),
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
                let transform =
                    self.check_transform(n, &format!("{path}.transform"), source, index)?;
                Some(StepKind::Transform {
                    transform,
                    source: source.clone(),
                })
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
                    tolerated_failures: self.check_tolerance(n, path, raw),
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
                let condition =
                    self.check_condition(n, &format!("{path}.condition"), source, index)?;
                Some(StepKind::Condition {
                    condition,
                    source: source.clone(),
                    when_true: None,
                    when_false: None,
                })
            }
            StepType::Map => self.check_map(n, path, raw, index).map(StepKind::Map),
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
        let present: [(&str, bool); 16] = [
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
            ("items", raw.items.is_some()),
            ("max_concurrency", raw.max_concurrency.is_some()),
            ("tolerated_failures", raw.tolerated_failures.is_some()),
        ];
        // A chain's agents take their own retry, timeout and input.
        let map_fields: &[&str] = if raw.steps.is_some() {
            &[
                "items",
                "steps",
                "max_concurrency",
                "tolerated_failures",
                "output",
            ]
        } else {
            &[
                "items",
                "agent",
                "input",
                "max_concurrency",
                "tolerated_failures",
                "retry",
                "timeout_ms",
                "output",
            ]
        };
        let applies: &[&str] = match step_type {
            StepType::Agent => &["agent", "input", "retry", "timeout_ms", "output"],
            StepType::Transform => &["transform", "output"],
            StepType::Parallel => &["steps", "tolerated_failures", "output"],
            StepType::Condition => &["condition", "then", "else"],
            StepType::Approval => &["message", "on_approve", "on_reject", "timeout_ms", "output"],
            StepType::Map => map_fields,
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

    /// Resolves names to indexes once every check has passed.
    pub(super) fn build_steps(
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
            // A chain step goes on to the next step of its chain, as a top-level step goes on
            // to the next top-level step; a branch goes nowhere (its parallel step routes).
            let siblings: &[usize] = match node.parent {
                None => top_level,
                Some(parent) if self.chain_of(n).is_some() => &self.nodes[parent].children,
                Some(_) => &[],
            };
            let on_success: Option<StepIndex> = if siblings.is_empty() {
                None
            } else if raw.next.is_some() {
                resolve(&raw.next)
            } else if raw.end == Some(true) {
                None
            } else {
                let position = siblings.iter().position(|&t| t == n)?;
                siblings.get(position + 1).copied()
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
        StepType::Transform | StepType::Parallel | StepType::Condition | StepType::Map => "a",
    };
    format!("{article} {}", step_type.as_str())
}
