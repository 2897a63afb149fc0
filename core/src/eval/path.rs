//! Paths into the run's data: `context.<stepId>.<field>...`, `input.<field>...`.
//!
//! Segments may contain hyphens (`context.parallel-tests.success`), since step ids do; that is why
//! the expression language has no subtraction. Brackets take a quoted key or an array index
//! (`context["parallel-tests"].data[0]`); a numeric dotted segment (`.0`) indexes arrays too, as
//! in JavaScript.

use std::fmt;

use serde_json::Value;
use winnow::ascii::{digit1, multispace0};
use winnow::combinator::{alt, cut_err, delimited, preceded, repeat};
use winnow::error::{ContextError, ErrMode, StrContext, StrContextValue};
use winnow::prelude::*;
use winnow::token::{any, take_while};

use super::Scope;

/// Where a path starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Root {
    /// `input`: the run's original input.
    Input,
    /// `context`: the results of earlier steps, by step id or `output` alias.
    Context,
    /// `map`: the item a map step's chain is running (`{"step", "item", "index", "count"}`);
    /// only defined inside a chain.
    Map,
}

/// One step down into a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// `.name` or `["name"]`.
    Key(String),
    /// `[3]`.
    Index(usize),
}

/// A parsed path, keeping its source text for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path {
    pub root: Root,
    pub segments: Vec<Segment>,
    pub text: String,
}

/// Why a path could not be resolved by [`Path::resolve_strict`]. The messages are the spec's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("Step not found: {0}")]
    StepNotFound(String),
    #[error("Path not found: {0}")]
    PathNotFound(String),
}

impl Path {
    /// Parses a whole path; anything after it is an error.
    pub fn parse(text: &str) -> Result<Self, String> {
        let trimmed = text.trim();
        path.parse(trimmed).map_err(|error| {
            format!(
                "cannot parse path \"{trimmed}\" at column {}: expected `context.<step>...`, `input...` or `map...`",
                error.offset() + 1
            )
        })
    }

    /// Follows the path, failing like the spec's transform executor when a step or field is
    /// missing.
    pub fn resolve_strict<'a>(&self, scope: &'a impl Scope) -> Result<&'a Value, ResolveError> {
        let mut segments = self.segments.iter();
        let start = match self.root {
            Root::Input => scope.input(),
            Root::Context => match segments.next() {
                None => return Err(ResolveError::PathNotFound(self.text.clone())),
                Some(first) => {
                    let key = first.as_key();
                    scope
                        .result(&key)
                        .ok_or_else(|| ResolveError::StepNotFound(key.into_owned()))?
                }
            },
            Root::Map => scope
                .map_item()
                .ok_or_else(|| ResolveError::PathNotFound(self.text.clone()))?,
        };
        segments.try_fold(start, |value, segment| {
            step_into(value, segment).ok_or_else(|| ResolveError::PathNotFound(self.text.clone()))
        })
    }

    /// Follows the path; a missing step or field is `None` (JavaScript's `undefined`).
    pub fn resolve<'a>(&self, scope: &'a impl Scope) -> Option<&'a Value> {
        self.resolve_strict(scope).ok()
    }

    /// The step id or alias a `context.` path reads first, for validation.
    pub fn first_context_key(&self) -> Option<String> {
        match (self.root, self.segments.first()) {
            (Root::Context, Some(segment)) => Some(segment.as_key().into_owned()),
            _ => None,
        }
    }
}

impl Segment {
    fn as_key(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Segment::Key(key) => key.into(),
            Segment::Index(index) => index.to_string().into(),
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// One step down, with JavaScript's leniency: arrays take numeric keys, objects take indexes as
/// keys.
fn step_into<'a>(value: &'a Value, segment: &Segment) -> Option<&'a Value> {
    match (value, segment) {
        (Value::Object(map), segment) => map.get(segment.as_key().as_ref()),
        (Value::Array(items), Segment::Index(index)) => items.get(*index),
        (Value::Array(items), Segment::Key(key)) => {
            key.parse::<usize>().ok().and_then(|index| items.get(index))
        }
        _ => None,
    }
}

/// `context`, `input` or `map`, then any number of segments.
pub(crate) fn path(input: &mut &str) -> ModalResult<Path> {
    let start = *input;
    let root = alt((
        "context".value(Root::Context),
        "input".value(Root::Input),
        "map".value(Root::Map),
    ))
    .parse_next(input)?;
    // `contexts.x` or `inputs` are not paths.
    if input.starts_with(is_segment_char) {
        return Err(ErrMode::Backtrack(ContextError::new()));
    }
    let segments: Vec<Segment> = repeat(0.., segment).parse_next(input)?;
    let text = start[..start.len() - input.len()].to_owned();
    Ok(Path {
        root,
        segments,
        text,
    })
}

fn is_segment_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '$'
}

fn segment(input: &mut &str) -> ModalResult<Segment> {
    alt((
        preceded(
            '.',
            cut_err(
                take_while(1.., is_segment_char)
                    .map(|key: &str| Segment::Key(key.to_owned()))
                    .context(StrContext::Expected(StrContextValue::Description(
                        "a field name after `.`",
                    ))),
            ),
        ),
        delimited(
            ('[', multispace0),
            cut_err(
                alt((
                    quoted_string.map(Segment::Key),
                    digit1.try_map(|digits: &str| digits.parse::<usize>().map(Segment::Index)),
                ))
                .context(StrContext::Expected(StrContextValue::Description(
                    "a quoted key or an index inside `[...]`",
                ))),
            ),
            cut_err((multispace0, ']')),
        ),
    ))
    .parse_next(input)
}

/// A single- or double-quoted string with JSON escapes (`\"`, `\\`, `\n`, `\u00e9`, ...): a key
/// inside `[...]`, and a string literal in conditions, which read their strings the same way.
pub(crate) fn quoted_string(input: &mut &str) -> ModalResult<String> {
    let quote = alt(('"', '\'')).parse_next(input)?;
    let mut out = String::new();
    loop {
        let c: char = cut_err(any)
            .context(StrContext::Expected(StrContextValue::Description(
                "a closing quote",
            )))
            .parse_next(input)?;
        if c == quote {
            return Ok(out);
        }
        if c != '\\' {
            out.push(c);
            continue;
        }
        let escaped = cut_err(any).parse_next(input)?;
        match escaped {
            'n' => out.push('\n'),
            't' => out.push('\t'),
            'r' => out.push('\r'),
            'b' => out.push('\u{8}'),
            'f' => out.push('\u{c}'),
            'u' => {
                let hex: &str = cut_err(take_while(4, |c: char| c.is_ascii_hexdigit()))
                    .context(StrContext::Expected(StrContextValue::Description(
                        "four hex digits after \\u",
                    )))
                    .parse_next(input)?;
                let code =
                    u32::from_str_radix(hex, 16).map_err(|_| ErrMode::Cut(ContextError::new()))?;
                out.push(char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER));
            }
            other => out.push(other),
        }
    }
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
            json!({"title": "dark mode"}),
            json!({
                "plan": {"files": ["src/theme.ts", "src/toggle.tsx"], "none": null},
                "parallel-tests": {"success": true, "data": [{"stepId": "unit"}]},
            }),
        )
    }

    #[test]
    fn resolves_the_spec_forms() {
        let doc = doc();
        let get = |text: &str| Path::parse(text).unwrap().resolve_strict(&doc).cloned();
        assert_eq!(
            get("context.plan.files"),
            Ok(json!(["src/theme.ts", "src/toggle.tsx"]))
        );
        assert_eq!(get("context.plan.files.1"), Ok(json!("src/toggle.tsx")));
        assert_eq!(get("context.plan.files[0]"), Ok(json!("src/theme.ts")));
        assert_eq!(get("context.parallel-tests.success"), Ok(json!(true)));
        assert_eq!(
            get("context[\"parallel-tests\"].data[0].stepId"),
            Ok(json!("unit"))
        );
        assert_eq!(
            get("context['parallel-tests'].data.0.stepId"),
            Ok(json!("unit"))
        );
        assert_eq!(get("input.title"), Ok(json!("dark mode")));
        assert_eq!(get("input"), Ok(json!({"title": "dark mode"})));
        assert_eq!(get("context.plan.none"), Ok(Value::Null));
    }

    #[test]
    fn missing_steps_and_fields_fail_with_the_spec_messages() {
        let doc = doc();
        let get = |text: &str| Path::parse(text).unwrap().resolve_strict(&doc).cloned();
        assert_eq!(
            get("context.code.files"),
            Err(ResolveError::StepNotFound("code".into()))
        );
        assert_eq!(
            get("context.plan.tests").unwrap_err().to_string(),
            "Path not found: context.plan.tests"
        );
        assert_eq!(
            get("context.plan.files.7").unwrap_err().to_string(),
            "Path not found: context.plan.files.7"
        );
        assert_eq!(
            get("context.plan.none.deeper").unwrap_err().to_string(),
            "Path not found: context.plan.none.deeper"
        );
        assert_eq!(
            Path::parse("context.plan.nope").unwrap().resolve(&doc),
            None
        );
    }

    #[test]
    fn rejects_what_is_not_a_path() {
        for text in [
            "",
            "plan.files",
            "context.",
            "context..plan",
            "context[plan]",
            "context.plan files",
            "contextual.plan",
            "context[\"unterminated]",
            "context.plan; rm -rf /",
        ] {
            assert!(Path::parse(text).is_err(), "{text:?} should not parse");
        }
    }
}
