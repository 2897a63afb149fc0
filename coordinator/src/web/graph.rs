//! A workflow laid out top to bottom, the drawing behind `GET /api/runs/<id>/graph`: every step
//! a box (a parallel step's branches and a map step's chain inside its box), every routing an
//! edge, in pixels from the top left. A pure function of the workflow; the page only draws it
//! and colours each box by its step's state.
//!
//! The drawing is built inside out, each step measured into a block before its scope is laid
//! out, so a container's size is known when its own scope places it:
//! - `routes`: the routings of one step, each with the kind of edge it becomes.
//! - `blocks`: a step as a block: a box of fixed size, a parallel step's branches wrapped into
//!   a grid (so 500 branches stay a few screens tall, not 100,000 px wide), a map step's chain
//!   laid out as a scope of its own.
//! - `layers`: one scope (the top level, or a chain) as a layered drawing: loops broken and
//!   ranks by longest path (`rank`), long edges cut at every rank they pass (`virtual_graph`),
//!   ranks ordered to reduce crossings (`order`), coordinates (`place`, `bands`) and
//!   polylines, loops and buses around the side (`lanes`, `route`).

mod blocks;
mod layers;
mod routes;

use baton_core::workflow::{MapBody, StepIndex, StepKind, StepType, Workflow};
use serde::{Deserialize, Serialize};

use blocks::{MARGIN, Rect};

/// The whole drawing: its size and what is in it, in px, origin top left.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    pub width: f64,
    pub height: f64,
    /// Every step, in document order (a container before what it holds).
    pub nodes: Vec<Node>,
    /// Every routing, by step in document order.
    pub edges: Vec<Edge>,
}

/// One step's box.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub id: String,
    pub kind: StepType,
    pub label: String,
    /// A line about what the step does: its agent, message, condition, transform, or size.
    pub detail: String,
    /// The parallel step this is a branch of, or the map step whose chain it is in.
    pub parent: Option<String>,
    /// Whether other boxes are drawn inside this one (a parallel step, a map with a chain).
    pub container: bool,
    /// Top-left corner.
    pub x: f64,
    pub y: f64,
    pub width: f64,
    pub height: f64,
}

/// One routing: where a step goes on some outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Edge {
    pub from: String,
    pub to: String,
    pub kind: EdgeKind,
    pub label: String,
    /// A loop: it goes to a step drawn at the same rank or above, around the side.
    pub back: bool,
    /// A polyline from the border of `from`'s box to the border of `to`'s; at least 2 points.
    pub points: Vec<[f64; 2]>,
}

/// Which routing field an edge draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EdgeKind {
    /// `next`, or the next step in document order.
    Next,
    Then,
    Else,
    OnError,
    OnApprove,
    OnReject,
}

impl EdgeKind {
    /// What the page writes on the edge.
    pub fn label(self) -> &'static str {
        match self {
            EdgeKind::Next => "",
            EdgeKind::Then => "then",
            EdgeKind::Else => "else",
            EdgeKind::OnError => "on error",
            EdgeKind::OnApprove => "approve",
            EdgeKind::OnReject => "reject",
        }
    }
}

/// How many characters of a message or an expression a box shows.
const DETAIL_CHARS: usize = 40;

/// Lays `workflow` out top to bottom.
pub fn layout(workflow: &Workflow) -> Graph {
    let top = blocks::scope(workflow, workflow.top_level());
    let mut rects: Vec<Option<Rect>> = vec![None; workflow.steps().len()];
    for (index, rect) in &top.boxes {
        rects[*index] = Some(rect.moved(MARGIN, MARGIN));
    }
    let nodes = rects
        .iter()
        .enumerate()
        .filter_map(|(index, rect)| Some(node(workflow, index, (*rect)?)))
        .collect();
    let mut routes = top.routes;
    // Each step's routings stay in the order `routes` gives them.
    routes.sort_by_key(|route| (route.from, route.slot));
    let edges = routes
        .into_iter()
        .map(|route| Edge {
            from: workflow.step(route.from).id.to_string(),
            to: workflow.step(route.to).id.to_string(),
            kind: route.kind,
            label: route.kind.label().to_owned(),
            back: route.back,
            points: route
                .points
                .into_iter()
                .map(|[x, y]| [x + MARGIN, y + MARGIN])
                .collect(),
        })
        .collect();
    Graph {
        width: top.width + 2.0 * MARGIN,
        height: top.height + 2.0 * MARGIN,
        nodes,
        edges,
    }
}

fn node(workflow: &Workflow, index: StepIndex, rect: Rect) -> Node {
    let step = workflow.step(index);
    Node {
        id: step.id.to_string(),
        kind: step.step_type(),
        label: step.id.to_string(),
        detail: detail(&step.kind),
        parent: step
            .parent
            .map(|parent| workflow.step(parent).id.to_string()),
        container: blocks::is_container(&step.kind),
        x: rect.x,
        y: rect.y,
        width: rect.width,
        height: rect.height,
    }
}

fn detail(kind: &StepKind) -> String {
    match kind {
        StepKind::Agent { agent } => agent.clone(),
        StepKind::Transform { source, .. } => shortened(source),
        StepKind::Parallel { branches, .. } => counted(branches.len(), "branch", "branches"),
        StepKind::Condition { source, .. } => shortened(source),
        StepKind::Approval { message, .. } => shortened(message),
        StepKind::Map(map) => match &map.body {
            MapBody::Agent(agent) => format!("per item: {agent}"),
            MapBody::Chain(chain) => format!("chain of {}", counted(chain.len(), "step", "steps")),
        },
    }
}

fn counted(count: usize, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

/// `text` on one line, cut to [`DETAIL_CHARS`] characters with an ellipsis.
fn shortened(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= DETAIL_CHARS {
        return line;
    }
    let mut cut: String = line.chars().take(DETAIL_CHARS - 1).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests;
