//! The tasks and waits of a map's items in flight, rebuilt from the run: what a coordinator
//! delivers again after a replay, and what GetRun says the run waits for.

use crate::engine::events::{AgentTask, TaskId, Waiting};
use crate::engine::pending::{ItemRun, MapRun, Pending};
use crate::engine::run::Run;
use crate::payload::AgentPayload;
use crate::workflow::{MapBody, MapStep, StepIndex, StepKind};

/// The task of an item as dispatched (and rebuilt after a replay: nothing it reads changes
/// while the item waits).
pub(super) fn item_task(run: &Run, task: TaskId, agent: &str, item: &ItemRun) -> AgentTask {
    let step = run.workflow.step(item.step);
    let reference = step.input.as_ref().and_then(|key| {
        item.context
            .data(key)
            .map(|data| (key.clone(), data.clone()))
    });
    AgentTask {
        task,
        agent: agent.to_owned(),
        payload: AgentPayload {
            context: item.context.clone(),
            reference,
            error: item.error.clone(),
            messages: run.messages.json().clone(),
            handoff: item.handoff.clone(),
            map: Some(item.info.clone()),
        },
        retry: step.retry.clone(),
        timeout_ms: step.timeout_ms,
    }
}

/// The agent a step waiting for an item runs.
fn agent_of(run: &Run, step: StepIndex) -> &str {
    match &run.workflow.step(step).kind {
        StepKind::Agent { agent } => agent,
        StepKind::Map(MapStep {
            body: MapBody::Agent(agent),
            ..
        }) => agent,
        _ => unreachable!("an item waits for an agent"),
    }
}

impl Run {
    /// The tasks of a map step's items in flight, as dispatched.
    pub(in crate::engine) fn item_tasks(&self, _index: StepIndex, map: &MapRun) -> Vec<AgentTask> {
        map.running
            .iter()
            .map(|(&i, item)| {
                let task = TaskId {
                    step_id: self.workflow.step(item.step).id.clone().into(),
                    visit: item.visit,
                    item: Some(i),
                };
                item_task(self, task, agent_of(self, item.step), item)
            })
            .collect()
    }

    /// One item's task, if the run waits for it.
    pub(in crate::engine) fn pending_item_task(&self, task: &TaskId) -> Option<AgentTask> {
        let i = task.item?;
        let step = self.workflow.index_of(&task.step_id)?;
        let map_index = self.workflow.map_of(step).unwrap_or(step);
        let Some(Pending::Map(map)) = self.pending.get(&map_index) else {
            return None;
        };
        let item = map.running.get(&i)?;
        (item.step == step && item.visit == task.visit)
            .then(|| item_task(self, task.clone(), agent_of(self, step), item))
    }

    /// What a map step's items in flight wait for.
    pub(in crate::engine) fn items_waiting(&self, map: &MapRun) -> Vec<Waiting> {
        map.running
            .iter()
            .map(|(&i, item)| Waiting::Agent {
                task: TaskId {
                    step_id: self.workflow.step(item.step).id.clone().into(),
                    visit: item.visit,
                    item: Some(i),
                },
                agent: agent_of(self, item.step).to_owned(),
            })
            .collect()
    }
}
