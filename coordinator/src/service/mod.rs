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
    /// A coordinator with the built-in (lexical) embedder for decisions. Only built: nothing
    /// moves on a timer until [`Coordinator::run`].
    pub fn new(store: S, config: Config) -> Self {
        Self::with_embedder(store, config, Arc::new(HashedNgrams::default()))
    }

    /// A coordinator that embeds decisions with `embedder`. Only built: it answers calls at
    /// once, but starts nothing in the background (and needs no Tokio runtime); its timers and
    /// the movers of live output are [`Coordinator::run`]'s.
    ///
    /// It installs the process's jq runner, unless one was installed first: every transition
    /// (a submit's included, with or without `run`) counts a run's jq programs against its
    /// budget and records their outcomes for replays through it.
    pub fn with_embedder(store: S, config: Config, embedder: Arc<dyn Embedder>) -> Self {
        let traces = if config.traces {
            Traces::on(&config.coordinator_id)
        } else {
            Traces::off()
        };
        let metrics = Metrics::default();
        let store = Timed::new(store, metrics.store_observer());
        // jq programs run in this process's threads unless a budgeted runner (sandboxes) was
        // installed first, as the `baton` binary does; either way every run's are counted
        // against its budget and recorded.
        baton_core::eval::install_jq_runner(Box::new(JqRuns::in_thread()));
        Self {
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
        }
    }

    /// Runs the coordinator's background work until `shutdown` completes, and returns once all
    /// of it has stopped. Call it once per coordinator, beside whatever serves it (the gRPC
    /// server, the web UI), for as long as it serves. It owns, each on a task of its own:
    /// - [`Config::computations`] computers, taking runs that wait for their turn to run a
    ///   step's jq program (`continuations`);
    /// - the clock (`leases`): workers fallen silent, timeouts, lease renewals, the sweep of
    ///   due tasks and timers (other coordinators' lost work included), idle runs forgotten,
    ///   free slots advertised, waiting tasks handed to coordinators with room;
    /// - live output's appender (workers' pieces to the store) and reader (the store's pieces
    ///   to the watchers here) (`output`).
    ///
    /// Without it the coordinator still answers every call, but nothing happens on a timer: its
    /// leases are not renewed (other coordinators take its tasks once they run out), nothing
    /// due is swept, no run takes its turn, and live output is neither stored nor followed (an
    /// answer whose task streamed output waits for it to be stored).
    ///
    /// When `shutdown` completes, nothing new starts and what is under way finishes: the clock's
    /// round, a run's turn, a read of live output (at most 250 ms), and the writing of the live
    /// output already queued (what comes after it is dropped, and an answer no longer waits
    /// for it). It does not drain: a coordinator leaving its cluster first calls
    /// [`Coordinator::shutdown`] (as `baton coordinator` does on SIGTERM), which also stops the
    /// clock and leaves the computers no turn to take. Dropping the returned future instead
    /// aborts the tasks where they are, as a crash would.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        let (stop, signal) = tokio::sync::watch::channel(false);
        let signal = StopSignal(signal);
        // Aborted with the set if this future is dropped.
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..self.inner.config.computations.max(1) {
            tasks.spawn(continuations::run_turns(self.clone(), signal.clone()));
        }
        tasks.spawn(leases::run_timers(self.clone(), signal.clone()));
        tasks.spawn(output::run_appender(self.clone(), signal.clone()));
        tasks.spawn(output::run_reader(self.clone(), signal));
        shutdown.await;
        let _ = stop.send(true);
        while let Some(stopped) = tasks.join_next().await {
            if let Err(error) = stopped {
                tracing::error!(%error, "a background task of the coordinator failed");
            }
        }
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

/// What [`Coordinator::run`]'s tasks are told when it is asked to stop.
#[derive(Clone)]
struct StopSignal(tokio::sync::watch::Receiver<bool>);

impl StopSignal {
    /// Whether the stop was given (or `run` is gone): a task checks before it starts anything
    /// new.
    fn given(&self) -> bool {
        *self.0.borrow() || self.0.has_changed().is_err()
    }

    /// Completes once the stop is given (at once if it was), or `run` is gone.
    async fn wait(&mut self) {
        let _ = self.0.wait_for(|given| *given).await;
    }
}

fn json(value: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(value).expect("coordinator records are JSON")
}
