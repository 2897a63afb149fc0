//! The spec's prompt templates and its feature-development example, run for real.

use std::path::PathBuf;

use serde_json::{Value, json};

use super::{AgentsFile, render_prompt};
use crate::Payload;

// The "Agent Prompt Templates" of the spec, byte for byte, as the example's `llm` agents use
// them (examples/feature-development/agents.llm.toml).

const PLANNER_PROMPT: &str =
    include_str!("../../../examples/feature-development/prompts/planner.md");
const CODER_PROMPT: &str = include_str!("../../../examples/feature-development/prompts/coder.md");
const TESTER_PROMPT: &str = include_str!("../../../examples/feature-development/prompts/tester.md");
const REVIEWER_PROMPT: &str =
    include_str!("../../../examples/feature-development/prompts/reviewer.md");

/// Method 5's synthesizer prompt.
const SYNTHESIZER_PROMPT: &str = r#"You are a research synthesizer.

## Available Research

{{#each context}}
### {{@key}}
{{this.findings}}
{{/each}}

## Your Task

Synthesize all research into a coherent implementation plan.
"#;

// The data of the "Complete Example: Feature Development Workflow".

const INPUT: &str = "Add dark mode toggle";

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

fn unit() -> Value {
    json!({"passed": 15, "failed": 0, "coverage": 95})
}

fn integration() -> Value {
    json!({"passed": 5, "failed": 0})
}

fn review() -> Value {
    json!({
        "approved": true,
        "comments": ["Good implementation", "Tests pass", "Code is clean"],
        "suggestions": []
    })
}

fn parallel_tests() -> Value {
    json!({
        "data": [
            {"stepId": "unit", "result": unit()},
            {"stepId": "integration", "result": integration()}
        ],
        "success": true
    })
}

/// Step 1: Plan.
fn planner_payload() -> Value {
    json!({"input": INPUT, "context": {}})
}

/// Step 3: Code (explicit `input: "plan"`).
fn coder_payload() -> Value {
    json!({
        "input": INPUT,
        "plan": plan(),
        "context": {"plan": plan(), "approve-plan": {"approved": true}}
    })
}

/// Step 4: Parallel Tests (the same for both branches).
fn tester_payload() -> Value {
    json!({
        "input": INPUT,
        "context": {"plan": plan(), "approve-plan": {"approved": true}, "code": code()}
    })
}

/// Step 6: Review (explicit `input: "code"`).
fn reviewer_payload() -> Value {
    json!({
        "input": INPUT,
        "code": code(),
        "context": {"plan": plan(), "code": code(), "parallel-tests": parallel_tests()}
    })
}

/// A prompt as an `llm` agent renders it for `payload`; no expression is left unrendered.
fn render(template: &str, payload: &Value) -> String {
    let text = render_prompt(template, payload).unwrap_or_else(|e| panic!("{e}"));
    assert!(!text.contains("{{"), "{text}");
    text
}

/// Asserts `text` contains `lines` as consecutive lines.
#[track_caller]
fn assert_lines(text: &str, lines: &[&str]) {
    let block = lines.join("\n");
    assert!(
        text.contains(&format!("{block}\n")),
        "expected\n{block}\nin\n{text}"
    );
}

#[test]
fn planner_prompt() {
    let text = render(PLANNER_PROMPT, &planner_payload());
    assert_lines(
        &text,
        &["You are a planning specialist.", "", "## Task", INPUT, ""],
    );
    assert_lines(&text, &["  \"files\": [\"file1.ts\", \"file2.ts\"],"]);
}

#[test]
fn coder_prompt_with_a_plan() {
    let text = render(CODER_PROMPT, &coder_payload());
    assert_lines(
        &text,
        &[
            "## Task",
            INPUT,
            "",
            "## Plan (if available)",
            r#"Files to create: ["src/theme.ts","src/toggle.tsx"]"#,
            "Approach: Use CSS variables",
            r#"Steps: ["Create theme context","Build toggle component","Add tests"]"#,
            "",
            "## Your Job",
        ],
    );
}

#[test]
fn coder_prompt_without_a_plan_renders_the_if_as_nothing() {
    let text = render(CODER_PROMPT, &planner_payload());
    assert_lines(&text, &["## Plan (if available)", "", "## Your Job"]);
    assert!(!text.contains("Files to create"), "{text}");
}

#[test]
fn tester_prompt() {
    let text = render(TESTER_PROMPT, &tester_payload());
    assert_lines(
        &text,
        &[
            "## Code Changes",
            r#"Files created: ["src/theme.ts","src/toggle.tsx"]"#,
            r#"Files modified: ["src/App.tsx"]"#,
            "Changes: Added theme context and toggle component",
            "",
            "## Your Job",
        ],
    );
    // The spec's context flow shows the code step's data without `changes`: it renders empty.
    let mut payload = tester_payload();
    payload["context"]["code"] = json!({
        "filesCreated": ["src/theme.ts", "src/toggle.tsx"],
        "filesModified": ["src/App.tsx"]
    });
    let text = render(TESTER_PROMPT, &payload);
    assert_lines(
        &text,
        &[r#"Files modified: ["src/App.tsx"]"#, "Changes: ", ""],
    );
    let text = render(TESTER_PROMPT, &coder_payload());
    assert_lines(&text, &["## Code Changes", "", "## Your Job"]);
}

#[test]
fn reviewer_prompt() {
    let text = render(REVIEWER_PROMPT, &reviewer_payload());
    assert_lines(
        &text,
        &[
            "## Code Changes",
            r#"Files created: ["src/theme.ts","src/toggle.tsx"]"#,
            r#"Files modified: ["src/App.tsx"]"#,
            "Changes: Added theme context and toggle component",
            "",
            "## Test Results",
            "- unit: 15 passed, 0 failed",
            "- integration: 5 passed, 0 failed",
            "",
            "## Your Job",
        ],
    );
    // Without test results or an explicit `code`, both sections are empty.
    let text = render(REVIEWER_PROMPT, &planner_payload());
    assert_lines(
        &text,
        &["## Code Changes", "", "## Test Results", "", "## Your Job"],
    );
}

#[test]
fn synthesizer_prompt_walks_the_context() {
    let payload = json!({
        "input": "Research dark mode implementations",
        "context": {
            "research-2": {"findings": ["prefers-color-scheme"], "sources": []},
            "research-1": {"findings": ["CSS variables", "React context"], "sources": []}
        }
    });
    let text = render(SYNTHESIZER_PROMPT, &payload);
    assert_lines(
        &text,
        &[
            "## Available Research",
            "",
            "### research-1",
            r#"["CSS variables","React context"]"#,
            "### research-2",
            r#"["prefers-color-scheme"]"#,
            "",
            "## Your Task",
        ],
    );
}

fn example_agents() -> AgentsFile {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/feature-development/agents.toml");
    AgentsFile::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// The example's `llm` agents load without a server (nothing is fetched at load time) and
/// with no key in the environment (a local Ollama needs none).
#[test]
fn example_llm_agents_load_without_a_network() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/feature-development/agents.llm.toml");
    let agents = AgentsFile::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = agents.agents.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        example_agents()
            .agents
            .keys()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        "the same agents as agents.toml"
    );
    for agent in agents.agents.values() {
        let super::Agent::Llm(agent) = agent else {
            panic!("{} is an llm agent", agent.name());
        };
        assert_eq!(agent.url(), "http://localhost:11434/v1/chat/completions");
    }
}

#[tokio::test]
async fn example_agents_answer_like_the_spec() {
    let agents = example_agents();
    assert_eq!(
        agents.agents.keys().collect::<Vec<_>>(),
        [
            "coder",
            "planner",
            "reviewer",
            "test-integration",
            "test-unit"
        ]
    );
    for (agent, payload, expected) in [
        ("planner", planner_payload(), plan()),
        ("coder", coder_payload(), code()),
        ("test-unit", tester_payload(), unit()),
        ("test-integration", tester_payload(), integration()),
        ("reviewer", reviewer_payload(), review()),
    ] {
        let out = agents
            .get(agent)
            .unwrap()
            .run(
                &Payload::from_value(payload.clone()),
                &[],
                &crate::OutputSink::none(),
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out, expected, "{agent}");
    }
}

#[tokio::test]
async fn example_coder_uses_the_plan_it_receives() {
    let agents = example_agents();
    let mut payload = coder_payload();
    payload["plan"]["files"] = json!(["src/other.ts"]);
    let out = agents
        .get("coder")
        .unwrap()
        .run(
            &Payload::from_value(payload.clone()),
            &[],
            &crate::OutputSink::none(),
        )
        .await
        .unwrap();
    assert_eq!(out.data["filesCreated"], json!(["src/other.ts"]));
    // Without its explicit reference the coder's template fails (strict mode), by name.
    let err = agents
        .get("coder")
        .unwrap()
        .run(
            &Payload::from_value(planner_payload()),
            &[],
            &crate::OutputSink::none(),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("`plan.files` does not exist"),
        "{err}"
    );
}

/// The engine runs `workflow.json` with the example agents answering every task: the run
/// succeeds through plan, approval, code, both tests and review, with the spec's data.
#[tokio::test]
async fn example_workflow_runs_end_to_end_with_the_example_agents() {
    use std::collections::VecDeque;
    use std::sync::Arc;

    use baton_core::{Action, Decision, Event, Run, RunStatus};

    let agents = example_agents();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/feature-development/workflow.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let workflow = Arc::new(
        baton_core::parse_workflow(&text)
            .unwrap_or_else(|e| panic!("{e}"))
            .workflow,
    );

    let transition = Run::start(workflow, json!(INPUT));
    let mut run = transition.run;
    let mut actions: VecDeque<Action> = transition.actions.into();
    let mut answered = Vec::new();
    let mut finished = None;
    while let Some(action) = actions.pop_front() {
        let event = match action {
            Action::Dispatch(task) => {
                let agent = agents
                    .get(&task.agent)
                    .unwrap_or_else(|| panic!("no agent {}", task.agent));
                let data = agent
                    .run(
                        &Payload::from_value(task.payload.to_value()),
                        &[],
                        &crate::OutputSink::none(),
                    )
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
                    .data;
                answered.push(task.agent.clone());
                Event::AgentSucceeded {
                    task: task.task,
                    data: data.into(),
                    notes: Default::default(),
                }
            }
            Action::AwaitApproval { step_id, .. } => Event::ApprovalDecided {
                step_id: step_id.to_string(),
                decision: Decision::approve(),
            },
            Action::Abandon(task) => panic!("abandoned {task:?}"),
            Action::Continue { .. } => Event::Continue,
            Action::Finished { status, error } => {
                finished = Some((status, error));
                continue;
            }
        };
        let transition = run.apply(event).unwrap_or_else(|e| panic!("{e}"));
        run = transition.run;
        actions.extend(transition.actions);
    }

    assert_eq!(finished, Some((RunStatus::Succeeded, None)));
    assert_eq!(
        answered,
        [
            "planner",
            "coder",
            "test-unit",
            "test-integration",
            "reviewer"
        ]
    );
    let data = |key: &str| run.context().data(key).map(|v| Value::clone(v));
    assert_eq!(data("plan"), Some(plan()));
    assert_eq!(data("code"), Some(code()));
    assert_eq!(data("review"), Some(review()));
    assert_eq!(data("parallel-tests").unwrap()["success"], json!(true));
}
