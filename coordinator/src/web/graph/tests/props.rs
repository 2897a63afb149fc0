//! Random workflows keep every promise: top-level agents, transforms, conditions, approvals,
//! parallel steps (some of many branches, some nesting a parallel step or a map) and map steps
//! (an agent, or a chain that routes and loops inside), routed anywhere, loops included.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::{invariants, layout, parse};

/// One top-level step as drawn from the strategy: its kind, where its routings point (taken
/// modulo the step count), a size (branches, chain length) and option bits.
type Raw = (u8, [u16; 4], usize, u8);

fn raw_step() -> impl Strategy<Value = Raw> {
    (0_u8..7, any::<[u16; 4]>(), 1_usize..30, any::<u8>())
}

/// Adds `next`, `end` and `on_error` to an agent-like step, as the bits say.
fn route(step: &mut Value, bits: u8, targets: &[String]) {
    if bits & 1 != 0 {
        step["next"] = json!(targets[0]);
    } else if bits & 4 != 0 {
        step["end"] = json!(true);
    }
    if bits & 2 != 0 {
        step["on_error"] = json!(targets[1]);
    }
}

fn branch(parent: &str, j: usize, bits: u8) -> Value {
    let id = format!("{parent}-b{j}");
    match j {
        0 if bits & 8 != 0 => json!({"id": id, "type": "parallel", "steps": [
            {"id": format!("{id}-x"), "type": "agent", "agent": "x"},
            {"id": format!("{id}-y"), "type": "transform", "transform": "input"}
        ]}),
        1 if bits & 16 != 0 => json!({"id": id, "type": "map", "items": "input.list", "steps": [
            {"id": format!("{id}-c0"), "type": "agent", "agent": "x", "on_error": format!("{id}-c1")},
            {"id": format!("{id}-c1"), "type": "agent", "agent": "y"}
        ]}),
        _ => json!({"id": id, "type": "agent", "agent": "worker"}),
    }
}

/// A chain of `length` steps that route within it as `picks` say (loops included).
fn chain(parent: &str, length: usize, picks: [u16; 4], bits: u8) -> Vec<Value> {
    let ids: Vec<String> = (0..length).map(|j| format!("{parent}-c{j}")).collect();
    let target = |k: usize, j: usize| ids[(picks[k] as usize + j) % length].clone();
    (0..length)
        .map(|j| {
            let id = ids[j].clone();
            match (picks[(j + 2) % 4] as usize + j) % 3 {
                0 => json!({"id": id, "type": "condition", "condition": "map.index === 0",
                            "then": target(0, j), "else": target(1, j)}),
                1 => {
                    let mut step = json!({"id": id, "type": "agent", "agent": "link"});
                    route(&mut step, bits >> (j % 4), &[target(2, j), target(3, j)]);
                    step
                }
                _ => json!({"id": id, "type": "transform", "transform": "map.item"}),
            }
        })
        .collect()
}

fn workflow(raws: &[Raw]) -> String {
    let ids: Vec<String> = (0..raws.len()).map(|i| format!("s{i}")).collect();
    let steps: Vec<Value> = raws
        .iter()
        .enumerate()
        .map(|(i, &(kind, picks, size, bits))| {
            let targets: Vec<String> = picks
                .iter()
                .map(|&p| ids[p as usize % ids.len()].clone())
                .collect();
            let id = ids[i].clone();
            match kind {
                0 | 1 => {
                    let mut step = if kind == 0 {
                        json!({"id": id, "type": "agent", "agent": "worker"})
                    } else {
                        json!({"id": id, "type": "transform", "transform": "input"})
                    };
                    route(&mut step, bits, &targets);
                    step
                }
                2 => {
                    let mut step = json!({"id": id, "type": "condition",
                                          "condition": "input.flag === true"});
                    if bits & 1 != 0 || bits & 2 == 0 {
                        step["then"] = json!(targets[0]);
                    }
                    if bits & 2 != 0 {
                        step["else"] = json!(targets[1]);
                    }
                    step
                }
                3 => {
                    let mut step = json!({"id": id, "type": "approval",
                        "message": "Does this long message about the plan read well when cut?"});
                    if bits & 1 != 0 {
                        step["on_approve"] = json!(targets[0]);
                    }
                    if bits & 2 != 0 {
                        step["on_reject"] = json!(targets[1]);
                    }
                    if bits & 4 != 0 {
                        step["on_error"] = json!(targets[2]);
                    }
                    step
                }
                4 => {
                    let branches: Vec<Value> = (0..size).map(|j| branch(&id, j, bits)).collect();
                    let mut step = json!({"id": id, "type": "parallel", "steps": branches});
                    route(&mut step, bits >> 5, &targets);
                    step
                }
                5 => {
                    let mut step = json!({"id": id, "type": "map", "items": "input.list",
                                          "agent": "worker"});
                    route(&mut step, bits, &targets);
                    step
                }
                _ => {
                    let steps = chain(&id, size % 5 + 1, picks, bits);
                    let mut step = json!({"id": id, "type": "map", "items": "input.list",
                                          "steps": steps});
                    route(&mut step, bits >> 4, &targets);
                    step
                }
            }
        })
        .collect();
    json!({"id": "random", "steps": steps}).to_string()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn random_workflows_keep_every_promise(raws in prop::collection::vec(raw_step(), 1..14)) {
        let text = workflow(&raws);
        let workflow = parse(&text);
        let graph = layout(&workflow);
        invariants::check(&workflow, &graph);
    }
}
