//! The in-memory store: the embedded default for `baton dev` and for fast tests.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use baton_core::RunStatus;
use tokio::sync::Notify;

use super::query::PageFill;
use super::{
    Claim, DueTask, Error, OUTPUT_KEPT_AFTER_END, OUTPUT_MAX_BYTES, OutputOffset, OutputPiece,
    RunCursor, RunHeader, RunPage, RunQuery, RunSummary, Settled, Store, StoredRun, TaskSwap,
    TransitionWrite, WRITE_ID_LEN, WRITES_KEPT, sum_slots,
};

/// Runs in a map behind one lock. Every call holds the lock for its whole write, which is what
/// makes a transition atomic here.
#[derive(Debug, Default)]
pub struct MemoryStore {
    runs: Mutex<BTreeMap<String, Entry>>,
    /// Run ids whose create was settled as never done; only changed while `runs` is locked, so
    /// that a settle and a create of the same id are one before the other.
    voided: Mutex<BTreeSet<String>>,
    /// Only changed while `runs` is locked, so tasks and their timers change together.
    timers: Mutex<Timers>,
    /// Idempotency key -> (run id, request digest, expiry).
    keys: Mutex<BTreeMap<String, (String, String, std::time::Instant)>>,
    /// Wakes `wait_output` callers when output is appended.
    output_added: Notify,
    /// Principal -> the runs it submitted that were running when last looked at.
    principal_runs: Mutex<HashMap<String, BTreeSet<String>>>,
    /// Coordinator -> what it advertised.
    slots: Mutex<HashMap<String, Advertisement>>,
}

/// Free slots per agent a coordinator advertised, and until when.
#[derive(Debug)]
struct Advertisement {
    expires_ms: i64,
    free: BTreeMap<String, usize>,
}

#[derive(Debug)]
struct Entry {
    run: StoredRun,
    decisions: BTreeMap<String, Vec<u8>>,
    output: Output,
    /// The `write_id`s of the writes that made the last versions, oldest first, one per version
    /// (a placeholder for a write with none, or a fence), at most [`WRITES_KEPT`].
    writes: VecDeque<String>,
}

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

    /// [`Store::settle_transition`] on this run.
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

/// A run's live output: its pieces, their text's size, and the next offset.
#[derive(Debug, Default)]
struct Output {
    pieces: VecDeque<(OutputOffset, OutputPiece)>,
    bytes: usize,
    next: u64,
    /// When the run ended: the output is gone [`OUTPUT_KEPT_AFTER_END`] later.
    ended: Option<std::time::Instant>,
}

impl Output {
    fn push(&mut self, piece: OutputPiece) {
        self.next += 1;
        self.bytes += piece.text.len();
        let offset = OutputOffset {
            ms: 0,
            seq: self.next,
        };
        self.pieces.push_back((offset, piece));
        while self.bytes > OUTPUT_MAX_BYTES
            && let Some((_, oldest)) = self.pieces.pop_front()
        {
            self.bytes -= oldest.text.len();
        }
    }

    fn after(
        &self,
        after: Option<OutputOffset>,
    ) -> impl Iterator<Item = &(OutputOffset, OutputPiece)> {
        let expired = self
            .ended
            .is_some_and(|ended| ended.elapsed() >= OUTPUT_KEPT_AFTER_END);
        self.pieces
            .iter()
            .filter(move |(offset, _)| !expired && after.is_none_or(|after| *offset > after))
    }
}

impl MemoryStore {
    /// Claims `key` for `run_id` unless a live claim holds it, which `taken_over` may give up
    /// (by its run id and request digest): a reclaim of a voided run's key.
    fn claim_key(
        &self,
        key: &str,
        run_id: &str,
        request_sha256: &str,
        ttl_s: u64,
        taken_over: impl Fn(&str, &str) -> bool,
    ) -> Claim {
        let mut keys = self.keys.lock().expect("keys lock");
        let now = std::time::Instant::now();
        if let Some((held, digest, expires)) = keys.get(key)
            && *expires > now
            && !taken_over(held, digest)
        {
            return Claim::Held {
                run_id: held.clone(),
                request_sha256: digest.clone(),
            };
        }
        keys.insert(
            key.to_owned(),
            (
                run_id.to_owned(),
                request_sha256.to_owned(),
                now + std::time::Duration::from_secs(ttl_s),
            ),
        );
        Claim::Claimed
    }
    pub fn new() -> Self {
        Self::default()
    }
}

/// Each agent's timers, ordered by due time, and where each task's timer is.
#[derive(Debug, Default)]
struct Timers {
    by_agent: HashMap<String, BTreeSet<(i64, String)>>,
    of_task: HashMap<String, (String, i64)>,
}

impl Timers {
    /// Puts the timer of `member` where `bytes` (the task about to be stored, or none) says.
    fn follow(&mut self, member: &str, bytes: Option<&[u8]>) {
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
fn integer(value: &serde_json::Value) -> Option<i64> {
    value.as_i64().or_else(|| {
        value
            .as_f64()
            .filter(|f| f.fract() == 0.0 && f.abs() < 2f64.powi(63))
            .map(|f| f as i64)
    })
}

fn attempt_of(bytes: &[u8]) -> Option<String> {
    let task: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    integer(task.get("attempt")?).map(|n| n.to_string())
}

fn summary(run: &StoredRun) -> RunSummary {
    RunSummary {
        run_id: run.header.run_id.clone(),
        workflow_id: run.header.workflow_id.clone(),
        status: run.status.clone(),
        created_ms: run.header.created_ms,
        updated_ms: run.updated_ms,
    }
}

fn member(run_id: &str, task_key: &str) -> String {
    format!("{run_id}/{task_key}")
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
    if run.status != RunStatus::Running.as_str() && entry.output.ended.is_none() {
        entry.output.ended = Some(std::time::Instant::now());
    }
    // A redriven run runs again, and streams again.
    if run.status == RunStatus::Running.as_str() {
        entry.output.ended = None;
    }
}

impl Store for MemoryStore {
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
                .is_some_and(|entry| entry.run.status == RunStatus::Running.as_str())
        });
        Ok(ids.len())
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

    async fn version(&self, run_id: &str) -> Result<Option<u64>, Error> {
        let runs = self.runs.lock().expect("store lock");
        Ok(runs.get(run_id).map(|entry| entry.run.version))
    }

    /// Walks the runs as the Redis store walks its indexes, so that both cut pages alike: the
    /// runs of the workflow (or all), the running ones alone for `running` (the active index,
    /// exact here), and with another status a walk bounded by the scan budget.
    async fn list_runs(&self, query: RunQuery) -> Result<RunPage, Error> {
        let runs = self.runs.lock().expect("store lock");
        let running_only = query.status == Some(RunStatus::Running);
        let mut index: Vec<(RunCursor, &StoredRun)> = runs
            .values()
            .map(|entry| &entry.run)
            .filter(|run| {
                query
                    .workflow_id
                    .as_ref()
                    .is_none_or(|workflow_id| &run.header.workflow_id == workflow_id)
            })
            .filter(|run| !running_only || run.status == RunStatus::Running.as_str())
            .map(|run| {
                let position = RunCursor {
                    created_ms: run.header.created_ms,
                    run_id: run.header.run_id.clone(),
                };
                (position, run)
            })
            .filter(|(position, _)| position.is_after(query.after.as_ref()))
            .collect();
        index.sort_by(|(a, _), (b, _)| b.cmp(a));
        let mut fill = PageFill::new(&query, !running_only);
        let mut entries = index.into_iter().peekable();
        while fill.wants_more()
            && let Some((position, run)) = entries.next()
        {
            fill.offer(position, Some(summary(run)));
        }
        Ok(fill.finish(entries.peek().is_some()))
    }

    async fn ping(&self) -> Result<(), Error> {
        Ok(())
    }

    async fn advertise_slots(
        &self,
        coordinator: &str,
        free: BTreeMap<String, usize>,
        expires_ms: i64,
    ) -> Result<(), Error> {
        self.slots
            .lock()
            .expect("store lock")
            .insert(coordinator.to_owned(), Advertisement { expires_ms, free });
        Ok(())
    }

    async fn slots_elsewhere(
        &self,
        me: &str,
        now_ms: i64,
    ) -> Result<BTreeMap<String, usize>, Error> {
        let mut slots = self.slots.lock().expect("store lock");
        slots.retain(|_, advertised| advertised.expires_ms > now_ms);
        Ok(sum_slots(
            slots
                .iter()
                .filter(|(coordinator, _)| coordinator.as_str() != me)
                .map(|(_, advertised)| &advertised.free),
        ))
    }

    async fn active_runs(&self) -> Result<Vec<String>, Error> {
        let runs = self.runs.lock().expect("store lock");
        Ok(runs
            .values()
            .filter(|entry| entry.run.status == RunStatus::Running.as_str())
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
        Ok(self.claim_key(key, run_id, request_sha256, ttl_s, |_, _| false))
    }

    async fn reclaim_idempotency_key(
        &self,
        key: &str,
        voided_run_id: &str,
        run_id: &str,
        request_sha256: &str,
        ttl_s: u64,
    ) -> Result<Claim, Error> {
        Ok(
            self.claim_key(key, run_id, request_sha256, ttl_s, |held, digest| {
                held == voided_run_id && digest == request_sha256
            }),
        )
    }

    async fn append_output(&self, pieces: Vec<(String, OutputPiece)>) -> Result<(), Error> {
        let mut runs = self.runs.lock().expect("store lock");
        // Expired output is hidden as soon as it expires, and freed here.
        for entry in runs.values_mut() {
            if entry
                .output
                .ended
                .is_some_and(|ended| ended.elapsed() >= OUTPUT_KEPT_AFTER_END)
                && !entry.output.pieces.is_empty()
            {
                entry.output.pieces.clear();
                entry.output.bytes = 0;
            }
        }
        for (run_id, piece) in pieces {
            if let Some(entry) = runs.get_mut(&run_id)
                && entry.run.status == RunStatus::Running.as_str()
            {
                entry.output.push(piece);
            }
        }
        drop(runs);
        self.output_added.notify_waiters();
        Ok(())
    }

    async fn read_output(
        &self,
        run_id: &str,
        after: Option<OutputOffset>,
    ) -> Result<Vec<(OutputOffset, OutputPiece)>, Error> {
        let runs = self.runs.lock().expect("store lock");
        Ok(runs
            .get(run_id)
            .map(|entry| entry.output.after(after).cloned().collect())
            .unwrap_or_default())
    }

    async fn wait_output(
        &self,
        after: Vec<(String, OutputOffset)>,
        block: Duration,
    ) -> Result<Vec<(String, OutputOffset, OutputPiece)>, Error> {
        let deadline = tokio::time::Instant::now() + block;
        loop {
            // Registered before looking, so that output appended in between still wakes it.
            let added = self.output_added.notified();
            tokio::pin!(added);
            added.as_mut().enable();
            let found: Vec<(String, OutputOffset, OutputPiece)> = {
                let runs = self.runs.lock().expect("store lock");
                after
                    .iter()
                    .filter_map(|(run_id, offset)| Some((run_id, runs.get(run_id)?, offset)))
                    .flat_map(|(run_id, entry, offset)| {
                        entry
                            .output
                            .after(Some(*offset))
                            .map(|(offset, piece)| (run_id.clone(), *offset, piece.clone()))
                    })
                    .collect()
            };
            if !found.is_empty() {
                return Ok(found);
            }
            if tokio::time::timeout_at(deadline, added).await.is_err() {
                return Ok(Vec::new());
            }
        }
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
