//! Serving the agents of an agents file with the worker runtime.

use std::sync::Arc;

use crate::agents::AgentsFile;
use crate::runtime::WorkerBuilder;

/// Registers every agent of `file` on `builder`. Command agents get `BATON_RUN_ID`,
/// `BATON_STEP_ID`, `BATON_VISIT`, `BATON_ATTEMPT` and `BATON_COORDINATOR` in their
/// environment, and `BATON_ITEM` (its index) for a map step's item. The attempt counts deliveries of the step visit from 1: delivery is at least
/// once, so an agent with side effects can use `run/step/visit` as an idempotency key. The
/// coordinator is the address that sent the task (one address, even when the worker has
/// several), the one that answers queries about its run. `TRACEPARENT` (W3C, when the run is
/// traced) makes the agent's own spans children of the worker's span of its execution.
pub fn agents_into(mut builder: WorkerBuilder, file: AgentsFile) -> WorkerBuilder {
    for (name, agent) in file.agents {
        let agent = Arc::new(agent);
        builder = builder.agent(name, move |task| {
            let agent = agent.clone();
            async move {
                let mut env = vec![
                    ("BATON_RUN_ID".to_owned(), task.run_id.clone()),
                    ("BATON_STEP_ID".to_owned(), task.step_id.clone()),
                    ("BATON_VISIT".to_owned(), task.visit.to_string()),
                    ("BATON_ATTEMPT".to_owned(), task.attempt.to_string()),
                    ("BATON_COORDINATOR".to_owned(), task.coordinator.clone()),
                ];
                if let Some(item) = task.item {
                    env.push(("BATON_ITEM".to_owned(), item.to_string()));
                }
                if !task.traceparent.is_empty() {
                    env.push(("TRACEPARENT".to_owned(), task.traceparent.clone()));
                }
                agent
                    .run(&task.payload, &env, &task.output)
                    .await
                    .map_err(|error| agent.failure(error))
            }
        });
    }
    builder
}
