//! Which edges are loops, and each member's rank.

use std::collections::VecDeque;

use super::Link;

/// What ranking found.
#[derive(Debug)]
pub(super) struct Ranking {
    /// Per member: its rank, from 0 at the top. Every rank up to the highest holds a member.
    pub rank: Vec<usize>,
    /// Per link: whether it closes a loop (goes to a member at the same rank or above).
    pub back: Vec<bool>,
    /// Per member: when the walk first reached it; the first guess at the order in a rank.
    pub preorder: Vec<usize>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Visit {
    New,
    Open,
    Done,
}

/// Walks depth first from the entry (member 0), then from each member it did not reach, in
/// order, following links in order; a link to a member still open on the walk is a loop. What
/// remains has no cycle, so longest paths are defined: a member's rank is the longest path to
/// it from a member nothing leads to, which puts every remaining link strictly downward and
/// gives members the entry does not reach a rank too.
pub(super) fn rank(count: usize, links: &[Link]) -> Ranking {
    let mut outgoing: Vec<Vec<usize>> = vec![Vec::new(); count];
    for (index, link) in links.iter().enumerate() {
        outgoing[link.from].push(index);
    }
    let mut visit = vec![Visit::New; count];
    let mut back = vec![false; links.len()];
    let mut preorder = vec![0; count];
    let mut reached = 0;
    for root in 0..count {
        if visit[root] != Visit::New {
            continue;
        }
        visit[root] = Visit::Open;
        preorder[root] = reached;
        reached += 1;
        // Each open member with how many of its links were followed.
        let mut stack = vec![(root, 0)];
        while let Some((member, followed)) = stack.last_mut() {
            let Some(&link) = outgoing[*member].get(*followed) else {
                visit[*member] = Visit::Done;
                stack.pop();
                continue;
            };
            *followed += 1;
            let target = links[link].to;
            match visit[target] {
                Visit::New => {
                    visit[target] = Visit::Open;
                    preorder[target] = reached;
                    reached += 1;
                    stack.push((target, 0));
                }
                Visit::Open => back[link] = true,
                Visit::Done => {}
            }
        }
    }
    let mut waiting_for = vec![0_usize; count];
    for (link, _) in links.iter().zip(&back).filter(|(_, back)| !**back) {
        waiting_for[link.to] += 1;
    }
    let mut rank = vec![0; count];
    let mut ready: VecDeque<usize> = (0..count).filter(|&m| waiting_for[m] == 0).collect();
    while let Some(member) = ready.pop_front() {
        for &link in &outgoing[member] {
            if back[link] {
                continue;
            }
            let target = links[link].to;
            rank[target] = rank[target].max(rank[member] + 1);
            waiting_for[target] -= 1;
            if waiting_for[target] == 0 {
                ready.push_back(target);
            }
        }
    }
    Ranking {
        rank,
        back,
        preorder,
    }
}
