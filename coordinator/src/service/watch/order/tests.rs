use super::*;
use crate::store::OutputOffset;

fn sequence() -> Sequence {
    let workflow = baton_core::parse_workflow(
        r#"{"steps": [
            {"id": "draft", "type": "agent", "agent": "talker", "next": "polish"},
            {"id": "polish", "type": "agent", "agent": "talker"}
        ]}"#,
    )
    .unwrap()
    .workflow;
    Sequence::new(agent_steps(&workflow))
}

fn started(step: &str, attempt: u32, worker: &str) -> RunEvent {
    RunEvent::StepStarted {
        step_id: step.into(),
        visit: 1,
        agent: "talker".into(),
        worker_id: Some(worker.into()),
        attempt,
    }
}

fn output(step: &str, attempt: u32, worker: &str, text: &str, seq: u64) -> RunEvent {
    RunEvent::StepOutput {
        step_id: step.into(),
        visit: 1,
        attempt,
        text: text.into(),
        restart: false,
        offset: OutputOffset { ms: 1, seq },
        worker_id: Some(worker.into()),
    }
}

fn finished(step: &str, position: usize, answered_by: Option<(u32, &str)>) -> RunEvent {
    RunEvent::StepFinished {
        step_id: step.into(),
        visit: 1,
        status: baton_core::StepStatus::Succeeded,
        data: None,
        encoded: None,
        error: String::new(),
        next: String::new(),
        parent: String::new(),
        position,
        answered_by: answered_by.map(|(attempt, worker)| (attempt, worker.into())),
    }
}

fn told(sequence: &mut Sequence) -> Vec<RunEvent> {
    std::iter::from_fn(|| sequence.pop()).collect()
}

#[test]
fn output_of_a_step_not_told_started_waits_for_a_catch_up_then_follows_its_start() {
    let mut sequence = sequence();
    sequence.push(started("draft", 1, "w1"));
    assert_eq!(told(&mut sequence), [started("draft", 1, "w1")]);
    // The next step's output comes through the store before this watch heard the draft end.
    sequence.push(output("polish", 1, "w1", "Hel", 1));
    sequence.push(output("polish", 1, "w1", "lo", 2));
    assert!(told(&mut sequence).is_empty(), "held back");
    assert!(sequence.wants_catch_up());
    sequence.catching_up();
    assert!(!sequence.wants_catch_up(), "one catch-up covers it");
    // The catch-up tells the draft's end; the store does not know who runs polish yet.
    sequence.push(finished("draft", 0, Some((1, "w1"))));
    assert_eq!(told(&mut sequence), [finished("draft", 0, Some((1, "w1")))]);
    sequence.caught_up();
    assert_eq!(
        told(&mut sequence),
        [
            started("polish", 1, "w1"),
            output("polish", 1, "w1", "Hel", 1),
            output("polish", 1, "w1", "lo", 2)
        ]
    );
    // The start heard later, from the store or this coordinator, is not told again.
    sequence.push(started("polish", 1, "w1"));
    sequence.push(output("polish", 1, "w1", "!", 3));
    assert_eq!(told(&mut sequence), [output("polish", 1, "w1", "!", 3)]);
}

#[test]
fn only_a_catch_up_that_began_after_the_output_came_lets_it_go() {
    let mut sequence = sequence();
    sequence.catching_up();
    // Read after the catch-up's read of the run: the run may have moved on meanwhile.
    sequence.push(output("draft", 1, "w1", "x", 1));
    sequence.caught_up();
    assert!(told(&mut sequence).is_empty());
    assert!(sequence.wants_catch_up());
}

#[test]
fn a_start_heard_lets_the_output_held_go_at_once() {
    let mut sequence = sequence();
    sequence.push(output("draft", 1, "w1", "x", 1));
    sequence.push(started("draft", 1, "w1"));
    assert_eq!(
        told(&mut sequence),
        [started("draft", 1, "w1"), output("draft", 1, "w1", "x", 1)]
    );
    assert!(!sequence.wants_catch_up());
}

#[test]
fn a_step_that_settled_unseen_is_told_started_on_the_worker_that_answered_before_its_output_and_end()
 {
    let mut sequence = sequence();
    sequence.push(output("draft", 2, "w2", "x", 1));
    // A catch-up from the store tells the end; the output's attempt goes first.
    sequence.catching_up();
    sequence.push(finished("draft", 0, Some((2, "w2"))));
    sequence.push(finished("polish", 1, Some((1, "w1"))));
    assert_eq!(
        told(&mut sequence),
        [
            started("draft", 2, "w2"),
            output("draft", 2, "w2", "x", 1),
            finished("draft", 0, Some((2, "w2"))),
            started("polish", 1, "w1"),
            finished("polish", 1, Some((1, "w1")))
        ]
    );
    sequence.caught_up();
    assert!(told(&mut sequence).is_empty());
}

#[test]
fn each_event_is_told_once_and_nothing_of_a_settled_visit_after_its_end() {
    let mut sequence = sequence();
    for _ in 0..2 {
        sequence.push(started("draft", 1, "w1"));
        sequence.push(output("draft", 1, "w1", "x", 1));
        sequence.push(finished("draft", 0, Some((1, "w1"))));
    }
    // A start heard late (this coordinator's, after a catch-up told the end) is stale.
    sequence.push(started("draft", 1, "w1"));
    sequence.push(output("draft", 1, "w1", "late", 2));
    assert_eq!(
        told(&mut sequence),
        [
            started("draft", 1, "w1"),
            output("draft", 1, "w1", "x", 1),
            finished("draft", 0, Some((1, "w1")))
        ]
    );
    assert_eq!(sequence.settled(), 1);
    assert!(sequence.told_started("draft", 1));
    assert!(!sequence.told_started("polish", 1));
}

#[test]
fn another_attempt_is_told_started_before_its_output() {
    let mut sequence = sequence();
    sequence.push(started("draft", 1, "w1"));
    sequence.push(output("draft", 2, "w2", "again", 1));
    sequence.push(started("draft", 1, "w1"));
    sequence.push(started("draft", 2, "w2"));
    assert_eq!(
        told(&mut sequence),
        [
            started("draft", 1, "w1"),
            started("draft", 2, "w2"),
            output("draft", 2, "w2", "again", 1)
        ]
    );
}

#[test]
fn the_end_of_the_run_lets_everything_held_go_before_it_and_nothing_after() {
    let mut sequence = sequence();
    sequence.push(output("draft", 1, "w1", "x", 1));
    let end = RunEvent::OutputMissed { pieces: 0 };
    sequence.push(end.clone());
    assert_eq!(told(&mut sequence), [end]);
    let record = crate::record::RunRecord {
        run_id: "r".into(),
        workflow_id: "w".into(),
        status: baton_core::RunStatus::Cancelled,
        error: String::new(),
        context: Vec::new(),
        steps: Vec::new(),
        waiting: Vec::new(),
        state_sha256: String::new(),
        created_ms: 0,
        updated_ms: 0,
        memory: Vec::new(),
        trace_id: String::new(),
        submitted_by: String::new(),
        usage: Vec::new(),
    };
    sequence.push(RunEvent::finished(record.clone()));
    sequence.push(started("polish", 1, "w1"));
    assert!(sequence.done());
    assert_eq!(
        told(&mut sequence),
        [
            started("draft", 1, "w1"),
            output("draft", 1, "w1", "x", 1),
            RunEvent::finished(record)
        ]
    );
}

#[test]
fn a_map_s_items_stream_without_a_start_of_their_own() {
    let workflow = baton_core::parse_workflow(
        r#"{"steps": [
            {"id": "each", "type": "map", "items": "input", "agent": "tester", "next": "triage"},
            {"id": "triage", "type": "map", "items": "input", "steps": [
                {"id": "explain", "type": "agent", "agent": "explainer"}
            ]},
            {"id": "review", "type": "agent", "agent": "reviewer"}
        ]}"#,
    )
    .unwrap()
    .workflow;
    let agents = agent_steps(&workflow);
    assert_eq!(
        agents,
        HashMap::from([("review".to_owned(), AgentName::from("reviewer"))])
    );
    let mut sequence = Sequence::new(agents);
    sequence.push(output("each", 1, "w1", "item", 1));
    sequence.push(output("explain", 1, "w1", "chain", 2));
    assert_eq!(
        told(&mut sequence),
        [
            output("each", 1, "w1", "item", 1),
            output("explain", 1, "w1", "chain", 2)
        ]
    );
}
