//! A turn of a run's computation going on into more steps that run jq, as the jq runner says
//! (`JqRunner::go_on`): its own test binary, since the runner is the process's.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};

use baton_core::eval::{JqProgram, JqRunner, JqSite, install_jq_runner};
use baton_core::{Event, Run, RunStatus};
use common::workflow;
use serde_json::{Value, json};

/// Runs programs in this thread, and lets a turn go on as many times as `turns` says.
struct GoingOn {
    turns: AtomicU32,
}

impl JqRunner for GoingOn {
    fn run(&self, _: &JqSite<'_>, program: &JqProgram, document: &Value) -> Result<Value, String> {
        program.run(document)
    }

    fn go_on(&self) -> bool {
        self.turns
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

static RUNNER: GoingOn = GoingOn {
    turns: AtomicU32::new(0),
};

struct Shared;

impl JqRunner for Shared {
    fn run(
        &self,
        site: &JqSite<'_>,
        program: &JqProgram,
        document: &Value,
    ) -> Result<Value, String> {
        RUNNER.run(site, program, document)
    }

    fn go_on(&self) -> bool {
        RUNNER.go_on()
    }
}

#[test]
fn a_turn_goes_on_into_as_many_jq_steps_as_the_runner_lets_it_and_no_request_does() {
    install_jq_runner(Box::new(Shared));
    let text = r#"{"steps": [
        {"id": "one", "type": "transform", "transform": "jq: 1"},
        {"id": "two", "type": "transform", "transform": "jq: .context.one + 1"},
        {"id": "ask", "type": "agent", "agent": "a"},
        {"id": "three", "type": "transform", "transform": "jq: .context.two + 1"},
        {"id": "four", "type": "transform", "transform": "jq: .context.three + 1"}
    ]}"#;
    // The runner would let a turn go on, but a start is no turn: it stops before `one`.
    RUNNER.turns.store(10, Ordering::SeqCst);
    let started = Run::start(workflow(text), json!({})).run;
    assert_eq!(started.continuation().map(|s| s.as_ref()), Some("one"));
    assert_eq!(RUNNER.turns.load(Ordering::SeqCst), 10, "not asked");
    // One turn takes `one` and goes on into `two`, then stops at the agent.
    let turn = started.apply(Event::Continue).unwrap().run;
    assert_eq!(
        turn.context().data("two").map(|d| (**d).clone()),
        Some(json!(2))
    );
    assert_eq!(RUNNER.turns.load(Ordering::SeqCst), 9);
    // The agent's answer is no turn either: it stops before `three`.
    let answered = turn
        .apply(Event::AgentSucceeded {
            task: baton_core::TaskId::new("ask", 1),
            data: json!("ok").into(),
            notes: Default::default(),
        })
        .unwrap()
        .run;
    assert_eq!(answered.continuation().map(|s| s.as_ref()), Some("three"));
    assert_eq!(RUNNER.turns.load(Ordering::SeqCst), 9);
    // A turn the runner does not let go on takes `three` alone.
    RUNNER.turns.store(0, Ordering::SeqCst);
    let short = answered.apply(Event::Continue).unwrap().run;
    assert_eq!(short.continuation().map(|s| s.as_ref()), Some("four"));
    let done = short.apply(Event::Continue).unwrap().run;
    assert_eq!(done.status(), RunStatus::Succeeded);
    assert_eq!(
        done.context().data("four").map(|d| (**d).clone()),
        Some(json!(4))
    );
}
