use serde_json::json;

use super::*;

#[test]
fn logged_events_round_trip_and_old_entries_read_with_no_time() {
    let logged = LoggedEvent::new(
        1_795_428_000_000,
        StoredEvent::AgentSucceeded {
            task: TaskId::new("plan", 1),
            result: "plan#1".into(),
            worker_id: "w1".into(),
            notes: AgentNotes::from_json(br#"{"decisions": [{"summary": "s"}]}"#).unwrap(),
        },
    );
    let bytes = serde_json::to_vec(&logged).unwrap();
    assert_eq!(
        serde_json::from_slice::<LoggedEvent>(&bytes).unwrap(),
        logged
    );
    assert!(
        !String::from_utf8(bytes).unwrap().contains("jq"),
        "no jq ran: nothing is written for it"
    );
    let continued = LoggedEvent {
        jq: vec![
            JqRecord {
                at: "shape#1".into(),
                cpu_us: 1_250,
                error: None,
            },
            JqRecord {
                at: "each#2/items".into(),
                cpu_us: 7,
                error: Some("jq error: boom".into()),
            },
        ],
        ..LoggedEvent::new(5, StoredEvent::Continue)
    };
    let bytes = serde_json::to_vec(&continued).unwrap();
    assert_eq!(
        serde_json::from_slice::<LoggedEvent>(&bytes).unwrap(),
        continued
    );
    assert_eq!(
        continued.event.to_event(|_| None),
        Ok(Some(Event::Continue))
    );
    assert_eq!(StoredEvent::Started.to_event(|_| None), Ok(None));
    let old = json!({"event": "cancel", "reason": "stop"}).to_string();
    let read: LoggedEvent = serde_json::from_str(&old).unwrap();
    assert_eq!(read.at_ms, 0);
    assert_eq!(
        read.event,
        StoredEvent::Cancel {
            reason: "stop".into()
        }
    );
}

#[test]
fn states_are_stored_by_their_old_names() {
    let entry = TaskEntry {
        agent: "coder".into(),
        state: TaskState::TimingOut,
        attempt: 2,
        ..TaskEntry::default()
    };
    let text = String::from_utf8(entry.encode()).unwrap();
    assert!(text.contains(r#""state":"timing_out""#), "{text}");
    let step = StepState {
        status: StepStatus::Retrying,
        visits: 1,
        ..StepState::default()
    };
    assert_eq!(
        serde_json::to_string(&step).unwrap(),
        r#"{"status":"retrying","visits":1,"attempts":0}"#
    );
    for status in [StepStatus::Pending, StepStatus::Cancelled] {
        let text = serde_json::to_string(&status).unwrap();
        assert_eq!(text, format!("\"{}\"", status.as_str()));
    }
}

#[test]
fn a_stored_event_is_built_from_the_engine_event_it_records() {
    let task = TaskId::new("plan", 2);
    let succeeded = Event::AgentSucceeded {
        task: task.clone(),
        data: json!({"big": "data"}).into(),
        notes: AgentNotes::default(),
    };
    let stored = StoredEvent::of(&succeeded, "w1").unwrap();
    assert_eq!(
        stored,
        StoredEvent::AgentSucceeded {
            task,
            result: "plan#2".into(),
            worker_id: "w1".into(),
            notes: AgentNotes::default(),
        }
    );
    let rebuilt = stored.to_event(|key| (key == "plan#2").then(|| json!({"big": "data"})));
    assert_eq!(rebuilt.unwrap(), Some(succeeded));
    assert_eq!(
        StoredEvent::of(&Event::Halt { error: "x".into() }, ""),
        None
    );
}

/// The texts between `start` and the next of `end` in `text`, each quoted by `quote`: a list of
/// statuses as a document writes it.
fn listed(text: &str, start: &str, end: &[char], quote: char) -> Vec<String> {
    let at = text
        .find(start)
        .unwrap_or_else(|| panic!("no {start:?} in the text"));
    let rest = &text[at + start.len()..];
    let list = &rest[..rest.find(end).expect("the list ends")];
    list.split(quote)
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Every run status and every step status appears, in order, wherever statuses are listed: the
/// book's run record (docs/src/handoffs.md) and the web UI's filter and legend (the CLI's `--status` takes
/// `RunStatus::ALL` itself).
#[test]
fn every_status_is_listed_where_statuses_are_listed() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |path: &str| std::fs::read_to_string(root.join(path)).unwrap();
    let runs: Vec<String> = baton_core::RunStatus::ALL
        .iter()
        .map(|status| status.as_str().to_owned())
        .collect();
    let steps: Vec<String> = StepStatus::ALL
        .iter()
        .map(|status| status.as_str().to_owned())
        .collect();
    let readme = read("docs/src/handoffs.md").replace('\n', " ");
    // The book's lists end at their `)`, or at the `;` before what they explain.
    let end = [')', ';'];
    assert_eq!(listed(&readme, "`run_id`, `status` (", &end, '`'), runs);
    assert_eq!(listed(&readme, "`type`, `status` (", &end, '`'), steps);
    let config = read("coordinator/src/web/assets/js/config.js");
    assert_eq!(listed(&config, "RUN_STATUSES = [", &[']'], '\''), runs);
    assert_eq!(listed(&config, "STEP_STATUSES = [", &[']'], '\''), steps);
}
