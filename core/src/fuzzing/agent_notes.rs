//! The notes target: an agent's notes as the coordinator reads them from a result, and their
//! messages merged into a history.

use serde_json::json;

use crate::handoff::AgentNotes;
use crate::messages::{Message, add_messages};

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
