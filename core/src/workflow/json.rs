//! Workflow text to JSON, the first pass of [`super::parse`]: `//` and `/* */` comments and
//! trailing commas are allowed, since the spec's own examples carry them, and the nesting depth
//! is bounded.

use serde_json::Value;

use crate::diagnostics::Diagnostic;
use crate::limits::Limits;

/// Reads JSON, allowing `//` and `/* */` comments and trailing commas.
pub(super) fn read_json(text: &str, limits: &Limits) -> Result<Value, Diagnostic> {
    let too_deep = |depth: usize| {
        Diagnostic::error(
            "$",
            None,
            format!(
                "the document nests {depth} levels deep; the limit is {}",
                limits.max_json_depth
            ),
        )
    };
    // Checked on the text first, so that neither reader recurses deeper than we allow.
    let depth = text_nesting_depth(text);
    if depth > limits.max_json_depth {
        return Err(too_deep(depth));
    }
    match serde_json::from_str(text) {
        Ok(value) => Ok(value),
        Err(strict_error) => {
            let options = jsonc_parser::ParseOptions {
                allow_comments: true,
                allow_trailing_commas: true,
                allow_loose_object_property_names: false,
                allow_missing_commas: false,
                allow_single_quoted_strings: false,
                allow_hexadecimal_numbers: false,
                ..Default::default()
            };
            // Without comments the strict reader's message is the familiar one; with them, only
            // the comment-tolerant reader knows where the real mistake is.
            let has_comments = text.contains("//") || text.contains("/*");
            jsonc_parser::parse_to_serde_value::<Value>(text, &options).map_err(|jsonc_error| {
                let reason = if has_comments {
                    jsonc_error.to_string()
                } else {
                    strict_error.to_string()
                };
                Diagnostic::error(
                    "$",
                    None,
                    format!("the document is not valid JSON: {reason}"),
                )
            })
        }
    }
}

/// Deepest bracket nesting outside strings and comments.
pub(crate) fn text_nesting_depth(text: &str) -> usize {
    #[derive(PartialEq)]
    enum In {
        Code,
        String { escaped: bool },
        LineComment,
        BlockComment,
    }
    let (mut depth, mut deepest, mut state) = (0usize, 0usize, In::Code);
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        let next = bytes.get(i + 1).copied();
        match state {
            In::String { escaped: true } => state = In::String { escaped: false },
            In::String { escaped: false } => match byte {
                b'\\' => state = In::String { escaped: true },
                b'"' => state = In::Code,
                _ => {}
            },
            In::LineComment if byte == b'\n' => state = In::Code,
            In::LineComment => {}
            In::BlockComment if byte == b'*' && next == Some(b'/') => {
                state = In::Code;
                i += 1;
            }
            In::BlockComment => {}
            In::Code => match (byte, next) {
                (b'"', _) => state = In::String { escaped: false },
                (b'/', Some(b'/')) => state = In::LineComment,
                (b'/', Some(b'*')) => {
                    state = In::BlockComment;
                    i += 1;
                }
                (b'[' | b'{', _) => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                (b']' | b'}', _) => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
        i += 1;
    }
    deepest
}
