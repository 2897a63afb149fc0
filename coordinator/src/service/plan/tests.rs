use std::sync::Arc;

use baton_core::integrity::{ChainLink, genesis};
use baton_core::{Decision, Event, TaskId};
use serde_json::{Value, json};

use super::*;
use crate::lease;
use crate::model::{StoredEvent, TaskState};
use crate::store::RunHeader;

const NOW: i64 = 1_800_000_000_000;
const LEASE: u64 = 10_000;

/// plan, then approval (with a timeout), then code.
const WORKFLOW: &str = r#"{"id": "wf", "steps": [
    {"id": "plan", "type": "agent", "agent": "planner"},
    {"id": "ok", "type": "approval", "message": "go?", "timeout_ms": 60000},
    {"id": "code", "type": "agent", "agent": "coder"}
]}"#;

fn holder(serves: &'static [&'static str]) -> Holder<'static> {
    Holder {
        id: "c1",
        lease_ms: LEASE,
        serves: Box::new(move |agent| serves.contains(&agent)),
        continues: true,
    }
}

/// A run just started, before its first write, and that first transition.
fn started() -> (Loaded, Transition) {
    started_with(WORKFLOW, json!("input"))
}

/// A run of `workflow` (text) with `input`, just started, and its first transition.
fn started_with(workflow: &str, input: Value) -> (Loaded, Transition) {
    let parsed = Arc::new(baton_core::parse_workflow(workflow).unwrap().workflow);
    let transition = Run::start(parsed, input.clone());
    let header = RunHeader {
        run_id: "r1".into(),
        workflow_id: "wf".into(),
        workflow: workflow.into(),
        input: serde_json::to_vec(&input).unwrap(),
        created_ms: NOW,
        traceparent: String::new(),
        submitted_by: String::new(),
    };
    let chain = genesis("r1", workflow, &input);
    let loaded = Loaded::new(header, transition.run.clone(), NOW, chain);
    (loaded, transition)
}

/// Plans `transition` and takes it on, as an acknowledged write does.
fn take(loaded: &mut Loaded, applied: &Applied<'_>, holder: &Holder<'_>) -> Planned {
    let planned = plan(loaded, applied, holder);
    loaded.adopt(
        applied.transition.run.clone(),
        loaded.version + 1,
        planned.clone(),
    );
    planned
}

fn first(transition: &Transition) -> Applied<'_> {
    Applied {
        event: None,
        answering: None,
        transition,
        history_before: 0,
        now_ms: NOW,
        embedded: None,
        computed: &[],
        fence: None,
    }
}

fn step<'a>(planned: &'a Planned, id: &str) -> &'a StepState {
    &planned.steps.iter().find(|(s, _)| s == id).unwrap().1
}

fn plan_task() -> TaskId {
    TaskId::new("plan", 1)
}

/// The run after the planner answered attempt 2 with `data`, and what that wrote.
fn planner_answered(data: Value) -> (Loaded, Planned) {
    planner_answered_as(data, None)
}

/// As [`planner_answered`], the worker having sent the data as `sent`.
fn planner_answered_as(data: Value, sent: Option<&Part>) -> (Loaded, Planned) {
    let (mut loaded, start) = started();
    take(&mut loaded, &first(&start), &holder(&["planner"]));
    let event = Event::AgentSucceeded {
        task: plan_task(),
        data: data.into(),
        notes: Default::default(),
    };
    let logged = LoggedEvent::new(NOW + 5, StoredEvent::of(&event, "w1").unwrap());
    let transition = loaded.run.apply_at(event, NOW + 5).unwrap();
    let task = plan_task();
    let applied = Applied {
        event: Some(&logged),
        answering: Some(Answering {
            worker_id: "w1",
            task: &task,
            attempt: 2,
            usage: &[],
            started_ms: 0,
            sent,
        }),
        transition: &transition,
        history_before: 0,
        now_ms: NOW + 5,
        embedded: None,
        computed: &[],
        fence: None,
    };
    let planned = take(&mut loaded, &applied, &holder(&["planner"]));
    (loaded, planned)
}

#[test]
fn a_result_sent_as_the_coordinator_encodes_it_is_kept_as_sent_and_not_hashed_again() {
    let data = json!({"blob": "x".repeat(1000)});
    // The digest was checked when the answer arrived; a made-up one here shows it is taken as
    // it came rather than computed again.
    let sent = Part {
        json: serde_json::to_vec(&data).unwrap().into(),
        sha256: "d".repeat(64),
    };
    let (loaded, planned) = planner_answered_as(data.clone(), Some(&sent));
    let (_, part) = &planned.encoded[0];
    assert_eq!(part.json.as_ptr(), sent.json.as_ptr(), "the bytes sent");
    assert_eq!(part.sha256, sent.sha256, "the digest they came with");
    assert_eq!(planned.write.results[0].1.as_ptr(), sent.json.as_ptr());
    let named = loaded
        .parts
        .cached(loaded.run.context().data("plan").unwrap());
    assert_eq!(named.unwrap().sha256, sent.sha256, "the payload part");
}

#[test]
fn a_result_sent_in_another_encoding_is_stored_as_the_coordinator_encodes_it() {
    let data = json!({"b": [1, 2], "a": "x"});
    // Spaces and another member order: the same value, other bytes.
    let sent = Part::new(br#"{ "b": [1, 2], "a": "x" }"#.to_vec());
    let (_, planned) = planner_answered_as(data.clone(), Some(&sent));
    let (_, part) = &planned.encoded[0];
    let encoding = serde_json::to_vec(&data).unwrap();
    assert_eq!(part.json[..], encoding[..]);
    assert_eq!(part.sha256, baton_proto::sha256_hex(&encoding));
    assert_eq!(planned.write.results[0].1[..], encoding[..]);
}

#[test]
fn a_dispatched_task_is_leased_to_this_coordinator_when_it_serves_the_agent() {
    let (loaded, start) = started();
    let planned = plan(&loaded, &first(&start), &holder(&["planner"]));
    let write = &planned.write;
    assert!(
        write.events.is_empty(),
        "the first transition applies no event"
    );
    assert_eq!(write.status, baton_core::RunStatus::Running);
    assert_eq!(write.updated_ms, NOW);
    assert_eq!(planned.tasks_set.len(), 1);
    let (key, entry) = &planned.tasks_set[0];
    assert_eq!(key, "plan#1");
    assert_eq!(
        (
            entry.state,
            entry.owner.as_deref().unwrap_or_default(),
            entry.attempt
        ),
        (TaskState::Queued, "c1", 1)
    );
    assert_eq!(entry.due_ms, NOW + LEASE as i64);
    assert_eq!(write.tasks_set, [(key.clone(), entry.encode())]);
    let plan = step(&planned, "plan");
    assert_eq!(plan.status, StepStatus::Queued);
    assert_eq!((plan.since_ms, plan.since_visit), (NOW, 1));
    assert!(write.links.is_empty() && write.results.is_empty());
}

#[test]
fn a_new_result_is_encoded_once_for_its_write_and_its_payload_part() {
    let (mut loaded, planned) = planner_answered(json!({"files": ["a.ts"]}));
    let stored = &planned.write.results[0].1;
    let data = loaded.run.history()[0].data.clone().unwrap();
    let part = loaded
        .parts
        .cached(&data)
        .expect("the new result is a part already");
    // The very bytes the write stores, not a copy or a second encoding.
    assert_eq!(part.json.as_ptr(), stored.as_ptr());
    assert_eq!(part.json, *stored);
    // The tasks that name it send that part.
    assert!(std::sync::Arc::ptr_eq(&loaded.parts.part(&data), &part));
}

#[test]
fn a_task_no_worker_here_serves_is_left_unowned_and_due_now() {
    let (loaded, start) = started();
    let planned = plan(&loaded, &first(&start), &holder(&["coder"]));
    let entry = &planned.tasks_set[0].1;
    assert_eq!(
        (entry.owner.as_deref().unwrap_or_default(), entry.due_ms),
        ("", NOW)
    );
}

#[test]
fn an_answer_is_fenced_stored_once_and_linked_to_the_chain() {
    let (loaded, planned) = planner_answered(json!({"files": ["a.ts"]}));
    let write = &planned.write;
    assert_eq!(write.fences, [("plan#1".to_string(), 2)]);
    assert!(write.tasks_removed.contains(&"plan#1".to_string()));
    assert_eq!(
        write.results,
        [("plan#1".to_string(), br#"{"files":["a.ts"]}"#[..].into())]
    );
    assert_eq!(write.events.len(), 1);
    let logged: LoggedEvent = serde_json::from_slice(&write.events[0]).unwrap();
    assert_eq!(logged.at_ms, NOW + 5);
    assert!(
        matches!(&logged.event, StoredEvent::AgentSucceeded { result, worker_id, .. } if result == "plan#1" && worker_id == "w1"),
        "the data is stored by reference: {logged:?}"
    );
    // The link hashes the previous head with the step visit and its result.
    let record = &loaded.run.history()[0];
    let link = ChainLink::after(
        &genesis("r1", WORKFLOW, &json!("input")),
        "plan",
        1,
        record.result_sha256(),
    );
    assert_eq!(write.links, [json(&link)]);
    assert_eq!(write.state_sha256, link.state_sha256);
    let plan = step(&planned, "plan");
    assert_eq!(plan.status, StepStatus::Succeeded);
    assert_eq!((plan.worker_id.as_deref(), plan.attempts), (Some("w1"), 2));
    assert_eq!(
        planned.settled,
        [SettledTiming {
            started_ms: NOW,
            parallel_visit: None
        }]
    );
}

#[test]
fn an_approval_with_a_timeout_gets_a_timer_that_its_decision_removes() {
    let (mut loaded, planned) = planner_answered(json!({}));
    let approval = step(&planned, "ok");
    assert_eq!(approval.status, StepStatus::Waiting);
    let timer = &planned
        .tasks_set
        .iter()
        .find(|(k, _)| k == "ok#1")
        .unwrap()
        .1;
    assert_eq!(timer.state, TaskState::Waiting);
    assert_eq!(timer.due_ms, NOW + 5 + 60_000);

    let event = Event::ApprovalDecided {
        step_id: "ok".into(),
        decision: Decision::approve(),
    };
    let transition = loaded.run.apply_at(event, NOW + 9).unwrap();
    let applied = Applied {
        event: None,
        answering: None,
        transition: &transition,
        history_before: 1,
        now_ms: NOW + 9,
        embedded: None,
        computed: &[],
        fence: None,
    };
    let decided = take(&mut loaded, &applied, &holder(&["coder"]));
    assert!(decided.write.tasks_removed.contains(&"ok#1".to_string()));
    assert!(
        decided.write.results.is_empty(),
        "rebuilt from the event log"
    );
    assert_eq!(decided.write.links.len(), 1);
    assert_eq!(decided.tasks_set[0].0, "code#1");
}

#[test]
fn a_cancel_abandons_the_task_and_leaves_no_task_or_timer() {
    let (mut loaded, start) = started();
    take(&mut loaded, &first(&start), &holder(&["planner"]));
    let transition = loaded
        .run
        .apply_at(
            Event::Cancel {
                reason: "stop".into(),
            },
            NOW + 1,
        )
        .unwrap();
    let applied = Applied {
        event: None,
        answering: None,
        transition: &transition,
        history_before: 0,
        now_ms: NOW + 1,
        embedded: None,
        computed: &[],
        fence: None,
    };
    let planned = plan(&loaded, &applied, &holder(&["planner"]));
    assert_eq!(planned.write.status, baton_core::RunStatus::Cancelled);
    assert_eq!(planned.write.tasks_removed, ["plan#1"]);
    assert_eq!(step(&planned, "plan").status, StepStatus::Cancelled);
    assert!(planned.tasks_set.is_empty());
}

#[test]
fn planning_is_pure() {
    let (loaded, start) = started();
    let once = plan(&loaded, &first(&start), &holder(&["planner"]));
    let again = plan(&loaded, &first(&start), &holder(&["planner"]));
    assert_eq!(once.write, again.write);
    assert_eq!(
        loaded.version, 0,
        "nothing changes until the write is acknowledged"
    );
    assert!(loaded.tasks.is_empty());
}

/// The bytes a write carries to the store.
fn write_bytes(write: &TransitionWrite) -> usize {
    let pairs = |pairs: &[(String, Vec<u8>)]| -> usize {
        pairs
            .iter()
            .map(|(key, value)| key.len() + value.len())
            .sum()
    };
    write.events.iter().map(Vec::len).sum::<usize>()
        + write
            .results
            .iter()
            .map(|(key, value)| key.len() + value.len())
            .sum::<usize>()
        + pairs(&write.steps)
        + pairs(&write.tasks_set)
        + write.tasks_removed.iter().map(String::len).sum::<usize>()
        + write.links.iter().map(Vec::len).sum::<usize>()
        + pairs(&write.decisions)
}

#[test]
fn settling_a_map_item_writes_as_much_at_the_last_item_as_at_the_first() {
    const ITEMS: u32 = 2_000;
    let text = r#"{"id": "wf", "steps": [
        {"id": "each", "type": "map", "items": "input", "agent": "tester", "max_concurrency": 8}
    ]}"#;
    let input = json!((0..ITEMS).collect::<Vec<_>>());
    let (mut loaded, start) = started_with(text, input);
    let first_write = take(&mut loaded, &first(&start), &holder(&["tester"]));
    assert_eq!(
        first_write.tasks_set.len(),
        8,
        "the cap: 8 items go out first"
    );
    assert_eq!(first_write.tasks_set[0].0, "each[0]#1");
    let used = [ModelUsage {
        model: "m".into(),
        prompt_tokens: 10,
        completion_tokens: 5,
    }];
    let mut sizes = Vec::new();
    for i in 0..ITEMS {
        let task = TaskId {
            item: Some(i),
            ..TaskId::new("each", 1)
        };
        let event = Event::AgentSucceeded {
            task: task.clone(),
            data: json!({"item": i}).into(),
            notes: Default::default(),
        };
        let logged = LoggedEvent::new(NOW + i64::from(i), StoredEvent::of(&event, "w1").unwrap());
        let history_before = loaded.run.history().len();
        let transition = loaded.run.apply_at(event, NOW + i64::from(i)).unwrap();
        let applied = Applied {
            event: Some(&logged),
            answering: Some(Answering {
                worker_id: "w1",
                task: &task,
                attempt: 1,
                usage: &used,
                started_ms: 0,
                sent: None,
            }),
            transition: &transition,
            history_before,
            now_ms: NOW + i64::from(i),
            embedded: None,
            computed: &[],
            fence: None,
        };
        let planned = take(&mut loaded, &applied, &holder(&["tester"]));
        if i + 1 < ITEMS {
            sizes.push(write_bytes(&planned.write));
        }
    }
    // Only digits grow (indexes, counts, token sums): never the items settled so far.
    let early = *sizes[10..20].iter().max().unwrap();
    let late = *sizes[sizes.len() - 200..].iter().max().unwrap();
    assert!(
        late <= early + 64,
        "settling an item wrote {early} bytes early on and {late} near the end"
    );
    let each = loaded.steps.get("each").unwrap();
    let items = each.items.as_ref().unwrap();
    assert_eq!(
        (items.count, items.succeeded, items.failed, items.running),
        (2_000, 2_000, 0, 0)
    );
    assert_eq!(
        items.usage,
        [ModelUsage {
            model: "m".into(),
            prompt_tokens: 20_000,
            completion_tokens: 10_000
        }],
        "the items' tokens, summed per model"
    );
    assert!(each.usage.is_empty(), "no entry per item attempt");
    assert_eq!(each.status, StepStatus::Succeeded);
}

#[test]
fn a_chain_step_s_state_counts_its_visits_over_every_item() {
    let text = r#"{"id": "wf", "steps": [
        {"id": "each", "type": "map", "items": "input", "steps": [
            {"id": "double", "type": "transform", "transform": "jq: .map.item * 2"},
            {"id": "ok", "type": "condition", "condition": "map.index < 9", "then": "keep"},
            {"id": "keep", "type": "transform", "transform": "context.double"}
        ]}
    ]}"#;
    let input = json!([1, 2, 3]);
    let (mut loaded, start) = started_with(text, input);
    // The map runs jq: the walk stops before it, and its visit is a transition of its own.
    take(&mut loaded, &first(&start), &holder(&[]));
    let continued = loaded.run.apply_at(Event::Continue, NOW + 1).unwrap();
    let logged = LoggedEvent::new(NOW + 1, StoredEvent::Continue);
    let applied = Applied {
        event: Some(&logged),
        transition: &continued,
        history_before: loaded.run.history().len(),
        now_ms: NOW + 1,
        ..first(&continued)
    };
    let planned = plan(&loaded, &applied, &holder(&[]));
    for id in ["double", "ok", "keep"] {
        let state = step(&planned, id);
        assert_eq!(
            (state.status, state.visits),
            (StepStatus::Succeeded, 3),
            "{id}"
        );
    }
    let each = step(&planned, "each");
    assert_eq!(each.status, StepStatus::Succeeded);
    assert_eq!(each.items.as_ref().unwrap().succeeded, 3);
    // One link per item step visit, each naming its item, and one for the map.
    assert_eq!(planned.write.links.len(), 3 * 3 + 1);
}

/// Issue 28, hole 3: a run whose walk stopped before a step that runs jq keeps a continuation
/// timer, held by the coordinator that goes on with it (or by nobody, due at once, when that
/// one is shutting down); the transition that goes on removes it, or sets it again when the
/// walk stops once more. The map's items, from a jq program, are stored under their site for
/// a replay to read back.
#[test]
fn a_continuation_has_a_timer_until_the_run_goes_on_and_jq_outputs_are_stored() {
    let text = r#"{"id": "wf", "steps": [
        {"id": "each", "type": "map", "items": "jq: .input", "agent": "a"},
        {"id": "shape", "type": "transform", "transform": "jq: .context.each"}
    ]}"#;
    let (mut loaded, start) = started_with(text, json!([1, 2]));
    let planned = take(&mut loaded, &first(&start), &holder(&[]));
    let timer = planned
        .tasks_set
        .iter()
        .find(|(key, _)| key == lease::CONTINUATION)
        .map(|(_, entry)| entry.clone())
        .expect("a continuation timer");
    assert_eq!(timer.state, TaskState::Continuing);
    assert_eq!(
        (timer.owner.as_deref().unwrap_or_default(), timer.due_ms),
        ("c1", NOW + LEASE as i64)
    );
    let stopping = Holder {
        continues: false,
        ..holder(&[])
    };
    let released = plan(&loaded, &first(&start), &stopping);
    let (_, entry) = released
        .tasks_set
        .iter()
        .find(|(key, _)| key == lease::CONTINUATION)
        .unwrap();
    assert_eq!(
        (entry.owner.as_deref().unwrap_or_default(), entry.due_ms),
        ("", NOW)
    );

    let continued = loaded.run.apply_at(Event::Continue, NOW + 1).unwrap();
    let logged = LoggedEvent::new(NOW + 1, StoredEvent::Continue);
    let computed = [crate::jq_runs::Evaluation {
        at: "each#1/items".into(),
        cpu: std::time::Duration::from_millis(2),
        outcome: Ok(std::sync::Arc::from("[1,2]")),
    }];
    let applied = Applied {
        event: Some(&logged),
        transition: &continued,
        history_before: loaded.run.history().len(),
        now_ms: NOW + 1,
        computed: &computed,
        ..first(&continued)
    };
    let planned = take(&mut loaded, &applied, &holder(&[]));
    assert!(
        planned
            .write
            .tasks_removed
            .iter()
            .any(|k| k == lease::CONTINUATION),
        "the map waits for agents now: nothing to go on with"
    );
    assert!(
        planned
            .write
            .results
            .iter()
            .any(|(key, bytes)| key == "each#1/items" && &bytes[..] == b"[1,2]"),
        "{:?}",
        planned.write.results
    );
}
