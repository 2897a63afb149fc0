//! The coordinator's logic, below the gRPC edge: it takes and returns domain types.
//!
//! Every change to a run follows one path (`change`): lock the run, let the engine compute the
//! transition, turn it into one store write (`plan`, pure), write it atomically, and only then
//! act on it (hand tasks to workers, tell watchers). A crash before the write loses nothing
//! that was acknowledged; a crash after it is repaired by the leases: every task in flight has
//! a timer in the store, and when its holder stops renewing it any coordinator claims it and
//! delivers it again (`leases`).
//!
//! The rooms, each an `impl Coordinator` over the parts of `Inner` it needs:
//! - `config`: sizes, ceilings, lease timings, the clock.
//! - `runs`: the cache of runs this coordinator has loaded, rebuilt and checked from the store.
//! - `change`: the one path of a change; `plan`: a transition as a store write, pure.
//! - `resolve`: writes whose answer was lost, settled (done, or never to be) before anyone is
//!   answered.
//! - `group_commit`: answers to one run that arrive together, settled in one transition.
//! - `tasks`: the coordinator's half of dispatch: tasks built from `Dispatch` actions, handed to
//!   the hub, their workers noted.
//! - `spans`: the spans of attempts and settled steps.
//! - `submit`: new runs, idempotency keys.
//! - `answers`: workers' results and payloads asked for again.
//! - `approvals`: people's decisions and cancels.
//! - `continuations`: runs waiting for their turn to run a step's jq program, least CPU
//!   used first.
//! - `ownership`: who may cancel or retry a run: its owner, or an operator (pure).
//! - `watch`: watch events, their stream, catching up on other coordinators' changes.
//! - `output`: live output, from the worker holding a task to the store to every watcher.
//! - `reads`: the run record and the list of runs.
//! - `inspect`: one step of a run for the web UI: payloads rebuilt by a replay, attempts, memory.
//! - `integrity`: `VerifyRun`, the state chain and the decision index from a fresh read.
//! - `queries`: decisions found by meaning, for clients and for agents mid-step.
//! - `stats`: counters, the profile of transitions, metrics.
//! - `workers`: worker streams connecting, disconnecting, falling silent; shutting down.
//! - `health`: readiness for probes (draining, the store answering).
//! - `leases`: leases, retries, timeouts and the timers that sweep them.

mod answers;
mod approvals;
mod change;
mod config;
mod continuations;
mod group_commit;
mod health;
mod inspect;
mod integrity;
mod leases;
mod output;
mod ownership;
mod plan;
mod queries;
mod reads;
mod resolve;
mod runs;
mod spans;
mod stats;
mod submit;
mod tasks;
mod watch;
mod workers;

use std::sync::Arc;

pub use self::answers::{Answer, Outcome};
pub use self::config::Config;
use self::continuations::Continuations;
pub use self::continuations::Turns;
use self::group_commit::AnswerQueues;
pub use self::health::NotReady;
pub use self::inspect::{ApprovalDetail, AttemptDetail, StepDetail, VisitDetail};
pub use self::integrity::Verification;
use self::leases::LeaseBook;
use self::output::OutputFeed;
pub use self::ownership::{Requester, RunChange, may_change};
pub use self::queries::{DecisionMatches, DecisionQuery, Scope, WorkerQuery};
use self::runs::RunCache;
use self::stats::Counters;
pub use self::stats::Stats;
pub use self::submit::{IDEMPOTENCY_TTL_S, Submission, Submitted, Submitter};
use self::watch::Watchers;
pub use self::watch::{EventStream, RunEvent};
pub use self::workers::WorkerHello;
pub use crate::decisions::StoredDecision;
use crate::embed::{Embedder, HashedNgrams};
use crate::error::Error;
use crate::hub::Hub;
use crate::jq_runs::{Aborts, JqRuns};
use crate::metrics::Metrics;
use crate::store::Store;
use crate::store::timed::Timed;
use crate::traces::Traces;
use crate::workflows::Workflows;

/// A handle on the coordinator; cheap to clone. The one way in.
pub struct Coordinator<S: Store> {
    inner: Arc<Inner<S>>,
}

impl<S: Store> Clone for Coordinator<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<S> {
    /// Every call timed, for `/metrics`.
    store: Timed<S>,
    hub: Hub,
    config: Config,
    embedder: Arc<dyn Embedder>,
    /// Runs this coordinator has loaded. The store is the truth; this saves replaying it.
    runs: RunCache,
    /// Answers waiting to be settled together, per run.
    answers: AnswerQueues,
    /// Who watches which run.
    watchers: Watchers,
    /// Live output on its way to the store, and to the watchers here.
    output: OutputFeed,
    /// The leases this coordinator holds.
    leases: LeaseBook,
    /// What `GetStats` reports besides the metrics.
    counters: Counters,
    /// Counters and histograms for `/metrics` (and `GetStats`).
    metrics: Metrics,
    /// Spans of runs (nothing when traces are off).
    traces: Traces,
    /// The workflows parsed last, by the digest of their text.
    workflows: Workflows,
    /// Runs waiting for their turn to run a step's jq program.
    continuations: Arc<Continuations>,
    /// The jq programs of transitions in progress, to stop on a cancel or a shutdown.
    aborts: Aborts,
}

impl<S: Store> Coordinator<S> {
    /// A coordinator with the built-in (lexical) embedder for decisions.
    pub fn new(store: S, config: Config) -> Self {
        Self::with_embedder(store, config, Arc::new(HashedNgrams::default()))
    }

    /// Inside a Tokio runtime this also starts the coordinator's timers (lease renewals, the
    /// sweep of due tasks, timeouts) and the movers of live output, which stop when the last
    /// handle is dropped.
    pub fn with_embedder(store: S, config: Config, embedder: Arc<dyn Embedder>) -> Self {
        let traces = if config.traces {
            Traces::on(&config.coordinator_id)
        } else {
            Traces::off()
        };
        let metrics = Metrics::default();
        let store = Timed::new(store, metrics.store_observer());
        let coordinator = Self {
            inner: Arc::new(Inner {
                traces,
                workflows: Workflows::new(config.limits.clone()),
                store,
                hub: Hub::default(),
                config,
                embedder,
                runs: RunCache::default(),
                answers: AnswerQueues::default(),
                watchers: Watchers::default(),
                output: OutputFeed::default(),
                leases: LeaseBook::default(),
                counters: Counters::default(),
                metrics,
                continuations: Arc::default(),
                aborts: Aborts::default(),
            }),
        };
        // jq programs run in this process's threads unless a budgeted runner (sandboxes) was
        // installed first, as the `baton` binary does; either way every run's are counted
        // against its budget and recorded.
        baton_core::eval::install_jq_runner(Box::new(JqRuns::in_thread()));
        if tokio::runtime::Handle::try_current().is_ok() {
            let inner = Arc::downgrade(&coordinator.inner);
            for _ in 0..coordinator.inner.config.computations.max(1) {
                tokio::spawn(continuations::run_turns(
                    inner.clone(),
                    coordinator.inner.continuations.clone(),
                ));
            }
            tokio::spawn(leases::run_timers(inner.clone()));
            tokio::spawn(output::run_appender(inner.clone()));
            tokio::spawn(output::run_reader(inner));
        }
        coordinator
    }

    /// This coordinator's id in task leases.
    pub fn id(&self) -> &str {
        &self.inner.config.coordinator_id
    }

    /// The sizes and ceilings the edge checks requests against.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The spans of runs, for the edge's `SubmitRun` span.
    pub fn traces(&self) -> &Traces {
        &self.inner.traces
    }

    pub fn store(&self) -> &S {
        self.inner.store.inner()
    }

    pub fn hub(&self) -> &Hub {
        &self.inner.hub
    }

    fn now_ms(&self) -> i64 {
        self.inner.config.clock.now_ms()
    }

    /// When `sent` went to its worker, in ms since the epoch.
    fn sent_at_ms(&self, sent: &crate::hub::Sent) -> i64 {
        self.now_ms() - i64::try_from(sent.started.elapsed().as_millis()).unwrap_or(i64::MAX)
    }
}

fn json(value: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(value).expect("coordinator records are JSON")
}
