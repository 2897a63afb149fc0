//! The in-memory store: the embedded default for `baton dev` and for fast tests.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::{Error, RunHeader, RunSummary, Store, StoredRun, TransitionWrite};

/// Runs in a map behind one lock. Every call holds the lock for its whole write, which is what
/// makes a transition atomic here.
#[derive(Debug, Default)]
pub struct MemoryStore {
    runs: Mutex<BTreeMap<String, StoredRun>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }
}

/// Checks a write against the run without changing it, so a refused write leaves no trace.
fn check(run: &StoredRun, write: &TransitionWrite) -> Result<(), Error> {
    for (key, bytes) in &write.results {
        if let Some(existing) = run.results.get(key)
            && existing != bytes
        {
            return Err(Error::Corrupt(format!(
                "run {} already has a different result for {key}",
                run.header.run_id
            )));
        }
    }
    Ok(())
}

fn apply(run: &mut StoredRun, write: TransitionWrite) {
    run.version += 1;
    if let Some(event) = write.event {
        run.events.push(event);
    }
    run.results.extend(write.results);
    run.steps.extend(write.steps);
    for key in &write.tasks_removed {
        run.tasks.remove(key);
    }
    run.tasks.extend(write.tasks_set);
    run.status = write.status;
    run.error = write.error;
    run.state_sha256 = write.state_sha256;
    run.updated_ms = write.updated_ms;
}

impl Store for MemoryStore {
    async fn create_run(&self, header: RunHeader, first: TransitionWrite) -> Result<(), Error> {
        let mut runs = self.runs.lock().expect("store lock");
        if runs.contains_key(&header.run_id) {
            return Err(Error::AlreadyExists(header.run_id));
        }
        let mut run = StoredRun {
            version: 0,
            status: String::new(),
            error: None,
            state_sha256: String::new(),
            updated_ms: header.created_ms,
            events: Vec::new(),
            results: Default::default(),
            steps: Default::default(),
            tasks: Default::default(),
            header,
        };
        check(&run, &first)?;
        apply(&mut run, first);
        runs.insert(run.header.run_id.clone(), run);
        Ok(())
    }

    async fn apply_transition(
        &self,
        run_id: &str,
        expected_version: u64,
        write: TransitionWrite,
    ) -> Result<u64, Error> {
        let mut runs = self.runs.lock().expect("store lock");
        let run = runs
            .get_mut(run_id)
            .ok_or_else(|| Error::NotFound(run_id.to_owned()))?;
        if run.version != expected_version {
            return Err(Error::Conflict {
                run_id: run_id.to_owned(),
                expected: expected_version,
                actual: run.version,
            });
        }
        check(run, &write)?;
        apply(run, write);
        Ok(run.version)
    }

    async fn load_run(&self, run_id: &str) -> Result<Option<StoredRun>, Error> {
        Ok(self.runs.lock().expect("store lock").get(run_id).cloned())
    }

    async fn set_task(&self, run_id: &str, task_key: &str, task: Vec<u8>) -> Result<bool, Error> {
        let mut runs = self.runs.lock().expect("store lock");
        let Some(run) = runs.get_mut(run_id) else {
            return Ok(false);
        };
        match run.tasks.get_mut(task_key) {
            Some(existing) => {
                *existing = task;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    async fn list_runs(&self, limit: usize) -> Result<Vec<RunSummary>, Error> {
        let runs = self.runs.lock().expect("store lock");
        let mut summaries: Vec<RunSummary> = runs
            .values()
            .map(|run| RunSummary {
                run_id: run.header.run_id.clone(),
                workflow_id: run.header.workflow_id.clone(),
                status: run.status.clone(),
                created_ms: run.header.created_ms,
                updated_ms: run.updated_ms,
            })
            .collect();
        summaries.sort_by(|a, b| (b.created_ms, &b.run_id).cmp(&(a.created_ms, &a.run_id)));
        summaries.truncate(limit);
        Ok(summaries)
    }

    async fn active_runs(&self) -> Result<Vec<String>, Error> {
        let runs = self.runs.lock().expect("store lock");
        Ok(runs
            .values()
            .filter(|run| run.status == "running")
            .map(|run| run.header.run_id.clone())
            .collect())
    }
}
