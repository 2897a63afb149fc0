//! Messages, decisions and handoff records as a run carries them from agent to agent.

mod common;

use std::collections::BTreeMap;

use baton_core::{Decision, RunStatus};
use common::{Driver, example};
use proptest::prelude::*;
use serde_json::{Value, json};

const START_MS: i64 = 1_795_428_000_000; // 2026-11-23T10:00:00Z

fn feature_development() -> Driver {
    let mut run = Driver::start(
        &example("feature-development/workflow.json"),
        json!("Add dark mode toggle"),
    );
    run.now_ms = START_MS;
    run
}

fn ids(messages: &Value) -> Vec<&str> {
    messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect()
}

#[test]
fn messages_accumulate_in_order_and_every_agent_receives_the_history() {
    let mut run = feature_development();
    let planner = run.answer_with(
        "plan",
        json!({"files": ["a.ts"]}),
        json!({"messages": [
            {"role": "user", "content": "Add dark mode toggle"},
            {"id": "plan-summary", "role": "assistant", "content": "Plan: a toggle"}
        ]}),
    );
    assert_eq!(planner.payload.to_value()["messages"], json!([]));
    run.decide("approve-plan", Decision::approve());
    let coder = run.answer_with(
        "code",
        json!("done"),
        json!({"messages": [
            // Same id: replaced in place, not appended (LangGraph's add_messages).
            {"id": "plan-summary", "role": "assistant", "content": "Plan v2: a toggle and a hook"},
            {"role": "assistant", "content": "Implemented"}
        ]}),
    );
    let received = &coder.payload.to_value()["messages"];
    assert_eq!(ids(received), ["plan#1/0", "plan-summary"]);
    assert_eq!(
        received[0]["name"],
        json!("planner"),
        "named after the agent"
    );

    let history = serde_json::to_value(run.run.messages().messages()).unwrap();
    assert_eq!(ids(&history), ["plan#1/0", "plan-summary", "code#1/1"]);
    assert_eq!(history[1]["content"], json!("Plan v2: a toggle and a hook"));
    assert_eq!(
        history[1]["name"],
        json!("coder"),
        "the replacing agent's name"
    );
    assert_eq!(history[2]["name"], json!("coder"));
}

#[test]
fn a_removal_deletes_by_id_and_an_unknown_id_fails_the_step_naming_it() {
    let mut run = feature_development();
    run.answer_with(
        "plan",
        json!(1),
        json!({"messages": [{"id": "draft", "role": "assistant", "content": "x"}]}),
    );
    run.decide("approve-plan", Decision::approve());
    run.answer_with(
        "code",
        json!(2),
        json!({"messages": [{"type": "remove", "id": "draft"}]}),
    );
    assert!(run.run.messages().messages().is_empty());

    run.answer_with(
        "unit",
        json!(3),
        json!({"messages": [{"type": "remove", "id": "never-written"}]}),
    );
    let unit = run
        .run
        .history()
        .iter()
        .find(|r| r.step_id.as_ref() == "unit")
        .unwrap();
    let error = unit.error.as_deref().unwrap();
    assert!(
        error.contains("messages[0]") && error.contains("never-written"),
        "{error}"
    );
}

/// Both orders of the testers' answers give the same history: branch order, not arrival.
#[test]
fn parallel_branches_merge_messages_in_branch_order_whatever_order_they_answer_in() {
    let histories: Vec<Value> = [["unit", "integration"], ["integration", "unit"]]
        .into_iter()
        .map(|order| {
            let mut run = feature_development();
            run.answer_with(
                "plan",
                json!(1),
                json!({"messages": [{"role": "user", "content": "go"}]}),
            );
            run.decide("approve-plan", Decision::approve());
            run.answer_with("code", json!(2), json!({}));
            for step in order {
                run.answer_with(
                    step,
                    json!({"passed": 1}),
                    json!({"messages": [{"role": "assistant", "content": format!("{step} ok")}]}),
                );
            }
            let reviewer = run.queue.front().expect("review dispatched").clone();
            assert_eq!(reviewer.task.step_id.as_ref(), "review");
            reviewer.payload.to_value()["messages"].clone()
        })
        .collect();
    assert_eq!(
        ids(&histories[0]),
        ["plan#1/0", "unit#1/0", "integration#1/0"]
    );
    assert_eq!(histories[0], histories[1]);
}

#[test]
fn a_sequential_handoff_carries_the_source_agent_its_decisions_and_their_keys() {
    let mut run = feature_development();
    let planner = run.answer_with(
        "plan",
        json!({"files": ["a.ts"]}),
        json!({
            "messages": [{"id": "m1", "role": "assistant", "content": "Plan"}],
            "decisions": [{
                "summary": "Use CSS variables",
                "rationale": "themes switch without a reload",
                "related_artifacts": ["src/theme.ts"]
            }]
        }),
    );
    assert!(
        planner.payload.to_value().get("handoff").is_none(),
        "the entry agent has no one handing over"
    );
    run.decide("approve-plan", Decision::approve());
    let coder = run.answer_with("code", json!("done"), json!({}));
    let handoff = &coder.payload.to_value()["handoff"];
    assert_eq!(
        handoff,
        &json!({
            "source_agent": "planner",
            "source_agents": ["planner"],
            "target_agent": "coder",
            "step_id": "code",
            "visit": 1,
            "decisions": [{
                "key": "plan#1/0",
                "agent": "planner",
                "step_id": "plan",
                "visit": 1,
                "summary": "Use CSS variables",
                "rationale": "themes switch without a reload",
                "timestamp": "2026-11-23T10:00:00Z",
                "related_artifacts": ["src/theme.ts"]
            }],
            "memory_refs": ["decision:plan#1/0", "message:m1"],
            // The approval was decided a second after the plan arrived: the handoff is then.
            "timestamp": "2026-11-23T10:00:01Z"
        })
    );
    assert_eq!(run.run.handoffs().len(), 3, "code, then both testers");
    assert_eq!(run.run.decisions().len(), 1);
}

#[test]
fn after_a_parallel_merge_every_branch_hands_over_in_branch_order() {
    let mut run = feature_development();
    run.answer_with("plan", json!(1), json!({}));
    run.decide("approve-plan", Decision::approve());
    let coder_notes =
        json!({"decisions": [{"summary": "Hook over context", "rationale": "smaller"}]});
    let unit = {
        run.answer_with("code", json!(2), coder_notes);
        run.queue
            .iter()
            .find(|t| t.task.step_id.as_ref() == "unit")
            .unwrap()
            .clone()
    };
    // Both branches got the coder's handoff.
    assert_eq!(
        unit.payload.to_value()["handoff"]["source_agent"],
        json!("coder")
    );
    assert_eq!(
        unit.payload.to_value()["handoff"]["target_agent"],
        json!("test-unit")
    );
    run.answer_with(
        "integration",
        json!({"passed": 5}),
        json!({"decisions": [{"summary": "Skip e2e", "rationale": "no browser"}]}),
    );
    run.answer_with(
        "unit",
        json!({"passed": 15}),
        json!({"decisions": [{"summary": "Mock the clock"}]}),
    );
    let reviewer = run.queue.front().unwrap().clone();
    let handoff = reviewer.payload.to_value()["handoff"].clone();
    assert_eq!(handoff["source_agent"], Value::Null);
    assert_eq!(
        handoff["source_agents"],
        json!(["test-unit", "test-integration"])
    );
    let summaries: Vec<&str> = handoff["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["summary"].as_str().unwrap())
        .collect();
    assert_eq!(summaries, ["Mock the clock", "Skip e2e"]);
    assert_eq!(
        handoff["memory_refs"],
        json!(["decision:unit#1/0", "decision:integration#1/0"])
    );
}

#[test]
fn a_loop_back_hands_over_from_the_agent_that_sent_the_run_back() {
    let text = r#"{"id": "loop", "steps": [
        {"id": "code", "type": "agent", "agent": "coder", "next": "review"},
        {"id": "review", "type": "agent", "agent": "reviewer", "next": "check"},
        {"id": "check", "type": "condition", "condition": "context.review.approved === true",
         "then": "ship", "else": "code"},
        {"id": "ship", "type": "transform", "transform": "context.code"}
    ]}"#;
    let mut run = Driver::start(text, json!("x"));
    run.now_ms = START_MS;
    run.answer_with("code", json!("v1"), json!({}));
    run.answer_with(
        "review",
        json!({"approved": false}),
        json!({"decisions": [{"summary": "Rename the hook", "rationale": "clarity"}]}),
    );
    let second = run.answer_with("code", json!("v2"), json!({}));
    assert_eq!(second.task.visit, 2);
    let handoff = second.payload.to_value()["handoff"].clone();
    assert_eq!(handoff["source_agent"], json!("reviewer"));
    assert_eq!(handoff["target_agent"], json!("coder"));
    assert_eq!(handoff["visit"], json!(2));
    assert_eq!(handoff["decisions"][0]["summary"], json!("Rename the hook"));
    let second_review = run.answer_with("review", json!({"approved": true}), json!({}));
    assert_eq!(
        second_review.payload.to_value()["handoff"]["source_agent"],
        json!("coder")
    );
    assert_eq!(run.finished.as_ref().unwrap().0, RunStatus::Succeeded);
    // The run keeps every handoff, in order: code <- reviewer, review <- coder, twice over.
    let kept: Vec<(String, u32, Option<String>)> = run
        .run
        .handoffs()
        .iter()
        .map(|h| (h.step_id.to_string(), h.visit, h.source_agent.clone()))
        .collect();
    assert_eq!(
        kept,
        [
            ("review".into(), 1, Some("coder".into())),
            ("code".into(), 2, Some("reviewer".into())),
            ("review".into(), 2, Some("coder".into())),
        ]
    );
}

#[test]
fn replaying_the_events_at_their_times_rebuilds_messages_decisions_and_handoffs() {
    let mut run = feature_development();
    run.answer_with(
        "plan",
        json!(1),
        json!({"messages": [{"role": "user", "content": "go"}],
               "decisions": [{"summary": "A", "rationale": "b"}]}),
    );
    run.decide("approve-plan", Decision::approve());
    run.answer_with(
        "code",
        json!(2),
        json!({"messages": [{"role": "assistant", "content": "c"}]}),
    );
    run.answer_with(
        "integration",
        json!(3),
        json!({"decisions": [{"summary": "I"}]}),
    );
    let replayed = run.replayed(
        &example("feature-development/workflow.json"),
        json!("Add dark mode toggle"),
    );
    assert_eq!(
        replayed.messages().messages(),
        run.run.messages().messages()
    );
    assert_eq!(replayed.decisions(), run.run.decisions());
    assert_eq!(replayed.handoffs(), run.run.handoffs());
    let pending: Vec<Value> = replayed
        .pending_tasks()
        .iter()
        .map(|t| t.payload.to_value())
        .collect();
    let dispatched = run
        .queue
        .iter()
        .map(|t| t.payload.to_value())
        .collect::<Vec<_>>();
    assert_eq!(
        pending, dispatched,
        "the unit tester's task is rebuilt whole"
    );
}

/// One agent's answer in a chain: its data, messages (some replacing earlier ids) and
/// decisions.
#[derive(Debug, Clone)]
struct Answer {
    data: Value,
    messages: Vec<(Option<u8>, String)>,
    decisions: Vec<String>,
}

fn arb_answer() -> impl Strategy<Value = Answer> {
    (
        prop_oneof![
            any::<i64>().prop_map(Value::from),
            "[a-z ]{0,12}".prop_map(Value::from),
            prop::collection::vec(any::<bool>(), 0..4).prop_map(|v| json!(v)),
        ],
        prop::collection::vec((prop::option::of(0u8..6), "[a-z]{1,8}"), 0..4),
        prop::collection::vec("[a-z ]{1,16}", 0..3),
    )
        .prop_map(|(data, messages, decisions)| Answer {
            data,
            messages,
            decisions,
        })
}

proptest! {
    /// Zero loss: across N handoffs, every result stays in the context, every message is in
    /// the history (replaced only by its own id), every decision is kept and handed to the next
    /// agent, and the last agent receives all of it.
    #[test]
    fn nothing_is_lost_across_random_handoffs(answers in prop::collection::vec(arb_answer(), 2..9)) {
        let steps: Vec<Value> = (0..answers.len())
            .map(|i| json!({"id": format!("s{i}"), "type": "agent", "agent": format!("agent{i}")}))
            .collect();
        let text = json!({"id": "chain", "steps": steps}).to_string();
        let mut run = Driver::start(&text, json!("input"));
        run.now_ms = START_MS;
        let mut expected_messages: Vec<(String, String)> = Vec::new();
        let mut expected_decisions = Vec::new();
        let mut last_payload = Value::Null;
        let mut history_before_last = Vec::new();
        for (i, answer) in answers.iter().enumerate() {
            let step = format!("s{i}");
            if i == answers.len() - 1 {
                history_before_last = expected_messages.clone();
            }
            let messages: Vec<Value> = answer.messages.iter().map(|(id, content)| match id {
                Some(id) => json!({"id": format!("shared-{id}"), "role": "assistant", "content": content}),
                None => json!({"role": "assistant", "content": content}),
            }).collect();
            let decisions: Vec<Value> = answer.decisions.iter()
                .map(|s| json!({"summary": s, "rationale": format!("because {s}")})).collect();
            let task = run.answer_with(&step, answer.data.clone(), json!({"messages": messages, "decisions": decisions}));
            last_payload = task.payload.to_value();
            if i > 0 {
                // The previous agent's decisions are in this agent's handoff.
                let previous: Vec<Value> = last_payload["handoff"]["decisions"].as_array().unwrap()
                    .iter().map(|d| d["summary"].clone()).collect();
                let expected: Vec<Value> = answers[i - 1].decisions.iter().map(|s| json!(s)).collect();
                prop_assert_eq!(previous, expected);
            }
            for (n, (id, content)) in answer.messages.iter().enumerate() {
                let id = match id { Some(id) => format!("shared-{id}"), None => format!("{step}#1/{n}") };
                match expected_messages.iter_mut().find(|(known, _)| *known == id) {
                    Some(entry) => entry.1 = content.clone(),
                    None => expected_messages.push((id, content.clone())),
                }
            }
            expected_decisions.extend(answer.decisions.iter().cloned());
        }
        prop_assert_eq!(run.finished.as_ref().map(|f| f.0), Some(RunStatus::Succeeded));
        let context = run.run.context().to_value();
        let expected_context: BTreeMap<String, Value> = answers.iter().enumerate()
            .map(|(i, a)| (format!("s{i}"), a.data.clone())).collect();
        prop_assert_eq!(context, serde_json::to_value(&expected_context).unwrap());
        let history: Vec<(String, String)> = run.run.messages().messages().iter()
            .map(|m| (m.id.clone(), m.content.as_str().unwrap().to_owned())).collect();
        prop_assert_eq!(&history, &expected_messages);
        let decisions: Vec<String> = run.run.decisions().iter().map(|d| d.summary.clone()).collect();
        prop_assert_eq!(decisions, expected_decisions);
        // The last agent saw every earlier result and the history as it was before its turn.
        let last = answers.len() - 1;
        for (i, answer) in answers.iter().enumerate().take(last) {
            prop_assert_eq!(&last_payload["context"][format!("s{i}")], &answer.data);
        }
        // ...and the history exactly as it stood before the last agent's own messages.
        let seen: Vec<(String, String)> = last_payload["messages"].as_array().unwrap().iter()
            .map(|m| (m["id"].as_str().unwrap().to_owned(), m["content"].as_str().unwrap().to_owned()))
            .collect();
        prop_assert_eq!(seen, history_before_last);
    }
}

/// A parallel step inside another: nothing of the inner one is applied before the outer one
/// settles, so every branch gets the same history, the merge keeps workflow order, and the
/// agent after it is handed over by every agent of both.
#[test]
fn a_nested_parallel_step_hands_over_all_its_agents_in_workflow_order() {
    let text = r#"{"id": "nested", "steps": [
        {"id": "plan", "type": "agent", "agent": "planner", "next": "fan"},
        {"id": "fan", "type": "parallel", "next": "review", "steps": [
            {"id": "first", "type": "agent", "agent": "alpha"},
            {"id": "inner", "type": "parallel", "steps": [
                {"id": "a", "type": "agent", "agent": "beta"},
                {"id": "b", "type": "agent", "agent": "gamma"}
            ]}
        ]},
        {"id": "review", "type": "agent", "agent": "reviewer"}
    ]}"#;
    let mut run = Driver::start(text, json!("x"));
    run.now_ms = START_MS;
    run.answer_with("plan", json!(0), json!({}));
    let say = |what: &str| {
        json!({"messages": [{"role": "assistant", "content": what}],
                                  "decisions": [{"summary": what}]})
    };
    run.answer_with("a", json!(1), say("a"));
    run.answer_with("b", json!(2), say("b"));
    // The inner parallel step has settled; `first` still runs on the history it started with,
    // and a replay rebuilds its payload exactly as it was sent.
    let first = run
        .queue
        .iter()
        .find(|t| t.task.step_id.as_ref() == "first")
        .unwrap()
        .clone();
    assert!(run.run.messages().messages().is_empty());
    let replayed = run.replayed(text, json!("x"));
    let rebuilt = replayed
        .pending_tasks()
        .into_iter()
        .find(|t| t.task.step_id.as_ref() == "first")
        .unwrap();
    assert_eq!(rebuilt.payload.to_value(), first.payload.to_value());

    run.answer_with("first", json!(3), say("first"));
    let review = run.queue.front().unwrap().payload.to_value();
    assert_eq!(
        review["handoff"]["source_agents"],
        json!(["alpha", "beta", "gamma"])
    );
    assert_eq!(
        ids(&review["messages"]),
        ["first#1/0", "a#1/0", "b#1/0"],
        "workflow order, not the order they answered in"
    );
    let summaries: Vec<&str> = review["handoff"]["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["summary"].as_str().unwrap())
        .collect();
    assert_eq!(summaries, ["first", "a", "b"]);
}

#[test]
fn memory_refs_name_each_kept_message_once() {
    let mut run = feature_development();
    run.answer_with(
        "plan",
        json!(1),
        json!({"messages": [
            {"id": "x", "role": "assistant", "content": "draft"},
            {"id": "x", "role": "assistant", "content": "final"},
            {"id": "gone", "role": "assistant", "content": "scratch"},
            {"type": "remove", "id": "gone"}
        ]}),
    );
    run.decide("approve-plan", Decision::approve());
    let coder = run.answer_with("code", json!(2), json!({}));
    assert_eq!(
        coder.payload.to_value()["handoff"]["memory_refs"],
        json!(["message:x"])
    );
    assert_eq!(ids(&coder.payload.to_value()["messages"]), ["x"]);
}

#[test]
fn a_history_past_its_limit_fails_the_step_naming_the_limit() {
    let mut run = feature_development();
    let messages: Vec<Value> = (0..=baton_core::messages::MAX_HISTORY)
        .map(|i| json!({"role": "assistant", "content": i}))
        .collect();
    run.answer_with("plan", json!(1), json!({"messages": messages}));
    let plan = run.run.history().front().unwrap();
    let error = plan.error.as_deref().unwrap();
    assert!(
        error.contains("the history would hold 10001 messages; the limit is 10000"),
        "{error}"
    );
    assert!(run.run.messages().messages().is_empty(), "nothing was kept");
}
