//! Condition expressions: the JavaScript subset the spec writes conditions in.
//!
//! ```text
//! expr     := or
//! or       := and ("||" and)*
//! and      := equality ("&&" equality)*
//! equality := relation (("===" | "!==" | "==" | "!=") relation)*
//! relation := unary (("<=" | ">=" | "<" | ">") unary)*
//! unary    := "!" unary | primary
//! primary  := "(" expr ")" | literal | path
//! literal  := string | number | true | false | null | undefined
//! ```
//!
//! Semantics follow JavaScript where it matters to a workflow author: a missing path is
//! `undefined` (falsy, never an error), `&&`/`||` short-circuit and yield an operand, `==` coerces
//! like JavaScript for primitives. One deliberate difference: `===` compares arrays and objects
//! by value, since JSON documents have no identity.

use std::borrow::Cow;

use serde_json::{Number, Value};
use winnow::ascii::{digit1, multispace0};
use winnow::combinator::{alt, cut_err, delimited, opt, preceded, repeat};
use winnow::error::{ContextError, ErrMode, StrContext, StrContextValue};
use winnow::prelude::*;
use winnow::token::take_while;

use super::Scope;
use super::path::{Path, path, quoted_string};

/// A parsed condition.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Literal(Value),
    Undefined,
    Path(Path),
    Not(Box<Expr>),
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    StrictEq,
    StrictNe,
    LooseEq,
    LooseNe,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
}

/// The value of an expression: a JSON value, or JavaScript's `undefined`.
#[derive(Debug, Clone, PartialEq)]
pub enum Val<'a> {
    Undefined,
    Json(Cow<'a, Value>),
}

impl Expr {
    /// Parses a whole condition; `max_depth` bounds nesting of brackets and `!`.
    pub fn parse(text: &str, max_depth: usize) -> Result<Self, String> {
        let trimmed = text.trim();
        let mut parser = delimited(
            multispace0,
            move |i: &mut &str| or(i, max_depth),
            multispace0,
        );
        parser.parse(trimmed).map_err(|error| {
            let column = error.offset() + 1;
            let inner = error.inner().to_string();
            let detail = if inner.is_empty() {
                String::new()
            } else {
                format!(": {}", inner.replace('\n', "; "))
            };
            format!("cannot parse condition \"{trimmed}\" at column {column}{detail}")
        })
    }

    /// Evaluates to a value; nothing here can fail.
    pub fn evaluate<'a>(&'a self, scope: &'a impl Scope) -> Val<'a> {
        match self {
            Expr::Literal(value) => Val::Json(Cow::Borrowed(value)),
            Expr::Undefined => Val::Undefined,
            Expr::Path(path) => match path.resolve(scope) {
                Some(value) => Val::Json(Cow::Borrowed(value)),
                None => Val::Undefined,
            },
            Expr::Not(inner) => Val::bool(!inner.evaluate(scope).truthy()),
            Expr::Binary(BinaryOp::And, left, right) => {
                let left = left.evaluate(scope);
                if left.truthy() {
                    right.evaluate(scope)
                } else {
                    left
                }
            }
            Expr::Binary(BinaryOp::Or, left, right) => {
                let left = left.evaluate(scope);
                if left.truthy() {
                    left
                } else {
                    right.evaluate(scope)
                }
            }
            Expr::Binary(op, left, right) => {
                let (left, right) = (left.evaluate(scope), right.evaluate(scope));
                Val::bool(match op {
                    BinaryOp::StrictEq => strict_eq(&left, &right),
                    BinaryOp::StrictNe => !strict_eq(&left, &right),
                    BinaryOp::LooseEq => loose_eq(&left, &right),
                    BinaryOp::LooseNe => !loose_eq(&left, &right),
                    BinaryOp::Lt => compare(&left, &right, |o| o.is_lt()),
                    BinaryOp::Le => compare(&left, &right, |o| o.is_le()),
                    BinaryOp::Gt => compare(&left, &right, |o| o.is_gt()),
                    BinaryOp::Ge => compare(&left, &right, |o| o.is_ge()),
                    BinaryOp::And | BinaryOp::Or => unreachable!("handled above"),
                })
            }
        }
    }

    /// Evaluates and takes JavaScript truthiness: what a condition step routes on.
    pub fn is_true(&self, scope: &impl Scope) -> bool {
        self.evaluate(scope).truthy()
    }

    /// Every path the expression reads, for validation.
    pub fn paths(&self) -> Vec<&Path> {
        let mut out = Vec::new();
        self.collect_paths(&mut out);
        out
    }

    fn collect_paths<'a>(&'a self, out: &mut Vec<&'a Path>) {
        match self {
            Expr::Path(path) => out.push(path),
            Expr::Not(inner) => inner.collect_paths(out),
            Expr::Binary(_, left, right) => {
                left.collect_paths(out);
                right.collect_paths(out);
            }
            Expr::Literal(_) | Expr::Undefined => {}
        }
    }
}

impl Val<'_> {
    fn bool(value: bool) -> Self {
        Val::Json(Cow::Owned(Value::Bool(value)))
    }

    /// JavaScript truthiness.
    pub fn truthy(&self) -> bool {
        match self {
            Val::Undefined => false,
            Val::Json(value) => match value.as_ref() {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0 && !f.is_nan()),
                Value::String(s) => !s.is_empty(),
                Value::Array(_) | Value::Object(_) => true,
            },
        }
    }

    /// JavaScript's ToNumber, for primitives; arrays and objects are NaN.
    fn to_number(&self) -> f64 {
        match self {
            Val::Undefined => f64::NAN,
            Val::Json(value) => match value.as_ref() {
                Value::Null => 0.0,
                Value::Bool(b) => f64::from(u8::from(*b)),
                Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
                Value::String(s) if s.trim().is_empty() => 0.0,
                Value::String(s) => s.trim().parse().unwrap_or(f64::NAN),
                Value::Array(_) | Value::Object(_) => f64::NAN,
            },
        }
    }
}

fn strict_eq(left: &Val, right: &Val) -> bool {
    match (left, right) {
        (Val::Undefined, Val::Undefined) => true,
        (Val::Json(a), Val::Json(b)) => json_eq(a, b),
        _ => false,
    }
}

/// Structural equality where numbers compare by value (`1 === 1.0`).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(xs), Value::Array(ys)) => {
            xs.len() == ys.len() && xs.iter().zip(ys).all(|(x, y)| json_eq(x, y))
        }
        (Value::Object(xs), Value::Object(ys)) => {
            xs.len() == ys.len()
                && xs
                    .iter()
                    .all(|(k, x)| ys.get(k).is_some_and(|y| json_eq(x, y)))
        }
        _ => a == b,
    }
}

/// JavaScript's `==` for primitives: null and undefined equal each other only; numbers, strings
/// and booleans compare as numbers when their types differ.
fn loose_eq(left: &Val, right: &Val) -> bool {
    let nullish = |v: &Val| matches!(v, Val::Undefined) || matches!(v, Val::Json(j) if j.is_null());
    if nullish(left) || nullish(right) {
        return nullish(left) && nullish(right);
    }
    let (Val::Json(a), Val::Json(b)) = (left, right) else {
        return false;
    };
    let primitive = |v: &Value| v.is_number() || v.is_string() || v.is_boolean();
    let same_type = std::mem::discriminant(a.as_ref()) == std::mem::discriminant(b.as_ref());
    if same_type || !primitive(a) || !primitive(b) {
        return json_eq(a, b);
    }
    left.to_number() == right.to_number()
}

/// `<`, `<=`, `>`, `>=`: strings compare by code point, everything else as numbers, and NaN
/// compares false both ways, as in JavaScript.
fn compare(left: &Val, right: &Val, test: impl Fn(std::cmp::Ordering) -> bool) -> bool {
    if let (Val::Json(a), Val::Json(b)) = (left, right)
        && let (Value::String(a), Value::String(b)) = (a.as_ref(), b.as_ref())
    {
        return test(a.cmp(b));
    }
    left.to_number()
        .partial_cmp(&right.to_number())
        .is_some_and(test)
}

fn too_deep() -> ErrMode<ContextError> {
    let mut error = ContextError::new();
    error.push(StrContext::Label("expression nested too deeply"));
    ErrMode::Cut(error)
}

fn ws<'a, O>(
    inner: impl Parser<&'a str, O, ErrMode<ContextError>>,
) -> impl Parser<&'a str, O, ErrMode<ContextError>> {
    delimited(multispace0, inner, multispace0)
}

/// Folds `operand (op operand)*` left to right.
fn binary_level(
    input: &mut &str,
    depth: usize,
    operators: &[(&'static str, BinaryOp)],
    operand: fn(&mut &str, usize) -> ModalResult<Expr>,
) -> ModalResult<Expr> {
    let first = operand(input, depth)?;
    let rest: Vec<(BinaryOp, Expr)> = repeat(
        0..,
        (
            ws(|i: &mut &str| {
                for (token, op) in operators {
                    if let Some(rest) = i.strip_prefix(token) {
                        *i = rest;
                        return Ok(*op);
                    }
                }
                Err(ErrMode::Backtrack(ContextError::new()))
            }),
            cut_err(move |i: &mut &str| operand(i, depth)).context(StrContext::Expected(
                StrContextValue::Description("an operand"),
            )),
        ),
    )
    .parse_next(input)?;
    Ok(rest.into_iter().fold(first, |left, (op, right)| {
        Expr::Binary(op, Box::new(left), Box::new(right))
    }))
}

fn or(input: &mut &str, depth: usize) -> ModalResult<Expr> {
    binary_level(input, depth, &[("||", BinaryOp::Or)], and)
}

fn and(input: &mut &str, depth: usize) -> ModalResult<Expr> {
    binary_level(input, depth, &[("&&", BinaryOp::And)], equality)
}

fn equality(input: &mut &str, depth: usize) -> ModalResult<Expr> {
    // Longest first: `===` must not be read as `==` followed by `=`.
    let operators = [
        ("===", BinaryOp::StrictEq),
        ("!==", BinaryOp::StrictNe),
        ("==", BinaryOp::LooseEq),
        ("!=", BinaryOp::LooseNe),
    ];
    binary_level(input, depth, &operators, relation)
}

fn relation(input: &mut &str, depth: usize) -> ModalResult<Expr> {
    let operators = [
        ("<=", BinaryOp::Le),
        (">=", BinaryOp::Ge),
        ("<", BinaryOp::Lt),
        (">", BinaryOp::Gt),
    ];
    binary_level(input, depth, &operators, unary)
}

fn unary(input: &mut &str, depth: usize) -> ModalResult<Expr> {
    if depth == 0 {
        return Err(too_deep());
    }
    let negated = opt(ws(('!', winnow::combinator::not('=')))).parse_next(input)?;
    if negated.is_some() {
        let inner = cut_err(|i: &mut &str| unary(i, depth - 1))
            .context(StrContext::Expected(StrContextValue::Description(
                "an operand after `!`",
            )))
            .parse_next(input)?;
        return Ok(Expr::Not(Box::new(inner)));
    }
    ws(|i: &mut &str| primary(i, depth)).parse_next(input)
}

fn primary(input: &mut &str, depth: usize) -> ModalResult<Expr> {
    alt((
        preceded(
            '(',
            cut_err((
                move |i: &mut &str| {
                    if depth <= 1 {
                        return Err(too_deep());
                    }
                    or(i, depth - 1)
                },
                ws(')').context(StrContext::Expected(StrContextValue::CharLiteral(')'))),
            ))
            .map(|(expr, _)| expr),
        ),
        quoted_string.map(|s| Expr::Literal(Value::String(s))),
        number.map(|n| Expr::Literal(Value::Number(n))),
        keyword,
        path.map(Expr::Path),
    ))
    .context(StrContext::Expected(StrContextValue::Description(
        "a path (context.<step>..., input...), a string, a number, true, false, null or undefined",
    )))
    .parse_next(input)
}

fn keyword(input: &mut &str) -> ModalResult<Expr> {
    let word: &str = take_while(1.., |c: char| {
        c.is_ascii_alphanumeric() || c == '_' || c == '$'
    })
    .parse_next(input)?;
    match word {
        "true" => Ok(Expr::Literal(Value::Bool(true))),
        "false" => Ok(Expr::Literal(Value::Bool(false))),
        "null" => Ok(Expr::Literal(Value::Null)),
        "undefined" => Ok(Expr::Undefined),
        _ => Err(ErrMode::Backtrack(ContextError::new())),
    }
}

/// A JSON-style number, optionally negative: `-1`, `0.5`, `1e3`.
fn number(input: &mut &str) -> ModalResult<Number> {
    let text = (
        opt('-'),
        digit1,
        opt(('.', digit1)),
        opt((alt(('e', 'E')), opt(alt(('+', '-'))), digit1)),
    )
        .take()
        .parse_next(input)?;
    if let Ok(integer) = text.parse::<i64>() {
        return Ok(Number::from(integer));
    }
    text.parse::<f64>()
        .ok()
        .and_then(Number::from_f64)
        .ok_or_else(|| ErrMode::Cut(ContextError::new()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Doc(Value, Value);
    impl Scope for Doc {
        fn input(&self) -> &Value {
            &self.0
        }
        fn result(&self, key: &str) -> Option<&Value> {
            self.1.get(key)
        }
        fn to_document(&self) -> Value {
            json!({"input": self.0, "context": self.1})
        }
    }

    fn doc() -> Doc {
        Doc(
            json!({"priority": 3, "name": "toggle", "tags": []}),
            json!({
                "parallel-tests": {"success": true, "data": [{"stepId": "unit", "result": {"failed": 0}}]},
                "review": {"approved": false, "score": 7.5, "comment": "", "count": "7"},
            }),
        )
    }

    fn eval(text: &str) -> bool {
        Expr::parse(text, 64)
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .is_true(&doc())
    }

    #[test]
    fn the_spec_condition_routes_on_the_parallel_result() {
        assert!(eval("context.parallel-tests.success === true"));
        assert!(eval("context[\"parallel-tests\"].success === true"));
        assert!(eval(
            "context['parallel-tests'].data[0].result.failed === 0"
        ));
        assert!(!eval("context.parallel-tests.success === false"));
    }

    #[test]
    fn every_operator() {
        // strict and loose equality
        assert!(eval("context.review.approved === false"));
        assert!(eval("context.review.approved !== true"));
        assert!(eval("context.review.count == 7"));
        assert!(!eval("context.review.count === 7"));
        assert!(eval("context.review.count != 8"));
        assert!(eval("null == undefined"));
        assert!(!eval("null === undefined"));
        assert!(eval("1 === 1.0"));
        assert!(eval("input.tags === input.tags"));
        // relations, numbers and strings
        assert!(eval("context.review.score > 7"));
        assert!(eval("context.review.score >= 7.5"));
        assert!(eval("input.priority < 4"));
        assert!(eval("input.priority <= 3"));
        assert!(eval("input.name < 'zebra'"));
        assert!(eval("-1 < 0"));
        assert!(eval("1e3 > 999"));
        // boolean logic, precedence and parentheses
        assert!(eval("true && !false"));
        assert!(eval("false || input.priority === 3"));
        assert!(eval("!(input.priority === 4)"));
        assert!(eval("true || false && false"));
        assert!(!eval("(true || false) && false"));
        assert!(eval("!!input.name"));
        // literals
        assert!(eval("'it\\'s' === \"it's\""));
        assert!(eval("\"caf\\u00e9\" === 'café'"));
        assert!(eval("null === null"));
    }

    #[test]
    fn missing_paths_are_undefined_and_falsy_not_errors() {
        assert!(!eval("context.nothing.here"));
        assert!(eval("context.nothing === undefined"));
        assert!(eval("!context.nothing"));
        assert!(!eval("context.nothing > 1"));
        assert!(!eval("context.nothing < 1"));
        assert!(eval("context.nothing == null"));
        assert!(!eval("context.review.comment"));
        assert!(eval("input.tags"));
    }

    #[test]
    fn and_or_yield_operands_as_in_javascript() {
        let doc = doc();
        let expr = Expr::parse("context.missing || input.name", 64).unwrap();
        assert_eq!(expr.evaluate(&doc), Val::Json(Cow::Owned(json!("toggle"))));
        let expr = Expr::parse("input.priority && context.missing", 64).unwrap();
        assert_eq!(expr.evaluate(&doc), Val::Undefined);
    }

    #[test]
    fn errors_name_the_column() {
        let error = Expr::parse("context.a === ", 64).unwrap_err();
        assert!(error.contains("column"), "{error}");
        for bad in [
            "",
            "===",
            "context.a ==== 1",
            "(true",
            "true)",
            "context.a = 1",
            "eval('x')",
            "context.a + 1",
            "'open",
            "!",
        ] {
            assert!(Expr::parse(bad, 64).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = format!("{}true{}", "(".repeat(100), ")".repeat(100));
        let error = Expr::parse(&deep, 64).unwrap_err();
        assert!(error.contains("nested too deeply"), "{error}");
        assert!(Expr::parse(&"!".repeat(10_000), 64).is_err());
        let fine = format!("{}true{}", "(".repeat(10), ")".repeat(10));
        assert!(Expr::parse(&fine, 64).is_ok());
    }
}
