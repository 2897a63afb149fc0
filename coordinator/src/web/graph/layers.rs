//! One scope (the top level, or a map step's chain) as a layered drawing, top to bottom:
//! Sugiyama's method, kept small and near linear, since a scope may hold thousands of steps.
//!
//! - `rank`: loops broken by a depth-first walk from the entry (an edge back to a step still
//!   on the walk is a loop), then each step's rank is its longest path from a source over the
//!   remaining edges, so every other edge goes down.
//! - `virtual_graph`: an edge that spans several ranks gets a thin placeholder at each rank
//!   between, so it has room to pass between boxes; loops go around the right side instead,
//!   and long edges into a step that many name (a bus) or past a budget around the left.
//! - `order`: each rank ordered by the barycenter of its neighbours, sweeping down and up,
//!   keeping the order with the fewest crossings.
//! - `place`: x, by pulling each box toward its neighbours without overlaps (an isotonic
//!   regression per rank).
//! - `lanes` (beyond every box, for the edges around the side), `bands` (y: a band per rank,
//!   gaps between them as tall as their tracks need) and `route` (ports on the boxes, and the
//!   polylines).

mod bands;
mod lanes;
mod order;
mod place;
mod rank;
mod route;
mod virtual_graph;

/// A box's size in px.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Size {
    pub width: f64,
    pub height: f64,
}

/// A routing between two members of the scope, by position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Link {
    pub from: usize,
    pub to: usize,
}

/// The scope drawn, with its top-left corner at the origin.
#[derive(Debug, Default)]
pub(super) struct Drawing {
    pub width: f64,
    pub height: f64,
    /// Each member's top-left corner.
    pub corners: Vec<[f64; 2]>,
    /// Each link's polyline, from the bottom of its source to the top of its target.
    pub paths: Vec<Vec<[f64; 2]>>,
    /// Each link: whether it is a loop.
    pub back: Vec<bool>,
}

/// Lays out members of `sizes` (the first is the entry) joined by `links`.
pub(super) fn draw(sizes: &[Size], links: &[Link]) -> Drawing {
    if sizes.is_empty() {
        return Drawing::default();
    }
    let ranking = rank::rank(sizes.len(), links);
    let mut graph = virtual_graph::VirtualGraph::new(sizes, links, &ranking);
    order::reduce_crossings(&mut graph);
    let centers = place::centers(&graph);
    route::draw(&graph, sizes, links, &centers, ranking.back)
}
