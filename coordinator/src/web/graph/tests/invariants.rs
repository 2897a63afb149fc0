//! What every drawing promises, checked against the workflow it draws. Each check panics
//! naming what is wrong, so it serves the example tests and the property tests alike.

use std::collections::{BTreeMap, HashMap};

use baton_core::workflow::{MapBody, StepKind, Workflow};

use super::super::{Edge, EdgeKind, Graph, Node};

/// How far off a border a point may be and still be on it (coordinates are whole or half
/// pixels; this only absorbs float noise).
const EPS: f64 = 0.01;

/// Every promise at once.
pub(super) fn check(workflow: &Workflow, graph: &Graph) {
    let nodes = nodes_match_steps(workflow, graph);
    boxes_nest_without_overlap(workflow, graph);
    drawing_contains_everything(graph);
    every_routing_has_one_edge(workflow, graph);
    for edge in &graph.edges {
        edge_is_drawn_well(workflow, graph, &nodes, edge);
    }
    forward_edges_are_acyclic(graph);
}

/// One box per step, in document order, with the step's kind, parent and container flag.
fn nodes_match_steps<'g>(workflow: &Workflow, graph: &'g Graph) -> HashMap<&'g str, &'g Node> {
    let ids: Vec<&str> = graph.nodes.iter().map(|node| node.id.as_str()).collect();
    let steps: Vec<&str> = workflow.steps().iter().map(|step| &*step.id).collect();
    assert_eq!(ids, steps, "one node per step, in document order");
    for (node, step) in graph.nodes.iter().zip(workflow.steps()) {
        assert_eq!(node.kind, step.step_type(), "kind of {}", node.id);
        assert_eq!(node.label, node.id, "label of {}", node.id);
        let parent = step.parent.map(|p| workflow.step(p).id.to_string());
        assert_eq!(node.parent, parent, "parent of {}", node.id);
        let container = match &step.kind {
            StepKind::Parallel { .. } => true,
            StepKind::Map(map) => matches!(map.body, MapBody::Chain(_)),
            _ => false,
        };
        assert_eq!(node.container, container, "container flag of {}", node.id);
        assert!(
            node.width > 0.0 && node.height > 0.0,
            "{} has no area",
            node.id
        );
        assert!(!node.detail.is_empty(), "{} has no detail", node.id);
    }
    graph
        .nodes
        .iter()
        .map(|node| (node.id.as_str(), node))
        .collect()
}

/// The steps that hold `index`, innermost first.
fn ancestors(workflow: &Workflow, index: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at = workflow.step(index).parent;
    while let Some(parent) = at {
        out.push(parent);
        at = workflow.step(parent).parent;
    }
    out
}

/// Each child inside its container; no two boxes overlap unless one holds the other.
fn boxes_nest_without_overlap(workflow: &Workflow, graph: &Graph) {
    for (index, node) in graph.nodes.iter().enumerate() {
        if let Some(parent) = workflow.step(index).parent {
            let outer = &graph.nodes[parent];
            assert!(
                inside(node, outer),
                "{} at {:?} is not inside its container {} at {:?}",
                node.id,
                corners(node),
                outer.id,
                corners(outer)
            );
        }
    }
    let ancestry: Vec<Vec<usize>> = (0..graph.nodes.len())
        .map(|i| ancestors(workflow, i))
        .collect();
    // Sorted by left edge, so only boxes that start before another ends are compared.
    let mut by_left: Vec<usize> = (0..graph.nodes.len()).collect();
    by_left.sort_by(|&a, &b| graph.nodes[a].x.total_cmp(&graph.nodes[b].x));
    for (at, &a) in by_left.iter().enumerate() {
        let first = &graph.nodes[a];
        for &b in &by_left[at + 1..] {
            let second = &graph.nodes[b];
            if second.x >= first.x + first.width - EPS {
                break;
            }
            if ancestry[a].contains(&b) || ancestry[b].contains(&a) {
                continue;
            }
            assert!(
                !overlap(first, second),
                "{} at {:?} overlaps {} at {:?}",
                first.id,
                corners(first),
                second.id,
                corners(second)
            );
        }
    }
}

fn corners(node: &Node) -> [f64; 4] {
    [node.x, node.y, node.x + node.width, node.y + node.height]
}

fn inside(inner: &Node, outer: &Node) -> bool {
    inner.x >= outer.x - EPS
        && inner.y >= outer.y - EPS
        && inner.x + inner.width <= outer.x + outer.width + EPS
        && inner.y + inner.height <= outer.y + outer.height + EPS
}

fn overlap(a: &Node, b: &Node) -> bool {
    a.x < b.x + b.width - EPS
        && b.x < a.x + a.width - EPS
        && a.y < b.y + b.height - EPS
        && b.y < a.y + a.height - EPS
}

/// The width and height hold every box and every point of every edge.
fn drawing_contains_everything(graph: &Graph) {
    for node in &graph.nodes {
        assert!(
            node.x >= 0.0
                && node.y >= 0.0
                && node.x + node.width <= graph.width + EPS
                && node.y + node.height <= graph.height + EPS,
            "{} at {:?} is outside the {}x{} drawing",
            node.id,
            corners(node),
            graph.width,
            graph.height
        );
    }
    for edge in &graph.edges {
        for point in &edge.points {
            assert!(
                point[0] >= -EPS
                    && point[1] >= -EPS
                    && point[0] <= graph.width + EPS
                    && point[1] <= graph.height + EPS,
                "edge {} -> {} has {point:?} outside the {}x{} drawing",
                edge.from,
                edge.to,
                graph.width,
                graph.height
            );
        }
    }
}

/// The routings the engine follows, read from the workflow itself: success (or a condition's
/// and an approval's outcomes, which already fall back to success), then `on_error`.
fn routings(workflow: &Workflow) -> BTreeMap<(String, String, &'static str), usize> {
    let mut out = BTreeMap::new();
    let mut add = |from: &str, to: Option<usize>, kind: &'static str| {
        if let Some(to) = to {
            let key = (from.to_owned(), workflow.step(to).id.to_string(), kind);
            *out.entry(key).or_insert(0) += 1;
        }
    };
    for step in workflow.steps() {
        match &step.kind {
            StepKind::Condition {
                when_true,
                when_false,
                ..
            } => {
                add(&step.id, *when_true, "then");
                add(&step.id, *when_false, "else");
            }
            StepKind::Approval {
                on_approve,
                on_reject,
                ..
            } => {
                add(&step.id, *on_approve, "on_approve");
                add(&step.id, *on_reject, "on_reject");
            }
            _ => add(&step.id, step.on_success, "next"),
        }
        add(&step.id, step.on_error, "on_error");
    }
    out
}

fn kind_name(kind: EdgeKind) -> &'static str {
    match kind {
        EdgeKind::Next => "next",
        EdgeKind::Then => "then",
        EdgeKind::Else => "else",
        EdgeKind::OnError => "on_error",
        EdgeKind::OnApprove => "on_approve",
        EdgeKind::OnReject => "on_reject",
    }
}

/// Exactly one edge per routing, of its kind, with its label.
fn every_routing_has_one_edge(workflow: &Workflow, graph: &Graph) {
    let mut drawn = BTreeMap::new();
    for edge in &graph.edges {
        let key = (edge.from.clone(), edge.to.clone(), kind_name(edge.kind));
        *drawn.entry(key).or_insert(0) += 1;
        let label = match edge.kind {
            EdgeKind::Next => "",
            EdgeKind::Then => "then",
            EdgeKind::Else => "else",
            EdgeKind::OnError => "on error",
            EdgeKind::OnApprove => "approve",
            EdgeKind::OnReject => "reject",
        };
        assert_eq!(edge.label, label, "label of {} -> {}", edge.from, edge.to);
    }
    assert_eq!(drawn, routings(workflow), "edges drawn vs routings");
}

/// Endpoints on the right borders, forward edges going down, loops going up, inside their
/// scope's container, and crossing no box.
fn edge_is_drawn_well(
    workflow: &Workflow,
    graph: &Graph,
    nodes: &HashMap<&str, &Node>,
    edge: &Edge,
) {
    let name = format!("edge {} -> {} ({:?})", edge.from, edge.to, edge.kind);
    let (from, to) = (nodes[edge.from.as_str()], nodes[edge.to.as_str()]);
    assert!(edge.points.len() >= 2, "{name} has fewer than 2 points");
    let (first, last) = (edge.points[0], edge.points[edge.points.len() - 1]);
    assert!(
        on_border(first, from),
        "{name} starts at {first:?}, off {:?}",
        corners(from)
    );
    assert!(
        on_border(last, to),
        "{name} ends at {last:?}, off {:?}",
        corners(to)
    );
    if edge.back {
        assert!(
            edge.from == edge.to || to.y + to.height <= from.y + EPS,
            "{name} is a loop but {} is not above {}",
            edge.to,
            edge.from
        );
    } else {
        assert!(
            to.y >= from.y + from.height - EPS,
            "{name} goes forward but {} is not below {}",
            edge.to,
            edge.from
        );
        for pair in edge.points.windows(2) {
            assert!(
                pair[1][1] >= pair[0][1] - EPS,
                "{name} goes forward but climbs from {:?} to {:?}",
                pair[0],
                pair[1]
            );
        }
    }
    let from_index = workflow.index_of(&edge.from).expect("a step");
    let holders = ancestors(workflow, from_index);
    if let Some(&scope) = holders.first() {
        let container = &graph.nodes[scope];
        for point in &edge.points {
            assert!(
                point[0] >= container.x - EPS
                    && point[0] <= container.x + container.width + EPS
                    && point[1] >= container.y - EPS
                    && point[1] <= container.y + container.height + EPS,
                "{name} leaves its container {} at {point:?}",
                container.id
            );
        }
    }
    for (index, node) in graph.nodes.iter().enumerate() {
        if holders.contains(&index) {
            continue;
        }
        for pair in edge.points.windows(2) {
            assert!(
                !crosses(pair[0], pair[1], node),
                "{name} crosses {} at {:?} between {:?} and {:?}",
                node.id,
                corners(node),
                pair[0],
                pair[1]
            );
        }
    }
}

fn on_border(point: [f64; 2], node: &Node) -> bool {
    let [x, y] = point;
    let [left, top, right, bottom] = corners(node);
    let within = x >= left - EPS && x <= right + EPS && y >= top - EPS && y <= bottom + EPS;
    let strictly_inside = x > left + EPS && x < right - EPS && y > top + EPS && y < bottom - EPS;
    within && !strictly_inside
}

/// Whether the segment `a`-`b` passes through the inside of `node` (touching its border is
/// fine): the segment clipped to the box shrunk by [`EPS`] (Liang-Barsky) is not empty.
fn crosses(a: [f64; 2], b: [f64; 2], node: &Node) -> bool {
    let [left, top, right, bottom] = corners(node);
    let (left, top, right, bottom) = (left + EPS, top + EPS, right - EPS, bottom - EPS);
    let (dx, dy) = (b[0] - a[0], b[1] - a[1]);
    let mut enter: f64 = 0.0;
    let mut leave: f64 = 1.0;
    for (p, q) in [
        (-dx, a[0] - left),
        (dx, right - a[0]),
        (-dy, a[1] - top),
        (dy, bottom - a[1]),
    ] {
        if p == 0.0 {
            if q <= 0.0 {
                return false;
            }
            continue;
        }
        let t = q / p;
        if p < 0.0 {
            enter = enter.max(t);
        } else {
            leave = leave.min(t);
        }
    }
    enter < leave
}

/// The edges not marked as loops leave no cycle: every loop is marked.
fn forward_edges_are_acyclic(graph: &Graph) {
    let index: HashMap<&str, usize> = graph
        .nodes
        .iter()
        .enumerate()
        .map(|(i, node)| (node.id.as_str(), i))
        .collect();
    let mut waiting = vec![0; graph.nodes.len()];
    let mut outgoing = vec![Vec::new(); graph.nodes.len()];
    for edge in graph.edges.iter().filter(|edge| !edge.back) {
        let (from, to) = (index[edge.from.as_str()], index[edge.to.as_str()]);
        outgoing[from].push(to);
        waiting[to] += 1;
    }
    let mut ready: Vec<usize> = (0..graph.nodes.len())
        .filter(|&i| waiting[i] == 0)
        .collect();
    let mut done = 0;
    while let Some(node) = ready.pop() {
        done += 1;
        for &to in &outgoing[node] {
            waiting[to] -= 1;
            if waiting[to] == 0 {
                ready.push(to);
            }
        }
    }
    assert_eq!(
        done,
        graph.nodes.len(),
        "the edges not marked back form a cycle"
    );
}
