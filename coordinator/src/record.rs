//! What a client sees of a run: the run record, the step states, and the run's memory.

use std::collections::BTreeMap;

use baton_core::workflow::{MapBody, MapStep, StepKind, StepType, Workflow};
use baton_core::{Run, RunStatus, Waiting, WorkerId};
use serde_json::{Value, json};

use crate::model::StepState;
pub use crate::model::{AttemptUsage, ItemCounts, ModelUsage, StepStatus};

/// A run as `GetRun` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub run_id: String,
    pub workflow_id: String,
    /// running, succeeded, failed or cancelled.
    pub status: RunStatus,
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
    pub worker_id: Option<WorkerId>,
    /// The parallel step it is a branch of, empty for none.
    pub parent: String,
    /// An agent step's agent, empty for other steps.
    pub agent: String,
    pub error: Option<String>,
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

/// The JSON that stands in a record for a value too large to show with the rest: its size and
/// digest (the value itself is stored whole, and agents still receive it).
fn omitted(bytes: &[u8], limit: usize) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    serde_json::to_vec(&json!({"$omitted": {
        "bytes": bytes.len(),
        "sha256": hex::encode(Sha256::digest(bytes)),
        "why": format!("too large to show in the run record, whose context and memory may hold {limit} bytes"),
    }}))
    .expect("JSON")
}

/// A record's context and memory (each JSON) within `limit` bytes together: as they are when
/// they fit, else with the largest context entries, then the memory, replaced by what
/// [`omitted`] says of them. Every result is bounded, but not their sum: without this, a few
/// large results (whatever workers sent) made a record no client could read (past the gRPC
/// message limit) and web pages of hundreds of megabytes.
pub fn fit(context: Vec<u8>, memory: Vec<u8>, limit: usize) -> (Vec<u8>, Vec<u8>) {
    if context.len() + memory.len() <= limit {
        return (context, memory);
    }
    let Ok(Value::Object(entries)) = serde_json::from_slice::<Value>(&context) else {
        return (omitted(&context, limit), omitted(&memory, limit));
    };
    let mut encoded: Vec<(String, Vec<u8>)> = entries
        .into_iter()
        .map(|(key, value)| (key, serde_json::to_vec(&value).expect("JSON")))
        .collect();
    let overhead = |entries: &[(String, Vec<u8>)]| -> usize {
        entries
            .iter()
            .map(|(key, value)| key.len() + value.len() + 4)
            .sum::<usize>()
            + 2
    };
    let mut by_size: Vec<usize> = (0..encoded.len()).collect();
    by_size.sort_by_key(|&i| std::cmp::Reverse(encoded[i].1.len()));
    for i in by_size {
        if overhead(&encoded) + memory.len() <= limit {
            break;
        }
        encoded[i].1 = omitted(&encoded[i].1, limit);
    }
    let memory = if overhead(&encoded) + memory.len() > limit {
        omitted(&memory, limit)
    } else {
        memory
    };
    let mut object = serde_json::Map::new();
    for (key, value) in encoded {
        let value: Value = serde_json::from_slice(&value).expect("JSON written above");
        object.insert(key, value);
    }
    (
        serde_json::to_vec(&Value::Object(object)).expect("JSON"),
        memory,
    )
}

#[cfg(test)]
mod fit_tests {
    use super::*;

    #[test]
    fn a_record_that_fits_is_kept_and_one_that_does_not_loses_its_largest_entries_first() {
        let context = serde_json::to_vec(&json!({"small": 1, "big": "x".repeat(1000)})).unwrap();
        let memory = b"{\"messages\":[]}".to_vec();
        let (kept, kept_memory) = fit(context.clone(), memory.clone(), 2_000);
        assert_eq!((kept, kept_memory), (context.clone(), memory.clone()));

        let (fitted, fitted_memory) = fit(context, memory.clone(), 600);
        assert!(
            fitted.len() + fitted_memory.len() <= 600,
            "{}",
            fitted.len()
        );
        let fitted: Value = serde_json::from_slice(&fitted).unwrap();
        assert_eq!(fitted["small"], json!(1), "what fits stays");
        assert_eq!(fitted["big"]["$omitted"]["bytes"], json!(1002));
        assert_eq!(fitted_memory, memory);
    }

    #[test]
    fn whatever_the_sizes_the_record_ends_within_its_limit_or_all_omitted() {
        let big = |n: usize| Value::String("y".repeat(n));
        let context =
            serde_json::to_vec(&json!({"a": big(3000), "b": big(3000), "c": big(10)})).unwrap();
        let memory = serde_json::to_vec(&json!({"messages": [big(5000)]})).unwrap();
        let (context, memory) = fit(context, memory, 1_500);
        assert!(context.len() + memory.len() <= 1_500);
        let memory: Value = serde_json::from_slice(&memory).unwrap();
        assert!(memory["$omitted"]["sha256"].is_string());
    }
}
