//! The validation rules of map steps and their chains, each shown on a small document: the JSON
//! path and step id of the problem, its severity, and a message that names it.

use baton_core::workflow::{MapBody, StepKind, Tolerance};
use baton_core::{Diagnostic, MAP_MAX_IN_FLIGHT, Severity};
use serde_json::{Value, json};

mod checks;

use checks::*;

/// The errors among `diagnostics`.
fn errors(diagnostics: &[Diagnostic]) -> Vec<&Diagnostic> {
    diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .collect()
}

/// An `agent` map step over `input.files`.
fn agent_map(id: &str) -> Value {
    json!({ "id": id, "type": "map", "items": "input.files", "agent": "tester" })
}

/// A chain map step over `input.files`.
fn chain_map(id: &str, chain: Value) -> Value {
    json!({ "id": id, "type": "map", "items": "input.files", "steps": chain })
}

// ---------------------------------------------------------------------------------------------
// Valid documents
// ---------------------------------------------------------------------------------------------

#[test]
fn the_agent_form_parses_with_every_field() {
    let parsed = accepted(&doc(json!([
        agent("plan"),
        { "id": "test-each", "type": "map", "items": "context.plan.files", "agent": "tester",
          "max_concurrency": 8, "tolerated_failures": 2, "output": "file-tests", "next": "review",
          "retry": { "max_attempts": 2 }, "timeout_ms": 1000 },
        with(agent("review"), json!({ "input": "file-tests" })),
    ])));
    assert!(parsed.warnings.is_empty(), "{}", list(&parsed.warnings));
    let workflow = &parsed.workflow;
    let step = workflow.step_by_id("test-each").unwrap();
    assert_eq!(step.context_key.as_ref(), "file-tests");
    assert_eq!(step.on_success, workflow.index_of("review"));
    assert_eq!(step.timeout_ms, Some(1000));
    assert_eq!(step.retry.as_ref().map(|r| r.max_attempts), Some(2));
    let StepKind::Map(map) = &step.kind else {
        panic!("not a map step: {:?}", step.kind);
    };
    assert_eq!(map.items_source, "context.plan.files");
    assert_eq!(map.body, MapBody::Agent("tester".into()));
    assert_eq!(map.max_concurrency, Some(8));
    assert_eq!(map.tolerated_failures, Some(Tolerance::Count(2)));
}

#[test]
fn the_chain_form_parses_and_its_steps_route_within_the_chain() {
    let parsed = accepted(&doc(json!([
        { "id": "each", "type": "map", "items": "jq: .input.files", "tolerated_failures": "10%",
          "steps": [
            { "id": "gate", "type": "condition", "condition": "map.item.big === true && map.index > 0",
              "then": "draft", "else": "quick" },
            { "id": "draft", "type": "agent", "agent": "drafter", "retry": { "max_attempts": 3 },
              "timeout_ms": 500, "on_error": "quick" },
            { "id": "check", "type": "agent", "agent": "checker", "input": "draft", "end": true },
            { "id": "quick", "type": "transform", "transform": "map.item.name" },
          ] },
        { "id": "after", "type": "transform", "transform": "context.each.data" },
    ])));
    assert!(parsed.warnings.is_empty(), "{}", list(&parsed.warnings));
    let workflow = &parsed.workflow;
    let map_index = workflow.index_of("each").unwrap();
    let StepKind::Map(map) = &workflow.step(map_index).kind else {
        panic!("not a map step");
    };
    assert_eq!(map.tolerated_failures, Some(Tolerance::Percent(10.0)));
    assert_eq!(map.max_concurrency, None);
    let MapBody::Chain(chain) = &map.body else {
        panic!("not a chain: {:?}", map.body);
    };
    let ids: Vec<&str> = chain
        .iter()
        .map(|&i| workflow.step(i).id.as_ref())
        .collect();
    assert_eq!(ids, ["gate", "draft", "check", "quick"]);
    for &i in chain {
        assert_eq!(workflow.step(i).parent, Some(map_index));
        assert_eq!(workflow.map_of(i), Some(map_index));
        assert_eq!(workflow.parallel_of(i), None);
    }
    // Chain steps are not top-level steps: the map goes on to "after".
    assert_eq!(
        workflow
            .top_level()
            .iter()
            .map(|&i| workflow.step(i).id.as_ref())
            .collect::<Vec<_>>(),
        ["each", "after"]
    );
    let index = |id: &str| workflow.index_of(id);
    let draft = workflow.step_by_id("draft").unwrap();
    assert_eq!(draft.on_success, index("check"), "document order");
    assert_eq!(draft.on_error, index("quick"));
    assert_eq!(draft.timeout_ms, Some(500));
    assert_eq!(
        workflow.step_by_id("check").unwrap().on_success,
        None,
        "end"
    );
    assert_eq!(
        workflow.step_by_id("quick").unwrap().on_success,
        None,
        "end of the chain"
    );
    let StepKind::Condition {
        when_true,
        when_false,
        ..
    } = &workflow.step_by_id("gate").unwrap().kind
    else {
        panic!("not a condition");
    };
    assert_eq!((*when_true, *when_false), (index("draft"), index("quick")));
    assert_eq!(
        workflow.step_by_id("each").unwrap().on_success,
        index("after")
    );
}

#[test]
fn max_concurrency_and_tolerated_failures_accept_their_whole_range() {
    for cap in [1, MAP_MAX_IN_FLIGHT] {
        accepted(&doc(json!([with(
            agent_map("each"),
            json!({ "max_concurrency": cap })
        )])));
    }
    for (tolerance, expected) in [
        (json!(0), Tolerance::Count(0)),
        (json!(100_000), Tolerance::Count(100_000)),
        (json!("0%"), Tolerance::Percent(0.0)),
        (json!("100%"), Tolerance::Percent(100.0)),
        (json!("2.5%"), Tolerance::Percent(2.5)),
    ] {
        let parsed = accepted(&doc(json!([with(
            agent_map("each"),
            json!({ "tolerated_failures": tolerance })
        )])));
        let StepKind::Map(map) = &parsed.workflow.step_by_id("each").unwrap().kind else {
            panic!("not a map step");
        };
        assert_eq!(map.tolerated_failures, Some(expected), "{tolerance}");
    }
}

#[test]
fn retry_timeout_and_input_on_a_chain_map_are_warnings() {
    let parsed = accepted(&doc(json!([
        agent("plan"),
        { "id": "each", "type": "map", "items": "input.files", "steps": [agent("work")],
          "retry": { "max_attempts": 2 }, "timeout_ms": 1000, "input": "plan" },
    ])));
    assert_eq!(parsed.warnings.len(), 3, "{}", list(&parsed.warnings));
    for field in ["retry", "timeout_ms", "input"] {
        expect_warning(
            &parsed.warnings,
            &format!("$.steps[1].{field}"),
            Some("each"),
            &format!("\"{field}\" has no effect on a map step"),
        );
    }
}

#[test]
fn chain_steps_unreachable_from_the_chains_first_step_are_warnings() {
    let parsed = accepted(&doc(json!([chain_map(
        "each",
        json!([with(agent("first"), json!({ "end": true })), agent("never")])
    )])));
    assert_eq!(parsed.warnings.len(), 1, "{}", list(&parsed.warnings));
    expect_warning(
        &parsed.warnings,
        "$.steps[0].steps[1]",
        Some("never"),
        "unreachable from the entry step \"first\"",
    );
}

// ---------------------------------------------------------------------------------------------
// The map step's own fields
// ---------------------------------------------------------------------------------------------

#[test]
fn a_map_step_needs_items() {
    only_error(
        &doc(json!([{ "id": "each", "type": "map", "agent": "tester" }])),
        "$.steps[0]",
        Some("each"),
        "a map step needs \"items\"",
    );
}

#[test]
fn items_must_parse_and_read_a_key_the_context_can_hold() {
    only_error(
        &doc(json!([with(
            agent_map("each"),
            json!({ "items": "context.plna.files" })
        )])),
        "$.steps[0].items",
        Some("each"),
        "\"plna\" names no step or output",
    );
    only_error(
        &doc(json!([with(
            agent_map("each"),
            json!({ "items": "files[0" })
        )])),
        "$.steps[0].items",
        Some("each"),
        "cannot parse path",
    );
}

#[test]
fn a_map_step_runs_agent_or_steps_not_both() {
    let diagnostics = rejected(&doc(json!([with(
        chain_map("each", json!([agent("work")])),
        json!({ "agent": "tester" })
    )])));
    assert_eq!(errors(&diagnostics).len(), 1, "{}", list(&diagnostics));
    expect_error(
        &diagnostics,
        "$.steps[0].steps",
        Some("each"),
        "a map step runs \"agent\" or \"steps\" per item, not both",
    );
}

#[test]
fn a_map_step_needs_agent_or_steps() {
    only_error(
        &doc(json!([{ "id": "each", "type": "map", "items": "input.files" }])),
        "$.steps[0]",
        Some("each"),
        "a map step needs \"agent\" (one agent per item) or \"steps\" (a chain per item)",
    );
    only_error(
        &doc(json!([with(agent_map("each"), json!({ "agent": " " }))])),
        "$.steps[0].agent",
        Some("each"),
        "agent name is empty",
    );
}

#[test]
fn a_chain_needs_at_least_one_step() {
    only_error(
        &doc(json!([chain_map("each", json!([]))])),
        "$.steps[0].steps",
        Some("each"),
        "a map step's chain needs at least one step",
    );
}

#[test]
fn max_concurrency_must_be_between_1_and_the_ceiling() {
    assert_eq!(MAP_MAX_IN_FLIGHT, 10_000);
    for cap in [0, 10_001] {
        only_error(
            &doc(json!([with(
                agent_map("each"),
                json!({ "max_concurrency": cap })
            )])),
            "$.steps[0].max_concurrency",
            Some("each"),
            "max_concurrency must be between 1 and 10000",
        );
    }
    // Not a whole number at all: the field's type is wrong.
    let diagnostics = rejected(&doc(json!([with(
        agent_map("each"),
        json!({ "max_concurrency": -1 })
    )])));
    let diagnostic = at(&diagnostics, "$.steps[0].max_concurrency");
    assert_eq!(diagnostic.severity, Severity::Error);
}

#[test]
fn tolerated_failures_must_be_a_count_or_a_percentage() {
    for (value, needle) in [
        (json!(-1), "or a percentage like \"10%\", not -1"),
        (json!(1.5), "or a percentage like \"10%\", not 1.5"),
        (json!(true), "or a percentage like \"10%\", not true"),
        (
            json!("abc"),
            "tolerated_failures \"abc\" is not a percentage from \"0%\" to \"100%\"",
        ),
        (
            json!("150%"),
            "tolerated_failures \"150%\" is not a percentage from \"0%\" to \"100%\"",
        ),
        (
            json!("-5%"),
            "tolerated_failures \"-5%\" is not a percentage",
        ),
        (json!("10"), "tolerated_failures \"10\" is not a percentage"),
    ] {
        only_error(
            &doc(json!([with(
                agent_map("each"),
                json!({ "tolerated_failures": value })
            )])),
            "$.steps[0].tolerated_failures",
            Some("each"),
            needle,
        );
    }
}

#[test]
fn map_is_a_reserved_id_and_alias() {
    only_error(
        &doc(json!([agent_map("map")])),
        "$.steps[0].id",
        Some("map"),
        "step id \"map\" is reserved",
    );
    only_error(
        &doc(json!([chain_map("each", json!([agent("map")]))])),
        "$.steps[0].steps[0].id",
        Some("map"),
        "step id \"map\" is reserved",
    );
    only_error(
        &doc(json!([with(agent_map("each"), json!({ "output": "map" }))])),
        "$.steps[0].output",
        Some("each"),
        "output \"map\" is reserved",
    );
}

// ---------------------------------------------------------------------------------------------
// Chains
// ---------------------------------------------------------------------------------------------

#[test]
fn a_chain_runs_only_agents_transforms_and_conditions() {
    for (step, type_name) in [
        (
            json!({ "id": "inner", "type": "parallel", "steps": [agent("a"), agent("b")] }),
            "parallel",
        ),
        (
            json!({ "id": "inner", "type": "approval", "message": "ok?" }),
            "approval",
        ),
        (
            json!({ "id": "inner", "type": "map", "items": "map.item", "agent": "t" }),
            "map",
        ),
        (
            json!({ "id": "inner", "type": "map", "items": "map.item", "steps": [agent("deep")] }),
            "map",
        ),
    ] {
        let diagnostics = rejected(&doc(json!([chain_map("each", json!([step]))])));
        assert_eq!(errors(&diagnostics).len(), 1, "{}", list(&diagnostics));
        expect_error(
            &diagnostics,
            "$.steps[0].steps[0].type",
            Some("inner"),
            &format!(
                "map step \"each\"'s chain runs agent, transform and condition steps, not {type_name} steps"
            ),
        );
    }
}

#[test]
fn a_chain_step_routes_only_within_its_chain() {
    for field in ["next", "on_error"] {
        only_error(
            &doc(json!([
                chain_map(
                    "each",
                    json!([with(agent("work"), json!({ field: "review" }))])
                ),
                agent("review"),
            ])),
            &format!("$.steps[0].steps[0].{field}"),
            Some("work"),
            &format!(
                "{field} names \"review\", which is not in map step \"each\"'s chain; a chain step routes within its chain"
            ),
        );
    }
    for field in ["then", "else"] {
        only_error(
            &doc(json!([
                chain_map(
                    "each",
                    json!([
                        { "id": "gate", "type": "condition", "condition": "map.index === 0", field: "review" },
                        agent("work"),
                    ])
                ),
                agent("review"),
            ])),
            &format!("$.steps[0].steps[0].{field}"),
            Some("gate"),
            &format!("{field} names \"review\", which is not in map step \"each\"'s chain"),
        );
    }
    // Nor into another map's chain.
    only_error(
        &doc(json!([
            chain_map("first", json!([with(agent("a"), json!({ "next": "b" }))])),
            chain_map("second", json!([agent("b")])),
        ])),
        "$.steps[0].steps[0].next",
        Some("a"),
        "next names \"b\", which is not in map step \"first\"'s chain",
    );
    // A name that is nowhere gets a hint from the chain's own steps.
    only_error(
        &doc(json!([chain_map(
            "each",
            json!([
                with(agent("work"), json!({ "next": "chek" })),
                agent("check")
            ])
        )])),
        "$.steps[0].steps[0].next",
        Some("work"),
        "next names no step: \"chek\"; did you mean \"check\"?",
    );
}

#[test]
fn a_top_level_step_cannot_route_into_a_chain() {
    for field in ["next", "on_error"] {
        only_error(
            &doc(json!([
                with(agent("plan"), json!({ field: "work" })),
                chain_map("each", json!([agent("work")])),
            ])),
            &format!("$.steps[0].{field}"),
            Some("plan"),
            &format!(
                "{field} names \"work\", a step of map step \"each\"'s chain; only top-level steps can be routed to"
            ),
        );
    }
}

#[test]
fn map_paths_outside_a_chain_are_errors_in_transforms_and_warnings_in_conditions() {
    only_error(
        &doc(json!([{ "id": "pick", "type": "transform", "transform": "map.item.name" }])),
        "$.steps[0].transform",
        Some("pick"),
        "\"map\" is the item a map step's chain runs, and is only defined inside a chain",
    );
    // A map step's own items are outside its chain too.
    only_error(
        &doc(json!([with(
            agent_map("each"),
            json!({ "items": "map.item" })
        )])),
        "$.steps[0].items",
        Some("each"),
        "only defined inside a chain",
    );
    let parsed = accepted(&doc(json!([
        { "id": "gate", "type": "condition", "condition": "map.index === 0", "then": "work" },
        agent("work"),
    ])));
    assert_eq!(parsed.warnings.len(), 1, "{}", list(&parsed.warnings));
    expect_warning(
        &parsed.warnings,
        "$.steps[0].condition",
        Some("gate"),
        "\"map\" is the item a map step's chain runs, and is only defined inside a chain; the path will always be undefined",
    );
}

#[test]
fn a_chain_steps_results_are_not_in_the_context_outside_its_chain() {
    let chain = || chain_map("each", json!([agent("work")]));
    only_error(
        &doc(json!([
            chain(),
            { "id": "after", "type": "transform", "transform": "context.work.result" },
        ])),
        "$.steps[1].transform",
        Some("after"),
        "\"work\" is a step of map step \"each\"'s chain; each item's results are in the map step's data",
    );
    only_error(
        &doc(json!([
            chain(),
            with(agent("after"), json!({ "input": "work" }))
        ])),
        "$.steps[1].input",
        Some("after"),
        "\"work\" is a step of map step \"each\"'s chain",
    );
    // From another map's chain, too.
    only_error(
        &doc(json!([
            chain(),
            chain_map(
                "other",
                json!([
                    { "id": "peek", "type": "transform", "transform": "context.work" },
                ])
            ),
        ])),
        "$.steps[1].steps[0].transform",
        Some("peek"),
        "\"work\" is a step of map step \"each\"'s chain",
    );
    let parsed = accepted(&doc(json!([
        chain(),
        { "id": "gate", "type": "condition", "condition": "context.work.ok === true", "then": "end" },
        agent("end"),
    ])));
    expect_warning(
        &parsed.warnings,
        "$.steps[1].condition",
        Some("gate"),
        "\"work\" is a step of map step \"each\"'s chain; each item's results are in the map step's data, and in the item's own context only inside the chain; the path will always be undefined",
    );
    // Inside the chain, they are.
    let parsed = accepted(&doc(json!([chain_map(
        "each",
        json!([
            with(agent("work"), json!({ "output": "done" })),
            { "id": "pick", "type": "transform", "transform": "context.done.result" },
            with(agent("use"), json!({ "input": "done" })),
        ])
    )])));
    assert!(parsed.warnings.is_empty(), "{}", list(&parsed.warnings));
}
