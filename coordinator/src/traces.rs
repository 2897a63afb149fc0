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

use opentelemetry::global::{BoxedSpan, BoxedTracer};
use opentelemetry::trace::{
    Event, Link, Span as _, SpanBuilder, SpanContext, SpanId, SpanKind, Status, TraceContextExt,
    TraceId,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
use sha2::{Digest, Sha256};

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
    pub step_type: &'a str,
    /// The parallel step (id, visit) this step is a branch of: its span is the parent.
    pub parallel: Option<(&'a str, u32)>,
}

/// One attempt of an agent step, from ready to persisted.
#[derive(Debug, Clone)]
pub struct AttemptSpan<'a> {
    pub step: StepSpan<'a>,
    pub agent: &'a str,
    pub attempt: u32,
    pub worker_id: &'a str,
    /// When it became ready for a worker (queued, or delivered again).
    pub ready_at: SystemTime,
    /// When it went to its worker.
    pub dispatched_at: SystemTime,
    /// When the coordinator started and finished recording the answer.
    pub persisted: (SystemTime, SystemTime),
    /// The attempt's error, which is the span's status.
    pub error: Option<&'a str>,
    /// The backoff before the next attempt, when the error is retried.
    pub retry_after_ms: Option<u64>,
}

/// A step that settled, other than an agent's attempt.
#[derive(Debug, Clone, Copy)]
pub struct SettledSpan<'a> {
    pub step: StepSpan<'a>,
    pub started: SystemTime,
    pub settled: SystemTime,
    pub error: Option<&'a str>,
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
    pub fn submit(&self, client_traceparent: &str) -> Option<BoxedSpan> {
        let tracer = self.tracer.as_ref()?;
        let parent = match parse_traceparent(client_traceparent) {
            Some(remote) => Context::new().with_remote_span_context(remote),
            None => Context::new(),
        };
        let span = SpanBuilder::from_name("SubmitRun")
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", "baton.v1.RunService"),
                KeyValue::new("rpc.method", "SubmitRun"),
                KeyValue::new(attribute::COORDINATOR_ID, self.coordinator_id.clone()),
            ])
            .start_with_context(tracer, &parent);
        Some(span)
    }

    /// The `traceparent` a worker gets with attempt `task_id` of a step: the attempt span's
    /// context. Empty when traces are off or the run has no trace.
    pub fn task_traceparent(&self, run_traceparent: &str, task_id: &str) -> String {
        if !self.enabled() {
            return String::new();
        }
        let Some(run) = parse_traceparent(run_traceparent) else {
            return String::new();
        };
        let span_id = derived_span_id(run.trace_id(), task_id);
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
    /// retried, and a link to the attempt before it.
    pub fn attempt(&self, run: RunSpan<'_>, span: &AttemptSpan<'_>) {
        let Some(tracer) = self.tracer.as_ref() else {
            return;
        };
        let Some(run_context) = parse_traceparent(run.traceparent) else {
            return;
        };
        let trace_id = run_context.trace_id();
        let task_id = attempt_id(run.run_id, span.step, span.attempt);
        let mut attributes = self.step_attributes(run, span.step);
        attributes.extend([
            KeyValue::new(attribute::AGENT, span.agent.to_owned()),
            KeyValue::new(attribute::ATTEMPT, i64::from(span.attempt)),
            KeyValue::new(attribute::WORKER_ID, span.worker_id.to_owned()),
        ]);
        let mut events = vec![Event::new(
            "dispatched",
            span.dispatched_at,
            vec![KeyValue::new(
                attribute::WORKER_ID,
                span.worker_id.to_owned(),
            )],
            0,
        )];
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
        let mut links = Vec::new();
        if span.attempt > 1 {
            let previous = attempt_id(run.run_id, span.step, span.attempt - 1);
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
        let builder = SpanBuilder::from_name(format!("step {}", span.step.step_id))
            .with_kind(SpanKind::Internal)
            .with_start_time(span.ready_at)
            .with_attributes(attributes)
            .with_events(events)
            .with_links(links);
        let parent = self.parent_of(&run_context, span.step);
        let mut step = build_with_id(
            tracer,
            builder,
            &parent,
            derived_span_id(trace_id, &task_id),
        );
        if let Some(error) = span.error {
            step.set_status(Status::error(error.to_owned()));
        }
        let step_context = Context::new().with_remote_span_context(step.span_context().clone());
        child(
            tracer,
            "queue wait",
            &step_context,
            (span.ready_at, span.dispatched_at),
        );
        child(tracer, "persist", &step_context, span.persisted);
        step.end_with_timestamp(span.persisted.1);
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
        let key = format!("{}#{}", span.step.step_id, span.step.visit);
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
                derived_span_id(run.trace_id(), &format!("{id}#{visit}")),
                run.trace_flags(),
                true,
                run.trace_state().clone(),
            ),
            None => run.clone(),
        };
        Context::new().with_remote_span_context(parent)
    }
}

/// The task id of attempt `attempt` of a step visit (as [`crate::model::task_id`] spells it).
fn attempt_id(run_id: &str, step: StepSpan<'_>, attempt: u32) -> String {
    format!("{run_id}/{}#{}@{attempt}", step.step_id, step.visit)
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
        let run = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let task = parse_traceparent(&traces.task_traceparent(run, "r/s#1@2")).unwrap();
        let trace_id = TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
        assert_eq!(task.trace_id(), trace_id);
        assert_eq!(task.span_id(), derived_span_id(trace_id, "r/s#1@2"));
        assert!(task.is_sampled());
        assert_eq!(Traces::off().task_traceparent(run, "r/s#1@2"), "");
        assert_eq!(traces.task_traceparent("", "r/s#1@2"), "");
    }
}
