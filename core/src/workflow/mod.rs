//! The workflow language: a JSON document of steps, parsed and validated into a [`Workflow`].
//!
//! - [`parse`]: document text to [`Workflow`], reporting every problem at once with its JSON path;
//!   it runs the passes below in order.
//! - `json`: the text to JSON, comments and trailing commas allowed, nesting bounded.
//! - `raw`: the document as written (serde), every field optional so nothing is lost before
//!   validation can say what is wrong.
//! - `steps`: each step read by itself, checked against its type, and built into a [`Step`].
//! - `validate`: the rules that need the whole document: ids, references, expressions, limits,
//!   reachability, and "did you mean" hints.
//! - `maps`: the rules only map steps and their chains have.
//! - [`names`]: what may be a step id, a workflow id or an agent name (printable, no braces,
//!   bounded); the coordinator checks the names clients filter by with it too.
//! - `checker`: what the passes share: the steps as found, and each problem with its step.
//! - `graph`: routing edges between top-level steps, for reachability.
//!
//! A [`Workflow`] only exists once it is valid: the engine never sees a dangling reference.

mod checker;
mod graph;
mod json;
mod maps;
pub mod names;
pub mod parse;
mod raw;
mod steps;
mod validate;

use std::collections::HashMap;
use std::sync::Arc;

use crate::eval::Transform;
use crate::eval::expr::Expr;

pub use parse::{ParseError, parse_workflow, parse_workflow_with};

/// Index of a step in [`Workflow::steps`].
pub type StepIndex = usize;

/// A validated workflow, ready to run. Cheap to share (`Arc<Workflow>`).
#[derive(Debug)]
pub struct Workflow {
    /// The document's `id`, if it has one.
    pub id: Option<String>,
    pub description: Option<String>,
    /// How many times any step may be entered in one run (a step's own `max_visits` wins).
    pub max_visits: u32,
    /// Every step, parallel branches and map chains included, in document order (a parallel
    /// or map step before its own steps).
    steps: Vec<Step>,
    /// Indexes of the top-level steps, in document order; the first is the entry.
    top_level: Vec<StepIndex>,
    by_id: HashMap<Arc<str>, StepIndex>,
}

/// One step of a workflow.
#[derive(Debug)]
pub struct Step {
    pub id: Arc<str>,
    pub kind: StepKind,
    /// The key under which the step's data enters the context: its `output` alias, else its id.
    pub context_key: Arc<str>,
    /// `input`: the step or alias whose data is also handed to an agent under its own key.
    pub input: Option<Arc<str>>,
    /// Where to go after success, already resolved from `next`, `end` and document order.
    pub on_success: Option<StepIndex>,
    /// `on_error`: where to go when the step fails.
    pub on_error: Option<StepIndex>,
    /// The parallel step this step is a branch of, or the map step whose chain it is in.
    pub parent: Option<StepIndex>,
    pub max_visits: u32,
    /// Parsed now, enforced by the coordinator.
    pub retry: Option<RetryPolicy>,
    /// Parsed now, enforced by the coordinator.
    pub timeout_ms: Option<u64>,
}

/// What a step does, with the fields its type needs.
#[derive(Debug)]
pub enum StepKind {
    Agent {
        agent: String,
    },
    Transform {
        transform: Transform,
        source: String,
    },
    Parallel {
        branches: Vec<StepIndex>,
        /// How many failed branches the step survives; more fail it (and stop the others).
        /// `None`: failed branches never fail the step by themselves.
        tolerated_failures: Option<Tolerance>,
    },
    Condition {
        condition: Expr,
        source: String,
        /// `then`, or where success would go when absent.
        when_true: Option<StepIndex>,
        /// `else`, or where success would go when absent.
        when_false: Option<StepIndex>,
    },
    Approval {
        message: String,
        /// `on_approve`, or where success would go when absent.
        on_approve: Option<StepIndex>,
        /// `on_reject`; when absent a rejection fails the step.
        on_reject: Option<StepIndex>,
    },
    Map(MapStep),
}

/// A map step: the same work for every item of a list.
#[derive(Debug)]
pub struct MapStep {
    /// What gives the items: a path or a `jq:` program that must give an array.
    pub items: Transform,
    pub items_source: String,
    /// What runs per item.
    pub body: MapBody,
    /// At most this many items wait for agents at once; `None` is the engine's ceiling,
    /// [`crate::limits::MAP_MAX_IN_FLIGHT`], which in practice leaves the workers' slots as the cap.
    pub max_concurrency: Option<u32>,
    /// How many failed items the step survives; more fail it. `None`: failed items never fail
    /// the step by themselves (as with a parallel step's branches).
    pub tolerated_failures: Option<Tolerance>,
}

/// What a map step runs for each item.
#[derive(Debug, Clone, PartialEq)]
pub enum MapBody {
    /// One agent per item: the map step's own task, per item.
    Agent(String),
    /// A chain of agent, transform and condition steps (their indexes, the first is the entry),
    /// routed inside the chain as top-level steps are; the last data is the item's result.
    Chain(Vec<StepIndex>),
}

/// `tolerated_failures`: a count, or a percentage of the items.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tolerance {
    Count(u64),
    Percent(f64),
}

impl Tolerance {
    /// Whether `failed` failures out of `count` items are more than this tolerates.
    pub fn exceeded_by(self, failed: usize, count: usize) -> bool {
        match self {
            Tolerance::Count(allowed) => failed as u64 > allowed,
            Tolerance::Percent(percent) => failed as f64 * 100.0 > percent * count as f64,
        }
    }
}

impl std::fmt::Display for Tolerance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tolerance::Count(n) => write!(f, "{n}"),
            Tolerance::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// The `type` of a step, without its fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepType {
    Agent,
    Transform,
    Parallel,
    Condition,
    Approval,
    Map,
}

impl StepType {
    pub const ALL: [StepType; 6] = [
        StepType::Agent,
        StepType::Transform,
        StepType::Parallel,
        StepType::Condition,
        StepType::Approval,
        StepType::Map,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StepType::Agent => "agent",
            StepType::Transform => "transform",
            StepType::Parallel => "parallel",
            StepType::Condition => "condition",
            StepType::Approval => "approval",
            StepType::Map => "map",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == name)
    }
}

/// Retry policy of a step, as Temporal spells it.
///
/// A step without `retry` is tried once: an agent's error goes straight to `on_error` (or
/// fails the run). A `retry` block's defaults are 3 attempts, 1 s, coefficient 2 and a ceiling
/// of 100 times the initial interval (Temporal's). Attempts lost with a worker do not count:
/// only the agent's errors and timeouts do.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub initial_interval_ms: u64,
    pub backoff_coefficient: f64,
    pub max_interval_ms: Option<u64>,
}

/// How far a backoff is moved at random either way: ±20 %, so that tasks that failed together
/// (a flaky dependency) do not all come back together.
pub const RETRY_JITTER: f64 = 0.2;

impl RetryPolicy {
    /// Whether a step that has failed `failures` times gets another attempt.
    pub fn retries_after(&self, failures: u32) -> bool {
        failures < self.max_attempts
    }

    /// The ceiling of a backoff: `max_interval_ms`, or 100 times the initial interval.
    pub fn max_interval(&self) -> u64 {
        self.max_interval_ms
            .unwrap_or(self.initial_interval_ms.saturating_mul(100))
    }

    /// The wait before the attempt after the `failures`-th failure (from 1):
    /// `initial * coefficient^(failures - 1)`, at most [`RetryPolicy::max_interval`], then moved
    /// by up to [`RETRY_JITTER`] either way by `unit` (a random number in `[0, 1)`; 0.5 moves
    /// it not at all). Pure, so the caller picks the randomness.
    pub fn backoff_ms(&self, failures: u32, unit: f64) -> u64 {
        // Past the ceiling the power may be infinite; `min` takes the ceiling then.
        let exponent = i32::try_from(failures.saturating_sub(1)).unwrap_or(i32::MAX);
        let base = self.initial_interval_ms as f64 * self.backoff_coefficient.powi(exponent);
        let capped = base.min(self.max_interval() as f64);
        let factor = 1.0 + RETRY_JITTER * (2.0 * unit.clamp(0.0, 1.0) - 1.0);
        (capped * factor).round().max(1.0) as u64
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 1,
            initial_interval_ms: 1_000,
            backoff_coefficient: 2.0,
            max_interval_ms: None,
        }
    }
}

impl Step {
    pub fn step_type(&self) -> StepType {
        match self.kind {
            StepKind::Agent { .. } => StepType::Agent,
            StepKind::Transform { .. } => StepType::Transform,
            StepKind::Parallel { .. } => StepType::Parallel,
            StepKind::Condition { .. } => StepType::Condition,
            StepKind::Approval { .. } => StepType::Approval,
            StepKind::Map(_) => StepType::Map,
        }
    }
}

impl Step {
    /// A parallel or map step's `tolerated_failures`, if it sets one: then the failures it
    /// tolerates do not send it to `on_error`, and more fail it.
    pub fn tolerated_failures(&self) -> Option<Tolerance> {
        match &self.kind {
            StepKind::Parallel {
                tolerated_failures, ..
            } => *tolerated_failures,
            StepKind::Map(map) => map.tolerated_failures,
            _ => None,
        }
    }
}

impl Workflow {
    /// The entry step: the first top-level step.
    pub fn entry(&self) -> StepIndex {
        self.top_level[0]
    }

    pub fn step(&self, index: StepIndex) -> &Step {
        &self.steps[index]
    }

    /// Whether entering step `index` runs a `jq:` program: a jq transform, a map step whose
    /// items or chain has one, a parallel step with such a branch. The engine enters such a
    /// top-level step only in a transition of its own ([`crate::Event::Continue`]).
    pub fn runs_jq(&self, index: StepIndex) -> bool {
        match &self.step(index).kind {
            StepKind::Transform { transform, .. } => transform.is_jq(),
            StepKind::Map(map) => {
                map.items.is_jq()
                    || matches!(&map.body, MapBody::Chain(chain) if chain.iter().any(|&s| self.runs_jq(s)))
            }
            StepKind::Parallel { branches, .. } => branches.iter().any(|&b| self.runs_jq(b)),
            StepKind::Agent { .. } | StepKind::Condition { .. } | StepKind::Approval { .. } => {
                false
            }
        }
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    pub fn top_level(&self) -> &[StepIndex] {
        &self.top_level
    }

    pub fn index_of(&self, id: &str) -> Option<StepIndex> {
        self.by_id.get(id).copied()
    }

    pub fn step_by_id(&self, id: &str) -> Option<&Step> {
        self.index_of(id).map(|index| &self.steps[index])
    }

    /// The parallel step `index` is a branch of, if it is one.
    pub fn parallel_of(&self, index: StepIndex) -> Option<StepIndex> {
        let parent = self.steps[index].parent?;
        matches!(self.steps[parent].kind, StepKind::Parallel { .. }).then_some(parent)
    }

    /// The map step whose chain `index` is in, if it is in one.
    pub fn map_of(&self, index: StepIndex) -> Option<StepIndex> {
        let parent = self.steps[index].parent?;
        matches!(self.steps[parent].kind, StepKind::Map(_)).then_some(parent)
    }
}
