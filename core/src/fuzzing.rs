//! Fuzz targets: the core's parsers that a client or a worker can reach, as functions of
//! arbitrary bytes.
//!
//! A target takes any bytes and returns nothing: it must not panic, hang or allocate without
//! bound whatever it is given, and where a cheap invariant exists it asserts it, so that a panic
//! is a bug either way. The suite runs each for a bounded number of cases on stable
//! (`core/tests/fuzz.rs`, with the regression inputs and seeds of `tests/fuzz/corpus/<target>/`);
//! `tests/fuzz/README.md` tells how to run them for longer, with `cargo fuzz` too.
//!
//! - [`workflow`]: workflow text, parsed and validated (what `SubmitRun` and `baton validate`
//!   do); a valid one is run by the engine against answers drawn from the input.
//! - [`workflow_shapes`]: a workflow built from the input as a structure, then as [`workflow`].
//! - [`condition`]: a condition step's expression.
//! - [`path`]: a transform's path.
//! - [`jq`]: a `jq:` transform, compiled (never run: jaq has no fuel, which is why coordinators
//!   run programs in budgeted sandbox processes).
//! - [`manifest`]: a payload by reference: the manifest of a payload, spliced back together.
//! - [`notes`]: an agent's notes, and their messages merged into a history.
//! - [`big_integers_in`]: JSON text scanned for integers beyond 64 bits, as every input, result
//!   and workflow is.
//!
//! [`json_value`] and [`string`] draw JSON and text from [`Unstructured`] data for these targets
//! and those of the other crates.

use std::collections::HashMap;
use std::sync::Arc;

use arbitrary::Unstructured;
use serde_json::{Map, Number, Value, json};
use sha2::{Digest, Sha256};

use crate::big_integers::{big_integers, first_big_integer};
use crate::eval::expr::Expr;
use crate::eval::path::Path;
use crate::eval::{JqProgram, JqRunner, JqSite, Scope, install_jq_runner};
use crate::handoff::AgentNotes;
use crate::messages::{Message, add_messages};
use crate::payload::{AgentPayload, ErrorInfo, Manifest, assemble};
use crate::text::text_nesting_depth;
use crate::workflow::parse::parse_workflow_value;
use crate::{
    Action, Context, Decision, Event, Limits, Run, RunStatus, StepResult, TaskId, Waiting,
    Workflow, parse_workflow_with,
};

/// A fuzz target: any bytes in, nothing out; a panic is a bug.
pub type Target = fn(&[u8]);

/// Every target of this crate, by name (the name of its corpus folder).
pub const TARGETS: &[(&str, Target)] = &[
    ("workflow", workflow),
    ("workflow_shapes", workflow_shapes),
    ("condition", condition),
    ("path", path),
    ("jq", jq),
    ("manifest", manifest),
    ("notes", notes),
    ("big_integers", big_integers_in),
];

/// The largest workflow a coordinator accepts (`Config::max_workflow_bytes`).
const MAX_WORKFLOW_BYTES: usize = 1 << 20;

/// How many events a fuzzed run is driven through at most.
const MAX_EVENTS: usize = 48;

/// Workflow text, parsed and validated with the default [`Limits`].
///
/// Invariants: an invalid document reports at least one error; a valid one validates the same
/// again, and the same from its JSON value and from that value written out again (validity does
/// not depend on spelling); it runs ([`drive`]) without the engine panicking, every dispatched
/// payload splices back byte for byte from its manifest, a pending task is rebuilt as it was
/// dispatched, and replaying the accepted events (through their stored JSON) rebuilds the run.
pub fn workflow(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if text.len() > MAX_WORKFLOW_BYTES {
        return;
    }
    let limits = Limits::default();
    let parsed = match parse_workflow_with(&text, &limits) {
        Ok(parsed) => parsed,
        Err(error) => {
            assert!(
                error.diagnostics.has_errors(),
                "a rejected workflow names an error: {error}"
            );
            let _ = error.to_string();
            // The depth of the text is checked before it is read as JSON; a value is not. Nor
            // does a value hold the integers beyond 64 bits its text did: they were rounded.
            if text_nesting_depth(&text) > limits.max_json_depth
                || big_integers(text.as_bytes()).next().is_some()
            {
                return;
            }
            if let Ok(value) = serde_json::from_str::<Value>(&text) {
                assert!(
                    parse_workflow_value(&value, &limits).is_err(),
                    "the document's JSON value is valid though its text is not"
                );
            }
            return;
        }
    };
    let again = parse_workflow_with(&text, &limits).expect("a valid workflow stays valid");
    assert_eq!(shape(&again.workflow), shape(&parsed.workflow));
    assert_eq!(again.warnings, parsed.warnings);
    if let Ok(value) = serde_json::from_str::<Value>(&text) {
        let from_value = parse_workflow_value(&value, &limits)
            .expect("the JSON value of a valid workflow is valid");
        assert_eq!(shape(&from_value.workflow), shape(&parsed.workflow));
        let rewritten = serde_json::to_string_pretty(&value).expect("a value serialises");
        let from_rewritten = parse_workflow_with(&rewritten, &limits)
            .expect("a valid workflow written out again is valid");
        assert_eq!(shape(&from_rewritten.workflow), shape(&parsed.workflow));
    }
    drive(Arc::new(parsed.workflow), data);
}

/// A workflow document built from the input as a structure (steps of every type, routing and
/// references among their ids, expressions from parts that mean something), written as text
/// and given to [`workflow`]: most of them are valid, so this is the target that runs the
/// engine through loops, parallel steps, approvals and `on_error`, where mutated text seldom
/// gets past the parser.
pub fn workflow_shapes(data: &[u8]) {
    let Ok(document) = arbitrary_workflow(&mut Unstructured::new(data)) else {
        return;
    };
    let text = serde_json::to_string(&document).expect("a value serialises");
    workflow(text.as_bytes());
}

fn arbitrary_workflow(u: &mut Unstructured) -> arbitrary::Result<Value> {
    let count = u.int_in_range(1..=7)?;
    let ids: Vec<String> = (0..count).map(|i| format!("s{i}")).collect();
    let mut steps = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        steps.push(arbitrary_step(u, id, &ids, &ids[..i], 0)?);
    }
    let mut document = json!({"steps": steps});
    if u.ratio(1, 3)? {
        document["max_visits"] = json!(small(u, 1..=6)?);
    }
    Ok(document)
}

/// True once in `times`, and never once `u` has run out of data (where `ratio` is always true).
fn rarely(u: &mut Unstructured, times: u32) -> arbitrary::Result<bool> {
    Ok(!u.ratio(times - 1, times)?)
}

/// A number in `range`, and now and then 0, which no count in a workflow may be.
fn small(u: &mut Unstructured, range: std::ops::RangeInclusive<u32>) -> arbitrary::Result<u32> {
    if rarely(u, 40)? {
        Ok(0)
    } else {
        u.int_in_range(range)
    }
}

/// One step of [`arbitrary_workflow`]: mostly valid, so that runs go far, and now and then
/// not (a reference to a branch, a branch that routes). It routes to any of `ids` and reads
/// the data of the `earlier` ones (the entry step is an agent: it has nothing to read).
fn arbitrary_step(
    u: &mut Unstructured,
    id: &str,
    ids: &[String],
    earlier: &[String],
    depth: usize,
) -> arbitrary::Result<Value> {
    let branch = depth > 0;
    let pick = |u: &mut Unstructured, from: &[String]| -> arbitrary::Result<String> {
        Ok(if from.is_empty() || rarely(u, 40)? {
            format!("{id}b0")
        } else {
            u.choose(from)?.clone()
        })
    };
    let reference = |u: &mut Unstructured| pick(u, ids);
    let source = |u: &mut Unstructured| pick(u, earlier);
    let mut step = Map::new();
    step.insert("id".into(), json!(id));
    let kind = match u.choose_index(6)? {
        _ if earlier.is_empty() && !branch => 0,
        2 if branch && !rarely(u, 20)? => 0,
        4 | 5 if depth >= 2 => 0,
        kind => kind,
    };
    match kind {
        0 => {
            step.insert("type".into(), json!("agent"));
            step.insert("agent".into(), json!(*u.choose(&["a", "b", "c"])?));
            if !earlier.is_empty() && u.ratio(1, 4)? {
                step.insert("input".into(), json!(source(u)?));
            }
            if u.ratio(1, 4)? {
                step.insert(
                    "retry".into(),
                    json!({"max_attempts": small(u, 1..=4)?, "initial_interval_ms": 10}),
                );
            }
            if u.ratio(1, 5)? {
                step.insert("timeout_ms".into(), json!(small(u, 1..=60_000)?));
            }
        }
        1 => {
            step.insert("type".into(), json!("transform"));
            let source = source(u)?;
            // Rarely jq: compiling a program costs some 3 ms in a debug build (the `jq` target
            // is where programs are fuzzed).
            let transform = match u.choose_index(10)? {
                _ if rarely(u, 30)? => format!("jq: .context[\"{source}\"]"),
                1 => "input.task".to_owned(),
                2..=4 => format!("context[\"{source}\"].files[0]"),
                _ => format!("context.{source}"),
            };
            step.insert("transform".into(), json!(transform));
        }
        2 => {
            step.insert("type".into(), json!("condition"));
            step.insert(
                "condition".into(),
                json!(arbitrary_condition(u, earlier, 2)?),
            );
            for field in ["then", "else"] {
                if u.ratio(2, 3)? {
                    step.insert(field.into(), json!(reference(u)?));
                }
            }
        }
        3 => {
            step.insert("type".into(), json!("approval"));
            step.insert("message".into(), json!("ship it?"));
            for field in ["on_approve", "on_reject"] {
                if (!branch || rarely(u, 60)?) && u.ratio(1, 2)? {
                    step.insert(field.into(), json!(reference(u)?));
                }
            }
            if u.ratio(1, 4)? {
                step.insert("timeout_ms".into(), json!(small(u, 1..=60_000)?));
            }
        }
        5 => {
            step.insert("type".into(), json!("map"));
            let items = match u.choose_index(4)? {
                0 => "input.flags".to_owned(),
                1 => "input.task".to_owned(),
                2 => format!("context[\"{}\"].files", source(u)?),
                _ => "input.items".to_owned(),
            };
            step.insert("items".into(), json!(items));
            if u.ratio(1, 2)? {
                step.insert("max_concurrency".into(), json!(small(u, 1..=3)?));
            }
            if u.ratio(1, 3)? {
                let tolerated = if u.arbitrary()? {
                    json!(u.int_in_range(0..=2)?)
                } else {
                    json!(format!("{}%", u.int_in_range(0..=60)?))
                };
                step.insert("tolerated_failures".into(), tolerated);
            }
            if u.ratio(1, 2)? {
                step.insert("agent".into(), json!(*u.choose(&["a", "b", "c"])?));
            } else {
                // A chain: an agent, then a condition on the item that goes to another agent or
                // to a transform of the item.
                let chain = |n: usize| format!("{id}c{n}");
                let mut first = json!({"id": chain(0), "type": "agent", "agent": "a"});
                if u.ratio(1, 4)? {
                    first["on_error"] = json!(chain(3));
                }
                step.insert(
                    "steps".into(),
                    json!([
                        first,
                        {"id": chain(1), "type": "condition",
                         "condition": format!("map.index < {} && context.{}", u.int_in_range(0..=4)?, chain(0)),
                         "then": chain(2), "else": chain(3)},
                        {"id": chain(2), "type": "agent", "agent": "b", "end": true},
                        {"id": chain(3), "type": "transform", "transform": "map.item"}
                    ]),
                );
            }
        }
        _ => {
            step.insert("type".into(), json!("parallel"));
            let branches: Vec<String> = (0..u.int_in_range(1..=3)?)
                .map(|b| format!("{id}b{b}"))
                .collect();
            let mut built = Vec::new();
            for branch in &branches {
                built.push(arbitrary_step(u, branch, ids, earlier, depth + 1)?);
            }
            step.insert("steps".into(), Value::Array(built));
        }
    }
    if !branch || rarely(u, 20)? {
        if u.ratio(1, 3)? {
            step.insert("next".into(), json!(reference(u)?));
        } else if u.ratio(1, 8)? {
            step.insert("end".into(), json!(true));
        }
        if u.ratio(1, 4)? {
            step.insert("on_error".into(), json!(reference(u)?));
        }
        if u.ratio(1, 5)? {
            step.insert("max_visits".into(), json!(small(u, 1..=5)?));
        }
        if u.ratio(1, 10)? {
            step.insert("output".into(), json!(format!("{id}_out")));
        }
    }
    Ok(Value::Object(step))
}

fn arbitrary_condition(
    u: &mut Unstructured,
    ids: &[String],
    depth: u32,
) -> arbitrary::Result<String> {
    if depth > 0 && u.ratio(1, 3)? {
        let left = arbitrary_condition(u, ids, depth - 1)?;
        let right = arbitrary_condition(u, ids, depth - 1)?;
        let op = *u.choose(&["&&", "||"])?;
        return Ok(if u.arbitrary()? {
            format!("!({left}) {op} {right}")
        } else {
            format!("({left}) {op} {right}")
        });
    }
    let Ok(id) = u.choose(ids) else {
        return Ok("input.n >= 3".to_owned());
    };
    Ok(match u.choose_index(5)? {
        0 => format!("context.{id}.success === true"),
        1 => format!("context.{id}.score > {}", u.int_in_range(0..=5)?),
        2 => format!("context.{id}"),
        3 => "input.n >= 3".to_owned(),
        _ => format!("context[\"{id}\"].approved == false"),
    })
}

/// What a workflow is made of, comparable (the workflow's own index of ids is a `HashMap`,
/// whose order differs between two parses).
fn shape(workflow: &Workflow) -> Vec<String> {
    let mut shape = vec![format!(
        "{:?} {:?} {} {:?}",
        workflow.id,
        workflow.description,
        workflow.max_visits,
        workflow.top_level()
    )];
    shape.extend(workflow.steps().iter().map(|step| format!("{step:?}")));
    shape
}

/// Refuses every `jq:` transform: jaq has no fuel, so a fuzzed program could run for ever here.
struct NoJq;

impl JqRunner for NoJq {
    fn run(&self, _: &JqSite<'_>, _: &JqProgram, _: &Value) -> Result<Value, String> {
        Err("jq transforms are not run while fuzzing".to_owned())
    }
}

/// Choices drawn from a generator seeded by the input's bytes (SplitMix64): the same input
/// makes the same choices, and the choices do not lean the way the bytes of a JSON text do.
struct Choices(u64);

impl Choices {
    fn of(data: &[u8]) -> Self {
        Self(data.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        }))
    }

    /// A number in `0..below`.
    fn next(&mut self, below: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % below.max(1) as u64) as usize
    }
}

/// Runs `workflow` as a coordinator would, answering each agent task and approval with what
/// the input's bytes choose, and checks what the engine promises on the way.
fn drive(workflow: Arc<Workflow>, data: &[u8]) {
    install_jq_runner(Box::new(NoJq));
    let mut choices = Choices::of(data);
    let input = json!({"task": "fuzz", "n": 3, "flags": [true, false], "items": [0, 1, 2, 3, 4]});
    let start = Run::start(workflow.clone(), input.clone());
    let mut run = start.run;
    let mut dispatched: HashMap<TaskId, Vec<u8>> = HashMap::new();
    check_actions(&start.actions, &mut dispatched);
    let mut events: Vec<(Event, i64)> = Vec::new();
    let mut redrives = 0;
    for n in 0..MAX_EVENTS {
        if run.status() != RunStatus::Running {
            // A failed run is now and then retried, as `baton runs retry` does.
            if run.redrive_target().is_ok() && redrives < 2 && choices.next(2) == 0 {
                redrives += 1;
                let at_ms = 1_700_000_000_000 + n as i64 * 1_000;
                let transition = run
                    .apply_at(Event::Redrive, at_ms)
                    .expect("a run with a redrive target takes a redrive");
                check_actions(&transition.actions, &mut dispatched);
                run = transition.run;
                events.push((Event::Redrive, at_ms));
                continue;
            }
            break;
        }
        for waiting in run.waiting() {
            if let Waiting::Agent { task, .. } = waiting {
                let rebuilt = run
                    .pending_task(&task)
                    .expect("an agent the run waits for has a pending task");
                if let Some(sent) = dispatched.get(&task) {
                    assert_eq!(
                        &rebuilt.payload.to_json(),
                        sent,
                        "a pending task is rebuilt as it was dispatched"
                    );
                }
            }
        }
        let waiting = run.waiting();
        let event = if waiting.is_empty() {
            Event::Cancel {
                reason: "nothing to wait for".to_owned(),
            }
        } else {
            let index = choices.next(waiting.len());
            event_for(&waiting[index], &run, n, &mut choices)
        };
        let at_ms = 1_700_000_000_000 + n as i64 * 1_000;
        match run.apply_at(event.clone(), at_ms) {
            Ok(transition) => {
                check_actions(&transition.actions, &mut dispatched);
                run = transition.run;
                events.push((event, at_ms));
            }
            Err(_) => continue,
        }
    }
    for record in run.history() {
        let _ = record.result_sha256();
    }
    // The coordinator stores events as JSON and rebuilds runs from them.
    let stored: Vec<(Event, i64)> = events
        .iter()
        .map(|(event, at_ms)| {
            let text = serde_json::to_string(event).expect("an event serialises");
            let back: Event = serde_json::from_str(&text).expect("a stored event reads back");
            assert_eq!(&back, event, "an event survives its stored JSON");
            (back, *at_ms)
        })
        .collect();
    let replayed = Run::replay_at(workflow, input, stored)
        .unwrap_or_else(|(i, error)| panic!("event {i} no longer applies on replay: {error}"));
    assert_eq!(replayed.status(), run.status());
    assert_eq!(replayed.error(), run.error());
    assert_eq!(replayed.history(), run.history());
    assert_eq!(replayed.context().to_value(), run.context().to_value());
    assert_eq!(replayed.messages().messages(), run.messages().messages());
    assert_eq!(replayed.decisions(), run.decisions());
    assert_eq!(replayed.handoffs(), run.handoffs());
}

/// Checks every payload dispatched: its manifest splices back to the same bytes.
fn check_actions(actions: &[Action], dispatched: &mut HashMap<TaskId, Vec<u8>>) {
    for action in actions {
        if let Action::Dispatch(task) = action {
            let whole = task.payload.to_json();
            assert_eq!(
                spliced(&task.payload),
                whole,
                "a payload splices back whole"
            );
            dispatched.insert(task.task.clone(), whole);
        }
    }
}

/// `payload` sent by reference and rebuilt as a worker rebuilds it.
fn spliced(payload: &AgentPayload) -> Vec<u8> {
    let mut parts: HashMap<String, Vec<u8>> = HashMap::new();
    let manifest = Manifest::of(payload, |value| {
        let bytes = serde_json::to_vec(value.as_ref()).expect("a part serialises");
        let digest = hex::encode(Sha256::digest(&bytes));
        parts.insert(digest.clone(), bytes);
        digest
    });
    let wire = serde_json::to_vec(&manifest).expect("a manifest serialises");
    let received: Manifest = serde_json::from_slice(&wire).expect("a manifest reads back");
    assert_eq!(received, manifest, "a manifest survives the wire");
    assemble(&received, |digest| parts.get(digest).map(Vec::as_slice))
        .expect("every part the manifest names was made")
}

/// The answer to what the run waits for, as the input's bytes choose.
fn event_for(waiting: &Waiting, run: &Run, n: usize, choices: &mut Choices) -> Event {
    match waiting {
        Waiting::Agent { task, .. } => match choices.next(10) {
            0 => Event::AgentFailed {
                task: task.clone(),
                error: format!("failure {n}"),
            },
            pick => {
                let flag = choices.next(2) == 0;
                let data = match pick {
                    1..=3 => {
                        json!({"success": flag, "approved": !flag, "score": n, "files": ["a"]})
                    }
                    4 => json!([n, {"nested": {"flag": flag}}]),
                    5 => Value::Null,
                    _ => json!({"n": n, "text": "answer"}),
                };
                Event::AgentSucceeded {
                    task: task.clone(),
                    data,
                    notes: notes_for(n, choices),
                }
            }
        },
        Waiting::Approval { step_id, .. } => match choices.next(3) {
            0 => Event::ApprovalTimedOut {
                step_id: step_id.to_string(),
                visit: run.visits(step_id),
            },
            pick => Event::ApprovalDecided {
                step_id: step_id.to_string(),
                decision: Decision {
                    approved: pick == 1,
                    comment: Some(format!("decided {n}")),
                    approver: None,
                },
            },
        },
        Waiting::Computation { .. } => Event::Continue,
    }
}

/// Notes for an agent's answer: messages that append, replace and remove, and decisions.
fn notes_for(n: usize, choices: &mut Choices) -> AgentNotes {
    let notes = match choices.next(5) {
        0 => json!({"messages": [{"role": "assistant", "content": format!("step {n}")}]}),
        1 => json!({"messages": [{"id": "shared", "role": "assistant", "content": n}],
                    "decisions": [{"summary": "keep it", "rationale": "simpler",
                                   "related_artifacts": ["a.ts"]}]}),
        2 => json!({"messages": [{"type": "remove", "id": "shared"}]}),
        3 => json!({"messages": [{"type": "remove", "id": "__remove_all__"}]}),
        _ => json!({}),
    };
    serde_json::from_value(notes).expect("the notes drawn are valid")
}

/// A condition expression, parsed as a condition step's `condition` is.
///
/// Invariants: a condition parses to the same tree in brackets one level deeper, and under `!`
/// to its negation; every path it reads parses again from its own text; it evaluates.
pub fn condition(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let limits = Limits::default();
    if text.chars().count() > limits.max_expression_len {
        return;
    }
    let depth = limits.max_expression_depth;
    let Ok(expr) = Expr::parse(&text, depth) else {
        return;
    };
    let trimmed = text.trim();
    let bracketed = Expr::parse(&format!("({trimmed})"), depth + 1);
    assert_eq!(
        bracketed.as_ref(),
        Ok(&expr),
        "({trimmed}) parses as {trimmed}"
    );
    let negated = Expr::parse(&format!("!({trimmed})"), depth + 2);
    assert_eq!(negated, Ok(Expr::Not(Box::new(expr.clone()))));
    for path in expr.paths() {
        assert_eq!(Path::parse(&path.text).as_ref(), Ok(path));
        let _ = path.first_context_key();
    }
    let scope = FuzzScope::new();
    let value = expr.evaluate(&scope);
    assert_eq!(value.truthy(), expr.is_true(&scope));
}

/// A transform's path.
///
/// Invariants: its text is the trimmed input and parses again to the same path; resolving it
/// leniently and strictly agree.
pub fn path(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if text.chars().count() > Limits::default().max_expression_len {
        return;
    }
    let Ok(path) = Path::parse(&text) else {
        return;
    };
    assert_eq!(path.text, text.trim());
    assert_eq!(Path::parse(&path.text).as_ref(), Ok(&path));
    let scope = FuzzScope::new();
    assert_eq!(path.resolve_strict(&scope).ok(), path.resolve(&scope));
    let _ = path.first_context_key();
}

/// A `jq:` program, compiled as a transform's is (never run).
///
/// Invariants: a compiled program keeps its source; a refused one says whether it did not parse
/// or did not compile.
pub fn jq(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if text.chars().count() > Limits::default().max_jq_len {
        return;
    }
    match JqProgram::compile(&text) {
        Ok(program) => assert_eq!(program.source(), text),
        Err(error) => assert!(
            error.starts_with("cannot parse jq program")
                || error.starts_with("cannot compile jq program"),
            "{error}"
        ),
    }
}

/// A payload by reference: an arbitrary payload's manifest and parts, spliced back together;
/// then the rest of the input read as a manifest off the wire.
///
/// Invariants: splicing gives the bytes of the whole payload; the manifest survives its JSON; a
/// part missing is named, never spliced around; any manifest that reads splices into JSON.
pub fn manifest(data: &[u8]) {
    let mut u = Unstructured::new(data);
    if let Ok((payload, missing)) = arbitrary_payload(&mut u) {
        let mut parts: HashMap<String, Vec<u8>> = HashMap::new();
        let made = Manifest::of(&payload, |value| {
            let bytes = serde_json::to_vec(value.as_ref()).expect("a part serialises");
            let digest = hex::encode(Sha256::digest(&bytes));
            parts.insert(digest.clone(), bytes);
            digest
        });
        assert_eq!(spliced(&payload), payload.to_json());
        let count = made.parts().count();
        let (key, digest) = made
            .parts()
            .nth(missing % count)
            .map(|(key, digest)| (key.to_owned(), digest.to_owned()))
            .expect("a manifest names at least its input and messages");
        parts.remove(&digest);
        let error = assemble(&made, |d| parts.get(d).map(Vec::as_slice))
            .expect_err("a payload with a part missing is not spliced");
        assert_eq!(error.digest, digest, "the missing part ({key}) is named");
    }
    let rest = u.take_rest();
    let Ok(received) = serde_json::from_slice::<Manifest>(rest) else {
        return;
    };
    let spliced = assemble(&received, |_| Some(b"null".as_slice()))
        .expect("every part is found when every part is null");
    // The handoff nests as deep as the manifest allowed, and one level more in the payload:
    // deeper than serde_json reads.
    if text_nesting_depth(&String::from_utf8_lossy(rest)) < 100 {
        let payload: Value = serde_json::from_slice(&spliced).expect("a spliced payload is JSON");
        assert!(payload.is_object());
    }
}

/// A payload drawn from `u` (and which of its parts to drop).
fn arbitrary_payload(u: &mut Unstructured) -> arbitrary::Result<(AgentPayload, usize)> {
    let mut context = Context::new(json_value(u, 3)?);
    for visit in 0..u.int_in_range(0..=6)? {
        let key: Arc<str> = string(u, 12)?.into();
        let result = if u.ratio(1, 5)? {
            StepResult::failure(key.clone(), visit, string(u, 20)?.into())
        } else {
            StepResult::success(key.clone(), visit, Arc::new(json_value(u, 3)?))
        };
        context = context.with_result(key, result);
    }
    let reference = if u.arbitrary()? {
        Some((string(u, 12)?.into(), Arc::new(json_value(u, 3)?)))
    } else {
        None
    };
    let error = if u.arbitrary()? {
        Some(ErrorInfo {
            step: string(u, 12)?.into(),
            message: string(u, 40)?.into(),
        })
    } else {
        None
    };
    let messages = Arc::new(json_value(u, 3)?);
    // The engine's handoff record is an object: a `null` one would not survive the manifest's
    // JSON (`"handoff": null` reads back as no handoff).
    let handoff = if u.arbitrary()? {
        let mut value = json_value(u, 3)?;
        if !value.is_object() {
            value = json!({ "record": value });
        }
        Some(Arc::from(
            serde_json::value::to_raw_value(&value).expect("a value serialises"),
        ))
    } else {
        None
    };
    let map = if u.arbitrary()? {
        Some(Arc::new(serde_json::json!({
            "step": "each",
            "item": json_value(u, 3)?,
            "index": u.int_in_range(0..=99_999u32)?,
            "count": 100_000,
        })))
    } else {
        None
    };
    let payload = AgentPayload {
        context,
        reference,
        error,
        messages,
        handoff,
        map,
    };
    Ok((payload, u.arbitrary()?))
}

/// An agent's notes, as the coordinator reads them from a result.
///
/// Invariants: notes that read write back to notes that read the same; their messages merge
/// into a history (or name the removal that cannot be made), the history never longer than
/// before plus the messages.
pub fn notes(data: &[u8]) {
    let Ok(notes) = AgentNotes::from_json(data) else {
        return;
    };
    let written = serde_json::to_vec(&notes).expect("notes serialise");
    let back = AgentNotes::from_json(&written).expect("written notes read back");
    assert_eq!(back.messages.len(), notes.messages.len());
    assert_eq!(back.decisions, notes.decisions);
    let history = vec![Message {
        id: "m1".to_owned(),
        role: "user".to_owned(),
        content: json!("dark mode"),
        name: None,
        metadata: None,
    }];
    let count = notes.messages.len();
    if let Ok(merged) = add_messages(&history, notes.messages, "step", 1, "agent") {
        assert!(merged.len() <= history.len() + count);
        assert!(serde_json::to_vec(&merged).is_ok());
    }
}

/// What conditions and paths are evaluated against in these targets: a little of every kind
/// of JSON.
struct FuzzScope {
    input: Value,
    context: Value,
}

impl FuzzScope {
    fn new() -> Self {
        Self {
            input: json!({"priority": 3, "name": "toggle", "tags": [], "0": [1, 2]}),
            context: json!({
                "parallel-tests": {"success": true, "data": [{"stepId": "unit", "result": {"failed": 0}}]},
                "review": {"approved": false, "score": 7.5, "comment": "", "count": "7"},
                "a": {"b": [null, true, "x", {"c": -1}]},
                "0": 0,
            }),
        }
    }
}

impl Scope for FuzzScope {
    fn input(&self) -> &Value {
        &self.input
    }

    fn result(&self, key: &str) -> Option<&Value> {
        self.context.get(key)
    }

    fn to_document(&self) -> Value {
        json!({"input": self.input, "context": self.context})
    }
}

/// A JSON value drawn from `u`, nesting at most `depth` levels below it.
pub fn json_value(u: &mut Unstructured, depth: u32) -> arbitrary::Result<Value> {
    let kinds = if depth == 0 { 5 } else { 7 };
    Ok(match u.choose_index(kinds)? {
        0 => Value::Null,
        1 => Value::Bool(u.arbitrary()?),
        2 => {
            if u.arbitrary()? {
                Value::from(u.arbitrary::<i64>()?)
            } else {
                Value::from(u.arbitrary::<u64>()?)
            }
        }
        3 => Number::from_f64(u.arbitrary()?).map_or(Value::Null, Value::Number),
        4 => Value::String(string(u, 24)?),
        5 => {
            let len = u.int_in_range(0..=4)?;
            Value::Array(
                (0..len)
                    .map(|_| json_value(u, depth - 1))
                    .collect::<arbitrary::Result<_>>()?,
            )
        }
        _ => {
            let mut object = Map::new();
            for _ in 0..u.int_in_range(0..=4)? {
                object.insert(string(u, 12)?, json_value(u, depth - 1)?);
            }
            Value::Object(object)
        }
    })
}

/// A string drawn from `u`, at most `max_chars` characters long.
pub fn string(u: &mut Unstructured, max_chars: usize) -> arbitrary::Result<String> {
    let text: String = u.arbitrary()?;
    Ok(text.chars().take(max_chars).collect())
}

/// JSON text scanned for integer literals beyond 64 bits ([`crate::big_integers`]).
///
/// Invariants: every literal found is an integer that fits in no 64-bit integer and its path
/// starts at `$`; text serde_json reads holds one exactly when the scan of it, guarded by the
/// value read, finds one, and the value at that path is the float it was rounded to.
pub fn big_integers_in(data: &[u8]) {
    for found in big_integers(data).take(1_000) {
        let digits = found.literal.strip_prefix('-').unwrap_or(found.literal);
        assert!(digits.bytes().all(|b| b.is_ascii_digit()), "{found:?}");
        assert!(
            found.literal.parse::<i64>().is_err() && found.literal.parse::<u64>().is_err(),
            "{found:?}"
        );
        assert!(found.path.starts_with('$'), "{found:?}");
        let _ = found.problem();
    }
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    // With a key repeated, the value keeps the last member, so a literal of an earlier one
    // may be gone from it (and nothing was rounded that anyone reads).
    if serde_json::from_slice::<UniqueKeys>(data).is_err() {
        return;
    }
    // The guard (no float in the value, so no scan) skips nothing the scan would find.
    assert_eq!(first_big_integer(data, &value), big_integers(data).next());
}

/// JSON whose objects repeat no key; reading anything else fails.
struct UniqueKeys;

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueKeysVisitor)
    }
}

struct UniqueKeysVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueKeysVisitor {
    type Value = UniqueKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON without repeated keys")
    }

    fn visit_bool<E>(self, _: bool) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_i64<E>(self, _: i64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_u64<E>(self, _: u64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_f64<E>(self, _: f64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_str<E>(self, _: &str) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_unit<E>(self) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueKeys, A::Error> {
        while seq.next_element::<UniqueKeys>()?.is_some() {}
        Ok(UniqueKeys)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<UniqueKeys, A::Error> {
        let mut keys = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !keys.insert(key) {
                return Err(serde::de::Error::custom("a repeated key"));
            }
            map.next_value::<UniqueKeys>()?;
        }
        Ok(UniqueKeys)
    }
}
