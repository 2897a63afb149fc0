//! Metrics by OTLP: the instruments `/metrics` serves, pushed to a collector as well.
//!
//! The coordinator and the worker keep one set of instruments, in a Prometheus registry. When an
//! OTLP endpoint is set (`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`, or
//! `OTEL_EXPORTER_OTLP_ENDPOINT`), this reads the registry every `OTEL_METRIC_EXPORT_INTERVAL`
//! milliseconds (60 s by default), and once more at shutdown, and sends it by OTLP/gRPC:
//! counters as cumulative monotonic sums (named without `_total`, which a Prometheus exporter
//! adds back), gauges as gauges, histograms as cumulative explicit-bucket histograms.
//! `OTEL_METRICS_EXPORTER=none` or `OTEL_SDK_DISABLED=true` turn it off.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model::{
    self as prometheus, MetricFamily, MetricType,
};
use tokio::sync::oneshot;
use tonic::transport::Channel;

use super::set;

/// Reads the process's metrics now.
pub type Source = Arc<dyn Fn() -> Vec<MetricFamily> + Send + Sync>;

/// The export running in the background; [`MetricsExport::shutdown`] sends the last values.
pub struct MetricsExport {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

fn endpoint() -> Option<String> {
    let disabled = set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || set("OTEL_METRICS_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
    if disabled {
        return None;
    }
    set("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT").or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

fn millis(name: &str, default: u64) -> Duration {
    Duration::from_millis(
        set(name)
            .and_then(|v| v.trim().parse().ok())
            .filter(|&ms| ms > 0)
            .unwrap_or(default),
    )
}

/// Starts pushing `source`'s metrics when an endpoint is set; `None` (and nothing running)
/// otherwise. `service` and `instance` describe the process, as for spans. Must run inside the
/// Tokio runtime.
pub fn start(
    service: &'static str,
    instance: &str,
    source: Source,
) -> anyhow::Result<Option<MetricsExport>> {
    let Some(endpoint) = endpoint() else {
        return Ok(None);
    };
    let channel = Channel::from_shared(endpoint.clone())
        .with_context(|| format!("the OTLP metrics endpoint {endpoint} is not a URL"))?
        .connect_lazy();
    let exporter = Exporter {
        client: MetricsServiceClient::new(channel),
        resource: proto_resource(&super::resource(service, Some(instance))),
        source,
        started_ns: unix_ns(SystemTime::now()),
        timeout: millis("OTEL_METRIC_EXPORT_TIMEOUT", 30_000),
    };
    let interval = millis("OTEL_METRIC_EXPORT_INTERVAL", 60_000);
    let (stop, mut stopped) = oneshot::channel();
    let task = tokio::spawn(async move {
        let mut exporter = exporter;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(interval) => exporter.push().await,
                _ = &mut stopped => {
                    exporter.push().await;
                    return;
                }
            }
        }
    });
    tracing::info!(service, %endpoint, ?interval, "exporting metrics by OTLP");
    Ok(Some(MetricsExport { stop, task }))
}

impl MetricsExport {
    /// Sends the metrics one last time and stops.
    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

struct Exporter {
    client: MetricsServiceClient<Channel>,
    resource: Resource,
    source: Source,
    /// The start of every cumulative series: when this process started counting.
    started_ns: u64,
    timeout: Duration,
}

impl Exporter {
    async fn push(&mut self) {
        let metrics = to_otlp(
            &(self.source)(),
            self.started_ns,
            unix_ns(SystemTime::now()),
        );
        let mut request = tonic::Request::new(ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(self.resource.clone()),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(InstrumentationScope {
                        name: "baton".to_owned(),
                        version: env!("CARGO_PKG_VERSION").to_owned(),
                        ..Default::default()
                    }),
                    metrics,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        });
        request.set_timeout(self.timeout);
        if let Err(status) = self.client.export(request).await {
            tracing::warn!(code = ?status.code(), message = status.message(), "could not export metrics by OTLP");
        }
    }
}

fn unix_ns(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default()
}

fn proto_resource(resource: &opentelemetry_sdk::Resource) -> Resource {
    use opentelemetry::Value;
    Resource {
        attributes: resource
            .iter()
            .map(|(key, value)| {
                let value = match value {
                    Value::Bool(b) => any_value::Value::BoolValue(*b),
                    Value::I64(n) => any_value::Value::IntValue(*n),
                    Value::F64(x) => any_value::Value::DoubleValue(*x),
                    other => any_value::Value::StringValue(other.to_string()),
                };
                attribute(key.as_str(), value)
            })
            .collect(),
        ..Default::default()
    }
}

fn attribute(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn labels(metric: &prometheus::Metric) -> Vec<KeyValue> {
    metric
        .label
        .iter()
        .map(|pair| {
            attribute(
                &pair.name,
                any_value::Value::StringValue(pair.value.clone()),
            )
        })
        .collect()
}

/// Prometheus metric families as OTLP metrics, cumulative from `start_ns`, observed at `now_ns`.
/// Summaries and untyped families (none of Baton's) are left out.
pub fn to_otlp(families: &[MetricFamily], start_ns: u64, now_ns: u64) -> Vec<Metric> {
    let number = |metric: &prometheus::Metric, value: f64| NumberDataPoint {
        attributes: labels(metric),
        start_time_unix_nano: start_ns,
        time_unix_nano: now_ns,
        value: Some(number_data_point::Value::AsDouble(value)),
        ..Default::default()
    };
    families
        .iter()
        .filter_map(|family| {
            let (name, data) = match family.r#type() {
                MetricType::Counter => (
                    family.name.strip_suffix("_total").unwrap_or(&family.name),
                    metric::Data::Sum(Sum {
                        data_points: family
                            .metric
                            .iter()
                            .map(|m| number(m, m.counter.as_ref().map_or(0.0, |c| c.value)))
                            .collect(),
                        aggregation_temporality: AggregationTemporality::Cumulative as i32,
                        is_monotonic: true,
                    }),
                ),
                MetricType::Gauge => (
                    family.name.as_str(),
                    metric::Data::Gauge(Gauge {
                        data_points: family
                            .metric
                            .iter()
                            .map(|m| number(m, m.gauge.as_ref().map_or(0.0, |g| g.value)))
                            .collect(),
                    }),
                ),
                MetricType::Histogram => (
                    family.name.as_str(),
                    metric::Data::Histogram(Histogram {
                        data_points: family
                            .metric
                            .iter()
                            .filter_map(|m| {
                                let histogram = m.histogram.as_ref()?;
                                Some(histogram_point(histogram, labels(m), start_ns, now_ns))
                            })
                            .collect(),
                        aggregation_temporality: AggregationTemporality::Cumulative as i32,
                    }),
                ),
                _ => return None,
            };
            // UCUM units, which a Prometheus exporter maps back to the `_seconds` suffix.
            let unit = match &family.unit {
                unit if !unit.is_empty() => unit.clone(),
                _ if name.ends_with("_seconds") => "s".to_owned(),
                _ => String::new(),
            };
            Some(Metric {
                name: name.to_owned(),
                description: family.help.clone(),
                unit,
                data: Some(data),
                ..Default::default()
            })
        })
        .collect()
}

/// Prometheus's cumulative buckets (the `+Inf` one optional) as OTLP's counts per bucket, the
/// last bucket above the last finite bound.
fn histogram_point(
    histogram: &prometheus::Histogram,
    attributes: Vec<KeyValue>,
    start_ns: u64,
    now_ns: u64,
) -> HistogramDataPoint {
    let mut explicit_bounds = Vec::new();
    let mut bucket_counts = Vec::new();
    let mut below = 0;
    for bucket in &histogram.bucket {
        if bucket.upper_bound.is_infinite() {
            continue;
        }
        explicit_bounds.push(bucket.upper_bound);
        bucket_counts.push(bucket.cumulative_count.saturating_sub(below));
        below = bucket.cumulative_count;
    }
    bucket_counts.push(histogram.sample_count.saturating_sub(below));
    HistogramDataPoint {
        attributes,
        start_time_unix_nano: start_ns,
        time_unix_nano: now_ns,
        count: histogram.sample_count,
        sum: Some(histogram.sample_sum),
        bucket_counts,
        explicit_bounds,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::prometheus_protobuf;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge as PromGauge;
    use prometheus_client::metrics::histogram::Histogram as PromHistogram;
    use prometheus_client::registry::Registry;

    use super::*;

    fn metric<'a>(metrics: &'a [Metric], name: &str) -> &'a metric::Data {
        metrics
            .iter()
            .find(|m| m.name == name)
            .and_then(|m| m.data.as_ref())
            .unwrap_or_else(|| panic!("no {name} in {metrics:#?}"))
    }

    fn value(point: &NumberDataPoint) -> f64 {
        match point.value {
            Some(number_data_point::Value::AsDouble(x)) => x,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn counters_gauges_and_histograms_become_otlp_metrics() {
        let mut registry = Registry::with_prefix("baton");
        let runs: Family<Vec<(String, String)>, Counter> = Family::default();
        registry.register("runs_finished", "Runs by status", runs.clone());
        runs.get_or_create(&vec![("status".into(), "failed".into())])
            .inc_by(3);
        let depth = PromGauge::<i64>::default();
        registry.register("queue_depth", "Waiting tasks", depth.clone());
        depth.set(7);
        let waits = PromHistogram::new([0.1, 1.0]);
        registry.register("wait_seconds", "Waits", waits.clone());
        for seconds in [0.05, 0.5, 0.7, 5.0] {
            waits.observe(seconds);
        }
        let families = prometheus_protobuf::encode(&registry).unwrap();

        let metrics = to_otlp(&families, 10, 20);
        let metric::Data::Sum(sum) = metric(&metrics, "baton_runs_finished") else {
            panic!("a counter is a sum")
        };
        assert!(sum.is_monotonic);
        assert_eq!(
            sum.aggregation_temporality,
            AggregationTemporality::Cumulative as i32
        );
        let point = &sum.data_points[0];
        assert_eq!(value(point), 3.0);
        assert_eq!((point.start_time_unix_nano, point.time_unix_nano), (10, 20));
        assert_eq!(point.attributes[0].key, "status");

        let metric::Data::Gauge(gauge) = metric(&metrics, "baton_queue_depth") else {
            panic!("a gauge is a gauge")
        };
        assert_eq!(value(&gauge.data_points[0]), 7.0);

        let metric::Data::Histogram(histogram) = metric(&metrics, "baton_wait_seconds") else {
            panic!("a histogram is a histogram")
        };
        let point = &histogram.data_points[0];
        assert_eq!(point.count, 4);
        assert_eq!(point.sum, Some(6.25));
        assert_eq!(point.explicit_bounds, [0.1, 1.0]);
        let unit = |name: &str| &metrics.iter().find(|m| m.name == name).unwrap().unit;
        assert_eq!(unit("baton_wait_seconds"), "s");
        assert_eq!(unit("baton_queue_depth"), "");
        // Per bucket, not cumulative: one up to 0.1, two up to 1, one above.
        assert_eq!(point.bucket_counts, [1, 2, 1]);
    }
}
