//! A test driver that plays the coordinator: it feeds the engine's actions back as events.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::Arc;

use baton_core::{Action, AgentTask, Decision, Event, Run, RunStatus, TaskId, parse_workflow};
use serde_json::Value;

pub struct Driver {
    pub run: Run,
    /// Every agent task dispatched, in dispatch order.
    pub dispatched: Vec<AgentTask>,
    /// Agent tasks not yet answered.
    pub queue: VecDeque<AgentTask>,
    /// Approval steps waiting, by step id.
    pub approvals: VecDeque<String>,
    pub abandoned: Vec<TaskId>,
    pub finished: Option<(RunStatus, Option<String>)>,
    /// Every event applied, for replay.
    pub events: Vec<Event>,
    /// The time each event was applied at; see `now_ms`.
    pub times: Vec<i64>,
    /// The time the next event is applied at (0: none, as before timestamps existed); each
    /// event moves it on by a second when it is set.
    pub now_ms: i64,
    /// The steps that run jq the walk stopped before, in order: the driver goes on at once
    /// with [`Event::Continue`], as a coordinator does when its turn comes.
    pub continued: Vec<String>,
    /// An [`Action::Continue`] not yet acted on.
    continuing: bool,
}

pub fn workflow(text: &str) -> Arc<baton_core::Workflow> {
    Arc::new(
        parse_workflow(text)
            .unwrap_or_else(|e| panic!("{e}"))
            .workflow,
    )
}

pub fn example(name: &str) -> String {
    let path = format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

impl Driver {
    pub fn start(text: &str, input: Value) -> Self {
        let transition = Run::start(workflow(text), input);
        let mut driver = Driver {
            run: transition.run,
            dispatched: Vec::new(),
            queue: VecDeque::new(),
            approvals: VecDeque::new(),
            abandoned: Vec::new(),
            finished: None,
            events: Vec::new(),
            times: Vec::new(),
            now_ms: 0,
            continued: Vec::new(),
            continuing: false,
        };
        driver.absorb(transition.actions);
        driver.go_on();
        driver
    }

    /// Applies [`Event::Continue`] while the run's walk stopped before a step that runs jq.
    fn go_on(&mut self) {
        while std::mem::take(&mut self.continuing) {
            self.apply(Event::Continue);
        }
    }

    fn absorb(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Dispatch(task) => {
                    self.dispatched.push(task.clone());
                    self.queue.push_back(task);
                }
                Action::AwaitApproval { step_id, .. } => {
                    self.approvals.push_back(step_id.to_string())
                }
                Action::Abandon(task) => self.abandoned.push(task),
                Action::Finished { status, error } => self.finished = Some((status, error)),
                Action::Continue { step_id } => {
                    self.continued.push(step_id.to_string());
                    self.continuing = true;
                }
            }
        }
    }

    pub fn apply(&mut self, event: Event) {
        let transition = self
            .run
            .apply_at(event.clone(), self.now_ms)
            .unwrap_or_else(|e| panic!("{e}"));
        self.events.push(event);
        self.times.push(self.now_ms);
        if self.now_ms != 0 {
            self.now_ms += 1_000;
        }
        self.run = transition.run;
        self.absorb(transition.actions);
        self.go_on();
    }

    /// Answers the oldest pending task of `step_id`.
    pub fn answer(&mut self, step_id: &str, result: Result<Value, &str>) -> AgentTask {
        let position = self
            .queue
            .iter()
            .position(|t| t.task.step_id.as_ref() == step_id)
            .unwrap_or_else(|| panic!("no task for {step_id}; queue: {:?}", self.queue_ids()));
        let task = self.queue.remove(position).unwrap();
        let event = match result {
            Ok(data) => Event::AgentSucceeded {
                task: task.task.clone(),
                data: data.into(),
                notes: Default::default(),
            },
            Err(error) => Event::AgentFailed {
                task: task.task.clone(),
                error: error.to_owned(),
            },
        };
        self.apply(event);
        task
    }

    /// Answers the oldest pending task of `step_id` with data and notes (`{"messages": [...],
    /// "decisions": [...]}`).
    pub fn answer_with(&mut self, step_id: &str, data: Value, notes: Value) -> AgentTask {
        let position = self
            .queue
            .iter()
            .position(|t| t.task.step_id.as_ref() == step_id)
            .unwrap_or_else(|| panic!("no task for {step_id}; queue: {:?}", self.queue_ids()));
        let task = self.queue.remove(position).unwrap();
        let notes = baton_core::handoff::AgentNotes::from_json(notes.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        self.apply(Event::AgentSucceeded {
            task: task.task.clone(),
            data: data.into(),
            notes,
        });
        task
    }

    /// The run rebuilt from the events applied so far, at their times.
    pub fn replayed(&self, workflow_text: &str, input: Value) -> Run {
        Run::replay_at(
            workflow(workflow_text),
            input,
            self.events.iter().cloned().zip(self.times.iter().copied()),
        )
        .unwrap_or_else(|(i, e)| panic!("event {i}: {e}"))
    }

    pub fn decide(&mut self, step_id: &str, decision: Decision) {
        let position = self
            .approvals
            .iter()
            .position(|s| s == step_id)
            .unwrap_or_else(|| panic!("{step_id} is not waiting for approval"));
        self.approvals.remove(position);
        self.apply(Event::ApprovalDecided {
            step_id: step_id.to_owned(),
            decision,
        });
    }

    pub fn queue_ids(&self) -> Vec<String> {
        self.queue
            .iter()
            .map(|t| t.task.step_id.to_string())
            .collect()
    }

    /// The payload the latest dispatch of `step_id` carried.
    pub fn payload_of(&self, step_id: &str) -> Value {
        self.dispatched
            .iter()
            .rev()
            .find(|t| t.task.step_id.as_ref() == step_id)
            .unwrap_or_else(|| panic!("{step_id} was never dispatched"))
            .payload
            .to_value()
    }
}

/// The payload as the spec defines it: without the `messages` and `handoff` keys Baton adds
/// (tested on their own in `handoffs.rs`).
pub fn spec(payload: &baton_core::AgentPayload) -> Value {
    let mut value = payload.to_value();
    let object = value.as_object_mut().expect("a payload is an object");
    object.remove("messages");
    object.remove("handoff");
    value
}
