//! How tasks and step visits are named, in the store and on the wire. The one place these names
//! are built and read.
//!
//! - A **visit key**, `<step>#<visit>`, names one visit of a step: its task, its result, its
//!   approval timer. Step ids may hold `#` (only the last one separates the visit).
//! - A [`TaskRef`], `<run>/<step>#<visit>@<attempt>`, names one delivery of a task to a worker.
//!   The attempt is the fencing token: an answer is accepted only for the current attempt.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use baton_core::TaskId;

/// `"<step>#<visit>"`.
pub fn visit_key(step_id: &str, visit: u32) -> String {
    format!("{step_id}#{visit}")
}

/// The visit key of a task.
pub fn task_key(task: &TaskId) -> String {
    visit_key(&task.step_id, task.visit)
}

/// A visit key read back: the step id and the visit.
pub fn parse_visit_key(key: &str) -> Option<(&str, u32)> {
    let (step_id, visit) = key.rsplit_once('#')?;
    Some((step_id, visit.parse().ok()?))
}

/// One delivery of a task: the run, the step visit, and the attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaskRef {
    pub run_id: String,
    pub task: TaskId,
    pub attempt: u32,
}

impl TaskRef {
    pub fn new(run_id: &str, task: &TaskId, attempt: u32) -> Self {
        Self {
            run_id: run_id.to_owned(),
            task: task.clone(),
            attempt,
        }
    }

    /// Its visit key, `<step>#<visit>`.
    pub fn key(&self) -> String {
        task_key(&self.task)
    }
}

impl fmt::Display for TaskRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}#{}@{}",
            self.run_id, self.task.step_id, self.task.visit, self.attempt
        )
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
        let (step_id, visit) = parse_visit_key(key).ok_or_else(malformed)?;
        Ok(Self {
            run_id: run_id.to_owned(),
            task: TaskId {
                step_id: Arc::from(step_id),
                visit,
            },
            attempt: attempt.parse().map_err(|_| malformed())?,
        })
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
        let task = TaskId {
            step_id: "parallel-tests".into(),
            visit: 12,
        };
        let id = TaskRef::new("0193-abc", &task, 3);
        assert_eq!(id.to_string(), "0193-abc/parallel-tests#12@3");
        assert_eq!(parse("0193-abc/parallel-tests#12@3"), Some(id));
        let hashed = TaskRef::new(
            "r",
            &TaskId {
                step_id: "a#b".into(),
                visit: 2,
            },
            1,
        );
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
        assert_eq!(parse_visit_key("plan#2"), Some(("plan", 2)));
        assert_eq!(parse_visit_key("a#b#3"), Some(("a#b", 3)));
        assert_eq!(parse_visit_key("plan"), None);
        assert_eq!(parse_visit_key("plan#x"), None);
    }
}
