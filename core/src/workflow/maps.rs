//! The checks of map steps and their chains: a third `impl Checker` beside `steps` and
//! `validate`, for the rules only map steps have.
//!
//! A map step runs `agent` or `steps` (a chain) once per item of `items`. A chain's steps are
//! nodes whose parent is the map step, like a parallel step's branches, but unlike branches they
//! route: `next`, `then`, `else` and `on_error` name steps of the same chain, and the chain's
//! steps see each other's results (in the item's own context) and the item under `map`.

use std::collections::HashMap;

use serde_json::Value;

use super::checker::Checker;
use super::raw::RawStep;
use super::{MapBody, MapStep, StepType, Tolerance};
use crate::limits::MAP_MAX_IN_FLIGHT;

impl Checker<'_> {
    /// The map step whose chain node `n` is in.
    pub(super) fn chain_of(&self, n: usize) -> Option<usize> {
        let parent = self.nodes[n].parent?;
        (self.nodes[parent].step_type() == Some(StepType::Map)).then_some(parent)
    }

    /// The parallel step node `n` is a branch of.
    pub(super) fn parallel_of(&self, n: usize) -> Option<usize> {
        let parent = self.nodes[n].parent?;
        (self.nodes[parent].step_type() != Some(StepType::Map)).then_some(parent)
    }

    /// The ids of the steps in the same scope as `n`: its chain, or the top level.
    pub(super) fn scope_ids(&self, n: usize) -> Vec<&str> {
        let chain = self.chain_of(n);
        self.nodes
            .iter()
            .filter(|node| match chain {
                Some(map) => node.parent == Some(map),
                None => node.parent.is_none(),
            })
            .filter_map(|node| node.id.as_deref())
            .collect()
    }

    /// The context keys a chain step can read besides the run's: those of its chain's steps.
    pub(super) fn chain_keys(&self, n: usize) -> Vec<&str> {
        let Some(map) = self.chain_of(n) else {
            return Vec::new();
        };
        self.nodes[map]
            .children
            .iter()
            .map(|&c| &self.nodes[c])
            .filter(|node| node.step_type() != Some(StepType::Condition))
            .filter_map(|node| node.context_key())
            .collect()
    }

    /// A chain runs agents, transforms and conditions only: one item's work, routed in line.
    pub(super) fn check_chain_step(&mut self, n: usize, path: &str, step_type: StepType) {
        let Some(map) = self.chain_of(n) else {
            return;
        };
        if matches!(
            step_type,
            StepType::Agent | StepType::Transform | StepType::Condition
        ) {
            return;
        }
        let map_id = self.nodes[map].id.clone().unwrap_or_default();
        self.error(
            format!("{path}.type"),
            Some(n),
            format!(
                "map step \"{map_id}\"'s chain runs agent, transform and condition steps, not {} steps; each item's work is one line of steps",
                step_type.as_str()
            ),
        );
    }

    /// A map step's own fields: `items`, `agent` or `steps`, `max_concurrency` and
    /// `tolerated_failures`.
    pub(super) fn check_map(
        &mut self,
        n: usize,
        path: &str,
        raw: &RawStep,
        index: &HashMap<String, usize>,
    ) -> Option<MapStep> {
        let items = match &raw.items {
            None => {
                self.error(path.to_owned(), Some(n), "a map step needs \"items\"");
                None
            }
            Some(source) => self
                .check_transform(n, &format!("{path}.items"), source, index)
                .map(|items| (items, source.clone())),
        };
        let body = match (&raw.agent, &raw.steps) {
            (Some(_), Some(_)) => {
                self.error(
                    format!("{path}.steps"),
                    Some(n),
                    "a map step runs \"agent\" or \"steps\" per item, not both",
                );
                None
            }
            (None, None) => {
                self.error(
                    path.to_owned(),
                    Some(n),
                    "a map step needs \"agent\" (one agent per item) or \"steps\" (a chain per item)",
                );
                None
            }
            (Some(agent), None) => self
                .check_agent_name(&format!("{path}.agent"), n, agent)
                .then(|| MapBody::Agent(agent.clone())),
            (None, Some(chain)) if chain.is_empty() => {
                self.error(
                    format!("{path}.steps"),
                    Some(n),
                    "a map step's chain needs at least one step",
                );
                None
            }
            (None, Some(_)) => Some(MapBody::Chain(self.nodes[n].children.clone())),
        };
        if self.chain_of(n).is_some() {
            // Reported by `check_chain_step`; nothing more to build.
            return None;
        }
        let max_concurrency = raw.max_concurrency.filter(|&cap| {
            let valid = (1..=MAP_MAX_IN_FLIGHT).contains(&cap);
            if !valid {
                self.error(
                    format!("{path}.max_concurrency"),
                    Some(n),
                    format!("max_concurrency must be between 1 and {MAP_MAX_IN_FLIGHT}"),
                );
            }
            valid
        });
        let tolerated_failures = self.check_tolerance(n, path, raw);
        let (items, items_source) = items?;
        Some(MapStep {
            items,
            items_source,
            body: body?,
            max_concurrency,
            tolerated_failures,
        })
    }
}

impl Checker<'_> {
    /// A parallel or map step's `tolerated_failures`, read.
    pub(super) fn check_tolerance(
        &mut self,
        n: usize,
        path: &str,
        raw: &RawStep,
    ) -> Option<Tolerance> {
        match tolerance(raw.tolerated_failures.as_ref()?) {
            Ok(tolerance) => Some(tolerance),
            Err(problem) => {
                self.error(format!("{path}.tolerated_failures"), Some(n), problem);
                None
            }
        }
    }
}

/// `tolerated_failures`: a whole number of items (or branches), or a percentage written `"N%"`
/// (0 to 100).
fn tolerance(value: &Value) -> Result<Tolerance, String> {
    let shown = || {
        let text = value.to_string();
        text.chars().take(40).collect::<String>()
    };
    match value {
        Value::Number(number) => number.as_u64().map(Tolerance::Count).ok_or_else(|| {
            format!(
                "tolerated_failures must be a whole number or a percentage like \"10%\", not {}",
                shown()
            )
        }),
        Value::String(text) => {
            let percent = text
                .trim()
                .strip_suffix('%')
                .and_then(|number| number.trim().parse::<f64>().ok())
                .filter(|p| (0.0..=100.0).contains(p));
            percent.map(Tolerance::Percent).ok_or_else(|| {
                format!(
                    "tolerated_failures \"{}\" is not a percentage from \"0%\" to \"100%\"",
                    text.chars().take(40).collect::<String>()
                )
            })
        }
        _ => Err(format!(
            "tolerated_failures must be a whole number or a percentage like \"10%\", not {}",
            shown()
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_tolerance_is_a_count_or_a_percentage() {
        assert_eq!(tolerance(&json!(2)), Ok(Tolerance::Count(2)));
        assert_eq!(tolerance(&json!("10%")), Ok(Tolerance::Percent(10.0)));
        assert_eq!(tolerance(&json!(" 2.5 %")), Ok(Tolerance::Percent(2.5)));
        for bad in [
            json!(-1),
            json!(1.5),
            json!("ten"),
            json!("120%"),
            json!(true),
        ] {
            assert!(tolerance(&bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn a_tolerance_is_exceeded_by_more_failures_than_it_allows() {
        assert!(!Tolerance::Count(2).exceeded_by(2, 10));
        assert!(Tolerance::Count(2).exceeded_by(3, 10));
        assert!(!Tolerance::Percent(10.0).exceeded_by(1, 10));
        assert!(Tolerance::Percent(10.0).exceeded_by(2, 10));
        assert!(Tolerance::Percent(0.0).exceeded_by(1, 1000));
        assert!(!Tolerance::Percent(100.0).exceeded_by(5, 5));
    }
}
