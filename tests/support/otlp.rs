//! An OTLP collector's trace service, in the test process: it keeps every span it is sent, for
//! tests to check the traces real `baton` processes export.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};

/// A span as the receiver got it, with ids in hex and attributes as text.
#[derive(Debug, Clone)]
pub struct Received {
    pub service: String,
    pub resource: BTreeMap<String, String>,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub name: String,
    pub attributes: BTreeMap<String, String>,
    /// 2 is ERROR.
    pub status_code: i32,
    pub status_message: String,
    pub events: Vec<String>,
    /// (span id, attributes) of each link.
    pub links: Vec<(String, BTreeMap<String, String>)>,
    pub start_ns: u64,
    pub end_ns: u64,
}

impl Received {
    pub fn attribute(&self, key: &str) -> &str {
        self.attributes
            .get(key)
            .unwrap_or_else(|| panic!("span {} has no {key}: {self:#?}", self.name))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: &Option<AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(n)) => n.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn attributes(pairs: &[KeyValue]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|kv| (kv.key.clone(), text(&kv.value)))
        .collect()
}

/// The in-process OTLP receiver: keeps every span it is sent.
#[derive(Clone, Default)]
pub struct Receiver {
    spans: Arc<Mutex<Vec<Received>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let resource = resource_spans
                .resource
                .map(|r| attributes(&r.attributes))
                .unwrap_or_default();
            let service = resource.get("service.name").cloned().unwrap_or_default();
            for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
                let status = span.status.unwrap_or_default();
                spans.push(Received {
                    service: service.clone(),
                    resource: resource.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name,
                    attributes: attributes(&span.attributes),
                    status_code: status.code,
                    status_message: status.message,
                    events: span.events.into_iter().map(|e| e.name).collect(),
                    links: span
                        .links
                        .into_iter()
                        .map(|l| (hex(&l.span_id), attributes(&l.attributes)))
                        .collect(),
                    start_ns: span.start_time_unix_nano,
                    end_ns: span.end_time_unix_nano,
                });
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Receiver {
    /// Serves OTLP/gRPC on a free loopback port, for as long as the test runs.
    pub async fn start() -> (Receiver, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let receiver = Receiver::default();
        let service = TraceServiceServer::new(receiver.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        (receiver, format!("http://{address}"))
    }

    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits (bounded) until `ready` holds of the spans received, and returns them.
    pub async fn wait_for(&self, what: &str, ready: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let spans = self.spans();
            if ready(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "the receiver never got {what}; it has:\n{}",
                spans
                    .iter()
                    .map(|s| format!("  {} {} {:?}\n", s.service, s.name, s.attributes))
                    .collect::<String>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The run's spans: those of its trace.
pub fn of_trace<'a>(spans: &'a [Received], trace_id: &str) -> Vec<&'a Received> {
    spans.iter().filter(|s| s.trace_id == trace_id).collect()
}

pub fn named<'a>(spans: &[&'a Received], name: &str) -> Vec<&'a Received> {
    spans.iter().copied().filter(|s| s.name == name).collect()
}

pub fn one<'a>(spans: &[&'a Received], name: &str) -> &'a Received {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "one span {name}: {spans:#?}");
    found[0]
}

/// Every span of `trace` has its own id, and every parent is a span of the trace, except the
/// root's, which may be `outside` (the caller's span) or none.
pub fn assert_connected(trace: &[&Received], outside: &str) {
    let mut ids: Vec<&str> = trace.iter().map(|s| s.span_id.as_str()).collect();
    ids.sort();
    let before = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), before, "a span id twice: {trace:#?}");
    for span in trace {
        let parent = span.parent_span_id.as_str();
        assert!(
            parent.is_empty() || parent == outside || ids.binary_search(&parent).is_ok(),
            "the parent of {} ({parent}) is not in the trace: {trace:#?}",
            span.name
        );
    }
    let roots = trace
        .iter()
        .filter(|s| s.parent_span_id.is_empty() || s.parent_span_id == outside)
        .count();
    assert_eq!(roots, 1, "one root: {trace:#?}");
}
