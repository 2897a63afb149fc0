//! OpenTelemetry export of the coordinator's and workers' spans (and, in [`metrics`], their
//! metrics), configured the standard way.
//!
//! Spans go out by OTLP over gRPC when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; the SDK reads the rest of its settings from the
//! standard variables (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`,
//! `OTEL_BSP_*`, `OTEL_EXPORTER_OTLP_TIMEOUT`...). Unset, nothing is installed and no span is
//! built. `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn export off too.

use std::time::Duration;

pub mod metrics;

use anyhow::Context as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// The installed tracer provider, if spans are exported. Shut it down before exiting, so that
/// the last spans are flushed.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

fn set(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .filter(|value| !value.trim().is_empty())
}

/// Whether the environment asks for spans to be exported.
pub fn configured() -> bool {
    let endpoint =
        set("OTEL_EXPORTER_OTLP_ENDPOINT").or_else(|| set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"));
    let disabled = set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || set("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
    endpoint.is_some() && !disabled
}

/// Export is OTLP over gRPC only: say so rather than fail silently against an HTTP endpoint.
pub(crate) fn warn_about_protocol() {
    for name in [
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    ] {
        if let Some(protocol) = set(name)
            && protocol != "grpc"
        {
            tracing::warn!(
                name,
                protocol,
                "Baton exports OTLP over gRPC only (usually port 4317); this setting is ignored"
            );
        }
    }
}

/// The process as exports describe it: `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME`, with
/// `service` as the name and `instance` (the coordinator's or worker's id) as
/// `service.instance.id` where they give none.
fn resource(service: &'static str, instance: Option<&str>) -> Resource {
    let given =
        |key: &str| set("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| a.contains(&format!("{key}=")));
    let mut resource = Resource::builder();
    if set("OTEL_SERVICE_NAME").is_none() && !given("service.name") {
        resource = resource.with_service_name(service);
    }
    if let Some(instance) = instance
        && !given("service.instance.id")
    {
        resource = resource.with_attribute(opentelemetry::KeyValue::new(
            "service.instance.id",
            instance.to_owned(),
        ));
    }
    resource.build()
}

/// Installs the global tracer provider when [`configured`]; `service` names the process and
/// `instance` tells it from its replicas, unless `OTEL_SERVICE_NAME` or
/// `OTEL_RESOURCE_ATTRIBUTES` says otherwise. Must run inside the Tokio runtime (the gRPC
/// exporter lives on it).
pub fn init(service: &'static str, instance: Option<&str>) -> anyhow::Result<Telemetry> {
    if !configured() {
        return Ok(Telemetry { provider: None });
    }
    warn_about_protocol();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
        .context("cannot set up the OTLP span exporter")?;
    let provider = SdkTracerProvider::builder()
        .with_resource(resource(service, instance))
        // Random ids, except for the spans of step attempts, whose ids any coordinator can
        // derive (see baton_coordinator::traces).
        .with_id_generator(baton_coordinator::traces::SpanIds::default())
        .with_batch_exporter(exporter)
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    tracing::info!(service, "exporting traces by OTLP");
    Ok(Telemetry {
        provider: Some(provider),
    })
}

impl Telemetry {
    pub fn enabled(&self) -> bool {
        self.provider.is_some()
    }

    /// Flushes the spans not yet exported and stops the exporter (bounded: an unreachable
    /// collector does not hold up the exit for long).
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        // The exporter's calls run on this runtime: block another thread, not this one.
        let flushed = tokio::task::spawn_blocking(move || {
            provider.shutdown_with_timeout(Duration::from_secs(5))
        })
        .await;
        if let Ok(Err(error)) = flushed {
            tracing::warn!(%error, "could not flush the last spans");
        }
    }
}

/// A client's span around one request, so that the run it starts joins the caller's trace.
///
/// `TRACEPARENT` in the environment (as CI systems and `otel-cli` set it) is sent as it is.
/// Otherwise, when export is [`configured`], the CLI exports a client span of its own and
/// sends that. Otherwise nothing is sent, and the coordinator starts the run's trace.
pub struct ClientSpan {
    traceparent: Option<String>,
    span: Option<(opentelemetry::global::BoxedSpan, Telemetry)>,
}

impl ClientSpan {
    pub async fn start(name: &'static str) -> anyhow::Result<ClientSpan> {
        use opentelemetry::trace::{Span as _, SpanKind, Tracer as _};
        if let Some(traceparent) = set("TRACEPARENT") {
            return Ok(ClientSpan {
                traceparent: Some(traceparent),
                span: None,
            });
        }
        let telemetry = init("baton-cli", None)?;
        if !telemetry.enabled() {
            return Ok(ClientSpan {
                traceparent: None,
                span: None,
            });
        }
        let tracer = opentelemetry::global::tracer("baton-cli");
        let span = tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .start(&tracer);
        let traceparent = baton_proto::trace_context::format_traceparent(span.span_context());
        Ok(ClientSpan {
            traceparent: Some(traceparent),
            span: Some((span, telemetry)),
        })
    }

    /// What to send as the request's `traceparent`, if anything.
    pub fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }

    /// Ends the span (with `error` as its status) and flushes it.
    pub async fn end(self, error: Option<&str>) {
        use opentelemetry::trace::{Span as _, Status};
        if let Some((mut span, telemetry)) = self.span {
            if let Some(error) = error {
                span.set_status(Status::error(error.to_owned()));
            }
            span.end();
            telemetry.shutdown().await;
        }
    }
}
