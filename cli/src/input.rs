//! `--input`: JSON, or else a plain string.

use serde_json::Value;

/// Parses `--input`: text that is JSON is taken as JSON, anything else as a JSON string.
pub fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_is_json_and_anything_else_a_string() {
        assert_eq!(parse(r#"{"a": 1}"#), json!({"a": 1}));
        assert_eq!(parse("\"quoted\""), json!("quoted"));
        assert_eq!(parse("42"), json!(42));
        assert_eq!(parse("Add dark mode toggle"), json!("Add dark mode toggle"));
        assert_eq!(parse("{broken"), json!("{broken"));
    }
}
