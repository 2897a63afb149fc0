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
    /// Recorded outcomes by site key, each handed back once, and how many times the turn went
    /// on.
    Replay(HashMap<String, Result<Value, String>>, u32),
}

struct LiveState {
    budget: Duration,
    spent: Duration,
    abort: Arc<Abort>,
    evaluations: Vec<Evaluation>,
    aborted: bool,
    /// The CPU time this transition's programs used: a turn goes on while it is within
    /// [`TURN`].
    this_turn: Duration,
    went_on: u32,
}

/// The CPU time a turn of a run's computation goes on for (into the next step that runs jq),
/// and how many more steps at most: long enough that cheap programs are not a transition each,
/// short enough that other runs' turns, a cancel and a shutdown never wait long.
const TURN: Duration = Duration::from_millis(20);
const TURN_STEPS: u32 = 256;

/// What a live transition's programs came to.
#[derive(Debug, Default)]
pub struct Computed {
    /// Each program it ran, in order.
    pub evaluations: Vec<Evaluation>,
    /// How many times its turn went on into another step that runs jq.
    pub went_on: u32,
    /// It was stopped (a cancel, a shutdown): what it computed means nothing.
    pub stopped: bool,
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
            this_turn: Duration::ZERO,
            went_on: 0,
        }));
        Live(())
    }

    /// What ran, and whether it was stopped: then what the transition computed means nothing
    /// and must not be written.
    pub fn finish(self) -> Computed {
        match take() {
            Some(Mode::Live(state)) => Computed {
                evaluations: state.evaluations,
                went_on: state.went_on,
                stopped: state.aborted,
            },
            _ => Computed::default(),
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
    /// `went_on`: how many times the transition's turn went on, as recorded.
    pub fn enter(recorded: HashMap<String, Result<Value, String>>, went_on: u32) -> Replay {
        set(Mode::Replay(recorded, went_on));
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
        Some(Mode::Replay(recorded, _)) => match recorded.remove(&site.key()) {
            Some(outcome) => outcome,
            // Not recorded: the run was stored before outcomes were, and runs it again.
            None => parsed(runs.evaluate(program, document, None, None).result).map(|(v, _)| v),
        },
        Some(Mode::Live(state)) => live(runs, state, site, program, document),
        None => parsed(runs.evaluate(program, document, None, None).result).map(|(v, _)| v),
    })
}

/// Whether this thread's transition goes on into another step that runs jq: live, while its
/// turn lasts (and nothing stopped it), counted; replayed, as many times as it did.
pub(super) fn go_on() -> bool {
    SCOPE.with_borrow_mut(|scope| match scope {
        Some(Mode::Live(state)) => {
            let goes_on = !state.aborted
                && !state.abort.is_aborted()
                && state.this_turn < TURN
                && state.went_on < TURN_STEPS;
            state.went_on += u32::from(goes_on);
            goes_on
        }
        Some(Mode::Replay(_, went_on)) => {
            let goes_on = *went_on > 0;
            *went_on = went_on.saturating_sub(1);
            goes_on
        }
        None => false,
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
    state.this_turn += evaluated.cpu;
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
        let Computed {
            evaluations,
            stopped,
            ..
        } = live.finish();
        assert!(!stopped);
        assert_eq!(evaluations.len(), 2);
        assert_eq!(evaluations[0].at, "shape#1");
        assert_eq!(evaluations[0].outcome, Ok(Arc::from("6")));
        assert_eq!(evaluations[1].at, "boom[4]#1");
        assert_eq!(evaluations[1].outcome, Err(failed.clone()));

        // A replay hands back what was recorded, whatever the program would say now.
        let _replay = Replay::enter(
            HashMap::from([
                ("shape#1".to_owned(), Ok(serde_json::json!("recorded"))),
                ("boom[4]#1".to_owned(), Err(failed.clone())),
            ]),
            0,
        );
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
        let computed = live.finish();
        assert!(
            !computed.stopped,
            "a spent budget is the step's failure, recorded"
        );
        assert_eq!(computed.evaluations[0].outcome, Err(error));

        let abort = Arc::new(Abort::default());
        let live = Live::enter(budget, Duration::ZERO, abort.clone());
        abort.abort();
        assert!(run(&runs, &SITE, &program("1"), &serde_json::json!({})).is_err());
        assert!(!go_on(), "a stopped turn goes no further");
        let computed = live.finish();
        assert!(computed.stopped, "the transition is to be dropped");
        assert!(computed.evaluations.is_empty(), "nothing of it is recorded");
    }

    #[test]
    fn a_turn_goes_on_while_its_cpu_slice_lasts_and_a_replay_as_often_as_it_did() {
        let runs = JqRuns::in_thread();
        let live = Live::enter(Duration::from_secs(60), Duration::ZERO, Arc::default());
        assert!(go_on() && go_on(), "cheap programs: the turn goes on");
        // A program that used the whole slice ends the turn.
        let heavy = program("[range(3000000)] | length");
        let mut n = 0;
        while go_on() {
            let site = JqSite {
                visit: n + 1,
                ..SITE
            };
            run(&runs, &site, &heavy, &serde_json::json!({})).unwrap();
            n += 1;
            assert!(n < TURN_STEPS, "the slice never ran out");
        }
        let computed = live.finish();
        assert_eq!(computed.went_on, n + 2);
        assert!(computed.evaluations.iter().map(|e| e.cpu).sum::<Duration>() >= TURN);

        let _replay = Replay::enter(HashMap::new(), 2);
        assert!(go_on() && go_on());
        assert!(
            !go_on(),
            "a replay goes on exactly as often as the turn did"
        );
    }
}
