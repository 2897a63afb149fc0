//! Reading a run back from the store, checked against its state chain.
//!
//! Every settled step visit added a link `state_n = sha256(state_{n-1} || step_id || visit ||
//! result_sha256)` in the transition that settled it ([`baton_core::integrity`]). Loading a run
//! replays its events, and each visit the replay settles must give the link the store holds: an
//! agent's result read back from Redis is hashed again (in canonical form) before anything is
//! built on it. The first visit that does not match is named, and the run is rebuilt only up to
//! the event before it, so nothing is built on data that cannot be trusted.
//!
//! A `jq:` program's outcome is read back too (the log records each one with the event whose
//! transition ran it, its output stored under its site): a replay never runs a program again,
//! so reading a run costs none of its CPU budget and cannot end differently near it. A
//! path transform's result is stored as well, but a replay computes it again instead of reading
//! it, so a corrupt stored copy cannot mislead a replay: it is reported (and counted) without
//! stopping the run; that is the "recompute where it is safe" case. A run stored before
//! outcomes were recorded runs its programs again, as it did then.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use baton_core::integrity::{ChainLink, genesis_of_digest};
use baton_core::workflow::StepType;
use baton_core::{Action, Run, StepRecord, Transition};
use serde_json::Value;

use crate::jq_runs::Replay;
use crate::model::{LoggedEvent, StoredEvent};
use crate::store::StoredRun;
use crate::task_ref::{chain_step, record_key};
use crate::workflows::Workflows;

/// Where a stored run stops matching its chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The step (and visit) whose stored data does not match, when one can be named.
    pub step: Option<(String, u32)>,
    pub problem: String,
    /// Where in the chain: the number of links that held before it.
    pub link: usize,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.step {
            Some((step_id, visit)) => write!(
                f,
                "integrity error at step \"{step_id}\" (visit {visit}): {}",
                self.problem
            ),
            None => write!(f, "integrity error: {}", self.problem),
        }
    }
}

/// A run read back from the store.
pub struct Checked {
    /// The run as far as its stored data holds: all of it, or up to the event before the first
    /// mismatch.
    pub run: Run,
    /// Links checked.
    pub links: usize,
    /// The first mismatch that stops the run (the replay went no further).
    pub mismatch: Option<Mismatch>,
    /// Stored copies that do not match but that the replay does not depend on.
    pub repaired: Vec<Mismatch>,
    /// The CPU time the run's jq programs used, as recorded.
    pub jq_cpu: Duration,
}

/// Why a stored run cannot be read at all (not a mismatch of one step's data).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unreadable(pub String);

/// Replays `stored`, checking each settled visit against the stored chain.
pub fn replay_checked(stored: &StoredRun, workflows: &Workflows) -> Result<Checked, Unreadable> {
    replay_observed(stored, workflows, |_, _| {})
}

/// [`replay_checked`], showing `observe` what each transition of the replay did (the run's
/// start first) and when (ms since the epoch): the agent tasks it dispatched are rebuilt
/// exactly as they were sent.
pub fn replay_observed(
    stored: &StoredRun,
    workflows: &Workflows,
    mut observe: impl FnMut(&[Action], i64),
) -> Result<Checked, Unreadable> {
    let header = &stored.header;
    let known = workflows
        .parse(&header.workflow)
        .map_err(|e| Unreadable(format!("workflow: {e}")))?;
    let input: Value =
        serde_json::from_slice(&header.input).map_err(|e| Unreadable(format!("input: {e}")))?;
    let links: Vec<ChainLink> = stored
        .links
        .iter()
        .enumerate()
        .map(|(i, bytes)| {
            serde_json::from_slice(bytes).map_err(|e| Unreadable(format!("chain link {i}: {e}")))
        })
        .collect::<Result<_, _>>()?;
    let mut check = Check {
        head: genesis_of_digest(&header.run_id, &known.text_sha256, &input),
        links: &links,
        checked: 0,
        results: &stored.results,
        repaired: Vec::new(),
        jq_cpu: Duration::ZERO,
    };
    // A run created since steps that run jq wait for their turn says so first; one stored
    // before is replayed as it ran then.
    let started = match starts_in_turns(stored) {
        true => Run::start(known.workflow, input),
        false => Run::start_settling_jq_inline(known.workflow, input),
    };
    observe(&started.actions, header.created_ms);
    let mut run = started.run;
    if let Some(mismatch) = check.settled(run.history().iter()) {
        return Ok(check.finish(run, Some(mismatch)));
    }
    for (i, bytes) in stored.events.iter().enumerate() {
        match check.replay_event(&run, i, bytes) {
            // How the run started: nothing to apply.
            Ok(None) => {}
            Ok(Some((next, at_ms))) => {
                // Shown only once its data held against the chain.
                observe(&next.actions, at_ms);
                run = next.run;
            }
            Err(mismatch) => return Ok(check.finish(run, Some(mismatch))),
        }
    }
    let mismatch = check.mismatch_at_the_end(&stored.state_sha256);
    Ok(check.finish(run, mismatch))
}

/// Whether the run's log starts with [`StoredEvent::Started`]: it was created since steps that
/// run jq wait for their turn.
fn starts_in_turns(stored: &StoredRun) -> bool {
    stored.events.first().is_some_and(|first| {
        matches!(
            serde_json::from_slice::<LoggedEvent>(first),
            Ok(LoggedEvent {
                event: StoredEvent::Started,
                ..
            })
        )
    })
}

/// The outcomes of the jq programs `logged`'s transition ran, by site, read back from the
/// results; or the first site whose output cannot be read, and why.
fn recorded_jq(
    logged: &LoggedEvent,
    results: &HashMap<String, Vec<u8>>,
) -> Result<HashMap<String, Result<Value, String>>, (String, String)> {
    logged
        .jq
        .iter()
        .map(|record| {
            let outcome = match &record.error {
                Some(error) => Err(error.clone()),
                None => Ok(read_result(results, &record.at)
                    .map_err(|problem| (record.at.clone(), problem))?),
            };
            Ok((record.at.clone(), outcome))
        })
        .collect()
}

/// The step (and visit) a jq site names: `<step>#<visit>`, `<step>[<item>]#<visit>`, or a map
/// step's `<step>#<visit>/items`.
fn site_step(at: &str) -> Option<(String, u32)> {
    let key = at.strip_suffix("/items").unwrap_or(at);
    let task = crate::task_ref::parse_task_key(key)?;
    let name = match task.item {
        Some(item) => format!("{}[{item}]", task.step_id),
        None => task.step_id.to_string(),
    };
    Some((name, task.visit))
}

fn read_result(results: &HashMap<String, Vec<u8>>, key: &str) -> Result<Value, String> {
    let bytes = results
        .get(key)
        .ok_or_else(|| format!("result {key} is missing"))?;
    serde_json::from_slice(bytes).map_err(|e| format!("result {key} is not JSON: {e}"))
}

/// An agent event whose stored result is missing or not JSON.
fn result_unreadable(
    check: &Check<'_>,
    logged: &LoggedEvent,
    results: &HashMap<String, Vec<u8>>,
) -> Mismatch {
    let problem = match &logged.event {
        crate::model::StoredEvent::AgentSucceeded { result, .. } => format!(
            "its stored result cannot be read: {}",
            read_result(results, result).err().unwrap_or_default()
        ),
        _ => "an event refers to a result that cannot be read".into(),
    };
    check.mismatch(event_step(logged), problem)
}

/// The step an event is about, when it names one.
fn event_step(logged: &LoggedEvent) -> Option<(String, u32)> {
    match &logged.event {
        StoredEvent::AgentSucceeded { task, .. } | StoredEvent::AgentFailed { task, .. } => {
            let name = match task.item {
                Some(item) => format!("{}[{item}]", task.step_id),
                None => task.step_id.to_string(),
            };
            Some((name, task.visit))
        }
        StoredEvent::ApprovalDecided { step_id, .. } => Some((step_id.clone(), 0)),
        StoredEvent::ApprovalTimedOut { step_id, visit } => Some((step_id.clone(), *visit)),
        StoredEvent::Cancel { .. }
        | StoredEvent::Redrive { .. }
        | StoredEvent::Continue
        | StoredEvent::Started => None,
    }
}

struct Check<'a> {
    head: String,
    links: &'a [ChainLink],
    checked: usize,
    results: &'a HashMap<String, Vec<u8>>,
    repaired: Vec<Mismatch>,
    jq_cpu: Duration,
}

impl Check<'_> {
    /// Event `i` of the log (`bytes`) applied to `run` with the outputs its jq programs
    /// recorded, its settled visits checked against the chain; with its time. `None` for the
    /// event that starts the run. An event log that changed is a mismatch like a changed result:
    /// the run stops there.
    fn replay_event(
        &mut self,
        run: &Run,
        i: usize,
        bytes: &[u8],
    ) -> Result<Option<(Transition, i64)>, Mismatch> {
        let logged: LoggedEvent = serde_json::from_slice(bytes)
            .map_err(|e| self.mismatch(None, format!("event {i} cannot be read: {e}")))?;
        let event = match logged
            .event
            .to_event(|key| read_result(self.results, key).ok())
        {
            Ok(Some(event)) => event,
            Ok(None) => return Ok(None),
            Err(_) => return Err(result_unreadable(self, &logged, self.results)),
        };
        let recorded = recorded_jq(&logged, self.results).map_err(|(at, problem)| {
            self.mismatch(
                site_step(&at),
                format!("the stored output of its jq program cannot be read: {problem}"),
            )
        })?;
        self.jq_cpu += logged
            .jq
            .iter()
            .map(|record| Duration::from_micros(record.cpu_us))
            .sum::<Duration>();
        let before = run.history().len();
        let replaying = Replay::enter(recorded, logged.went_on);
        let applied = run.apply_at(event, logged.at_ms);
        drop(replaying);
        let next = applied.map_err(|e| {
            self.mismatch(
                event_step(&logged),
                format!("event {i} does not apply to the run as stored: {e}"),
            )
        })?;
        if let Some(mismatch) = self.settled(next.run.history_since(before).into_iter()) {
            return Err(mismatch);
        }
        Ok(Some((next, logged.at_ms)))
    }

    /// Once every event is replayed: links the events did not settle, or a recorded state
    /// that is not where the chain ends.
    fn mismatch_at_the_end(&self, state_sha256: &str) -> Option<Mismatch> {
        let links = self.links;
        if self.checked < links.len() {
            let extra = &links[self.checked];
            Some(self.mismatch(
                Some((extra.step_id.clone(), extra.visit)),
                format!(
                    "the chain has {} links but the stored events settle {} step visits",
                    links.len(),
                    self.checked
                ),
            ))
        } else if state_sha256 != self.head {
            Some(self.mismatch(
                None,
                format!(
                    "the run records state {} but its chain ends at {}",
                    state_sha256, self.head
                ),
            ))
        } else {
            None
        }
    }

    fn mismatch(&self, step: Option<(String, u32)>, problem: String) -> Mismatch {
        Mismatch {
            step,
            problem,
            link: self.checked,
        }
    }

    /// Checks newly settled visits against the next links; the first mismatch is returned and
    /// the head stays before it.
    fn settled<'r>(&mut self, records: impl Iterator<Item = &'r StepRecord>) -> Option<Mismatch> {
        for record in records {
            let name = chain_step(record);
            let step = Some((name.to_string(), record.visit));
            let Some(link) = self.links.get(self.checked) else {
                return Some(Mismatch {
                    link: self.checked,
                    step,
                    problem: format!(
                        "the stored chain ends after {} links; this visit has none",
                        self.checked
                    ),
                });
            };
            let result_sha256 = record.result_sha256();
            if link.step_id != name || link.visit != record.visit {
                return Some(Mismatch {
                    link: self.checked,
                    step,
                    problem: format!(
                        "link {} is for step \"{}\" (visit {})",
                        self.checked, link.step_id, link.visit
                    ),
                });
            }
            if link.result_sha256 != result_sha256 {
                return Some(Mismatch {
                    link: self.checked,
                    step,
                    problem: format!(
                        "its stored data hashes to {result_sha256}, the chain recorded {}",
                        link.result_sha256
                    ),
                });
            }
            let expected = ChainLink::after(&self.head, &link.step_id, link.visit, result_sha256);
            if expected.state_sha256 != link.state_sha256 {
                return Some(Mismatch {
                    link: self.checked,
                    step,
                    problem: format!(
                        "link {} records state {}, recomputed {}",
                        self.checked, link.state_sha256, expected.state_sha256
                    ),
                });
            }
            if record.step_type == StepType::Transform {
                self.check_stored_copy(record, link);
            }
            self.head = expected.state_sha256;
            self.checked += 1;
        }
        None
    }

    /// A transform's stored copy is not what a replay reads; a bad one is noted, not fatal.
    fn check_stored_copy(&mut self, record: &StepRecord, link: &ChainLink) {
        let key = record_key(record);
        let Some(data) = &record.data else { return };
        let stored = match read_result(self.results, &key) {
            Ok(stored) => stored,
            Err(problem) => {
                self.repaired.push(Mismatch {
                    link: self.checked,
                    step: Some((chain_step(record).to_string(), record.visit)),
                    problem: format!("{problem} (recomputed by the replay)"),
                });
                return;
            }
        };
        if stored != **data {
            let mut copy = record.clone();
            copy.data = Some(Arc::new(stored));
            self.repaired.push(Mismatch {
                link: self.checked,
                step: Some((chain_step(record).to_string(), record.visit)),
                problem: format!(
                    "its stored copy hashes to {}, the chain recorded {} (recomputed by the replay)",
                    copy.result_sha256(),
                    link.result_sha256
                ),
            });
        }
    }

    fn finish(self, run: Run, mismatch: Option<Mismatch>) -> Checked {
        Checked {
            run,
            links: self.checked,
            mismatch,
            repaired: self.repaired,
            jq_cpu: self.jq_cpu,
        }
    }
}
