//! What a client sees of a run: the run record, the step states, and the run's memory.

use std::collections::BTreeMap;

use baton_core::workflow::{MapBody, MapStep, StepKind, StepType, Workflow};
use baton_core::{Run, Waiting};
use serde_json::{Value, json};

use crate::model::StepState;
pub use crate::model::{AttemptUsage, ItemCounts, ModelUsage, StepStatus};

/// A run as `GetRun` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub run_id: String,
    pub workflow_id: String,
    /// running, succeeded, failed or cancelled.
    pub status: String,
    pub error: String,
    /// The context as agents see it, JSON.
    pub context: Vec<u8>,
    /// Every step in workflow order.
    pub steps: Vec<StepView>,
    /// What a running run waits for.
    pub waiting: Vec<WaitingFor>,
    /// The head of the run's state chain.
    pub state_sha256: String,
    pub created_ms: i64,
    pub updated_ms: i64,
    /// The run's memory, JSON ([`memory`]).
    pub memory: Vec<u8>,
    /// The run's trace, empty when it has none.
    pub trace_id: String,
    /// The principal that submitted the run; empty without authentication.
    pub submitted_by: String,
    /// The tokens every step's attempts used, summed per model (in the order models first
    /// appear).
    pub usage: Vec<ModelUsage>,
}

/// One step of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepView {
    pub step_id: String,
    pub step_type: StepType,
    pub status: StepStatus,
    pub attempts: u32,
    pub visits: u32,
    pub worker_id: String,
    /// The parallel step it is a branch of, empty for none.
    pub parent: String,
    /// An agent step's agent, empty for other steps.
    pub agent: String,
    pub error: String,
    /// The tokens its attempts used, one entry per call to a model.
    pub usage: Vec<AttemptUsage>,
    /// A map step's items, at its current (or last) visit.
    pub items: Option<ItemCounts>,
}

/// What a running run waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitingFor {
    /// A worker for an agent step; `served` says whether a connected worker serves the agent.
    Agent {
        step_id: String,
        agent: String,
        served: bool,
    },
    /// A person's decision on an approval step.
    Approval { step_id: String, message: String },
    /// Its turn to run a step's `jq:` program.
    Computation { step_id: String },
}

/// The run's memory: its message history, the decisions its agents reported, and every
/// handoff into an agent step.
pub fn memory(run: &Run) -> Value {
    json!({
        "messages": run.messages().messages(),
        "decisions": run.decisions().iter().map(|d| d.as_ref()).collect::<Vec<_>>(),
        "handoffs": run.handoffs().iter().map(|h| h.as_ref()).collect::<Vec<_>>(),
    })
}

/// Every step in workflow order, with its state (pending if never entered).
pub fn step_states(workflow: &Workflow, steps: &BTreeMap<String, StepState>) -> Vec<StepView> {
    workflow
        .steps()
        .iter()
        .map(|step| {
            let state = steps.get(step.id.as_ref()).cloned().unwrap_or_default();
            StepView {
                step_id: step.id.to_string(),
                step_type: step.step_type(),
                status: state.status,
                attempts: state.attempts,
                visits: state.visits,
                worker_id: state.worker_id,
                parent: step
                    .parent
                    .map(|p| workflow.step(p).id.to_string())
                    .unwrap_or_default(),
                agent: match &step.kind {
                    StepKind::Agent { agent } => agent.clone(),
                    StepKind::Map(MapStep {
                        body: MapBody::Agent(agent),
                        ..
                    }) => agent.clone(),
                    _ => String::new(),
                },
                error: state.error,
                usage: state.usage,
                items: state.items,
            }
        })
        .collect()
}

/// The tokens of every step's attempts, summed per model, in the order models first appear.
pub fn usage_totals<'a>(steps: impl IntoIterator<Item = &'a StepState>) -> Vec<ModelUsage> {
    let mut totals: Vec<ModelUsage> = Vec::new();
    let used = steps.into_iter().flat_map(|state| {
        let items = state.items.iter().flat_map(|items| &items.usage);
        state.usage.iter().map(|used| &used.usage).chain(items)
    });
    for used in used {
        match totals.iter_mut().find(|total| total.model == used.model) {
            Some(total) => {
                total.prompt_tokens += used.prompt_tokens;
                total.completion_tokens += used.completion_tokens;
            }
            None => totals.push(used.clone()),
        }
    }
    totals
}

/// What a running run waits for; `served` says whether a connected worker serves an agent.
/// A map step's items in flight are one entry per step and agent, not one per item.
pub fn waiting(run: &Run, served: impl Fn(&str) -> bool) -> Vec<WaitingFor> {
    let mut seen = std::collections::HashSet::new();
    run.waiting()
        .into_iter()
        .filter(|waiting| match waiting {
            Waiting::Agent { task, agent } if task.item.is_some() => {
                seen.insert((task.step_id.clone(), agent.clone()))
            }
            _ => true,
        })
        .map(|waiting| match waiting {
            Waiting::Agent { task, agent } => WaitingFor::Agent {
                step_id: task.step_id.to_string(),
                served: served(&agent),
                agent,
            },
            Waiting::Approval { step_id, message } => WaitingFor::Approval {
                step_id: step_id.to_string(),
                message,
            },
            Waiting::Computation { step_id } => WaitingFor::Computation {
                step_id: step_id.to_string(),
            },
        })
        .collect()
}
