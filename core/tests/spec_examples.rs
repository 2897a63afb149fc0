//! The spec's "what each agent receives" examples, reproduced field for field.

mod common;

use baton_core::{Decision, RunStatus};
use common::{Driver, example, spec};
use serde_json::{Value, json};

fn plan() -> Value {
    json!({
        "files": ["src/theme.ts", "src/toggle.tsx"],
        "approach": "Use CSS variables",
        "steps": ["Create theme context", "Build toggle component", "Add tests"]
    })
}

fn code() -> Value {
    json!({
        "filesCreated": ["src/theme.ts", "src/toggle.tsx"],
        "filesModified": ["src/App.tsx"],
        "changes": "Added theme context and toggle component"
    })
}

#[test]
fn feature_development_hands_each_agent_what_the_spec_shows() {
    let input = json!("Add dark mode toggle");
    let mut run = Driver::start(&example("feature-development/workflow.json"), input.clone());

    // Step 1: the planner sees the input and an empty context.
    let planner = run.answer("plan", Ok(plan()));
    assert_eq!(planner.agent, "planner");
    assert_eq!(
        spec(&planner.payload),
        json!({"input": input, "context": {}})
    );

    // Step 2: the approval waits for a person.
    assert_eq!(run.approvals, ["approve-plan"]);
    assert!(run.queue.is_empty());
    run.decide("approve-plan", Decision::approve());

    // Step 3: the coder gets the plan explicitly and the full context.
    let coder = run.answer("code", Ok(code()));
    assert_eq!(
        spec(&coder.payload),
        json!({
            "input": input,
            "plan": plan(),
            "context": {"plan": plan(), "approve-plan": {"approved": true}}
        })
    );

    // Step 4: both testers are dispatched at once with the same payload.
    assert_eq!(run.queue_ids(), ["unit", "integration"]);
    let expected_test_payload = json!({
        "input": input,
        "context": {"plan": plan(), "approve-plan": {"approved": true}, "code": code()}
    });
    let unit = run.answer(
        "unit",
        Ok(json!({"passed": 15, "failed": 0, "coverage": 95})),
    );
    let integration = run.answer("integration", Ok(json!({"passed": 5, "failed": 0})));
    assert_eq!(spec(&unit.payload), expected_test_payload);
    assert_eq!(spec(&integration.payload), expected_test_payload);
    assert_eq!(
        (unit.agent.as_str(), integration.agent.as_str()),
        ("test-unit", "test-integration")
    );

    // Step 5: check-tests reads `context.parallel-tests.success` and routes to review.
    // Step 6: the reviewer gets the code explicitly and the whole context.
    let parallel_tests = json!({
        "success": true,
        "data": [
            {"stepId": "unit", "status": "fulfilled", "result": {"passed": 15, "failed": 0, "coverage": 95}, "error": null},
            {"stepId": "integration", "status": "fulfilled", "result": {"passed": 5, "failed": 0}, "error": null}
        ]
    });
    let review = json!({"approved": true, "comments": ["Good implementation", "Tests pass", "Code is clean"], "suggestions": []});
    let reviewer = run.answer("review", Ok(review.clone()));
    assert_eq!(reviewer.agent, "reviewer");
    assert_eq!(
        spec(&reviewer.payload),
        json!({
            "input": input,
            "code": code(),
            "context": {
                "plan": plan(),
                "approve-plan": {"approved": true},
                "code": code(),
                "parallel-tests": parallel_tests
            }
        })
    );

    assert_eq!(run.finished, Some((RunStatus::Succeeded, None)));
    let check = run
        .run
        .history()
        .iter()
        .find(|r| r.step_id.as_ref() == "check-tests")
        .unwrap();
    assert_eq!(check.next.as_deref(), Some("review"));
    assert_eq!(
        run.run.context().data("review").map(|d| (**d).clone()),
        Some(review)
    );
}

#[test]
fn automatic_injection_gives_the_tester_plan_and_code() {
    let input = json!("Build a dark mode toggle");
    let mut run = Driver::start(&example("feature-dev.json"), input.clone());
    let planner = run.answer("plan", Ok(plan()));
    assert_eq!(
        spec(&planner.payload),
        json!({"input": input, "context": {}})
    );
    let coder = run.answer("code", Ok(code()));
    assert_eq!(
        spec(&coder.payload),
        json!({"input": input, "context": {"plan": plan()}})
    );
    let tester = run.answer("test", Ok(json!({"passed": 1})));
    assert_eq!(
        spec(&tester.payload),
        json!({"input": input, "context": {"plan": plan(), "code": code()}})
    );
    assert_eq!(run.finished, Some((RunStatus::Succeeded, None)));
}

#[test]
fn steps_without_next_run_in_document_order() {
    // The spec's opening workflow names no `next`; its steps still run plan, code, test.
    let mut run = Driver::start(&example("problem-statement.json"), json!("toggle"));
    run.answer("plan", Ok(plan()));
    run.answer("code", Ok(code()));
    let tester = run.answer("test", Ok(json!({})));
    assert_eq!(
        spec(&tester.payload),
        json!({"input": "toggle", "context": {"plan": plan(), "code": code()}})
    );
    assert_eq!(run.finished, Some((RunStatus::Succeeded, None)));
}

#[test]
fn explicit_references_add_the_named_step_beside_the_context() {
    let mut run = Driver::start(&example("explicit-references.json"), json!("toggle"));
    run.answer("plan", Ok(plan()));
    let coder = run.answer("code", Ok(code()));
    assert_eq!(
        spec(&coder.payload),
        json!({"input": "toggle", "plan": plan(), "context": {"plan": plan()}})
    );
    let tester = run.answer("test", Ok(json!({})));
    assert_eq!(
        spec(&tester.payload),
        json!({"input": "toggle", "code": code(), "context": {"plan": plan(), "code": code()}})
    );
}

#[test]
fn a_transform_output_is_usable_as_input_and_in_the_context() {
    let mut run = Driver::start(&example("transform-extract.json"), json!("toggle"));
    run.answer("plan", Ok(plan()));
    let coder = run.answer("code", Ok(code()));
    let files = json!(["src/theme.ts", "src/toggle.tsx"]);
    assert_eq!(
        spec(&coder.payload),
        json!({"input": "toggle", "files": files, "context": {"plan": plan(), "files": files}})
    );
    let extract = run
        .run
        .history()
        .iter()
        .find(|r| r.step_id.as_ref() == "extract")
        .unwrap();
    assert_eq!(extract.data.as_deref(), Some(&files));
}

#[test]
fn research_results_accumulate_for_the_synthesizer() {
    let input = json!("Research dark mode implementations");
    let mut run = Driver::start(&example("research-and-implement.json"), input.clone());
    let first = json!({"findings": ["CSS variables"], "sources": ["mdn"]});
    let second = json!({"findings": ["prefers-color-scheme"], "sources": ["web.dev"]});
    let researcher_one = run.answer("research-1", Ok(first.clone()));
    let researcher_two = run.answer("research-2", Ok(second.clone()));
    let synthesizer = run.answer("synthesize", Ok(plan()));
    assert_eq!(researcher_one.agent, "researcher");
    assert_eq!(
        spec(&researcher_two.payload),
        json!({"input": input, "context": {"research-1": first}})
    );
    assert_eq!(synthesizer.agent, "synthesizer");
    assert_eq!(
        spec(&synthesizer.payload),
        json!({"input": input, "context": {"research-1": first, "research-2": second}})
    );
    let coder = run.answer("code", Ok(code()));
    assert_eq!(
        spec(&coder.payload)["context"],
        json!({"research-1": first, "research-2": second, "synthesize": plan()})
    );
}

#[test]
fn parallel_branches_share_one_snapshot_and_results_merge_in_workflow_order() {
    let text = r#"{"id": "shared", "steps": [
        {"id": "code", "type": "agent", "agent": "coder"},
        {"id": "parallel-tests", "type": "parallel", "steps": [
            {"id": "unit", "type": "agent", "agent": "test-unit"},
            {"id": "integration", "type": "agent", "agent": "test-integration"},
            {"id": "e2e", "type": "agent", "agent": "test-e2e"}
        ]},
        {"id": "report", "type": "agent", "agent": "reporter"}
    ]}"#;
    let input = json!("Test the application");
    let mut run = Driver::start(text, input.clone());
    run.answer("code", Ok(json!({"filesCreated": ["a.ts"]})));
    assert_eq!(run.queue_ids(), ["unit", "integration", "e2e"]);
    let expected = json!({"input": input, "context": {"code": {"filesCreated": ["a.ts"]}}});
    // Finish out of order: the merged data still follows the workflow.
    let e2e = run.answer("e2e", Ok(json!({"passed": 10, "failed": 0})));
    let unit = run.answer("unit", Ok(json!({"passed": 50, "failed": 0})));
    assert!(
        run.queue_ids() == ["integration"],
        "no step runs before every branch settled"
    );
    let integration = run.answer("integration", Ok(json!({"passed": 20, "failed": 1})));
    for branch in [&unit, &integration, &e2e] {
        assert_eq!(spec(&branch.payload), expected, "{}", branch.task.step_id);
    }
    let reporter = run.answer("report", Ok(json!("done")));
    assert_eq!(
        spec(&reporter.payload)["context"]["parallel-tests"],
        json!({"success": true, "data": [
            {"stepId": "unit", "status": "fulfilled", "result": {"passed": 50, "failed": 0}, "error": null},
            {"stepId": "integration", "status": "fulfilled", "result": {"passed": 20, "failed": 1}, "error": null},
            {"stepId": "e2e", "status": "fulfilled", "result": {"passed": 10, "failed": 0}, "error": null}
        ]})
    );
    // Branches are not context entries of their own.
    assert!(spec(&reporter.payload)["context"].get("unit").is_none());
}
