//! Integrity: canonical JSON hashing (RFC 8785) and the per-run state chain.
//!
//! 1. `canonical_sha256` hashes exactly the canonical text RFC 8785 gives for its own examples:
//!    key order by UTF-16 code units, ECMAScript number formatting, minimal string escaping.
//! 2. The hash is of the value, not its spelling: key order, whitespace, string escapes and
//!    number spelling of the source JSON do not change it (property).
//! 3. Changing any single leaf changes the hash (property).
//! 4. Genesis and link states hash the documented byte strings, and no two different inputs
//!    share one.
//! 5. `verify_chain` accepts an intact chain and names the first link, or the head, that does
//!    not hold.

use baton_core::integrity::{
    ChainError, ChainLink, canonical_sha256, canonical_sha256_of, genesis, next_state, verify_chain,
};
use proptest::prelude::*;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Asserts that `value` hashes as the canonical text `expected`, showing both forms on failure.
fn assert_canonical(value: &Value, expected: &str) {
    assert_eq!(
        canonical_sha256(value),
        sha256_hex(expected.as_bytes()),
        "canonical form is {:?}, expected {expected:?}",
        serde_json_canonicalizer::to_string(value).unwrap(),
    );
}

// ---------------------------------------------------------------------------------------------
// 1. RFC 8785 examples
// ---------------------------------------------------------------------------------------------

/// RFC 8785 section 3.2.2: the example input and its canonical form.
#[test]
fn rfc8785_section_3_2_2_example_hashes_its_canonical_text() {
    let input = r#"{
      "numbers": [333333333.33333329, 1E30, 4.50,
                  2e-3, 0.000000000000000000000000001],
      "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
      "literals": [null, true, false]
    }"#;
    let expected = r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#;
    assert_canonical(&serde_json::from_str(input).unwrap(), expected);
}

/// RFC 8785 section 3.2.3: properties sort by UTF-16 code units. The emoji (U+1F600, the
/// surrogate pair D83D DE00) sorts before U+FB33, though its code point, and so its UTF-8 bytes,
/// sort after it.
#[test]
fn rfc8785_keys_sort_by_utf16_code_units_not_utf8_bytes() {
    let input = r#"{
      "\u20ac": "Euro Sign",
      "\r": "Carriage Return",
      "\ufb33": "Hebrew Letter Dalet With Dagesh",
      "1": "One",
      "\ud83d\ude00": "Emoji: Grinning Face",
      "\u0080": "Control",
      "\u00f6": "Latin Small Letter O With Diaeresis"
    }"#;
    let expected = concat!(
        r#"{"\r":"Carriage Return","#,
        r#""1":"One","#,
        "\"\u{80}\":\"Control\",",
        "\"\u{F6}\":\"Latin Small Letter O With Diaeresis\",",
        "\"\u{20AC}\":\"Euro Sign\",",
        "\"\u{1F600}\":\"Emoji: Grinning Face\",",
        "\"\u{FB33}\":\"Hebrew Letter Dalet With Dagesh\"}",
    );
    assert_canonical(&serde_json::from_str(input).unwrap(), expected);

    // The smallest case where the two orders disagree: a non-BMP key and U+FFFD.
    let value = json!({ "\u{FFFD}": 1, "\u{1F600}": 2 });
    assert_canonical(&value, "{\"\u{1F600}\":2,\"\u{FFFD}\":1}");
    assert_ne!(
        canonical_sha256(&value),
        sha256_hex("{\"\u{FFFD}\":1,\"\u{1F600}\":2}".as_bytes()),
        "keys must not sort by UTF-8 bytes",
    );
}

/// RFC 8785 appendix B: IEEE-754 doubles (by bit pattern) and their canonical text.
#[test]
fn rfc8785_appendix_b_numbers_hash_their_canonical_text() {
    let cases: [(u64, &str); 24] = [
        (0x0000000000000000, "0"),
        (0x8000000000000000, "0"),
        (0x0000000000000001, "5e-324"),
        (0x8000000000000001, "-5e-324"),
        (0x7fefffffffffffff, "1.7976931348623157e+308"),
        (0xffefffffffffffff, "-1.7976931348623157e+308"),
        (0x4340000000000000, "9007199254740992"),
        (0xc340000000000000, "-9007199254740992"),
        (0x4430000000000000, "295147905179352830000"),
        (0x44b52d02c7e14af5, "9.999999999999997e+22"),
        (0x44b52d02c7e14af6, "1e+23"),
        (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
        (0x444b1ae4d6e2ef4e, "999999999999999700000"),
        (0x444b1ae4d6e2ef4f, "999999999999999900000"),
        (0x444b1ae4d6e2ef50, "1e+21"),
        (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
        (0x3eb0c6f7a0b5ed8d, "0.000001"),
        (0x41b3de4355555553, "333333333.3333332"),
        (0x41b3de4355555554, "333333333.33333325"),
        (0x41b3de4355555555, "333333333.3333333"),
        (0x41b3de4355555556, "333333333.3333334"),
        (0x41b3de4355555557, "333333333.33333343"),
        (0xbecbf647612f3696, "-0.0000033333333333333333"),
        (0x43143ff3c1cb0959, "1424953923781206.2"),
    ];
    for (bits, expected) in cases {
        assert_canonical(&json!(f64::from_bits(bits)), expected);
    }
}

#[test]
fn numbers_take_their_shortest_ecmascript_form() {
    let cases: [(Value, &str); 9] = [
        (json!(1.0), "1"),
        (json!(-0.0), "0"),
        (json!(1e21), "1e+21"),
        (json!(1e20), "100000000000000000000"),
        (json!(1e-7), "1e-7"),
        (json!(0.000001), "0.000001"),
        (json!(0.1 + 0.2), "0.30000000000000004"),
        (json!(-12), "-12"),
        (serde_json::from_str("12e1").unwrap(), "120"),
    ];
    for (value, expected) in cases {
        assert_canonical(&value, expected);
    }
}

/// The documented limit: integers beyond 2^53 hash as their nearest double.
#[test]
fn integers_beyond_2_pow_53_hash_as_their_nearest_double() {
    let exact: Value = serde_json::from_str("9007199254740993").unwrap();
    assert_eq!(
        exact.as_u64(),
        Some(9_007_199_254_740_993),
        "the value keeps the exact number"
    );
    assert_canonical(&exact, "9007199254740992");
    assert_eq!(
        canonical_sha256(&exact),
        canonical_sha256(&json!(9_007_199_254_740_992u64))
    );
}

/// JCS escapes only `"`, `\` and the controls below U+0020, with the short forms where JSON has
/// them; `/`, DEL and everything else is written as itself.
#[test]
fn strings_use_the_minimal_escapes() {
    let value = json!("\u{0}\u{8}\t\n\u{c}\r\u{1f}\"\\/\u{7f}\u{2028}é😀");
    assert_canonical(
        &value,
        "\"\\u0000\\b\\t\\n\\f\\r\\u001f\\\"\\\\/\u{7f}\u{2028}é😀\"",
    );
}

#[test]
fn literals_arrays_and_nested_objects_are_written_without_whitespace() {
    let value: Value = serde_json::from_str(
        r#" { "b" : [ true , false , null , { "y" : [ ] , "x" : { } } ] , "a" : "" } "#,
    )
    .unwrap();
    assert_canonical(&value, r#"{"a":"","b":[true,false,null,{"x":{},"y":[]}]}"#);
}

#[test]
fn canonical_sha256_is_lowercase_hex_of_32_bytes() {
    let hash = canonical_sha256(&json!({ "k": [1, 2, 3] }));
    assert_eq!(hash.len(), 64);
    assert!(
        hash.chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)),
        "{hash}"
    );
}

/// A serialisable type hashes as the JSON it serialises to, canonicalised.
#[test]
fn canonical_sha256_of_a_struct_is_that_of_its_json() {
    #[derive(serde::Serialize)]
    struct Outcome<'a> {
        status: &'a str,
        data: Option<Value>,
        error: Option<&'a str>,
        attempts: u32,
        score: f64,
    }
    let outcome = Outcome {
        status: "succeeded",
        data: Some(json!({ "z": 1, "a": [2.50] })),
        error: None,
        attempts: 3,
        score: 1.0,
    };
    let expected =
        r#"{"attempts":3,"data":{"a":[2.5],"z":1},"error":null,"score":1,"status":"succeeded"}"#;
    assert_eq!(
        canonical_sha256_of(&outcome),
        sha256_hex(expected.as_bytes())
    );
    assert_eq!(
        canonical_sha256_of(&outcome),
        canonical_sha256(&serde_json::to_value(&outcome).unwrap()),
    );
}

/// serde_json writes a non-finite float inside a value as `null`; the hash agrees with
/// `to_value`, which makes it `Value::Null`.
#[test]
fn canonical_sha256_of_hashes_a_nested_nan_as_null() {
    let floats = [1.5, f64::NAN, f64::INFINITY];
    assert_eq!(canonical_sha256_of(&floats), sha256_hex(b"[1.5,null,null]"));
    assert_eq!(
        canonical_sha256_of(&floats),
        canonical_sha256(&serde_json::to_value(floats).unwrap())
    );
}

#[test]
#[should_panic(expected = "no canonical JSON form")]
fn canonical_sha256_of_a_bare_nan_panics() {
    canonical_sha256_of(&f64::NAN);
}

// ---------------------------------------------------------------------------------------------
// 2 and 3. Properties of the canonical hash
// ---------------------------------------------------------------------------------------------

/// Integers that a double holds exactly, so that every spelling of one is the same number.
const SAFE_INTEGER: i64 = (1 << 53) - 1;

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::string::string_regex("[a-c]{0,2}").unwrap(),
        proptest::string::string_regex("(?s).{0,5}").unwrap(),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-SAFE_INTEGER..=SAFE_INTEGER).prop_map(Value::from),
        (prop::num::f64::NORMAL
            | prop::num::f64::SUBNORMAL
            | prop::num::f64::ZERO
            | prop::num::f64::POSITIVE
            | prop::num::f64::NEGATIVE)
            .prop_map(Value::from),
        proptest::string::string_regex("(?s).{0,8}")
            .unwrap()
            .prop_map(Value::String),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 40, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..5)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
}

fn json_object() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(key(), json_value(), 0..8)
        .prop_map(|members| Value::Object(members.into_iter().collect()))
}

/// A small deterministic generator, so that one proptest seed picks every spelling choice.
struct Choices(u64);

impl Choices {
    fn below(&mut self, n: usize) -> usize {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

/// Writes `value` as JSON with shuffled keys, random whitespace, random string escapes and
/// another spelling of each number: what a different JSON library could have produced.
fn respell(value: &Value, choices: &mut Choices, out: &mut String) {
    const SPACE: [&str; 5] = ["", " ", "\n", "\t", "\r\n  "];
    out.push_str(SPACE[choices.below(SPACE.len())]);
    match value {
        Value::Object(members) => {
            let mut members: Vec<_> = members.iter().collect();
            for i in (1..members.len()).rev() {
                members.swap(i, choices.below(i + 1));
            }
            out.push('{');
            for (i, (key, member)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                respell_string(key, choices, out);
                out.push_str(SPACE[choices.below(SPACE.len())]);
                out.push(':');
                respell(member, choices, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                respell(item, choices, out);
            }
            out.push(']');
        }
        Value::String(text) => respell_string(text, choices, out),
        Value::Number(number) => {
            if let Some(integer) = number.as_i64() {
                // Parsed back as a double, not an integer: JCS must not tell them apart.
                let spellings = [
                    format!("{integer}"),
                    format!("{integer}.0"),
                    format!("{integer}e0"),
                    format!("{integer}.000E+00"),
                ];
                out.push_str(&spellings[choices.below(spellings.len())]);
            } else {
                let double = number.as_f64().unwrap();
                let spellings = [
                    format!("{double:e}"),
                    format!("{double}"),
                    format!("{double:E}"),
                ];
                out.push_str(&spellings[choices.below(spellings.len())]);
            }
        }
        Value::Bool(_) | Value::Null => out.push_str(&value.to_string()),
    }
    out.push_str(SPACE[choices.below(SPACE.len())]);
}

fn respell_string(text: &str, choices: &mut Choices, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        let escape_anyway = choices.below(3) == 0;
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '/' if escape_anyway => out.push_str("\\/"),
            '\n' if escape_anyway => out.push_str("\\n"),
            c if (c as u32) < 0x20 || escape_anyway => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04X}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Every leaf of `value`, by JSON pointer.
fn leaf_pointers(value: &Value, pointer: String, found: &mut Vec<String>) {
    let escape = |key: &str| key.replace('~', "~0").replace('/', "~1");
    match value {
        Value::Object(members) => {
            for (key, member) in members {
                leaf_pointers(member, format!("{pointer}/{}", escape(key)), found);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                leaf_pointers(item, format!("{pointer}/{i}"), found);
            }
        }
        _ => found.push(pointer),
    }
}

/// A leaf of the same kind whose canonical form differs from `leaf`'s.
fn changed_leaf(leaf: &Value) -> Value {
    match leaf {
        Value::Null => Value::Bool(false),
        Value::Bool(flag) => Value::Bool(!flag),
        Value::String(text) => Value::String(format!("{text}x")),
        Value::Number(number) => match number.as_i64() {
            Some(integer) => Value::from(integer + 1),
            None => {
                // The neighbouring double: always a different canonical number (-0 and 0 are
                // one number, so a sign flip would not do).
                let bits = number.as_f64().unwrap().to_bits();
                let up = f64::from_bits(bits + 1);
                Value::from(if up.is_finite() {
                    up
                } else {
                    f64::from_bits(bits - 1)
                })
            }
        },
        Value::Array(_) | Value::Object(_) => unreachable!("not a leaf"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Key order, whitespace, string escapes and number spelling of the source do not change
    /// the hash.
    #[test]
    fn the_hash_is_of_the_value_not_its_spelling(value in json_object(), seed in any::<u64>()) {
        let compact = serde_json::to_string(&value).unwrap();
        let mut respelled = String::new();
        respell(&value, &mut Choices(seed | 1), &mut respelled);

        let from_compact: Value = serde_json::from_str(&compact).unwrap();
        let from_respelled: Value = serde_json::from_str(&respelled)
            .unwrap_or_else(|e| panic!("respelled JSON does not parse: {e}\n{respelled}"));
        prop_assert_eq!(
            canonical_sha256(&from_compact),
            canonical_sha256(&from_respelled),
            "\n{}\n{}", compact, respelled
        );
    }

    #[test]
    fn changing_any_single_leaf_changes_the_hash(value in json_object(), pick in any::<prop::sample::Index>()) {
        let mut pointers = Vec::new();
        leaf_pointers(&value, String::new(), &mut pointers);
        prop_assume!(!pointers.is_empty());
        let pointer = &pointers[pick.index(pointers.len())];

        let mut changed = value.clone();
        let leaf = changed.pointer_mut(pointer).unwrap();
        *leaf = changed_leaf(leaf);
        prop_assert_ne!(
            canonical_sha256(&value),
            canonical_sha256(&changed),
            "changing {} left the hash unchanged", pointer
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Genesis and link states
// ---------------------------------------------------------------------------------------------

const WORKFLOW: &str = r#"{"version": 1, "steps": [{"id": "a", "agent": "x"}]}"#;

#[test]
fn genesis_hashes_the_documented_object() {
    let input = json!({ "b": 1.0, "a": [true] });
    let expected_text = format!(
        r#"{{"input_sha256":"{}","run_id":"run-1","workflow_sha256":"{}"}}"#,
        sha256_hex(br#"{"a":[true],"b":1}"#),
        sha256_hex(WORKFLOW.as_bytes()),
    );
    assert_eq!(
        genesis("run-1", WORKFLOW, &input),
        sha256_hex(expected_text.as_bytes())
    );
}

#[test]
fn genesis_depends_on_the_run_id_the_workflow_text_and_the_input() {
    let input = json!({ "topic": "rust" });
    let base = genesis("run-1", WORKFLOW, &input);
    assert_ne!(base, genesis("run-2", WORKFLOW, &input), "run id");
    assert_ne!(
        base,
        genesis("run-1", &format!("{WORKFLOW} "), &input),
        "workflow text"
    );
    assert_ne!(
        base,
        genesis("run-1", WORKFLOW, &json!({ "topic": "go" })),
        "input"
    );
    assert_ne!(base, genesis("run-1", WORKFLOW, &json!(null)), "input");
    // The input is hashed as a value: its spelling does not matter.
    let respelled: Value = serde_json::from_str(r#"{ "topic" : "\u0072ust" }"#).unwrap();
    assert_eq!(base, genesis("run-1", WORKFLOW, &respelled));
}

/// Pins the byte encoding the module doc promises, so that another implementation can follow it.
#[test]
fn next_state_hashes_the_documented_byte_encoding() {
    let previous = sha256_hex(b"previous");
    let result = sha256_hex(b"result");
    let mut bytes = Vec::new();
    for field in ["baton.chain.v1", previous.as_str(), "write é"] {
        bytes.extend_from_slice(&(field.len() as u64).to_be_bytes());
        bytes.extend_from_slice(field.as_bytes());
    }
    bytes.extend_from_slice(&7u32.to_be_bytes());
    bytes.extend_from_slice(&64u64.to_be_bytes());
    bytes.extend_from_slice(result.as_bytes());
    assert_eq!(
        next_state(&previous, "write é", 7, &result),
        sha256_hex(&bytes)
    );
}

#[test]
fn next_state_fields_cannot_run_into_each_other() {
    let previous = sha256_hex(b"previous");
    let result = sha256_hex(b"result");
    let cases: [(&str, u32); 8] = [
        ("a", 12),
        ("a1", 2),
        ("a12", 0),
        ("a", 1),
        ("a\u{0}1", 2),
        ("a\u{0}", 12),
        ("", 0),
        ("\u{0}", 0),
    ];
    let states: Vec<String> = cases
        .iter()
        .map(|(step, visit)| next_state(&previous, step, *visit, &result))
        .collect();
    for i in 0..states.len() {
        for j in i + 1..states.len() {
            assert_ne!(
                states[i], states[j],
                "{:?} and {:?} collide",
                cases[i], cases[j]
            );
        }
    }

    // Inputs that a NUL-separated encoding would run together: a NUL may sit in any field.
    assert_ne!(
        next_state("p", "a\u{0}1", 2, "r"),
        next_state("p", "a", 1, "2\u{0}r"),
        "step id, visit and result",
    );
    assert_ne!(
        next_state("p\u{0}a", "b", 0, "r"),
        next_state("p", "a\u{0}b", 0, "r"),
        "previous state and step id",
    );

    // Moving characters between the hash fields and the step id changes the state too.
    assert_ne!(
        next_state("ab", "c", 0, "d"),
        next_state("a", "bc", 0, "d"),
        "previous state and step id",
    );
    assert_ne!(
        next_state("a", "bc", 0, "d"),
        next_state("a", "b", 0, "cd"),
        "step id and result",
    );
    assert_ne!(
        next_state(&previous, "a", 1, &result),
        next_state(&result, "a", 1, &previous)
    );
}

#[test]
fn next_state_depends_on_every_argument() {
    let previous = sha256_hex(b"previous");
    let result = sha256_hex(b"result");
    let base = next_state(&previous, "a", 1, &result);
    assert_eq!(
        base,
        next_state(&previous, "a", 1, &result),
        "deterministic"
    );
    assert_ne!(base, next_state(&result, "a", 1, &result), "previous state");
    assert_ne!(base, next_state(&previous, "b", 1, &result), "step id");
    assert_ne!(base, next_state(&previous, "a", 2, &result), "visit");
    assert_ne!(base, next_state(&previous, "a", 1, &previous), "result");
}

// ---------------------------------------------------------------------------------------------
// 5. verify_chain
// ---------------------------------------------------------------------------------------------

fn run_genesis() -> String {
    genesis("run-1", WORKFLOW, &json!({ "topic": "rust" }))
}

/// A chain of five links, with a step visited twice.
fn chain(genesis: &str) -> Vec<ChainLink> {
    let steps = [
        ("plan", 1),
        ("write", 1),
        ("review", 1),
        ("write", 2),
        ("review", 2),
    ];
    let mut links: Vec<ChainLink> = Vec::new();
    for (step_id, visit) in steps {
        let previous = links
            .last()
            .map_or(genesis, |link| &link.state_sha256)
            .to_owned();
        let result = canonical_sha256(&json!({ "step": step_id, "visit": visit }));
        links.push(ChainLink::after(&previous, step_id, visit, result));
    }
    links
}

#[test]
fn an_intact_chain_verifies() {
    let genesis = run_genesis();
    let links = chain(&genesis);
    let head = links.last().unwrap().state_sha256.clone();
    assert_eq!(verify_chain(&genesis, &links, &head), Ok(()));
    // Each link's state is next_state of the one before.
    assert_eq!(
        links[0].state_sha256,
        next_state(&genesis, "plan", 1, &links[0].result_sha256)
    );
    assert_eq!(
        links[3].state_sha256,
        next_state(&links[2].state_sha256, "write", 2, &links[3].result_sha256),
    );
}

#[test]
fn an_empty_chain_verifies_when_the_head_is_genesis() {
    let genesis = run_genesis();
    assert_eq!(verify_chain(&genesis, &[], &genesis), Ok(()));
    assert_eq!(
        verify_chain(&genesis, &[], &sha256_hex(b"other")),
        Err(ChainError::HeadMismatch {
            head: sha256_hex(b"other"),
            chain_end: genesis.clone(),
            links: 0,
        }),
    );
}

#[test]
fn a_changed_result_hash_names_its_link() {
    let genesis = run_genesis();
    let mut links = chain(&genesis);
    let head = links.last().unwrap().state_sha256.clone();
    links[3].result_sha256 = canonical_sha256(&json!("forged"));

    let error = verify_chain(&genesis, &links, &head).unwrap_err();
    assert_eq!(
        error,
        ChainError::BrokenLink {
            index: 3,
            step_id: "write".into(),
            visit: 2,
            stored: links[3].state_sha256.clone(),
            recomputed: next_state(&links[2].state_sha256, "write", 2, &links[3].result_sha256),
        },
    );
    let message = error.to_string();
    assert!(
        message.starts_with("link 3 (step \"write\" visit 2): state is "),
        "{message}"
    );
}

#[test]
fn a_changed_state_names_its_link() {
    let genesis = run_genesis();
    let mut links = chain(&genesis);
    let head = links.last().unwrap().state_sha256.clone();
    links[1].state_sha256 = sha256_hex(b"forged");

    match verify_chain(&genesis, &links, &head) {
        Err(ChainError::BrokenLink {
            index: 1,
            step_id,
            visit: 1,
            stored,
            ..
        }) => {
            assert_eq!(step_id, "write");
            assert_eq!(stored, sha256_hex(b"forged"));
        }
        other => panic!("expected link 1 to be named, got {other:?}"),
    }
}

#[test]
fn a_changed_step_id_or_visit_names_its_link() {
    let genesis = run_genesis();
    let links = chain(&genesis);
    let head = links.last().unwrap().state_sha256.clone();

    let mut renamed = links.clone();
    renamed[2].step_id = "approve".into();
    assert!(matches!(
        verify_chain(&genesis, &renamed, &head),
        Err(ChainError::BrokenLink { index: 2, .. })
    ));

    let mut revisited = links.clone();
    revisited[4].visit = 3;
    assert!(matches!(
        verify_chain(&genesis, &revisited, &head),
        Err(ChainError::BrokenLink {
            index: 4,
            visit: 3,
            ..
        })
    ));
}

#[test]
fn a_chain_from_another_genesis_breaks_at_its_first_link() {
    let links = chain(&run_genesis());
    let head = links.last().unwrap().state_sha256.clone();
    let other = genesis("run-2", WORKFLOW, &json!({ "topic": "rust" }));
    assert!(matches!(
        verify_chain(&other, &links, &head),
        Err(ChainError::BrokenLink { index: 0, .. })
    ));
}

#[test]
fn a_head_that_is_not_the_last_link_is_named() {
    let genesis = run_genesis();
    let links = chain(&genesis);
    let last = links.last().unwrap().state_sha256.clone();

    // A head left behind by a dropped link, and links appended after the head was written.
    let stale_head = links[3].state_sha256.clone();
    let error = verify_chain(&genesis, &links, &stale_head).unwrap_err();
    assert_eq!(
        error,
        ChainError::HeadMismatch {
            head: stale_head.clone(),
            chain_end: last.clone(),
            links: 5
        },
    );
    assert_eq!(
        error.to_string(),
        format!("run head is {stale_head}, but the chain of 5 links ends at {last}"),
    );

    // Dropping the last link leaves a chain that holds but no longer reaches the head.
    assert_eq!(
        verify_chain(&genesis, &links[..4], &last),
        Err(ChainError::HeadMismatch {
            head: last,
            chain_end: stale_head,
            links: 4
        }),
    );
}

#[test]
fn a_chain_link_is_stored_with_these_field_names() {
    let link = ChainLink::after(&run_genesis(), "plan", 1, sha256_hex(b"result"));
    let stored = serde_json::to_value(&link).unwrap();
    assert_eq!(
        stored,
        json!({
            "step_id": "plan",
            "visit": 1,
            "result_sha256": sha256_hex(b"result"),
            "state_sha256": link.state_sha256,
        }),
    );
    let read_back: ChainLink = serde_json::from_value(stored).unwrap();
    assert_eq!(read_back, link);
}

/// A step's outcome as it was hashed before it was written member by member: the derived struct
/// through the canonicalizer. Chains stored then must verify now.
fn outcome_sha256_as_before(record: &baton_core::StepRecord) -> String {
    #[derive(serde::Serialize)]
    struct Outcome<'a> {
        status: baton_core::StepStatus,
        data: Option<baton_core::integrity::ExactNumbers<'a>>,
        error: Option<&'a str>,
        notes: Option<&'a baton_core::handoff::AgentNotes>,
        at_ms: i64,
    }
    canonical_sha256_of(&Outcome {
        status: record.status,
        data: record
            .data
            .as_deref()
            .map(baton_core::integrity::ExactNumbers),
        error: record.error.as_deref(),
        notes: record.notes.as_deref(),
        at_ms: record.at_ms,
    })
}

proptest! {
    #[test]
    fn a_step_outcome_hashes_as_the_whole_object_did(
        data in proptest::option::of(json_value()),
        error in proptest::option::of("(?s).{0,12}"),
        status in 0usize..4,
        at_ms in prop_oneof![Just(0i64), any::<i64>(), 1_600_000_000_000i64..1_900_000_000_000],
        summary in proptest::option::of("(?s).{0,12}"),
    ) {
        let status = [
            baton_core::StepStatus::Succeeded,
            baton_core::StepStatus::Failed,
            baton_core::StepStatus::Rejected,
            baton_core::StepStatus::Redriven,
        ][status];
        let notes = summary.map(|summary| {
            std::sync::Arc::new(baton_core::handoff::AgentNotes {
                messages: Vec::new(),
                decisions: vec![baton_core::handoff::NewDecision {
                    summary,
                    rationale: "because".into(),
                    related_artifacts: vec!["a.rs".into()],
                }],
            })
        });
        let record = baton_core::StepRecord {
            step_id: "s".into(),
            step_type: baton_core::workflow::StepType::Agent,
            visit: 1,
            parent: None,
            item: None,
            status,
            data: data.map(std::sync::Arc::new),
            error: error.map(Into::into),
            next: None,
            notes,
            at_ms,
        };
        prop_assert_eq!(record.result_sha256(), outcome_sha256_as_before(&record));
    }
}
