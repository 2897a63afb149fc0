//! The worker's span of an agent's execution: a child of the coordinator's span of the step's
//! attempt, whose context the task carries (`Task.traceparent`).

use opentelemetry::global::BoxedSpan;
use opentelemetry::trace::{Span as _, SpanBuilder, SpanKind, Status, TraceContextExt};
use opentelemetry::{Context, KeyValue};

use baton_proto::trace_context::{format_traceparent, parse_traceparent};

/// The span of one execution, or nothing when traces are off or the task has no trace.
pub(crate) struct ExecutionSpan {
    span: Option<BoxedSpan>,
    /// What the agent is given as its own `traceparent`: this span's context, or the task's.
    pub(crate) traceparent: String,
}

impl ExecutionSpan {
    pub(crate) fn start(enabled: bool, worker_id: &str, task: &baton_proto::v1::Task) -> Self {
        let parent = enabled
            .then(|| parse_traceparent(&task.traceparent))
            .flatten();
        let Some(parent) = parent else {
            return ExecutionSpan {
                span: None,
                traceparent: task.traceparent.clone(),
            };
        };
        let tracer = opentelemetry::global::tracer("baton-worker");
        let span = SpanBuilder::from_name(format!("execute {}", task.agent))
            .with_kind(SpanKind::Consumer)
            .with_attributes([
                KeyValue::new("baton.run.id", task.run_id.clone()),
                KeyValue::new("baton.step.id", task.step_id.clone()),
                KeyValue::new("baton.step.visit", i64::from(task.visit)),
                KeyValue::new("baton.agent", task.agent.clone()),
                KeyValue::new("baton.attempt", i64::from(task.attempt)),
                KeyValue::new("baton.worker.id", worker_id.to_owned()),
                KeyValue::new("baton.task.id", task.task_id.clone()),
            ])
            .start_with_context(&tracer, &Context::new().with_remote_span_context(parent));
        ExecutionSpan {
            traceparent: format_traceparent(span.span_context()),
            span: Some(span),
        }
    }

    /// The trace and span ids, as log lines carry them (empty when there is no span).
    pub(crate) fn ids(&self) -> (String, String) {
        match &self.span {
            Some(span) => {
                let context = span.span_context();
                (
                    context.trace_id().to_string(),
                    context.span_id().to_string(),
                )
            }
            None => Default::default(),
        }
    }

    /// Names the calls to models the execution made, as OpenTelemetry's GenAI conventions do
    /// (`gen_ai.*`; tokens summed over the calls, the model and provider of the last one).
    pub(crate) fn record_calls(&mut self, calls: &[crate::ModelCall]) {
        let (Some(span), Some(last)) = (self.span.as_mut(), calls.last()) else {
            return;
        };
        let input: u64 = calls.iter().map(|call| call.prompt_tokens).sum();
        let output: u64 = calls.iter().map(|call| call.completion_tokens).sum();
        let reasons: Vec<opentelemetry::StringValue> = calls
            .iter()
            .filter_map(|call| call.finish_reason.clone())
            .map(Into::into)
            .collect();
        span.set_attribute(KeyValue::new("gen_ai.system", last.system.clone()));
        span.set_attribute(KeyValue::new("gen_ai.request.model", last.model.clone()));
        span.set_attribute(KeyValue::new("gen_ai.usage.input_tokens", input as i64));
        span.set_attribute(KeyValue::new("gen_ai.usage.output_tokens", output as i64));
        if !reasons.is_empty() {
            span.set_attribute(KeyValue::new(
                "gen_ai.response.finish_reasons",
                opentelemetry::Value::Array(reasons.into()),
            ));
        }
    }

    /// Ends the span, with the agent's error as its status.
    pub(crate) fn finish(mut self, error: Option<&str>) {
        if let Some(mut span) = self.span.take() {
            if let Some(error) = error {
                span.set_status(Status::error(error.to_owned()));
            }
            span.end();
        }
    }
}

/// An execution dropped before it finished was stopped: its coordinator cancelled it (the run
/// no longer needed it, or it timed out) or the worker is going away.
impl Drop for ExecutionSpan {
    fn drop(&mut self) {
        if let Some(mut span) = self.span.take() {
            span.add_event("cancelled", Vec::new());
            span.set_status(Status::error("stopped before it finished"));
            span.end();
        }
    }
}
