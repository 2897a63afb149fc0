//! The executions log the `logged-agent.sh` and `chaos-agent.sh` agents append to: one line
//! `<run> <step> <visit> <attempt> <worker>` per agent execution.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

/// One agent execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    pub run_id: String,
    pub step_id: String,
    pub visit: u32,
    pub attempt: u32,
    pub worker: String,
}

/// Every execution logged under `root` so far, in order.
pub fn read(root: &Path) -> Vec<Execution> {
    let text = std::fs::read_to_string(root.join("executions.log")).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            Some(Execution {
                run_id: fields.next()?.to_owned(),
                step_id: fields.next()?.to_owned(),
                visit: fields.next()?.parse().ok()?,
                attempt: fields.next()?.parse().ok()?,
                worker: fields.next()?.to_owned(),
            })
        })
        .collect()
}

/// Executions per step visit: `(run, step, visit) -> count`.
pub fn per_visit(executions: &[Execution]) -> BTreeMap<(String, String, u32), usize> {
    let mut counts = BTreeMap::new();
    for e in executions {
        *counts
            .entry((e.run_id.clone(), e.step_id.clone(), e.visit))
            .or_default() += 1;
    }
    counts
}

/// How many executions repeated a step visit that had already run (at-least-once delivery).
pub fn duplicated(executions: &[Execution]) -> usize {
    per_visit(executions).values().map(|n| n - 1).sum()
}
