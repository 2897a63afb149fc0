//! A parallel step with `tolerated_failures`: the failures it tolerates go on, one more fails it
//! at once (the branches still running are stopped), and a retry of the run it failed runs only
//! the branches that did not succeed.

mod common;

use baton_core::{EngineError, Event, RunStatus, StepStatus, parse_workflow};
use common::Driver;
use serde_json::json;

fn tests_workflow(tolerated: serde_json::Value) -> String {
    json!({"id": "tolerant", "steps": [
        {"id": "tests", "type": "parallel", "tolerated_failures": tolerated, "steps": [
            {"id": "unit", "type": "agent", "agent": "tester"},
            {"id": "lint", "type": "agent", "agent": "linter"},
            {"id": "e2e", "type": "agent", "agent": "browser"},
            {"id": "sign-off", "type": "approval"}
        ]},
        {"id": "review", "type": "agent", "agent": "reviewer"}
    ]})
    .to_string()
}

#[test]
fn tolerated_branch_failures_go_on_to_the_next_step() {
    let mut run = Driver::start(&tests_workflow(json!(1)), json!(null));
    run.answer("unit", Err("flaky"));
    run.answer("lint", Ok(json!("clean")));
    run.answer("e2e", Ok(json!("green")));
    run.decide("sign-off", baton_core::Decision::approve());
    assert_eq!(run.queue_ids(), ["review"], "one failure is tolerated");
    let tests = run.run.context().data("tests").unwrap();
    assert_eq!(tests["success"], false);
    assert_eq!(tests["data"][0]["status"], "rejected");
    let record = run
        .run
        .history()
        .iter()
        .find(|r| r.step_id.as_ref() == "tests")
        .unwrap();
    assert_eq!(record.status, StepStatus::Succeeded);
    assert_eq!(record.next.as_deref(), Some("review"));
}

#[test]
fn one_failure_more_than_tolerated_stops_the_other_branches_and_fails_the_run() {
    let mut run = Driver::start(&tests_workflow(json!("25%")), json!(null));
    run.answer("unit", Err("flaky"));
    assert_eq!(
        run.run.status(),
        RunStatus::Running,
        "25% of 4 is one branch"
    );
    run.answer("lint", Ok(json!("clean")));
    run.answer("e2e", Err("browser crashed"));
    let (status, error) = run.finished.clone().expect("the run ended");
    assert_eq!(status, RunStatus::Failed);
    let error = error.unwrap();
    assert!(
        error.contains("2 of 4 branches failed; tolerated_failures is 25%"),
        "{error}"
    );
    // The approval still waiting was stopped with the step; nothing else was running.
    let abandoned: Vec<&str> = run.abandoned.iter().map(|t| t.step_id.as_ref()).collect();
    assert_eq!(abandoned, ["sign-off"]);
    let tests = &run.run.context().data("tests").unwrap()["data"];
    assert!(
        tests[3]["error"]
            .as_str()
            .unwrap()
            .starts_with("abandoned: "),
        "{tests}"
    );
    assert!(run.run.waiting().is_empty());
}

#[test]
fn a_retry_of_a_parallel_step_runs_only_the_branches_that_did_not_succeed() {
    let text = tests_workflow(json!(0));
    let mut run = Driver::start(&text, json!(null));
    run.answer("lint", Ok(json!("clean")));
    run.answer("unit", Err("flaky"));
    assert_eq!(run.run.status(), RunStatus::Failed);
    assert_eq!(run.run.redrive_target().unwrap().as_ref(), "tests");
    let dispatched_before = run.dispatched.len();

    run.apply(Event::Redrive);
    assert_eq!(run.run.status(), RunStatus::Running);
    let again: Vec<&str> = run.dispatched[dispatched_before..]
        .iter()
        .map(|t| t.task.step_id.as_ref())
        .collect();
    assert_eq!(again, ["unit", "e2e"], "lint succeeded and is kept");
    assert_eq!(run.run.visits("lint"), 1);
    assert_eq!(run.run.visits("unit"), 2);
    assert_eq!(run.run.visits("tests"), 2);
    // The redrive is on the record: the failed visit, taken up again.
    let redriven = run
        .run
        .history()
        .iter()
        .find(|r| r.status == StepStatus::Redriven)
        .expect("a redriven record");
    assert_eq!((redriven.step_id.as_ref(), redriven.visit), ("tests", 1));

    // The first visit's tasks were abandoned: only the second visit's remain to answer.
    run.queue.retain(|t| t.task.visit == 2);
    run.answer("unit", Ok(json!("passed")));
    run.answer("e2e", Ok(json!("green")));
    run.decide("sign-off", baton_core::Decision::approve());
    run.answer("review", Ok(json!("ship it")));
    assert_eq!(run.run.status(), RunStatus::Succeeded);
    let tests = run.run.context().data("tests").unwrap();
    assert_eq!(tests["success"], true);
    assert_eq!(tests["data"][1]["result"], "clean", "the kept result");
    assert_eq!(tests["data"][0]["result"], "passed");

    // Replaying the log, the retry included, rebuilds the same run.
    let replayed = run.replayed(&text, json!(null));
    assert_eq!(replayed.status(), RunStatus::Succeeded);
    assert_eq!(replayed.history().len(), run.run.history().len());
}

#[test]
fn only_a_failed_run_can_be_retried_and_only_at_a_step() {
    let mut run = Driver::start(&tests_workflow(json!(0)), json!(null));
    assert_eq!(
        run.run.apply(Event::Redrive).unwrap_err(),
        EngineError::NotFailed(RunStatus::Running)
    );
    run.apply(Event::Halt {
        error: "integrity error at step \"unit\"".into(),
    });
    assert!(matches!(
        run.run.apply(Event::Redrive).unwrap_err(),
        EngineError::NothingToRedrive(_)
    ));
}

#[test]
fn tolerated_failures_on_a_parallel_step_is_checked() {
    let text = json!({"steps": [{"id": "p", "type": "parallel", "tolerated_failures": "lots",
        "steps": [{"id": "a", "type": "agent", "agent": "x"}]}]})
    .to_string();
    let error = parse_workflow(&text).unwrap_err().to_string();
    assert!(error.contains("$.steps[0].tolerated_failures"), "{error}");
    assert!(error.contains("\"lots\" is not a percentage"), "{error}");
}

#[test]
fn a_nested_parallel_step_that_tolerates_its_failure_is_a_fulfilled_branch() {
    let text = json!({"steps": [
        {"id": "outer", "type": "parallel", "tolerated_failures": 0, "steps": [
            {"id": "inner", "type": "parallel", "tolerated_failures": 1, "steps": [
                {"id": "a", "type": "agent", "agent": "x"},
                {"id": "b", "type": "agent", "agent": "x"}]},
            {"id": "c", "type": "agent", "agent": "x"}]},
        {"id": "after", "type": "agent", "agent": "x"}
    ]})
    .to_string();
    let mut run = Driver::start(&text, json!(null));
    run.answer("a", Err("boom"));
    run.answer("b", Ok(json!("fine")));
    assert_eq!(run.run.status(), RunStatus::Running, "{:?}", run.finished);
    assert!(run.abandoned.is_empty(), "c goes on: {:?}", run.abandoned);
    run.answer("c", Ok(json!("done")));
    assert_eq!(run.queue_ids(), ["after"]);
    let outer = run.run.context().data("outer").unwrap();
    assert_eq!(outer["success"], true, "{outer}");
    assert_eq!(outer["data"][0]["status"], "fulfilled");
    assert_eq!(outer["data"][0]["result"]["data"][0]["status"], "rejected");
}
