//! The scope as ranked layers: members, plus a placeholder at every rank a long edge passes,
//! so that every downward edge joins adjacent ranks.

use super::rank::Ranking;
use super::{Link, Size};

/// How wide the room kept for an edge passing a rank is.
const PLACEHOLDER_WIDTH: f64 = 8.0;

/// How many placeholders a scope may have. A long edge costs one per rank it passes, so many
/// long edges could cost quadratically many; past the budget, the longest go around the left
/// side instead.
fn placeholder_budget(members: usize) -> usize {
    4_000 + 8 * members
}

/// A step that this many long edges go to (an error handler most steps name in `on_error`)
/// gets them along one lane on the left, a bus, instead of as many lines side by side that
/// would push the boxes apart.
const BUS_FROM: usize = 3;

/// Which side of the scope an edge goes around.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Side {
    /// Long edges going down: into a bus, or past the placeholder budget.
    Left,
    /// Loops, going up.
    Right,
}

/// How a link is drawn.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Shape {
    /// Straight down the ranks, through these placeholders (top to bottom; none between
    /// adjacent ranks).
    Down(Vec<usize>),
    /// Around the side.
    Around(Side),
}

/// Members (vertices `0..members`) and placeholders (after them), by rank, in order.
#[derive(Debug)]
pub(super) struct VirtualGraph {
    pub members: usize,
    /// Per vertex.
    pub widths: Vec<f64>,
    /// Per vertex.
    pub rank: Vec<usize>,
    /// The vertices of each rank, left to right.
    pub layers: Vec<Vec<usize>>,
    /// Per vertex: its neighbours one rank up, one per link segment.
    pub up: Vec<Vec<usize>>,
    /// Per vertex: its neighbours one rank down, one per link segment.
    pub down: Vec<Vec<usize>>,
    /// Per link.
    pub shapes: Vec<Shape>,
}

impl VirtualGraph {
    pub fn new(sizes: &[Size], links: &[Link], ranking: &Ranking) -> Self {
        let members = sizes.len();
        let mut graph = VirtualGraph {
            members,
            widths: sizes.iter().map(|size| size.width).collect(),
            rank: ranking.rank.clone(),
            layers: Vec::new(),
            up: vec![Vec::new(); members],
            down: vec![Vec::new(); members],
            // Loops keep this; every other link is given its shape below.
            shapes: vec![Shape::Around(Side::Right); links.len()],
        };
        // Where a placeholder sits in the first order: just after its edge's source.
        let mut first_guess: Vec<usize> = ranking.preorder.iter().map(|p| 2 * p).collect();
        let span = |link: &Link| ranking.rank[link.to] - ranking.rank[link.from];
        let mut long: Vec<usize> = (0..links.len())
            .filter(|&l| !ranking.back[l] && span(&links[l]) > 1)
            .collect();
        let mut long_into = vec![0_usize; members];
        for &l in &long {
            long_into[links[l].to] += 1;
        }
        long.sort_by_key(|&l| span(&links[l]));
        let mut budget = placeholder_budget(members);
        for l in long {
            let needed = span(&links[l]) - 1;
            if needed > budget || long_into[links[l].to] >= BUS_FROM {
                graph.shapes[l] = Shape::Around(Side::Left);
                continue;
            }
            budget -= needed;
            let link = links[l];
            let mut via = Vec::with_capacity(needed);
            let mut above = link.from;
            for rank in ranking.rank[link.from] + 1..ranking.rank[link.to] {
                let placeholder = graph.widths.len();
                graph.widths.push(PLACEHOLDER_WIDTH);
                graph.rank.push(rank);
                graph.up.push(Vec::new());
                graph.down.push(Vec::new());
                first_guess.push(2 * ranking.preorder[link.from] + 1);
                graph.join(above, placeholder);
                via.push(placeholder);
                above = placeholder;
            }
            graph.join(above, link.to);
            graph.shapes[l] = Shape::Down(via);
        }
        for (l, link) in links.iter().enumerate() {
            if !ranking.back[l] && span(link) == 1 {
                graph.join(link.from, link.to);
                graph.shapes[l] = Shape::Down(Vec::new());
            }
        }
        let ranks = ranking.rank.iter().max().map_or(0, |top| top + 1);
        graph.layers = vec![Vec::new(); ranks];
        let mut vertices: Vec<usize> = (0..graph.widths.len()).collect();
        vertices.sort_by_key(|&v| (first_guess[v], v));
        for v in vertices {
            graph.layers[graph.rank[v]].push(v);
        }
        graph
    }

    fn join(&mut self, above: usize, below: usize) {
        self.down[above].push(below);
        self.up[below].push(above);
    }

    pub fn is_member(&self, vertex: usize) -> bool {
        vertex < self.members
    }
}
