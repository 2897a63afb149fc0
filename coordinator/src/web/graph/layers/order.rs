//! The order within each rank: barycenter sweeps, keeping the order with the fewest
//! crossings. Each sweep costs about the number of vertices and segments (times a log), so a
//! scope of thousands of steps stays fast.

use super::virtual_graph::VirtualGraph;

/// Sweeps down then up, at most this many times.
const SWEEPS: usize = 4;

pub(super) fn reduce_crossings(graph: &mut VirtualGraph) {
    let mut position = positions(graph);
    let mut best = graph.layers.clone();
    let mut fewest = crossings(graph, &position);
    for _ in 0..SWEEPS {
        if fewest == 0 {
            break;
        }
        for rank in 1..graph.layers.len() {
            sort_by_neighbours(graph, rank, true, &mut position);
        }
        for rank in (0..graph.layers.len().saturating_sub(1)).rev() {
            sort_by_neighbours(graph, rank, false, &mut position);
        }
        let now = crossings(graph, &position);
        if now < fewest {
            fewest = now;
            best = graph.layers.clone();
        }
    }
    graph.layers = best;
}

fn positions(graph: &VirtualGraph) -> Vec<usize> {
    let mut position = vec![0; graph.widths.len()];
    for layer in &graph.layers {
        for (at, &v) in layer.iter().enumerate() {
            position[v] = at;
        }
    }
    position
}

/// Orders `rank` by the mean position of each vertex's neighbours above (or below), as a
/// fraction of their rank's width so ranks of different lengths compare; a vertex without
/// such neighbours keeps its place. The sort is stable, so ties keep their order.
fn sort_by_neighbours(
    graph: &mut VirtualGraph,
    rank: usize,
    from_above: bool,
    position: &mut [usize],
) {
    let neighbour_rank = if from_above { rank - 1 } else { rank + 1 };
    let neighbour_count = graph.layers[neighbour_rank].len() as f64;
    let own_count = graph.layers[rank].len() as f64;
    let neighbours = if from_above { &graph.up } else { &graph.down };
    let mut keyed: Vec<(f64, usize)> = graph.layers[rank]
        .iter()
        .map(|&v| {
            let around = &neighbours[v];
            let key = if around.is_empty() {
                (position[v] as f64 + 0.5) / own_count
            } else {
                let sum: f64 = around
                    .iter()
                    .map(|&n| (position[n] as f64 + 0.5) / neighbour_count)
                    .sum();
                sum / around.len() as f64
            };
            (key, v)
        })
        .collect();
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (at, (_, v)) in keyed.iter().enumerate() {
        position[*v] = at;
        graph.layers[rank][at] = *v;
    }
}

/// How many pairs of segments cross, over all adjacent ranks: for each pair of ranks, the
/// inversions among segments sorted by their upper end (counted with a Fenwick tree).
fn crossings(graph: &VirtualGraph, position: &[usize]) -> usize {
    let mut total = 0;
    for rank in 0..graph.layers.len().saturating_sub(1) {
        let mut segments: Vec<(usize, usize)> = graph.layers[rank]
            .iter()
            .flat_map(|&v| {
                graph.down[v]
                    .iter()
                    .map(move |&w| (position[v], position[w]))
            })
            .collect();
        segments.sort_unstable();
        let mut tree = vec![0_usize; graph.layers[rank + 1].len() + 1];
        for (seen, &(_, lower)) in segments.iter().enumerate() {
            // Segments seen so far whose lower end is right of this one's cross it.
            total += seen - prefix_count(&tree, lower);
            let mut i = lower + 1;
            while i < tree.len() {
                tree[i] += 1;
                i += i & i.wrapping_neg();
            }
        }
    }
    total
}

/// How many recorded lower ends are at `lower` or left of it.
fn prefix_count(tree: &[usize], lower: usize) -> usize {
    let mut sum = 0;
    let mut i = lower + 1;
    while i > 0 {
        sum += tree[i];
        i -= i & i.wrapping_neg();
    }
    sum
}
