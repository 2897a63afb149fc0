//! How tasks and step visits are named, in the store and on the wire. The one place these names
//! are built and read.
//!
//! - A **visit key**, `<step>#<visit>`, names one visit of a step: its task, its result, its
//!   approval timer. A map step's item adds its index: `<step>[<item>]#<visit>` (the map step's
//!   own visit for an `agent` map; a chain step's visit, counted over every item, for a chain),
//!   so that every item's task and result has a key of its own. Step ids may hold `#` (only
//!   the last one separates the visit); they never hold `[`.
//! - A [`TaskRef`], `<run>/<visit key>@<attempt>`, names one delivery of a task to a worker.
//!   The attempt is the fencing token: an answer is accepted only for the current attempt.

use baton_core::{RunId, StepId, StepRecord, TaskId};
use std::fmt;
use std::str::FromStr;

/// `"<step>#<visit>"`.
pub fn visit_key(step_id: &str, visit: u32) -> String {
    format!("{step_id}#{visit}")
}

/// `"<step>#<visit>"`, or `"<step>[<item>]#<visit>"` for a map item.
pub fn item_key(step_id: &str, item: Option<u32>, visit: u32) -> String {
    match item {
        None => visit_key(step_id, visit),
        Some(item) => format!("{step_id}[{item}]#{visit}"),
    }
}

/// The visit key of a task.
pub fn task_key(task: &TaskId) -> String {
    item_key(&task.step_id, task.item, task.visit)
}

/// The visit key of a settled step visit: the key of its result and of its link's step.
pub fn record_key(record: &StepRecord) -> String {
    item_key(&record.step_id, record.item, record.visit)
}

/// What a record's link on the state chain names as its step: the step id, with the item's
/// index for a map item (`<step>[<item>]`).
pub fn chain_step(record: &StepRecord) -> std::borrow::Cow<'_, str> {
    match record.item {
        None => record.step_id.as_ref().into(),
        Some(item) => format!("{}[{item}]", record.step_id).into(),
    }
}

/// A visit key read back as the task it names.
pub fn parse_task_key(key: &str) -> Option<TaskId> {
    let (head, visit) = key.rsplit_once('#')?;
    let visit = visit.parse().ok()?;
    let (step_id, item) = match head.strip_suffix(']').and_then(|h| h.rsplit_once('[')) {
        Some((step_id, item)) => (step_id, Some(item.parse().ok()?)),
        None => (head, None),
    };
    Some(TaskId {
        step_id: StepId::from(step_id),
        visit,
        item,
    })
}

/// One delivery of a task: the run, the step visit, and the attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaskRef {
    pub run_id: RunId,
    pub task: TaskId,
    pub attempt: u32,
}

impl TaskRef {
    pub fn new(run_id: impl Into<RunId>, task: &TaskId, attempt: u32) -> Self {
        Self {
            run_id: run_id.into(),
            task: task.clone(),
            attempt,
        }
    }

    /// Its visit key, `<step>#<visit>` (with `[<item>]` for a map item).
    pub fn key(&self) -> String {
        task_key(&self.task)
    }
}

impl fmt::Display for TaskRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}@{}", self.run_id, self.key(), self.attempt)
    }
}

/// A task id that does not read as `<run>/<step>#<visit>@<attempt>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed task id {0:?}")]
pub struct MalformedTaskId(pub String);

impl FromStr for TaskRef {
    type Err = MalformedTaskId;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let malformed = || MalformedTaskId(text.to_owned());
        let (run_id, rest) = text.split_once('/').ok_or_else(malformed)?;
        let (key, attempt) = rest.rsplit_once('@').ok_or_else(malformed)?;
        Ok(Self {
            run_id: run_id.into(),
            task: parse_task_key(key).ok_or_else(malformed)?,
            attempt: attempt.parse().map_err(|_| malformed())?,
        })
    }
}

/// A map key naming a task of a run: `(run id, visit key)`, as the hub and the lease book keep
/// the tasks they hold. [`task_in`] looks one up by borrowed strings: a lookup by an owned
/// tuple would copy both for every answer, resend and renewal.
pub type TaskKey = (String, String);

/// A `(run id, visit key)` pair, owned or borrowed, as a map of [`TaskKey`]s compares and hashes
/// it (the way a tuple of two strings does, so both forms agree).
pub trait TaskKeyed {
    fn run_id(&self) -> &str;
    fn task_key(&self) -> &str;
}

impl TaskKeyed for TaskKey {
    fn run_id(&self) -> &str {
        &self.0
    }
    fn task_key(&self) -> &str {
        &self.1
    }
}

impl TaskKeyed for (&str, &str) {
    fn run_id(&self) -> &str {
        self.0
    }
    fn task_key(&self) -> &str {
        self.1
    }
}

impl<'a> std::borrow::Borrow<dyn TaskKeyed + 'a> for TaskKey {
    fn borrow(&self) -> &(dyn TaskKeyed + 'a) {
        self
    }
}

impl std::hash::Hash for dyn TaskKeyed + '_ {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // As `(String, String)` hashes: each string in turn.
        self.run_id().hash(state);
        self.task_key().hash(state);
    }
}

impl PartialEq for dyn TaskKeyed + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.run_id() == other.run_id() && self.task_key() == other.task_key()
    }
}

impl Eq for dyn TaskKeyed + '_ {}

/// A map of tasks by [`TaskKey`], read and changed by borrowed `(run id, visit key)`.
pub trait TaskMap<V> {
    fn get_task(&self, run_id: &str, task_key: &str) -> Option<&V>;
    fn get_task_mut(&mut self, run_id: &str, task_key: &str) -> Option<&mut V>;
    fn remove_task(&mut self, run_id: &str, task_key: &str) -> Option<V>;
}

impl<V, S: std::hash::BuildHasher> TaskMap<V> for std::collections::HashMap<TaskKey, V, S> {
    fn get_task(&self, run_id: &str, task_key: &str) -> Option<&V> {
        self.get(&(run_id, task_key) as &dyn TaskKeyed)
    }
    fn get_task_mut(&mut self, run_id: &str, task_key: &str) -> Option<&mut V> {
        self.get_mut(&(run_id, task_key) as &dyn TaskKeyed)
    }
    fn remove_task(&mut self, run_id: &str, task_key: &str) -> Option<V> {
        self.remove(&(run_id, task_key) as &dyn TaskKeyed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Option<TaskRef> {
        text.parse().ok()
    }

    #[test]
    fn task_refs_round_trip_even_with_hyphens_and_hashes() {
        let task = TaskId::new("parallel-tests", 12);
        let id = TaskRef::new("0193-abc", &task, 3);
        assert_eq!(id.to_string(), "0193-abc/parallel-tests#12@3");
        assert_eq!(parse("0193-abc/parallel-tests#12@3"), Some(id));
        let hashed = TaskRef::new("r", &TaskId::new("a#b", 2), 1);
        assert_eq!(parse(&hashed.to_string()), Some(hashed));
        assert_eq!(parse("no-slash"), None);
        assert_eq!(parse("run/step#x@1"), None);
        assert_eq!(parse("run/step#1"), None, "the attempt is required");
        assert_eq!(parse("run/step#1@x"), None);
        assert_eq!(
            "run/step".parse::<TaskRef>(),
            Err(MalformedTaskId("run/step".into()))
        );
    }

    #[test]
    fn visit_keys_round_trip() {
        assert_eq!(visit_key("plan", 2), "plan#2");
        assert_eq!(parse_task_key("plan#2"), Some(TaskId::new("plan", 2)));
        assert_eq!(parse_task_key("a#b#3"), Some(TaskId::new("a#b", 3)));
        assert_eq!(parse_task_key("plan"), None);
        assert_eq!(parse_task_key("plan#x"), None);
    }

    #[test]
    fn map_items_have_keys_and_task_ids_of_their_own() {
        let item = TaskId {
            item: Some(42),
            ..TaskId::new("test-each", 1)
        };
        assert_eq!(task_key(&item), "test-each[42]#1");
        assert_eq!(parse_task_key("test-each[42]#1"), Some(item.clone()));
        let id = TaskRef::new("r", &item, 2);
        assert_eq!(id.to_string(), "r/test-each[42]#1@2");
        assert_eq!(parse(&id.to_string()), Some(id));
        assert_eq!(parse_task_key("each[x]#1"), None);
        assert_eq!(parse_task_key("each[-1]#1"), None);
    }

    #[test]
    fn a_task_map_is_read_by_borrowed_strings() {
        use std::collections::HashMap;
        let mut held: HashMap<TaskKey, u32> = HashMap::new();
        held.insert(("r".into(), "plan#1".into()), 1);
        held.insert(("r".into(), "plan#2".into()), 2);
        assert_eq!(held.get_task("r", "plan#1"), Some(&1));
        assert_eq!(held.get_task("r", "plan#3"), None);
        assert_eq!(
            held.get_task("rplan", "#1"),
            None,
            "the pair, not the concatenation"
        );
        *held.get_task_mut("r", "plan#2").unwrap() += 40;
        assert_eq!(held.remove_task("r", "plan#2"), Some(42));
        assert_eq!(held.len(), 1);
    }
}
