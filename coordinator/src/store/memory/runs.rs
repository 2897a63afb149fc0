//! [`Runs`] in memory: a write checked against the run first, so that a refused one leaves no
//! trace, then applied under the store's lock; the last writes remembered for settles.

use std::collections::{BTreeMap, VecDeque};

use baton_core::RunStatus;

use super::output::Output;
use super::tasks::{Timers, integer, member};
use super::{Entry, MemoryStore};
use crate::store::{
    Error, RunHeader, Runs, Settled, StoredRun, TransitionWrite, WRITE_ID_LEN, WRITES_KEPT,
};

impl Entry {
    /// Raises the version for a write of `write_id` (or a fence, `""`), remembering it.
    fn next_version(&mut self, write_id: &str) {
        self.run.version += 1;
        let remembered = if write_id.len() == WRITE_ID_LEN {
            write_id.to_owned()
        } else {
            NO_WRITE_ID.to_owned()
        };
        self.writes.push_back(remembered);
        while self.writes.len() > WRITES_KEPT {
            self.writes.pop_front();
        }
    }

    /// [`Runs::settle_transition`] on this run.
    fn settle(&mut self, expected_version: u64, write_id: &str) -> Settled {
        let version = self.run.version;
        if version == expected_version {
            self.next_version("");
            return Settled::NotDone;
        }
        match remembered_at(version, self.writes.len(), expected_version + 1) {
            Some(index) if self.writes[index] == write_id => Settled::Done,
            Some(_) => Settled::NotDone,
            None => Settled::Unknown,
        }
    }
}

/// What stands for a write of no id among a run's remembered writes: never a write id (which
/// is hex).
const NO_WRITE_ID: &str = "----------------";

/// Where the write that made version `made` is among the `kept` writes remembered of a run at
/// `version` (the last of them made it): `None` when it is not, older or not yet made.
fn remembered_at(version: u64, kept: usize, made: u64) -> Option<usize> {
    let oldest = version.checked_sub(kept as u64)? + 1;
    if made < oldest || made > version {
        return None;
    }
    usize::try_from(made - oldest).ok()
}

fn attempt_of(bytes: &[u8]) -> Option<String> {
    let task: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    integer(task.get("attempt")?).map(|n| n.to_string())
}

/// Checks a write against the run without changing it, so a refused write leaves no trace.
fn check(run: &StoredRun, write: &TransitionWrite) -> Result<(), Error> {
    for (key, attempt) in &write.fences {
        let current = run.tasks.get(key).and_then(|bytes| attempt_of(bytes));
        if current.as_deref() != Some(attempt.to_string().as_str()) {
            return Err(Error::Fenced {
                run_id: run.header.run_id.clone(),
                task_key: key.clone(),
                attempt: *attempt,
                current: current.unwrap_or_else(|| "none".into()),
            });
        }
    }
    for (key, bytes) in &write.results {
        if let Some(existing) = run.results.get(key)
            && existing[..] != bytes[..]
        {
            return Err(Error::Corrupt(format!(
                "run {} already has a different result for {key}",
                run.header.run_id
            )));
        }
    }
    Ok(())
}

fn apply(entry: &mut Entry, timers: &mut Timers, write: TransitionWrite) {
    for (key, bytes) in write.decisions {
        // First write wins, like HSETNX: a retried write may carry a recomputed embedding.
        entry.decisions.entry(key).or_insert(bytes);
    }
    entry.next_version(&write.write_id);
    let run = &mut entry.run;
    run.links.extend(write.links);
    run.events.extend(write.events);
    run.results.extend(
        write
            .results
            .into_iter()
            .map(|(key, bytes)| (key, bytes.to_vec())),
    );
    run.steps.extend(write.steps);
    for key in &write.tasks_removed {
        run.tasks.remove(key);
        timers.follow(&member(&run.header.run_id, key), None);
    }
    for (key, bytes) in write.tasks_set {
        timers.follow(&member(&run.header.run_id, &key), Some(&bytes));
        run.tasks.insert(key, bytes);
    }
    run.status = write.status;
    run.error = write.error;
    run.state_sha256 = write.state_sha256;
    run.updated_ms = write.updated_ms;
    // A run's live output takes no more pieces once it ends, and expires a little later.
    if run.status != RunStatus::Running && entry.output.ended.is_none() {
        entry.output.ended = Some(std::time::Instant::now());
    }
    // A redriven run runs again, and streams again.
    if run.status == RunStatus::Running {
        entry.output.ended = None;
    }
}

impl Runs for MemoryStore {
    async fn create_run(&self, header: RunHeader, first: TransitionWrite) -> Result<(), Error> {
        let mut runs = self.runs.lock().expect("store lock");
        if runs.contains_key(&header.run_id) {
            return Err(Error::AlreadyExists(header.run_id));
        }
        if self
            .voided
            .lock()
            .expect("voided lock")
            .contains(&header.run_id)
        {
            return Err(Error::Voided(header.run_id));
        }
        let run = StoredRun {
            version: 0,
            status: RunStatus::Running,
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
            output: Output::default(),
            writes: VecDeque::new(),
        };
        apply(
            &mut entry,
            &mut self.timers.lock().expect("timers lock"),
            first,
        );
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
        apply(entry, &mut self.timers.lock().expect("timers lock"), write);
        Ok(entry.run.version)
    }

    async fn settle_create(&self, header: &RunHeader) -> Result<Settled, Error> {
        let runs = self.runs.lock().expect("store lock");
        if runs.contains_key(&header.run_id) {
            return Ok(Settled::Done);
        }
        self.voided
            .lock()
            .expect("voided lock")
            .insert(header.run_id.clone());
        Ok(Settled::NotDone)
    }

    async fn settle_transition(
        &self,
        run_id: &str,
        expected_version: u64,
        write_id: &str,
    ) -> Result<Settled, Error> {
        let mut runs = self.runs.lock().expect("store lock");
        Ok(match runs.get_mut(run_id) {
            Some(entry) => entry.settle(expected_version, write_id),
            None => Settled::NotDone,
        })
    }

    async fn load_run(&self, run_id: &str) -> Result<Option<StoredRun>, Error> {
        Ok(self
            .runs
            .lock()
            .expect("store lock")
            .get(run_id)
            .map(|entry| entry.run.clone()))
    }

    async fn version(&self, run_id: &str) -> Result<Option<u64>, Error> {
        let runs = self.runs.lock().expect("store lock");
        Ok(runs.get(run_id).map(|entry| entry.run.version))
    }

    async fn add_principal_run(&self, principal: &str, run_id: &str) -> Result<(), Error> {
        self.principal_runs
            .lock()
            .expect("principals lock")
            .entry(principal.to_owned())
            .or_default()
            .insert(run_id.to_owned());
        Ok(())
    }

    async fn running_runs_of(&self, principal: &str) -> Result<usize, Error> {
        let runs = self.runs.lock().expect("store lock");
        let mut principal_runs = self.principal_runs.lock().expect("principals lock");
        let Some(ids) = principal_runs.get_mut(principal) else {
            return Ok(0);
        };
        ids.retain(|id| {
            runs.get(id)
                .is_some_and(|entry| entry.run.status == RunStatus::Running)
        });
        Ok(ids.len())
    }
}
