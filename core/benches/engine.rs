//! Micro-benchmarks of the engine's hot path: one transition, building a payload, hashing it.
//!
//! `cargo bench -p baton-core`. The end-to-end numbers (Redis, gRPC, workers) come from
//! `baton bench`; these isolate what the engine itself costs per step.

use std::hint::black_box;
use std::sync::Arc;

use baton_core::payload::assemble;
use baton_core::{Action, Event, Manifest, Run, Workflow, parse_workflow};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use sha2::Digest;

/// A chain of `n` agent steps.
fn chain(n: usize) -> Arc<Workflow> {
    let steps: Vec<Value> = (0..n)
        .map(|i| json!({"id": format!("s{i}"), "type": "agent", "agent": "noop"}))
        .collect();
    let text = json!({"id": "chain", "steps": steps}).to_string();
    Arc::new(parse_workflow(&text).unwrap().workflow)
}

/// Runs a chain to just before its last step, each step returning `data`.
fn run_until_last(workflow: &Arc<Workflow>, data: &Value) -> (Run, Action) {
    let transition = Run::start(workflow.clone(), json!("input"));
    let (mut run, mut action) = (
        transition.run,
        transition.actions.into_iter().next().unwrap(),
    );
    for _ in 1..workflow.steps().len() {
        let Action::Dispatch(task) = action else {
            unreachable!()
        };
        let next = run
            .apply(Event::AgentSucceeded {
                task: task.task,
                data: data.clone().into(),
                notes: Default::default(),
            })
            .unwrap();
        run = next.run;
        action = next.actions.into_iter().next().unwrap();
    }
    (run, action)
}

fn transitions(c: &mut Criterion) {
    let small = json!({"ok": true, "i": 1});
    for steps in [10, 200] {
        let workflow = chain(steps);
        let (run, action) = run_until_last(&workflow, &small);
        let Action::Dispatch(task) = action else {
            unreachable!()
        };
        c.bench_function(
            &format!("transition/agent result, step {steps} of a chain"),
            |b| {
                b.iter_batched(
                    || Event::AgentSucceeded {
                        task: task.task.clone(),
                        data: small.clone().into(),
                        notes: Default::default(),
                    },
                    // At a real time, as the coordinator applies events (handoffs and
                    // decisions are stamped with it).
                    |event| black_box(run.apply_at(event, 1_795_428_000_000).unwrap()),
                    BatchSize::SmallInput,
                )
            },
        );
    }
    let fan_out: Vec<Value> = (0..500)
        .map(|i| json!({"id": format!("b{i}"), "type": "agent", "agent": "noop"}))
        .collect();
    let text = json!({"steps": [{"id": "fan", "type": "parallel", "steps": fan_out}]}).to_string();
    let workflow = Arc::new(parse_workflow(&text).unwrap().workflow);
    c.bench_function("transition/start a 500-branch parallel step", |b| {
        b.iter(|| black_box(Run::start(workflow.clone(), json!("input"))))
    });
}

fn payloads(c: &mut Criterion) {
    // W4's shape: 199 earlier results of 64 KiB each in the context.
    let big = json!({"ok": true, "text": "x".repeat(64 * 1024)});
    let workflow = chain(200);
    let (_, action) = run_until_last(&workflow, &big);
    let Action::Dispatch(task) = action else {
        unreachable!()
    };
    let payload = task.payload;
    c.bench_function("payload/serialise 199 x 64 KiB context", |b| {
        b.iter(|| black_box(payload.to_json()))
    });
    let bytes = payload.to_json();
    c.bench_function("payload/sha256 of 12.7 MB", |b| {
        b.iter(|| black_box(hex::encode(sha2::Sha256::digest(&bytes))))
    });
    // By reference: the manifest of that payload when every part's digest is already known
    // (the coordinator's per-run encoder), and the worker splicing the payload from its parts.
    let mut digests = std::collections::HashMap::new();
    let mut parts = std::collections::HashMap::new();
    for (_, data) in payload.context.visible() {
        let bytes = serde_json::to_vec(data.as_ref()).unwrap();
        let digest = hex::encode(sha2::Sha256::digest(&bytes));
        digests.insert(Arc::as_ptr(data) as usize, digest.clone());
        parts.insert(digest, bytes);
    }
    let input = serde_json::to_vec(payload.context.input().as_ref()).unwrap();
    let input_digest = hex::encode(sha2::Sha256::digest(&input));
    digests.insert(
        Arc::as_ptr(payload.context.input()) as usize,
        input_digest.clone(),
    );
    parts.insert(input_digest, input);
    let messages = serde_json::to_vec(payload.messages.as_ref()).unwrap();
    let messages_digest = hex::encode(sha2::Sha256::digest(&messages));
    digests.insert(
        Arc::as_ptr(&payload.messages) as usize,
        messages_digest.clone(),
    );
    parts.insert(messages_digest, messages);
    c.bench_function(
        "payload/manifest of 199 known parts, serialised and hashed",
        |b| {
            b.iter(|| {
                let manifest =
                    Manifest::of(&payload, |v| digests[&(Arc::as_ptr(v) as usize)].clone());
                let bytes = serde_json::to_vec(&manifest).unwrap();
                black_box(hex::encode(sha2::Sha256::digest(&bytes)))
            })
        },
    );
    let manifest = Manifest::of(&payload, |v| digests[&(Arc::as_ptr(v) as usize)].clone());
    c.bench_function("payload/splice 12.7 MB from 200 parts", |b| {
        b.iter(|| black_box(assemble(&manifest, |d| parts.get(d).map(Vec::as_slice)).unwrap()))
    });
    let small = json!({"input": "x", "context": {"plan": {"files": ["a", "b"]}}});
    c.bench_function("payload/serialise and sha256 a small payload", |b| {
        b.iter(|| {
            let bytes = serde_json::to_vec(&small).unwrap();
            black_box(hex::encode(sha2::Sha256::digest(&bytes)))
        })
    });
}

/// What the state chain costs per settled step: the outcome's canonical hash, then the link.
fn integrity(c: &mut Criterion) {
    let workflow = chain(10);
    let (run, action) = run_until_last(&workflow, &json!({"ok": true, "i": 1}));
    let Action::Dispatch(task) = action else {
        unreachable!()
    };
    let settled = run
        .apply_at(
            Event::AgentSucceeded {
                task: task.task,
                data: json!({"ok": true, "i": 1}).into(),
                notes: Default::default(),
            },
            1_795_428_000_000,
        )
        .unwrap()
        .run;
    let record = settled.history().last().unwrap().clone();
    c.bench_function("integrity/hash a small outcome and link it", |b| {
        b.iter(|| {
            let result = black_box(&record).result_sha256();
            black_box(baton_core::integrity::ChainLink::after(
                "0".repeat(64).as_str(),
                &record.step_id,
                record.visit,
                result,
            ))
        })
    });
}

/// A run of one map step over `n` items (256 in flight), halfway through: every item answered
/// in order until half have settled. Returns the run and the next item's task to answer.
fn half_done_map(n: usize) -> (Run, baton_core::TaskId) {
    let text = json!({"steps": [{"id": "each", "type": "map", "items": "input",
        "agent": "noop", "max_concurrency": 256}]})
    .to_string();
    let workflow = Arc::new(parse_workflow(&text).unwrap().workflow);
    let transition = Run::start(workflow, json!((0..n).collect::<Vec<_>>()));
    let mut run = transition.run;
    let mut waiting: std::collections::VecDeque<baton_core::TaskId> = transition
        .actions
        .into_iter()
        .filter_map(|action| match action {
            Action::Dispatch(task) => Some(task.task),
            _ => None,
        })
        .collect();
    for _ in 0..n / 2 {
        let task = waiting.pop_front().unwrap();
        let next = run
            .apply_at(
                Event::AgentSucceeded {
                    task,
                    data: json!({"ok": true}).into(),
                    notes: Default::default(),
                },
                1_795_428_000_000,
            )
            .unwrap();
        run = next.run;
        waiting.extend(next.actions.into_iter().filter_map(|action| match action {
            Action::Dispatch(task) => Some(task.task),
            _ => None,
        }));
    }
    (run, waiting.pop_front().unwrap())
}

/// Settling one item of a map, halfway through maps of 1,000 to 100,000 items: what the engine
/// costs per item as a map grows (it should barely).
fn map_items(c: &mut Criterion) {
    for n in [1_000, 10_000, 100_000] {
        let (run, task) = half_done_map(n);
        c.bench_function(
            &format!("transition/map item, halfway through {n} items"),
            |b| {
                b.iter_batched(
                    || Event::AgentSucceeded {
                        task: task.clone(),
                        data: json!({"ok": true}).into(),
                        notes: Default::default(),
                    },
                    |event| black_box(run.apply_at(event, 1_795_428_000_000).unwrap()),
                    BatchSize::SmallInput,
                )
            },
        );
    }
}

criterion_group!(benches, transitions, payloads, integrity, map_items);
criterion_main!(benches);
