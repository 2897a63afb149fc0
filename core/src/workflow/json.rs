//! Workflow text to JSON, the first pass of [`super::parse`]: `//` and `/* */` comments and
//! trailing commas are allowed, since the spec's own examples carry them, and the nesting depth
//! is bounded.

use serde_json::Value;

use crate::diagnostics::Diagnostic;
use crate::limits::Limits;
use crate::text::text_nesting_depth;

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
