//! What the coordinator's targets share: the configuration whose limits they meet, and the
//! checks several of them make (a refusal, a task id written back, a text cut to its limit).

use std::sync::OnceLock;

use baton_proto::{Json, sha256_hex};
use serde_json::Value;

use crate::service::Config;
use crate::task_ref::TaskRef;

/// The coordinator's default configuration: its limits are what a worker or client meets.
pub(super) fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(Config::default)
}

/// Makes `json`'s digest that of its bytes; whether it changed.
pub(super) fn fix_digest(json: &mut Json) -> bool {
    let digest = sha256_hex(&json.json);
    let changed = json.sha256 != digest;
    json.sha256 = digest;
    changed
}

/// `kept` is `sent` if that was within `limit`, and otherwise within the limit, starting as
/// `sent` did and naming its length.
pub(super) fn check_cut(sent: &str, kept: &str, limit: usize) {
    if sent.len() <= limit {
        assert_eq!(kept, sent);
        return;
    }
    assert!(kept.len() <= limit, "{} bytes kept of {limit}", kept.len());
    let (head, _) = kept.split_once(" [... cut: ").expect("a marker");
    assert!(sent.starts_with(head));
    assert!(kept.contains(&format!("cut: {} bytes in all", sent.len())));
}

/// How deep a JSON value nests (1 for a scalar), without recursion.
pub(super) fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 1)];
    while let Some((value, at)) = stack.pop() {
        deepest = deepest.max(at);
        match value {
            Value::Array(items) => stack.extend(items.iter().map(|item| (item, at + 1))),
            Value::Object(members) => stack.extend(members.values().map(|item| (item, at + 1))),
            _ => {}
        }
    }
    deepest
}

/// A task id that was read from `text` writes back as an id that reads the same.
pub(super) fn check_task_ref(task: &TaskRef, text: &str) {
    let written = task.to_string();
    assert_eq!(
        written.parse::<TaskRef>().as_ref(),
        Ok(task),
        "task id {text:?} written back as {written:?}"
    );
}

/// An error the edge returns: it has a message and a gRPC status.
pub(super) fn refused(error: crate::Error) {
    let message = error.to_string();
    assert!(!message.is_empty());
    let status = tonic::Status::from(error);
    assert_ne!(status.code(), tonic::Code::Ok);
}
