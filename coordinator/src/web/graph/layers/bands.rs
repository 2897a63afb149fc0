//! The vertical layout: a band per rank, as tall as its tallest box, and a gap above, between
//! and below the bands, as tall as the tracks the edges around the side need there (the gaps
//! at the very top and bottom are empty without them).

use super::Link;
use super::Size;
use super::lanes::Lanes;
use super::virtual_graph::{Shape, Side, VirtualGraph};

/// The gap between two bands, without tracks.
const RANK_GAP: f64 = 48.0;
/// Between two tracks of a gap.
const TRACK: f64 = 8.0;

/// Where each band and each track is.
#[derive(Debug)]
pub(super) struct Bands {
    /// Per rank.
    pub top: Vec<f64>,
    pub height: Vec<f64>,
    /// Per link around the side: the y of its track in the gap below its source.
    pub leave_y: Vec<f64>,
    /// Per bundle: the y of its track in the gap above its target.
    pub enter_y: Vec<f64>,
    /// The whole scope's height.
    pub total: f64,
}

impl Bands {
    /// `out_port` is where each link leaves its source: it orders the tracks of a gap.
    ///
    /// In the gap below a source, each edge around the side gets a track, the one leaving
    /// nearest its lane on top, so that no edge's drop crosses another's run to the
    /// lane; in the gap above a target, each bundle gets a track below those, the target
    /// nearest its lane lowest, for the same reason.
    pub fn stack(
        graph: &VirtualGraph,
        sizes: &[Size],
        links: &[Link],
        lanes: &Lanes,
        out_port: &[f64],
        center: &[f64],
    ) -> Self {
        let ranks = graph.layers.len();
        let toward_lane = |side: Side, x: f64| match side {
            Side::Left => x,
            Side::Right => -x,
        };
        let mut leaving: Vec<Vec<(Side, f64, usize)>> = vec![Vec::new(); ranks + 1];
        for (l, link) in links.iter().enumerate() {
            if let Shape::Around(side) = graph.shapes[l] {
                let order = toward_lane(side, out_port[l]);
                leaving[graph.rank[link.from] + 1].push((side, order, l));
            }
        }
        let mut entering: Vec<Vec<(Side, f64, usize)>> = vec![Vec::new(); ranks + 1];
        for (b, bundle) in lanes.bundles.iter().enumerate() {
            let order = -toward_lane(bundle.side, center[bundle.target]);
            entering[graph.rank[bundle.target]].push((bundle.side, order, b));
        }
        for tracks in leaving.iter_mut().chain(entering.iter_mut()) {
            tracks.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
        }

        let mut height = vec![0.0_f64; ranks];
        for (member, size) in sizes.iter().enumerate() {
            let rank = graph.rank[member];
            height[rank] = height[rank].max(size.height);
        }
        let mut bands = Bands {
            top: Vec::with_capacity(ranks),
            height,
            leave_y: vec![0.0; links.len()],
            enter_y: vec![0.0; lanes.bundles.len()],
            total: 0.0,
        };
        let mut y = 0.0;
        for gap in 0..=ranks {
            let outer = gap == 0 || gap == ranks;
            // The first track sits mid-gap (or one track down at the very top and bottom).
            let first_track = if outer { TRACK } else { RANK_GAP / 2.0 };
            let tracks = leaving[gap].iter().map(|&(_, _, l)| (true, l));
            let tracks = tracks.chain(entering[gap].iter().map(|&(_, _, b)| (false, b)));
            let mut count = 0;
            for (i, (leaves, which)) in tracks.enumerate() {
                let track_y = y + first_track + TRACK * i as f64;
                if leaves {
                    bands.leave_y[which] = track_y;
                } else {
                    bands.enter_y[which] = track_y;
                }
                count += 1;
            }
            y += match (outer, count) {
                (true, 0) => 0.0,
                (true, _) => TRACK * (count + 1) as f64,
                (false, _) => RANK_GAP + TRACK * count as f64,
            };
            if gap < ranks {
                bands.top.push(y);
                y += bands.height[gap];
            }
        }
        bands.total = y;
        bands
    }

    pub fn bottom(&self, rank: usize) -> f64 {
        self.top[rank] + self.height[rank]
    }
}
