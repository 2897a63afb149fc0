//! What the validation tests share: parsing a document that must be rejected or accepted, and
//! checking each diagnostic's JSON path, step id, severity and message.

#![allow(dead_code)]

use baton_core::workflow::parse::{ParseError, Parsed};
use baton_core::{Diagnostic, Limits, Severity, parse_workflow, parse_workflow_with};
use serde_json::{Value, json};

/// Every diagnostic, one a line, for failure messages.
pub fn list(diagnostics: &[Diagnostic]) -> String {
    if diagnostics.is_empty() {
        return "  (no diagnostics)".to_owned();
    }
    diagnostics
        .iter()
        .map(|d| format!("  {d}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Parses `text`, which must be rejected, and returns every diagnostic.
#[track_caller]
pub fn rejected(text: &str) -> Vec<Diagnostic> {
    rejected_with(text, &Limits::default())
}

#[track_caller]
pub fn rejected_with(text: &str, limits: &Limits) -> Vec<Diagnostic> {
    match parse_workflow_with(text, limits) {
        Ok(parsed) => panic!(
            "expected the workflow to be rejected, but it was accepted; warnings:\n{}\ndocument:\n{text}",
            list(&parsed.warnings)
        ),
        Err(ParseError { diagnostics }) => {
            assert!(
                diagnostics.has_errors(),
                "a ParseError must hold at least one error:\n{}",
                list(&diagnostics.0)
            );
            diagnostics.0
        }
    }
}

/// Parses `text`, which must be accepted.
#[track_caller]
pub fn accepted(text: &str) -> Parsed {
    parse_workflow(text).unwrap_or_else(|error| {
        panic!(
            "expected the workflow to be accepted; got:\n{}\ndocument:\n{text}",
            list(&error.diagnostics.0)
        )
    })
}

/// The one diagnostic at `path`; fails, printing every diagnostic, when there is none or more.
#[track_caller]
pub fn at<'a>(diagnostics: &'a [Diagnostic], path: &str) -> &'a Diagnostic {
    let found: Vec<&Diagnostic> = diagnostics.iter().filter(|d| d.path == path).collect();
    match found.as_slice() {
        [one] => one,
        [] => panic!(
            "no diagnostic at {path}; the diagnostics are:\n{}",
            list(diagnostics)
        ),
        many => panic!(
            "{} diagnostics at {path}, expected one; the diagnostics are:\n{}",
            many.len(),
            list(diagnostics)
        ),
    }
}

/// Checks the diagnostic at `path`: its severity, step id and a message substring.
#[track_caller]
pub fn expect<'a>(
    diagnostics: &'a [Diagnostic],
    severity: Severity,
    path: &str,
    step_id: Option<&str>,
    needle: &str,
) -> &'a Diagnostic {
    let diagnostic = at(diagnostics, path);
    let context = || format!("at {path}; the diagnostics are:\n{}", list(diagnostics));
    assert_eq!(diagnostic.severity, severity, "severity {}", context());
    assert_eq!(
        diagnostic.step_id.as_deref(),
        step_id,
        "step id {}",
        context()
    );
    assert!(
        diagnostic.message.contains(needle),
        "message {:?} does not contain {needle:?} {}",
        diagnostic.message,
        context()
    );
    diagnostic
}

#[track_caller]
pub fn expect_error<'a>(
    diagnostics: &'a [Diagnostic],
    path: &str,
    step_id: Option<&str>,
    needle: &str,
) -> &'a Diagnostic {
    expect(diagnostics, Severity::Error, path, step_id, needle)
}

#[track_caller]
pub fn expect_warning<'a>(
    diagnostics: &'a [Diagnostic],
    path: &str,
    step_id: Option<&str>,
    needle: &str,
) -> &'a Diagnostic {
    expect(diagnostics, Severity::Warning, path, step_id, needle)
}

/// Checks that `diagnostics` holds exactly the diagnostic expected, and nothing else.
#[track_caller]
pub fn only_error(text: &str, path: &str, step_id: Option<&str>, needle: &str) -> Diagnostic {
    let diagnostics = rejected(text);
    assert_eq!(
        diagnostics.len(),
        1,
        "expected exactly one diagnostic; got:\n{}",
        list(&diagnostics)
    );
    expect_error(&diagnostics, path, step_id, needle).clone()
}

/// A document around `steps`.
pub fn doc(steps: Value) -> String {
    json!({ "steps": steps }).to_string()
}

pub fn agent(id: &str) -> Value {
    json!({ "id": id, "type": "agent", "agent": format!("{id}-agent") })
}

/// `base` with `extra`'s fields added.
pub fn with(mut base: Value, extra: Value) -> Value {
    let (Value::Object(base_map), Value::Object(extra)) = (&mut base, extra) else {
        panic!("with() takes two objects");
    };
    base_map.extend(extra);
    base
}
