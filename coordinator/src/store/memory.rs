//! The in-memory store: the embedded default for `baton dev` and for fast tests.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::{Claim, Error, RunHeader, RunSummary, Store, StoredRun, TransitionWrite};

/// Runs in a map behind one lock. Every call holds the lock for its whole write, which is what
/// makes a transition atomic here.
#[derive(Debug, Default)]
pub struct MemoryStore {
    runs: Mutex<BTreeMap<String, Entry>>,
    /// Idempotency key -> (run id, request digest, expiry).
    keys: Mutex<BTreeMap<String, (String, String, std::time::Instant)>>,
}

#[derive(Debug)]
struct Entry {
    run: StoredRun,
    decisions: BTreeMap<String, Vec<u8>>,
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

fn apply(entry: &mut Entry, write: TransitionWrite) {
    for (key, bytes) in write.decisions {
        // First write wins, like HSETNX: a retried write may carry a recomputed embedding.
        entry.decisions.entry(key).or_insert(bytes);
    }
    let run = &mut entry.run;
    run.version += 1;
    run.links.extend(write.links);
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
        let run = StoredRun {
            version: 0,
            status: String::new(),
            error: None,
            state_sha256: String::new(),
            updated_ms: header.created_ms,
            events: Vec::new(),
            results: Default::default(),
            steps: Default::default(),
            tasks: Default::default(),
            links: Vec::new(),
            header,
        };
        check(&run, &first)?;
        let mut entry = Entry {
            run,
            decisions: BTreeMap::new(),
        };
        apply(&mut entry, first);
        runs.insert(entry.run.header.run_id.clone(), entry);
        Ok(())
    }

    async fn apply_transition(
        &self,
        run_id: &str,
        expected_version: u64,
        write: TransitionWrite,
    ) -> Result<u64, Error> {
        let mut runs = self.runs.lock().expect("store lock");
        let entry = runs
            .get_mut(run_id)
            .ok_or_else(|| Error::NotFound(run_id.to_owned()))?;
        if entry.run.version != expected_version {
            return Err(Error::Conflict {
                run_id: run_id.to_owned(),
                expected: expected_version,
                actual: entry.run.version,
            });
        }
        check(&entry.run, &write)?;
        apply(entry, write);
        Ok(entry.run.version)
    }

    async fn load_run(&self, run_id: &str) -> Result<Option<StoredRun>, Error> {
        Ok(self
            .runs
            .lock()
            .expect("store lock")
            .get(run_id)
            .map(|entry| entry.run.clone()))
    }

    async fn set_task(&self, run_id: &str, task_key: &str, task: Vec<u8>) -> Result<bool, Error> {
        let mut runs = self.runs.lock().expect("store lock");
        let Some(entry) = runs.get_mut(run_id) else {
            return Ok(false);
        };
        match entry.run.tasks.get_mut(task_key) {
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
            .map(|entry| &entry.run)
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
            .filter(|entry| entry.run.status == "running")
            .map(|entry| entry.run.header.run_id.clone())
            .collect())
    }

    async fn decisions(&self, run_id: &str) -> Result<BTreeMap<String, Vec<u8>>, Error> {
        let runs = self.runs.lock().expect("store lock");
        Ok(runs
            .get(run_id)
            .map(|entry| entry.decisions.clone())
            .unwrap_or_default())
    }

    async fn claim_idempotency_key(
        &self,
        key: &str,
        run_id: &str,
        request_sha256: &str,
        ttl_s: u64,
    ) -> Result<Claim, Error> {
        let mut keys = self.keys.lock().expect("keys lock");
        let now = std::time::Instant::now();
        if let Some((held, digest, expires)) = keys.get(key)
            && *expires > now
        {
            return Ok(Claim::Held {
                run_id: held.clone(),
                request_sha256: digest.clone(),
            });
        }
        keys.insert(
            key.to_owned(),
            (
                run_id.to_owned(),
                request_sha256.to_owned(),
                now + std::time::Duration::from_secs(ttl_s),
            ),
        );
        Ok(Claim::Claimed)
    }

    async fn runs_of_workflow(
        &self,
        workflow_id: &str,
        limit: usize,
    ) -> Result<Vec<String>, Error> {
        let runs = self.runs.lock().expect("store lock");
        let mut matching: Vec<(i64, &String)> = runs
            .values()
            .filter(|entry| entry.run.header.workflow_id == workflow_id)
            .map(|entry| (entry.run.header.created_ms, &entry.run.header.run_id))
            .collect();
        matching.sort_by(|a, b| b.cmp(a));
        Ok(matching
            .into_iter()
            .take(limit)
            .map(|(_, id)| id.clone())
            .collect())
    }
}
