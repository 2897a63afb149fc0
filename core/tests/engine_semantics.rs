//! Routing, loops, failures and the engine's refusals, step by step.

mod common;

use baton_core::{Decision, EngineError, Event, Run, RunStatus, StepStatus, TaskId, Waiting};
use common::{Driver, example, spec, workflow};
use serde_json::json;

#[test]
fn a_rejected_plan_loops_back_and_the_planner_sees_the_rejection() {
    let mut run = Driver::start(
        &example("feature-development/workflow.json"),
        json!("toggle"),
    );
    run.answer("plan", Ok(json!({"v": 1})));
    run.decide(
        "approve-plan",
        Decision {
            approved: false,
            comment: Some("split the toggle out".into()),
            approver: Some("ana".into()),
        },
    );
    let second_plan = run.answer("plan", Ok(json!({"v": 2})));
    assert_eq!(second_plan.task.visit, 2);
    assert_eq!(
        spec(&second_plan.payload),
        json!({"input": "toggle", "context": {
            "plan": {"v": 1},
            "approve-plan": {"approved": false, "comment": "split the toggle out", "approver": "ana"}
        }})
    );
    run.decide("approve-plan", Decision::approve());
    let coder = run.answer("code", Ok(json!("code")));
    assert_eq!(
        coder.payload.to_value()["plan"],
        json!({"v": 2}),
        "the latest plan wins"
    );
    assert_eq!(run.run.visits("plan"), 2);
    // Both versions stay in the run's history and in the context's versions.
    let versions: Vec<_> = run
        .run
        .context()
        .versions("plan")
        .map(|r| r.visit)
        .collect();
    assert_eq!(versions, [1, 2]);
    let rejected = run
        .run
        .history()
        .iter()
        .find(|r| r.step_id.as_ref() == "approve-plan")
        .unwrap();
    assert_eq!(
        (rejected.status, rejected.next.as_deref()),
        (StepStatus::Rejected, Some("plan"))
    );
}

#[test]
fn failing_tests_send_the_run_back_to_code_then_on_to_review() {
    let mut run = Driver::start(
        &example("feature-development/workflow.json"),
        json!("toggle"),
    );
    run.answer("plan", Ok(json!("plan")));
    run.decide("approve-plan", Decision::approve());
    run.answer("code", Ok(json!("attempt 1")));
    run.answer("unit", Err("2 tests failed"));
    run.answer("integration", Ok(json!({"passed": 5})));
    // check-tests took the else branch: code runs again and sees the failed branch.
    let second = run.answer("code", Ok(json!("attempt 2")));
    assert_eq!(second.task.visit, 2);
    assert_eq!(
        second.payload.to_value()["context"]["parallel-tests"],
        json!({"success": false, "data": [
            {"stepId": "unit", "status": "rejected", "result": null, "error": "2 tests failed"},
            {"stepId": "integration", "status": "fulfilled", "result": {"passed": 5}, "error": null}
        ]})
    );
    run.answer("unit", Ok(json!({"passed": 7})));
    run.answer("integration", Ok(json!({"passed": 5})));
    run.answer("review", Ok(json!({"approved": true})));
    assert_eq!(run.finished, Some((RunStatus::Succeeded, None)));
    assert_eq!(run.run.visits("check-tests"), 2);
    assert_eq!(run.run.visits("unit"), 2);
}

#[test]
fn a_loop_that_never_exits_stops_at_the_visit_limit() {
    let text = r#"{"id": "spin", "max_visits": 3, "steps": [
        {"id": "work", "type": "agent", "agent": "a"},
        {"id": "again", "type": "condition", "condition": "true", "then": "work"}
    ]}"#;
    let mut run = Driver::start(text, json!(null));
    for _ in 0..3 {
        run.answer("work", Ok(json!(1)));
    }
    let (status, error) = run.finished.clone().expect("the run ended");
    assert_eq!(status, RunStatus::Failed);
    let error = error.unwrap();
    assert!(
        error.contains("\"work\" reached its limit of 3 visits"),
        "{error}"
    );
    assert!(error.contains("max_visits"), "{error}");
    assert!(run.queue.is_empty());
}

#[test]
fn a_loop_of_transforms_stops_copying_its_data_past_the_transition_budget() {
    // 8 MiB of input, copied on every visit of a loop that would run 10,000 times within the
    // submit's own transition: it stops once 256 MiB were produced, at the 32nd visit.
    let text = r#"{"max_visits": 10000, "steps": [
        {"id": "copy", "type": "transform", "transform": "input"},
        {"id": "again", "type": "condition", "condition": "true", "then": "copy"}
    ]}"#;
    let run = Run::start(workflow(text), json!("x".repeat(8 << 20))).run;
    assert_eq!(run.status(), RunStatus::Failed);
    let error = run.error().unwrap();
    assert!(
        error.contains("step \"copy\" failed") && error.contains("produced over 256 MiB of data"),
        "{error}"
    );
    assert_eq!(run.visits("copy"), 32);
}

#[test]
fn the_default_visit_limit_is_25_and_a_step_may_set_its_own() {
    let text = r#"{"steps": [
        {"id": "count", "type": "transform", "transform": "input"},
        {"id": "again", "type": "condition", "condition": "true", "then": "count"}
    ]}"#;
    let run = Run::start(workflow(text), json!(0)).run;
    assert_eq!(run.status(), RunStatus::Failed);
    assert_eq!(run.visits("count"), 26, "the 26th entry is refused");
    let text = r#"{"steps": [
        {"id": "count", "type": "transform", "transform": "input", "max_visits": 2},
        {"id": "again", "type": "condition", "condition": "true", "then": "count"}
    ]}"#;
    let run = Run::start(workflow(text), json!(0)).run;
    assert!(run.error().unwrap().contains("limit of 2 visits"));
}

#[test]
fn a_failed_step_without_on_error_fails_the_run_naming_step_and_error() {
    let mut run = Driver::start(&example("feature-dev.json"), json!("x"));
    run.answer("plan", Ok(json!(1)));
    run.answer("code", Err("compiler exploded"));
    assert_eq!(
        run.finished,
        Some((
            RunStatus::Failed,
            Some("step \"code\" failed: compiler exploded".into())
        ))
    );
    assert_eq!(
        run.run.context().to_value(),
        json!({"plan": 1}),
        "a failed step adds no data"
    );
}

#[test]
fn on_error_routes_the_failure_and_tells_the_handler_what_failed() {
    let text = r#"{"steps": [
        {"id": "code", "type": "agent", "agent": "coder", "on_error": "fix"},
        {"id": "ship", "type": "agent", "agent": "shipper", "end": true},
        {"id": "fix", "type": "agent", "agent": "fixer", "next": "code"}
    ]}"#;
    let mut run = Driver::start(text, json!("x"));
    run.answer("code", Err("type error in theme.ts"));
    let fixer = run.answer("fix", Ok(json!({"patched": true})));
    assert_eq!(
        spec(&fixer.payload),
        json!({"input": "x", "context": {}, "error": {"step": "code", "message": "type error in theme.ts"}})
    );
    run.answer("code", Ok(json!("ok")));
    let shipper = run.answer("ship", Ok(json!("shipped")));
    assert!(shipper.payload.to_value().get("error").is_none());
    assert_eq!(run.finished, Some((RunStatus::Succeeded, None)));
}

#[test]
fn a_failed_branch_routes_to_on_error_when_set() {
    let text = r#"{"steps": [
        {"id": "tests", "type": "parallel", "on_error": "triage", "steps": [
            {"id": "unit", "type": "agent", "agent": "u"},
            {"id": "lint", "type": "agent", "agent": "l"}
        ], "next": "done"},
        {"id": "done", "type": "agent", "agent": "d", "end": true},
        {"id": "triage", "type": "agent", "agent": "t"}
    ]}"#;
    let mut run = Driver::start(text, json!(null));
    run.answer("lint", Err("3 warnings"));
    run.answer("unit", Ok(json!("fine")));
    let triage = run.answer("triage", Ok(json!("noted")));
    assert_eq!(triage.payload.to_value()["error"]["step"], json!("tests"));
    assert_eq!(
        triage.payload.to_value()["error"]["message"],
        json!("branches failed: lint: 3 warnings")
    );
    assert_eq!(
        triage.payload.to_value()["context"]["tests"]["success"],
        json!(false)
    );
    let lint = run
        .run
        .history()
        .iter()
        .find(|r| r.step_id.as_ref() == "lint")
        .unwrap();
    assert_eq!(
        (lint.status, lint.parent.as_deref()),
        (StepStatus::Failed, Some("tests"))
    );
}

#[test]
fn a_missing_reference_fails_the_step_with_the_spec_message() {
    let text = r#"{"steps": [
        {"id": "code", "type": "agent", "agent": "coder", "input": "review"},
        {"id": "review", "type": "agent", "agent": "reviewer"}
    ]}"#;
    let run = Driver::start(text, json!(null));
    assert!(run.dispatched.is_empty(), "the agent never runs");
    assert_eq!(
        run.finished,
        Some((
            RunStatus::Failed,
            Some("step \"code\" failed: Referenced step not found: review".into())
        ))
    );
}

#[test]
fn transforms_fail_with_the_spec_messages() {
    let text = r#"{"steps": [
        {"id": "plan", "type": "agent", "agent": "planner"},
        {"id": "extract", "type": "transform", "transform": "context.plan.files.9"}
    ]}"#;
    let mut run = Driver::start(text, json!(null));
    run.answer("plan", Ok(json!({"files": ["a"]})));
    assert_eq!(
        run.finished.unwrap().1.unwrap(),
        "step \"extract\" failed: Path not found: context.plan.files.9"
    );
    let text = r#"{"steps": [
        {"id": "plan", "type": "agent", "agent": "planner", "on_error": "extract"},
        {"id": "extract", "type": "transform", "transform": "context.plan.files"}
    ]}"#;
    let mut run = Driver::start(text, json!(null));
    run.answer("plan", Err("no plan today"));
    assert_eq!(
        run.finished.unwrap().1.unwrap(),
        "step \"extract\" failed: Step not found: plan"
    );
}

#[test]
fn jq_transforms_reshape_and_store_under_their_alias() {
    let text = r#"{"steps": [
        {"id": "plan", "type": "agent", "agent": "planner"},
        {"id": "shout", "type": "transform", "transform": "jq: [.context.plan.files[] | ascii_upcase]", "output": "loud"},
        {"id": "code", "type": "agent", "agent": "coder", "input": "loud"}
    ]}"#;
    let mut run = Driver::start(text, json!("x"));
    run.answer("plan", Ok(json!({"files": ["a.ts", "b.ts"]})));
    let coder = run.answer("code", Ok(json!(null)));
    assert_eq!(coder.payload.to_value()["loud"], json!(["A.TS", "B.TS"]));
    assert_eq!(
        coder.payload.to_value()["context"]["loud"],
        json!(["A.TS", "B.TS"])
    );
    assert!(
        coder.payload.to_value()["context"].get("shout").is_none(),
        "stored under the alias only"
    );
}

#[test]
fn conditions_route_on_input_and_fall_through_when_a_branch_is_absent() {
    let text = r#"{"steps": [
        {"id": "gate", "type": "condition", "condition": "input.risky === true", "then": "review"},
        {"id": "ship", "type": "transform", "transform": "input", "end": true},
        {"id": "review", "type": "approval", "message": "Risky change: ship it?"}
    ]}"#;
    let safe = Run::start(workflow(text), json!({"risky": false})).run;
    assert_eq!(safe.status(), RunStatus::Succeeded);
    assert_eq!(safe.visits("review"), 0);
    let risky = Run::start(workflow(text), json!({"risky": true})).run;
    assert_eq!(
        risky.waiting(),
        [Waiting::Approval {
            step_id: "review".into(),
            message: "Risky change: ship it?".into()
        }]
    );
    let gate = risky
        .history()
        .iter()
        .find(|r| r.step_id.as_ref() == "gate")
        .unwrap();
    assert_eq!(gate.data.as_deref(), Some(&json!({"result": true})));
    assert!(
        risky.context().data("gate").is_none(),
        "conditions store no data"
    );
}

#[test]
fn a_rejection_without_on_reject_fails_the_step() {
    let text = r#"{"steps": [{"id": "sign-off", "type": "approval", "message": "Ship?"}]}"#;
    let mut run = Driver::start(text, json!(null));
    run.decide(
        "sign-off",
        Decision {
            approved: false,
            comment: Some("not yet".into()),
            approver: Some("lee".into()),
        },
    );
    assert_eq!(
        run.finished.unwrap().1.unwrap(),
        "step \"sign-off\" failed: approval \"sign-off\" was rejected by lee: not yet"
    );
}

#[test]
fn branches_may_be_transforms_approvals_and_nested_parallels() {
    let text = r#"{"steps": [
        {"id": "plan", "type": "agent", "agent": "planner"},
        {"id": "fan", "type": "parallel", "steps": [
            {"id": "files", "type": "transform", "transform": "context.plan.files"},
            {"id": "legal", "type": "approval", "message": "Legal ok?"},
            {"id": "inner", "type": "parallel", "steps": [
                {"id": "a", "type": "agent", "agent": "x"},
                {"id": "b", "type": "agent", "agent": "x", "input": "plan"}
            ]}
        ]}
    ]}"#;
    let mut run = Driver::start(text, json!(null));
    run.answer("plan", Ok(json!({"files": ["f"]})));
    assert_eq!(run.queue_ids(), ["a", "b"]);
    assert_eq!(run.approvals, ["legal"]);
    assert_eq!(run.payload_of("b")["plan"], json!({"files": ["f"]}));
    run.answer("a", Ok(json!(1)));
    run.answer("b", Err("boom"));
    assert!(run.finished.is_none());
    run.decide("legal", Decision::approve());
    let fan = run.run.context().data("fan").unwrap();
    assert_eq!(
        **fan,
        json!({"success": false, "data": [
            {"stepId": "files", "status": "fulfilled", "result": ["f"], "error": null},
            {"stepId": "legal", "status": "fulfilled", "result": {"approved": true}, "error": null},
            {"stepId": "inner", "status": "rejected", "result": null, "error": "branches failed: b: boom"}
        ]})
    );
    assert_eq!(
        run.finished,
        Some((RunStatus::Succeeded, None)),
        "no on_error: a failed branch does not fail the run"
    );
}

#[test]
fn stale_and_unknown_events_are_refused_and_change_nothing() {
    let mut run = Driver::start(&example("feature-development/workflow.json"), json!("x"));
    let first_plan = run.answer("plan", Ok(json!(1)));
    let before = run.run.clone();
    // A second answer for a task already answered.
    let late = before.apply(Event::AgentSucceeded {
        task: first_plan.task.clone(),
        data: json!(2).into(),
        notes: Default::default(),
    });
    assert_eq!(
        late.unwrap_err(),
        EngineError::UnknownTask(first_plan.task.clone())
    );
    // A task that never existed.
    let ghost = TaskId::new("review", 1);
    assert!(matches!(
        before.apply(Event::AgentFailed {
            task: ghost,
            error: "x".into()
        }),
        Err(EngineError::UnknownTask(_))
    ));
    // An approval for a step that is not waiting.
    assert_eq!(
        before
            .apply(Event::ApprovalDecided {
                step_id: "review".into(),
                decision: Decision::approve()
            })
            .unwrap_err(),
        EngineError::NotAwaitingApproval("review".into())
    );
    assert_eq!(before.context().to_value(), run.run.context().to_value());
    assert_eq!(before.history().len(), run.run.history().len());
    // A rejected plan makes a second visit: an answer for visit 1 is now stale.
    run.decide("approve-plan", Decision::reject("again"));
    let stale = run.run.apply(Event::AgentSucceeded {
        task: first_plan.task.clone(),
        data: json!(3).into(),
        notes: Default::default(),
    });
    assert!(matches!(stale, Err(EngineError::UnknownTask(_))));
}

#[test]
fn cancel_abandons_tasks_in_flight_and_ends_the_run() {
    let text = &example("parallel-tests.json");
    let mut run = Driver::start(text, json!(null));
    run.answer("unit", Ok(json!(1)));
    run.apply(Event::Cancel {
        reason: "user asked".into(),
    });
    assert_eq!(
        run.finished,
        Some((RunStatus::Cancelled, Some("user asked".into())))
    );
    let abandoned: Vec<_> = run
        .abandoned
        .iter()
        .map(|t| t.step_id.to_string())
        .collect();
    assert_eq!(abandoned, ["integration", "e2e"]);
    let after = run.run.apply(Event::Cancel {
        reason: "again".into(),
    });
    assert_eq!(
        after.unwrap_err(),
        EngineError::NotRunning(RunStatus::Cancelled)
    );
}

#[test]
fn replaying_the_events_rebuilds_the_same_run() {
    let mut run = Driver::start(&example("feature-development/workflow.json"), json!("x"));
    run.answer("plan", Ok(json!(1)));
    run.decide("approve-plan", Decision::reject("no"));
    run.answer("plan", Ok(json!(2)));
    run.decide("approve-plan", Decision::approve());
    run.answer("code", Ok(json!(3)));
    run.answer("integration", Ok(json!(4)));
    let replayed = Run::replay(
        workflow(&example("feature-development/workflow.json")),
        json!("x"),
        run.events.clone(),
    )
    .unwrap();
    assert_eq!(replayed.context().to_value(), run.run.context().to_value());
    assert_eq!(replayed.history(), run.run.history());
    assert_eq!(replayed.waiting(), run.run.waiting());
}

#[test]
fn pending_tasks_after_a_replay_are_the_tasks_that_were_dispatched() {
    let text = r#"{"steps": [
        {"id": "code", "type": "agent", "agent": "coder", "on_error": "tests"},
        {"id": "tests", "type": "parallel", "steps": [
            {"id": "unit", "type": "agent", "agent": "u"},
            {"id": "lint", "type": "agent", "agent": "l"}
        ]}
    ]}"#;
    let mut run = Driver::start(text, json!("x"));
    run.answer("code", Err("broken"));
    let replayed = Run::replay(workflow(text), json!("x"), run.events.clone()).unwrap();
    let rebuilt: Vec<_> = replayed
        .pending_tasks()
        .into_iter()
        .map(|t| (t.task, t.agent, t.payload.to_value()))
        .collect();
    let dispatched: Vec<_> = run
        .queue
        .iter()
        .map(|t| (t.task.clone(), t.agent.clone(), t.payload.to_value()))
        .collect();
    assert_eq!(rebuilt.len(), 2);
    assert_eq!(rebuilt, dispatched);
    // One of them alone, as a coordinator delivering it again asks for it.
    for (task, agent, payload) in &dispatched {
        let one = replayed.pending_task(task).expect("pending");
        assert_eq!(
            (&one.task, &one.agent, &one.payload.to_value()),
            (task, agent, payload)
        );
    }
    let not_waited_for = TaskId::new("unit", 2);
    assert!(replayed.pending_task(&not_waited_for).is_none());
    let settled = TaskId::new("code", 1);
    assert!(replayed.pending_task(&settled).is_none());

    // A top-level step reached through on_error keeps its error in the rebuilt payload.
    let text = r#"{"steps": [
        {"id": "code", "type": "agent", "agent": "coder", "on_error": "fix"},
        {"id": "fix", "type": "agent", "agent": "fixer", "input": "plan"},
        {"id": "plan", "type": "agent", "agent": "planner"}
    ]}"#;
    let mut run = Driver::start(text, json!("x"));
    run.answer("code", Err("broken"));
    assert!(
        run.finished.is_some(),
        "fix references plan, which has no data yet"
    );
    let text = r#"{"steps": [
        {"id": "code", "type": "agent", "agent": "coder", "on_error": "fix"},
        {"id": "fix", "type": "agent", "agent": "fixer"}
    ]}"#;
    let mut run = Driver::start(text, json!("x"));
    run.answer("code", Err("broken"));
    let replayed = Run::replay(workflow(text), json!("x"), run.events.clone()).unwrap();
    let rebuilt = replayed.pending_tasks();
    assert_eq!(rebuilt[0].payload.to_value(), run.payload_of("fix"));
    assert_eq!(
        rebuilt[0].payload.to_value()["error"]["message"],
        json!("broken")
    );
}

#[test]
fn an_approval_nobody_decides_in_time_fails_and_routes_like_any_failure() {
    let text = r#"{"steps": [
        {"id": "sign-off", "type": "approval", "message": "Ship?", "timeout_ms": 60000,
         "on_error": "escalate"},
        {"id": "ship", "type": "agent", "agent": "shipper", "end": true},
        {"id": "escalate", "type": "agent", "agent": "pager"}
    ]}"#;
    let workflow = workflow(text);
    let started = Run::start(workflow, json!(null));
    let timeouts: Vec<Option<u64>> = started
        .actions
        .iter()
        .filter_map(|action| match action {
            baton_core::Action::AwaitApproval { timeout_ms, .. } => Some(*timeout_ms),
            _ => None,
        })
        .collect();
    assert_eq!(
        timeouts,
        [Some(60_000)],
        "the coordinator is told to set a timer"
    );

    let mut run = Driver::start(text, json!(null));
    run.apply(Event::ApprovalTimedOut {
        step_id: "sign-off".into(),
        visit: 1,
    });
    // Decided too late: refused, nothing changes.
    assert_eq!(
        run.run
            .apply(Event::ApprovalDecided {
                step_id: "sign-off".into(),
                decision: Decision::approve(),
            })
            .unwrap_err(),
        EngineError::NotAwaitingApproval("sign-off".into())
    );
    let pager = run.answer("escalate", Ok(json!("paged")));
    assert_eq!(
        pager.payload.to_value()["error"],
        json!({"step": "sign-off", "message": "approval timed out after 60000 ms"})
    );
    let record = &run.run.history()[0];
    assert_eq!(
        (record.step_id.as_ref(), record.status),
        ("sign-off", StepStatus::Failed)
    );
}

#[test]
fn a_timeout_of_an_earlier_visit_of_an_approval_is_refused() {
    let text = r#"{"steps": [
        {"id": "plan", "type": "agent", "agent": "planner", "next": "approve"},
        {"id": "approve", "type": "approval", "timeout_ms": 1000, "on_reject": "plan"}
    ]}"#;
    let mut run = Driver::start(text, json!(null));
    run.answer("plan", Ok(json!(1)));
    run.decide("approve", Decision::reject("again"));
    run.answer("plan", Ok(json!(2)));
    assert_eq!(run.run.visits("approve"), 2);
    let stale = Event::ApprovalTimedOut {
        step_id: "approve".into(),
        visit: 1,
    };
    assert_eq!(
        run.run.apply(stale).unwrap_err(),
        EngineError::NotAwaitingApproval("approve".into())
    );
    run.apply(Event::ApprovalTimedOut {
        step_id: "approve".into(),
        visit: 2,
    });
    assert_eq!(
        run.finished,
        Some((
            RunStatus::Failed,
            Some("step \"approve\" failed: approval timed out after 1000 ms".into())
        ))
    );
}

/// Issue 28, hole 3: a step that runs jq is never entered by the transition that reaches it (a
/// submit, an answer), only by `Event::Continue`, one such step per transition. A run is
/// stored, listed and cancellable before any of its jq runs, and the coordinator decides when
/// each computation gets its turn.
#[test]
fn the_walk_stops_before_each_step_that_runs_jq_until_told_to_continue() {
    let text = r#"{"steps": [
        {"id": "pick", "type": "transform", "transform": "input.a"},
        {"id": "gate", "type": "condition", "condition": "context.pick === 1", "then": "double", "else": "ask"},
        {"id": "double", "type": "transform", "transform": "jq: .context.pick * 2"},
        {"id": "triple", "type": "transform", "transform": "jq: .context.double * 3"},
        {"id": "ask", "type": "agent", "agent": "a"},
        {"id": "last", "type": "transform", "transform": "jq: .context.ask", "end": true}
    ]}"#;
    let started = Run::start(workflow(text), json!({"a": 1}));
    // Paths and conditions settle at once; the walk stops before the first jq program.
    let run = started.run;
    assert_eq!(run.status(), RunStatus::Running);
    assert_eq!(run.history().len(), 2, "pick and gate settled");
    assert!(matches!(
        started.actions.as_slice(),
        [baton_core::Action::Continue { step_id }] if step_id.as_ref() == "double"
    ));
    assert_eq!(
        run.waiting(),
        [Waiting::Computation {
            step_id: "double".into()
        }]
    );
    assert_eq!(run.visits("double"), 0, "not entered yet");

    // One jq step a transition: `double` runs, the walk stops again before `triple`.
    let next = run.apply(Event::Continue).unwrap();
    assert_eq!(
        next.run.context().data("double").map(|d| (**d).clone()),
        Some(json!(2))
    );
    assert_eq!(next.run.continuation().map(|s| s.as_ref()), Some("triple"));
    let next = next.run.apply(Event::Continue).unwrap();
    assert_eq!(
        next.run.context().data("triple").map(|d| (**d).clone()),
        Some(json!(6))
    );
    // `triple` goes on to `ask`, an agent: nothing to continue.
    assert_eq!(next.run.continuation(), None);
    assert_eq!(
        next.run.apply(Event::Continue).unwrap_err(),
        EngineError::NotContinuing
    );
    // An agent's answer reaching a jq step stops before it too.
    let task = TaskId::new("ask", 1);
    let answered = next
        .run
        .apply(Event::AgentSucceeded {
            task,
            data: json!("answer").into(),
            notes: Default::default(),
        })
        .unwrap();
    assert_eq!(
        answered.run.continuation().map(|s| s.as_ref()),
        Some("last")
    );
    let done = answered.run.apply(Event::Continue).unwrap().run;
    assert_eq!(done.status(), RunStatus::Succeeded);
}

#[test]
fn a_run_waiting_to_compute_is_cancelled_and_forgets_its_computation() {
    let text = r#"{"steps": [{"id": "slow", "type": "transform", "transform": "jq: .input"}]}"#;
    let run = Run::start(workflow(text), json!(1)).run;
    assert_eq!(run.continuation().map(|s| s.as_ref()), Some("slow"));
    let cancelled = run
        .apply(Event::Cancel {
            reason: "stop".into(),
        })
        .unwrap()
        .run;
    assert_eq!(cancelled.status(), RunStatus::Cancelled);
    assert_eq!(cancelled.continuation(), None);
    assert!(cancelled.waiting().is_empty());
    assert_eq!(
        cancelled.apply(Event::Continue).unwrap_err(),
        EngineError::NotRunning(RunStatus::Cancelled)
    );
}

/// A jq step met through `on_error` stops the walk like any other; a redrive of a failed jq
/// step stops before it too and, continued, is still exempt from the visit limit.
#[test]
fn a_continued_step_keeps_what_routed_to_it_and_a_redrive_its_exemption() {
    let text = r#"{"steps": [
        {"id": "work", "type": "agent", "agent": "a", "on_error": "explain"},
        {"id": "explain", "type": "transform", "transform": "jq: .input.why", "max_visits": 1}
    ]}"#;
    let mut driver = Driver::start(text, json!({"why": "it broke"}));
    assert!(driver.continued.is_empty());
    driver.answer("work", Err("it broke"));
    assert_eq!(driver.continued, ["explain"]);
    assert_eq!(
        driver.run.context().data("explain").map(|d| (**d).clone()),
        Some(json!("it broke"))
    );

    let failing = r#"{"steps": [
        {"id": "fail", "type": "transform", "transform": "jq: error(\"no\")", "max_visits": 1}
    ]}"#;
    let mut driver = Driver::start(failing, json!({}));
    assert_eq!(driver.run.status(), RunStatus::Failed);
    driver.apply(Event::Redrive);
    assert_eq!(driver.continued, ["fail", "fail"]);
    assert_eq!(
        driver.run.visits("fail"),
        2,
        "the redriven visit is not refused"
    );
    assert_eq!(driver.run.status(), RunStatus::Failed);
    assert!(
        driver.run.error().unwrap().contains("no"),
        "{:?}",
        driver.run.error()
    );
}

/// A run stored before jq steps waited for `Continue` is replayed as it ran: its log has no
/// `Continue` events.
#[test]
fn a_run_started_the_old_way_walks_through_its_jq_steps() {
    let text = r#"{"steps": [
        {"id": "one", "type": "transform", "transform": "jq: 1"},
        {"id": "two", "type": "transform", "transform": "jq: .context.one + 1"}
    ]}"#;
    let run = Run::start_settling_jq_inline(workflow(text), json!({})).run;
    assert_eq!(run.status(), RunStatus::Succeeded);
    assert_eq!(
        run.context().data("two").map(|d| (**d).clone()),
        Some(json!(2))
    );
}
