//! The runs this coordinator holds in memory: a cache of the store, rebuilt from it by replay
//! and checked against the run's state chain as it is read.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use baton_core::{Event, Run, RunStatus};
use tokio::sync::Mutex as AsyncMutex;

use crate::clock::Instant;

use super::{Coordinator, Error};
use crate::chain::{self, Mismatch};
use crate::model::{StepState, TaskEntry};
use crate::parts::PartEncoder;
use crate::store::{RunHeader, Runs, Store, StoredRun, TransitionWrite};
use crate::workflows::Workflows;

/// A run's place in the cache: locked for each change, `None` until loaded (or after a version
/// conflict emptied it, to be loaded again).
pub(super) type Slot = Arc<AsyncMutex<Option<Loaded>>>;

/// A slot's lock, held.
pub(super) type LoadedGuard = tokio::sync::OwnedMutexGuard<Option<Loaded>>;

#[derive(Default)]
pub(super) struct RunCache {
    slots: Mutex<HashMap<String, Cached>>,
    /// What has been counted: `<run id> <problem>`, so that reading the same broken run again
    /// (a finished run is read back for every GetRun) does not count it again.
    reported: Mutex<HashSet<String>>,
}

/// A run's slot and when it was last asked for.
struct Cached {
    slot: Slot,
    touched: Instant,
}

impl Cached {
    fn new(slot: Slot) -> Self {
        Cached {
            slot,
            touched: Instant::now(),
        }
    }
}

impl RunCache {
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Cached>> {
        self.slots.lock().expect("runs lock")
    }

    /// The run's slot if it is in memory; never loads it.
    pub fn cached(&self, run_id: &str) -> Option<Slot> {
        self.slots().get_mut(run_id).map(|cached| {
            cached.touched = Instant::now();
            cached.slot.clone()
        })
    }

    /// The run's slot, an empty one if it is not in memory yet.
    fn entry(&self, run_id: &str) -> Slot {
        let mut slots = self.slots();
        let cached = slots
            .entry(run_id.to_owned())
            .or_insert_with(|| Cached::new(Arc::new(AsyncMutex::new(None))));
        cached.touched = Instant::now();
        cached.slot.clone()
    }

    pub fn insert(&self, run_id: &str, slot: Slot) {
        self.slots().insert(run_id.to_owned(), Cached::new(slot));
    }

    /// How many runs are in memory (loaded, or being loaded).
    pub fn len(&self) -> usize {
        self.slots().len()
    }

    /// The runs nobody has asked for since `before`.
    fn untouched_since(&self, before: Instant) -> Vec<(String, Slot)> {
        self.slots()
            .iter()
            .filter(|(_, cached)| cached.touched < before)
            .map(|(run_id, cached)| (run_id.clone(), cached.slot.clone()))
            .collect()
    }

    /// Forgets a run's in-memory copy: it is read back from the store if asked for, so a
    /// long-lived coordinator's memory follows its running runs, not every run it has seen.
    pub fn evict(&self, run_id: &str) {
        self.slots().remove(run_id);
    }

    /// Whether `slot` is the cache's for the run.
    fn holds(&self, run_id: &str, slot: &Slot) -> bool {
        self.slots()
            .get(run_id)
            .is_some_and(|held| Arc::ptr_eq(&held.slot, slot))
    }

    /// [`RunCache::evict`], only if the cache still holds `slot` for the run (not a newer one
    /// that others may be using).
    pub fn evict_slot(&self, run_id: &str, slot: &Slot) {
        let mut slots = self.slots();
        if slots
            .get(run_id)
            .is_some_and(|held| Arc::ptr_eq(&held.slot, slot))
        {
            slots.remove(run_id);
        }
    }

    /// [`RunCache::evict_slot`], only if nobody has asked for the run since `before`; whether
    /// it was evicted.
    fn evict_untouched(&self, run_id: &str, slot: &Slot, before: Instant) -> bool {
        let mut slots = self.slots();
        let untouched = slots
            .get(run_id)
            .is_some_and(|held| Arc::ptr_eq(&held.slot, slot) && held.touched < before);
        if untouched {
            slots.remove(run_id);
        }
        untouched
    }

    /// Whether this is the first time this coordinator sees `mismatch` in `run_id`.
    fn first_report(&self, run_id: &str, mismatch: &Mismatch) -> bool {
        self.reported
            .lock()
            .expect("reported lock")
            .insert(format!("{run_id} {mismatch}"))
    }
}

/// When a settled step visit started, as its span needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SettledTiming {
    pub started_ms: i64,
    /// The visit of the parallel step a branch belongs to.
    pub parallel_visit: Option<u32>,
}

/// How long a read waits for a run whose transition is under way here before it reads the
/// store's copy instead.
const READ_PATIENCE: std::time::Duration = std::time::Duration::from_millis(100);

/// A run as the coordinator holds it between transitions.
pub(super) struct Loaded {
    pub header: RunHeader,
    pub run: Run,
    pub version: u64,
    pub steps: BTreeMap<String, StepState>,
    pub tasks: BTreeMap<String, TaskEntry>,
    pub updated_ms: i64,
    /// The head of the run's state chain.
    pub state_sha256: String,
    /// For a finished run whose stored data no longer matches its chain: the status the store
    /// records, which the record keeps (with the integrity error) since nothing stored changes.
    pub finished_as: Option<RunStatus>,
    /// The encoded parts of this run's payloads.
    pub parts: PartEncoder,
    /// For each step visit the last transition settled, in history order: when it started and,
    /// for a branch, its parallel step's visit (for its span).
    pub settled: Vec<SettledTiming>,
    /// The CPU time the run's jq programs have used, against its budget.
    pub jq_cpu: std::time::Duration,
}

impl Loaded {
    /// A run about to be stored for the first time, at version 0.
    pub fn new(header: RunHeader, run: Run, now_ms: i64, state_sha256: String) -> Self {
        Loaded {
            header,
            run,
            version: 0,
            steps: BTreeMap::new(),
            tasks: BTreeMap::new(),
            updated_ms: now_ms,
            state_sha256,
            finished_as: None,
            parts: PartEncoder::default(),
            settled: Vec::new(),
            jq_cpu: std::time::Duration::ZERO,
        }
    }
}

impl<S: Store> Coordinator<S> {
    /// The run's slot, locked, with the run loaded from the store the first time; a finished
    /// run is not kept in memory. Loading a run sends nothing: its tasks have leases, and a task
    /// whose holder is gone is delivered again when its timer comes due ([`super::leases`]).
    /// A slot is only ever loaded while it is the cache's: one evicted while this waited for
    /// its lock is left, and the cache's taken instead, so that no change goes on in a copy
    /// other callers no longer find (a task it dispatched would be answered to another copy,
    /// from before that dispatch).
    pub(super) async fn locked(&self, run_id: &str) -> Result<(Slot, LoadedGuard), Error> {
        let runs = &self.inner.runs;
        loop {
            let slot = runs.entry(run_id);
            let mut guard = slot.clone().lock_owned().await;
            if guard.is_some() {
                return Ok((slot, guard));
            }
            if !runs.holds(run_id, &slot) {
                continue;
            }
            let stored = match self.inner.store.load_run(run_id).await {
                Ok(Some(stored)) => stored,
                Ok(None) => {
                    runs.evict_slot(run_id, &slot);
                    return Err(Error::RunNotFound(run_id.to_owned()));
                }
                Err(error) => return Err(error.into()),
            };
            let loaded = self.rebuild(stored).await?;
            if loaded.run.status().is_terminal() {
                runs.evict_slot(run_id, &slot);
            }
            *guard = Some(loaded);
            return Ok((slot, guard));
        }
    }

    /// The run locked, reloaded first if the store has moved on from this coordinator's copy
    /// (another coordinator's transition). A copy ahead of the version read is fresh: a
    /// transition of this coordinator's went through it after the read.
    pub(super) async fn fresh(&self, run_id: &str) -> Result<LoadedGuard, Error> {
        loop {
            let (slot, mut guard) = self.locked(run_id).await?;
            let loaded = guard.as_ref().expect("locked loads the run");
            if loaded.finished_as.is_some() {
                return Ok(guard);
            }
            let copy = loaded.version;
            drop(guard);
            let stored = self.inner.store.version(run_id).await?;
            guard = slot.clone().lock_owned().await;
            match guard.as_ref() {
                Some(loaded) if stored.is_some_and(|stored| loaded.version >= stored) => {
                    return Ok(guard);
                }
                // Behind the store, and still the copy that was found behind: dropped (under
                // the lock, and only if the cache still holds this slot), then loaded anew.
                Some(loaded) if loaded.version == copy => {
                    *guard = None;
                    self.inner.runs.evict_slot(run_id, &slot);
                }
                // Changed or emptied meanwhile: look again.
                _ => {}
            }
        }
    }

    /// Drops from memory the runs nobody has asked for in `config.run_idle_ms`, so that this
    /// coordinator's memory follows the runs it works on, not every run it has read. A slot in
    /// use is left; one dropped is loaded again (replayed from the store, as after a restart)
    /// by whoever asks for it next. Emptied under its lock and only while it is the cache's,
    /// as [`Coordinator::fresh`] does, so no change goes on in a copy others no longer find.
    pub(super) fn forget_idle_runs(&self) {
        let idle = std::time::Duration::from_millis(self.inner.config.run_idle_ms);
        let Some(before) = Instant::now().checked_sub(idle) else {
            return;
        };
        let runs = &self.inner.runs;
        for (run_id, slot) in runs.untouched_since(before) {
            let Ok(mut guard) = slot.clone().try_lock_owned() else {
                continue;
            };
            // Asked for since it was listed: it stays.
            if runs.evict_untouched(&run_id, &slot, before) {
                *guard = None;
            }
        }
    }

    /// How many runs this coordinator holds in memory.
    pub fn runs_in_memory(&self) -> usize {
        self.inner.runs.len()
    }

    /// Reads the run as the store has it now (reloaded if another coordinator moved it on),
    /// holding its lock while `read` runs. A run whose transition is under way here may hold
    /// its lock for as long as a jq program runs (or a store write waits): past
    /// [`READ_PATIENCE`] the read is of the store's copy instead, read back apart (which runs
    /// none of the run's programs), so that a computing run is as readable as any other and a
    /// cancel's look at the run never waits for its program.
    pub(super) async fn read_fresh<T>(
        &self,
        run_id: &str,
        read: impl FnOnce(&Loaded) -> T,
    ) -> Result<T, Error> {
        if let Ok(guard) = tokio::time::timeout(READ_PATIENCE, self.fresh(run_id)).await {
            return Ok(read(guard?.as_ref().expect("fresh loads the run")));
        }
        let stored = self.stored_run(run_id).await?;
        Ok(read(&self.rebuild(stored).await?))
    }

    /// The run as the store holds it now, not as this coordinator's memory does.
    pub(super) async fn stored_run(&self, run_id: &str) -> Result<StoredRun, Error> {
        self.inner
            .store
            .load_run(run_id)
            .await?
            .ok_or_else(|| Error::RunNotFound(run_id.to_owned()))
    }

    /// The run's workflow, loading the run if needed.
    pub(super) async fn workflow_of(
        &self,
        run_id: &str,
    ) -> Result<Arc<baton_core::Workflow>, Error> {
        let (_, guard) = self.locked(run_id).await?;
        let loaded = guard.as_ref().expect("locked loads the run");
        Ok(loaded.run.workflow().clone())
    }

    /// Rebuilds a run read from the store. Stored data that does not match the state chain is
    /// logged and counted; if the replay depended on it, the run stops there with an integrity
    /// error naming the step (and a running run is marked failed in the store, nothing else
    /// changed), so nothing is ever built on data that cannot be trusted.
    async fn rebuild(&self, stored: StoredRun) -> Result<Loaded, Error> {
        let run_id = stored.header.run_id.clone();
        let stored_status = stored.status;
        let (mut loaded, checked) = rebuild(stored, &self.inner.workflows)?;
        for repaired in &checked.repaired {
            if self.count_integrity_failure(&run_id, repaired) {
                tracing::error!(%run_id, problem = %repaired, "stored copy does not match the state chain; the replay recomputed it");
            }
        }
        let Some(mismatch) = checked.mismatch else {
            return Ok(loaded);
        };
        if self.count_integrity_failure(&run_id, &mismatch) {
            tracing::error!(%run_id, problem = %mismatch, "stored run does not match its state chain; stopping it");
        }
        self.halt(&mut loaded, &mismatch, stored_status).await?;
        Ok(loaded)
    }

    /// Counts a mismatch the first time this coordinator sees it; says whether it was new.
    fn count_integrity_failure(&self, run_id: &str, mismatch: &Mismatch) -> bool {
        let new = self.inner.runs.first_report(run_id, mismatch);
        if new {
            self.inner.metrics.integrity_failures.inc();
        }
        new
    }

    /// Stops a run whose stored data cannot be trusted: a running run is written as failed
    /// with the integrity error and its tasks dropped; a finished one keeps its stored status.
    async fn halt(
        &self,
        loaded: &mut Loaded,
        mismatch: &Mismatch,
        stored_status: RunStatus,
    ) -> Result<(), Error> {
        let error = mismatch.to_string();
        let halted = loaded
            .run
            .apply(Event::Halt {
                error: error.clone(),
            })
            .map(|t| t.run)
            .unwrap_or_else(|_| loaded.run.clone());
        loaded.run = halted;
        if stored_status != RunStatus::Running {
            loaded.finished_as = Some(stored_status);
            return Ok(());
        }
        let write = TransitionWrite {
            tasks_removed: loaded.tasks.keys().cloned().collect(),
            status: RunStatus::Failed,
            error: Some(error),
            state_sha256: loaded.state_sha256.clone(),
            updated_ms: self.now_ms(),
            ..TransitionWrite::default()
        };
        let updated_ms = write.updated_ms;
        loaded.version = self
            .inner
            .store
            .apply_transition(&loaded.header.run_id, loaded.version, write)
            .await?;
        loaded.tasks.clear();
        loaded.updated_ms = updated_ms;
        Ok(())
    }
}

/// The run as the store holds it, checked against its state chain ([`chain`]).
fn rebuild(stored: StoredRun, workflows: &Workflows) -> Result<(Loaded, chain::Checked), Error> {
    let run_id = stored.header.run_id.clone();
    let corrupt = |reason: String| Error::Corrupt {
        run_id: run_id.clone(),
        reason,
    };
    let checked = chain::replay_checked(&stored, workflows).map_err(|e| corrupt(e.0))?;
    let steps = decode(&stored.steps).map_err(|e| corrupt(format!("step state: {e}")))?;
    let tasks = decode(&stored.tasks).map_err(|e| corrupt(format!("task: {e}")))?;
    let loaded = Loaded {
        version: stored.version,
        steps,
        tasks,
        jq_cpu: checked.jq_cpu,
        ..Loaded::new(
            stored.header,
            checked.run.clone(),
            stored.updated_ms,
            stored.state_sha256,
        )
    };
    Ok((loaded, checked))
}

/// Each stored JSON document of a map, read.
fn decode<T: serde::de::DeserializeOwned>(
    stored: &BTreeMap<String, Vec<u8>>,
) -> Result<BTreeMap<String, T>, serde_json::Error> {
    stored
        .iter()
        .map(|(key, bytes)| Ok((key.clone(), serde_json::from_slice(bytes)?)))
        .collect()
}
