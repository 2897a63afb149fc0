//! [`Tasks`] in memory: a run's tasks live in its entry, and each agent's timers in one ordered
//! set, moved in the same lock as the task they time.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::MemoryStore;
use crate::store::{DueTask, Error, TaskSwap, Tasks};

/// Each agent's timers, ordered by due time, and where each task's timer is.
#[derive(Debug, Default)]
pub(super) struct Timers {
    pub(super) by_agent: HashMap<String, BTreeSet<(i64, String)>>,
    of_task: HashMap<String, (String, i64)>,
}

impl Timers {
    /// Puts the timer of `member` where `bytes` (the task about to be stored, or none) says.
    pub(super) fn follow(&mut self, member: &str, bytes: Option<&[u8]>) {
        if let Some((agent, due)) = self.of_task.remove(member)
            && let Some(set) = self.by_agent.get_mut(&agent)
        {
            set.remove(&(due, member.to_owned()));
        }
        if let Some((agent, due)) = bytes.and_then(timer_of) {
            self.by_agent
                .entry(agent.clone())
                .or_default()
                .insert((due, member.to_owned()));
            self.of_task.insert(member.to_owned(), (agent, due));
        }
    }
}

/// The agent and due time of a task, if it has a timer (the store contract's rule).
fn timer_of(bytes: &[u8]) -> Option<(String, i64)> {
    let task: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let agent = task.get("agent")?.as_str()?.to_owned();
    Some((agent, integer(task.get("due_ms")?)?))
}

/// A JSON number with no fraction (`2000.0` and `2e3` included, as Redis's Lua sees them).
pub(super) fn integer(value: &serde_json::Value) -> Option<i64> {
    value.as_i64().or_else(|| {
        value
            .as_f64()
            .filter(|f| f.fract() == 0.0 && f.abs() < 2f64.powi(63))
            .map(|f| f as i64)
    })
}

/// A task's timer's member in its agent's set: `<run id>/<task key>`.
pub(super) fn member(run_id: &str, task_key: &str) -> String {
    format!("{run_id}/{task_key}")
}

impl Tasks for MemoryStore {
    async fn swap_tasks(&self, swaps: Vec<TaskSwap>) -> Result<Vec<bool>, Error> {
        let mut runs = self.runs.lock().expect("store lock");
        let mut timers = self.timers.lock().expect("timers lock");
        Ok(swaps
            .into_iter()
            .map(|swap| {
                let Some(tasks) = runs.get_mut(&swap.run_id).map(|entry| &mut entry.run.tasks)
                else {
                    return false;
                };
                if tasks.get(&swap.task_key) != Some(&swap.expected) {
                    return false;
                }
                timers.follow(&member(&swap.run_id, &swap.task_key), swap.new.as_deref());
                match swap.new {
                    Some(bytes) => tasks.insert(swap.task_key, bytes),
                    None => tasks.remove(&swap.task_key),
                };
                true
            })
            .collect())
    }

    async fn due_tasks(
        &self,
        agent: &str,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<DueTask>, Error> {
        let runs = self.runs.lock().expect("store lock");
        let timers = self.timers.lock().expect("timers lock");
        let Some(set) = timers.by_agent.get(agent) else {
            return Ok(Vec::new());
        };
        Ok(set
            .iter()
            .take_while(|(due, _)| *due <= now_ms)
            .filter_map(|(_, member)| {
                let (run_id, task_key) = member.split_once('/')?;
                let task = runs.get(run_id)?.run.tasks.get(task_key)?;
                Some(DueTask {
                    run_id: run_id.to_owned(),
                    task_key: task_key.to_owned(),
                    task: task.clone(),
                })
            })
            .take(limit)
            .collect())
    }

    async fn task(&self, run_id: &str, task_key: &str) -> Result<Option<Vec<u8>>, Error> {
        let runs = self.runs.lock().expect("store lock");
        Ok(runs
            .get(run_id)
            .and_then(|entry| entry.run.tasks.get(task_key).cloned()))
    }

    async fn tasks(&self, run_id: &str) -> Result<BTreeMap<String, Vec<u8>>, Error> {
        let runs = self.runs.lock().expect("store lock");
        Ok(runs
            .get(run_id)
            .map(|entry| entry.run.tasks.clone())
            .unwrap_or_default())
    }
}
