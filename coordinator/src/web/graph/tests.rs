//! The drawing's promises (`invariants`), checked on every example workflow, the spec's
//! workflows, a parallel step of 500 branches, and random workflows (`props`).

mod invariants;
mod props;

use std::path::Path;

use baton_core::parse_workflow;
use baton_core::workflow::{StepType, Workflow};
use serde_json::json;

use super::{EdgeKind, Graph, layout};

fn parse(text: &str) -> Workflow {
    match parse_workflow(text) {
        Ok(parsed) => parsed.workflow,
        Err(error) => panic!("{error}\n{text}"),
    }
}

fn drawn(text: &str) -> (Workflow, Graph) {
    let workflow = parse(text);
    let graph = layout(&workflow);
    invariants::check(&workflow, &graph);
    (workflow, graph)
}

fn node<'g>(graph: &'g Graph, id: &str) -> &'g super::Node {
    graph
        .nodes
        .iter()
        .find(|node| node.id == id)
        .unwrap_or_else(|| panic!("no node {id}"))
}

/// The spec's workflows, as the spec prints them (Method 4's parallel step wrapped as the one
/// step of a workflow).
const SPEC: [(&str, &str); 7] = [
    (
        "problem-statement",
        include_str!("tests/fixtures/spec-problem-statement.json"),
    ),
    (
        "feature-dev",
        include_str!("tests/fixtures/spec-feature-dev.json"),
    ),
    (
        "explicit-references",
        include_str!("tests/fixtures/spec-explicit-references.json"),
    ),
    (
        "transform-extract",
        include_str!("tests/fixtures/spec-transform-extract.json"),
    ),
    (
        "parallel-tests",
        include_str!("tests/fixtures/spec-parallel-tests.json"),
    ),
    (
        "research-and-implement",
        include_str!("tests/fixtures/spec-research-and-implement.json"),
    ),
    (
        "feature-development",
        include_str!("tests/fixtures/spec-feature-development.json"),
    ),
];

#[test]
fn the_spec_workflows_keep_every_promise() {
    for (name, text) in SPEC {
        let workflow = parse(text);
        let graph = layout(&workflow);
        assert!(
            !graph.edges.is_empty() || workflow.steps().len() <= 4,
            "{name}"
        );
        invariants::check(&workflow, &graph);
    }
}

#[test]
fn every_example_workflow_keeps_every_promise() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&examples).expect("examples/") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            let workflow = path.join("workflow.json");
            if workflow.exists() {
                files.push(workflow);
            }
        } else if path.extension().is_some_and(|ext| ext == "json") {
            files.push(path);
        }
    }
    assert!(files.len() >= 8, "found only {files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        let workflow = match parse_workflow(&text) {
            Ok(parsed) => parsed.workflow,
            Err(error) => panic!("{}: {error}", file.display()),
        };
        invariants::check(&workflow, &layout(&workflow));
    }
}

#[test]
fn the_feature_development_workflow_is_drawn_as_it_routes() {
    let (_, graph) = drawn(SPEC[6].1);
    let edges: Vec<(&str, &str, EdgeKind, bool)> = graph
        .edges
        .iter()
        .map(|edge| (edge.from.as_str(), edge.to.as_str(), edge.kind, edge.back))
        .collect();
    assert_eq!(
        edges,
        vec![
            ("plan", "approve-plan", EdgeKind::Next, false),
            ("approve-plan", "code", EdgeKind::OnApprove, false),
            ("approve-plan", "plan", EdgeKind::OnReject, true),
            ("code", "parallel-tests", EdgeKind::Next, false),
            ("parallel-tests", "check-tests", EdgeKind::Next, false),
            ("check-tests", "review", EdgeKind::Then, false),
            ("check-tests", "code", EdgeKind::Else, true),
        ]
    );
    let order = [
        "plan",
        "approve-plan",
        "code",
        "parallel-tests",
        "check-tests",
        "review",
    ];
    for pair in order.windows(2) {
        let (above, below) = (node(&graph, pair[0]), node(&graph, pair[1]));
        assert!(
            above.y + above.height < below.y,
            "{} above {}",
            pair[0],
            pair[1]
        );
    }
    // The branches run at once: side by side in their parallel step's box.
    let (unit, integration) = (node(&graph, "unit"), node(&graph, "integration"));
    assert_eq!(unit.y, integration.y);
    assert!(unit.x + unit.width < integration.x);
    assert_eq!(unit.parent.as_deref(), Some("parallel-tests"));
    // Loops go around the right side of every box.
    let rightmost = graph
        .nodes
        .iter()
        .map(|node| node.x + node.width)
        .fold(0.0, f64::max);
    for edge in graph.edges.iter().filter(|edge| edge.back) {
        assert!(
            edge.points.iter().any(|point| point[0] > rightmost),
            "{} -> {} does not go around the side",
            edge.from,
            edge.to
        );
    }
}

#[test]
fn details_say_what_each_step_does() {
    let text = json!({"steps": [
        {"id": "plan", "type": "agent", "agent": "planner"},
        {"id": "extract", "type": "transform", "transform": "context.plan.files"},
        {"id": "ok", "type": "approval",
         "message": "Please approve the plan before anything is written to disk, thank you"},
        {"id": "check", "type": "condition",
         "condition": "context.plan.files === true && context.plan.approach === true",
         "then": "each"},
        {"id": "each", "type": "map", "items": "context.plan.files", "agent": "tester"},
        {"id": "chain", "type": "map", "items": "context.plan.files", "steps": [
            {"id": "one", "type": "agent", "agent": "a"},
            {"id": "two", "type": "agent", "agent": "b"}]},
        {"id": "fan", "type": "parallel", "steps": [{"id": "solo", "type": "agent", "agent": "c"}]}
    ]})
    .to_string();
    let (_, graph) = drawn(&text);
    let detail = |id: &str| node(&graph, id).detail.clone();
    assert_eq!(detail("plan"), "planner");
    assert_eq!(detail("extract"), "context.plan.files");
    assert_eq!(detail("ok"), "Please approve the plan before anything…");
    assert_eq!(detail("ok").chars().count(), 40);
    assert_eq!(detail("check"), "context.plan.files === true && context.…");
    assert_eq!(detail("each"), "per item: tester");
    assert!(!node(&graph, "each").container);
    assert_eq!(detail("chain"), "chain of 2 steps");
    assert!(node(&graph, "chain").container);
    assert_eq!(detail("fan"), "1 branch");
}

#[test]
fn self_loops_and_unreachable_steps_are_drawn() {
    let text = json!({"steps": [
        {"id": "start", "type": "agent", "agent": "a", "on_error": "start", "next": "check"},
        {"id": "check", "type": "condition", "condition": "input.ok === true",
         "then": "finish", "else": "check"},
        {"id": "orphan", "type": "agent", "agent": "b", "next": "finish"},
        {"id": "finish", "type": "agent", "agent": "c"}
    ]})
    .to_string();
    let (_, graph) = drawn(&text);
    let back: Vec<(&str, &str)> = graph
        .edges
        .iter()
        .filter(|edge| edge.back)
        .map(|edge| (edge.from.as_str(), edge.to.as_str()))
        .collect();
    assert_eq!(back, vec![("start", "start"), ("check", "check")]);
    assert!(node(&graph, "orphan").y < node(&graph, "finish").y);
}

/// A plan, a fan-out of `branches`, a map whose chain loops, and a check that loops back to
/// the plan; the fan-out's errors go to a report.
fn wide_workflow(branches: usize) -> String {
    let fan: Vec<_> = (0..branches)
        .map(|i| json!({"id": format!("test-{i:03}"), "type": "agent", "agent": "tester"}))
        .collect();
    json!({"id": "wide", "steps": [
        {"id": "plan", "type": "agent", "agent": "planner"},
        {"id": "fan", "type": "parallel", "steps": fan, "on_error": "report"},
        {"id": "triage", "type": "map", "items": "context.plan.files", "steps": [
            {"id": "judge", "type": "condition", "condition": "map.item.failed === 0",
             "then": "note", "else": "fix"},
            {"id": "fix", "type": "agent", "agent": "fixer", "next": "judge"},
            {"id": "note", "type": "transform", "transform": "map.item"}
        ]},
        {"id": "review", "type": "condition", "condition": "context.triage.success === true",
         "then": "publish", "else": "plan"},
        {"id": "publish", "type": "agent", "agent": "publisher", "end": true},
        {"id": "report", "type": "agent", "agent": "reporter"}
    ]})
    .to_string()
}

#[test]
fn five_hundred_branches_wrap_into_a_compact_grid() {
    let (workflow, graph) = drawn(&wide_workflow(500));
    assert!(graph.width < 2_500.0, "{} px wide", graph.width);
    assert!(graph.height < 5_000.0, "{} px tall", graph.height);
    let fan = workflow.index_of("fan").expect("fan");
    let branches: Vec<&super::Node> = graph
        .nodes
        .iter()
        .filter(|node| node.parent.as_deref() == Some("fan"))
        .collect();
    assert_eq!(branches.len(), 500);
    let mut per_row = std::collections::BTreeMap::<u64, usize>::new();
    for branch in &branches {
        assert_eq!(branch.kind, StepType::Agent);
        assert!(branch.width < 180.0 && branch.height < 48.0, "compact");
        *per_row.entry(branch.y.to_bits()).or_default() += 1;
    }
    assert!(per_row.values().all(|&count| count <= 10), "{per_row:?}");
    assert_eq!(graph.nodes[fan].detail, "500 branches");
    // Inside the chain: the loop back to the judge is marked.
    let fix = graph
        .edges
        .iter()
        .find(|edge| edge.from == "fix")
        .expect("fix -> judge");
    assert!(fix.back && fix.to == "judge");
}

#[test]
fn a_few_branches_stay_full_size_side_by_side() {
    let (_, graph) = drawn(&wide_workflow(3));
    let branches: Vec<&super::Node> = graph
        .nodes
        .iter()
        .filter(|node| node.parent.as_deref() == Some("fan"))
        .collect();
    assert!(
        branches
            .iter()
            .all(|b| b.width == 180.0 && b.y == branches[0].y)
    );
}

#[test]
fn the_graph_serializes_as_the_api_says() {
    let (_, graph) = drawn(SPEC[6].1);
    let value = serde_json::to_value(&graph).expect("serializable");
    assert!(value["width"].is_f64() && value["height"].is_f64());
    let nodes = value["nodes"].as_array().expect("nodes");
    assert_eq!(nodes[0]["id"], "plan");
    assert_eq!(nodes[0]["kind"], "agent");
    assert_eq!(nodes[0]["detail"], "planner");
    assert_eq!(nodes[0]["parent"], serde_json::Value::Null);
    assert_eq!(nodes[0]["container"], false);
    assert_eq!(nodes[1]["kind"], "approval");
    let unit = nodes.iter().find(|n| n["id"] == "unit").expect("unit");
    assert_eq!(unit["parent"], "parallel-tests");
    let reject = value["edges"]
        .as_array()
        .expect("edges")
        .iter()
        .find(|e| e["kind"] == "on_reject")
        .expect("the reject edge");
    assert_eq!(reject["label"], "reject");
    assert_eq!(reject["back"], true);
    assert!(
        reject["points"]
            .as_array()
            .expect("points")
            .iter()
            .all(|p| p
                .as_array()
                .is_some_and(|xy| xy.len() == 2 && xy[0].is_f64()))
    );
    let mut keys: Vec<&String> = value["edges"][0]
        .as_object()
        .expect("an edge")
        .keys()
        .collect();
    keys.sort();
    assert_eq!(keys, ["back", "from", "kind", "label", "points", "to"]);
    let mut keys: Vec<&String> = nodes[0].as_object().expect("a node").keys().collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "container",
            "detail",
            "height",
            "id",
            "kind",
            "label",
            "parent",
            "width",
            "x",
            "y"
        ]
    );
}

/// `count` agents, step `i` naming step `target(i)` in `on_error`.
fn with_errors_to(count: usize, target: impl Fn(usize) -> usize) -> String {
    let steps: Vec<_> = (0..count)
        .map(|i| {
            json!({"id": format!("s{i}"), "type": "agent", "agent": "worker",
                   "on_error": format!("s{}", target(i))})
        })
        .collect();
    json!({"steps": steps}).to_string()
}

/// Whether `edge` passes left of every box.
fn goes_around_the_left(graph: &Graph, edge: &super::Edge) -> bool {
    let leftmost = graph
        .nodes
        .iter()
        .map(|node| node.x)
        .fold(f64::INFINITY, f64::min);
    edge.points.iter().any(|point| point[0] < leftmost)
}

#[test]
fn an_error_handler_that_many_steps_name_gets_one_bus_on_the_left() {
    let (_, graph) = drawn(&with_errors_to(9, |_| 8));
    let long: Vec<&super::Edge> = graph
        .edges
        .iter()
        .filter(|edge| edge.kind == EdgeKind::OnError && edge.from != "s7" && edge.from != "s8")
        .collect();
    assert_eq!(long.len(), 7);
    assert!(long.iter().all(|edge| goes_around_the_left(&graph, edge)));
    // One lane for all of them: the boxes are not pushed apart.
    let lanes: std::collections::BTreeSet<u64> = long
        .iter()
        .map(|edge| edge.points[2][0].to_bits())
        .collect();
    assert_eq!(lanes.len(), 1, "{long:?}");
    assert!(graph.width < 400.0, "{} px wide", graph.width);
}

#[test]
fn past_the_placeholder_budget_long_edges_go_around_the_left() {
    // Each step's errors go 60 steps on (or back around): no step gets three long edges, so
    // none gets a bus, and 140 edges passing 59 ranks each is past the budget.
    let (_, graph) = drawn(&with_errors_to(200, |i| (i + 60) % 200));
    let around: Vec<&super::Edge> = graph
        .edges
        .iter()
        .filter(|edge| goes_around_the_left(&graph, edge))
        .collect();
    assert!(!around.is_empty(), "every long edge got placeholders");
    assert!(around.len() < 140, "no long edge got placeholders");
    assert!(around.iter().all(|edge| !edge.back));
}
