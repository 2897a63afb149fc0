//! W3C trace context (`traceparent`), as a `SubmitRun` request's metadata and a task carry it.

use std::collections::HashMap;

use opentelemetry::Context;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The trace context a W3C `traceparent` names; `None` when it names none (empty or malformed).
pub fn parse_traceparent(traceparent: &str) -> Option<SpanContext> {
    if traceparent.is_empty() {
        return None;
    }
    let carrier = HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    let context = TraceContextPropagator::new().extract(&carrier);
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then_some(span_context)
}

/// `span_context` as a W3C `traceparent`.
pub fn format_traceparent(span_context: &SpanContext) -> String {
    let mut carrier = HashMap::new();
    let context = Context::new().with_remote_span_context(span_context.clone());
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier.remove("traceparent").unwrap_or_default()
}

/// The trace id in a `traceparent`, as 32 hex digits; empty when there is none.
pub fn trace_id_of(traceparent: &str) -> String {
    parse_traceparent(traceparent)
        .map(|context| context.trace_id().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = parse_traceparent(text).expect("a valid traceparent");
        assert_eq!(
            context.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(format_traceparent(&context), text);
        assert_eq!(trace_id_of(text), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn malformed_traceparents_name_no_trace() {
        for text in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        ] {
            assert!(parse_traceparent(text).is_none(), "{text}");
            assert_eq!(trace_id_of(text), "");
        }
    }
}
