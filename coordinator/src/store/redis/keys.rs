//! The name of every key the store writes, from its prefix `P`: a run's keys each carry the
//! run's hash tag `{<run id>}`; the indexes are global; the timer sets are one per agent on a
//! single server, one per agent and slot on a cluster (`timers.rs` names those). The
//! [module docs](super#layout) say what each one holds.

use super::RedisStore;

/// The keys of one run, each with the run's hash tag.
pub(super) struct RunKeys {
    pub(super) run: String,
    pub(super) events: String,
    pub(super) results: String,
    pub(super) steps: String,
    pub(super) tasks: String,
    pub(super) chain: String,
    pub(super) decisions: String,
    /// The run's live output, a stream.
    pub(super) output: String,
    /// Written before a `WAIT` that makes a read of the run wait for replicas (never read).
    pub(super) barrier: String,
    /// Written by `settle_create` for a run whose create it settled as never done: the create,
    /// should it still come, is refused.
    pub(super) void: String,
}

impl RunKeys {
    /// The run's keys as a script's `KEYS[1]` to `KEYS[8]`, in the order `lua/transition.lua`
    /// names them.
    pub(super) fn names(&self) -> [&str; 8] {
        [
            &self.run,
            &self.events,
            &self.results,
            &self.steps,
            &self.tasks,
            &self.chain,
            &self.decisions,
            &self.output,
        ]
    }

    /// The keys of `create_run`: [`RunKeys::names`], then the void marker as `KEYS[9]`.
    pub(super) fn create_names(&self) -> [&str; 9] {
        let [run, events, results, steps, tasks, chain, decisions, output] = self.names();
        [
            run, events, results, steps, tasks, chain, decisions, output, &self.void,
        ]
    }
}

impl RedisStore {
    /// `P:run:{R}`, the run's header, and the keys named after it. Built by appending rather
    /// than `format!`: every transition names them, and formatting ten keys was a tenth of what
    /// a transition cost the coordinator (issue 20).
    pub(super) fn run_keys(&self, run_id: &str) -> RunKeys {
        let run = [self.prefix.as_str(), ":run:{", run_id, "}"].concat();
        let after = |suffix: &str| {
            let mut key = String::with_capacity(run.len() + suffix.len());
            key.push_str(&run);
            key.push_str(suffix);
            key
        };
        RunKeys {
            events: after(":events"),
            results: after(":results"),
            steps: after(":steps"),
            tasks: after(":tasks"),
            chain: after(":chain"),
            decisions: after(":decisions"),
            output: after(":output"),
            barrier: after(":barrier"),
            void: after(":void"),
            run,
        }
    }

    /// The prefix of the agents' timer sets on a single server: `P:timers:<agent>` (a
    /// cluster's are per slot, see `timers.rs`).
    pub(super) fn timer_prefix(&self) -> String {
        format!("{}:timers:", self.prefix)
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
