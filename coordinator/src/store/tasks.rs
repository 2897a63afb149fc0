//! Tasks and their timers: the [`Tasks`] trait, a compare-and-swap of a task ([`TaskSwap`]) and
//! a task found due ([`DueTask`]).

use std::collections::BTreeMap;

use super::Error;
use super::declare::store_trait;

store_trait! {
    /// A run's tasks (queued, running or waiting to be retried) and their timers: the
    /// scheduling view, which the coordinators' leases and sweeps read and swap.
    ///
    /// Contract, for every implementation:
    /// - Tasks are JSON objects. A task with a string `agent` and an integer `due_ms` has a
    ///   timer in that agent's timer set at `due_ms`; every write of the task (a transition's
    ///   `tasks_set` or `tasks_removed`, a swap) moves or removes its timer in the same atomic
    ///   step.
    /// - Tasks are written by transitions ([`Runs::apply_transition`]) and swapped here; a swap
    ///   never creates a task and never changes the run's version (no engine state changes
    ///   with it).
    ///
    /// [`Runs::apply_transition`]: super::Runs::apply_transition
    pub trait Tasks {
        /// Replaces (or removes) each task only if it holds exactly the expected bytes, each
        /// swap on its own, and says which happened (one `bool` per swap, in order).
        async fn swap_tasks(&self, swaps: Vec<TaskSwap>) -> Result<Vec<bool>, Error>;

        /// Up to `limit` tasks of `agent` whose timers are at or before `now_ms`, earliest
        /// first, reading only those: its cost follows the due work, not the number of runs.
        async fn due_tasks(
            &self,
            agent: &str,
            now_ms: i64,
            limit: usize,
        ) -> Result<Vec<DueTask>, Error>;

        /// One task of the run, as stored now (`None` when there is no such task or run).
        async fn task(&self, run_id: &str, task_key: &str) -> Result<Option<Vec<u8>>, Error>;

        /// Every task of the run, by key, as stored now (empty for an unknown run): where each
        /// step in flight stands, whoever holds it.
        async fn tasks(&self, run_id: &str) -> Result<BTreeMap<String, Vec<u8>>, Error>;
    }
}

/// A compare-and-swap of one task ([`Tasks::swap_tasks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSwap {
    pub run_id: String,
    pub task_key: String,
    /// The bytes the task must hold now.
    pub expected: Vec<u8>,
    /// What it holds after; `None` removes it.
    pub new: Option<Vec<u8>>,
}

/// A task whose timer is due ([`Tasks::due_tasks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueTask {
    pub run_id: String,
    pub task_key: String,
    /// The task as stored.
    pub task: Vec<u8>,
}
