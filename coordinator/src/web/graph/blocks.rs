//! A step as a block: its box and everything drawn inside it, relative to the block's top-left
//! corner. Blocks are measured inside out, so a scope knows the size of each of its steps
//! before it places them.
//!
//! Sizes are fixed per kind and never measure text (the page truncates labels). Sizes and gaps
//! are even numbers of pixels, which keeps coordinates whole or half pixels when centring.

use std::collections::HashMap;

use baton_core::workflow::{MapBody, StepIndex, StepKind, Workflow};

use super::EdgeKind;
use super::layers::{self, Link, Size};
use super::routes::routes;

/// A step's box.
const NODE: Size = Size {
    width: 180.0,
    height: 48.0,
};
/// A branch's box in a parallel step of many branches.
const COMPACT_NODE: Size = Size {
    width: 120.0,
    height: 32.0,
};
/// A parallel step of more branches than this draws the plain ones compact.
const COMPACT_ABOVE: usize = 12;
/// Branches per row of a parallel step's grid: few and wide, or many and compact.
const COLUMNS: usize = 4;
const COMPACT_COLUMNS: usize = 10;
const GRID_GAP: f64 = 16.0;
const COMPACT_GRID_GAP: f64 = 8.0;
/// The top of a container, where its label and detail go.
const HEADER: f64 = 40.0;
/// Between a container's border and what it holds, at the sides and the bottom.
const PADDING: f64 = 12.0;
const MIN_CONTAINER_WIDTH: f64 = NODE.width + 2.0 * PADDING;
/// Around the whole drawing.
pub(super) const MARGIN: f64 = 16.0;

/// A box, top-left corner and size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Rect {
    pub x: f64,
    pub y: f64,
    pub width: f64,
    pub height: f64,
}

impl Rect {
    pub fn moved(self, dx: f64, dy: f64) -> Rect {
        Rect {
            x: self.x + dx,
            y: self.y + dy,
            ..self
        }
    }
}

/// A routing, drawn.
#[derive(Debug, Clone)]
pub(super) struct Route {
    pub from: StepIndex,
    pub to: StepIndex,
    pub kind: EdgeKind,
    /// Its place among `from`'s routings, to keep their order in the graph.
    pub slot: usize,
    pub back: bool,
    pub points: Vec<[f64; 2]>,
}

/// Everything drawn in a block, relative to its top-left corner.
#[derive(Debug, Default)]
pub(super) struct Block {
    pub width: f64,
    pub height: f64,
    pub boxes: Vec<(StepIndex, Rect)>,
    pub routes: Vec<Route>,
}

impl Block {
    /// Adds `inner`'s contents to this block, with `inner`'s corner at `(dx, dy)`.
    fn take(&mut self, inner: Block, dx: f64, dy: f64) {
        self.boxes.extend(
            inner
                .boxes
                .into_iter()
                .map(|(index, rect)| (index, rect.moved(dx, dy))),
        );
        self.routes
            .extend(inner.routes.into_iter().map(|mut route| {
                for point in &mut route.points {
                    *point = [point[0] + dx, point[1] + dy];
                }
                route
            }));
    }
}

/// Whether a step's box holds other boxes.
pub(super) fn is_container(kind: &StepKind) -> bool {
    match kind {
        StepKind::Parallel { .. } => true,
        StepKind::Map(map) => matches!(map.body, MapBody::Chain(_)),
        _ => false,
    }
}

/// `index` and everything inside it; `compact` for a branch among many.
fn measure(workflow: &Workflow, index: StepIndex, compact: bool) -> Block {
    let plain = if compact { COMPACT_NODE } else { NODE };
    match &workflow.step(index).kind {
        StepKind::Parallel { branches, .. } => grid(workflow, index, branches),
        StepKind::Map(map) => match &map.body {
            MapBody::Chain(chain) => chain_box(workflow, index, chain),
            MapBody::Agent(_) => leaf(index, plain),
        },
        _ => leaf(index, plain),
    }
}

fn leaf(index: StepIndex, size: Size) -> Block {
    Block {
        width: size.width,
        height: size.height,
        boxes: vec![(index, rect_at_origin(size))],
        routes: Vec::new(),
    }
}

fn rect_at_origin(size: Size) -> Rect {
    Rect {
        x: 0.0,
        y: 0.0,
        width: size.width,
        height: size.height,
    }
}

/// A container's box around content `inner_width` by `inner_height`, alone in its block so
/// far: it comes first, so it is drawn under what goes in.
fn container(index: StepIndex, inner_width: f64, inner_height: f64) -> Block {
    let size = Size {
        width: (inner_width + 2.0 * PADDING).max(MIN_CONTAINER_WIDTH),
        height: HEADER + inner_height + PADDING,
    };
    leaf(index, size)
}

/// A parallel step: its branches run at once and do not route, so they need no ranks; they
/// are wrapped row by row into a grid, in document order, rows as even as the count allows.
fn grid(workflow: &Workflow, index: StepIndex, branches: &[StepIndex]) -> Block {
    let compact = branches.len() > COMPACT_ABOVE;
    let (max_columns, gap) = if compact {
        (COMPACT_COLUMNS, COMPACT_GRID_GAP)
    } else {
        (COLUMNS, GRID_GAP)
    };
    let cells: Vec<Block> = branches
        .iter()
        .map(|&branch| measure(workflow, branch, compact))
        .collect();
    let rows = cells.len().div_ceil(max_columns).max(1);
    let columns = cells.len().div_ceil(rows).max(1);
    let mut column_widths = vec![0.0_f64; columns];
    let mut row_heights = vec![0.0_f64; rows];
    for (i, cell) in cells.iter().enumerate() {
        column_widths[i % columns] = column_widths[i % columns].max(cell.width);
        row_heights[i / columns] = row_heights[i / columns].max(cell.height);
    }
    let column_lefts = starts(&column_widths, gap);
    let row_tops = starts(&row_heights, gap);
    let inner_width = column_lefts[columns];
    let inner_height = row_tops[rows];
    let mut block = container(index, inner_width, inner_height);
    let left = (block.width - inner_width) / 2.0;
    for (i, cell) in cells.into_iter().enumerate() {
        let (row, column) = (i / columns, i % columns);
        let x = left + column_lefts[column] + (column_widths[column] - cell.width) / 2.0;
        let y = HEADER + row_tops[row];
        block.take(cell, x, y);
    }
    block
}

/// Where each of `lengths` starts when laid end to end with `gap` between them, and (last)
/// the total.
fn starts(lengths: &[f64], gap: f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(lengths.len() + 1);
    let mut at = 0.0;
    for (i, length) in lengths.iter().enumerate() {
        out.push(at);
        at += length + if i + 1 < lengths.len() { gap } else { 0.0 };
    }
    out.push(at);
    out
}

/// A map step that runs a chain per item: the chain drawn as a scope inside its box.
fn chain_box(workflow: &Workflow, index: StepIndex, chain: &[StepIndex]) -> Block {
    let inner = scope(workflow, chain);
    let mut block = container(index, inner.width, inner.height);
    let left = (block.width - inner.width) / 2.0;
    block.take(inner, left, HEADER);
    block
}

/// The steps of one scope (the top level, or a chain; the first is the entry) and the routings
/// between them, laid out in ranks. The block has no box of its own.
pub(super) fn scope(workflow: &Workflow, members: &[StepIndex]) -> Block {
    let blocks: Vec<Block> = members
        .iter()
        .map(|&member| measure(workflow, member, false))
        .collect();
    let local: HashMap<StepIndex, usize> = members
        .iter()
        .enumerate()
        .map(|(position, &member)| (member, position))
        .collect();
    let mut links = Vec::new();
    let mut routings = Vec::new();
    for (position, &member) in members.iter().enumerate() {
        for (slot, (kind, target)) in routes(workflow, member).into_iter().enumerate() {
            // Validation keeps every routing within its scope.
            let Some(&to) = local.get(&target) else {
                debug_assert!(false, "a routing leaves its scope");
                continue;
            };
            links.push(Link { from: position, to });
            routings.push((member, target, kind, slot));
        }
    }
    let sizes: Vec<Size> = blocks
        .iter()
        .map(|block| Size {
            width: block.width,
            height: block.height,
        })
        .collect();
    let drawing = layers::draw(&sizes, &links);
    let mut out = Block {
        width: drawing.width,
        height: drawing.height,
        ..Block::default()
    };
    for (block, corner) in blocks.into_iter().zip(&drawing.corners) {
        out.take(block, corner[0], corner[1]);
    }
    for (((from, to, kind, slot), path), back) in
        routings.into_iter().zip(drawing.paths).zip(drawing.back)
    {
        out.routes.push(Route {
            from,
            to,
            kind,
            slot,
            back,
            points: path,
        });
    }
    out
}
