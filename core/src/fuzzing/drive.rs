//! A valid workflow run as a coordinator would run it, with answers the input's bytes choose,
//! checking what the engine promises on the way: payloads splice back from their manifests,
//! pending tasks are rebuilt as dispatched, and the stored events replay to the same run.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::payloads::spliced;
use crate::eval::{JqProgram, JqRunner, JqSite, install_jq_runner};
use crate::handoff::AgentNotes;
use crate::{Action, Decision, Event, Run, RunStatus, TaskId, Waiting, Workflow};

/// How many events a fuzzed run is driven through at most.
const MAX_EVENTS: usize = 48;

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
pub(super) fn drive(workflow: Arc<Workflow>, data: &[u8]) {
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
                    data: data.into(),
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
