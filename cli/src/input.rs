//! `--input`: JSON, or else a plain string.

use serde_json::Value;

/// The bytes `--input` sends: text that is JSON as it was written (so that the coordinator
/// reads every number as written, and refuses an integer beyond 64 bits naming its path
/// rather than get the float serde_json would make of it here), anything else as a JSON
/// string.
pub fn json(text: &str) -> Vec<u8> {
    match serde_json::from_str::<Value>(text) {
        Ok(_) => text.as_bytes().to_vec(),
        Err(_) => Value::String(text.to_owned()).to_string().into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(text: &str) -> String {
        String::from_utf8(json(text)).unwrap()
    }

    #[test]
    fn json_is_sent_as_written_and_anything_else_as_a_string() {
        assert_eq!(sent(r#"{"a": 1}"#), r#"{"a": 1}"#);
        assert_eq!(sent("\"quoted\""), "\"quoted\"");
        assert_eq!(sent("42"), "42");
        assert_eq!(sent("Add dark mode toggle"), "\"Add dark mode toggle\"");
        assert_eq!(sent("{broken"), "\"{broken\"");
    }

    #[test]
    fn an_integer_beyond_64_bits_is_not_rounded_on_the_way() {
        let text = r#"{"id": 123456789012345678901234567890}"#;
        assert_eq!(sent(text), text);
    }
}
