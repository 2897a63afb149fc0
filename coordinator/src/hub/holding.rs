//! Who holds which task: where each held task is, for a lease renewal ([`Hub::locate`]), and
//! whether a worker holds the attempt it answers or asks about.

use std::collections::{HashMap, HashSet};

use baton_core::WorkerId;

use super::session::Session;
use super::{Holding, Hub, Worker};
use crate::task_ref::TaskMap;

/// A task [`Hub::locate`] is asked about.
#[derive(Debug, Clone, Copy)]
pub struct TaskAsked<'a> {
    pub run_id: &'a str,
    /// Its visit key.
    pub task_key: &'a str,
    pub agent: &'a str,
}

impl Hub {
    /// Where each task is: on a worker's stream, or queued while a worker that serves its agent
    /// is connected. One pass over the workers and queues, whatever the number of tasks asked
    /// about.
    pub fn locate(&self, tasks: &[TaskAsked<'_>]) -> Vec<Holding> {
        let state = self.lock();
        let mut served: HashSet<&str> = HashSet::new();
        let mut holders: HashMap<(&str, &str), (&WorkerId, &Option<String>)> = HashMap::new();
        for (id, worker) in &state.workers {
            for (run_id, task_key) in worker.holding.keys() {
                holders.insert((run_id, task_key), (id, &worker.principal));
            }
            served.extend(worker.agents.iter().map(String::as_str));
        }
        let queued: HashSet<(&str, &str)> = state
            .queues
            .values()
            .flatten()
            .map(|task| (task.run_id(), task.key.as_str()))
            .collect();
        tasks
            .iter()
            .map(
                |&TaskAsked {
                     run_id,
                     task_key,
                     agent,
                 }| {
                    let key = (run_id, task_key);
                    if let Some((id, principal)) = holders.get(&key) {
                        Holding::Worker(Worker {
                            id: (*id).clone(),
                            principal: (*principal).clone(),
                        })
                    } else if queued.contains(&key) && served.contains(agent) {
                        Holding::Queued
                    } else {
                        // In no queue and on no worker: dropped on an error path. Given up, so
                        // that a sweep delivers it again.
                        Holding::Nowhere
                    }
                },
            )
            .collect()
    }

    /// Whether `worker_id` holds this attempt of the task.
    pub fn holds(&self, worker_id: &str, run_id: &str, task_key: &str, attempt: u32) -> bool {
        self.holds_if(worker_id, run_id, task_key, attempt, |_| true)
    }

    /// Whether `worker_id` holds this attempt of the task and connected as `principal` (`None`
    /// without authentication): for a request that names the worker in a field rather than
    /// coming down its stream.
    pub fn holds_as(
        &self,
        worker_id: &str,
        principal: Option<&str>,
        run_id: &str,
        task_key: &str,
        attempt: u32,
    ) -> bool {
        self.holds_if(worker_id, run_id, task_key, attempt, |worker| {
            worker.principal.as_deref() == principal
        })
    }

    fn holds_if(
        &self,
        worker_id: &str,
        run_id: &str,
        task_key: &str,
        attempt: u32,
        accept: impl FnOnce(&Session) -> bool,
    ) -> bool {
        let state = self.lock();
        state.workers.get(worker_id).is_some_and(|worker| {
            accept(worker)
                && worker
                    .holding
                    .get_task(run_id, task_key)
                    .is_some_and(|task| task.attempt() == attempt)
        })
    }
}
