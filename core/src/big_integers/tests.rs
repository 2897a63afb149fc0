use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

fn paths(text: &str) -> Vec<(String, String)> {
    big_integers(text.as_bytes())
        .map(|found| (found.path, found.literal.to_owned()))
        .collect()
}

#[test]
fn integers_past_64_bits_are_found_with_their_paths() {
    let text = r#"{
        "order": {"id": 123456789012345678901234567890, "qty": 3},
        "ids": [1, -9223372036854775809, 18446744073709551615, 18446744073709551616],
        "odd key": [[-9223372036854775808, 99999999999999999999]],
        "fine": [1.5, 1e300, -0.0, 12345678901234567890123.0, 1E+400]
    }"#;
    assert_eq!(
        paths(text),
        [
            ("$.order.id", "123456789012345678901234567890"),
            ("$.ids[1]", "-9223372036854775809"),
            ("$.ids[3]", "18446744073709551616"),
            ("$[\"odd key\"][0][1]", "99999999999999999999"),
        ]
        .map(|(path, literal)| (path.to_owned(), literal.to_owned()))
    );
}

#[test]
fn strings_comments_and_keys_hide_nothing_and_invent_nothing() {
    let text = r#"
        // 123456789012345678901234567890 in a comment
        /* and 123456789012345678901234567890 in a block */
        {
            "123456789012345678901234567890": "a key is a string",
            "s": "123456789012345678901234567890 in a string, \" and an escaped quote 1",
            "after": 123456789012345678901234567890, // a trailing comma next
        }
    "#;
    assert_eq!(
        paths(text),
        [(
            "$.after".to_owned(),
            "123456789012345678901234567890".to_owned()
        )]
    );
    assert_eq!(paths("123456789012345678901234567890")[0].0, "$");
}

#[test]
fn a_key_that_could_fool_a_reader_is_quoted_and_escaped() {
    let text = "{\"a\\u001b[2J\u{202e}b\": 123456789012345678901234567890}";
    let found = big_integers(text.as_bytes()).next().unwrap();
    assert_eq!(found.path, "$[\"a\\u001b[2J\\u202eb\"]");
    assert!(!found.path.contains('\u{1b}') && !found.path.contains('\u{202e}'));
}

#[test]
fn the_problem_names_the_path_and_suggests_a_string() {
    let text = br#"{"id": 123456789012345678901234567890}"#;
    let value: Value = serde_json::from_slice(text).unwrap();
    let found = first_big_integer(text, &value).unwrap();
    assert_eq!(found.path, "$.id");
    assert_eq!(
        found.problem(),
        "integer 123456789012345678901234567890 is beyond 64 bits, which JSON readers round to \
         a float; write it as a string (\"123456789012345678901234567890\")"
    );
    // A literal of a thousand digits is not quoted back whole.
    let long = format!("[{}]", "9".repeat(1000));
    let found = big_integers(long.as_bytes()).next().unwrap();
    assert_eq!(
        found.problem(),
        "integer 99999999999999999999... (1000 characters) is beyond 64 bits, which JSON \
         readers round to a float; write it as a string"
    );
}

#[test]
fn data_without_a_float_is_not_scanned() {
    // serde_json reads a literal beyond 64 bits as a float: no float, no such literal.
    let value = json!({"a": [1, u64::MAX, i64::MIN, "x"]});
    assert!(!holds_float(&value));
    assert!(holds_float(&json!({"a": [1, {"b": 0.5}]})));
    assert_eq!(first_big_integer(b"not even read", &value), None);
}

#[test]
fn text_that_is_not_json_yields_without_panicking() {
    for text in [
        "",
        "\"",
        "\"\\",
        "/*",
        "//",
        "{",
        "}",
        "]]]",
        "{,:1",
        "-",
        "--1",
        "1e",
        "[-]",
        "{\"a\"",
        "{\"\\x\": 123456789012345678901234567890}",
    ] {
        let _ = paths(text);
    }
    assert_eq!(
        paths("{: 123456789012345678901234567890")[0].0,
        "$[?]",
        "a value where a key should be"
    );
}

/// A JSON document as a tree, some of whose integers are beyond 64 bits.
#[derive(Debug, Clone)]
enum Node {
    Small(i64),
    Unsigned(u64),
    Float(f64),
    Big(String),
    Text(String),
    Array(Vec<Node>),
    Object(Vec<Node>),
}

fn node() -> impl Strategy<Value = Node> {
    let big = prop_oneof![
        "[1-9][0-9]{20,60}",
        "-[1-9][0-9]{19,60}",
        Just("18446744073709551616".to_owned()),
        Just("-9223372036854775809".to_owned()),
    ];
    let leaf = prop_oneof![
        any::<i64>().prop_map(Node::Small),
        any::<u64>().prop_map(Node::Unsigned),
        (-1e300f64..1e300).prop_map(Node::Float),
        big.prop_map(Node::Big),
        "[a-z0-9 \"\\\\/{}\\[\\],:]{0,12}".prop_map(Node::Text),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Node::Array),
            prop::collection::vec(inner, 0..6).prop_map(Node::Object),
        ]
    })
}

/// Writes `node` as JSON text at `path`, with whitespace and comments between tokens, and
/// the paths and literals of its big integers.
fn write(node: &Node, path: &str, text: &mut String, expected: &mut Vec<(String, String)>) {
    text.push_str(" /* , */ ");
    match node {
        Node::Small(n) => text.push_str(&n.to_string()),
        Node::Unsigned(n) => text.push_str(&n.to_string()),
        Node::Float(x) => text.push_str(&serde_json::to_string(x).unwrap()),
        Node::Big(digits) => {
            text.push_str(digits);
            expected.push((path.to_owned(), digits.clone()));
        }
        Node::Text(s) => text.push_str(&Value::String(s.clone()).to_string()),
        Node::Array(items) => {
            text.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    text.push_str(",\n");
                }
                write(item, &format!("{path}[{i}]"), text, expected);
            }
            text.push(']');
        }
        Node::Object(members) => {
            text.push('{');
            for (i, member) in members.iter().enumerate() {
                if i > 0 {
                    text.push_str(", // ]\n");
                }
                // Keys unique, some plain words and some not.
                let key = if i % 2 == 0 {
                    format!("k{i}")
                } else {
                    format!("{i} {{\"}}")
                };
                let shown = if i % 2 == 0 {
                    format!(".{key}")
                } else {
                    format!("[{}]", Value::String(key.clone()))
                };
                text.push_str(&Value::String(key).to_string());
                text.push_str(" : ");
                write(member, &format!("{path}{shown}"), text, expected);
            }
            text.push('}');
        }
    }
}

proptest! {
    /// Every big integer written is found, at its path, and nothing else is; a value read
    /// from text with none holds none, so skipping the scan for it loses nothing.
    #[test]
    fn the_scan_finds_exactly_the_big_integers_written(node in node()) {
        let mut text = String::new();
        let mut expected = Vec::new();
        write(&node, "$", &mut text, &mut expected);
        prop_assert_eq!(paths(&text), expected.clone());
        let plain = text.replace(" /* , */ ", " ").replace(" // ]", "");
        let value: Value = serde_json::from_str(&plain).unwrap();
        prop_assert_eq!(
            first_big_integer(plain.as_bytes(), &value).map(|found| found.path),
            expected.first().map(|(path, _)| path.clone())
        );
    }

    /// Any text at all: the scan ends, and everything it yields is an integer literal beyond
    /// 64 bits.
    #[test]
    fn any_text_is_scanned_without_panicking(text in ".{0,200}") {
        for found in big_integers(text.as_bytes()) {
            let digits = found.literal.trim_start_matches('-');
            prop_assert!(digits.bytes().all(|b| b.is_ascii_digit()) && digits.len() >= 19);
        }
    }
}
