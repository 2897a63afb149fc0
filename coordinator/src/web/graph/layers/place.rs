//! Horizontal positions: each vertex pulled toward the mean of its neighbours, rank by rank,
//! without overlaps and without changing the order (an isotonic regression per rank, solved
//! exactly by pooling adjacent violators: linear in the rank's length).

use super::virtual_graph::VirtualGraph;

/// Between two boxes of a rank.
const BOX_GAP: f64 = 40.0;
/// Between a placeholder and anything else.
const PLACEHOLDER_GAP: f64 = 16.0;
/// Passes down, up, down, ...; odd, so the last goes down, the way the page is read.
const PASSES: usize = 7;

/// Each vertex's centre x, in whole pixels.
pub(super) fn centers(graph: &VirtualGraph) -> Vec<f64> {
    let mut center = vec![0.0; graph.widths.len()];
    for layer in &graph.layers {
        let placed = pack(&vec![0.0; layer.len()], &separations(graph, layer));
        for (&v, x) in layer.iter().zip(placed) {
            center[v] = x;
        }
    }
    let ranks = graph.layers.len();
    for pass in 0..PASSES {
        let downward = pass % 2 == 0;
        let order: Vec<usize> = if downward {
            (1..ranks).collect()
        } else {
            (0..ranks.saturating_sub(1)).rev().collect()
        };
        let neighbours = if downward { &graph.up } else { &graph.down };
        for rank in order {
            let layer = &graph.layers[rank];
            let wanted: Vec<f64> = layer
                .iter()
                .map(|&v| match neighbours[v].len() {
                    0 => center[v],
                    count => neighbours[v].iter().map(|&n| center[n]).sum::<f64>() / count as f64,
                })
                .collect();
            for (&v, x) in layer.iter().zip(pack(&wanted, &separations(graph, layer))) {
                center[v] = x;
            }
        }
    }
    for layer in &graph.layers {
        let gaps = separations(graph, layer);
        for (i, &v) in layer.iter().enumerate() {
            // `floor(x + 0.5)` moves with x, so the gaps (whole numbers) survive rounding;
            // the max mends what float error could still take off.
            let mut x = (center[v] + 0.5).floor();
            if i > 0 {
                x = x.max(center[layer[i - 1]] + gaps[i - 1]);
            }
            center[v] = x;
        }
    }
    center
}

/// The least distance between the centres of each adjacent pair of `layer`.
fn separations(graph: &VirtualGraph, layer: &[usize]) -> Vec<f64> {
    layer
        .windows(2)
        .map(|pair| {
            let (a, b) = (pair[0], pair[1]);
            let gap = if graph.is_member(a) && graph.is_member(b) {
                BOX_GAP
            } else {
                PLACEHOLDER_GAP
            };
            (graph.widths[a] + graph.widths[b]) / 2.0 + gap
        })
        .collect()
}

/// Positions as close as possible (least squares) to `wanted`, in order, each at least
/// `gaps[i]` right of the one before. With `x[i] = y[i] + offset[i]` (offset the sum of the
/// gaps before), that is the closest non-decreasing `y` to `wanted - offset`: pooled adjacent
/// violators.
fn pack(wanted: &[f64], gaps: &[f64]) -> Vec<f64> {
    let mut offsets = Vec::with_capacity(wanted.len());
    let mut at = 0.0;
    for i in 0..wanted.len() {
        if i > 0 {
            at += gaps[i - 1];
        }
        offsets.push(at);
    }
    // Pools of (sum, count), their means non-decreasing.
    let mut pools: Vec<(f64, usize)> = Vec::new();
    for (w, offset) in wanted.iter().zip(&offsets) {
        pools.push((w - offset, 1));
        while pools.len() >= 2 {
            let (sum, count) = pools[pools.len() - 1];
            let (before_sum, before_count) = pools[pools.len() - 2];
            if before_sum / before_count as f64 <= sum / count as f64 {
                break;
            }
            pools.pop();
            let last = pools.len() - 1;
            pools[last] = (before_sum + sum, before_count + count);
        }
    }
    let mut out = Vec::with_capacity(wanted.len());
    for (sum, count) in pools {
        let mean = sum / count as f64;
        for _ in 0..count {
            out.push(mean + offsets[out.len()]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::pack;

    #[test]
    fn packing_keeps_gaps_and_stays_near_what_is_wanted() {
        assert_eq!(pack(&[0.0, 100.0], &[50.0]), vec![0.0, 100.0]);
        // Both want 10: they split the difference around it.
        assert_eq!(pack(&[10.0, 10.0], &[40.0]), vec![-10.0, 30.0]);
        // Out of order wishes pool too.
        assert_eq!(
            pack(&[30.0, 0.0, 100.0], &[10.0, 10.0]),
            vec![10.0, 20.0, 100.0]
        );
    }
}
