//! What the engine's caller set up on this thread for the jq programs of one transition: a live
//! run under a budget whose outcomes are recorded, or a replay of recorded outcomes.
//!
//! Thread-local, because the engine is a pure function that knows nothing of budgets or
//! stores: the coordinator sets the scope around one synchronous call of the engine, and the
//! runner the engine calls (on the same thread) reads it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use baton_core::eval::{JqProgram, JqSite};
use serde_json::Value;

use super::{JqRuns, parsed};
use crate::jq_sandbox::Abort;

thread_local! {
    static SCOPE: RefCell<Option<Mode>> = const { RefCell::new(None) };
}

enum Mode {
    Live(LiveState),
    /// Recorded outcomes by site key, each handed back once.
    Replay(HashMap<String, Result<Value, String>>),
}

struct LiveState {
    budget: Duration,
    spent: Duration,
    abort: Arc<Abort>,
    evaluations: Vec<Evaluation>,
    aborted: bool,
}

/// One jq program a live transition ran: where, what it cost, and how it ended (its output as
/// the JSON text it gave, or the error that failed its step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluation {
    /// The site's key ([`JqSite::key`]): where its output is stored.
    pub at: String,
    pub cpu: Duration,
    pub outcome: Result<Arc<str>, String>,
}

impl Evaluation {
    /// How the log keeps it: the output is stored apart, under its site.
    pub fn record(&self) -> crate::model::JqRecord {
        crate::model::JqRecord {
            at: self.at.clone(),
            cpu_us: u64::try_from(self.cpu.as_micros()).unwrap_or(u64::MAX),
            error: self.outcome.as_ref().err().cloned(),
        }
    }
}

/// The error of a program met once its run's budget is spent.
pub fn budget_spent(budget: Duration, spent: Duration) -> String {
    format!(
        "the run's jq CPU budget of {} ms is spent ({} ms used by its jq programs); a run's jq \
         programs together may use no more (the coordinator's --jq-run-cpu-ms)",
        budget.as_millis(),
        spent.as_millis()
    )
}

/// The programs of one live transition, until [`Live::finish`].
pub struct Live(());

impl Live {
    /// Programs run on this thread from now on count against a run that has used `spent` of
    /// `budget`, and stop when `abort` says so.
    pub fn enter(budget: Duration, spent: Duration, abort: Arc<Abort>) -> Live {
        set(Mode::Live(LiveState {
            budget,
            spent,
            abort,
            evaluations: Vec::new(),
            aborted: false,
        }));
        Live(())
    }

    /// What ran, in order, and whether it was stopped: then what the transition computed
    /// means nothing and must not be written.
    pub fn finish(self) -> (Vec<Evaluation>, bool) {
        match take() {
            Some(Mode::Live(state)) => (state.evaluations, state.aborted),
            _ => (Vec::new(), false),
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        take();
    }
}

/// The recorded outcomes of one logged transition, handed back as the replay meets them.
pub struct Replay(());

impl Replay {
    pub fn enter(recorded: HashMap<String, Result<Value, String>>) -> Replay {
        set(Mode::Replay(recorded));
        Replay(())
    }
}

impl Drop for Replay {
    fn drop(&mut self) {
        take();
    }
}

fn set(mode: Mode) {
    SCOPE.with_borrow_mut(|scope| {
        debug_assert!(scope.is_none(), "one jq scope at a time on a thread");
        *scope = Some(mode);
    });
}

fn take() -> Option<Mode> {
    SCOPE.with_borrow_mut(Option::take)
}

/// The runner's answer for `site`, as this thread's scope says.
pub(super) fn run(
    runs: &JqRuns,
    site: &JqSite<'_>,
    program: &JqProgram,
    document: &Value,
) -> Result<Value, String> {
    SCOPE.with_borrow_mut(|scope| match scope {
        Some(Mode::Replay(recorded)) => match recorded.remove(&site.key()) {
            Some(outcome) => outcome,
            // Not recorded: the run was stored before outcomes were, and runs it again.
            None => parsed(runs.evaluate(program, document, None, None).result).map(|(v, _)| v),
        },
        Some(Mode::Live(state)) => live(runs, state, site, program, document),
        None => parsed(runs.evaluate(program, document, None, None).result).map(|(v, _)| v),
    })
}

fn live(
    runs: &JqRuns,
    state: &mut LiveState,
    site: &JqSite<'_>,
    program: &JqProgram,
    document: &Value,
) -> Result<Value, String> {
    const STOPPED: &str = "the run's computation was stopped";
    if state.aborted || state.abort.is_aborted() {
        state.aborted = true;
        return Err(STOPPED.to_owned());
    }
    let at = site.key();
    let left = state.budget.saturating_sub(state.spent);
    if left.is_zero() {
        let error = budget_spent(state.budget, state.spent);
        state.evaluations.push(Evaluation {
            at,
            cpu: Duration::ZERO,
            outcome: Err(error.clone()),
        });
        return Err(error);
    }
    let per_program = runs.per_program();
    let cap = per_program.map_or(left, |per_program| per_program.min(left));
    let evaluated = runs.evaluate(program, document, Some(cap), Some(&state.abort));
    if evaluated.aborted {
        state.aborted = true;
        return Err(STOPPED.to_owned());
    }
    state.spent += evaluated.cpu;
    let result = match evaluated.result {
        // Stopped by what was left of the run's budget, not by the program's own.
        Err(_) if evaluated.ran_out_of_cpu && per_program.is_some_and(|p| cap < p) => {
            Err(budget_spent(state.budget, state.spent))
        }
        result => result,
    };
    let outcome = parsed(result);
    state.evaluations.push(Evaluation {
        at,
        cpu: evaluated.cpu,
        outcome: match &outcome {
            Ok((_, text)) => Ok(Arc::from(text.as_str())),
            Err(error) => Err(error.clone()),
        },
    });
    outcome.map(|(value, _)| value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(source: &str) -> JqProgram {
        JqProgram::compile(source).unwrap()
    }

    const SITE: JqSite<'static> = JqSite {
        step_id: "shape",
        visit: 1,
        item: None,
        items: false,
    };

    #[test]
    fn a_live_transition_records_each_program_and_a_replay_hands_it_back() {
        let runs = JqRuns::in_thread();
        let live = Live::enter(Duration::from_secs(10), Duration::ZERO, Arc::default());
        let document = serde_json::json!({"input": 2});
        assert_eq!(
            run(&runs, &SITE, &program(".input * 3"), &document),
            Ok(serde_json::json!(6))
        );
        let failing = JqSite {
            step_id: "boom",
            item: Some(4),
            ..SITE
        };
        let failed = run(&runs, &failing, &program("error(\"no\")"), &document).unwrap_err();
        let (evaluations, aborted) = live.finish();
        assert!(!aborted);
        assert_eq!(evaluations.len(), 2);
        assert_eq!(evaluations[0].at, "shape#1");
        assert_eq!(evaluations[0].outcome, Ok(Arc::from("6")));
        assert_eq!(evaluations[1].at, "boom[4]#1");
        assert_eq!(evaluations[1].outcome, Err(failed.clone()));

        // A replay hands back what was recorded, whatever the program would say now.
        let _replay = Replay::enter(HashMap::from([
            ("shape#1".to_owned(), Ok(serde_json::json!("recorded"))),
            ("boom[4]#1".to_owned(), Err(failed.clone())),
        ]));
        assert_eq!(
            run(&runs, &SITE, &program(".input * 3"), &document),
            Ok(serde_json::json!("recorded"))
        );
        assert_eq!(run(&runs, &failing, &program("1"), &document), Err(failed));
        // One not recorded (a run stored before outcomes were) runs.
        let other = JqSite {
            step_id: "other",
            ..SITE
        };
        assert_eq!(
            run(&runs, &other, &program(".input"), &document),
            Ok(serde_json::json!(2))
        );
    }

    #[test]
    fn a_spent_budget_fails_the_next_program_and_an_abort_stops_the_transition() {
        let runs = JqRuns::in_thread();
        let budget = Duration::from_millis(50);
        let live = Live::enter(budget, budget, Arc::default());
        let error = run(&runs, &SITE, &program("1"), &serde_json::json!({})).unwrap_err();
        assert!(error.contains("jq CPU budget of 50 ms is spent"), "{error}");
        let (evaluations, aborted) = live.finish();
        assert!(!aborted, "a spent budget is the step's failure, recorded");
        assert_eq!(evaluations[0].outcome, Err(error));

        let abort = Arc::new(Abort::default());
        let live = Live::enter(budget, Duration::ZERO, abort.clone());
        abort.abort();
        assert!(run(&runs, &SITE, &program("1"), &serde_json::json!({})).is_err());
        let (evaluations, aborted) = live.finish();
        assert!(aborted, "the transition is to be dropped");
        assert!(evaluations.is_empty(), "nothing of it is recorded");
    }
}
