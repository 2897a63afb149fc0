//! The workflow targets: workflow text as a client sends it, and workflows built from the input
//! as a structure ([`super::shapes`]); a valid one is run by the engine ([`super::drive`]).

use std::sync::Arc;

use arbitrary::Unstructured;
use serde_json::Value;

use super::drive::drive;
use super::shapes::arbitrary_workflow;
use crate::big_integers::big_integers;
use crate::text::text_nesting_depth;
use crate::workflow::parse::parse_workflow_value;
use crate::{Limits, Workflow, parse_workflow_with};

/// The largest workflow a coordinator accepts (`Config::max_workflow_bytes`).
const MAX_WORKFLOW_BYTES: usize = 1 << 20;

/// Workflow text, parsed and validated with the default [`Limits`].
///
/// Invariants: an invalid document reports at least one error; a valid one validates the same
/// again, and the same from its JSON value and from that value written out again (validity does
/// not depend on spelling); it runs ([`drive`]) without the engine panicking, every dispatched
/// payload splices back byte for byte from its manifest, a pending task is rebuilt as it was
/// dispatched, and replaying the accepted events (through their stored JSON) rebuilds the run.
pub fn workflow(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if text.len() > MAX_WORKFLOW_BYTES {
        return;
    }
    let limits = Limits::default();
    let parsed = match parse_workflow_with(&text, &limits) {
        Ok(parsed) => parsed,
        Err(error) => {
            assert!(
                error.diagnostics.has_errors(),
                "a rejected workflow names an error: {error}"
            );
            let _ = error.to_string();
            // The depth of the text is checked before it is read as JSON; a value is not. Nor
            // does a value hold the integers beyond 64 bits its text did: they were rounded.
            if text_nesting_depth(&text) > limits.max_json_depth
                || big_integers(text.as_bytes()).next().is_some()
            {
                return;
            }
            if let Ok(value) = serde_json::from_str::<Value>(&text) {
                assert!(
                    parse_workflow_value(&value, &limits).is_err(),
                    "the document's JSON value is valid though its text is not"
                );
            }
            return;
        }
    };
    let again = parse_workflow_with(&text, &limits).expect("a valid workflow stays valid");
    assert_eq!(shape(&again.workflow), shape(&parsed.workflow));
    assert_eq!(again.warnings, parsed.warnings);
    if let Ok(value) = serde_json::from_str::<Value>(&text) {
        let from_value = parse_workflow_value(&value, &limits)
            .expect("the JSON value of a valid workflow is valid");
        assert_eq!(shape(&from_value.workflow), shape(&parsed.workflow));
        let rewritten = serde_json::to_string_pretty(&value).expect("a value serialises");
        let from_rewritten = parse_workflow_with(&rewritten, &limits)
            .expect("a valid workflow written out again is valid");
        assert_eq!(shape(&from_rewritten.workflow), shape(&parsed.workflow));
    }
    drive(Arc::new(parsed.workflow), data);
}

/// A workflow document built from the input as a structure (steps of every type, routing and
/// references among their ids, expressions from parts that mean something), written as text
/// and given to [`workflow`]: most of them are valid, so this is the target that runs the
/// engine through loops, parallel steps, approvals and `on_error`, where mutated text seldom
/// gets past the parser.
pub fn workflow_shapes(data: &[u8]) {
    let Ok(document) = arbitrary_workflow(&mut Unstructured::new(data)) else {
        return;
    };
    let text = serde_json::to_string(&document).expect("a value serialises");
    workflow(text.as_bytes());
}

/// What a workflow is made of, comparable (the workflow's own index of ids is a `HashMap`,
/// whose order differs between two parses).
fn shape(workflow: &Workflow) -> Vec<String> {
    let mut shape = vec![format!(
        "{:?} {:?} {} {:?}",
        workflow.id,
        workflow.description,
        workflow.max_visits,
        workflow.top_level()
    )];
    shape.extend(workflow.steps().iter().map(|step| format!("{step:?}")));
    shape
}
