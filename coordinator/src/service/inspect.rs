//! One step of a run, inspected: every visit with the payload its agent received, its result or
//! error, its attempts, and the messages, decisions and handoffs it took part in. What the web
//! UI's step panel shows.
//!
//! Payloads are not stored: they are rebuilt by replaying the run's events, checked against its
//! state chain, exactly as the engine dispatched them ([`chain::replay_observed`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use baton_core::workflow::{MapBody, MapStep, StepKind};
use baton_core::{Action, Run, Workflow};
use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::{Coordinator, Error};
use crate::chain;
use crate::model::{AttemptRecord, AttemptUsage, StepState, StepStatus};
use crate::store::Store;

/// How many of a step's visits are shown, the latest: a loop may visit a step hundreds of
/// times, and each visit's payload holds the whole context.
pub const VISITS_SHOWN: usize = 20;

/// A step as its panel shows it.
#[derive(Debug, Clone, Serialize)]
pub struct StepDetail {
    pub step_id: String,
    #[serde(rename = "type")]
    pub step_type: &'static str,
    /// The agent of an agent step (or of an agent map step).
    pub agent: Option<String>,
    pub status: StepStatus,
    /// The latest [`VISITS_SHOWN`] visits, oldest first.
    pub visits: Vec<VisitDetail>,
    /// How many visits there were in all.
    pub visit_count: u32,
    /// The messages of the run's history that the step wrote.
    pub messages: Vec<Value>,
    /// The decisions the step recorded.
    pub decisions: Vec<Value>,
    /// The handoffs into the step, and those it took part in as a source.
    pub handoffs: Vec<Value>,
    pub approval: Option<ApprovalDetail>,
    /// Why the run's stored data could not be read past some point, if it could not: what is
    /// shown stops there.
    pub integrity_problem: Option<String>,
}

/// One visit of a step.
#[derive(Debug, Clone, Serialize)]
pub struct VisitDetail {
    pub visit: u32,
    /// How it ended, or (the current visit) where it stands.
    pub status: StepStatus,
    /// The agent payload exactly as the agent received it.
    pub payload: Option<Box<RawValue>>,
    pub result: Option<Value>,
    pub error: Option<String>,
    /// When it started: its agent task dispatched, or the step entered; ms since the epoch.
    pub started_ms: Option<i64>,
    pub finished_ms: Option<i64>,
    pub attempts: Vec<AttemptDetail>,
}

/// One attempt of a visit.
#[derive(Debug, Clone, Serialize)]
pub struct AttemptDetail {
    #[serde(flatten)]
    pub record: AttemptRecord,
    /// The tokens it used, one entry per call to a model.
    pub usage: Vec<crate::model::ModelUsage>,
}

/// What an approval step asks, and about what.
#[derive(Debug, Clone, Serialize)]
pub struct ApprovalDetail {
    pub message: String,
    /// The step whose data is up for approval: the one that routed to the approval last.
    pub about: Option<String>,
    pub about_data: Option<Value>,
}

impl<S: Store> Coordinator<S> {
    /// The workflow `run_id` runs.
    pub async fn workflow(&self, run_id: &str) -> Result<Arc<Workflow>, Error> {
        self.workflow_of(run_id).await
    }

    /// Everything about `step_id` of `run_id`, read from the store now.
    pub async fn inspect_step(&self, run_id: &str, step_id: &str) -> Result<StepDetail, Error> {
        let stored = self.stored_run(run_id).await?;
        let state: StepState = match stored.steps.get(step_id) {
            Some(bytes) => serde_json::from_slice(bytes).map_err(|e| Error::Corrupt {
                run_id: run_id.to_owned(),
                reason: format!("step state of {step_id}: {e}"),
            })?,
            None => StepState::default(),
        };
        let mut dispatched: BTreeMap<u32, (Box<RawValue>, i64)> = BTreeMap::new();
        let mut entered: BTreeMap<u32, i64> = BTreeMap::new();
        let checked = chain::replay_observed(&stored, &self.inner.workflows, |actions, at| {
            for action in actions {
                match action {
                    Action::Dispatch(task)
                        if task.task.item.is_none() && &*task.task.step_id == step_id =>
                    {
                        let payload = RawValue::from_string(
                            String::from_utf8(task.payload.to_json())
                                .expect("serde_json writes UTF-8"),
                        )
                        .expect("a payload is JSON");
                        dispatched.insert(task.task.visit, (payload, at));
                    }
                    Action::AwaitApproval {
                        step_id: awaited,
                        visit,
                        ..
                    } if &**awaited == step_id => {
                        entered.insert(*visit, at);
                    }
                    _ => {}
                }
            }
        })
        .map_err(|unreadable| Error::Corrupt {
            run_id: run_id.to_owned(),
            reason: unreadable.0,
        })?;
        let run = &checked.run;
        let step = run
            .workflow()
            .step_by_id(step_id)
            .ok_or_else(|| Error::StepNotFound {
                run_id: run_id.to_owned(),
                step_id: step_id.to_owned(),
            })?;
        let visit_count = run.visits(step_id);
        let first_shown = visit_count.saturating_sub(VISITS_SHOWN as u32) + 1;
        let visits = (first_shown..=visit_count)
            .map(|visit| {
                let (payload, dispatched_at) = dispatched
                    .remove(&visit)
                    .map_or((None, None), |(payload, at)| (Some(payload), Some(at)));
                visit_detail(run, &state, step_id, visit, payload)
                    .started(dispatched_at.or_else(|| entered.get(&visit).copied()))
            })
            .collect();
        let agent = match &step.kind {
            StepKind::Agent { agent } => Some(agent.clone()),
            StepKind::Map(MapStep {
                body: MapBody::Agent(agent),
                ..
            }) => Some(agent.clone()),
            _ => None,
        };
        let approval = match &step.kind {
            StepKind::Approval { message, .. } => Some(approval_detail(run, step_id, message)),
            _ => None,
        };
        Ok(StepDetail {
            step_id: step_id.to_owned(),
            step_type: step.step_type().as_str(),
            messages: messages_of(run, step_id, agent.as_deref()),
            decisions: run
                .decisions()
                .iter()
                .filter(|decision| decision.step_id == step_id)
                .map(|decision| to_value(decision.as_ref()))
                .collect(),
            handoffs: run
                .handoffs()
                .iter()
                .filter(|handoff| {
                    &*handoff.step_id == step_id
                        || agent
                            .as_ref()
                            .is_some_and(|agent| handoff.source_agents.contains(agent))
                })
                .map(|handoff| to_value(handoff.as_ref()))
                .collect(),
            agent,
            status: state.status,
            visits,
            visit_count,
            approval,
            integrity_problem: checked.mismatch.map(|mismatch| mismatch.to_string()),
        })
    }
}

impl VisitDetail {
    fn started(mut self, at: Option<i64>) -> Self {
        self.started_ms = at.or(self.started_ms);
        self
    }
}

/// A visit as the history settled it (or as it stands, for the current one).
fn visit_detail(
    run: &Run,
    state: &StepState,
    step_id: &str,
    visit: u32,
    payload: Option<Box<RawValue>>,
) -> VisitDetail {
    // A step's own settled record of this visit; map items settle records of their own.
    let settled = run.history().iter().rev().find(|record| {
        &*record.step_id == step_id && record.visit == visit && record.item.is_none()
    });
    let usage = |attempt: u32| {
        state
            .usage
            .iter()
            .filter(|used: &&AttemptUsage| used.visit == visit && used.attempt == attempt)
            .map(|used| used.usage.clone())
            .collect()
    };
    let attempts = state
        .attempt_log
        .iter()
        .filter(|record| record.visit == visit)
        .map(|record| AttemptDetail {
            usage: usage(record.attempt),
            record: record.clone(),
        })
        .collect();
    match settled {
        Some(record) => VisitDetail {
            visit,
            status: record.status.into(),
            payload,
            result: record.data.as_deref().cloned(),
            error: record.error.as_deref().map(str::to_owned),
            started_ms: None,
            finished_ms: (record.at_ms > 0).then_some(record.at_ms),
            attempts,
        },
        None => VisitDetail {
            visit,
            status: state.status,
            payload,
            result: None,
            error: state.error.clone(),
            started_ms: (state.since_visit == visit && state.since_ms > 0)
                .then_some(state.since_ms),
            finished_ms: None,
            attempts,
        },
    }
}

/// The approval's question and the data it is about: that of the step that routed to it last.
fn approval_detail(run: &Run, step_id: &str, message: &str) -> ApprovalDetail {
    let about = run
        .history()
        .iter()
        .rev()
        .find(|record| record.next.as_deref() == Some(step_id))
        .map(|record| record.step_id.to_string());
    let about_data = about.as_deref().and_then(|about| {
        let key = run.workflow().step_by_id(about)?.context_key.clone();
        run.context().data(&key).map(|data| data.as_ref().clone())
    });
    ApprovalDetail {
        message: message.to_owned(),
        about,
        about_data,
    }
}

/// The messages a step wrote: ids it was given (`<step>#<visit>/<n>`) or its agent's name.
fn messages_of(run: &Run, step_id: &str, agent: Option<&str>) -> Vec<Value> {
    let prefix = format!("{step_id}#");
    run.messages()
        .messages()
        .iter()
        .filter(|message| {
            message.id.starts_with(&prefix) || (agent.is_some() && message.name.as_deref() == agent)
        })
        .map(to_value)
        .collect()
}

fn to_value(value: &impl Serialize) -> Value {
    serde_json::to_value(value).expect("memory records are JSON")
}
