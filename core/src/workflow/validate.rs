//! The rules that need the whole document: unique ids and well-formed names, references to
//! steps and to context keys (with a "did you mean" for near misses), the context keys that
//! transform paths and conditions read, limits, unknown fields and reachability.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::checker::{Checker, Node};
use super::names::{name_problem, step_id_problem};
use super::{MapBody, MapStep, StepKind, StepType, Workflow, graph};
use crate::diagnostics::did_you_mean;
use crate::eval::Transform;
use crate::eval::expr::Expr;
use crate::eval::path::Root;
use crate::payload::RESERVED_KEYS;

/// Why a `map.` path outside a chain reads nothing.
const MAP_OUTSIDE_A_CHAIN: &str =
    "\"map\" is the item a map step's chain runs, and is only defined inside a chain";

impl Checker<'_> {
    /// First occurrence of each id; later ones are reported as duplicates.
    pub(super) fn index_ids(&mut self) -> HashMap<String, usize> {
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

    pub(super) fn check_name(&mut self, path: &str, n: usize, what: &str, name: &str) {
        if let Some(problem) = step_id_problem(what, name, self.limits.max_id_len) {
            self.error(path.to_owned(), Some(n), problem);
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

    /// A workflow id or an agent name: printable, brace-free and bounded ([`name_problem`]).
    pub(super) fn check_label(&mut self, path: &str, n: Option<usize>, what: &str, name: &str) {
        if let Some(problem) = name_problem(what, name, self.limits.max_id_len) {
            self.error(path.to_owned(), n, problem);
        }
    }

    /// Whether `agent` may name an agent (reported at `path` if not): not blank, and a name
    /// like a workflow id, since it is part of storage keys and shown wherever its tasks are.
    pub(super) fn check_agent_name(&mut self, path: &str, n: usize, agent: &str) -> bool {
        if agent.trim().is_empty() {
            self.error(path.to_owned(), Some(n), "agent name is empty");
            return false;
        }
        let errors = self.diagnostics.len();
        self.check_label(path, Some(n), "agent name", agent);
        self.diagnostics.len() == errors
    }

    /// `next`, `then`, ... must name a step of the same scope: a top-level step from a
    /// top-level step, a step of the same chain from a chain step.
    pub(super) fn check_target(
        &mut self,
        n: usize,
        path: &str,
        field: &str,
        target: &str,
        index: &HashMap<String, usize>,
    ) {
        let id_of =
            |checker: &Self, node: usize| checker.nodes[node].id.clone().unwrap_or_default();
        let Some(&t) = index.get(target) else {
            let hint = did_you_mean(target, self.scope_ids(n));
            self.error(
                path.to_owned(),
                Some(n),
                format!("{field} names no step: \"{target}\"{hint}"),
            );
            return;
        };
        let problem = match (self.chain_of(n), self.chain_of(t), self.parallel_of(t)) {
            (_, _, Some(parallel)) => format!(
                "{field} names \"{target}\", a branch of parallel step \"{}\"; only top-level steps can be routed to",
                id_of(self, parallel)
            ),
            (Some(mine), Some(theirs), _) if mine == theirs => return,
            (None, None, _) => return,
            (Some(mine), _, _) => format!(
                "{field} names \"{target}\", which is not in map step \"{}\"'s chain; a chain step routes within its chain",
                id_of(self, mine)
            ),
            (None, Some(theirs), _) => format!(
                "{field} names \"{target}\", a step of map step \"{}\"'s chain; only top-level steps can be routed to",
                id_of(self, theirs)
            ),
        };
        self.error(path.to_owned(), Some(n), problem);
    }

    /// Keys the context can hold: top-level steps that produce data, by alias or id.
    pub(super) fn context_keys(&self) -> Vec<&str> {
        self.nodes
            .iter()
            .filter(|node| node.parent.is_none() && node.step_type() != Some(StepType::Condition))
            .filter_map(Node::context_key)
            .collect()
    }

    /// `input` must name a context key: a step id, or an output alias.
    pub(super) fn check_input_reference(
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
        if self.context_keys.contains(key) || self.chain_keys(n).contains(&key) {
            return;
        }
        let problem = match index.get(key).map(|&t| (t, &self.nodes[t])) {
            Some((t, _)) if self.chain_of(t).is_some() => format!(
                "\"{key}\" is a step of map step \"{}\"'s chain; each item's results are in the map step's data, and in the item's own context only inside the chain",
                self.chain_of(t)
                    .and_then(|m| self.nodes[m].id.clone())
                    .unwrap_or_default()
            ),
            Some((_, target)) if target.parent.is_some() => format!(
                "\"{key}\" is a parallel branch; branch results are in the parallel step's data, not in the context by their own id"
            ),
            Some((_, target)) if target.step_type() == Some(StepType::Condition) => {
                format!("\"{key}\" is a condition step, which stores no data")
            }
            Some((_, target)) => format!(
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

    /// A transform, parsed; a path must read a key the context can hold.
    pub(super) fn check_transform(
        &mut self,
        n: usize,
        path: &str,
        source: &str,
        index: &HashMap<String, usize>,
    ) -> Option<Transform> {
        let parsed = Transform::parse(
            source,
            self.limits.max_expression_len,
            self.limits.max_jq_len,
        );
        let transform = self.parsed_or_reported(n, path, parsed)?;
        if let Transform::Path(p) = &transform {
            if let Some(key) = p.first_context_key() {
                self.check_context_key(n, path, &key, index, true);
            }
            if p.root == Root::Map && self.chain_of(n).is_none() {
                self.error(path.to_owned(), Some(n), MAP_OUTSIDE_A_CHAIN);
            }
        }
        Some(transform)
    }

    /// A condition, bounded in length and parsed; its paths should read keys the context can hold.
    pub(super) fn check_condition(
        &mut self,
        n: usize,
        path: &str,
        source: &str,
        index: &HashMap<String, usize>,
    ) -> Option<Expr> {
        if source.chars().count() > self.limits.max_expression_len {
            self.error(
                path.to_owned(),
                Some(n),
                format!(
                    "condition is {} characters long; the limit is {}",
                    source.chars().count(),
                    self.limits.max_expression_len
                ),
            );
            return None;
        }
        let parsed = Expr::parse(source, self.limits.max_expression_depth);
        let condition = self.parsed_or_reported(n, path, parsed)?;
        for p in condition.paths() {
            if let Some(key) = p.first_context_key() {
                self.check_context_key(n, path, &key, index, false);
            }
            if p.root == Root::Map && self.chain_of(n).is_none() {
                self.warning(
                    path.to_owned(),
                    Some(n),
                    format!("{MAP_OUTSIDE_A_CHAIN}; the path will always be undefined"),
                );
            }
        }
        Some(condition)
    }

    /// What parsed, or `None` with the parser's error reported at `path`.
    fn parsed_or_reported<T>(
        &mut self,
        n: usize,
        path: &str,
        parsed: Result<T, String>,
    ) -> Option<T> {
        parsed
            .map_err(|error| self.error(path.to_owned(), Some(n), error))
            .ok()
    }

    pub(super) fn check_max_visits(
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

    pub(super) fn unknown_fields(
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

    /// Top-level steps that no route from the entry step reaches, and chain steps that no
    /// route from their chain's first step reaches.
    pub(super) fn warn_unreachable(&mut self, workflow: &Workflow) {
        let mut scopes = vec![workflow.top_level().to_vec()];
        scopes.extend(workflow.steps().iter().filter_map(|step| match &step.kind {
            StepKind::Map(MapStep {
                body: MapBody::Chain(chain),
                ..
            }) => Some(chain.clone()),
            _ => None,
        }));
        for scope in scopes {
            let entry_id = workflow.step(scope[0]).id.clone();
            for unreachable in graph::unreachable(workflow, &scope) {
                self.warning(
                    self.nodes[unreachable].path.clone(),
                    Some(unreachable),
                    format!("step is unreachable from the entry step \"{entry_id}\""),
                );
            }
        }
    }
}
