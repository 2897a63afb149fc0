//! Faults injected on the wire, for end-to-end tests: `BATON_TEST_CORRUPT_PARTS=N` on a
//! coordinator flips one byte of the first part of the next N task messages that carry parts,
//! after their digests were computed, to show that workers refuse such a payload and ask for it
//! again. The copy on the wire only: never the part the run keeps, and never in dispatch.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use baton_proto::v1::{CoordinatorMessage, coordinator_message};

/// How many more task messages with parts get a byte flipped, shared by every worker stream.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    corrupt_parts: Arc<AtomicU64>,
}

impl Faults {
    /// No faults.
    pub fn none() -> Self {
        Self::default()
    }

    /// The next `tasks` task messages that carry parts get one byte of their first part flipped.
    pub fn corrupt_parts(tasks: u64) -> Self {
        Faults {
            corrupt_parts: Arc::new(AtomicU64::new(tasks)),
        }
    }

    /// `message` as it goes on the wire, corrupted while faults remain.
    pub fn apply(&self, mut message: CoordinatorMessage) -> CoordinatorMessage {
        if self.corrupt_parts.load(Ordering::Relaxed) == 0 {
            return message;
        }
        if let Some(coordinator_message::Message::Task(task)) = &mut message.message
            && let Some(part) = task.parts.first_mut().filter(|part| !part.json.is_empty())
            && self
                .corrupt_parts
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
        {
            let last = part.json.len() - 1;
            part.flip(last, 0x01);
        }
        message
    }
}

#[cfg(test)]
mod tests {
    use baton_proto::Json;
    use baton_proto::v1::Task;

    use super::*;

    fn task(parts: &[&str]) -> CoordinatorMessage {
        CoordinatorMessage {
            message: Some(coordinator_message::Message::Task(Task {
                parts: parts
                    .iter()
                    .map(|part| Json::new(part.as_bytes().to_vec()))
                    .collect(),
                ..Task::default()
            })),
        }
    }

    fn first_part(message: &CoordinatorMessage) -> Option<&Json> {
        match &message.message {
            Some(coordinator_message::Message::Task(task)) => task.parts.first(),
            _ => None,
        }
    }

    #[test]
    fn only_the_next_n_tasks_with_parts_are_corrupted() {
        let faults = Faults::corrupt_parts(1);
        let untouched = faults.apply(task(&[]));
        assert_eq!(untouched, task(&[]), "no part: not counted");
        let corrupted = faults.apply(task(&["[1]"]));
        assert!(first_part(&corrupted).unwrap().verified().is_err());
        let next = faults.apply(task(&["[1]"]));
        assert!(first_part(&next).unwrap().verified().is_ok(), "one only");
        assert_eq!(Faults::none().apply(task(&["[1]"])), task(&["[1]"]));
    }
}
