//! The scope's boxes placed and its edges drawn as polylines.
//!
//! Every edge leaves its source through a port on the bottom and enters its target through a
//! port on the top; a box's ports are spread along its border in the order of where their
//! edges head, so edges between the same two boxes stay apart. Downward edges go straight
//! down within a band (below their source, above their target, or through their placeholder's
//! room) and slant only across the gaps, where there are no boxes. An edge around the side
//! drops into the gap below its source, runs along its track to its lane, along the lane to
//! the gap above its target, and along its bundle's track back to its target: tracks lie in
//! gaps and lanes beyond every box, so no edge crosses a box.

use super::bands::Bands;
use super::lanes::Lanes;
use super::virtual_graph::{Shape, VirtualGraph};
use super::{Drawing, Link, Size};

pub(super) fn draw(
    graph: &VirtualGraph,
    sizes: &[Size],
    links: &[Link],
    center: &[f64],
    back: Vec<bool>,
) -> Drawing {
    let left_of = |v: usize| center[v] - graph.widths[v] / 2.0;
    let right_of = |v: usize| center[v] + graph.widths[v] / 2.0;
    let vertices = 0..graph.widths.len();
    let leftmost = vertices.clone().map(left_of).fold(f64::INFINITY, f64::min);
    let rightmost = vertices.map(right_of).fold(f64::NEG_INFINITY, f64::max);
    let lanes = Lanes::assign(graph, links, leftmost, rightmost);
    let (out_port, in_port) = ports(graph, sizes, links, center, &lanes);
    let bands = Bands::stack(graph, sizes, links, &lanes, &out_port, center);

    let corners: Vec<[f64; 2]> = sizes
        .iter()
        .enumerate()
        .map(|(member, size)| {
            let rank = graph.rank[member];
            let slack = bands.height[rank] - size.height;
            [left_of(member), bands.top[rank] + slack / 2.0]
        })
        .collect();
    let paths = links.iter().enumerate().map(|(l, link)| {
        let (out_x, in_x) = (out_port[l], in_port[l]);
        let mut points = vec![[out_x, corners[link.from][1] + sizes[link.from].height]];
        match (&graph.shapes[l], lanes.bundle_of[l]) {
            (Shape::Down(via), _) => {
                points.push([out_x, bands.bottom(graph.rank[link.from])]);
                for &placeholder in via {
                    let rank = graph.rank[placeholder];
                    points.push([center[placeholder], bands.top[rank]]);
                    points.push([center[placeholder], bands.bottom(rank)]);
                }
                points.push([in_x, bands.top[graph.rank[link.to]]]);
            }
            (Shape::Around(_), Some(bundle)) => {
                let (lane, leave_y, enter_y) = (
                    lanes.bundles[bundle].x,
                    bands.leave_y[l],
                    bands.enter_y[bundle],
                );
                points.push([out_x, leave_y]);
                points.push([lane, leave_y]);
                points.push([lane, enter_y]);
                points.push([in_x, enter_y]);
            }
            (Shape::Around(_), None) => unreachable!("every link around the side has a lane"),
        }
        points.push([in_x, corners[link.to][1]]);
        points.dedup();
        points
    });
    let paths: Vec<Vec<[f64; 2]>> = paths.collect();

    // Everything moved right, so the leftmost lane or box touches 0.
    let lane_xs = || lanes.bundles.iter().map(|bundle| bundle.x);
    let left_edge = lane_xs().fold(leftmost, f64::min);
    let right_edge = lane_xs().fold(rightmost, f64::max);
    let moved = |[x, y]: [f64; 2]| [x - left_edge, y];
    Drawing {
        width: right_edge - left_edge,
        height: bands.total,
        corners: corners.into_iter().map(moved).collect(),
        paths: paths
            .into_iter()
            .map(|path| path.into_iter().map(moved).collect())
            .collect(),
        back,
    }
}

/// Where each link leaves its source and enters its target (x on the bottom and top border).
fn ports(
    graph: &VirtualGraph,
    sizes: &[Size],
    links: &[Link],
    center: &[f64],
    lanes: &Lanes,
) -> (Vec<f64>, Vec<f64>) {
    let mut leaving: Vec<Vec<(f64, usize)>> = vec![Vec::new(); graph.members];
    let mut entering: Vec<Vec<(f64, usize)>> = vec![Vec::new(); graph.members];
    for (l, link) in links.iter().enumerate() {
        let (heading, coming_from) = match (&graph.shapes[l], lanes.of(l)) {
            (Shape::Down(via), _) => (
                center[*via.first().unwrap_or(&link.to)],
                center[*via.last().unwrap_or(&link.from)],
            ),
            (Shape::Around(_), bundle) => {
                let lane = bundle.map_or(center[link.from], |bundle| bundle.x);
                (lane, lane)
            }
        };
        leaving[link.from].push((heading, l));
        entering[link.to].push((coming_from, l));
    }
    let mut out_port = vec![0.0; links.len()];
    let mut in_port = vec![0.0; links.len()];
    for (member, size) in sizes.iter().enumerate() {
        let left = center[member] - size.width / 2.0;
        spread(&mut leaving[member], left, size.width, &mut out_port);
        spread(&mut entering[member], left, size.width, &mut in_port);
    }
    (out_port, in_port)
}

/// Spreads the ports of one border (its edges, each with the x it heads for) evenly along it,
/// from `left`, `width` wide, in that order.
fn spread(edges: &mut [(f64, usize)], left: f64, width: f64, port: &mut [f64]) {
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let count = edges.len() as f64;
    for (i, &(_, l)) in edges.iter().enumerate() {
        port[l] = (left + width * (i as f64 + 1.0) / (count + 1.0)).round();
    }
}
