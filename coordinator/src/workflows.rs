//! Parsed workflows, by the SHA-256 of their text.
//!
//! Most runs share their workflow with many others (one document submitted again and again),
//! and a coordinator parses a run's workflow at its submit and again each time it rebuilds the
//! run from the store. Parsing and validating even a 3-step workflow cost more than a third of
//! what submitting its run did (issue 20, W3), and the state chain hashes the text anyway; so a
//! coordinator keeps the workflows it parsed last, under that digest.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use baton_core::workflow::ParseError;
use baton_core::{Limits, Workflow};
use sha2::{Digest, Sha256};

/// How many parsed workflows a coordinator keeps; the oldest goes first.
const KEPT: usize = 256;

/// A valid workflow and the SHA-256 of its text (lowercase hex), which the state chain's
/// genesis takes.
#[derive(Debug, Clone)]
pub struct Known {
    pub workflow: Arc<Workflow>,
    pub text_sha256: String,
}

/// The coordinator's parsed workflows, parsed under its limits.
pub struct Workflows {
    limits: Limits,
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    by_digest: HashMap<[u8; 32], Arc<Workflow>>,
    /// Oldest first.
    order: VecDeque<[u8; 32]>,
}

impl Workflows {
    pub fn new(limits: Limits) -> Self {
        Workflows {
            limits,
            kept: Mutex::default(),
        }
    }

    /// `text` parsed and validated, or the problems found; parsed once while it is kept.
    pub fn parse(&self, text: &str) -> Result<Known, ParseError> {
        let digest: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        let text_sha256 = hex::encode(digest);
        if let Some(workflow) = self.kept().by_digest.get(&digest) {
            return Ok(Known {
                workflow: workflow.clone(),
                text_sha256,
            });
        }
        let workflow = Arc::new(baton_core::parse_workflow_with(text, &self.limits)?.workflow);
        let mut kept = self.kept();
        if kept.by_digest.insert(digest, workflow.clone()).is_none() {
            kept.order.push_back(digest);
            while kept.order.len() > KEPT {
                if let Some(oldest) = kept.order.pop_front() {
                    kept.by_digest.remove(&oldest);
                }
            }
        }
        Ok(Known {
            workflow,
            text_sha256,
        })
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().expect("workflows lock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: &str = r#"{"id": "one", "steps": [{"id": "a", "type": "agent", "agent": "x"}]}"#;

    #[test]
    fn a_text_is_parsed_once_and_a_bad_one_every_time() {
        let workflows = Workflows::new(Limits::default());
        let first = workflows.parse(ONE).unwrap();
        let again = workflows.parse(ONE).unwrap();
        assert!(Arc::ptr_eq(&first.workflow, &again.workflow));
        assert_eq!(first.text_sha256, hex::encode(Sha256::digest(ONE)));
        assert!(workflows.parse("{").is_err());
        assert!(workflows.parse("{").is_err(), "nothing kept for a bad text");
    }

    #[test]
    fn only_the_newest_are_kept() {
        let workflows = Workflows::new(Limits::default());
        let first = workflows.parse(ONE).unwrap();
        for n in 0..KEPT {
            let text = ONE.replace("\"one\"", &format!("\"w{n}\""));
            workflows.parse(&text).unwrap();
        }
        assert_eq!(workflows.kept().by_digest.len(), KEPT);
        let parsed_again = workflows.parse(ONE).unwrap();
        assert!(!Arc::ptr_eq(&first.workflow, &parsed_again.workflow));
    }
}
