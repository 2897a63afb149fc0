//! The coordinator's logic, below the gRPC edge: submit, decide, cancel, complete tasks, watch.
//!
//! Every change to a run follows one path: lock the run, let the engine compute the transition,
//! write it to the store in one atomic call, and only then act on it (hand tasks to workers,
//! tell watchers). A crash before the write loses nothing that was acknowledged; a crash after
//! it is repaired by the leases: every task in flight has a timer in the store, and when its
//! holder stops renewing it any coordinator claims it and delivers it again
//! ([`leases`](self::leases)).

mod leases;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use baton_core::handoff::{AgentNotes, DecisionRecord};
use baton_core::integrity::{ChainLink, genesis};
use baton_core::workflow::StepType;
use baton_core::{
    Action, Decision, EngineError, Event, Limits, Run, StepRecord, TaskId, Transition,
};
use baton_proto::Json;
use baton_proto::v1::{self, run_event};
use opentelemetry::KeyValue;
use opentelemetry::global::BoxedSpan;
use opentelemetry::trace::{Span as _, Status as OtelStatus};
use serde_json::Value;
use tokio::sync::{Mutex as AsyncMutex, broadcast};
use tracing::Instrument as _;

use crate::chain::{self, Mismatch};
use crate::decisions::{self, Embedded, StoredDecision};
use crate::embed::{Embedder, HashedNgrams};
use crate::error::Error;
use crate::hub::{Assignment, Hub, ReadyTask, Sent};
use crate::lease;
use crate::model::{
    LoggedEvent, StepState, StoredEvent, TaskEntry, parse_task_id, task_id, task_key,
};
use crate::parts::PartEncoder;
use crate::record;
use crate::store::timed::Timed;
use crate::store::{self, Claim, RunHeader, Store, StoredRun, TransitionWrite};
use crate::traces::{self, AttemptSpan, RunSpan, SettledSpan, StepSpan, TaskTrace, Traces};

/// Sizes clients and workers control, and their ceilings.
#[derive(Debug, Clone)]
pub struct Config {
    pub max_workflow_bytes: usize,
    pub max_input_bytes: usize,
    pub max_result_bytes: usize,
    /// How deep a run input or an agent result may nest. A payload nests data two levels
    /// deeper, and parsers commonly stop at 128 (serde_json among them), so every agent can
    /// still read its payload.
    pub max_data_depth: usize,
    /// How many decisions one result may carry (each is embedded and stored).
    pub max_decisions_per_result: usize,
    /// How many messages one result may carry (every later payload carries the history).
    pub max_messages_per_result: usize,
    /// How long a decision's summary and rationale may be, in bytes.
    pub max_decision_summary_bytes: usize,
    pub max_decision_rationale_bytes: usize,
    /// How many artifacts one decision may name (each as long as a summary at most).
    pub max_related_artifacts: usize,
    /// How many stored decisions one query ranks at most (a workflow-wide query stops reading
    /// older runs there).
    pub max_query_decisions: usize,
    /// How long a decision query's text may be, in bytes.
    pub max_query_bytes: usize,
    /// How long a SubmitRun idempotency key may be, in bytes.
    pub max_idempotency_key_bytes: usize,
    /// How many runs a workflow-wide decision query reads, newest first.
    pub max_query_runs: usize,
    pub limits: Limits,
    /// This coordinator's name in task leases; unique among the coordinators of one store.
    pub coordinator_id: String,
    /// How long a lease lasts without renewal: how long the tasks of a coordinator that died
    /// wait before another one delivers them again. Renewed every third of it.
    pub lease_ms: u64,
    /// How often due timers (expired leases, retries whose backoff is over) are swept, and
    /// timeouts and silent workers checked.
    pub sweep_interval_ms: u64,
    /// A worker that says nothing (not even a heartbeat) for this long is taken for dead: its
    /// stream is closed and its tasks delivered again.
    pub worker_silence_ms: u64,
    /// How many times a task may be lost with its worker or coordinator before its step fails.
    pub max_lost_deliveries: u32,
    /// Build OpenTelemetry spans of runs, through the global tracer provider (which should use
    /// [`crate::traces::SpanIds`]). Off, nothing is spent on them.
    pub traces: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_workflow_bytes: 1 << 20,
            max_input_bytes: 4 << 20,
            max_result_bytes: 64 << 20,
            max_data_depth: 100,
            max_decisions_per_result: 100,
            max_messages_per_result: 1_000,
            max_decision_summary_bytes: 2 << 10,
            max_decision_rationale_bytes: 16 << 10,
            max_related_artifacts: 64,
            max_query_decisions: 10_000,
            max_query_bytes: 8 << 10,
            max_query_runs: 1_000,
            max_idempotency_key_bytes: 256,
            limits: Limits::default(),
            coordinator_id: default_coordinator_id(),
            lease_ms: 10_000,
            sweep_interval_ms: 200,
            worker_silence_ms: 5_000,
            max_lost_deliveries: 10,
            traces: false,
        }
    }
}

/// `<host>-<pid>-<random>`: unique even when a restarted pod gets the same host name and pid.
fn default_coordinator_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "coordinator".into());
    let random = uuid::Uuid::now_v7().simple().to_string();
    format!(
        "{host}-{}-{}",
        std::process::id(),
        &random[random.len() - 8..]
    )
}

/// How long an idempotency key names its run: a client retrying within a day gets the same run.
pub const IDEMPOTENCY_TTL_S: u64 = 24 * 60 * 60;

/// The run a submission started, or found under its idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    pub run_id: String,
    /// The key already named this run: nothing new was started.
    pub existing: bool,
}

/// What makes two submissions the same request: the workflow text and the input bytes.
fn workflow_bytes_digest_input(workflow: &str, input: &[u8]) -> String {
    let mut bytes = Vec::with_capacity(workflow.len() + input.len() + 1);
    bytes.extend_from_slice(workflow.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(input);
    baton_proto::sha256_hex(&bytes)
}

/// A handle on the coordinator; cheap to clone.
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
    runs: std::sync::Mutex<HashMap<String, Arc<AsyncMutex<Option<Loaded>>>>>,
    watchers: std::sync::Mutex<HashMap<String, broadcast::Sender<v1::RunEvent>>>,
    /// Transitions written to the store since start.
    transitions: AtomicU64,
    /// Counters and histograms for `/metrics` (and `GetStats`).
    metrics: crate::metrics::Metrics,
    /// What has been counted: `<run id> <problem>`, so that reading the same broken run again
    /// (a finished run is read back for every GetRun) does not count it again.
    integrity_seen: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Payloads a worker asked to be sent again.
    resends: AtomicU64,
    /// Where transitions spend their time, for `baton bench`'s profile.
    profile: Profile,
    /// The tasks this coordinator holds the lease of, as last written to the store: what the
    /// renewals compare against.
    held: std::sync::Mutex<HashMap<(String, String), TaskEntry>>,
    /// Shutting down: no more claims.
    stopping: std::sync::atomic::AtomicBool,
    /// Held while a lease is read and written (renewals, claims, retries, takeovers), so that
    /// two of this coordinator's own lease writes never race each other's compare-and-swap.
    lease_writes: AsyncMutex<()>,
    /// Spans of runs (nothing when traces are off).
    traces: Traces,
}

/// Microseconds spent in each phase of a transition, summed.
#[derive(Default)]
struct Profile {
    engine_us: AtomicU64,
    plan_us: AtomicU64,
    store_us: AtomicU64,
    act_us: AtomicU64,
}

fn add_elapsed(counter: &AtomicU64, since: std::time::Instant) -> std::time::Instant {
    let now = std::time::Instant::now();
    counter.fetch_add((now - since).as_micros() as u64, Ordering::Relaxed);
    now
}

/// A run as the coordinator holds it between transitions.
struct Loaded {
    header: RunHeader,
    run: Run,
    version: u64,
    steps: BTreeMap<String, StepState>,
    tasks: BTreeMap<String, TaskEntry>,
    updated_ms: i64,
    /// The head of the run's state chain.
    state_sha256: String,
    /// For a finished run whose stored data no longer matches its chain: the status the store
    /// records, which the record keeps (with the integrity error) since nothing stored changes.
    finished_as: Option<String>,
    /// The encoded parts of this run's payloads.
    parts: PartEncoder,
    /// For each step visit the last transition settled, in history order: when it started and,
    /// for a branch, its parallel step's visit (for its span).
    settled: Vec<SettledTiming>,
}

/// When a settled step visit started, as its span needs it.
#[derive(Debug, Clone, Copy)]
struct SettledTiming {
    started_ms: i64,
    /// The visit of the parallel step a branch belongs to.
    parallel_visit: Option<u32>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

fn json(value: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(value).expect("coordinator records are JSON")
}

impl<S: Store> Coordinator<S> {
    /// A coordinator with the built-in (lexical) embedder for decisions.
    pub fn new(store: S, config: Config) -> Self {
        Self::with_embedder(store, config, Arc::new(HashedNgrams::default()))
    }

    /// Inside a Tokio runtime this also starts the coordinator's timers (lease renewals, the
    /// sweep of due tasks, timeouts), which stop when the last handle is dropped.
    pub fn with_embedder(store: S, config: Config, embedder: Arc<dyn Embedder>) -> Self {
        let traces = if config.traces {
            Traces::on(&config.coordinator_id)
        } else {
            Traces::off()
        };
        let metrics = crate::metrics::Metrics::default();
        let store = Timed::new(store, metrics.store_observer());
        let coordinator = Self {
            inner: Arc::new(Inner {
                traces,
                store,
                hub: Hub::default(),
                config,
                embedder,
                runs: Default::default(),
                watchers: Default::default(),
                transitions: AtomicU64::new(0),
                metrics,
                integrity_seen: Default::default(),
                resends: AtomicU64::new(0),
                profile: Profile::default(),
                held: Default::default(),
                stopping: Default::default(),
                lease_writes: AsyncMutex::new(()),
            }),
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(leases::run_timers(Arc::downgrade(&coordinator.inner)));
        }
        coordinator
    }

    /// This coordinator's id in task leases.
    pub fn id(&self) -> &str {
        &self.inner.config.coordinator_id
    }

    pub fn store(&self) -> &S {
        self.inner.store.inner()
    }

    pub fn hub(&self) -> &Hub {
        &self.inner.hub
    }

    /// Validates the workflow and input, stores the new run and starts it. Returns its id.
    pub async fn submit(&self, workflow: &[u8], input: &Json) -> Result<String, Error> {
        Ok(self.submit_once(workflow, input, None).await?.run_id)
    }

    /// [`Coordinator::submit`] with an idempotency key: the first submission with a key starts
    /// a run, and the same request with the same key (a client's retry, within a day) gets
    /// that run back instead of a second one. The same key with another workflow or input is
    /// refused, naming the run it belongs to.
    pub async fn submit_once(
        &self,
        workflow: &[u8],
        input: &Json,
        idempotency_key: Option<&str>,
    ) -> Result<Submitted, Error> {
        self.submit_traced(workflow, input, idempotency_key, "")
            .await
    }

    /// [`Coordinator::submit_once`] in the caller's trace: `traceparent` (W3C, may be empty)
    /// is the parent of the run's `SubmitRun` span, whose context is stored with the run.
    pub async fn submit_traced(
        &self,
        workflow: &[u8],
        input: &Json,
        idempotency_key: Option<&str>,
        traceparent: &str,
    ) -> Result<Submitted, Error> {
        let mut span = self.inner.traces.submit(traceparent);
        // Untraced here, a run still belongs to its caller's trace.
        let run_traceparent = match &span {
            Some(span) => traces::format_traceparent(span.span_context()),
            None if traces::parse_traceparent(traceparent).is_some() => traceparent.to_owned(),
            None => String::new(),
        };
        let submitted = self
            .submit_in_trace(workflow, input, idempotency_key, run_traceparent, &mut span)
            .await;
        if let Some(mut span) = span {
            match &submitted {
                Ok(submitted) => {
                    span.set_attribute(KeyValue::new(
                        traces::attribute::RUN_ID,
                        submitted.run_id.clone(),
                    ));
                    span.set_attribute(KeyValue::new("baton.run.existing", submitted.existing));
                }
                Err(error) => span.set_status(OtelStatus::error(error.to_string())),
            }
            span.end();
        }
        submitted
    }

    async fn submit_in_trace(
        &self,
        workflow: &[u8],
        input: &Json,
        idempotency_key: Option<&str>,
        traceparent: String,
        span: &mut Option<BoxedSpan>,
    ) -> Result<Submitted, Error> {
        let config = &self.inner.config;
        if let Some(key) = idempotency_key
            && (key.is_empty() || key.len() > config.max_idempotency_key_bytes)
        {
            return Err(Error::InvalidInput(format!(
                "idempotency_key: {} bytes; it must have 1 to {}",
                key.len(),
                config.max_idempotency_key_bytes
            )));
        }
        if workflow.len() > config.max_workflow_bytes {
            return Err(Error::TooLarge {
                what: "the workflow",
                size: workflow.len(),
                limit: config.max_workflow_bytes,
            });
        }
        if input.json.len() > config.max_input_bytes {
            return Err(Error::TooLarge {
                what: "the input",
                size: input.json.len(),
                limit: config.max_input_bytes,
            });
        }
        let input_bytes = input.verified()?;
        let input_value: Value = serde_json::from_slice(input_bytes)
            .map_err(|e| Error::InvalidInput(format!("the input is not valid JSON: {e}")))?;
        self.check_depth("the input", &input_value)?;
        let text = std::str::from_utf8(workflow).map_err(|_| {
            Error::InvalidWorkflow(baton_core::Diagnostics(vec![
                baton_core::Diagnostic::error("$", None, "the workflow is not UTF-8 text"),
            ]))
        })?;
        let parsed = baton_core::parse_workflow_with(text, &config.limits)
            .map_err(|e| Error::InvalidWorkflow(e.diagnostics))?;
        let workflow = Arc::new(parsed.workflow);
        if let (Some(span), Some(id)) = (span.as_mut(), &workflow.id) {
            span.set_attribute(KeyValue::new(traces::attribute::WORKFLOW_ID, id.clone()));
        }
        let mut run_id = uuid::Uuid::now_v7().to_string();
        if let Some(key) = idempotency_key {
            let request = workflow_bytes_digest_input(text, input_bytes);
            match self
                .inner
                .store
                .claim_idempotency_key(key, &run_id, &request, IDEMPOTENCY_TTL_S)
                .await?
            {
                Claim::Claimed => {}
                Claim::Held {
                    run_id: held,
                    request_sha256,
                } if request_sha256 != request => {
                    return Err(Error::IdempotencyConflict {
                        key: key.to_owned(),
                        run_id: held,
                    });
                }
                Claim::Held { run_id: held, .. } => {
                    if self.inner.store.load_run(&held).await?.is_some() {
                        return Ok(Submitted {
                            run_id: held,
                            existing: true,
                        });
                    }
                    // Claimed, but its run was never created (the submitter died in between,
                    // or is creating it now): create it under the id the key names.
                    run_id = held;
                }
            }
        }
        let now = now_ms();
        let chain_start = genesis(&run_id, text, &input_value);
        let header = RunHeader {
            run_id: run_id.clone(),
            workflow_id: workflow.id.clone().unwrap_or_default(),
            workflow: text.to_owned(),
            input: input_bytes.to_vec(),
            created_ms: now,
            traceparent,
        };
        let transition = Run::start(workflow, input_value);
        let mut loaded = Loaded {
            header: header.clone(),
            run: transition.run.clone(),
            version: 0,
            steps: BTreeMap::new(),
            tasks: BTreeMap::new(),
            updated_ms: now,
            state_sha256: chain_start,
            finished_as: None,
            parts: PartEncoder::default(),
            settled: Vec::new(),
        };
        let planned = plan(
            &loaded,
            None,
            None,
            &transition,
            0,
            now,
            None,
            &self.holder(),
        );
        let created = self
            .inner
            .store
            .create_run(header, planned.write.clone())
            .await;
        match created {
            Ok(()) => {}
            // Another submission with the same idempotency key created it first.
            Err(store::Error::AlreadyExists(_)) if idempotency_key.is_some() => {
                return Ok(Submitted {
                    run_id,
                    existing: true,
                });
            }
            Err(error) => return Err(error.into()),
        }
        let held = self.held_change(&planned);
        loaded.adopt(transition.run.clone(), 1, planned);
        let slot = Arc::new(AsyncMutex::new(None));
        let mut guard = slot.lock().await;
        self.inner
            .runs
            .lock()
            .expect("runs lock")
            .insert(run_id.clone(), slot.clone());
        let assignments = self.act(&run_id, &mut loaded, &transition, 0);
        self.note_held(&run_id, held);
        self.inner.metrics.run_started();
        let finished = loaded.run.status().is_terminal();
        *guard = Some(loaded);
        drop(guard);
        if finished {
            self.evict(&run_id);
        }
        self.assigned(assignments).await;
        Ok(Submitted {
            run_id,
            existing: false,
        })
    }

    /// A person decided an approval step.
    pub async fn decide(
        &self,
        run_id: &str,
        step_id: &str,
        decision: Decision,
    ) -> Result<v1::RunRecord, Error> {
        let event = Event::ApprovalDecided {
            step_id: step_id.to_owned(),
            decision: decision.clone(),
        };
        let stored = StoredEvent::ApprovalDecided {
            step_id: step_id.to_owned(),
            decision,
        };
        let record = self
            .apply(run_id, event, stored, None, true, None)
            .await
            .map_err(|e| match e {
                Error::NotAwaitingApproval { .. } => Error::NotAwaitingApproval {
                    run_id: run_id.to_owned(),
                    step_id: step_id.to_owned(),
                },
                other => other,
            })?;
        Ok(record.expect("asked for"))
    }

    /// Stops a run now; tasks queued or running for it are dropped.
    pub async fn cancel(&self, run_id: &str, reason: &str) -> Result<v1::RunRecord, Error> {
        let reason = if reason.is_empty() {
            "cancelled"
        } else {
            reason
        };
        let event = Event::Cancel {
            reason: reason.to_owned(),
        };
        let stored = StoredEvent::Cancel {
            reason: reason.to_owned(),
        };
        let record = self.apply(run_id, event, stored, None, true, None).await?;
        Ok(record.expect("asked for"))
    }

    /// A worker's result for a task it holds, at the attempt it holds. An error goes through
    /// the step's retry policy; data settles the step, fenced by the attempt.
    pub async fn complete(&self, worker_id: &str, result: v1::TaskResult) -> Result<(), Error> {
        // Log lines about the answer name its trace and span, once known.
        let logs = tracing::info_span!(
            "task",
            task_id = %result.task_id,
            trace_id = tracing::field::Empty,
            span_id = tracing::field::Empty,
        );
        self.complete_answer(worker_id, result)
            .instrument(logs)
            .await
    }

    async fn complete_answer(&self, worker_id: &str, result: v1::TaskResult) -> Result<(), Error> {
        let (run_id, task, attempt) = parse_task_id(&result.task_id)
            .ok_or_else(|| Error::MalformedTaskId(result.task_id.clone()))?;
        let key = task_key(&task);
        if !self.inner.hub.holds(worker_id, run_id, &key, attempt) {
            // Counted as fenced: most often the answer of an attempt that was given to another
            // worker after this one was taken for lost.
            self.inner.metrics.fenced.inc();
            return Err(Error::TaskNotHeld {
                worker_id: worker_id.to_owned(),
                task_id: result.task_id.clone(),
            });
        }
        let sent = self.inner.hub.sent(worker_id, run_id, &key);
        if let Some(sent) = &sent {
            self.inner
                .metrics
                .task_answered(&sent.agent, sent.started.elapsed());
        }
        let trace = sent.as_ref().and_then(|sent| sent.trace.clone());
        if let Some(trace) = &trace
            && let Some((trace_id, span_id)) =
                traces::attempt_ids(&trace.run_traceparent, &result.task_id)
        {
            let logs = tracing::Span::current();
            logs.record("trace_id", trace_id);
            logs.record("span_id", span_id);
        }
        // Read before the outcome changes the entry.
        let lost_before = match &trace {
            Some(_) => self.held_entry(run_id, &key).map_or(0, |entry| entry.lost),
            None => 0,
        };
        let persisting = SystemTime::now();
        // A result that cannot be taken as data still settles its task: the step fails with
        // the reason (or is retried), instead of waiting for an answer that will never come.
        let (outcome, refusal) = match self.read_outcome(result.outcome, result.notes) {
            Ok(outcome) => (outcome, None),
            Err(refused) => (
                Err(format!("the agent's result was refused: {refused}")),
                Some(refused),
            ),
        };
        let applied = match outcome {
            Ok((data, notes)) => {
                let embedded = self.embed_decisions(&notes).await;
                let event = Event::AgentSucceeded {
                    task: task.clone(),
                    data,
                    notes: notes.clone(),
                };
                let stored = StoredEvent::AgentSucceeded {
                    task: task.clone(),
                    result: key.clone(),
                    worker_id: worker_id.to_owned(),
                    notes,
                };
                self.apply_patiently(
                    run_id,
                    event,
                    stored,
                    Some((worker_id, &task, attempt)),
                    embedded.as_ref(),
                )
                .await
                .map(|()| (None, None))
            }
            Err(error) => {
                let retryable = !result.non_retryable;
                self.fail_attempt(run_id, &task, attempt, worker_id, error.clone(), retryable)
                    .await
                    .map(|retry_after_ms| (Some(error), retry_after_ms))
            }
        };
        if let (Some(sent), Ok((error, retry_after_ms))) = (&sent, &applied) {
            self.trace_attempt(&Answered {
                worker_id,
                attempt,
                sent,
                persisting,
                error: error.as_deref(),
                retry_after_ms: *retry_after_ms,
                lost_before,
                abandoned: None,
            });
        }
        let applied = applied.map(|_| ());
        let assignments = match &applied {
            // Not recorded: the task goes back to the queue rather than being lost.
            Err(Error::Store(store::Error::Unavailable(_))) => {
                self.inner.hub.requeue(worker_id, run_id, &key)
            }
            // Recorded, or refused (a stale answer): either way this worker is done with it.
            _ => self
                .inner
                .hub
                .finish(worker_id, run_id, &key)
                .unwrap_or_default(),
        };
        self.assigned(assignments).await;
        match (applied, refusal) {
            (Err(Error::RunFinished { .. }), _) => Ok(()),
            (Err(error), _) => Err(error),
            (Ok(()), Some(refused)) => Err(refused),
            (Ok(()), None) => Ok(()),
        }
    }

    /// Writes the span of an attempt whose outcome (an answer, a timeout, its worker lost) was
    /// just recorded.
    fn trace_attempt(&self, answered: &Answered<'_>) {
        let Some(trace) = &answered.sent.trace else {
            return;
        };
        let span = AttemptSpan {
            attempt: answered.attempt,
            worker_id: answered.worker_id,
            ready_at: traces::wall_clock(answered.sent.ready_at),
            dispatched_at: traces::wall_clock(answered.sent.started),
            persisted: (answered.persisting, SystemTime::now()),
            error: answered.error,
            retry_after_ms: answered.retry_after_ms,
            lost_before: answered.lost_before,
            abandoned: answered.abandoned,
        };
        self.inner.traces.attempt(trace, &span);
    }

    /// [`Coordinator::apply`] for a worker's answer: a store that is briefly unreachable (Redis
    /// restarting) is waited out for a while rather than losing the answer, which is safe since
    /// the write is fenced by the run's version and the task's attempt. A superseded attempt is
    /// counted and refused.
    async fn apply_patiently(
        &self,
        run_id: &str,
        event: Event,
        stored: StoredEvent,
        from_worker: Option<(&str, &TaskId, u32)>,
        embedded: Option<&Embedded>,
    ) -> Result<(), Error> {
        let mut wait = std::time::Duration::from_millis(50);
        let give_up = std::time::Instant::now() + leases::STORE_PATIENCE;
        loop {
            let applied = self
                .apply(
                    run_id,
                    event.clone(),
                    stored.clone(),
                    from_worker,
                    false,
                    embedded,
                )
                .await;
            match applied {
                Err(Error::Store(store::Error::Unavailable(reason)))
                    if std::time::Instant::now() < give_up =>
                {
                    tracing::warn!(run_id, %reason, "store unavailable; the answer waits");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(std::time::Duration::from_secs(1));
                }
                Err(Error::Store(store::Error::Fenced {
                    task_key,
                    attempt,
                    current,
                    ..
                })) => {
                    self.inner.metrics.fenced.inc();
                    self.forget_held(run_id, &task_key);
                    return Err(Error::Superseded {
                        task_id: format!("{run_id}/{task_key}@{attempt}"),
                        attempt,
                        current,
                    });
                }
                other => return other.map(|_| ()),
            }
        }
    }

    /// The data and notes of an outcome, the agent's error, or why the result cannot be
    /// accepted.
    fn read_outcome(
        &self,
        outcome: Option<v1::task_result::Outcome>,
        notes: Option<Json>,
    ) -> Result<Result<(Value, AgentNotes), String>, Error> {
        match outcome {
            Some(v1::task_result::Outcome::Data(data)) => {
                let config = &self.inner.config;
                let limit = config.max_result_bytes;
                let size = data.json.len() + notes.as_ref().map_or(0, |n| n.json.len());
                if size > limit {
                    return Err(Error::TooLarge {
                        what: "the result (data and notes)",
                        size,
                        limit,
                    });
                }
                let bytes = data.verified()?;
                let value: Value = serde_json::from_slice(bytes).map_err(|e| {
                    Error::InvalidInput(format!("the result is not valid JSON: {e}"))
                })?;
                self.check_depth("the result", &value)?;
                let notes = match &notes {
                    None => AgentNotes::default(),
                    Some(notes) => {
                        let bytes = notes.verified()?;
                        let value: Value = serde_json::from_slice(bytes).map_err(|e| {
                            Error::InvalidInput(format!("the result's notes are not JSON: {e}"))
                        })?;
                        self.check_depth("the result's notes", &value)?;
                        AgentNotes::from_json(bytes)
                            .map_err(|e| Error::InvalidInput(format!("the result's notes: {e}")))?
                    }
                };
                if notes.decisions.len() > config.max_decisions_per_result {
                    return Err(Error::InvalidInput(format!(
                        "the result's notes: decisions has {} entries; the limit is {}",
                        notes.decisions.len(),
                        config.max_decisions_per_result
                    )));
                }
                if notes.messages.len() > config.max_messages_per_result {
                    return Err(Error::InvalidInput(format!(
                        "the result's notes: messages has {} entries; the limit is {}",
                        notes.messages.len(),
                        config.max_messages_per_result
                    )));
                }
                check_decisions(&notes, config)?;
                Ok(Ok((value, notes)))
            }
            Some(v1::task_result::Outcome::Error(error)) => Ok(Err(error)),
            None => Err(Error::InvalidInput(
                "a result needs data or an error".into(),
            )),
        }
    }

    /// Vectors for a result's decisions. An embedder that fails does not hold the result
    /// back: the decisions are stored without vectors and embedded when they are queried.
    async fn embed_decisions(&self, notes: &AgentNotes) -> Option<Embedded> {
        if notes.decisions.is_empty() {
            return None;
        }
        let texts: Vec<String> = notes
            .decisions
            .iter()
            .map(|d| {
                if d.rationale.is_empty() {
                    d.summary.clone()
                } else {
                    format!("{}: {}", d.summary, d.rationale)
                }
            })
            .collect();
        let embedder = &self.inner.embedder;
        match embedder.embed(&texts).await {
            Ok(vectors) => Some(Embedded {
                model: embedder.model().to_owned(),
                vectors,
            }),
            Err(error) => {
                tracing::warn!(%error, "decisions stored without embeddings; they are embedded when queried");
                None
            }
        }
    }

    fn check_depth(&self, what: &str, value: &Value) -> Result<(), Error> {
        let limit = self.inner.config.max_data_depth;
        let depth = json_depth(value);
        if depth > limit {
            return Err(Error::InvalidInput(format!(
                "{what} nests {depth} levels deep; the limit is {limit}"
            )));
        }
        Ok(())
    }

    /// A worker could not rebuild a task's payload: the task goes to it again whole, or, after
    /// [`crate::hub::MAX_RESENDS`] tries, its step fails with the reason (it is logged either way).
    pub async fn resend(&self, worker_id: &str, request: v1::ResendTask) -> Result<(), Error> {
        let (run_id, task, _) = parse_task_id(&request.task_id)
            .ok_or_else(|| Error::MalformedTaskId(request.task_id.clone()))?;
        let reason = request.reason;
        let resent = self.inner.hub.resend(worker_id, run_id, &task_key(&task));
        if !matches!(resent, Err(crate::hub::Error::NotHeld { .. })) {
            self.inner.resends.fetch_add(1, Ordering::Relaxed);
        }
        match resent {
            Ok(()) => {
                tracing::warn!(worker_id, task_id = %request.task_id, %reason, "payload did not arrive intact; sent again");
                Ok(())
            }
            Err(exhausted @ crate::hub::Error::ResendsExhausted { .. }) => {
                tracing::error!(worker_id, task_id = %request.task_id, %reason, "payload never arrived intact; failing the step");
                let failure = v1::TaskResult {
                    task_id: request.task_id,
                    outcome: Some(v1::task_result::Outcome::Error(format!(
                        "{exhausted}: {reason}"
                    ))),
                    notes: None,
                    non_retryable: false,
                };
                self.complete(worker_id, failure).await
            }
            Err(_) => Err(Error::TaskNotHeld {
                worker_id: worker_id.to_owned(),
                task_id: request.task_id,
            }),
        }
    }

    /// A worker said hello: it takes over the tasks it still runs from an earlier stream
    /// (`held`, where their attempts are still current; the others are stopped) and gets
    /// queued tasks for its agents at once. Returns the connection's number, for
    /// [`Coordinator::disconnect_worker`], and a receiver that completes when the coordinator
    /// lets the worker go (it fell silent): the stream must end then.
    pub async fn connect_worker(
        &self,
        worker_id: &str,
        agents: Vec<String>,
        capacity: usize,
        cache_bytes: u64,
        held: Vec<String>,
        stream: tokio::sync::mpsc::UnboundedSender<v1::CoordinatorMessage>,
    ) -> Result<(u64, tokio::sync::oneshot::Receiver<()>), Error> {
        // A coordinator on its way out takes nobody: the worker goes to its next address.
        if self.inner.stopping.load(Ordering::SeqCst) {
            return Err(Error::ShuttingDown);
        }
        let (connection, closed) = self
            .inner
            .hub
            .connect(worker_id, agents, capacity, cache_bytes, stream)
            .map_err(|e| Error::DuplicateWorker(e.to_string()))?;
        tracing::info!(worker_id, capacity, held = held.len(), "worker connected");
        // The tasks it still runs take their slots first.
        for task_id in held {
            self.adopt_running(worker_id, &task_id).await;
            self.inner.hub.seen(worker_id);
        }
        let assignments = self.inner.hub.fill_worker(worker_id);
        self.assigned(assignments).await;
        // What is due for its agents goes to it now rather than at the next sweep.
        self.sweep().await;
        Ok((connection, closed))
    }

    /// A worker's stream ended (or fell silent): the tasks it held are delivered again, each as
    /// a new attempt, so that its answers, should it come back, are refused.
    pub async fn disconnect_worker(&self, worker_id: &str, connection: u64) {
        let returned = self.inner.hub.disconnect(worker_id, connection);
        tracing::info!(worker_id, returned = returned.len(), "worker disconnected");
        for task in returned {
            self.redeliver_lost(worker_id, task).await;
        }
    }

    /// Counters since this coordinator started.
    pub fn stats(&self) -> v1::Stats {
        let hub = self.inner.hub.counters();
        v1::Stats {
            workers: hub.workers as u32,
            tasks_dispatched: hub.tasks_dispatched,
            bytes_to_workers: hub.bytes_to_workers,
            transitions: self.inner.transitions.load(Ordering::Relaxed),
            engine_us: self.inner.profile.engine_us.load(Ordering::Relaxed),
            plan_us: self.inner.profile.plan_us.load(Ordering::Relaxed),
            store_us: self.inner.profile.store_us.load(Ordering::Relaxed),
            act_us: self.inner.profile.act_us.load(Ordering::Relaxed),
            integrity_failures: self.inner.metrics.integrity_failures.get(),
            resends: self.inner.resends.load(Ordering::Relaxed),
            fenced_results: self.inner.metrics.fenced.get(),
            retries: self.inner.metrics.retries.get(),
            redeliveries: self.inner.metrics.redeliveries.get(),
            timeouts: self.inner.metrics.timeouts.get(),
        }
    }

    /// The Prometheus text exposition of this coordinator's metrics (`/metrics`).
    pub fn metrics_text(&self) -> String {
        self.inner.metrics.render(self.hub_gauges())
    }

    /// The metrics of [`Coordinator::metrics_text`], as data for export by OTLP.
    pub fn metric_families(&self) -> Vec<crate::metrics::MetricFamily> {
        self.inner.metrics.families(self.hub_gauges())
    }

    fn hub_gauges(&self) -> crate::metrics::HubGauges {
        let (workers, free_slots) = self.inner.hub.capacity();
        crate::metrics::HubGauges {
            workers,
            free_slots,
            queues: self.inner.hub.queue_stats(),
        }
    }

    /// The run record of `run_id`, as the store has it now (another coordinator may have moved
    /// the run on since this one last touched it).
    pub async fn record(&self, run_id: &str) -> Result<v1::RunRecord, Error> {
        let slot = self.fresh_slot(run_id).await?;
        let guard = slot.lock().await;
        let loaded = guard
            .as_ref()
            .ok_or_else(|| Error::RunNotFound(run_id.to_owned()))?;
        Ok(self.record_of(loaded))
    }

    pub async fn list(&self, limit: usize) -> Result<Vec<v1::RunSummary>, Error> {
        let limit = if limit == 0 { 50 } else { limit.min(1_000) };
        let runs = self.inner.store.list_runs(limit).await?;
        Ok(runs
            .into_iter()
            .map(|r| v1::RunSummary {
                run_id: r.run_id,
                workflow_id: r.workflow_id,
                status: r.status,
                created_ms: r.created_ms,
                updated_ms: r.updated_ms,
            })
            .collect())
    }

    /// What has happened so far, and the events still to come (none when the run is over).
    pub async fn watch(
        &self,
        run_id: &str,
    ) -> Result<(Vec<v1::RunEvent>, Option<broadcast::Receiver<v1::RunEvent>>), Error> {
        let slot = self.fresh_slot(run_id).await?;
        // Holding the run's lock while subscribing: no event can slip between the two.
        let guard = slot.lock().await;
        let loaded = guard
            .as_ref()
            .ok_or_else(|| Error::RunNotFound(run_id.to_owned()))?;
        let events = self.run_events(loaded, 0, true);
        if loaded.run.status().is_terminal() {
            return Ok((events, None));
        }
        let receiver = self.watchers(run_id).subscribe();
        Ok((events, Some(receiver)))
    }

    /// What a watcher has not been told of a run that another coordinator may have moved on,
    /// read from the store: the step visits settled after the first `settled`, the approvals
    /// awaited, and the end.
    pub async fn catch_up(&self, run_id: &str, settled: usize) -> Result<Vec<v1::RunEvent>, Error> {
        let slot = self.fresh_slot(run_id).await?;
        let guard = slot.lock().await;
        let loaded = guard
            .as_ref()
            .ok_or_else(|| Error::RunNotFound(run_id.to_owned()))?;
        Ok(self.run_events(loaded, settled, false))
    }

    /// A run's state as watch events: the step visits settled after the first `settled`, the
    /// steps running now (if `running`), the approvals awaited, and the end if it is over.
    fn run_events(&self, loaded: &Loaded, settled: usize, running: bool) -> Vec<v1::RunEvent> {
        let mut events: Vec<v1::RunEvent> = loaded
            .run
            .history()
            .iter()
            .skip(settled)
            .map(step_finished)
            .collect();
        if running {
            for (key, entry) in &loaded.tasks {
                if entry.state == "running"
                    && let Some((step_id, visit)) = key.rsplit_once('#')
                {
                    events.push(started(step_id, visit.parse().unwrap_or(0), entry));
                }
            }
        }
        for waiting in loaded.run.waiting() {
            if let baton_core::Waiting::Approval { step_id, message } = waiting {
                events.push(approval_requested(
                    &step_id,
                    loaded.run.visits(&step_id),
                    &message,
                ));
            }
        }
        if loaded.run.status().is_terminal() {
            events.push(finished(self.record_of(loaded)));
        }
        events
    }

    /// Recomputes a run's state chain from the store (not from this coordinator's memory).
    pub async fn verify(&self, run_id: &str) -> Result<v1::VerifyRunResponse, Error> {
        let stored = self
            .inner
            .store
            .load_run(run_id)
            .await?
            .ok_or_else(|| Error::RunNotFound(run_id.to_owned()))?;
        let state_sha256 = stored.state_sha256.clone();
        let checked = match chain::replay_checked(&stored, &self.inner.config.limits) {
            Ok(checked) => checked,
            Err(unreadable) => {
                return Ok(v1::VerifyRunResponse {
                    ok: false,
                    links: 0,
                    state_sha256,
                    problem: unreadable.0,
                    step_id: String::new(),
                    visit: 0,
                });
            }
        };
        // A stored transform copy that does not match is reported here too, though a replay
        // does not depend on it: whichever comes first in the chain.
        let mut problems: Vec<Mismatch> = checked.repaired;
        problems.extend(checked.mismatch);
        if problems.is_empty() {
            problems.extend(self.check_decision_index(run_id, &checked.run).await?);
        }
        let problem = problems.into_iter().min_by_key(|m| m.link);
        let (step_id, visit) = problem
            .as_ref()
            .and_then(|m| m.step.clone())
            .unwrap_or_default();
        Ok(v1::VerifyRunResponse {
            ok: problem.is_none(),
            links: checked.links as u32,
            state_sha256,
            problem: problem.map(|m| m.problem).unwrap_or_default(),
            step_id,
            visit,
        })
    }

    /// The decision index (the run's decisions as stored for search, with their embeddings)
    /// against the decisions the verified replay rebuilt: the first that differs, is missing or
    /// is extra.
    async fn check_decision_index(
        &self,
        run_id: &str,
        run: &Run,
    ) -> Result<Option<Mismatch>, Error> {
        let mut stored = self.inner.store.decisions(run_id).await?;
        let mismatch = |decision: &DecisionRecord, problem: String| Mismatch {
            step: Some((decision.step_id.clone(), decision.visit)),
            problem,
            link: usize::MAX,
        };
        for decision in run.decisions() {
            let Some(bytes) = stored.remove(&decision.key) else {
                return Ok(Some(mismatch(
                    decision,
                    format!(
                        "decision {} is missing from the decision index",
                        decision.key
                    ),
                )));
            };
            let indexed: Option<StoredDecision> = serde_json::from_slice(&bytes).ok();
            if indexed.as_ref().map(|d| &d.decision) != Some(decision.as_ref()) {
                return Ok(Some(mismatch(
                    decision,
                    format!(
                        "decision {} in the decision index differs from the one its step reported",
                        decision.key
                    ),
                )));
            }
        }
        Ok(stored.into_keys().next().map(|key| Mismatch {
            step: None,
            problem: format!("the decision index holds {key}, which no step reported"),
            link: usize::MAX,
        }))
    }

    /// Rebuilds a run read from the store. Stored data that does not match the state chain is
    /// logged and counted; if the replay depended on it, the run stops there with an integrity
    /// error naming the step (and a running run is marked failed in the store, nothing else
    /// changed), so nothing is ever built on data that cannot be trusted.
    async fn rebuild(&self, stored: StoredRun) -> Result<Loaded, Error> {
        let run_id = stored.header.run_id.clone();
        let stored_status = stored.status.clone();
        let (mut loaded, checked) = rebuild(stored, &self.inner.config.limits)?;
        for repaired in &checked.repaired {
            if self.count_integrity_failure(&run_id, repaired) {
                tracing::error!(%run_id, problem = %repaired, "stored copy does not match the state chain; the replay recomputed it");
            }
        }
        let Some(mismatch) = checked.mismatch else {
            return Ok(loaded);
        };
        if self.count_integrity_failure(&run_id, &mismatch) {
            tracing::error!(%run_id, problem = %mismatch, "stored run does not match its state chain; stopping it");
        }
        self.halt(&mut loaded, &mismatch, &stored_status).await?;
        Ok(loaded)
    }

    /// Counts a mismatch the first time this coordinator sees it; says whether it was new.
    fn count_integrity_failure(&self, run_id: &str, mismatch: &Mismatch) -> bool {
        let new = self
            .inner
            .integrity_seen
            .lock()
            .expect("integrity lock")
            .insert(format!("{run_id} {mismatch}"));
        if new {
            self.inner.metrics.integrity_failures.inc();
        }
        new
    }

    async fn halt(
        &self,
        loaded: &mut Loaded,
        mismatch: &Mismatch,
        stored_status: &str,
    ) -> Result<(), Error> {
        let error = mismatch.to_string();
        let halted = loaded
            .run
            .apply(Event::Halt {
                error: error.clone(),
            })
            .map(|t| t.run)
            .unwrap_or_else(|_| loaded.run.clone());
        loaded.run = halted;
        if stored_status != "running" {
            loaded.finished_as = Some(stored_status.to_owned());
            return Ok(());
        }
        let write = TransitionWrite {
            tasks_removed: loaded.tasks.keys().cloned().collect(),
            status: "failed".into(),
            error: Some(error),
            state_sha256: loaded.state_sha256.clone(),
            updated_ms: now_ms(),
            ..TransitionWrite::default()
        };
        let updated_ms = write.updated_ms;
        loaded.version = self
            .inner
            .store
            .apply_transition(&loaded.header.run_id, loaded.version, write)
            .await?;
        loaded.tasks.clear();
        loaded.updated_ms = updated_ms;
        Ok(())
    }

    /// The decisions closest in meaning to `text`: of `run_id`, or of every run of
    /// `workflow_id` (exactly one of the two).
    pub async fn query_decisions(
        &self,
        request: v1::QueryDecisionsRequest,
    ) -> Result<v1::QueryDecisionsResponse, Error> {
        let config = &self.inner.config;
        if request.text.trim().is_empty() {
            return Err(Error::InvalidInput("text: a query needs some text".into()));
        }
        if request.text.len() > config.max_query_bytes {
            return Err(Error::TooLarge {
                what: "the query text",
                size: request.text.len(),
                limit: config.max_query_bytes,
            });
        }
        let k = match request.k {
            0 => 5,
            k if k > 100 => {
                return Err(Error::InvalidInput(format!(
                    "k: {k} matches asked for; the limit is 100"
                )));
            }
            k => k as usize,
        };
        let runs = match (request.run_id.is_empty(), request.workflow_id.is_empty()) {
            (false, true) => vec![request.run_id.clone()],
            (true, false) => {
                self.inner
                    .store
                    .runs_of_workflow(&request.workflow_id, config.max_query_runs)
                    .await?
            }
            _ => {
                return Err(Error::InvalidInput(
                    "run_id, workflow_id: give exactly one of them".into(),
                ));
            }
        };
        let mut found = Vec::new();
        for run_id in &runs {
            let stored = self.inner.store.decisions(run_id).await?;
            // A run without decisions may not exist at all: say so rather than "no match".
            if stored.is_empty()
                && !request.run_id.is_empty()
                && self.cached_slot(run_id).is_none()
                && self.inner.store.load_run(run_id).await?.is_none()
            {
                return Err(Error::RunNotFound(run_id.clone()));
            }
            if found.len() + stored.len() > config.max_query_decisions {
                tracing::warn!(
                    limit = config.max_query_decisions,
                    "a decision query stops reading older runs at its limit"
                );
                break;
            }
            for (key, bytes) in stored {
                let decision: StoredDecision =
                    serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
                        run_id: run_id.clone(),
                        reason: format!("decision {key}: {e}"),
                    })?;
                found.push(decision);
            }
        }
        let agent = (!request.agent.is_empty()).then_some(request.agent.as_str());
        let ranked = decisions::rank(&self.inner.embedder, &request.text, agent, k, found)
            .await
            .map_err(|e| Error::Embedding(e.to_string()))?;
        Ok(v1::QueryDecisionsResponse {
            matches: ranked.into_iter().map(decisions::to_match).collect(),
            model: self.inner.embedder.model().to_owned(),
        })
    }

    /// [`Coordinator::query_decisions`] for an agent mid-step: only about the run of a task
    /// the worker holds.
    pub async fn worker_query_decisions(
        &self,
        request: v1::WorkerQueryDecisionsRequest,
    ) -> Result<v1::QueryDecisionsResponse, Error> {
        let (run_id, task, attempt) = parse_task_id(&request.task_id)
            .ok_or_else(|| Error::MalformedTaskId(request.task_id.clone()))?;
        if !self
            .inner
            .hub
            .holds(&request.worker_id, run_id, &task_key(&task), attempt)
        {
            return Err(Error::TaskNotHeld {
                worker_id: request.worker_id.clone(),
                task_id: request.task_id.clone(),
            });
        }
        let (run_id, workflow_id) = if request.workflow_scope {
            let slot = self.slot(run_id).await?;
            let guard = slot.lock().await;
            let workflow_id = guard
                .as_ref()
                .map(|loaded| loaded.header.workflow_id.clone())
                .ok_or_else(|| Error::RunNotFound(run_id.to_owned()))?;
            if workflow_id.is_empty() {
                return Err(Error::InvalidInput(
                    "workflow_scope: this run's workflow has no \"id\", so there are no other runs of it to search; give the workflow an id, or query the run alone".into(),
                ));
            }
            (String::new(), workflow_id)
        } else {
            (run_id.to_owned(), String::new())
        };
        self.query_decisions(v1::QueryDecisionsRequest {
            run_id,
            workflow_id,
            text: request.text,
            agent: request.agent,
            k: request.k,
        })
        .await
    }

    fn watchers(&self, run_id: &str) -> broadcast::Sender<v1::RunEvent> {
        self.inner
            .watchers
            .lock()
            .expect("watchers lock")
            .entry(run_id.to_owned())
            .or_insert_with(|| broadcast::channel(1_024).0)
            .clone()
    }

    fn notify(&self, run_id: &str, event: v1::RunEvent) {
        let sender = self
            .inner
            .watchers
            .lock()
            .expect("watchers lock")
            .get(run_id)
            .cloned();
        if let Some(sender) = sender {
            let _ = sender.send(event);
        }
    }

    /// The run's slot if this coordinator holds the run in memory; never loads it.
    fn cached_slot(&self, run_id: &str) -> Option<Arc<AsyncMutex<Option<Loaded>>>> {
        self.inner
            .runs
            .lock()
            .expect("runs lock")
            .get(run_id)
            .cloned()
    }

    /// The run's slot, loading it from the store the first time; a finished run is not kept in
    /// memory. Loading a run sends nothing: its tasks have leases, and a task whose holder is
    /// gone is delivered again when its timer comes due ([`leases`](self::leases)).
    async fn slot(&self, run_id: &str) -> Result<Arc<AsyncMutex<Option<Loaded>>>, Error> {
        let slot = self
            .inner
            .runs
            .lock()
            .expect("runs lock")
            .entry(run_id.to_owned())
            .or_insert_with(|| Arc::new(AsyncMutex::new(None)))
            .clone();
        let mut guard = slot.lock().await;
        if guard.is_some() {
            return Ok(slot.clone());
        }
        let stored = match self.inner.store.load_run(run_id).await {
            Ok(Some(stored)) => stored,
            Ok(None) => {
                drop(guard);
                self.evict(run_id);
                return Err(Error::RunNotFound(run_id.to_owned()));
            }
            Err(error) => return Err(error.into()),
        };
        let loaded = self.rebuild(stored).await?;
        let finished = loaded.run.status().is_terminal();
        *guard = Some(loaded);
        drop(guard);
        if finished {
            self.evict(run_id);
        }
        Ok(slot)
    }

    /// Applies one event to a run: engine, store, then effects. Returns the run record when
    /// `want_record` (built before a finished run leaves memory).
    async fn apply(
        &self,
        run_id: &str,
        event: Event,
        stored: StoredEvent,
        from_worker: Option<(&str, &TaskId, u32)>,
        want_record: bool,
        embedded: Option<&Embedded>,
    ) -> Result<Option<v1::RunRecord>, Error> {
        // A conflict means another coordinator moved the run on: reload it and try again.
        let mut conflicts = 0;
        loop {
            let slot = self.slot(run_id).await?;
            let mut guard = slot.lock().await;
            let Some(loaded) = guard.as_mut() else {
                continue; // cleared by a conflict in between; slot() reloads it
            };
            let profile = &self.inner.profile;
            let started = std::time::Instant::now();
            let now = now_ms();
            let transition = loaded
                .run
                .apply_at(event.clone(), now)
                .map_err(|e| match e {
                    EngineError::NotRunning(status) => Error::RunFinished {
                        run_id: run_id.to_owned(),
                        status: status.to_string(),
                    },
                    EngineError::NotAwaitingApproval(step_id) => Error::NotAwaitingApproval {
                        run_id: run_id.to_owned(),
                        step_id,
                    },
                    EngineError::UnknownTask(task) => Error::TaskNotHeld {
                        worker_id: from_worker
                            .map(|(w, _, _)| w.to_owned())
                            .unwrap_or_default(),
                        task_id: task_id(run_id, &task, from_worker.map_or(0, |(_, _, a)| a)),
                    },
                })?;
            let started = add_elapsed(&profile.engine_us, started);
            let before = loaded.run.history().len();
            let logged = LoggedEvent {
                at_ms: now,
                event: stored.clone(),
            };
            let planned = plan(
                loaded,
                Some(&logged),
                from_worker,
                &transition,
                before,
                now,
                embedded,
                &self.holder(),
            );
            let started = add_elapsed(&profile.plan_us, started);
            let written = self
                .inner
                .store
                .apply_transition(run_id, loaded.version, planned.write.clone())
                .await;
            let started = add_elapsed(&profile.store_us, started);
            let held = match written {
                Ok(version) => {
                    self.inner.transitions.fetch_add(1, Ordering::Relaxed);
                    let held = self.held_change(&planned);
                    loaded.adopt(transition.run.clone(), version, planned);
                    held
                }
                Err(store::Error::Conflict { .. }) if conflicts < 3 => {
                    conflicts += 1;
                    *guard = None;
                    continue;
                }
                Err(other) => return Err(other.into()),
            };
            let assignments = self.act(run_id, loaded, &transition, before);
            self.note_held(run_id, held);
            add_elapsed(&profile.act_us, started);
            let record = want_record.then(|| self.record_of(loaded));
            let finished = loaded.run.status().is_terminal();
            drop(guard);
            if finished {
                self.evict(run_id);
            }
            self.assigned(assignments).await;
            return Ok(record);
        }
    }

    /// Forgets a finished run's in-memory copy: it is read back from the store if asked for, so
    /// a long-lived coordinator's memory follows its running runs, not every run it has seen.
    fn evict(&self, run_id: &str) {
        self.inner.runs.lock().expect("runs lock").remove(run_id);
    }

    /// Carries out a stored transition: tasks to the hub, events to watchers.
    fn act(
        &self,
        run_id: &str,
        loaded: &mut Loaded,
        transition: &Transition,
        history_before: usize,
    ) -> Vec<Assignment> {
        let settled = std::mem::take(&mut loaded.settled);
        for (n, record) in loaded.run.history().iter().skip(history_before).enumerate() {
            self.inner
                .metrics
                .step_settled(record.step_type.as_str(), record.status.as_str());
            self.notify(run_id, step_finished(record));
            // An agent step's spans are its attempts', written as their answers come.
            if self.inner.traces.enabled()
                && record.step_type != StepType::Agent
                && let Some(timing) = settled.get(n)
            {
                self.trace_settled(loaded, record, *timing);
            }
        }
        let mut assignments = Vec::new();
        for action in &transition.actions {
            match action {
                Action::Dispatch(task) => {
                    // A task nobody here can run was left unowned in the store, due now: a
                    // coordinator with a worker for its agent claims it.
                    let entry = loaded.tasks.get(&task_key(&task.task));
                    let Some(entry) = entry.filter(|e| e.owner == self.inner.config.coordinator_id)
                    else {
                        continue;
                    };
                    let attempt = entry.attempt;
                    let ready = ready_task(
                        &self.inner.traces,
                        &loaded.header,
                        &loaded.run,
                        task,
                        attempt,
                        &mut loaded.parts,
                    );
                    if let Some(assignment) = self.inner.hub.submit(ready) {
                        assignments.push(assignment);
                    }
                }
                Action::AwaitApproval {
                    step_id,
                    visit,
                    message,
                    ..
                } => self.notify(run_id, approval_requested(step_id, *visit, message)),
                Action::Abandon(task) => {
                    let reason = "its run no longer needs it";
                    let forgotten = self.inner.hub.forget(run_id, &task_key(task), reason);
                    assignments.extend(forgotten.assignments);
                    // The attempt that was running ends here, in its span too.
                    if let Some((worker_id, ready)) = forgotten.held
                        && let Some(sent) = ready.sent()
                    {
                        let now = SystemTime::now();
                        self.trace_attempt(&Answered {
                            worker_id: &worker_id,
                            attempt: ready.attempt(),
                            sent: &sent,
                            persisting: now,
                            error: None,
                            retry_after_ms: None,
                            lost_before: 0,
                            abandoned: Some(reason),
                        });
                    }
                }
                Action::Finished { status, .. } => {
                    let trace_id = traces::trace_id_of(&loaded.header.traceparent);
                    tracing::info!(run_id, status = %status, %trace_id, "run finished");
                    self.inner.metrics.run_finished(status.as_str());
                    self.notify(run_id, finished(self.record_of(loaded)));
                    self.inner
                        .watchers
                        .lock()
                        .expect("watchers lock")
                        .remove(run_id);
                }
            }
        }
        assignments
    }

    /// Writes the span of a step that settled without an agent, from when its visit started
    /// waiting (a transform or condition takes no time) to when it settled.
    fn trace_settled(&self, loaded: &Loaded, record: &StepRecord, timing: SettledTiming) {
        let parallel = record.parent.as_deref().zip(timing.parallel_visit);
        let span = SettledSpan {
            step: StepSpan {
                step_id: &record.step_id,
                visit: record.visit,
                step_type: record.step_type.as_str(),
                parallel,
            },
            started: traces::from_ms(timing.started_ms),
            settled: traces::from_ms(record.at_ms),
            error: record.error.as_deref(),
        };
        let run = RunSpan {
            traceparent: &loaded.header.traceparent,
            run_id: &loaded.header.run_id,
            workflow_id: &loaded.header.workflow_id,
        };
        self.inner.traces.settled(run, &span);
    }

    /// Records which worker took each task, and tells watchers the step started.
    async fn assigned(&self, assignments: Vec<Assignment>) {
        for assignment in assignments {
            self.inner
                .metrics
                .task_sent(&assignment.agent, assignment.waited);
            // Only runs in memory: a run that is not has finished, or will queue its tasks
            // again when it is loaded.
            let Some(slot) = self.cached_slot(&assignment.run_id) else {
                continue;
            };
            let mut guard = slot.lock().await;
            if let Some(loaded) = guard.as_mut() {
                self.mark_assigned(loaded, &assignment);
            }
        }
    }

    /// Notes which worker took a task. The store learns it with the next lease renewal (a write
    /// per dispatch would cost a round trip per step); the result's transition records the
    /// worker for good.
    fn mark_assigned(&self, loaded: &mut Loaded, assignment: &Assignment) {
        let Some(entry) = loaded.tasks.get_mut(&assignment.task_key) else {
            return;
        };
        entry.state = "running".into();
        entry.worker_id = assignment.worker_id.clone();
        let entry = entry.clone();
        let Some((step_id, visit)) = assignment.task_key.rsplit_once('#') else {
            return;
        };
        if let Some(step) = loaded.steps.get_mut(step_id) {
            step.status = "running".into();
            step.worker_id = assignment.worker_id.clone();
            step.attempts = entry.attempt;
        }
        self.notify(
            &assignment.run_id,
            started(step_id, visit.parse().unwrap_or(0), &entry),
        );
    }

    fn record_of(&self, loaded: &Loaded) -> v1::RunRecord {
        let workflow = loaded.run.workflow();
        v1::RunRecord {
            run_id: loaded.header.run_id.clone(),
            workflow_id: loaded.header.workflow_id.clone(),
            status: loaded
                .finished_as
                .clone()
                .unwrap_or_else(|| loaded.run.status().as_str().into()),
            error: loaded.run.error().unwrap_or_default().into(),
            context: Some(Json::new(json(&loaded.run.context().visible_serializer()))),
            steps: record::step_states(workflow, &loaded.steps),
            waiting: record::waiting(&loaded.run, |agent| self.inner.hub.serves(agent)),
            state_sha256: loaded.state_sha256.clone(),
            created_ms: loaded.header.created_ms,
            updated_ms: loaded.updated_ms,
            memory: Some(Json::new(json(&record::memory(&loaded.run)))),
            trace_id: traces::trace_id_of(&loaded.header.traceparent),
        }
    }
}

impl Loaded {
    fn adopt(&mut self, run: Run, version: u64, planned: Planned) {
        self.run = run;
        self.version = version;
        self.steps.extend(planned.steps);
        for key in &planned.write.tasks_removed {
            self.tasks.remove(key);
        }
        self.tasks.extend(planned.tasks_set);
        self.updated_ms = planned.write.updated_ms;
        self.state_sha256 = planned.write.state_sha256;
        self.settled = planned.settled;
    }
}

/// How an attempt ended, for its span.
struct Answered<'a> {
    worker_id: &'a str,
    attempt: u32,
    sent: &'a Sent,
    /// When the coordinator started recording the outcome.
    persisting: SystemTime,
    error: Option<&'a str>,
    retry_after_ms: Option<u64>,
    /// Earlier deliveries of the step visit lost with their worker or coordinator.
    lost_before: u32,
    /// Why the attempt was stopped, when the run no longer needed it.
    abandoned: Option<&'a str>,
}

/// A transition's write, and the changes it makes to the step and task maps.
struct Planned {
    write: TransitionWrite,
    steps: Vec<(String, StepState)>,
    tasks_set: Vec<(String, TaskEntry)>,
    /// One per step visit settled, in history order.
    settled: Vec<SettledTiming>,
}

/// Turns a transition into the store write that records it. Pure: nothing changes until the
/// write is acknowledged.
#[allow(clippy::too_many_arguments)]
fn plan(
    loaded: &Loaded,
    event: Option<&LoggedEvent>,
    from_worker: Option<(&str, &TaskId, u32)>,
    transition: &Transition,
    history_before: usize,
    now: i64,
    embedded: Option<&Embedded>,
    holder: &Holder<'_>,
) -> Planned {
    let run = &transition.run;
    // Only what changes is copied: a transition costs the size of its change, not of the run
    // (a 500-branch parallel step settles 500 times).
    let mut steps: BTreeMap<String, StepState> = BTreeMap::new();
    let mut write = TransitionWrite {
        event: event.map(json),
        ..TransitionWrite::default()
    };
    let mut tasks_set = Vec::new();
    let mut head = loaded.state_sha256.clone();
    if let Some((worker_id, task, attempt)) = from_worker {
        write.tasks_removed.push(task_key(task));
        // Recorded only while this attempt is the task's current one.
        write.fences.push((task_key(task), attempt));
        let state = changed(&mut steps, loaded, &task.step_id);
        if !worker_id.is_empty() {
            state.worker_id = worker_id.to_owned();
        }
        // The answer can overtake the bookkeeping of its own delivery.
        state.attempts = state.attempts.max(attempt);
    }
    let mut settled = Vec::new();
    for record in run.history().iter().skip(history_before) {
        settled.push(settled_timing(loaded, run, record));
        // Agent and transform data is stored once here; parallel data is rebuilt from its
        // branches, conditions and approvals from the event log.
        if matches!(record.step_type, StepType::Agent | StepType::Transform)
            && let Some(data) = &record.data
        {
            let key = format!("{}#{}", record.step_id, record.visit);
            write.results.push((key, json(data.as_ref())));
        }
        let link = ChainLink::after(&head, &record.step_id, record.visit, record.result_sha256());
        head = link.state_sha256.clone();
        write.links.push(json(&link));
        let state = changed(&mut steps, loaded, &record.step_id);
        state.status = record.status.as_str().to_owned();
        state.visits = run.visits(&record.step_id);
        state.error = record.error.as_deref().unwrap_or_default().to_owned();
        // A decided (or timed out) approval's timer goes with it.
        let key = format!("{}#{}", record.step_id, record.visit);
        if record.step_type == StepType::Approval && loaded.tasks.contains_key(&key) {
            write.tasks_removed.push(key);
        }
    }
    for action in &transition.actions {
        match action {
            Action::Dispatch(task) => {
                let key = task_key(&task.task);
                let owner = (holder.serves)(&task.agent).then_some(holder.id);
                let entry = lease::dispatched(&task.agent, owner, now, holder.lease_ms);
                write.tasks_set.push((key.clone(), entry.encode()));
                tasks_set.push((key, entry));
                let state = changed(&mut steps, loaded, &task.task.step_id);
                state.status = "queued".into();
                state.visits = run.visits(&task.task.step_id);
                state.error.clear();
                state.since_ms = now;
                state.since_visit = task.task.visit;
                // The attempt that reaches a worker is written here when it does.
                state.attempts = 0;
                // A parallel step's visit starts with its first branch.
                if let Some(parallel) = parallel_of(run.workflow(), &task.task.step_id) {
                    let visit = run.visits(parallel);
                    let state = changed(&mut steps, loaded, parallel);
                    if state.since_visit != visit {
                        state.since_ms = now;
                        state.since_visit = visit;
                        state.status = "running".into();
                        state.error.clear();
                    }
                }
            }
            Action::AwaitApproval {
                step_id,
                visit,
                timeout_ms,
                ..
            } => {
                let state = changed(&mut steps, loaded, step_id);
                state.status = "waiting".into();
                state.visits = run.visits(step_id);
                state.since_ms = now;
                state.since_visit = *visit;
                if let Some(timeout_ms) = timeout_ms {
                    let key = format!("{step_id}#{visit}");
                    let entry = lease::approval_timer(now, *timeout_ms);
                    write.tasks_set.push((key.clone(), entry.encode()));
                    tasks_set.push((key, entry));
                }
            }
            Action::Abandon(task) => {
                write.tasks_removed.push(task_key(task));
                changed(&mut steps, loaded, &task.step_id).status = "cancelled".into();
            }
            Action::Finished { .. } => {}
        }
    }
    write.steps = steps
        .iter()
        .map(|(id, state)| (id.clone(), json(state)))
        .collect();
    let new_decisions = run.decisions().iter().skip(loaded.run.decisions().len());
    for (n, decision) in new_decisions.enumerate() {
        let vector = embedded.and_then(|e| e.vectors.get(n).map(|v| (e.model.clone(), v.clone())));
        let stored = StoredDecision {
            run_id: loaded.header.run_id.clone(),
            decision: DecisionRecord::clone(decision),
            model: vector.as_ref().map(|(model, _)| model.clone()),
            embedding: vector.map(|(_, v)| v),
        };
        write
            .decisions
            .push((decision.key.clone(), stored.encode()));
    }
    // A finished run keeps no task or timer (a cancelled run's approval timer, say).
    if run.status().is_terminal() {
        for key in loaded.tasks.keys() {
            if !write.tasks_removed.contains(key) {
                write.tasks_removed.push(key.clone());
            }
        }
    }
    write.status = run.status().as_str().into();
    write.error = run.error().map(str::to_owned);
    write.state_sha256 = head;
    write.updated_ms = now;
    Planned {
        write,
        steps: steps.into_iter().collect(),
        tasks_set,
        settled,
    }
}

/// When `record`'s visit started (the time it started waiting, as the run's step states said
/// before this transition; or when it settled, for a step that took no time) and, for a branch,
/// which visit of its parallel step it belongs to.
fn settled_timing(loaded: &Loaded, run: &Run, record: &StepRecord) -> SettledTiming {
    let since = |id: &str, visit: u32| {
        loaded
            .steps
            .get(id)
            .filter(|state| state.since_visit == visit && state.since_ms > 0)
            .map(|state| state.since_ms)
    };
    let parallel_visit = record.parent.as_deref().map(|parallel| {
        // A parallel step under way when this transition began owns the branches settling in
        // it; otherwise it started in this transition.
        match loaded.steps.get(parallel) {
            Some(state) if state.status == "running" && state.since_visit > 0 => state.since_visit,
            _ => run.visits(parallel),
        }
    });
    SettledTiming {
        started_ms: since(&record.step_id, record.visit).unwrap_or(record.at_ms),
        parallel_visit,
    }
}

/// The id of the parallel step `step_id` is a branch of, if it is one.
fn parallel_of<'w>(workflow: &'w baton_core::Workflow, step_id: &str) -> Option<&'w str> {
    let step = workflow.step_by_id(step_id)?;
    Some(&*workflow.step(step.parent?).id)
}

/// The step's state as this transition changes it, starting from what `loaded` holds.
fn changed<'a>(
    steps: &'a mut BTreeMap<String, StepState>,
    loaded: &Loaded,
    id: &str,
) -> &'a mut StepState {
    steps
        .entry(id.to_owned())
        .or_insert_with(|| loaded.steps.get(id).cloned().unwrap_or_default())
}

/// The run as the store holds it, checked against its state chain ([`chain`]).
fn rebuild(stored: StoredRun, limits: &Limits) -> Result<(Loaded, chain::Checked), Error> {
    let run_id = stored.header.run_id.clone();
    let corrupt = |reason: String| Error::Corrupt {
        run_id: run_id.clone(),
        reason,
    };
    let checked = chain::replay_checked(&stored, limits).map_err(|e| corrupt(e.0))?;
    let steps = stored
        .steps
        .iter()
        .map(|(id, bytes)| Ok((id.clone(), serde_json::from_slice(bytes)?)))
        .collect::<Result<_, serde_json::Error>>()
        .map_err(|e| corrupt(format!("step state: {e}")))?;
    let tasks = stored
        .tasks
        .iter()
        .map(|(key, bytes)| Ok((key.clone(), serde_json::from_slice(bytes)?)))
        .collect::<Result<_, serde_json::Error>>()
        .map_err(|e| corrupt(format!("task: {e}")))?;
    let loaded = Loaded {
        header: stored.header,
        run: checked.run.clone(),
        version: stored.version,
        steps,
        tasks,
        updated_ms: stored.updated_ms,
        state_sha256: stored.state_sha256,
        finished_as: None,
        parts: PartEncoder::default(),
        settled: Vec::new(),
    };
    Ok((loaded, checked))
}

/// Decisions are embedded (often by a model with a bounded input) and shown to people: each
/// needs a summary, and neither it nor the rationale may be huge.
fn check_decisions(notes: &AgentNotes, config: &Config) -> Result<(), Error> {
    for (i, decision) in notes.decisions.iter().enumerate() {
        if decision.summary.trim().is_empty() {
            return Err(Error::InvalidInput(format!(
                "the result's notes: decisions[{i}].summary is empty; a decision needs a summary"
            )));
        }
        if decision.related_artifacts.len() > config.max_related_artifacts {
            return Err(Error::InvalidInput(format!(
                "the result's notes: decisions[{i}].related_artifacts has {} entries; the limit is {}",
                decision.related_artifacts.len(),
                config.max_related_artifacts
            )));
        }
        if let Some((n, artifact)) = decision
            .related_artifacts
            .iter()
            .enumerate()
            .find(|(_, a)| a.len() > config.max_decision_summary_bytes)
        {
            return Err(Error::InvalidInput(format!(
                "the result's notes: decisions[{i}].related_artifacts[{n}] is {} bytes; the limit is {}",
                artifact.len(),
                config.max_decision_summary_bytes
            )));
        }
        for (field, text, limit) in [
            (
                "summary",
                &decision.summary,
                config.max_decision_summary_bytes,
            ),
            (
                "rationale",
                &decision.rationale,
                config.max_decision_rationale_bytes,
            ),
        ] {
            if text.len() > limit {
                return Err(Error::InvalidInput(format!(
                    "the result's notes: decisions[{i}].{field} is {} bytes; the limit is {limit}",
                    text.len()
                )));
            }
        }
    }
    Ok(())
}

/// How deep a JSON value nests: 1 for a scalar, one more for each array or object around it.
fn json_depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 1)];
    while let Some((value, depth)) = stack.pop() {
        deepest = deepest.max(depth);
        match value {
            Value::Array(items) => stack.extend(items.iter().map(|v| (v, depth + 1))),
            Value::Object(fields) => stack.extend(fields.values().map(|v| (v, depth + 1))),
            _ => {}
        }
    }
    deepest
}

/// Attempt `attempt` of `task`, ready for a worker, with what its spans need when traces are
/// on (the worker gets its `traceparent`, in the run's trace).
fn ready_task(
    traces: &Traces,
    header: &RunHeader,
    run: &Run,
    task: &baton_core::AgentTask,
    attempt: u32,
    encoder: &mut PartEncoder,
) -> ReadyTask {
    let run_id = header.run_id.as_str();
    let task_id = task_id(run_id, &task.task, attempt);
    let trace = traces.enabled().then(|| {
        Arc::new(TaskTrace {
            run_traceparent: header.traceparent.clone(),
            run_id: run_id.to_owned(),
            workflow_id: header.workflow_id.clone(),
            step_id: task.task.step_id.to_string(),
            visit: task.task.visit,
            agent: task.agent.clone(),
            parallel: parallel_of(run.workflow(), &task.task.step_id)
                .map(|parallel| (parallel.to_owned(), run.visits(parallel))),
        })
    });
    let traceparent = trace
        .as_ref()
        .map(|trace| traces.task_traceparent(trace, attempt))
        .unwrap_or_default();
    let payload = encoder.payload(&task.payload);
    ReadyTask {
        run_id: run_id.to_owned(),
        task_key: task_key(&task.task),
        agent: task.agent.clone(),
        message: v1::Task {
            task_id,
            attempt,
            run_id: run_id.to_owned(),
            step_id: task.task.step_id.to_string(),
            visit: task.task.visit,
            agent: task.agent.clone(),
            manifest: Some(payload.manifest),
            parts: Vec::new(),
            timeout_ms: task.timeout_ms.unwrap_or_default(),
            traceparent,
        },
        parts: payload.parts,
        resends: 0,
        started: None,
        ready_at: std::time::Instant::now(),
        trace,
    }
}

/// Who takes the tasks a transition dispatches: this coordinator, for a lease, if one of its
/// workers serves the agent.
struct Holder<'a> {
    id: &'a str,
    lease_ms: u64,
    serves: Box<dyn Fn(&str) -> bool + 'a>,
}

fn step_finished(record: &StepRecord) -> v1::RunEvent {
    v1::RunEvent {
        event: Some(run_event::Event::StepFinished(v1::StepFinished {
            step_id: record.step_id.to_string(),
            visit: record.visit,
            status: record.status.as_str().to_owned(),
            data: record.data.as_ref().map(|d| Json::new(json(d.as_ref()))),
            error: record.error.as_deref().unwrap_or_default().to_owned(),
            next: record.next.as_deref().unwrap_or_default().to_owned(),
            parent: record.parent.as_deref().unwrap_or_default().to_owned(),
        })),
    }
}

fn started(step_id: &str, visit: u32, entry: &TaskEntry) -> v1::RunEvent {
    v1::RunEvent {
        event: Some(run_event::Event::StepStarted(v1::StepStarted {
            step_id: step_id.to_owned(),
            visit,
            agent: entry.agent.clone(),
            worker_id: entry.worker_id.clone(),
        })),
    }
}

fn approval_requested(step_id: &str, visit: u32, message: &str) -> v1::RunEvent {
    v1::RunEvent {
        event: Some(run_event::Event::ApprovalRequested(v1::ApprovalRequested {
            step_id: step_id.to_owned(),
            visit,
            message: message.to_owned(),
        })),
    }
}

fn finished(record: v1::RunRecord) -> v1::RunEvent {
    v1::RunEvent {
        event: Some(run_event::Event::RunFinished(v1::RunFinished {
            record: Some(record),
        })),
    }
}
