//! Every validation rule of `parse_workflow`, each shown on a small document: the JSON path and
//! step id of the problem, its severity, and a message that names it.

use std::path::{Path, PathBuf};

use baton_core::payload::RESERVED_KEYS;
use baton_core::{Limits, parse_workflow, parse_workflow_with};
use serde_json::{Value, json};

mod checks;

use checks::*;

// ---------------------------------------------------------------------------------------------
// Reading the text
// ---------------------------------------------------------------------------------------------

#[test]
fn text_that_is_not_json_is_rejected_at_the_root() {
    let error = only_error(
        r#"{"steps": [ {"id": "plan" "type": "agent"} ]}"#,
        "$",
        None,
        "the document is not valid JSON",
    );
    // The position of the problem is part of the message.
    assert!(error.message.contains("column"), "{error}");

    only_error("steps: plan, code", "$", None, "not valid JSON");
}

#[test]
fn comments_and_trailing_commas_are_accepted() {
    let parsed = accepted(
        r#"
        // The spec's own examples carry comments.
        {
            "id": "commented",
            /* a block comment */
            "steps": [
                { "id": "plan", "type": "agent", "agent": "planner", }, // trailing comma
                { "id": "code", "type": "agent", "agent": "coder" },
            ],
        }
        "#,
    );
    assert!(parsed.warnings.is_empty(), "{}", list(&parsed.warnings));
    assert_eq!(parsed.workflow.id.as_deref(), Some("commented"));
    assert_eq!(parsed.workflow.steps().len(), 2);
}

#[test]
fn json_nested_deeper_than_the_limit_is_rejected_without_overflowing_the_stack() {
    assert_eq!(Limits::default().max_json_depth, 64);

    let arrays = "[".repeat(100_000);
    only_error(
        &arrays,
        "$",
        None,
        "the document nests 100000 levels deep; the limit is 64",
    );

    let objects = r#"{"a":"#.repeat(100_000);
    only_error(&objects, "$", None, "the limit is 64");

    // Well-formed (closed) deep nesting is rejected just the same.
    let closed = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    only_error(&closed, "$", None, "nests 100000 levels deep");

    // Brackets inside strings are not nesting.
    let in_string = format!(
        r#"{{"description": "{}", "steps": [{{"id": "plan", "type": "agent", "agent": "p"}}]}}"#,
        "[".repeat(1_000)
    );
    accepted(&in_string);
}

#[test]
fn json_depth_limit_boundary() {
    // `{` + `"steps": [` + `{` = 3 levels; an unknown field adds the rest.
    let at_depth = |depth: usize| {
        let arrays = depth - 1; // the outer object is level 1
        format!(
            r#"{{"steps": [{{"id": "plan", "type": "agent", "agent": "p"}}], "extra": {}{}}}"#,
            "[".repeat(arrays),
            "]".repeat(arrays)
        )
    };
    // 64 deep: read, then rejected only for the unknown field.
    only_error(&at_depth(64), "$.extra", None, "unknown field \"extra\"");
    // 65 deep: rejected for its depth.
    only_error(
        &at_depth(65),
        "$",
        None,
        "the document nests 65 levels deep; the limit is 64",
    );
}

#[test]
fn deep_nesting_after_a_quote_in_a_comment_is_still_rejected_for_its_depth() {
    // 100 levels: within jsonc-parser's own ceiling (512), beyond Baton's (64).
    let text = format!(
        "// the \"steps\n{{\"steps\": [{{\"id\": \"plan\", \"type\": \"agent\", \"agent\": \"p\"}}], \"extra\": {}{}}}",
        "[".repeat(99),
        "]".repeat(99)
    );
    let diagnostics = rejected(&text);
    expect_error(&diagnostics, "$", None, "levels deep; the limit is 64");
}

#[test]
fn deep_nesting_after_a_quote_in_a_comment_does_not_overflow_the_stack() {
    // Whatever the message, reading must fail cleanly rather than crash the process.
    let text = format!("// \"\n{}", "[".repeat(100_000));
    let diagnostics = rejected(&text);
    at(&diagnostics, "$");
}

#[test]
fn a_syntax_error_after_a_comment_is_reported_where_it_is() {
    let text =
        "// a comment\n{\n  \"steps\": [\n    {\"id\": \"plan\" \"type\": \"agent\"}\n  ]\n}\n";
    let diagnostics = rejected(text);
    // The missing comma is on line 4.
    expect_error(&diagnostics, "$", None, "line 4");
}

// ---------------------------------------------------------------------------------------------
// Top level
// ---------------------------------------------------------------------------------------------

#[test]
fn the_document_must_be_an_object() {
    for text in ["[]", "\"steps\"", "42", "null", r#"[{"id": "plan"}]"#] {
        only_error(text, "$", None, "a workflow must be a JSON object");
    }
}

#[test]
fn a_workflow_needs_a_steps_array() {
    only_error("{}", "$", None, "a workflow needs a \"steps\" array");
    only_error(
        r#"{"id": "w", "description": "no steps"}"#,
        "$",
        None,
        "needs a \"steps\" array",
    );
    // `steps` of the wrong JSON type is reported at `steps`.
    only_error(
        r#"{"steps": {"plan": {}}}"#,
        "$.steps",
        None,
        "invalid type: map, expected a sequence",
    );
}

#[test]
fn a_workflow_needs_at_least_one_step() {
    only_error(
        r#"{"steps": []}"#,
        "$.steps",
        None,
        "a workflow needs at least one step",
    );
}

#[test]
fn unknown_top_level_fields_are_errors_with_a_hint() {
    let text = doc(json!([agent("plan")]));
    let mut value: Value = serde_json::from_str(&text).unwrap();
    value["max_visit"] = json!(5);
    value["colour"] = json!("blue");
    let diagnostics = rejected(&value.to_string());
    assert_eq!(diagnostics.len(), 2, "{}", list(&diagnostics));
    let close = expect_error(
        &diagnostics,
        "$.max_visit",
        None,
        "unknown field \"max_visit\"; did you mean \"max_visits\"?",
    );
    assert_eq!(close.step_id, None);
    // Far from every known field: no hint.
    let far = expect_error(&diagnostics, "$.colour", None, "unknown field \"colour\"");
    assert!(!far.message.contains("did you mean"), "{far}");
}

#[test]
fn max_visits_must_be_in_range() {
    let ceiling = Limits::default().max_visits_ceiling;
    for bad in [json!(0), json!(ceiling + 1)] {
        let text = json!({ "max_visits": bad, "steps": [agent("plan")] }).to_string();
        only_error(
            &text,
            "$.max_visits",
            None,
            &format!("max_visits must be between 1 and {ceiling}"),
        );
    }
    // Not a number at all is a type error at the same path.
    only_error(
        &json!({ "max_visits": -1, "steps": [agent("plan")] }).to_string(),
        "$.max_visits",
        None,
        "invalid value",
    );
    // A step's own max_visits is checked the same way.
    only_error(
        &doc(json!([with(agent("plan"), json!({ "max_visits": 0 }))])),
        "$.steps[0].max_visits",
        Some("plan"),
        "max_visits must be between 1",
    );
    let parsed = accepted(&json!({ "max_visits": 3, "steps": [agent("plan")] }).to_string());
    assert_eq!(parsed.workflow.max_visits, 3);
}

// ---------------------------------------------------------------------------------------------
// Steps
// ---------------------------------------------------------------------------------------------

#[test]
fn a_step_must_be_an_object() {
    let diagnostics = rejected(&doc(json!([agent("plan"), "code", 5])));
    assert_eq!(diagnostics.len(), 2, "{}", list(&diagnostics));
    expect_error(
        &diagnostics,
        "$.steps[1]",
        None,
        "a step must be a JSON object",
    );
    expect_error(
        &diagnostics,
        "$.steps[2]",
        None,
        "a step must be a JSON object",
    );
}

#[test]
fn a_step_needs_an_id() {
    only_error(
        &doc(json!([agent("plan"), { "type": "agent", "agent": "coder" }])),
        "$.steps[1]",
        None,
        "a step needs an \"id\"",
    );
}

#[test]
fn a_step_needs_a_type() {
    only_error(
        &doc(json!([agent("plan"), { "id": "code", "agent": "coder" }])),
        "$.steps[1]",
        Some("code"),
        "a step needs a \"type\"",
    );
}

#[test]
fn an_unknown_step_type_is_an_error_with_a_hint() {
    only_error(
        &doc(json!([agent("plan"), { "id": "code", "type": "agnet", "agent": "coder" }])),
        "$.steps[1].type",
        Some("code"),
        "unknown step type \"agnet\"; expected agent, transform, parallel, condition, approval or map; did you mean \"agent\"?",
    );
    let far = only_error(
        &doc(json!([{ "id": "code", "type": "shell" }])),
        "$.steps[0].type",
        Some("code"),
        "unknown step type \"shell\"",
    );
    assert!(!far.message.contains("did you mean"), "{far}");
}

#[test]
fn a_field_of_the_wrong_json_type_reports_the_field_path() {
    let diagnostics = rejected(&doc(json!([
        agent("plan"),
        with(agent("code"), json!({ "next": 5 })),
        with(agent("review"), json!({ "end": "yes" })),
        with(agent("fix"), json!({ "retry": { "max_attempts": "three" } })),
        {
            "id": "tests",
            "type": "parallel",
            "steps": [agent("unit"), { "id": "lint", "type": "agent", "agent": ["l"] }]
        },
        // A malformed step does not hide the problems of the others.
        { "id": "ship", "type": "agnet", "agent": "shipper" },
    ])));
    assert_eq!(diagnostics.len(), 5, "{}", list(&diagnostics));
    expect_error(
        &diagnostics,
        "$.steps[1].next",
        Some("code"),
        "invalid type: integer `5`, expected a string",
    );
    expect_error(
        &diagnostics,
        "$.steps[2].end",
        Some("review"),
        "invalid type: string \"yes\", expected a boolean",
    );
    expect_error(
        &diagnostics,
        "$.steps[3].retry.max_attempts",
        Some("fix"),
        "invalid type: string \"three\"",
    );
    expect_error(
        &diagnostics,
        "$.steps[4].steps[1].agent",
        Some("lint"),
        "invalid type: sequence, expected a string",
    );
    expect_error(
        &diagnostics,
        "$.steps[5].type",
        Some("ship"),
        "unknown step type",
    );
}

#[test]
fn an_unknown_step_field_is_an_error_with_a_hint() {
    only_error(
        &doc(json!([
            with(agent("plan"), json!({ "nxt": "code" })),
            agent("code")
        ])),
        "$.steps[0].nxt",
        Some("plan"),
        "unknown field \"nxt\"; did you mean \"next\"?",
    );
    let far = only_error(
        &doc(json!([with(agent("plan"), json!({ "colour": "blue" }))])),
        "$.steps[0].colour",
        Some("plan"),
        "unknown field \"colour\"",
    );
    assert!(!far.message.contains("did you mean"), "{far}");
}

// ---------------------------------------------------------------------------------------------
// Fields each type needs
// ---------------------------------------------------------------------------------------------

#[test]
fn an_agent_step_needs_an_agent() {
    only_error(
        &doc(json!([{ "id": "plan", "type": "agent" }])),
        "$.steps[0]",
        Some("plan"),
        "an agent step needs \"agent\"",
    );
    only_error(
        &doc(json!([{ "id": "plan", "type": "agent", "agent": "  " }])),
        "$.steps[0].agent",
        Some("plan"),
        "agent name is empty",
    );
}

#[test]
fn a_transform_step_needs_a_transform() {
    only_error(
        &doc(json!([agent("plan"), { "id": "extract", "type": "transform" }])),
        "$.steps[1]",
        Some("extract"),
        "a transform step needs \"transform\"",
    );
}

#[test]
fn a_parallel_step_needs_branches() {
    only_error(
        &doc(json!([{ "id": "tests", "type": "parallel" }])),
        "$.steps[0]",
        Some("tests"),
        "a parallel step needs \"steps\"",
    );
    only_error(
        &doc(json!([{ "id": "tests", "type": "parallel", "steps": [] }])),
        "$.steps[0].steps",
        Some("tests"),
        "a parallel step needs at least one branch",
    );
}

#[test]
fn a_condition_step_needs_a_condition() {
    only_error(
        &doc(json!([agent("plan"), { "id": "gate", "type": "condition", "then": "plan" }])),
        "$.steps[1]",
        Some("gate"),
        "a condition step needs \"condition\"",
    );
}

#[test]
fn a_condition_step_needs_then_or_else() {
    only_error(
        &doc(json!([
            agent("plan"),
            { "id": "gate", "type": "condition", "condition": "context.plan.ok" },
            agent("code"),
        ])),
        "$.steps[1]",
        Some("gate"),
        "a condition step needs \"then\", \"else\" or both",
    );
    // Either one is enough.
    for field in ["then", "else"] {
        accepted(&doc(json!([
            agent("plan"),
            { "id": "gate", "type": "condition", "condition": "context.plan.ok", field: "plan" },
            agent("code"),
        ])));
    }
}

// ---------------------------------------------------------------------------------------------
// Ids
// ---------------------------------------------------------------------------------------------

#[test]
fn duplicate_ids_are_reported_at_the_second_occurrence() {
    only_error(
        &doc(json!([agent("plan"), agent("code"), agent("plan")])),
        "$.steps[2].id",
        Some("plan"),
        "duplicate step id \"plan\"; it is first used at $.steps[0]",
    );
}

#[test]
fn a_branch_repeating_a_top_level_id_is_a_duplicate() {
    // Top-level first, branch second.
    only_error(
        &doc(json!([
            agent("unit"),
            { "id": "tests", "type": "parallel", "steps": [agent("lint"), agent("unit")] },
        ])),
        "$.steps[1].steps[1].id",
        Some("unit"),
        "duplicate step id \"unit\"; it is first used at $.steps[0]",
    );
    // Branch first, top-level second.
    only_error(
        &doc(json!([
            { "id": "tests", "type": "parallel", "steps": [agent("unit")] },
            agent("unit"),
        ])),
        "$.steps[1].id",
        Some("unit"),
        "duplicate step id \"unit\"; it is first used at $.steps[0].steps[0]",
    );
    // Two branches of different parallel steps.
    only_error(
        &doc(json!([
            { "id": "a", "type": "parallel", "steps": [agent("unit")] },
            { "id": "b", "type": "parallel", "steps": [agent("unit")] },
        ])),
        "$.steps[1].steps[0].id",
        Some("unit"),
        "it is first used at $.steps[0].steps[0]",
    );
}

#[test]
fn reserved_step_ids_are_errors() {
    let reserved = ["input", "context", "error", "messages", "handoff", "map"];
    assert_eq!(RESERVED_KEYS, reserved);
    for id in reserved {
        only_error(
            &doc(json!([agent(id)])),
            "$.steps[0].id",
            Some(id),
            &format!("step id \"{id}\" is reserved"),
        );
    }
}

#[test]
fn reserved_output_aliases_are_errors() {
    for alias in RESERVED_KEYS {
        only_error(
            &doc(json!([with(agent("plan"), json!({ "output": alias }))])),
            "$.steps[0].output",
            Some("plan"),
            &format!("output \"{alias}\" is reserved"),
        );
    }
}

#[test]
fn an_output_alias_equal_to_another_step_id_is_an_error() {
    only_error(
        &doc(json!([
            with(agent("plan"), json!({ "output": "code" })),
            agent("code")
        ])),
        "$.steps[0].output",
        Some("plan"),
        "output \"code\" is also the id of another step",
    );
    // A step may name its own id as its alias.
    accepted(&doc(json!([with(
        agent("plan"),
        json!({ "output": "plan" })
    )])));
}

#[test]
fn ids_may_only_hold_letters_digits_underscores_and_hyphens() {
    for id in ["plan step", "plan.step", "plan/step", "plän", "-plan"] {
        only_error(
            &doc(json!([agent(id)])),
            "$.steps[0].id",
            Some(id),
            &format!(
                "step id \"{id}\" may only contain ASCII letters, digits, \"_\" and \"-\" (not first)"
            ),
        );
    }
    only_error(
        &doc(json!([agent("")])),
        "$.steps[0].id",
        Some(""),
        "step id is empty",
    );
    // Output aliases follow the same rule.
    only_error(
        &doc(json!([with(
            agent("plan"),
            json!({ "output": "the plan" })
        )])),
        "$.steps[0].output",
        Some("plan"),
        "output \"the plan\" may only contain",
    );
    accepted(&doc(json!([agent("Plan_2-b")])));
}

#[test]
fn ids_longer_than_the_limit_are_errors() {
    assert_eq!(Limits::default().max_id_len, 128);
    // The agent named apart: `agent(id)` names it after the id, past its own limit.
    let step = |id: &str| with(agent(id), json!({"agent": "planner"}));
    let long = "a".repeat(129);
    only_error(
        &doc(json!([step(&long)])),
        "$.steps[0].id",
        Some(long.as_str()),
        "step id is 129 characters long; the limit is 128",
    );
    accepted(&doc(json!([step(&"a".repeat(128))])));
}

#[test]
fn a_short_non_ascii_id_is_rejected_for_its_characters_not_its_length() {
    let id = "é".repeat(65);
    only_error(
        &doc(json!([with(agent(&id), json!({"agent": "planner"}))])),
        "$.steps[0].id",
        Some(id.as_str()),
        "may only contain ASCII letters",
    );
}

// ---------------------------------------------------------------------------------------------
// Workflow ids, agent names and numbers (issue 28: ANSI escapes in a workflow id reached
// `baton runs list`, braces reached Redis keys, and integers beyond 64 bits were rounded)
// ---------------------------------------------------------------------------------------------

/// A document with workflow id `id` (JSON-escaped as it must be).
fn with_id(id: &str) -> String {
    json!({ "id": id, "steps": [agent("plan")] }).to_string()
}

#[test]
fn a_workflow_id_with_an_escape_sequence_is_refused_at_its_path_and_shown_escaped() {
    // What the attack submitted: `runs list` cleared the screen and painted a fake row.
    let hostile = "\u{1b}[2J\u{1b}[31mpayments-prod";
    let error = only_error(
        &with_id(hostile),
        "$.id",
        None,
        "workflow id \"\\u{1b}[2J\\u{1b}[31mpayments-prod\" holds an unprintable character (U+001B) at byte 0",
    );
    assert!(!error.to_string().contains('\u{1b}'), "{error}");
    for (id, needle) in [
        ("line\nbreak", "(U+000A) at byte 4"),
        ("del\u{7f}", "(U+007F) at byte 3"),
        ("csi\u{9b}31m", "(U+009B) at byte 3"),
        ("txt\u{202e}fdp.exe", "(U+202E) at byte 3"),
        ("zero\u{200b}width", "(U+200B) at byte 4"),
    ] {
        only_error(&with_id(id), "$.id", None, needle);
    }
}

#[test]
fn a_workflow_id_with_braces_is_refused_since_braces_pick_a_redis_cluster_slot() {
    for (id, at) in [("{run}", 0), ("a}b", 1), ("x:{i1}", 2)] {
        only_error(
            &with_id(id),
            "$.id",
            None,
            &format!("holds a brace at byte {at}; names are part of storage keys"),
        );
    }
}

#[test]
fn a_workflow_id_is_bounded_in_bytes_and_not_empty() {
    only_error(
        &with_id(&"a".repeat(129)),
        "$.id",
        None,
        "workflow id is 129 bytes long; the limit is 128",
    );
    only_error(
        &with_id(&"é".repeat(65)),
        "$.id",
        None,
        "workflow id is 130 bytes long; the limit is 128",
    );
    only_error(&with_id(""), "$.id", None, "workflow id is empty");
    for fine in ["a".repeat(128), "Feature dev: v2 (équipe/α)".to_owned()] {
        let parsed = accepted(&with_id(&fine));
        assert_eq!(parsed.workflow.id.as_deref(), Some(fine.as_str()));
    }
}

#[test]
fn agent_names_follow_the_rules_of_workflow_ids() {
    for (name, needle) in [
        (
            "{planner}",
            "agent name \"{planner}\" holds a brace at byte 0",
        ),
        (
            "plan\u{1b}]0;owned\u{7}",
            "holds an unprintable character (U+001B) at byte 4",
        ),
    ] {
        only_error(
            &doc(json!([with(agent("plan"), json!({ "agent": name }))])),
            "$.steps[0].agent",
            Some("plan"),
            needle,
        );
        // A map step's agent too.
        only_error(
            &doc(json!([{
                "id": "each", "type": "map", "items": "input", "agent": name
            }])),
            "$.steps[0].agent",
            Some("each"),
            needle,
        );
    }
    only_error(
        &doc(json!([with(
            agent("plan"),
            json!({ "agent": "p".repeat(129) })
        )])),
        "$.steps[0].agent",
        Some("plan"),
        "agent name is 129 bytes long; the limit is 128",
    );
    accepted(&doc(json!([with(
        agent("plan"),
        json!({ "agent": "planner v2.1/α" })
    )])));
}

#[test]
fn integers_beyond_64_bits_are_refused_naming_their_path_and_step() {
    let text = r#"{
        "steps": [
            { "id": "plan", "type": "agent", "agent": "planner" },
            { "id": "code", "type": "agent", "agent": "coder",
              "timeout_ms": 123456789012345678901234567890 },
            { "id": "tests", "type": "parallel", "steps": [
                { "id": "unit", "type": "agent", "agent": "tester",
                  "retry": { "max_attempts": -9223372036854775809 } }
            ] }
        ]
    }"#;
    let diagnostics = rejected(text);
    for (path, step_id, literal) in [
        (
            "$.steps[1].timeout_ms",
            Some("code"),
            "123456789012345678901234567890",
        ),
        (
            "$.steps[2].steps[0].retry.max_attempts",
            Some("unit"),
            "-9223372036854775809",
        ),
    ] {
        // Only this one: not serde's complaint about the float it was rounded to.
        let found = at(&diagnostics, path);
        assert_eq!(found.step_id.as_deref(), step_id, "{found}");
        assert_eq!(
            found.message,
            format!(
                "integer {literal} is beyond 64 bits, which JSON readers round to a float; \
                 write it as a string (\"{literal}\")"
            )
        );
    }
    // Outside any step, at the document's own fields.
    let top = r#"{"max_visits": 18446744073709551616, "steps": [{"id": "a", "type": "agent", "agent": "x"}]}"#;
    only_error(
        top,
        "$.max_visits",
        None,
        "integer 18446744073709551616 is beyond 64 bits",
    );
    // The largest integers that fit are not flagged, nor floats however large.
    let fits = doc(json!([with(
        agent("plan"),
        json!({ "timeout_ms": u64::MAX, "description": "1e400 in a string" })
    )]));
    assert!(
        parse_workflow(&fits)
            .err()
            .is_none_or(|e| !e.to_string().contains("beyond 64 bits")),
    );
}

#[test]
fn a_document_of_many_big_integers_names_twenty_and_says_there_are_more() {
    let many = vec!["123456789012345678901234567890"; 30].join(", ");
    let text =
        format!(r#"{{"steps": [{{"id": "a", "type": "agent", "agent": "x"}}], "k": [{many}]}}"#);
    let diagnostics = rejected(&text);
    let named = diagnostics
        .iter()
        .filter(|d| d.message.contains("is beyond 64 bits"))
        .count();
    assert_eq!(named, 20, "{}", list(&diagnostics));
    expect_error(
        &diagnostics,
        "$",
        None,
        "more integers beyond 64 bits than the 20 named",
    );
}

// ---------------------------------------------------------------------------------------------
// Routing
// ---------------------------------------------------------------------------------------------

/// A workflow whose second step sets `field` to `target`, with a parallel step `tests`
/// (branches `unit` and `lint`) and a top-level `review`.
fn routing_doc(field: &str, target: &str) -> (String, &'static str) {
    let (source, id) = match field {
        "next" | "on_error" => (agent("code"), "code"),
        "then" | "else" => (
            json!({ "id": "gate", "type": "condition", "condition": "context.plan.ok" }),
            "gate",
        ),
        "on_approve" | "on_reject" => (json!({ "id": "sign-off", "type": "approval" }), "sign-off"),
        other => panic!("not a routing field: {other}"),
    };
    let text = doc(json!([
        agent("plan"),
        with(source, json!({ field: target })),
        { "id": "tests", "type": "parallel", "steps": [agent("unit"), agent("lint")] },
        agent("review"),
    ]));
    (text, id)
}

const ROUTING_FIELDS: [&str; 6] = [
    "next",
    "then",
    "else",
    "on_error",
    "on_approve",
    "on_reject",
];

#[test]
fn routing_fields_naming_a_top_level_step_are_accepted() {
    for field in ROUTING_FIELDS {
        let (text, _) = routing_doc(field, "review");
        accepted(&text);
    }
}

#[test]
fn routing_fields_naming_no_step_are_errors_with_a_hint() {
    for field in ROUTING_FIELDS {
        let (text, id) = routing_doc(field, "reviw");
        only_error(
            &text,
            &format!("$.steps[1].{field}"),
            Some(id),
            &format!("{field} names no step: \"reviw\"; did you mean \"review\"?"),
        );
        let (text, id) = routing_doc(field, "deploy-to-production");
        let far = only_error(
            &text,
            &format!("$.steps[1].{field}"),
            Some(id),
            &format!("{field} names no step: \"deploy-to-production\""),
        );
        assert!(!far.message.contains("did you mean"), "{far}");
    }
}

#[test]
fn routing_to_a_parallel_branch_is_an_error() {
    for field in ROUTING_FIELDS {
        let (text, id) = routing_doc(field, "unit");
        only_error(
            &text,
            &format!("$.steps[1].{field}"),
            Some(id),
            &format!(
                "{field} names \"unit\", a branch of parallel step \"tests\"; only top-level steps can be routed to"
            ),
        );
    }
}

#[test]
fn end_true_with_next_is_an_error() {
    only_error(
        &doc(json!([
            with(agent("plan"), json!({ "next": "code", "end": true })),
            agent("code"),
        ])),
        "$.steps[0].end",
        Some("plan"),
        "\"end\": true and \"next\" contradict each other",
    );
    // `"end": false` says nothing against `next`.
    accepted(&doc(json!([
        with(agent("plan"), json!({ "next": "code", "end": false })),
        agent("code"),
    ])));
}

// ---------------------------------------------------------------------------------------------
// References to data: `input`, transforms, conditions
// ---------------------------------------------------------------------------------------------

#[test]
fn input_naming_no_step_is_an_error_with_a_hint() {
    only_error(
        &doc(json!([
            agent("plan"),
            with(agent("code"), json!({ "input": "plna" }))
        ])),
        "$.steps[1].input",
        Some("code"),
        "\"plna\" names no step or output; did you mean \"plan\"?",
    );
}

#[test]
fn input_may_name_a_step_or_an_output_alias() {
    let parsed = accepted(&doc(json!([
        agent("plan"),
        with(
            agent("code"),
            json!({ "input": "plan", "output": "the-code" })
        ),
        with(agent("review"), json!({ "input": "the-code" })),
    ])));
    assert!(parsed.warnings.is_empty(), "{}", list(&parsed.warnings));
    let review = parsed.workflow.step_by_id("review").unwrap();
    assert_eq!(review.input.as_deref(), Some("the-code"));
    let code = parsed.workflow.step_by_id("code").unwrap();
    assert_eq!(&*code.context_key, "the-code");
}

#[test]
fn input_naming_a_step_stored_under_an_alias_is_an_error_naming_the_alias() {
    only_error(
        &doc(json!([
            with(agent("plan"), json!({ "output": "the-plan" })),
            with(agent("code"), json!({ "input": "plan" })),
        ])),
        "$.steps[1].input",
        Some("code"),
        "step \"plan\" stores its data under its output \"the-plan\"; refer to that instead",
    );
}

#[test]
fn input_naming_a_branch_is_an_error() {
    only_error(
        &doc(json!([
            { "id": "tests", "type": "parallel", "steps": [agent("unit"), agent("lint")] },
            with(agent("fix"), json!({ "input": "unit" })),
        ])),
        "$.steps[1].input",
        Some("fix"),
        "\"unit\" is a parallel branch",
    );
    // The parallel step itself holds the branch results.
    accepted(&doc(json!([
        { "id": "tests", "type": "parallel", "steps": [agent("unit"), agent("lint")] },
        with(agent("fix"), json!({ "input": "tests" })),
    ])));
}

#[test]
fn input_naming_a_condition_step_is_an_error() {
    only_error(
        &doc(json!([
            agent("plan"),
            { "id": "gate", "type": "condition", "condition": "context.plan.ok", "then": "code" },
            with(agent("code"), json!({ "input": "gate" })),
        ])),
        "$.steps[2].input",
        Some("code"),
        "\"gate\" is a condition step, which stores no data",
    );
}

#[test]
fn input_naming_a_reserved_key_is_an_error() {
    only_error(
        &doc(json!([
            agent("plan"),
            with(agent("code"), json!({ "input": "context" }))
        ])),
        "$.steps[1].input",
        Some("code"),
        "input \"context\" is a reserved payload key, not a step",
    );
}

fn transform_doc(transform: &str) -> String {
    doc(json!([
        agent("plan"),
        { "id": "extract", "type": "transform", "transform": transform },
    ]))
}

#[test]
fn valid_transforms_are_accepted() {
    for transform in [
        "context.plan.files",
        "context[\"plan\"].files[0]",
        "input.repository",
        "jq: [.context.plan.files[] | ascii_upcase]",
        "jq: {count: (.context.plan.files | length)}",
    ] {
        accepted(&transform_doc(transform));
    }
}

#[test]
fn a_transform_path_that_does_not_parse_is_an_error() {
    let error = only_error(
        &transform_doc("context.plan..files"),
        "$.steps[1].transform",
        Some("extract"),
        "cannot parse path \"context.plan..files\"",
    );
    assert!(error.message.contains("column"), "{error}");
    only_error(
        &transform_doc("plan.files"),
        "$.steps[1].transform",
        Some("extract"),
        "cannot parse path",
    );
}

#[test]
fn a_transform_path_to_an_unknown_step_is_an_error() {
    only_error(
        &transform_doc("context.plann.files"),
        "$.steps[1].transform",
        Some("extract"),
        "\"plann\" names no step or output; did you mean \"plan\"?",
    );
}

#[test]
fn a_jq_transform_that_does_not_parse_is_an_error() {
    only_error(
        &transform_doc("jq: .context.plan | "),
        "$.steps[1].transform",
        Some("extract"),
        "cannot parse jq program",
    );
    only_error(
        &transform_doc("jq: [.context.plan"),
        "$.steps[1].transform",
        Some("extract"),
        "cannot parse jq program",
    );
}

#[test]
fn a_jq_transform_using_env_or_now_is_an_error() {
    for (program, name) in [
        ("jq: env.HOME", "env"),
        ("jq: now", "now"),
        ("jq: {at: now}", "now"),
        ("jq: $ENV.PATH", "ENV"),
    ] {
        let error = only_error(
            &transform_doc(program),
            "$.steps[1].transform",
            Some("extract"),
            "cannot compile jq program: undefined",
        );
        assert!(
            error.message.contains(&format!("`{name}`"))
                || error.message.contains(&format!("`${name}`")),
            "{program}: {error}"
        );
    }
}

fn condition_doc(condition: &str) -> String {
    doc(json!([
        agent("plan"),
        { "id": "gate", "type": "condition", "condition": condition, "then": "plan", "else": "code" },
        agent("code"),
    ]))
}

#[test]
fn a_condition_that_does_not_parse_is_an_error_naming_the_column() {
    for condition in [
        "context.plan.ok ==",
        "context.plan.ok && (",
        "context.plan.ok = true",
    ] {
        let error = only_error(
            &condition_doc(condition),
            "$.steps[1].condition",
            Some("gate"),
            "cannot parse condition",
        );
        assert!(error.message.contains("column"), "{error}");
    }
}

#[test]
fn a_condition_path_to_an_unknown_step_is_only_a_warning() {
    let parsed = accepted(&condition_doc("context.plann.ok === true"));
    assert_eq!(parsed.warnings.len(), 1, "{}", list(&parsed.warnings));
    expect_warning(
        &parsed.warnings,
        "$.steps[1].condition",
        Some("gate"),
        "\"plann\" names no step or output; did you mean \"plan\"?; the path will always be undefined",
    );
    // A condition reading a branch is accepted too, with the same kind of warning.
    let parsed = accepted(&doc(json!([
        { "id": "tests", "type": "parallel", "steps": [agent("unit")] },
        { "id": "gate", "type": "condition", "condition": "context.unit.ok", "then": "tests" },
    ])));
    expect_warning(
        &parsed.warnings,
        "$.steps[1].condition",
        Some("gate"),
        "\"unit\" is a parallel branch",
    );
}

// ---------------------------------------------------------------------------------------------
// Parallel branches
// ---------------------------------------------------------------------------------------------

#[test]
fn a_condition_cannot_be_a_branch() {
    only_error(
        &doc(json!([
            agent("plan"),
            {
                "id": "tests",
                "type": "parallel",
                "steps": [
                    agent("unit"),
                    { "id": "check", "type": "condition", "condition": "context.plan.ok", "then": "plan" },
                ]
            },
        ])),
        "$.steps[1].steps[1].type",
        Some("check"),
        "a parallel branch cannot be a condition",
    );
}

#[test]
fn branches_cannot_route_or_alias() {
    let diagnostics = rejected(&doc(json!([
        {
            "id": "tests",
            "type": "parallel",
            "steps": [
                with(agent("unit"), json!({ "next": "review" })),
                with(agent("lint"), json!({ "on_error": "review" })),
                with(agent("e2e"), json!({ "output": "e2e-results" })),
                with(agent("smoke"), json!({ "end": true })),
                { "id": "ok", "type": "approval", "on_approve": "review", "on_reject": "review" },
            ]
        },
        agent("review"),
    ])));
    assert_eq!(diagnostics.len(), 6, "{}", list(&diagnostics));
    for (path, id, field) in [
        ("$.steps[0].steps[0].next", "unit", "next"),
        ("$.steps[0].steps[1].on_error", "lint", "on_error"),
        ("$.steps[0].steps[2].output", "e2e", "output"),
        ("$.steps[0].steps[3].end", "smoke", "end"),
        ("$.steps[0].steps[4].on_approve", "ok", "on_approve"),
        ("$.steps[0].steps[4].on_reject", "ok", "on_reject"),
    ] {
        expect_error(
            &diagnostics,
            path,
            Some(id),
            &format!("a parallel branch cannot set \"{field}\""),
        );
    }
}

/// `depth` parallel steps nested inside one another, the innermost holding one agent.
fn nested_parallels(depth: usize) -> String {
    let mut step = agent("leaf");
    for level in (0..depth).rev() {
        step = json!({ "id": format!("p{level}"), "type": "parallel", "steps": [step] });
    }
    doc(json!([step]))
}

#[test]
fn parallel_nesting_deeper_than_the_limit_is_an_error() {
    let limit = Limits::default().max_parallel_depth;
    assert_eq!(limit, 8);
    accepted(&nested_parallels(limit));
    // The innermost parallel step (p8, the ninth) would put its branches one level too deep.
    let path = format!("$.steps[0]{}.steps", ".steps[0]".repeat(limit));
    only_error(
        &nested_parallels(limit + 1),
        &path,
        Some("p8"),
        "parallel steps may nest at most 8 deep",
    );
}

// ---------------------------------------------------------------------------------------------
// Retry and timeout
// ---------------------------------------------------------------------------------------------

#[test]
fn retry_and_timeout_values_are_checked() {
    let diagnostics = rejected(&doc(json!([
        with(agent("a"), json!({ "retry": { "max_attempts": 0 } })),
        with(
            agent("b"),
            json!({ "retry": { "backoff_coefficient": 0.5 } })
        ),
        with(
            agent("c"),
            json!({ "retry": { "initial_interval_ms": 2000, "max_interval_ms": 1000 } })
        ),
        with(agent("d"), json!({ "retry": { "max_attempt": 5 } })),
        with(agent("e"), json!({ "retry": { "initial_interval_ms": 0 } })),
        with(agent("f"), json!({ "timeout_ms": 0 })),
    ])));
    assert_eq!(diagnostics.len(), 6, "{}", list(&diagnostics));
    expect_error(
        &diagnostics,
        "$.steps[0].retry.max_attempts",
        Some("a"),
        "max_attempts must be at least 1",
    );
    expect_error(
        &diagnostics,
        "$.steps[1].retry.backoff_coefficient",
        Some("b"),
        "backoff_coefficient must be a number of at least 1",
    );
    expect_error(
        &diagnostics,
        "$.steps[2].retry.max_interval_ms",
        Some("c"),
        "max_interval_ms must be at least initial_interval_ms",
    );
    expect_error(
        &diagnostics,
        "$.steps[3].retry.max_attempt",
        Some("d"),
        "unknown field \"max_attempt\"; did you mean \"max_attempts\"?",
    );
    expect_error(
        &diagnostics,
        "$.steps[4].retry.initial_interval_ms",
        Some("e"),
        "initial_interval_ms must be at least 1",
    );
    expect_error(
        &diagnostics,
        "$.steps[5].timeout_ms",
        Some("f"),
        "timeout_ms must be at least 1",
    );
}

#[test]
fn a_valid_retry_policy_is_kept() {
    let parsed = accepted(&doc(json!([with(
        agent("a"),
        json!({
            "retry": {
                "max_attempts": 4,
                "initial_interval_ms": 500,
                "backoff_coefficient": 1.5,
                "max_interval_ms": 500
            },
            "timeout_ms": 60000
        })
    )])));
    let step = parsed.workflow.step_by_id("a").unwrap();
    let retry = step.retry.as_ref().unwrap();
    assert_eq!(retry.max_attempts, 4);
    assert_eq!(retry.initial_interval_ms, 500);
    assert_eq!(retry.backoff_coefficient, 1.5);
    assert_eq!(retry.max_interval_ms, Some(500));
    assert_eq!(step.timeout_ms, Some(60_000));
}

// ---------------------------------------------------------------------------------------------
// Warnings
// ---------------------------------------------------------------------------------------------

#[test]
fn unreachable_steps_are_warnings() {
    let parsed = accepted(&doc(json!([
        with(agent("plan"), json!({ "end": true })),
        agent("orphan"),
    ])));
    assert_eq!(parsed.warnings.len(), 1, "{}", list(&parsed.warnings));
    expect_warning(
        &parsed.warnings,
        "$.steps[1]",
        Some("orphan"),
        "step is unreachable from the entry step \"plan\"",
    );

    // A step reached only through on_error, else or on_reject is reachable.
    let parsed = accepted(&doc(json!([
        with(agent("plan"), json!({ "on_error": "recover", "next": "gate" })),
        { "id": "gate", "type": "condition", "condition": "context.plan.ok", "then": "sign-off", "else": "rework" },
        { "id": "sign-off", "type": "approval", "on_approve": "done", "on_reject": "rejected" },
        with(agent("recover"), json!({ "end": true })),
        with(agent("rework"), json!({ "end": true })),
        with(agent("rejected"), json!({ "end": true })),
        with(agent("done"), json!({ "end": true })),
    ])));
    assert!(parsed.warnings.is_empty(), "{}", list(&parsed.warnings));
}

#[test]
fn fields_with_no_effect_for_the_type_are_warnings() {
    let parsed = accepted(&doc(json!([
        agent("plan"),
        { "id": "extract", "type": "transform", "transform": "context.plan.files", "agent": "coder" },
        {
            "id": "gate",
            "type": "condition",
            "condition": "context.extract",
            "then": "code",
            "output": "gate-result",
        },
        with(agent("code"), json!({ "message": "hello" })),
    ])));
    assert_eq!(parsed.warnings.len(), 3, "{}", list(&parsed.warnings));
    // The article is checked in `no_effect_warnings_use_the_right_article`.
    expect_warning(
        &parsed.warnings,
        "$.steps[3].message",
        Some("code"),
        "\"message\" has no effect on a",
    );
    expect_warning(
        &parsed.warnings,
        "$.steps[1].agent",
        Some("extract"),
        "\"agent\" has no effect on a transform step",
    );
    expect_warning(
        &parsed.warnings,
        "$.steps[2].output",
        Some("gate"),
        "\"output\" has no effect on a condition step",
    );
    assert!(
        parsed.warnings[2].message.ends_with("agent step"),
        "{}",
        list(&parsed.warnings)
    );
}

#[test]
fn no_effect_warnings_use_the_right_article() {
    let parsed = accepted(&doc(json!([
        with(agent("code"), json!({ "message": "hello" })),
        { "id": "sign-off", "type": "approval", "agent": "reviewer" },
    ])));
    expect_warning(
        &parsed.warnings,
        "$.steps[0].message",
        Some("code"),
        "\"message\" has no effect on an agent step",
    );
    expect_warning(
        &parsed.warnings,
        "$.steps[1].agent",
        Some("sign-off"),
        "\"agent\" has no effect on an approval step",
    );
}

// ---------------------------------------------------------------------------------------------
// All at once
// ---------------------------------------------------------------------------------------------

#[test]
fn every_problem_is_reported_at_once() {
    let text = r#"{
        "max_visit": 3,
        "steps": [
            { "id": "plan", "type": "agnet", "agent": "planner" },
            { "id": "code", "type": "agent", "agent": "coder", "next": "reviw" },
            { "id": "plan", "type": "agent", "agent": "again" },
            { "id": "extract", "type": "transform", "transform": "context.nope.files" },
            { "id": "gate", "type": "condition", "condition": "context.code.ok ==" },
            { "id": "review", "type": "agent", "agent": "reviewer", "retry": { "max_attempts": 0 } },
            { "id": "tests", "type": "parallel", "steps": [
                { "id": "unit", "type": "agent", "agent": "u", "next": "review" }
            ] },
            { "type": "agent", "agent": "nameless" },
            { "id": "fix", "type": "agent", "agent": "fixer", "nxt": "review" }
        ]
    }"#;
    let diagnostics = rejected(text);
    let expected = [
        ("$.max_visit", None, "did you mean \"max_visits\"?"),
        ("$.steps[0].type", Some("plan"), "did you mean \"agent\"?"),
        (
            "$.steps[1].next",
            Some("code"),
            "next names no step: \"reviw\"; did you mean \"review\"?",
        ),
        (
            "$.steps[2].id",
            Some("plan"),
            "duplicate step id \"plan\"; it is first used at $.steps[0]",
        ),
        (
            "$.steps[3].transform",
            Some("extract"),
            "\"nope\" names no step or output",
        ),
        ("$.steps[4].condition", Some("gate"), "column"),
        (
            "$.steps[4]",
            Some("gate"),
            "a condition step needs \"then\", \"else\" or both",
        ),
        (
            "$.steps[5].retry.max_attempts",
            Some("review"),
            "max_attempts must be at least 1",
        ),
        (
            "$.steps[6].steps[0].next",
            Some("unit"),
            "a parallel branch cannot set \"next\"",
        ),
        ("$.steps[7]", None, "a step needs an \"id\""),
        (
            "$.steps[8].nxt",
            Some("fix"),
            "unknown field \"nxt\"; did you mean \"next\"?",
        ),
    ];
    assert_eq!(diagnostics.len(), expected.len(), "{}", list(&diagnostics));
    for (path, step_id, needle) in expected {
        expect_error(&diagnostics, path, step_id, needle);
    }
}

#[test]
fn diagnostics_come_in_document_order() {
    let diagnostics = rejected(&doc(json!([
        { "id": "plan", "type": "agnet", "agent": "planner" },
        agent("code"),
        agent("code"),
        with(agent("review"), json!({ "next": 5 })),
    ])));
    let paths: Vec<&str> = diagnostics.iter().map(|d| d.path.as_str()).collect();
    assert_eq!(
        paths,
        ["$.steps[0].type", "$.steps[2].id", "$.steps[3].next"],
        "{}",
        list(&diagnostics)
    );
}

#[test]
fn a_malformed_step_does_not_cause_a_bogus_error_where_it_is_referenced() {
    let diagnostics = rejected(&doc(json!([
        with(agent("plan"), json!({ "next": 5 })),
        with(agent("code"), json!({ "input": "plan" })),
    ])));
    assert_eq!(diagnostics.len(), 1, "{}", list(&diagnostics));
    expect_error(
        &diagnostics,
        "$.steps[0].next",
        Some("plan"),
        "invalid type",
    );
}

// ---------------------------------------------------------------------------------------------
// Examples and limits
// ---------------------------------------------------------------------------------------------

/// The workflows under `dir`: every `.json` file but the JSON Schemas of `schemas/` folders
/// (an `llm` agent's reply schemas live next to their workflow).
fn json_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if !path.ends_with("schemas") {
                json_files(&path, out);
            }
        } else if path.extension().is_some_and(|ext| ext == "json") {
            out.push(path);
        }
    }
}

#[test]
fn every_example_parses_without_errors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files = Vec::new();
    json_files(&dir, &mut files);
    files.sort();
    assert!(
        files
            .iter()
            .any(|f| f.ends_with("feature-development/workflow.json")),
        "examples/feature-development/workflow.json not found among {files:?}"
    );
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        match parse_workflow(&text) {
            Ok(parsed) => assert!(
                parsed.warnings.is_empty(),
                "{} has warnings:\n{}",
                file.display(),
                list(&parsed.warnings)
            ),
            Err(error) => failures.push(format!(
                "{}:\n{}",
                file.display(),
                list(&error.diagnostics.0)
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn more_steps_than_the_limit_is_an_error() {
    assert_eq!(Limits::default().max_steps, 10_000);
    let limits = Limits {
        max_steps: 3,
        ..Default::default()
    };
    let three = doc(json!([agent("a"), agent("b"), agent("c")]));
    parse_workflow_with(&three, &limits).unwrap_or_else(|e| panic!("{e}"));

    let four = doc(json!([agent("a"), agent("b"), agent("c"), agent("d")]));
    let diagnostics = rejected_with(&four, &limits);
    assert_eq!(diagnostics.len(), 1, "{}", list(&diagnostics));
    expect_error(
        &diagnostics,
        "$.steps",
        None,
        "a workflow may have at most 3 steps",
    );

    // Branches count as steps.
    let branches = doc(json!([
        { "id": "p", "type": "parallel", "steps": [agent("a"), agent("b"), agent("c")] },
    ]));
    let diagnostics = rejected_with(&branches, &limits);
    assert_eq!(diagnostics.len(), 1, "{}", list(&diagnostics));
    expect_error(
        &diagnostics,
        "$.steps[0].steps",
        Some("p"),
        "a workflow may have at most 3 steps",
    );
}
