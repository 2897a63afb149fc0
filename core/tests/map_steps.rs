//! Map steps in the engine: items from paths and jq, chains per item, the concurrency cap,
//! tolerated failures, message order, replay and redrive.

mod common;

use std::collections::BTreeMap;

use baton_core::handoff::AgentNotes;
use baton_core::workflow::StepType;
use baton_core::{
    AgentTask, EngineError, Event, MapProgress, Run, RunStatus, StepRecord, StepStatus, TaskId,
    Waiting,
};
use common::{Driver, spec, workflow};
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn item_task(step: &str, visit: u32, index: u32) -> TaskId {
    TaskId {
        step_id: step.into(),
        visit,
        item: Some(index),
    }
}

/// The tasks waiting for an answer, in dispatch order.
fn queued(d: &Driver) -> Vec<TaskId> {
    d.queue.iter().map(|t| t.task.clone()).collect()
}

/// Applies `event`; the tasks the engine abandoned leave the queue (nobody answers them).
fn apply(d: &mut Driver, event: Event) {
    d.apply(event);
    let abandoned = d.abandoned.clone();
    d.queue.retain(|t| !abandoned.contains(&t.task));
}

/// Takes the task item `index` waits for out of the queue.
fn take_item(d: &mut Driver, index: u32) -> AgentTask {
    let position = d
        .queue
        .iter()
        .position(|t| t.task.item == Some(index))
        .unwrap_or_else(|| panic!("item {index} waits for no agent; queue: {:?}", queued(d)));
    d.queue.remove(position).unwrap()
}

/// Answers the task item `index` waits for (at whatever step of its chain).
fn answer_item(d: &mut Driver, index: u32, result: Result<Value, &str>) -> AgentTask {
    let task = take_item(d, index);
    let event = match result {
        Ok(data) => Event::AgentSucceeded {
            task: task.task.clone(),
            data: data.into(),
            notes: AgentNotes::default(),
        },
        Err(error) => Event::AgentFailed {
            task: task.task.clone(),
            error: error.to_owned(),
        },
    };
    apply(d, event);
    task
}

/// Answers item `index` with data and notes (`{"messages": [...], "decisions": [...]}`).
fn answer_item_with(d: &mut Driver, index: u32, data: Value, notes: Value) -> AgentTask {
    let task = take_item(d, index);
    let notes =
        AgentNotes::from_json(notes.to_string().as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    apply(
        d,
        Event::AgentSucceeded {
            task: task.task.clone(),
            data: data.into(),
            notes,
        },
    );
    task
}

/// The item tasks dispatched since the `from`th dispatch.
fn started_since(d: &Driver, from: usize) -> Vec<TaskId> {
    d.dispatched[from..]
        .iter()
        .filter(|t| t.task.item.is_some())
        .map(|t| t.task.clone())
        .collect()
}

/// How many times each item was dispatched, over the whole run.
fn dispatch_counts(d: &Driver) -> BTreeMap<u32, usize> {
    let mut counts = BTreeMap::new();
    for task in &d.dispatched {
        if let Some(i) = task.task.item {
            *counts.entry(i).or_default() += 1;
        }
    }
    counts
}

fn fulfilled(index: usize, result: Value) -> Value {
    json!({"index": index, "status": "fulfilled", "result": result, "error": null})
}

fn rejected(index: usize, error: &str) -> Value {
    json!({"index": index, "status": "rejected", "result": null, "error": error})
}

/// The visible context's data under `key` (`null` when absent).
fn context_of(run: &Run, key: &str) -> Value {
    run.context().to_value()[key].clone()
}

/// The top-level history records of `step_id`, in order.
fn records<'a>(run: &'a Run, step_id: &str) -> Vec<&'a StepRecord> {
    run.history()
        .iter()
        .filter(|r| r.step_id.as_ref() == step_id && r.item.is_none())
        .collect()
}

/// The history records of the map items, as (step, item).
fn item_records(run: &Run) -> Vec<(String, u32)> {
    run.history()
        .iter()
        .filter_map(|r| Some((r.step_id.to_string(), r.item?)))
        .collect()
}

fn queued_agent(d: &Driver, step_id: &str) -> AgentTask {
    d.queue
        .iter()
        .find(|t| t.task.step_id.as_ref() == step_id)
        .unwrap_or_else(|| panic!("{step_id} is not queued; queue: {:?}", queued(d)))
        .clone()
}

fn run_error(d: &Driver) -> String {
    match &d.finished {
        Some((RunStatus::Failed, Some(error))) => error.clone(),
        other => panic!("expected a failed run; finished: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Items
// ---------------------------------------------------------------------------------------------

/// A planner lists files; a map tests each (two at a time); a reviewer reads the results.
const PER_FILE: &str = r#"{"steps": [
    {"id": "plan", "type": "agent", "agent": "planner"},
    {"id": "test-each", "type": "map", "items": "context.plan.files", "agent": "tester",
     "max_concurrency": 2, "output": "file-tests", "next": "review"},
    {"id": "review", "type": "agent", "agent": "reviewer"}
]}"#;

#[test]
fn items_from_a_context_path_run_the_agent_once_each_and_collect_in_item_order() {
    let mut d = Driver::start(PER_FILE, json!("go"));
    d.answer("plan", Ok(json!({"files": ["a.rs", "b.rs", "c.rs"]})));
    assert_eq!(
        queued(&d),
        [item_task("test-each", 1, 0), item_task("test-each", 1, 1)]
    );
    let first = d.queue[0].clone();
    assert_eq!(first.agent, "tester");
    assert_eq!(
        spec(&first.payload),
        json!({
            "input": "go",
            "context": {"plan": {"files": ["a.rs", "b.rs", "c.rs"]}},
            "map": {"step": "test-each", "item": "a.rs", "index": 0, "count": 3}
        })
    );

    answer_item(&mut d, 1, Ok(json!({"passed": 2})));
    assert_eq!(queued(&d)[1], item_task("test-each", 1, 2));
    assert_eq!(
        d.queue[1].payload.to_value()["map"],
        json!({"step": "test-each", "item": "c.rs", "index": 2, "count": 3})
    );
    answer_item(&mut d, 2, Ok(json!({"passed": 3})));
    assert_eq!(
        d.run.map_progress(),
        [MapProgress {
            step_id: "test-each".into(),
            visit: 1,
            count: 3,
            succeeded: 2,
            failed: 0,
            running: 1,
        }]
    );
    answer_item(&mut d, 0, Ok(json!({"passed": 1})));
    assert!(d.run.map_progress().is_empty());

    let expected = json!({"success": true, "data": [
        fulfilled(0, json!({"passed": 1})),
        fulfilled(1, json!({"passed": 2})),
        fulfilled(2, json!({"passed": 3})),
    ]});
    let review = queued_agent(&d, "review");
    assert_eq!(review.payload.to_value()["context"]["file-tests"], expected);
    assert!(
        review.payload.to_value()["context"]
            .get("test-each")
            .is_none(),
        "stored under its output only"
    );
    let map = records(&d.run, "test-each");
    assert_eq!(map.len(), 1);
    assert_eq!(map[0].status, StepStatus::Succeeded);
    assert_eq!(map[0].step_type, StepType::Map);
    assert_eq!(map[0].next.as_deref(), Some("review"));
    assert_eq!(map[0].data.as_deref(), Some(&expected));
    // One record per item, in the order they settled, each naming its map step.
    assert_eq!(
        item_records(&d.run),
        [
            ("test-each".to_owned(), 1),
            ("test-each".to_owned(), 2),
            ("test-each".to_owned(), 0)
        ]
    );
    assert!(
        d.run
            .history()
            .iter()
            .filter(|r| r.item.is_some())
            .all(|r| {
                r.parent.as_deref() == Some("test-each") && r.step_type == StepType::Agent
            })
    );
    d.answer("review", Ok(json!("ok")));
    assert_eq!(d.finished, Some((RunStatus::Succeeded, None)));
}

#[test]
fn items_from_an_input_path_and_from_jq() {
    let text = r#"{"steps": [
        {"id": "each", "type": "map", "items": "input.todo", "agent": "worker"},
        {"id": "lint", "type": "map",
         "items": "jq: [.input.files[] | select(endswith(\".rs\")) | {name: ., n: length}]",
         "agent": "linter"}
    ]}"#;
    let mut d = Driver::start(
        text,
        json!({"todo": [1, 2], "files": ["a.rs", "b.md", "lib.rs"]}),
    );
    assert_eq!(
        queued(&d),
        [item_task("each", 1, 0), item_task("each", 1, 1)]
    );
    assert_eq!(d.queue[1].payload.to_value()["map"]["item"], json!(2));
    answer_item(&mut d, 0, Ok(json!("one")));
    answer_item(&mut d, 1, Ok(json!("two")));
    assert_eq!(
        queued(&d),
        [item_task("lint", 1, 0), item_task("lint", 1, 1)]
    );
    assert_eq!(
        d.queue[1].payload.to_value()["map"],
        json!({"step": "lint", "item": {"name": "lib.rs", "n": 6}, "index": 1, "count": 2})
    );
    // The second map's items see the first map's data.
    assert_eq!(
        d.queue[0].payload.to_value()["context"]["each"]["data"][1]["result"],
        json!("two")
    );
    answer_item(&mut d, 1, Ok(json!(true)));
    answer_item(&mut d, 0, Ok(json!(false)));
    assert_eq!(d.finished, Some((RunStatus::Succeeded, None)));
    assert_eq!(
        context_of(&d.run, "lint"),
        json!({"success": true, "data": [fulfilled(0, json!(false)), fulfilled(1, json!(true))]})
    );
}

#[test]
fn an_empty_list_succeeds_at_once() {
    let text = r#"{"steps": [
        {"id": "each", "type": "map", "items": "input.files", "agent": "tester", "tolerated_failures": "10%"},
        {"id": "after", "type": "transform", "transform": "context.each"}
    ]}"#;
    let transition = Run::start(workflow(text), json!({"files": []}));
    assert!(
        !transition
            .actions
            .iter()
            .any(|a| matches!(a, baton_core::Action::Dispatch(_))),
        "nothing to dispatch"
    );
    let run = transition.run;
    assert_eq!(run.status(), RunStatus::Succeeded);
    assert_eq!(
        context_of(&run, "each"),
        json!({"success": true, "data": []})
    );
    assert_eq!(
        context_of(&run, "after"),
        json!({"success": true, "data": []})
    );
    assert_eq!(records(&run, "each")[0].status, StepStatus::Succeeded);
    assert_eq!(run.visits("each"), 1);
}

#[test]
fn items_that_are_not_an_array_fail_the_step_naming_what_they_gave() {
    let text = r#"{"steps": [
        {"id": "each", "type": "map", "items": "input.files", "agent": "tester"},
        {"id": "after", "type": "agent", "agent": "closer"}
    ]}"#;
    for (files, gave) in [
        (json!({"a": 1, "b": 2}), "an object with 2 fields"),
        (json!("abc"), "a string (\"abc\")"),
        (json!(3), "a number (3)"),
        (json!(true), "a boolean (true)"),
        (json!(null), "null"),
    ] {
        let run = Run::start(workflow(text), json!({"files": files})).run;
        assert_eq!(run.status(), RunStatus::Failed, "{files}");
        assert_eq!(
            run.error(),
            Some(
                format!(
                    "step \"each\" failed: items must give an array; \"input.files\" gave {gave}"
                )
                .as_str()
            )
        );
        assert_eq!(run.visits("after"), 0);
        assert_eq!(records(&run, "each")[0].status, StepStatus::Failed);
    }
    // A path that finds nothing fails too, naming the items.
    let run = Run::start(workflow(text), json!({"other": []})).run;
    let error = run.error().unwrap();
    assert!(error.contains("items \"input.files\""), "{error}");

    // A jq program's value is checked the same way.
    let jq = r#"{"steps": [{"id": "each", "type": "map", "items": "jq: .input | length", "agent": "t"}]}"#;
    // Its map step runs jq, so the run waits for its turn to compute before it enters it.
    let started = Run::start(workflow(jq), json!([1, 2, 3])).run;
    assert_eq!(started.status(), RunStatus::Running);
    assert_eq!(started.continuation().map(|s| s.as_ref()), Some("each"));
    let run = started.apply(Event::Continue).unwrap().run;
    let error = run.error().unwrap();
    assert!(
        error.contains("items must give an array; \"jq: .input | length\" gave a number (3)"),
        "{error}"
    );
}

#[test]
fn a_failing_items_path_routes_to_on_error_with_the_reason() {
    let text = r#"{"steps": [
        {"id": "each", "type": "map", "items": "input.files", "agent": "tester", "on_error": "triage"},
        {"id": "after", "type": "agent", "agent": "closer", "end": true},
        {"id": "triage", "type": "agent", "agent": "triager"}
    ]}"#;
    let d = Driver::start(text, json!({"files": {"a": 1, "b": 2}}));
    let triage = queued_agent(&d, "triage");
    assert_eq!(
        triage.payload.to_value()["error"],
        json!({"step": "each", "message": "items must give an array; \"input.files\" gave an object with 2 fields"})
    );
}

#[test]
fn more_items_than_the_limit_fail_the_step() {
    assert_eq!(baton_core::MAX_MAP_ITEMS, 100_000);
    let text = r#"{"steps": [
        {"id": "each", "type": "map", "items": "input", "steps": [
            {"id": "index", "type": "transform", "transform": "map.index"}
        ]}
    ]}"#;
    let run = Run::start(workflow(text), Value::Array(vec![Value::Null; 100_001])).run;
    assert_eq!(run.status(), RunStatus::Failed);
    let error = run.error().unwrap();
    assert!(
        error.contains("gave 100001 items; a map step takes at most 100000"),
        "{error}"
    );
    // The limit itself is allowed.
    let run = Run::start(workflow(text), Value::Array(vec![Value::Null; 100_000])).run;
    assert_eq!(run.status(), RunStatus::Succeeded, "{:?}", run.error());
    assert_eq!(
        context_of(&run, "each")["data"][99_999],
        fulfilled(99_999, json!(99_999))
    );
}

// ---------------------------------------------------------------------------------------------
// Chains
// ---------------------------------------------------------------------------------------------

/// Big files are split by an agent and joined by a transform; small ones need no agent.
const ROUTED: &str = r#"{"steps": [
    {"id": "each", "type": "map", "items": "input.files", "max_concurrency": 5, "steps": [
        {"id": "size", "type": "condition", "condition": "map.item.big === true", "then": "split", "else": "quick"},
        {"id": "split", "type": "agent", "agent": "splitter", "next": "join"},
        {"id": "quick", "type": "transform", "transform": "map.item.name", "end": true},
        {"id": "join", "type": "transform", "transform": "context.split.parts"}
    ]},
    {"id": "done", "type": "agent", "agent": "closer"}
]}"#;

#[test]
fn a_chain_routes_each_item_by_its_own_condition() {
    let input = json!({"files": [
        {"name": "a", "big": true},
        {"name": "b", "big": false},
        {"name": "c", "big": true}
    ]});
    let mut d = Driver::start(ROUTED, input.clone());
    // Item 1 needed no agent and is done; the big ones wait for the splitter. A chain step's
    // visits are counted over every item.
    assert_eq!(
        queued(&d),
        [item_task("split", 1, 0), item_task("split", 2, 2)]
    );
    assert_eq!(d.queue[0].agent, "splitter");
    assert_eq!(
        (
            d.run.visits("size"),
            d.run.visits("split"),
            d.run.visits("quick"),
            d.run.visits("join")
        ),
        (3, 2, 1, 0)
    );
    assert_eq!(
        spec(&d.queue[1].payload),
        json!({
            "input": input,
            "context": {},
            "map": {"step": "each", "item": {"name": "c", "big": true}, "index": 2, "count": 3}
        })
    );
    assert_eq!(
        d.run.map_progress()[0],
        MapProgress {
            step_id: "each".into(),
            visit: 1,
            count: 3,
            succeeded: 1,
            failed: 0,
            running: 2,
        }
    );

    answer_item(&mut d, 2, Ok(json!({"parts": ["c1", "c2"]})));
    answer_item(&mut d, 0, Ok(json!({"parts": ["a1"]})));
    let done = queued_agent(&d, "done");
    assert_eq!(
        done.payload.to_value()["context"],
        json!({"each": {"success": true, "data": [
            fulfilled(0, json!(["a1"])),
            fulfilled(1, json!("b")),
            fulfilled(2, json!(["c1", "c2"])),
        ]}}),
        "the chain's results stay in the items' own contexts"
    );
    let item_1: Vec<_> = d
        .run
        .history()
        .iter()
        .filter(|r| r.item == Some(1))
        .map(|r| {
            (
                r.step_id.to_string(),
                r.step_type,
                r.data.as_deref().cloned(),
            )
        })
        .collect();
    assert_eq!(
        item_1,
        [
            (
                "size".to_owned(),
                StepType::Condition,
                Some(json!({"result": false}))
            ),
            ("quick".to_owned(), StepType::Transform, Some(json!("b"))),
        ]
    );
}

#[test]
fn chain_transforms_read_map_and_an_item_without_data_gives_null() {
    let text = r#"{"steps": [
        {"id": "each", "type": "map", "items": "input", "steps": [
            {"id": "gate", "type": "condition", "condition": "map.index === 0", "then": "calc", "else": "stop"},
            {"id": "calc", "type": "transform", "transform": "jq: {i: .map.index, n: .map.count, item: .map.item, seen: (.context | keys)}", "end": true},
            {"id": "stop", "type": "condition", "condition": "true", "else": "calc"}
        ]}
    ]}"#;
    let run = Run::start(workflow(text), json!(["x", "y"]))
        .run
        .apply(Event::Continue)
        .unwrap()
        .run;
    assert_eq!(run.status(), RunStatus::Succeeded, "{:?}", run.error());
    assert_eq!(
        context_of(&run, "each"),
        json!({"success": true, "data": [
            fulfilled(0, json!({"i": 0, "n": 2, "item": "x", "seen": []})),
            fulfilled(1, Value::Null),
        ]})
    );
}

/// Each item is drafted, then checked with the draft as its reference.
const DRAFTS: &str = r#"{"steps": [
    {"id": "plan", "type": "agent", "agent": "planner"},
    {"id": "each", "type": "map", "items": "context.plan.parts", "steps": [
        {"id": "draft", "type": "agent", "agent": "drafter"},
        {"id": "check", "type": "agent", "agent": "checker", "input": "draft"}
    ]},
    {"id": "after", "type": "agent", "agent": "closer"}
]}"#;

#[test]
fn an_items_payload_carries_map_and_its_own_chain_results_only() {
    let mut d = Driver::start(DRAFTS, json!("go"));
    d.answer("plan", Ok(json!({"parts": ["x", "y"]})));
    assert_eq!(
        queued(&d),
        [item_task("draft", 1, 0), item_task("draft", 2, 1)]
    );
    let plan = json!({"parts": ["x", "y"]});
    assert_eq!(
        spec(&d.queue[0].payload),
        json!({
            "input": "go",
            "context": {"plan": plan},
            "map": {"step": "each", "item": "x", "index": 0, "count": 2}
        })
    );
    // The first agent of a chain takes over from the agents before the map.
    let handoff = d.queue[0].payload.to_value()["handoff"].clone();
    assert_eq!(handoff["source_agents"], json!(["planner"]));
    assert_eq!(handoff["item"], json!(0));

    answer_item(&mut d, 1, Ok(json!("dy")));
    let check_1 = d.queue.back().unwrap().clone();
    assert_eq!(check_1.task, item_task("check", 1, 1));
    assert_eq!(
        spec(&check_1.payload),
        json!({
            "input": "go",
            "context": {"plan": plan, "draft": "dy"},
            "draft": "dy",
            "map": {"step": "each", "item": "y", "index": 1, "count": 2}
        })
    );
    let handoff = check_1.payload.to_value()["handoff"].clone();
    assert_eq!(handoff["source_agents"], json!(["drafter"]));
    assert_eq!(handoff["item"], json!(1));

    answer_item(&mut d, 0, Ok(json!("dx")));
    let check_0 = d.queue.back().unwrap().clone();
    assert_eq!(check_0.task, item_task("check", 2, 0));
    assert_eq!(
        check_0.payload.to_value()["context"],
        json!({"plan": plan, "draft": "dx"}),
        "an item never sees another item's results"
    );

    answer_item(&mut d, 0, Ok(json!("ok x")));
    answer_item(&mut d, 1, Ok(json!("ok y")));
    let after = queued_agent(&d, "after");
    assert_eq!(
        after.payload.to_value()["context"],
        json!({"plan": plan, "each": {"success": true, "data": [
            fulfilled(0, json!("ok x")),
            fulfilled(1, json!("ok y")),
        ]}})
    );
    // The next agent step takes over from the items' agents, in index order.
    assert_eq!(
        after.payload.to_value()["handoff"]["source_agents"],
        json!(["drafter", "checker", "drafter", "checker"])
    );
}

#[test]
fn on_error_inside_a_chain_recovers_an_item_and_without_it_the_item_is_rejected() {
    let text = r#"{"steps": [
        {"id": "each", "type": "map", "items": "input", "steps": [
            {"id": "work", "type": "agent", "agent": "worker", "on_error": "rescue"},
            {"id": "finish", "type": "transform", "transform": "context.work.value", "end": true},
            {"id": "rescue", "type": "agent", "agent": "rescuer"}
        ]},
        {"id": "after", "type": "agent", "agent": "closer"}
    ]}"#;
    let mut d = Driver::start(text, json!(["a", "b", "c", "d"]));
    answer_item(&mut d, 0, Ok(json!({"value": 1})));
    answer_item(&mut d, 1, Err("boom"));
    let rescue = d.queue.back().unwrap().clone();
    assert_eq!(rescue.task, item_task("rescue", 1, 1));
    assert_eq!(
        rescue.payload.to_value()["error"],
        json!({"step": "work", "message": "boom"})
    );
    // The failed step's result does not enter the item's context.
    assert_eq!(rescue.payload.to_value()["context"], json!({}));
    answer_item(&mut d, 1, Ok(json!("saved")));
    answer_item(&mut d, 2, Err("boom again"));
    answer_item(&mut d, 2, Err("still broken"));
    // A transform failing with no on_error rejects its item too.
    answer_item(&mut d, 3, Ok(json!({"other": true})));
    let data = context_of(&d.run, "each");
    assert_eq!(data["success"], json!(false));
    assert_eq!(data["data"][0], fulfilled(0, json!(1)));
    assert_eq!(data["data"][1], fulfilled(1, json!("saved")));
    assert_eq!(data["data"][2], rejected(2, "still broken"));
    assert_eq!(data["data"][3]["status"], json!("rejected"));
    assert!(
        data["data"][3]["error"]
            .as_str()
            .unwrap()
            .contains("context.work.value"),
        "{data}"
    );
    // Without tolerated_failures, failed items do not fail the step: the run goes on.
    let map = records(&d.run, "each");
    assert_eq!(map[0].next.as_deref(), Some("after"));
    assert!(d.queue.iter().any(|t| t.task.step_id.as_ref() == "after"));
}

#[test]
fn failed_items_without_a_tolerance_route_to_on_error_if_set() {
    let text = r#"{"steps": [
        {"id": "each", "type": "map", "items": "input", "agent": "worker", "on_error": "triage"},
        {"id": "after", "type": "agent", "agent": "closer", "end": true},
        {"id": "triage", "type": "agent", "agent": "triager"}
    ]}"#;
    let mut d = Driver::start(text, json!([1, 2]));
    answer_item(&mut d, 0, Err("nope"));
    answer_item(&mut d, 1, Ok(json!(2)));
    let triage = queued_agent(&d, "triage");
    assert_eq!(triage.payload.to_value()["error"]["step"], json!("each"));
    // The error names the failed items.
    let message = triage.payload.to_value()["error"]["message"].clone();
    let message = message.as_str().unwrap();
    assert!(
        message.contains("item 0") && message.contains("nope"),
        "{message}"
    );
    assert_eq!(
        triage.payload.to_value()["context"]["each"],
        json!({"success": false, "data": [rejected(0, "nope"), fulfilled(1, json!(2))]})
    );
    assert_eq!(d.run.visits("after"), 0);
}

#[test]
fn a_looping_chain_stops_at_its_visit_limit_in_each_item() {
    let text = r#"{"steps": [
        {"id": "each", "type": "map", "items": "input", "steps": [
            {"id": "spin", "type": "condition", "condition": "true", "then": "spin", "max_visits": 3}
        ]}
    ]}"#;
    let run = Run::start(workflow(text), json!([1, 2])).run;
    let data = context_of(&run, "each");
    for i in 0..2 {
        let error = data["data"][i]["error"].as_str().unwrap();
        assert!(
            error.contains(&format!(
                "step \"spin\" reached its limit of 3 visits in item {i}"
            )),
            "{error}"
        );
    }
    // The limit is per item: both items ran their three visits.
    assert_eq!(run.visits("spin"), 6);
}

// ---------------------------------------------------------------------------------------------
// The concurrency cap
// ---------------------------------------------------------------------------------------------

#[test]
fn at_most_max_concurrency_items_wait_and_the_next_starts_as_one_settles() {
    let text = r#"{"steps": [
        {"id": "each", "type": "map", "items": "input", "agent": "worker", "max_concurrency": 2}
    ]}"#;
    let mut d = Driver::start(text, json!(["a", "b", "c", "d", "e"]));
    assert_eq!(
        started_since(&d, 0),
        [item_task("each", 1, 0), item_task("each", 1, 1)]
    );
    fn step(d: &mut Driver, answer: u32, ok: bool) -> Vec<TaskId> {
        let before = d.dispatched.len();
        answer_item(d, answer, if ok { Ok(json!(answer)) } else { Err("no") });
        assert!(d.queue.len() <= 2, "{:?}", queued(d));
        started_since(d, before)
    }
    assert_eq!(step(&mut d, 1, true), [item_task("each", 1, 2)]);
    // A failure frees a slot too.
    assert_eq!(step(&mut d, 2, false), [item_task("each", 1, 3)]);
    assert_eq!(step(&mut d, 0, true), [item_task("each", 1, 4)]);
    assert_eq!(d.run.map_progress()[0].running, 2);
    assert_eq!(step(&mut d, 4, true), []);
    assert_eq!(step(&mut d, 3, true), []);
    assert_eq!(d.finished, Some((RunStatus::Succeeded, None)));
    assert_eq!(
        dispatch_counts(&d).values().copied().collect::<Vec<_>>(),
        [1; 5]
    );
}

#[test]
fn without_max_concurrency_every_item_starts_at_once() {
    let text = r#"{"steps": [{"id": "each", "type": "map", "items": "input", "agent": "worker"}]}"#;
    let items: Vec<Value> = (0..50).map(|i| json!(i)).collect();
    let d = Driver::start(text, Value::Array(items));
    assert_eq!(d.queue.len(), 50);
    assert_eq!(d.run.waiting().len(), 50);
    assert_eq!(
        d.run.waiting()[49],
        Waiting::Agent {
            task: item_task("each", 1, 49),
            agent: "worker".into()
        }
    );
}

#[test]
fn items_that_need_no_agent_do_not_count_against_the_cap() {
    let text = r#"{"steps": [
        {"id": "each", "type": "map", "items": "input", "max_concurrency": 1, "steps": [
            {"id": "gate", "type": "condition", "condition": "map.item === 'agent'", "then": "ask", "else": "skip"},
            {"id": "ask", "type": "agent", "agent": "asker", "end": true},
            {"id": "skip", "type": "transform", "transform": "map.index"}
        ]}
    ]}"#;
    let mut d = Driver::start(
        text,
        json!(["quick", "agent", "quick", "quick", "agent", "quick"]),
    );
    // Items 0 settles, 1 waits; the cap holds the rest back.
    assert_eq!(queued(&d), [item_task("ask", 1, 1)]);
    assert_eq!(d.run.map_progress()[0].succeeded, 1);
    let before = d.dispatched.len();
    answer_item(&mut d, 1, Ok(json!("one")));
    // 2 and 3 settle on the way, 4 waits.
    assert_eq!(started_since(&d, before), [item_task("ask", 2, 4)]);
    answer_item(&mut d, 4, Ok(json!("four")));
    assert_eq!(d.finished, Some((RunStatus::Succeeded, None)));
    let results: Vec<Value> = context_of(&d.run, "each")["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["result"].clone())
        .collect();
    assert_eq!(
        results,
        [
            json!(0),
            json!("one"),
            json!(2),
            json!(3),
            json!("four"),
            json!(5)
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Tolerated failures
// ---------------------------------------------------------------------------------------------

/// A map that tolerates one failed item (two at a time), with an on_error handler.
const TOLERANT: &str = r#"{"steps": [
    {"id": "each", "type": "map", "items": "input", "agent": "tester", "max_concurrency": 2,
     "tolerated_failures": 1, "on_error": "triage", "output": "results"},
    {"id": "done", "type": "transform", "transform": "context.results", "end": true},
    {"id": "triage", "type": "agent", "agent": "triager"}
]}"#;

#[test]
fn failures_up_to_the_tolerated_count_let_the_step_succeed_and_go_next() {
    let mut d = Driver::start(TOLERANT, json!(["a", "b", "c"]));
    answer_item(&mut d, 0, Err("flaky"));
    answer_item(&mut d, 1, Ok(json!("B")));
    answer_item(&mut d, 2, Ok(json!("C")));
    assert_eq!(d.finished, Some((RunStatus::Succeeded, None)));
    assert!(d.abandoned.is_empty());
    assert_eq!(
        d.run.visits("triage"),
        0,
        "a tolerated failure is not an error"
    );
    let expected = json!({"success": false, "data": [
        rejected(0, "flaky"),
        fulfilled(1, json!("B")),
        fulfilled(2, json!("C")),
    ]});
    assert_eq!(context_of(&d.run, "done"), expected);
    let map = records(&d.run, "each");
    assert_eq!(
        (map[0].status, map[0].next.as_deref(), map[0].error.clone()),
        (StepStatus::Succeeded, Some("done"), None)
    );
}

#[test]
fn more_failures_than_tolerated_abandon_the_items_in_flight_and_fail_the_step() {
    let mut d = Driver::start(TOLERANT, json!(["a", "b", "c", "d", "e", "f"]));
    answer_item(&mut d, 0, Err("e0"));
    assert_eq!(
        queued(&d),
        [item_task("each", 1, 1), item_task("each", 1, 2)]
    );
    let before = d.dispatched.len();
    answer_item(&mut d, 1, Err("e1"));
    assert_eq!(d.abandoned, [item_task("each", 1, 2)]);
    assert_eq!(started_since(&d, before), [], "unstarted items never start");
    let why = "2 of 6 items failed; tolerated_failures is 1";
    let data = json!({"success": false, "data": [
        rejected(0, "e0"),
        rejected(1, "e1"),
        rejected(2, &format!("abandoned: {why}")),
        rejected(3, &format!("not run: {why}")),
        rejected(4, &format!("not run: {why}")),
        rejected(5, &format!("not run: {why}")),
    ]});
    assert_eq!(context_of(&d.run, "results"), data);
    let triage = queued_agent(&d, "triage");
    let error = &triage.payload.to_value()["error"];
    assert_eq!(error["step"], json!("each"));
    assert!(error["message"].as_str().unwrap().contains(why), "{error}");
    let map = records(&d.run, "each");
    assert_eq!(
        (map[0].status, map[0].next.as_deref()),
        (StepStatus::Failed, Some("triage"))
    );
    assert!(map[0].error.as_deref().unwrap().contains(why));
    // The abandoned item's late answer is refused.
    let late = d.run.apply(Event::AgentSucceeded {
        task: item_task("each", 1, 2),
        data: json!("C").into(),
        notes: AgentNotes::default(),
    });
    assert!(
        matches!(&late, Err(EngineError::UnknownTask(task)) if *task == item_task("each", 1, 2)),
        "{late:?}"
    );
    assert!(d.run.map_progress().is_empty());
}

/// Ten items at once, 20% of them tolerated, no on_error.
const PERCENT: &str = r#"{"steps": [
    {"id": "each", "type": "map", "items": "input", "agent": "tester", "tolerated_failures": "20%"},
    {"id": "done", "type": "transform", "transform": "context.each"}
]}"#;

#[test]
fn a_percentage_tolerates_that_share_of_the_items() {
    let items: Vec<Value> = (0..10).map(|i| json!(i)).collect();
    let mut d = Driver::start(PERCENT, Value::Array(items));
    for i in 0..10 {
        answer_item(
            &mut d,
            i,
            if i == 3 || i == 7 {
                Err("x")
            } else {
                Ok(json!(i))
            },
        );
    }
    assert_eq!(d.finished, Some((RunStatus::Succeeded, None)));
    let data = context_of(&d.run, "done");
    assert_eq!(data["success"], json!(false));
    assert_eq!(data["data"][7], rejected(7, "x"));
    assert_eq!(data["data"][8], fulfilled(8, json!(8)));
}

#[test]
fn more_than_the_percentage_fails_the_run_at_once() {
    let items: Vec<Value> = (0..10).map(|i| json!(i)).collect();
    let mut d = Driver::start(PERCENT, Value::Array(items));
    for i in 0..5 {
        answer_item(&mut d, i, Ok(json!(i)));
    }
    answer_item(&mut d, 5, Err("x5"));
    answer_item(&mut d, 6, Err("x6"));
    assert!(d.finished.is_none(), "two of ten is 20%");
    answer_item(&mut d, 7, Err("x7"));
    assert_eq!(
        d.abandoned,
        [item_task("each", 1, 8), item_task("each", 1, 9)]
    );
    assert!(d.queue.is_empty());
    let error = run_error(&d);
    assert_eq!(
        error,
        "step \"each\" failed: 3 of 10 items failed; tolerated_failures is 20%"
    );
    let data = context_of(&d.run, "each");
    assert_eq!(data["data"][4], fulfilled(4, json!(4)));
    assert_eq!(data["data"][7], rejected(7, "x7"));
    for i in [8, 9] {
        assert_eq!(
            data["data"][i],
            rejected(
                i,
                "abandoned: 3 of 10 items failed; tolerated_failures is 20%"
            )
        );
    }
    assert_eq!(d.run.visits("done"), 0);
    assert_eq!(d.run.redrive_target(), Ok("each".into()));
}

#[test]
fn giving_up_abandons_a_chain_item_at_the_step_it_waits_at() {
    let text = r#"{"steps": [
        {"id": "each", "type": "map", "items": "input", "tolerated_failures": 0, "steps": [
            {"id": "first", "type": "agent", "agent": "one"},
            {"id": "second", "type": "agent", "agent": "two"}
        ]}
    ]}"#;
    let mut d = Driver::start(text, json!(["x", "y"]));
    answer_item(&mut d, 0, Ok(json!("x1")));
    assert_eq!(
        queued(&d),
        [item_task("first", 2, 1), item_task("second", 1, 0)]
    );
    answer_item(&mut d, 1, Err("y failed"));
    assert_eq!(d.abandoned, [item_task("second", 1, 0)]);
    let error = run_error(&d);
    assert!(
        error.contains("1 of 2 items failed; tolerated_failures is 0"),
        "{error}"
    );
}

#[test]
fn items_failing_without_an_agent_stop_the_rest_from_starting() {
    let text = r#"{"steps": [
        {"id": "each", "type": "map", "items": "input", "tolerated_failures": 1, "steps": [
            {"id": "size", "type": "transform", "transform": "map.item.size"}
        ]}
    ]}"#;
    let run = Run::start(workflow(text), json!([{"size": 1}, 2, 3, {"size": 4}])).run;
    assert_eq!(run.status(), RunStatus::Failed);
    let data = context_of(&run, "each");
    assert_eq!(data["data"][0], fulfilled(0, json!(1)));
    assert_eq!(data["data"][1]["status"], json!("rejected"));
    assert_eq!(data["data"][2]["status"], json!("rejected"));
    assert_eq!(
        data["data"][3],
        rejected(3, "not run: 2 of 4 items failed; tolerated_failures is 1")
    );
    assert!(
        !item_records(&run).iter().any(|(_, i)| *i == 3),
        "item 3 never ran"
    );
}

// ---------------------------------------------------------------------------------------------
// Messages, decisions and handoffs
// ---------------------------------------------------------------------------------------------

const MESSAGES: &str = r#"{"steps": [
    {"id": "plan", "type": "agent", "agent": "planner"},
    {"id": "each", "type": "map", "items": "input", "agent": "tester"},
    {"id": "review", "type": "agent", "agent": "reviewer"}
]}"#;

/// Runs MESSAGES, the items answering in `order`; returns the reviewer's payload.
fn messages_in(order: [u32; 3]) -> Value {
    let mut d = Driver::start(MESSAGES, json!(["a", "b", "c"]));
    d.answer_with(
        "plan",
        json!("plan"),
        json!({"messages": [{"role": "assistant", "content": "planned"}]}),
    );
    for (n, &i) in order.iter().enumerate() {
        let task = answer_item_with(
            &mut d,
            i,
            json!(i),
            json!({
                "messages": [{"role": "assistant", "content": format!("m{i}")}],
                "decisions": [{"summary": format!("d{i}")}]
            }),
        );
        // Every item was dispatched with the history as the map found it.
        assert_eq!(
            task.payload.to_value()["messages"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        // Decisions are recorded at once; messages wait for the map to settle.
        assert_eq!(d.run.decisions().len(), n + 1);
        if n < 2 {
            assert_eq!(d.run.messages().messages().len(), 1);
        }
    }
    let decisions: Vec<&str> = d
        .run
        .decisions()
        .iter()
        .map(|r| r.summary.as_str())
        .collect();
    let expected: Vec<String> = order.iter().map(|i| format!("d{i}")).collect();
    assert_eq!(decisions, expected, "decisions in the order they came");
    queued_agent(&d, "review").payload.to_value()
}

#[test]
fn item_messages_join_the_history_in_index_order_whatever_order_items_finish() {
    let reference = messages_in([0, 1, 2]);
    let contents: Vec<Value> = reference["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].clone())
        .collect();
    assert_eq!(
        contents,
        [json!("planned"), json!("m0"), json!("m1"), json!("m2")]
    );
    let names: Vec<Value> = reference["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].clone())
        .collect();
    assert_eq!(
        names[1..],
        [json!("tester"), json!("tester"), json!("tester")]
    );
    let ids: std::collections::BTreeSet<&str> = reference["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 4, "each item's message has an id of its own");
    for order in [[2, 0, 1], [1, 2, 0], [2, 1, 0]] {
        let payload = messages_in(order);
        assert_eq!(
            payload["messages"], reference["messages"],
            "order {order:?}"
        );
        assert_eq!(payload["context"], reference["context"], "order {order:?}");
    }
    // The reviewer takes over from every item's agent.
    let handoff = &reference["handoff"];
    assert_eq!(
        handoff["source_agents"],
        json!(["tester", "tester", "tester"])
    );
    assert_eq!(handoff["target_agent"], json!("reviewer"));
    let summaries: Vec<Value> = handoff["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["summary"].clone())
        .collect();
    assert_eq!(summaries, [json!("d0"), json!("d1"), json!("d2")]);
}

#[test]
fn refused_item_messages_reject_that_item() {
    let mut d = Driver::start(MESSAGES, json!(["a", "b"]));
    d.answer("plan", Ok(json!("plan")));
    answer_item_with(
        &mut d,
        0,
        json!("data"),
        json!({"messages": [{"type": "remove", "id": "never-written"}]}),
    );
    answer_item(&mut d, 1, Ok(json!("fine")));
    let data = context_of(&d.run, "each");
    assert_eq!(data["data"][0]["status"], json!("rejected"));
    assert!(
        data["data"][0]["error"]
            .as_str()
            .unwrap()
            .contains("the agent's messages were refused"),
        "{data}"
    );
    assert_eq!(data["data"][1], fulfilled(1, json!("fine")));
}

// ---------------------------------------------------------------------------------------------
// Refusals, cancellation and replay
// ---------------------------------------------------------------------------------------------

#[test]
fn answers_to_tasks_the_map_is_not_waiting_for_are_refused() {
    let mut d = Driver::start(MESSAGES, json!(["a", "b"]));
    d.answer("plan", Ok(json!("plan")));
    answer_item(&mut d, 0, Ok(json!(0)));
    for task in [
        item_task("each", 1, 0), // settled already
        item_task("each", 1, 7), // no such item
        item_task("each", 2, 1), // another visit
        item_task("plan", 1, 1), // not a map step
        TaskId::new("each", 1),  // not an item
    ] {
        let refused = d.run.apply(Event::AgentFailed {
            task: task.clone(),
            error: "late".into(),
        });
        assert!(
            matches!(&refused, Err(EngineError::UnknownTask(t)) if *t == task),
            "{task:?}: {refused:?}"
        );
    }
}

#[test]
fn cancelling_abandons_the_items_in_flight() {
    let text = r#"{"steps": [
        {"id": "each", "type": "map", "items": "input", "agent": "worker", "max_concurrency": 3}
    ]}"#;
    let mut d = Driver::start(text, json!([1, 2, 3, 4, 5]));
    answer_item(&mut d, 1, Ok(json!(1)));
    apply(
        &mut d,
        Event::Cancel {
            reason: "stop".into(),
        },
    );
    assert_eq!(
        d.abandoned,
        [
            item_task("each", 1, 0),
            item_task("each", 1, 2),
            item_task("each", 1, 3)
        ]
    );
    assert_eq!(
        d.finished,
        Some((RunStatus::Cancelled, Some("stop".into())))
    );
    assert!(d.run.waiting().is_empty());
    assert!(d.run.map_progress().is_empty());
}

/// A task as the coordinator sends it: id, agent, payload and timeout.
type Shape = (TaskId, String, Value, Option<u64>);

/// What a pending task is, comparably.
fn shape(task: &AgentTask) -> Shape {
    (
        task.task.clone(),
        task.agent.clone(),
        task.payload.to_value(),
        task.timeout_ms,
    )
}

fn sorted(mut tasks: Vec<Shape>) -> Vec<Shape> {
    tasks.sort_by(|a, b| a.0.cmp(&b.0));
    tasks
}

#[test]
fn replaying_a_half_done_map_rebuilds_its_pending_tasks_and_waits() {
    let text = r#"{"steps": [
        {"id": "plan", "type": "agent", "agent": "planner"},
        {"id": "each", "type": "map", "items": "context.plan.parts", "max_concurrency": 3, "steps": [
            {"id": "draft", "type": "agent", "agent": "drafter", "timeout_ms": 5000},
            {"id": "check", "type": "agent", "agent": "checker", "input": "draft"}
        ]},
        {"id": "after", "type": "agent", "agent": "closer"}
    ]}"#;
    let mut d = Driver::start(text, json!("go"));
    d.now_ms = 1_700_000_000_000;
    d.answer_with(
        "plan",
        json!({"parts": ["p", "q", "r", "s", "t"]}),
        json!({"messages": [{"role": "assistant", "content": "five parts"}],
               "decisions": [{"summary": "split in five"}]}),
    );
    answer_item_with(
        &mut d,
        2,
        json!("draft r"),
        json!({"messages": [{"role": "assistant", "content": "r drafted"}]}),
    );
    answer_item(&mut d, 0, Err("draft p failed"));
    answer_item(&mut d, 2, Ok(json!("checked r")));
    answer_item(&mut d, 1, Ok(json!("draft q")));
    assert!(d.finished.is_none());

    let live = d.run.clone();
    let replayed = d.replayed(text, json!("go"));
    let queue: Vec<_> = d.queue.iter().map(shape).collect();
    assert_eq!(
        sorted(live.pending_tasks().iter().map(shape).collect()),
        sorted(queue.clone())
    );
    assert_eq!(
        sorted(replayed.pending_tasks().iter().map(shape).collect()),
        sorted(queue),
        "the replayed run sends exactly what was dispatched"
    );
    assert_eq!(replayed.waiting(), live.waiting());
    assert_eq!(replayed.map_progress(), live.map_progress());
    assert_eq!(
        live.map_progress(),
        [MapProgress {
            step_id: "each".into(),
            visit: 1,
            count: 5,
            succeeded: 1,
            failed: 1,
            running: 3,
        }]
    );
    assert_eq!(replayed.history(), live.history());
    assert_eq!(replayed.decisions(), live.decisions());
    for task in &d.queue {
        let one = replayed
            .pending_task(&task.task)
            .expect("pending after replay");
        assert_eq!(shape(&one), shape(task));
    }
    // The replayed run goes on like the live one.
    let mut live_driver = d;
    let mut replayed_run = replayed;
    while let Some(task) = live_driver.queue.front().cloned() {
        let event = Event::AgentSucceeded {
            task: task.task.clone(),
            data: json!(format!("{:?}", task.task)).into(),
            notes: AgentNotes::default(),
        };
        replayed_run = replayed_run
            .apply_at(event.clone(), live_driver.now_ms)
            .unwrap()
            .run;
        live_driver.queue.pop_front();
        apply(&mut live_driver, event);
    }
    assert_eq!(
        live_driver.finished.as_ref().map(|f| f.0),
        Some(RunStatus::Succeeded)
    );
    assert_eq!(replayed_run.status(), RunStatus::Succeeded);
    assert_eq!(
        replayed_run.context().to_value(),
        live_driver.run.context().to_value()
    );
    assert_eq!(
        replayed_run.messages().json(),
        live_driver.run.messages().json()
    );
}

// ---------------------------------------------------------------------------------------------
// Redrive
// ---------------------------------------------------------------------------------------------

/// Five items, two at a time, no failure tolerated.
const STRICT: &str = r#"{"steps": [
    {"id": "each", "type": "map", "items": "input", "agent": "worker", "max_concurrency": 2,
     "tolerated_failures": 0},
    {"id": "after", "type": "agent", "agent": "closer"}
]}"#;

#[test]
fn a_redriven_map_keeps_its_fulfilled_items_and_reruns_only_the_others() {
    let input = json!(["a", "b", "c", "d", "e"]);
    let mut d = Driver::start(STRICT, input.clone());
    answer_item(&mut d, 0, Ok(json!("A")));
    answer_item(&mut d, 2, Ok(json!("C")));
    answer_item(&mut d, 1, Err("flaky b"));
    assert_eq!(d.abandoned, [item_task("each", 1, 3)]);
    let first_error = run_error(&d);
    assert!(
        first_error.contains("tolerated_failures is 0"),
        "{first_error}"
    );
    assert_eq!(d.run.redrive_target(), Ok("each".into()));

    // First redrive: items 1 and 3 run again (4 never ran), as visit 2.
    d.finished = None;
    let before = d.dispatched.len();
    apply(&mut d, Event::Redrive);
    assert_eq!(d.run.status(), RunStatus::Running);
    assert_eq!(d.run.error(), None);
    let redriven = d
        .run
        .history()
        .iter()
        .rev()
        .find(|r| r.status == StepStatus::Redriven)
        .expect("a redriven record")
        .clone();
    assert_eq!(
        (
            redriven.step_id.as_ref(),
            redriven.visit,
            redriven.next.as_deref(),
            redriven.error.as_deref()
        ),
        ("each", 1, Some("each"), Some(first_error.as_str()))
    );
    assert_eq!(
        started_since(&d, before),
        [item_task("each", 2, 1), item_task("each", 2, 3)]
    );
    assert_eq!(
        d.run.map_progress(),
        [MapProgress {
            step_id: "each".into(),
            visit: 2,
            count: 5,
            succeeded: 2,
            failed: 0,
            running: 2,
        }]
    );
    // A replay of the events, the redrive included, waits for the same tasks.
    let replayed = d.replayed(STRICT, input.clone());
    assert_eq!(
        sorted(replayed.pending_tasks().iter().map(shape).collect()),
        sorted(d.queue.iter().map(shape).collect())
    );
    assert_eq!(replayed.map_progress(), d.run.map_progress());
    answer_item(&mut d, 3, Ok(json!("D")));
    assert_eq!(
        queued(&d),
        [item_task("each", 2, 1), item_task("each", 2, 4)]
    );
    answer_item(&mut d, 1, Err("flaky b again"));
    assert_eq!(d.abandoned.last(), Some(&item_task("each", 2, 4)));
    assert_eq!(d.finished.as_ref().map(|f| f.0), Some(RunStatus::Failed));

    // Second redrive: only 1 and 4 are left.
    d.finished = None;
    let before = d.dispatched.len();
    apply(&mut d, Event::Redrive);
    assert_eq!(
        started_since(&d, before),
        [item_task("each", 3, 1), item_task("each", 3, 4)]
    );
    answer_item(&mut d, 4, Ok(json!("E")));
    answer_item(&mut d, 1, Ok(json!("B")));
    let after = queued_agent(&d, "after");
    assert_eq!(
        after.payload.to_value()["context"]["each"],
        json!({"success": true, "data": [
            fulfilled(0, json!("A")),
            fulfilled(1, json!("B")),
            fulfilled(2, json!("C")),
            fulfilled(3, json!("D")),
            fulfilled(4, json!("E")),
        ]})
    );
    // Every item that succeeded ran exactly once overall.
    assert_eq!(
        dispatch_counts(&d),
        BTreeMap::from([(0, 1), (1, 3), (2, 1), (3, 2), (4, 2)])
    );
    d.answer("after", Ok(json!("closed")));
    assert_eq!(d.finished, Some((RunStatus::Succeeded, None)));
    assert_eq!(d.run.visits("each"), 3);
    let statuses: Vec<StepStatus> = records(&d.run, "each").iter().map(|r| r.status).collect();
    assert_eq!(
        statuses,
        [
            StepStatus::Failed,
            StepStatus::Redriven,
            StepStatus::Failed,
            StepStatus::Redriven,
            StepStatus::Succeeded
        ]
    );
    // Replaying the events, redrives included, rebuilds the same run.
    let replayed = d.replayed(STRICT, input);
    assert_eq!(replayed.status(), RunStatus::Succeeded);
    assert_eq!(replayed.history(), d.run.history());
    assert_eq!(replayed.context().to_value(), d.run.context().to_value());
}

const AGENTS: &str = r#"{"steps": [
    {"id": "plan", "type": "agent", "agent": "planner"},
    {"id": "code", "type": "agent", "agent": "coder", "input": "plan", "max_visits": 1},
    {"id": "ship", "type": "agent", "agent": "shipper"}
]}"#;

#[test]
fn a_redriven_agent_step_runs_again_as_a_new_visit_beyond_max_visits() {
    let mut d = Driver::start(AGENTS, json!("go"));
    d.answer("plan", Ok(json!({"files": 1})));
    let first = d.answer("code", Err("compiler crashed"));
    assert_eq!(
        d.finished,
        Some((
            RunStatus::Failed,
            Some("step \"code\" failed: compiler crashed".into())
        ))
    );
    assert_eq!(d.run.redrive_target(), Ok("code".into()));
    d.finished = None;
    apply(&mut d, Event::Redrive);
    let again = queued_agent(&d, "code");
    assert_eq!(
        again.task,
        TaskId::new("code", 2),
        "not held to max_visits 1"
    );
    assert_eq!(spec(&again.payload), spec(&first.payload));
    let statuses: Vec<(StepStatus, u32)> = records(&d.run, "code")
        .iter()
        .map(|r| (r.status, r.visit))
        .collect();
    assert_eq!(
        statuses,
        [(StepStatus::Failed, 1), (StepStatus::Redriven, 1)]
    );
    d.answer("code", Ok(json!("fixed")));
    d.answer("ship", Ok(json!("shipped")));
    assert_eq!(d.finished, Some((RunStatus::Succeeded, None)));
    assert_eq!(context_of(&d.run, "code"), json!("fixed"));
}

#[test]
fn a_redriven_on_error_step_gets_the_error_that_sent_the_run_there() {
    let text = r#"{"steps": [
        {"id": "build", "type": "agent", "agent": "builder", "on_error": "fix"},
        {"id": "fix", "type": "agent", "agent": "fixer", "end": true}
    ]}"#;
    let mut d = Driver::start(text, json!(null));
    d.answer("build", Err("red"));
    let first = d.answer("fix", Err("gave up"));
    assert_eq!(
        first.payload.to_value()["error"],
        json!({"step": "build", "message": "red"})
    );
    assert_eq!(d.run.redrive_target(), Ok("fix".into()));
    d.finished = None;
    apply(&mut d, Event::Redrive);
    let again = queued_agent(&d, "fix");
    assert_eq!(again.task, TaskId::new("fix", 2));
    assert_eq!(
        again.payload.to_value()["error"],
        first.payload.to_value()["error"]
    );
}

#[test]
fn only_a_run_that_failed_at_a_step_can_be_redriven() {
    let check = |run: &Run, expected: &dyn Fn(&EngineError) -> bool| {
        let target = run.redrive_target();
        assert!(target.as_ref().is_err_and(expected), "{target:?}");
        let applied = run.apply(Event::Redrive);
        assert!(
            applied.as_ref().err().is_some_and(expected),
            "{:?}",
            applied.map(|t| t.run.status())
        );
    };
    // Running, succeeded, cancelled: not failed.
    let mut d = Driver::start(AGENTS, json!("go"));
    check(&d.run, &|e| {
        *e == EngineError::NotFailed(RunStatus::Running)
    });
    let running = d.run.clone();
    d.answer("plan", Ok(json!(1)));
    d.answer("code", Ok(json!(2)));
    d.answer("ship", Ok(json!(3)));
    check(&d.run, &|e| {
        *e == EngineError::NotFailed(RunStatus::Succeeded)
    });
    let cancelled = running
        .apply(Event::Cancel {
            reason: "stop".into(),
        })
        .unwrap()
        .run;
    check(&cancelled, &|e| {
        *e == EngineError::NotFailed(RunStatus::Cancelled)
    });

    // Failed, but not at a step: halted, or a step out of visits.
    let halted = running
        .apply(Event::Halt {
            error: "state chain mismatch".into(),
        })
        .unwrap()
        .run;
    assert_eq!(halted.status(), RunStatus::Failed);
    check(
        &halted,
        &|e| matches!(e, EngineError::NothingToRedrive(why) if why.contains("state chain mismatch")),
    );
    let spin = r#"{"max_visits": 2, "steps": [
        {"id": "work", "type": "agent", "agent": "a"},
        {"id": "again", "type": "condition", "condition": "true", "then": "work"}
    ]}"#;
    let mut d = Driver::start(spin, json!(null));
    d.answer("work", Ok(json!(1)));
    d.answer("work", Ok(json!(2)));
    assert_eq!(d.run.status(), RunStatus::Failed);
    check(
        &d.run,
        &|e| matches!(e, EngineError::NothingToRedrive(why) if why.contains("reached its limit of 2 visits")),
    );

    // A halted map run: its items are abandoned and it cannot be redriven.
    let mut d = Driver::start(STRICT, json!(["a", "b"]));
    apply(
        &mut d,
        Event::Halt {
            error: "integrity".into(),
        },
    );
    assert_eq!(
        d.abandoned,
        [item_task("each", 1, 0), item_task("each", 1, 1)]
    );
    check(&d.run, &|e| matches!(e, EngineError::NothingToRedrive(_)));
}

#[test]
fn only_the_redriven_step_is_exempt_from_max_visits() {
    // The map's chain reads the map's own data, which only the failed visit stored: its first
    // visit fails, the redrive settles at once and routes back to "prep", which has used its
    // one visit. That visit must fail the run; the redrive's exemption is for "each" alone.
    let text = r#"{"steps": [
        {"id": "prep", "type": "transform", "transform": "input", "max_visits": 1},
        {"id": "each", "type": "map", "items": "context.prep", "tolerated_failures": 0, "next": "prep",
         "steps": [{"id": "look", "type": "transform", "transform": "context.each.success"}]}
    ]}"#;
    let run = Run::start(workflow(text), json!([1, 2])).run;
    assert_eq!(run.status(), RunStatus::Failed);
    assert_eq!(run.redrive_target(), Ok("each".into()));
    let run = run.apply(Event::Redrive).unwrap().run;
    assert_eq!(run.status(), RunStatus::Failed);
    let error = run.error().unwrap();
    assert!(
        error.contains("step \"prep\" reached its limit of 1 visits"),
        "{error}"
    );
    assert_eq!(
        (run.visits("each"), run.visits("prep")),
        (2, 2),
        "prep's second visit is over its limit and ends the run"
    );
}

#[test]
fn a_rejected_approval_is_redriven_as_a_new_wait() {
    let text = r#"{"steps": [
        {"id": "gate", "type": "approval", "message": "Ship it?"},
        {"id": "ship", "type": "agent", "agent": "shipper"}
    ]}"#;
    let mut d = Driver::start(text, json!(null));
    d.decide("gate", baton_core::Decision::reject("not yet"));
    assert_eq!(d.run.status(), RunStatus::Failed);
    assert_eq!(d.run.redrive_target(), Ok("gate".into()));
    d.finished = None;
    apply(&mut d, Event::Redrive);
    assert_eq!(d.approvals, ["gate"]);
    assert_eq!(d.run.visits("gate"), 2);
    d.decide("gate", baton_core::Decision::approve());
    d.answer("ship", Ok(json!("shipped")));
    assert_eq!(d.finished, Some((RunStatus::Succeeded, None)));
}

// ---------------------------------------------------------------------------------------------
// A map as a parallel branch
// ---------------------------------------------------------------------------------------------

#[test]
fn a_map_branch_settles_into_its_parallel_step_with_its_messages_in_order() {
    let text = r#"{"steps": [
        {"id": "both", "type": "parallel", "steps": [
            {"id": "each", "type": "map", "items": "input", "agent": "worker", "tolerated_failures": 0},
            {"id": "solo", "type": "agent", "agent": "soloist"}
        ]},
        {"id": "after", "type": "agent", "agent": "closer"}
    ]}"#;
    let mut d = Driver::start(text, json!([1, 2, 3]));
    assert_eq!(
        queued(&d),
        [
            item_task("each", 1, 0),
            item_task("each", 1, 1),
            item_task("each", 1, 2),
            TaskId::new("solo", 1)
        ]
    );
    answer_item_with(
        &mut d,
        1,
        json!(2),
        json!({"messages": [{"role": "assistant", "content": "m1"}]}),
    );
    answer_item(&mut d, 0, Err("x"));
    assert_eq!(d.abandoned, [item_task("each", 1, 2)]);
    assert!(
        d.finished.is_none(),
        "a failed branch does not fail the run"
    );
    d.answer_with(
        "solo",
        json!("s"),
        json!({"messages": [{"role": "assistant", "content": "solo"}]}),
    );
    let both = context_of(&d.run, "both");
    assert_eq!(both["success"], json!(false));
    assert_eq!(both["data"][0]["stepId"], json!("each"));
    assert_eq!(both["data"][0]["status"], json!("rejected"));
    assert!(
        both["data"][0]["error"]
            .as_str()
            .unwrap()
            .contains("1 of 3 items failed; tolerated_failures is 0"),
        "{both}"
    );
    assert_eq!(both["data"][1]["result"], json!("s"));
    let after = queued_agent(&d, "after");
    let contents: Vec<Value> = after.payload.to_value()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].clone())
        .collect();
    assert_eq!(contents, [json!("m1"), json!("solo")], "branch order");
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

fn capped(cap: u32, tolerance: Option<u64>) -> String {
    let mut map = json!({"id": "each", "type": "map", "items": "input.items", "agent": "worker",
                         "max_concurrency": cap});
    if let Some(tolerance) = tolerance {
        map["tolerated_failures"] = json!(tolerance);
    }
    json!({"steps": [map, {"id": "after", "type": "transform", "transform": "context.each"}]})
        .to_string()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Items answered in a random order, some failing: never more than the cap in flight (and
    /// as many as there can be), each item dispatched once and in index order, the data in item
    /// order; with a tolerance, the step gives up exactly when failures exceed it.
    #[test]
    fn the_cap_holds_each_item_runs_once_and_the_data_keeps_item_order(
        count in 0..60usize,
        cap in 1..10u32,
        tolerance in prop::option::of(0..6u64),
        failing in prop::collection::vec(prop::bool::weighted(0.2), 60),
        picks in prop::collection::vec(any::<Index>(), 60),
    ) {
        let items: Vec<Value> = (0..count).map(|i| json!(format!("item {i}"))).collect();
        let mut d = Driver::start(&capped(cap, tolerance), json!({"items": items}));
        let mut outcomes: Vec<Option<Value>> = vec![None; count];
        let mut failed = 0u64;
        let mut picks = picks.iter();
        let mut gave_up = None;
        while !d.queue.is_empty() {
            let settled = outcomes.iter().filter(|o| o.is_some()).count();
            prop_assert!(d.queue.len() <= cap as usize);
            prop_assert_eq!(d.queue.len(), (cap as usize).min(count - settled));
            prop_assert_eq!(d.run.map_progress()[0].running, d.queue.len());
            let pick = picks.next().unwrap().index(d.queue.len());
            let i = d.queue[pick].task.item.unwrap();
            let in_flight: Vec<TaskId> = queued(&d).into_iter().filter(|t| t.item != Some(i)).collect();
            if failing[i as usize] {
                failed += 1;
                answer_item(&mut d, i, Err(&format!("failed {i}")));
                outcomes[i as usize] = Some(rejected(i as usize, &format!("failed {i}")));
            } else {
                answer_item(&mut d, i, Ok(json!(i)));
                outcomes[i as usize] = Some(fulfilled(i as usize, json!(i)));
            }
            if tolerance.is_some_and(|t| failed > t) {
                gave_up = Some(in_flight);
                break;
            }
        }
        // Each item was dispatched at most once, in index order.
        let order: Vec<u32> = d.dispatched.iter().map(|t| t.task.item.unwrap()).collect();
        let started = order.len();
        prop_assert_eq!(order, (0..started as u32).collect::<Vec<_>>());
        let data = context_of(&d.run, "each");
        match gave_up {
            None => {
                prop_assert_eq!(started, count);
                prop_assert!(d.abandoned.is_empty());
                let entries: Vec<Value> = outcomes.into_iter().map(Option::unwrap).collect();
                prop_assert_eq!(
                    data,
                    json!({"success": failed == 0, "data": entries})
                );
                prop_assert_eq!(d.finished.clone(), Some((RunStatus::Succeeded, None)));
            }
            Some(in_flight) => {
                prop_assert_eq!(&d.abandoned, &in_flight);
                prop_assert!(d.queue.is_empty());
                let entries = data["data"].as_array().unwrap();
                prop_assert_eq!(entries.len(), count);
                for (i, entry) in entries.iter().enumerate() {
                    prop_assert_eq!(&entry["index"], &json!(i));
                    let error = entry["error"].as_str().unwrap_or_default();
                    match &outcomes[i] {
                        Some(outcome) => prop_assert_eq!(entry, outcome),
                        None if in_flight.iter().any(|t| t.item == Some(i as u32)) => {
                            prop_assert!(error.starts_with("abandoned: "), "{}", entry)
                        }
                        None => {
                            prop_assert!(i >= started, "{}", entry);
                            prop_assert!(error.starts_with("not run: "), "{}", entry)
                        }
                    }
                }
                let error = run_error(&d);
                prop_assert!(error.contains("tolerated_failures"), "{}", error);
            }
        }
    }
}
