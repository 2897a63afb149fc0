//! The `jq:` programs of runs: what each costs its run, and how its outcome is kept.
//!
//! The engine asks the process's jq runner ([`baton_core::eval::JqRunner`]) for every program
//! it meets, naming the evaluation by its site ([`JqSite`]). This runner does what the engine's
//! caller set up on the calling thread ([`scope`]):
//! - a **live** transition runs the program in a sandbox ([`crate::jq_sandbox`]) under what is
//!   left of the run's CPU budget, stops it if the run is cancelled or the coordinator stops
//!   ([`Abort`]), and records how it ended and what it cost ([`Evaluation`]): the log keeps
//!   that with the event ([`crate::model::JqRecord`]);
//! - a **replay** hands back the recorded outcome, so that reading a run never runs its
//!   programs again;
//! - with no scope (validating a workflow, a run stored before outcomes were recorded) it just
//!   runs the program.

mod scope;

use std::sync::Arc;
use std::time::Duration;

use baton_core::eval::{JqProgram, JqRunner, JqSite, parse_output};
use serde_json::Value;

pub use self::scope::{Computed, Evaluation, Live, Replay, budget_spent};
use crate::jq_sandbox::{Abort, Evaluated, Sandboxed};

/// The jq runner a coordinator process installs: programs in budgeted sandboxes, or (unbudgeted,
/// for measuring what the budget costs, and in tests) in the calling thread.
pub struct JqRuns {
    sandboxed: Option<Sandboxed>,
}

impl JqRuns {
    pub fn sandboxed(sandboxed: Sandboxed) -> Self {
        Self {
            sandboxed: Some(sandboxed),
        }
    }

    /// Programs run in the calling thread with no CPU or memory budget: one endless program
    /// stalls the thread. The run's budget is still counted, between programs.
    pub fn in_thread() -> Self {
        Self { sandboxed: None }
    }

    /// Runs `program` on `document` with at most `cpu` of CPU time, stopped by `abort`.
    fn evaluate(
        &self,
        program: &JqProgram,
        document: &Value,
        cpu: Option<Duration>,
        abort: Option<&Abort>,
    ) -> Evaluated {
        let Some(sandboxed) = &self.sandboxed else {
            let started = thread_cpu();
            let result = program.run(document).map(|value| value.to_string());
            return Evaluated {
                result,
                cpu: thread_cpu().saturating_sub(started),
                aborted: false,
                ran_out_of_cpu: false,
            };
        };
        let document = match serde_json::to_vec(document) {
            Ok(document) => document,
            Err(error) => {
                return Evaluated {
                    result: Err(format!("jq input: {error}")),
                    cpu: Duration::ZERO,
                    aborted: false,
                    ran_out_of_cpu: false,
                };
            }
        };
        let pool = sandboxed.pool();
        let cpu = cpu.unwrap_or(pool.budget().cpu);
        // The engine calls this in an async task: tell Tokio this thread blocks for a while, so
        // that the runtime moves its other tasks (lease renewals, other runs) to another thread.
        let evaluate = || pool.evaluate_within(program.source(), &document, cpu, abort);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime)
                if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread =>
            {
                tokio::task::block_in_place(evaluate)
            }
            _ => evaluate(),
        }
    }

    /// The CPU time one program may use at most, whatever is left of its run's budget.
    fn per_program(&self) -> Option<Duration> {
        self.sandboxed.as_ref().map(|s| s.pool().budget().cpu)
    }
}

impl JqRunner for JqRuns {
    fn run(
        &self,
        site: &JqSite<'_>,
        program: &JqProgram,
        document: &Value,
    ) -> Result<Value, String> {
        scope::run(self, site, program, document)
    }

    fn go_on(&self) -> bool {
        scope::go_on()
    }
}

/// CPU time the calling thread has used.
fn thread_cpu() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// The program's output text as the engine takes it: parsed.
fn parsed(result: Result<String, String>) -> Result<(Value, String), String> {
    let text = result?;
    let value = parse_output(&text)?;
    Ok((value, text))
}

/// The [`Abort`] of each run's transition in progress on this coordinator, so that a cancel (or
/// a shutdown) can stop the jq program it runs instead of waiting for it.
#[derive(Default)]
pub struct Aborts {
    state: std::sync::Mutex<AbortsState>,
    /// Shutting down: every transition from now on is stopped as soon as it runs jq.
    stopping: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct AbortsState {
    running: std::collections::HashMap<String, Arc<Abort>>,
    /// Runs being cancelled: their transitions are stopped as soon as they run jq, until the
    /// cancel is applied (an answer retried at once must not take the run back first).
    stopped: std::collections::HashMap<String, usize>,
}

impl Aborts {
    fn state(&self) -> std::sync::MutexGuard<'_, AbortsState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The abort of a transition of `run_id` about to run (its run is locked: one at a time),
    /// until the returned guard is dropped.
    pub fn begin(&self, run_id: &str) -> Running<'_> {
        let abort = Arc::new(Abort::default());
        let mut state = self.state();
        if self.stopping.load(std::sync::atomic::Ordering::SeqCst)
            || state.stopped.contains_key(run_id)
        {
            abort.abort();
        }
        state.running.insert(run_id.to_owned(), abort.clone());
        Running {
            aborts: self,
            run_id: run_id.to_owned(),
            abort,
        }
    }

    /// Whether a transition of `run_id` is under way here (it may be running a jq program).
    pub fn in_progress(&self, run_id: &str) -> bool {
        self.state().running.contains_key(run_id)
    }

    /// Whether a cancel of `run_id` is on its way here.
    pub fn stopped(&self, run_id: &str) -> bool {
        self.state().stopped.contains_key(run_id)
    }

    /// Stops the jq program `run_id`'s transition in progress runs, if any, and those of its
    /// transitions until the returned guard is dropped (the cancel applied).
    pub fn stop(&self, run_id: &str) -> Stopped<'_> {
        let mut state = self.state();
        *state.stopped.entry(run_id.to_owned()).or_default() += 1;
        if let Some(abort) = state.running.get(run_id) {
            abort.abort();
        }
        Stopped {
            aborts: self,
            run_id: run_id.to_owned(),
        }
    }

    /// Stops every transition's jq program, now and from now on.
    pub fn abort_all(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for abort in self.state().running.values() {
            abort.abort();
        }
    }
}

/// A transition under way, stoppable through [`Running::abort`]; over when dropped (however
/// the transition ends: written, refused, or its future dropped).
pub struct Running<'a> {
    aborts: &'a Aborts,
    run_id: String,
    abort: Arc<Abort>,
}

impl Running<'_> {
    pub fn abort(&self) -> &Arc<Abort> {
        &self.abort
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut state = self.aborts.state();
        if state
            .running
            .get(&self.run_id)
            .is_some_and(|a| Arc::ptr_eq(a, &self.abort))
        {
            state.running.remove(&self.run_id);
        }
    }
}

/// A run's transitions are stopped as soon as they run jq, while this lives.
pub struct Stopped<'a> {
    aborts: &'a Aborts,
    run_id: String,
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        let mut state = self.aborts.state();
        if let Some(count) = state.stopped.get_mut(&self.run_id) {
            *count -= 1;
            if *count == 0 {
                state.stopped.remove(&self.run_id);
            }
        }
    }
}
