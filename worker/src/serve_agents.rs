//! Serving the agents of an agents file with the worker runtime.

use std::sync::Arc;

use crate::agents::AgentsFile;
use crate::runtime::WorkerBuilder;

/// Registers every agent of `file` on `builder`. Command agents get `BATON_RUN_ID`,
/// `BATON_STEP_ID` and `BATON_COORDINATOR` in their environment.
pub fn agents_into(
    mut builder: WorkerBuilder,
    file: AgentsFile,
    coordinator: &str,
) -> WorkerBuilder {
    for (name, agent) in file.agents {
        let agent = Arc::new(agent);
        let coordinator = coordinator.to_owned();
        builder = builder.agent(name, move |task| {
            let (agent, coordinator) = (agent.clone(), coordinator.clone());
            async move {
                let env = [
                    ("BATON_RUN_ID".to_owned(), task.run_id.clone()),
                    ("BATON_STEP_ID".to_owned(), task.step_id.clone()),
                    ("BATON_COORDINATOR".to_owned(), coordinator),
                ];
                agent
                    .run(&task.payload, &env)
                    .await
                    .map_err(|error| error.to_string())
            }
        });
    }
    builder
}
