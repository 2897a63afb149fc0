//! The spec's "Complete Example: Feature Development Workflow": what each agent answers and what
//! each agent receives, field for field (the same values as `core/tests/spec_examples.rs`).

#![allow(dead_code)]

use serde_json::{Value, json};

/// The run's input in the spec's example.
pub const INPUT: &str = "Add dark mode toggle";

/// The planner's answer.
pub fn plan() -> Value {
    json!({
        "files": ["src/theme.ts", "src/toggle.tsx"],
        "approach": "Use CSS variables",
        "steps": ["Create theme context", "Build toggle component", "Add tests"]
    })
}

/// The coder's answer.
pub fn code() -> Value {
    json!({
        "filesCreated": ["src/theme.ts", "src/toggle.tsx"],
        "filesModified": ["src/App.tsx"],
        "changes": "Added theme context and toggle component"
    })
}

/// test-unit's answer.
pub fn unit() -> Value {
    json!({"passed": 15, "failed": 0, "coverage": 95})
}

/// test-integration's answer.
pub fn integration() -> Value {
    json!({"passed": 5, "failed": 0})
}

/// The reviewer's answer.
pub fn review() -> Value {
    json!({
        "approved": true,
        "comments": ["Good implementation", "Tests pass", "Code is clean"],
        "suggestions": []
    })
}

/// The data of `parallel-tests` once both testers answered.
pub fn parallel_tests() -> Value {
    json!({
        "success": true,
        "data": [
            {"stepId": "unit", "status": "fulfilled", "result": unit(), "error": null},
            {"stepId": "integration", "status": "fulfilled", "result": integration(), "error": null}
        ]
    })
}

/// What each agent step of the workflow receives on its first visit, by step id, when the plan
/// was approved with the decision data `approval` (`{"approved": true}` in the spec).
pub fn payloads(approval: &Value) -> Vec<(&'static str, Value)> {
    let tests = json!({
        "input": INPUT,
        "context": {"plan": plan(), "approve-plan": approval, "code": code()}
    });
    vec![
        ("plan", json!({"input": INPUT, "context": {}})),
        (
            "code",
            json!({
                "input": INPUT,
                "plan": plan(),
                "context": {"plan": plan(), "approve-plan": approval}
            }),
        ),
        ("unit", tests.clone()),
        ("integration", tests),
        (
            "review",
            json!({
                "input": INPUT,
                "code": code(),
                "context": {
                    "plan": plan(),
                    "approve-plan": approval,
                    "code": code(),
                    "parallel-tests": parallel_tests()
                }
            }),
        ),
    ]
}

/// The run's context when it succeeded.
pub fn final_context(approval: &Value) -> Value {
    json!({
        "plan": plan(),
        "approve-plan": approval,
        "code": code(),
        "parallel-tests": parallel_tests(),
        "review": review()
    })
}

/// Each agent step's answer, by the result key the store uses (`<step>#<visit>`).
pub fn results() -> Vec<(&'static str, Value)> {
    vec![
        ("plan#1", plan()),
        ("code#1", code()),
        ("unit#1", unit()),
        ("integration#1", integration()),
        ("review#1", review()),
    ]
}

/// A payload as the spec shows it: without the `messages` and `handoff` keys Baton adds (the
/// message history and the handoff record, tested on their own).
pub fn spec_view(mut payload: Value) -> Value {
    if let Some(object) = payload.as_object_mut() {
        object.remove("messages");
        object.remove("handoff");
    }
    payload
}
