//! A run's message history, merged with LangGraph's `add_messages` semantics.
//!
//! Agents may return messages besides their data. Each message has an `id`, a `role`, its
//! `content`, the `name` of the agent that wrote it and optional `metadata`. Merging an agent's
//! messages into the history ([`add_messages`]):
//! - appends a message whose id is new, in order;
//! - replaces in place a message whose id already exists;
//! - deletes by id on a removal marker `{"type": "remove", "id": ...}` (an unknown id is an
//!   error, as in LangGraph), and clears everything before it on
//!   `{"type": "remove", "id": "__remove_all__"}`.
//!
//! A message without an id gets `<step>#<visit>/<n>` (its step, the visit, its position in the
//! step's list), not a random one: replaying a run's events must rebuild the same history.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How many messages a run's history may hold: every agent payload carries all of them.
pub const MAX_HISTORY: usize = 10_000;

/// The id of a removal marker that clears the history before it.
pub const REMOVE_ALL_MESSAGES: &str = "__remove_all__";

/// One message of the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub id: String,
    pub role: String,
    pub content: Value,
    /// The agent that wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

/// A message as an agent returns it: a message, perhaps without an id, or a removal marker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageUpdate {
    Remove(Removal),
    Message(NewMessage),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Removal {
    #[serde(rename = "type")]
    pub kind: RemoveTag,
    pub id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RemoveTag {
    Remove,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewMessage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub role: String,
    pub content: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

/// Gives every message of `update` without an id the one [`add_messages`] would give it, and
/// returns the ids of the messages (not the removals), in order.
pub fn assign_ids(update: &mut [MessageUpdate], step_id: &str, visit: u32) -> Vec<String> {
    update
        .iter_mut()
        .enumerate()
        .filter_map(|(n, item)| match item {
            MessageUpdate::Message(message) => Some(
                message
                    .id
                    .get_or_insert_with(|| format!("{step_id}#{visit}/{n}"))
                    .clone(),
            ),
            MessageUpdate::Remove(_) => None,
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessagesError {
    #[error("messages[{index}]: cannot remove message \"{id}\": no message has that id")]
    UnknownRemoval { index: usize, id: String },
}

/// Merges the messages one step (`step_id`, `visit`, agent `agent`) returned into `history`.
/// A message without a `name` gets the agent's.
pub fn add_messages(
    history: &[Message],
    update: Vec<MessageUpdate>,
    step_id: &str,
    visit: u32,
    agent: &str,
) -> Result<Vec<Message>, MessagesError> {
    merge(history, update, step_id, visit, agent, true)
}

/// [`add_messages`] for a parallel branch's messages, merged after the branches before it.
/// Each branch was checked against the history as the parallel step began; a removal that an
/// earlier branch already made is not an error here.
pub fn add_branch_messages(
    history: &[Message],
    update: Vec<MessageUpdate>,
    step_id: &str,
    visit: u32,
    agent: &str,
) -> Vec<Message> {
    merge(history, update, step_id, visit, agent, false).expect("lenient merges do not fail")
}

fn merge(
    history: &[Message],
    update: Vec<MessageUpdate>,
    step_id: &str,
    visit: u32,
    agent: &str,
    strict: bool,
) -> Result<Vec<Message>, MessagesError> {
    let mut merged: Vec<Option<Message>> = history.iter().cloned().map(Some).collect();
    let mut index_of: std::collections::HashMap<String, usize> = merged
        .iter()
        .enumerate()
        .filter_map(|(i, m)| m.as_ref().map(|m| (m.id.clone(), i)))
        .collect();
    for (n, item) in update.into_iter().enumerate() {
        match item {
            MessageUpdate::Remove(removal) if removal.id == REMOVE_ALL_MESSAGES => {
                merged.clear();
                index_of.clear();
            }
            MessageUpdate::Remove(removal) => match index_of.get(&removal.id) {
                Some(&i) => merged[i] = None,
                None if !strict => {}
                None => {
                    return Err(MessagesError::UnknownRemoval {
                        index: n,
                        id: removal.id,
                    });
                }
            },
            MessageUpdate::Message(new) => {
                let message = Message {
                    id: new.id.unwrap_or_else(|| format!("{step_id}#{visit}/{n}")),
                    role: new.role,
                    content: new.content,
                    name: new.name.or_else(|| Some(agent.to_owned())),
                    metadata: new.metadata,
                };
                match index_of.get(&message.id) {
                    // Replaced in place; a message removed earlier in this update comes back.
                    Some(&i) => merged[i] = Some(message),
                    None => {
                        index_of.insert(message.id.clone(), merged.len());
                        merged.push(Some(message));
                    }
                }
            }
        }
    }
    Ok(merged.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn updates(value: Value) -> Vec<MessageUpdate> {
        serde_json::from_value(value).unwrap()
    }

    fn ids(history: &[Message]) -> Vec<&str> {
        history.iter().map(|m| m.id.as_str()).collect()
    }

    #[test]
    fn new_messages_append_in_order_with_ids_and_names_assigned() {
        let history = add_messages(
            &[],
            updates(json!([
                {"role": "user", "content": "Add dark mode"},
                {"role": "assistant", "content": "Plan: a toggle", "id": "p1"}
            ])),
            "plan",
            1,
            "planner",
        )
        .unwrap();
        assert_eq!(ids(&history), ["plan#1/0", "p1"]);
        assert!(history.iter().all(|m| m.name.as_deref() == Some("planner")));
    }

    #[test]
    fn a_message_with_an_existing_id_replaces_it_in_place() {
        // LangGraph's documented example: the second message is rewritten, not appended.
        let start = add_messages(
            &[],
            updates(json!([
                {"role": "assistant", "content": "Hello! How can I assist you?", "name": "Model", "id": "1"},
                {"role": "user", "content": "I'm looking for information on marine biology.", "name": "Lance", "id": "2"}
            ])),
            "a",
            1,
            "a",
        )
        .unwrap();
        let history = add_messages(
            &start,
            updates(json!([{"role": "user", "content": "I'm looking for information on whales, specifically", "name": "Lance", "id": "2"}])),
            "b",
            1,
            "b",
        )
        .unwrap();
        assert_eq!(ids(&history), ["1", "2"]);
        assert_eq!(
            history[1].content,
            json!("I'm looking for information on whales, specifically")
        );
    }

    #[test]
    fn removal_deletes_by_id_and_an_unknown_id_is_an_error() {
        let start = add_messages(
            &[],
            updates(json!([
                {"role": "user", "content": "a", "id": "1"},
                {"role": "assistant", "content": "b", "id": "2"},
                {"role": "user", "content": "c", "id": "3"}
            ])),
            "s",
            1,
            "s",
        )
        .unwrap();
        let history = add_messages(
            &start,
            updates(json!([{"type": "remove", "id": "1"}, {"type": "remove", "id": "2"}])),
            "t",
            1,
            "t",
        )
        .unwrap();
        assert_eq!(ids(&history), ["3"]);
        assert_eq!(
            add_messages(
                &start,
                updates(json!([{"type": "remove", "id": "nope"}])),
                "t",
                1,
                "t"
            ),
            Err(MessagesError::UnknownRemoval {
                index: 0,
                id: "nope".into()
            })
        );
    }

    #[test]
    fn remove_all_clears_what_came_before_it() {
        let start = add_messages(
            &[],
            updates(json!([{"role": "user", "content": "old", "id": "1"}])),
            "s",
            1,
            "s",
        )
        .unwrap();
        let history = add_messages(
            &start,
            updates(json!([
                {"role": "assistant", "content": "dropped too", "id": "2"},
                {"type": "remove", "id": REMOVE_ALL_MESSAGES},
                {"role": "assistant", "content": "fresh start", "id": "3"}
            ])),
            "t",
            1,
            "t",
        )
        .unwrap();
        assert_eq!(ids(&history), ["3"]);
    }

    #[test]
    fn parallel_branches_merge_in_branch_order_whatever_order_they_finished_in() {
        let branch = |step: &str, text: &str| {
            (
                step.to_owned(),
                updates(json!([{"role": "assistant", "content": text}])),
            )
        };
        let finished_in = [
            branch("test-integration", "integration ok"),
            branch("test-unit", "unit ok"),
        ];
        let workflow_order = ["test-unit", "test-integration"];
        let mut history = Vec::new();
        for step in workflow_order {
            let (_, update) = finished_in.iter().find(|(s, _)| s == step).unwrap();
            history = add_messages(&history, update.clone(), step, 1, step).unwrap();
        }
        assert_eq!(ids(&history), ["test-unit#1/0", "test-integration#1/0"]);
    }

    #[test]
    fn the_same_update_gives_the_same_history_on_replay() {
        let update = updates(json!([{"role": "assistant", "content": "x"}]));
        let once = add_messages(&[], update.clone(), "code", 2, "coder").unwrap();
        let again = add_messages(&[], update, "code", 2, "coder").unwrap();
        assert_eq!(once, again);
        assert_eq!(once[0].id, "code#2/0");
    }
}
