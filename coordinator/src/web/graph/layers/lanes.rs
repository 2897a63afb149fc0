//! Lanes for the edges around the side: vertical lines beyond every box of the scope.
//!
//! Edges of one side into one target form a bundle that shares a lane (and the track into the
//! target): they end at the same box, so merging reads as "all of these go there". Bundles
//! share a lane only when the gaps they span do not overlap.

use std::collections::{BTreeMap, HashMap};

use super::Link;
use super::virtual_graph::{Shape, Side, VirtualGraph};

/// Between the outermost box and the first lane.
const LANE_MARGIN: f64 = 20.0;
/// Between two lanes.
const LANE_GAP: f64 = 12.0;
/// How many lanes, nearest first, to look through for room before opening a new one: bounds
/// the work on a scope of thousands of loops.
const LANE_SEARCH: usize = 64;

/// The edges around the side of one side into one target.
#[derive(Debug)]
pub(super) struct Bundle {
    pub side: Side,
    pub target: usize,
    /// The gaps its lane spans (gaps are numbered from 0, above the first rank).
    first_gap: usize,
    last_gap: usize,
    /// Where its lane runs.
    pub x: f64,
}

/// Every bundle, and which bundle each link around the side is in.
#[derive(Debug)]
pub(super) struct Lanes {
    pub bundles: Vec<Bundle>,
    /// Per link: its bundle, if it goes around the side.
    pub bundle_of: Vec<Option<usize>>,
}

impl Lanes {
    /// Bundles the links around the side and gives each bundle a lane, left of `leftmost` or
    /// right of `rightmost` (the scope's boxes and placeholders).
    pub fn assign(graph: &VirtualGraph, links: &[Link], leftmost: f64, rightmost: f64) -> Self {
        let mut bundles: Vec<Bundle> = Vec::new();
        let mut by_target: HashMap<(Side, usize), usize> = HashMap::new();
        let mut bundle_of = vec![None; links.len()];
        for (l, link) in links.iter().enumerate() {
            let Shape::Around(side) = graph.shapes[l] else {
                continue;
            };
            let leave_gap = graph.rank[link.from] + 1;
            let enter_gap = graph.rank[link.to];
            let (first, last) = (leave_gap.min(enter_gap), leave_gap.max(enter_gap));
            let b = *by_target.entry((side, link.to)).or_insert_with(|| {
                bundles.push(Bundle {
                    side,
                    target: link.to,
                    first_gap: first,
                    last_gap: last,
                    x: 0.0,
                });
                bundles.len() - 1
            });
            bundles[b].first_gap = bundles[b].first_gap.min(first);
            bundles[b].last_gap = bundles[b].last_gap.max(last);
            bundle_of[l] = Some(b);
        }
        let numbers = lane_numbers(&bundles);
        for (bundle, lane) in bundles.iter_mut().zip(numbers) {
            bundle.x = match bundle.side {
                Side::Left => leftmost - LANE_MARGIN - lane as f64 * LANE_GAP,
                Side::Right => rightmost + LANE_MARGIN + lane as f64 * LANE_GAP,
            };
        }
        Lanes { bundles, bundle_of }
    }

    /// The lane of link `l`, if it goes around the side.
    pub fn of(&self, l: usize) -> Option<&Bundle> {
        self.bundle_of[l].map(|b| &self.bundles[b])
    }
}

/// A lane number per bundle (0 nearest the boxes). Shorter spans go nearer, so a loop inside
/// another loop is drawn inside it rather than across it.
fn lane_numbers(bundles: &[Bundle]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..bundles.len()).collect();
    order.sort_by_key(|&b| {
        let bundle = &bundles[b];
        (bundle.last_gap - bundle.first_gap, bundle.first_gap, b)
    });
    let mut lane_of = vec![0; bundles.len()];
    // Per side, per lane: the spans it holds (first gap to last gap), disjoint.
    let mut lanes: HashMap<Side, Vec<BTreeMap<usize, usize>>> = HashMap::new();
    for b in order {
        let bundle = &bundles[b];
        let side_lanes = lanes.entry(bundle.side).or_default();
        // Spans are disjoint, so the one starting last at or before this one's end is the
        // only one that could overlap it.
        let free = |spans: &BTreeMap<usize, usize>| {
            spans
                .range(..=bundle.last_gap)
                .next_back()
                .is_none_or(|(_, &last)| last < bundle.first_gap)
        };
        let lane = (0..side_lanes.len().min(LANE_SEARCH))
            .find(|&lane| free(&side_lanes[lane]))
            .unwrap_or_else(|| {
                side_lanes.push(BTreeMap::new());
                side_lanes.len() - 1
            });
        side_lanes[lane].insert(bundle.first_gap, bundle.last_gap);
        lane_of[b] = lane;
    }
    lane_of
}
