//! Leases: who holds a task until when, and what happens when that runs out. Pure functions of a
//! stored [`TaskEntry`]; the coordinator writes their answers with a compare-and-swap
//! ([`crate::store::Tasks::swap_tasks`]), so of two coordinators deciding about the same task only
//! one succeeds.
//!
//! The life of a task's entry:
//!
//! ```text
//!  dispatched ──▶ queued (owner C, due = now + lease) ──▶ running on a worker of C
//!       │              ▲  C renews `due` while it holds the task      │
//!       │              │                                              │ agent error/timeout,
//!       ▼              │ due passes (C died): claimed by any          │ retry policy allows
//!  unowned, due now ───┘ coordinator, attempt + 1                     ▼
//!  (C serves no worker                                  retrying (unowned, due = backoff)
//!   for the agent)                                                    │ due passes: claimed,
//!                                                                     ▼ attempt + 1
//! ```
//!
//! Every new delivery raises `attempt`, the fencing token: only the current attempt's answer is
//! recorded.

use baton_core::WorkerId;
use baton_core::workflow::RetryPolicy;

use crate::model::{TaskEntry, TaskState};

/// The timer set of what needs no worker: approval steps' timeouts and runs' continuations.
/// Agent names are never blank, so it is no agent's.
pub const APPROVAL_TIMERS: &str = "";

/// The task key of a run's continuation timer: never a step visit's (those hold a `#`).
pub const CONTINUATION: &str = "continue";

/// The timer of a run whose walk stopped before a step that runs jq: held by `holder`, which
/// goes on with the run when its turn comes, renewed while the run waits for it; if the holder
/// dies, it comes due and any coordinator goes on with the run. Held by nobody (due at once for
/// any coordinator) when this one is shutting down.
pub fn continuation(holder: Option<&str>, now_ms: i64, lease_ms: u64) -> TaskEntry {
    TaskEntry {
        agent: APPROVAL_TIMERS.into(),
        state: TaskState::Continuing,
        attempt: 1,
        owner: holder.map(str::to_owned),
        due_ms: now_ms + lease_ms as i64,
        ..TaskEntry::default()
    }
}

/// A continuation timer that came due (its holder died, or released it shutting down), taken
/// over by `me`.
pub fn continuation_claimed(
    entry: &TaskEntry,
    me: &str,
    now_ms: i64,
    lease_ms: u64,
) -> Option<TaskEntry> {
    (entry.state == TaskState::Continuing && entry.due_ms <= now_ms).then(|| TaskEntry {
        owner: Some(me.to_owned()),
        attempt: entry.attempt + 1,
        due_ms: now_ms + lease_ms as i64,
        ..entry.clone()
    })
}

/// The timer of an approval step with a `timeout_ms`: due when nobody decided in time. Nobody
/// holds it; whichever coordinator sweeps it first fails the step.
pub fn approval_timer(now_ms: i64, timeout_ms: u64) -> TaskEntry {
    TaskEntry {
        agent: APPROVAL_TIMERS.into(),
        state: TaskState::Waiting,
        attempt: 1,
        due_ms: now_ms.saturating_add(timeout_ms.min(i64::MAX as u64) as i64),
        ..TaskEntry::default()
    }
}

/// An approval timer claimed by a coordinator about to fail the step: if it dies first, the
/// timer is due again after a lease and another coordinator does it.
pub fn timing_out(entry: &TaskEntry, now_ms: i64, lease_ms: u64) -> Option<TaskEntry> {
    (entry.due_ms <= now_ms).then(|| TaskEntry {
        state: TaskState::TimingOut,
        due_ms: now_ms + lease_ms as i64,
        ..entry.clone()
    })
}

/// A new task of a transition: held by `owner` for a lease, or by nobody and due at once when
/// the dispatching coordinator has no worker for its agent (another one with such a worker
/// sweeps it up).
pub fn dispatched(agent: &str, owner: Option<&str>, now_ms: i64, lease_ms: u64) -> TaskEntry {
    TaskEntry {
        agent: agent.into(),
        state: TaskState::Queued,
        attempt: 1,
        owner: owner.map(str::to_owned),
        due_ms: match owner {
            Some(_) => now_ms + lease_ms as i64,
            None => now_ms,
        },
        ..TaskEntry::default()
    }
}

/// A connected worker as a task entry names it: its id, and the principal it connected as
/// (`None` when the coordinator does not authenticate).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Worker {
    pub id: WorkerId,
    pub principal: Option<String>,
}

impl Worker {
    /// A worker as its hello names it: `principal` is empty when nobody authenticated it.
    pub fn new(id: impl Into<WorkerId>, principal: &str) -> Self {
        Worker {
            id: id.into(),
            principal: (!principal.is_empty()).then(|| principal.to_owned()),
        }
    }
}

/// Where the holder has the task now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holding {
    /// On this worker's stream.
    Worker(Worker),
    /// In the hub's queue, with a worker connected that serves the agent.
    Queued,
    /// Nowhere useful: no worker for its agent is connected any more.
    Nowhere,
}

/// The entry after its holder renews it: the lease pushed out (and the worker and its principal
/// written down, so that every coordinator's view shows it and a coordinator this worker moves
/// to can tell it is the one running the task), or given up so that a coordinator with a
/// worker for the agent takes it at once.
pub fn renewed(entry: &TaskEntry, holding: &Holding, now_ms: i64, lease_ms: u64) -> TaskEntry {
    let until = now_ms + lease_ms as i64;
    // A continuation waits for its turn, never for a worker: kept while it waits here (or its
    // turn is under way), else left due at once for whichever coordinator sweeps it first, so
    // that a run whose turn went astray here (a cancel that failed after stopping it) is
    // never held by nobody's hand.
    if entry.state == TaskState::Continuing {
        return match holding {
            Holding::Nowhere => TaskEntry {
                owner: None,
                due_ms: now_ms,
                ..entry.clone()
            },
            _ => TaskEntry {
                due_ms: until,
                ..entry.clone()
            },
        };
    }
    match holding {
        Holding::Worker(worker) => TaskEntry {
            state: TaskState::Running,
            worker_id: Some(worker.id.clone()),
            principal: worker.principal.clone(),
            due_ms: until,
            ..entry.clone()
        },
        Holding::Queued => TaskEntry {
            state: TaskState::Queued,
            worker_id: None,
            principal: None,
            due_ms: until,
            ..entry.clone()
        },
        Holding::Nowhere => released(entry, now_ms),
    }
}

/// Given up by its holder (no worker for it, or the coordinator is shutting down; a
/// continuation it will not get to): due now, so any coordinator may claim it. The attempt
/// stays: nothing was lost.
pub fn released(entry: &TaskEntry, now_ms: i64) -> TaskEntry {
    TaskEntry {
        state: TaskState::Queued,
        worker_id: None,
        principal: None,
        owner: None,
        due_ms: now_ms,
        ..entry.clone()
    }
}

/// What a coordinator does with a task whose timer came due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Due {
    /// Someone pushed the timer out since it was read: leave it.
    NotYet,
    /// Claim it with this entry and send it to a worker.
    Deliver(TaskEntry),
    /// Claim it with this entry, then fail the step with this error: the task was lost too many
    /// times (a task that kills every worker it lands on must not go round for ever).
    GiveUp(TaskEntry, String),
}

/// The claim of a due task by `me`: a retry whose backoff is over, a task nobody holds, or one
/// whose holder stopped renewing it (a lost delivery). Each is a new attempt.
pub fn on_due(entry: &TaskEntry, me: &str, now_ms: i64, lease_ms: u64, max_lost: u32) -> Due {
    if entry.due_ms > now_ms {
        return Due::NotYet;
    }
    // Held by someone (queued there or on a worker) and not renewed: that delivery was lost.
    let lost = entry.state != TaskState::Retrying && entry.owner.is_some();
    let claimed = TaskEntry {
        state: TaskState::Queued,
        worker_id: None,
        principal: None,
        attempt: entry.attempt + 1,
        owner: Some(me.to_owned()),
        due_ms: now_ms + lease_ms as i64,
        lost: entry.lost + u32::from(lost),
        ..entry.clone()
    };
    if claimed.lost > max_lost {
        let error = lost_too_often(&claimed);
        return Due::GiveUp(claimed, error);
    }
    Due::Deliver(claimed)
}

/// The holder saw the worker go (its stream ended or fell silent): deliver again, as a new
/// attempt, or give up after too many losses.
pub fn lost(entry: &TaskEntry, now_ms: i64, lease_ms: u64, max_lost: u32) -> Due {
    let again = TaskEntry {
        state: TaskState::Queued,
        worker_id: None,
        principal: None,
        attempt: entry.attempt + 1,
        due_ms: now_ms + lease_ms as i64,
        lost: entry.lost + 1,
        ..entry.clone()
    };
    if again.lost > max_lost {
        let error = lost_too_often(&again);
        return Due::GiveUp(again, error);
    }
    Due::Deliver(again)
}

fn lost_too_often(entry: &TaskEntry) -> String {
    format!(
        "the task was lost {} times (its worker or coordinator went away each time); giving up",
        entry.lost
    )
}

/// What happens after an attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterFailure {
    /// Try again: store this entry (unowned, due when the backoff is over).
    Retry { entry: TaskEntry, backoff_ms: u64 },
    /// The step fails with this error.
    Fail(String),
}

/// Applies the step's retry policy to a failed attempt. `unit` is a random number in `[0, 1)`
/// for the jitter. Without a policy a step is tried once; an error the agent marked as not
/// retryable fails at once.
pub fn after_failure(
    entry: &TaskEntry,
    policy: Option<&RetryPolicy>,
    error: &str,
    retryable: bool,
    now_ms: i64,
    unit: f64,
) -> AfterFailure {
    let failures = entry.failures + 1;
    let Some(policy) = policy else {
        return AfterFailure::Fail(error.to_owned());
    };
    if !retryable {
        return AfterFailure::Fail(format!("{error} (not retryable)"));
    }
    if !policy.retries_after(failures) {
        return AfterFailure::Fail(format!(
            "{error} (failed {failures} of {} attempts)",
            policy.max_attempts
        ));
    }
    let backoff_ms = policy.backoff_ms(failures, unit);
    AfterFailure::Retry {
        entry: TaskEntry {
            state: TaskState::Retrying,
            worker_id: None,
            principal: None,
            owner: None,
            due_ms: now_ms + backoff_ms as i64,
            failures,
            error: Some(error.to_owned()),
            ..entry.clone()
        },
        backoff_ms,
    }
}

/// Why a worker that names a task in its hello (`Hello.held`) does not take it over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its attempt is no longer the current one (the task went to another worker), or the
    /// task waits to be retried: a late worker, not necessarily a hostile one.
    Superseded,
    /// No worker is written down for it: its holder died before its first renewal wrote the
    /// worker down. Nobody can tell who runs it, so it is delivered again when its lease runs
    /// out.
    NotWrittenDown,
    /// The entry names another worker id.
    OtherWorker,
    /// The entry names this worker id under another principal: a worker of another principal
    /// that took the id.
    OtherPrincipal,
    /// This worker does not serve the task's agent (so its principal may not, or it did not
    /// offer it).
    AgentNotServed,
}

impl Refusal {
    /// What the worker is told in its `CancelTask`.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Superseded => "superseded: the task was given to another worker",
            Refusal::NotWrittenDown => {
                "no worker is recorded as running it; it is delivered again when its lease runs out"
            }
            Refusal::OtherWorker | Refusal::OtherPrincipal => {
                "refused: the coordinator's record names another worker as running it"
            }
            Refusal::AgentNotServed => "refused: this worker does not serve the task's agent",
        }
    }
}

/// A worker that reconnected (to `me`) says it still runs `attempt` of the task. `me` takes
/// over its lease only if the stored entry says this very worker runs it: the attempt is the
/// current one, the entry names this worker id and the principal it connected as, and the
/// worker serves the task's agent (`serves_agent`: an agent its hello offered, which the edge
/// checked its principal may serve). Anything else is refused, and the worker must drop it.
///
/// An entry that names no worker yet (written by a dispatch, not yet by a renewal) is refused
/// too: whoever names it cannot be told from the worker that runs it.
pub fn adopted(
    entry: &TaskEntry,
    attempt: u32,
    worker: &Worker,
    serves_agent: bool,
    me: &str,
    now_ms: i64,
    lease_ms: u64,
) -> Result<TaskEntry, Refusal> {
    if entry.attempt != attempt || entry.state == TaskState::Retrying {
        return Err(Refusal::Superseded);
    }
    let Some(holder) = &entry.worker_id else {
        return Err(Refusal::NotWrittenDown);
    };
    if *holder != worker.id {
        return Err(Refusal::OtherWorker);
    }
    if entry.principal != worker.principal {
        return Err(Refusal::OtherPrincipal);
    }
    if !serves_agent {
        return Err(Refusal::AgentNotServed);
    }
    Ok(TaskEntry {
        state: TaskState::Running,
        owner: Some(me.to_owned()),
        due_ms: now_ms + lease_ms as i64,
        ..entry.clone()
    })
}

#[cfg(test)]
mod tests;
