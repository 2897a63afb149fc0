//! The targets of the workflow's small languages: a condition's expression, a transform's path
//! and a `jq:` program (compiled, never run).

use serde_json::{Value, json};

use crate::Limits;
use crate::eval::expr::Expr;
use crate::eval::path::Path;
use crate::eval::{JqProgram, Scope};

/// A condition expression, parsed as a condition step's `condition` is.
///
/// Invariants: a condition parses to the same tree in brackets one level deeper, and under `!`
/// to its negation; every path it reads parses again from its own text; it evaluates.
pub fn condition(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let limits = Limits::default();
    if text.chars().count() > limits.max_expression_len {
        return;
    }
    let depth = limits.max_expression_depth;
    let Ok(expr) = Expr::parse(&text, depth) else {
        return;
    };
    let trimmed = text.trim();
    let bracketed = Expr::parse(&format!("({trimmed})"), depth + 1);
    assert_eq!(
        bracketed.as_ref(),
        Ok(&expr),
        "({trimmed}) parses as {trimmed}"
    );
    let negated = Expr::parse(&format!("!({trimmed})"), depth + 2);
    assert_eq!(negated, Ok(Expr::Not(Box::new(expr.clone()))));
    for path in expr.paths() {
        assert_eq!(Path::parse(&path.text).as_ref(), Ok(path));
        let _ = path.first_context_key();
    }
    let scope = FuzzScope::new();
    let value = expr.evaluate(&scope);
    assert_eq!(value.truthy(), expr.is_true(&scope));
}

/// A transform's path.
///
/// Invariants: its text is the trimmed input and parses again to the same path; resolving it
/// leniently and strictly agree.
pub fn path(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if text.chars().count() > Limits::default().max_expression_len {
        return;
    }
    let Ok(path) = Path::parse(&text) else {
        return;
    };
    assert_eq!(path.text, text.trim());
    assert_eq!(Path::parse(&path.text).as_ref(), Ok(&path));
    let scope = FuzzScope::new();
    assert_eq!(path.resolve_strict(&scope).ok(), path.resolve(&scope));
    let _ = path.first_context_key();
}

/// A `jq:` program, compiled as a transform's is (never run).
///
/// Invariants: a compiled program keeps its source; a refused one says whether it did not parse
/// or did not compile.
pub fn jq(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if text.chars().count() > Limits::default().max_jq_len {
        return;
    }
    match JqProgram::compile(&text) {
        Ok(program) => assert_eq!(program.source(), text),
        Err(error) => assert!(
            error.starts_with("cannot parse jq program")
                || error.starts_with("cannot compile jq program"),
            "{error}"
        ),
    }
}

/// What conditions and paths are evaluated against in these targets: a little of every kind
/// of JSON.
struct FuzzScope {
    input: Value,
    context: Value,
}

impl FuzzScope {
    fn new() -> Self {
        Self {
            input: json!({"priority": 3, "name": "toggle", "tags": [], "0": [1, 2]}),
            context: json!({
                "parallel-tests": {"success": true, "data": [{"stepId": "unit", "result": {"failed": 0}}]},
                "review": {"approved": false, "score": 7.5, "comment": "", "count": "7"},
                "a": {"b": [null, true, "x", {"c": -1}]},
                "0": 0,
            }),
        }
    }
}

impl Scope for FuzzScope {
    fn input(&self) -> &Value {
        &self.input
    }

    fn result(&self, key: &str) -> Option<&Value> {
        self.context.get(key)
    }

    fn to_document(&self) -> Value {
        json!({"input": self.input, "context": self.context})
    }
}
