//! OpenTelemetry traces of runs: one trace per run, whatever crosses it.
//!
//! A run's trace starts with the `SubmitRun` span, which continues the client's trace when the
//! request carries W3C `traceparent`. That span's context is stored with the run (Redis), so
//! every step joins the same trace, whichever coordinator moves it on and however long after.
//!
//! Step spans are written when the step settles, with the times it actually had, rather than
//! kept open in memory: a coordinator that dies would take an open span with it, and the
//! answer of an attempt may reach another coordinator than the one that sent it. An agent
//! step's attempt span has an id derived from its task id (`run/step#visit@attempt`), so the
//! coordinator that sends the task can give the worker its parent (`Task.traceparent`) before
//! the span exists, any coordinator can write it, and a later attempt can link to an earlier
//! one. [`SpanIds`] is the id generator that makes this possible; a process exporting
//! coordinator spans must install it.
//!
//! Nothing here costs anything when tracing is off ([`Traces::off`]): no span is built.

use std::borrow::Cow;
use std::cell::Cell;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use baton_core::TaskId;
use opentelemetry::global::{BoxedSpan, BoxedTracer};
use opentelemetry::trace::{
    Event, Link, Span as _, SpanBuilder, SpanContext, SpanId, SpanKind, Status, TraceContextExt,
    TraceId,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
use sha2::{Digest, Sha256};

use crate::task_ref::{TaskRef, item_key, visit_key};

pub use baton_proto::trace_context::{format_traceparent, parse_traceparent, trace_id_of};

/// The attributes every Baton span may carry.
pub mod attribute {
    pub const RUN_ID: &str = "baton.run.id";
    pub const WORKFLOW_ID: &str = "baton.workflow.id";
    pub const STEP_ID: &str = "baton.step.id";
    pub const STEP_TYPE: &str = "baton.step.type";
    pub const STEP_VISIT: &str = "baton.step.visit";
    pub const AGENT: &str = "baton.agent";
    pub const ATTEMPT: &str = "baton.attempt";
    pub const WORKER_ID: &str = "baton.worker.id";
    pub const COORDINATOR_ID: &str = "baton.coordinator.id";
    /// The authenticated principal that called (its name; never a token).
    pub const PRINCIPAL: &str = "baton.principal";
}

thread_local! {
    /// The id the next span built on this thread gets, if set ([`SpanIds`]).
    static PRESET_SPAN_ID: Cell<Option<SpanId>> = const { Cell::new(None) };
}

/// Random trace and span ids, except for the spans this module builds with an id derived from
/// what they stand for. Install it in the tracer provider of a process that runs a coordinator.
#[derive(Debug, Default)]
pub struct SpanIds(RandomIdGenerator);

impl IdGenerator for SpanIds {
    fn new_trace_id(&self) -> TraceId {
        self.0.new_trace_id()
    }

    fn new_span_id(&self) -> SpanId {
        PRESET_SPAN_ID
            .take()
            .unwrap_or_else(|| self.0.new_span_id())
    }
}

/// The span id of what `key` names in trace `trace_id`: the first 8 bytes of
/// SHA-256(trace id, key), never the invalid all-zero id.
pub fn derived_span_id(trace_id: TraceId, key: &str) -> SpanId {
    let digest = Sha256::new()
        .chain_update(trace_id.to_bytes())
        .chain_update(key.as_bytes())
        .finalize();
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    if bytes == [0; 8] {
        bytes[7] = 1;
    }
    SpanId::from_bytes(bytes)
}

/// The trace id and span id (hex) of attempt `task_id`'s span in the run's trace, for logs.
pub fn attempt_ids(run_traceparent: &str, task_id: &str) -> Option<(String, String)> {
    let run = parse_traceparent(run_traceparent)?;
    let span_id = derived_span_id(run.trace_id(), task_id);
    Some((run.trace_id().to_string(), span_id.to_string()))
}

/// A point in time known as an [`Instant`], as wall-clock time.
pub fn wall_clock(instant: Instant) -> SystemTime {
    SystemTime::now() - instant.elapsed()
}

/// Milliseconds since the epoch, as wall-clock time.
pub fn from_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

/// The run a span belongs to.
#[derive(Debug, Clone, Copy)]
pub struct RunSpan<'a> {
    /// The stored context of the run's `SubmitRun` span.
    pub traceparent: &'a str,
    pub run_id: &'a str,
    pub workflow_id: &'a str,
}

/// A step visit, as a span names it.
#[derive(Debug, Clone, Copy)]
pub struct StepSpan<'a> {
    pub step_id: &'a str,
    pub visit: u32,
    /// The map item it ran.
    pub item: Option<u32>,
    pub step_type: &'a str,
    /// The parallel step (id, visit) this step is a branch of, or the map step whose item it
    /// ran: its span is the parent.
    pub parallel: Option<(&'a str, u32)>,
}

/// What the spans of an agent task's attempts need to know about its run, carried with the
/// task from the moment it is ready, so that writing them reads nothing.
#[derive(Debug)]
pub struct TaskTrace {
    /// The stored context of the run's `SubmitRun` span.
    pub run_traceparent: String,
    pub run_id: String,
    pub workflow_id: String,
    pub step_id: String,
    pub visit: u32,
    /// The map item the task runs.
    pub item: Option<u32>,
    pub agent: String,
    /// The parallel step (id, visit) the step is a branch of, or the map step whose item it runs.
    pub parallel: Option<(String, u32)>,
}

impl TaskTrace {
    fn run(&self) -> RunSpan<'_> {
        RunSpan {
            traceparent: &self.run_traceparent,
            run_id: &self.run_id,
            workflow_id: &self.workflow_id,
        }
    }

    fn step(&self) -> StepSpan<'_> {
        StepSpan {
            step_id: &self.step_id,
            visit: self.visit,
            item: self.item,
            step_type: "agent",
            parallel: self
                .parallel
                .as_ref()
                .map(|(id, visit)| (id.as_str(), *visit)),
        }
    }
}

/// How one attempt of an agent step went, from ready to persisted.
#[derive(Debug, Clone)]
pub struct AttemptSpan<'a> {
    pub attempt: u32,
    pub worker_id: &'a str,
    /// When it became ready for a worker (queued, or delivered again).
    pub ready_at: SystemTime,
    /// When it went to its worker.
    pub dispatched_at: SystemTime,
    /// When the coordinator started and finished recording the outcome.
    pub persisted: (SystemTime, SystemTime),
    /// The attempt's error, which is the span's status.
    pub error: Option<&'a str>,
    /// The backoff before the next attempt, when the error is retried.
    pub retry_after_ms: Option<u64>,
    /// Earlier deliveries of this step visit lost with their worker or coordinator.
    pub lost_before: u32,
    /// Why the attempt was stopped unanswered, when its run no longer needed it.
    pub abandoned: Option<&'a str>,
}

/// A step that settled, other than an agent's attempt.
#[derive(Debug, Clone, Copy)]
pub struct SettledSpan<'a> {
    pub step: StepSpan<'a>,
    pub started: SystemTime,
    pub settled: SystemTime,
    pub error: Option<&'a str>,
}

/// The span of one `SubmitRun` request; its context is the run's, which every later span of the
/// run descends from.
pub struct SubmitSpan {
    span: Option<BoxedSpan>,
    /// The context to store with the run: this span's, or the client's when traces are off
    /// here; empty for none.
    pub run_traceparent: String,
}

impl SubmitSpan {
    /// Ends the span with the run the request started or found (`run_id`, whether it existed,
    /// the workflow's id), or the error that refused it.
    pub fn end(self, outcome: Result<(&str, bool, &str), String>) {
        let Some(mut span) = self.span else {
            return;
        };
        match outcome {
            Ok((run_id, existing, workflow_id)) => {
                span.set_attribute(KeyValue::new(attribute::RUN_ID, run_id.to_owned()));
                span.set_attribute(KeyValue::new("baton.run.existing", existing));
                if !workflow_id.is_empty() {
                    span.set_attribute(KeyValue::new(
                        attribute::WORKFLOW_ID,
                        workflow_id.to_owned(),
                    ));
                }
            }
            Err(error) => span.set_status(Status::error(error)),
        }
        span.end();
    }
}

/// The coordinator's tracer, or nothing when traces are off.
pub struct Traces {
    tracer: Option<BoxedTracer>,
    coordinator_id: String,
}

impl Traces {
    /// Spans through the global tracer provider, which should use [`SpanIds`].
    pub fn on(coordinator_id: &str) -> Self {
        Traces {
            tracer: Some(opentelemetry::global::tracer("baton-coordinator")),
            coordinator_id: coordinator_id.to_owned(),
        }
    }

    pub fn off() -> Self {
        Traces {
            tracer: None,
            coordinator_id: String::new(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.tracer.is_some()
    }

    /// Starts the `SubmitRun` span, a child of the client's `traceparent` when it names one.
    pub fn submit(&self, client_traceparent: &str, principal: Option<&str>) -> SubmitSpan {
        let span = self.tracer.as_ref().map(|tracer| {
            let parent = match parse_traceparent(client_traceparent) {
                Some(remote) => Context::new().with_remote_span_context(remote),
                None => Context::new(),
            };
            // Named as the RPC semantic conventions name server spans.
            SpanBuilder::from_name("baton.v1.RunService/SubmitRun")
                .with_kind(SpanKind::Server)
                .with_attributes(
                    [
                        KeyValue::new("rpc.system", "grpc"),
                        KeyValue::new("rpc.service", "baton.v1.RunService"),
                        KeyValue::new("rpc.method", "SubmitRun"),
                        KeyValue::new(attribute::COORDINATOR_ID, self.coordinator_id.clone()),
                    ]
                    .into_iter()
                    .chain(
                        principal.map(|name| KeyValue::new(attribute::PRINCIPAL, name.to_owned())),
                    )
                    .collect::<Vec<_>>(),
                )
                .start_with_context(tracer, &parent)
        });
        // Untraced here, a run still belongs to its caller's trace.
        let run_traceparent = match &span {
            Some(span) => format_traceparent(span.span_context()),
            None if parse_traceparent(client_traceparent).is_some() => {
                client_traceparent.to_owned()
            }
            None => String::new(),
        };
        SubmitSpan {
            span,
            run_traceparent,
        }
    }

    /// The `traceparent` a worker gets with attempt `attempt` of a task: the attempt span's
    /// context. Empty when the run has no trace.
    pub fn task_traceparent(&self, task: &TaskTrace, attempt: u32) -> String {
        let Some(run) = parse_traceparent(&task.run_traceparent) else {
            return String::new();
        };
        let task_id = attempt_id(&task.run_id, task.step(), attempt);
        let span_id = derived_span_id(run.trace_id(), &task_id);
        format_traceparent(&SpanContext::new(
            run.trace_id(),
            span_id,
            run.trace_flags(),
            true,
            run.trace_state().clone(),
        ))
    }

    /// Writes an agent step's attempt: its span (the worker's is a child), with a `queue wait`
    /// and a `persist` child, a `dispatched` event, a `retry scheduled` event when its error is
    /// retried, a `previous delivery lost` event when one was, an `abandoned` event when its
    /// run no longer needed it, and a link to the attempt before it.
    pub fn attempt(&self, task: &TaskTrace, span: &AttemptSpan<'_>) {
        let Some(tracer) = self.tracer.as_ref() else {
            return;
        };
        let Some(run_context) = parse_traceparent(&task.run_traceparent) else {
            return;
        };
        let trace_id = run_context.trace_id();
        let step = task.step();
        let task_id = attempt_id(&task.run_id, step, span.attempt);
        let mut attributes = self.step_attributes(task.run(), step);
        attributes.extend([
            KeyValue::new(attribute::AGENT, task.agent.clone()),
            KeyValue::new(attribute::ATTEMPT, i64::from(span.attempt)),
            KeyValue::new(attribute::WORKER_ID, span.worker_id.to_owned()),
            KeyValue::new("baton.task.id", task_id.clone()),
        ]);
        let mut events = Vec::new();
        if span.lost_before > 0 {
            events.push(Event::new(
                "previous delivery lost",
                span.ready_at,
                vec![KeyValue::new(
                    "baton.lost_deliveries",
                    i64::from(span.lost_before),
                )],
                0,
            ));
        }
        events.push(Event::new(
            "dispatched",
            span.dispatched_at,
            vec![KeyValue::new(
                attribute::WORKER_ID,
                span.worker_id.to_owned(),
            )],
            0,
        ));
        if let Some(backoff_ms) = span.retry_after_ms {
            events.push(Event::new(
                "retry scheduled",
                span.persisted.1,
                vec![
                    KeyValue::new("baton.retry.backoff_ms", backoff_ms as i64),
                    KeyValue::new("baton.retry.next_attempt", i64::from(span.attempt) + 1),
                ],
                0,
            ));
        }
        if let Some(reason) = span.abandoned {
            events.push(Event::new(
                "abandoned",
                span.persisted.1,
                vec![KeyValue::new("baton.reason", reason.to_owned())],
                0,
            ));
        }
        let mut links = Vec::new();
        if span.attempt > 1 {
            let previous = attempt_id(&task.run_id, step, span.attempt - 1);
            links.push(Link::new(
                SpanContext::new(
                    trace_id,
                    derived_span_id(trace_id, &previous),
                    run_context.trace_flags(),
                    true,
                    run_context.trace_state().clone(),
                ),
                vec![KeyValue::new("baton.link", "previous attempt")],
                0,
            ));
        }
        // A producer: the worker's execution is its consumer.
        let builder = SpanBuilder::from_name(format!("step {}", step.step_id))
            .with_kind(SpanKind::Producer)
            .with_start_time(span.ready_at)
            .with_attributes(attributes)
            .with_events(events)
            .with_links(links);
        let parent = self.parent_of(&run_context, step);
        let mut attempt = build_with_id(
            tracer,
            builder,
            &parent,
            derived_span_id(trace_id, &task_id),
        );
        if let Some(error) = span.error {
            attempt.set_status(Status::error(error.to_owned()));
        }
        let attempt = Context::new().with_span(attempt);
        child(
            tracer,
            "queue wait",
            &attempt,
            (span.ready_at, span.dispatched_at),
        );
        child(tracer, "persist", &attempt, span.persisted);
        attempt.span().end_with_timestamp(span.persisted.1);
    }

    /// Writes the span of a step that settled without an agent: a transform, condition,
    /// parallel or approval step.
    pub fn settled(&self, run: RunSpan<'_>, span: &SettledSpan<'_>) {
        let Some(tracer) = self.tracer.as_ref() else {
            return;
        };
        let Some(run_context) = parse_traceparent(run.traceparent) else {
            return;
        };
        let key = item_key(span.step.step_id, span.step.item, span.step.visit);
        let builder = SpanBuilder::from_name(format!("step {}", span.step.step_id))
            .with_kind(SpanKind::Internal)
            .with_start_time(span.started.min(span.settled))
            .with_attributes(self.step_attributes(run, span.step));
        let parent = self.parent_of(&run_context, span.step);
        let mut step = build_with_id(
            tracer,
            builder,
            &parent,
            derived_span_id(run_context.trace_id(), &key),
        );
        if let Some(error) = span.error {
            step.set_status(Status::error(error.to_owned()));
        }
        step.end_with_timestamp(span.settled);
    }

    fn step_attributes(&self, run: RunSpan<'_>, step: StepSpan<'_>) -> Vec<KeyValue> {
        vec![
            KeyValue::new(attribute::RUN_ID, run.run_id.to_owned()),
            KeyValue::new(attribute::WORKFLOW_ID, run.workflow_id.to_owned()),
            KeyValue::new(attribute::STEP_ID, step.step_id.to_owned()),
            KeyValue::new(attribute::STEP_TYPE, step.step_type.to_owned()),
            KeyValue::new(attribute::STEP_VISIT, i64::from(step.visit)),
            KeyValue::new(attribute::COORDINATOR_ID, self.coordinator_id.clone()),
        ]
    }

    /// A branch's span is a child of its parallel step's; any other step's, of the run's.
    fn parent_of(&self, run: &SpanContext, step: StepSpan<'_>) -> Context {
        let parent = match step.parallel {
            Some((id, visit)) => SpanContext::new(
                run.trace_id(),
                derived_span_id(run.trace_id(), &visit_key(id, visit)),
                run.trace_flags(),
                true,
                run.trace_state().clone(),
            ),
            None => run.clone(),
        };
        Context::new().with_remote_span_context(parent)
    }
}

/// The task id of an attempt ([`TaskRef`]), which its span id is derived from.
fn attempt_id(run_id: &str, step: StepSpan<'_>, attempt: u32) -> String {
    let task = TaskId {
        item: step.item,
        ..TaskId::new(step.step_id, step.visit)
    };
    TaskRef::new(run_id, &task, attempt).to_string()
}

/// Starts the span `builder` describes with the id `span_id`.
fn build_with_id(
    tracer: &BoxedTracer,
    builder: SpanBuilder,
    parent: &Context,
    span_id: SpanId,
) -> BoxedSpan {
    PRESET_SPAN_ID.set(Some(span_id));
    let span = builder.start_with_context(tracer, parent);
    // Not taken: the provider does not use [`SpanIds`] (or built no span); the id must not
    // leak into the next span built on this thread.
    PRESET_SPAN_ID.set(None);
    span
}

/// A child span with its own (random) id over `times`.
fn child(
    tracer: &BoxedTracer,
    name: &'static str,
    parent: &Context,
    (start, end): (SystemTime, SystemTime),
) {
    let mut span = SpanBuilder::from_name(Cow::Borrowed(name))
        .with_start_time(start)
        .start_with_context(tracer, parent);
    span.end_with_timestamp(end.max(start));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_span_ids_depend_on_trace_and_key() {
        let a = TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
        let b = TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4737").unwrap();
        let id = derived_span_id(a, "r/s#1@1");
        assert_eq!(id, derived_span_id(a, "r/s#1@1"));
        assert_ne!(id, derived_span_id(a, "r/s#1@2"));
        assert_ne!(id, derived_span_id(b, "r/s#1@1"));
        assert_ne!(id, SpanId::INVALID);
    }

    #[test]
    fn a_task_parent_is_the_attempt_span_in_the_run_trace() {
        let traces = Traces {
            tracer: Some(opentelemetry::global::tracer("test")),
            coordinator_id: "c".into(),
        };
        let mut task = TaskTrace {
            run_traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
            run_id: "r".into(),
            workflow_id: "w".into(),
            step_id: "s".into(),
            visit: 1,
            item: None,
            agent: "a".into(),
            parallel: None,
        };
        let parent = parse_traceparent(&traces.task_traceparent(&task, 2)).unwrap();
        let trace_id = TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
        assert_eq!(parent.trace_id(), trace_id);
        assert_eq!(parent.span_id(), derived_span_id(trace_id, "r/s#1@2"));
        assert!(parent.is_sampled());
        task.run_traceparent.clear();
        assert_eq!(traces.task_traceparent(&task, 2), "");
    }
}
