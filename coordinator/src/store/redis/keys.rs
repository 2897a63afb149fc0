//! The name of every key the store writes, from its prefix `P`: a run's keys each carry the
//! run's hash tag `{<run id>}`; the indexes are global; the timer sets are one per agent on a
//! single server, one per agent and slot on a cluster (`timers.rs` names those). The
//! [module docs](super#layout) say what each one holds.

use super::RedisStore;

/// The keys of one run, each with the run's hash tag: `P:run:{R}` and the keys named after it,
/// one after another in one string (every transition and read names them: ten strings each
/// were a tenth of a transition's allocations).
pub(super) struct RunKeys {
    text: String,
    /// Where each key ends in `text`, in the order of [`SUFFIXES`] after the header's.
    ends: [usize; 10],
}

/// What follows `P:run:{R}` in each of the run's other keys, in the order `RunKeys` keeps them:
/// the events, results, steps, tasks, chain, decisions, live output (a stream), the barrier
/// (written before a `WAIT` that makes a read of the run wait for replicas; never read) and the
/// void marker (written by `settle_create` for a run whose create it settled as never done: the
/// create, should it still come, is refused).
const SUFFIXES: [&str; 9] = [
    ":events",
    ":results",
    ":steps",
    ":tasks",
    ":chain",
    ":decisions",
    ":output",
    ":barrier",
    ":void",
];

impl RunKeys {
    fn new(prefix: &str, run_id: &str) -> Self {
        let run = [prefix, ":run:{", run_id, "}"];
        let run_len: usize = run.iter().map(|part| part.len()).sum();
        let suffixes: usize = SUFFIXES.iter().map(|suffix| suffix.len()).sum();
        let mut text = String::with_capacity(run_len * (1 + SUFFIXES.len()) + suffixes);
        run.iter().for_each(|part| text.push_str(part));
        let mut ends = [run_len; 10];
        for (n, suffix) in SUFFIXES.iter().enumerate() {
            text.extend_from_within(..run_len);
            text.push_str(suffix);
            ends[n + 1] = text.len();
        }
        RunKeys { text, ends }
    }

    fn key(&self, n: usize) -> &str {
        let start = if n == 0 { 0 } else { self.ends[n - 1] };
        &self.text[start..self.ends[n]]
    }

    pub(super) fn run(&self) -> &str {
        self.key(0)
    }
    pub(super) fn events(&self) -> &str {
        self.key(1)
    }
    pub(super) fn results(&self) -> &str {
        self.key(2)
    }
    pub(super) fn steps(&self) -> &str {
        self.key(3)
    }
    pub(super) fn tasks(&self) -> &str {
        self.key(4)
    }
    pub(super) fn chain(&self) -> &str {
        self.key(5)
    }
    pub(super) fn decisions(&self) -> &str {
        self.key(6)
    }
    pub(super) fn output(&self) -> &str {
        self.key(7)
    }
    pub(super) fn barrier(&self) -> &str {
        self.key(8)
    }
    pub(super) fn void(&self) -> &str {
        self.key(9)
    }

    /// The run's keys as a script's `KEYS[1]` to `KEYS[8]`, in the order `lua/transition.lua`
    /// names them.
    pub(super) fn names(&self) -> [&str; 8] {
        std::array::from_fn(|n| self.key(n))
    }

    /// The keys of `create_run`: [`RunKeys::names`], then the void marker as `KEYS[9]`.
    pub(super) fn create_names(&self) -> [&str; 9] {
        let [run, events, results, steps, tasks, chain, decisions, output] = self.names();
        [
            run,
            events,
            results,
            steps,
            tasks,
            chain,
            decisions,
            output,
            self.void(),
        ]
    }
}

impl RedisStore {
    /// `P:run:{R}`, the run's header, and the keys named after it, in one string.
    pub(super) fn run_keys(&self, run_id: &str) -> RunKeys {
        RunKeys::new(&self.prefix, run_id)
    }

    /// The prefix of the agents' timer sets on a single server: `P:timers:<agent>` (a
    /// cluster's are per slot, see `timers.rs`).
    pub(super) fn timer_prefix(&self) -> &str {
        &self.timer_prefix
    }

    /// `P:runs`: every run by creation time; on a cluster, the shard of it that holds
    /// `run_id` (`indexes.rs`).
    pub(super) fn runs_key(&self, run_id: &str) -> String {
        format!("{}:runs{}", self.prefix, self.index_shard(run_id))
    }

    /// Every shard of `P:runs`: the one key on a single server.
    pub(super) fn runs_keys(&self) -> Vec<String> {
        self.index_shards()
            .map(|shard| format!("{}:runs{shard}", self.prefix))
            .collect()
    }

    /// `P:workflow:<workflow id>:runs`: the runs of one workflow by creation time; on a
    /// cluster, the shard of it that holds `run_id`.
    pub(super) fn workflow_runs_key(&self, workflow_id: &str, run_id: &str) -> String {
        format!(
            "{}:workflow:{workflow_id}:runs{}",
            self.prefix,
            self.index_shard(run_id)
        )
    }

    /// Every shard of `P:workflow:<workflow id>:runs`.
    pub(super) fn workflow_runs_keys(&self, workflow_id: &str) -> Vec<String> {
        self.index_shards()
            .map(|shard| format!("{}:workflow:{workflow_id}:runs{shard}", self.prefix))
            .collect()
    }

    /// `P:runs:active`: the runs whose status is `running`; on a cluster, the shard of it that
    /// holds `run_id`.
    pub(super) fn active_key(&self, run_id: &str) -> String {
        format!("{}:runs:active{}", self.prefix, self.index_shard(run_id))
    }

    /// Every shard of `P:runs:active`.
    pub(super) fn active_keys(&self) -> Vec<String> {
        self.index_shards()
            .map(|shard| format!("{}:runs:active{shard}", self.prefix))
            .collect()
    }

    /// `P:slots`: each coordinator's advertisement of its workers' free slots (field: its id;
    /// value: `{"expires_ms", "free": {agent: slots}}`).
    pub(super) fn slots_key(&self) -> String {
        format!("{}:slots", self.prefix)
    }

    /// The timer set of `agent`: `P:timers:<agent>`.
    pub(super) fn agent_timers_key(&self, agent: &str) -> String {
        format!("{}{agent}", self.timer_prefix())
    }

    /// What `lua/due_tasks.lua` puts `{<run id>}:tasks` after to name a run's tasks: `P:run:`.
    pub(super) fn run_key_prefix(&self) -> String {
        format!("{}:run:", self.prefix)
    }

    /// `P:principal:<name>:runs`: the runs a principal with a `max_running_runs` submitted
    /// that were running when last counted.
    pub(super) fn principal_runs_key(&self, principal: &str) -> String {
        format!("{}:principal:{principal}:runs", self.prefix)
    }

    /// `P:ready:{<slot tag>}`: the key a readiness probe writes on `slot`'s master (one key on
    /// a single server, whose slot is none).
    pub(super) fn probe_key(&self, slot: Option<u16>) -> String {
        match slot {
            Some(slot) => format!(
                "{}:ready:{{{}}}",
                self.prefix,
                super::slots::tag_of_slot(slot)
            ),
            None => format!("{}:ready", self.prefix),
        }
    }

    /// The key that holds a claim of the idempotency key `key`.
    pub(super) fn idempotency_key(&self, key: &str) -> String {
        format!("{}:idempotency:{key}", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::RunKeys;

    #[test]
    fn a_run_keys_are_named_after_its_header_with_its_hash_tag() {
        let keys = RunKeys::new("baton", "r-1");
        assert_eq!(
            keys.create_names(),
            [
                "baton:run:{r-1}",
                "baton:run:{r-1}:events",
                "baton:run:{r-1}:results",
                "baton:run:{r-1}:steps",
                "baton:run:{r-1}:tasks",
                "baton:run:{r-1}:chain",
                "baton:run:{r-1}:decisions",
                "baton:run:{r-1}:output",
                "baton:run:{r-1}:void",
            ]
        );
        assert_eq!(
            (keys.run(), keys.tasks(), keys.barrier(), keys.void()),
            (
                "baton:run:{r-1}",
                "baton:run:{r-1}:tasks",
                "baton:run:{r-1}:barrier",
                "baton:run:{r-1}:void"
            )
        );
        assert_eq!(keys.names(), keys.create_names()[..8]);
    }
}
