//! The worker's metrics, in the Prometheus text format (`baton worker` serves them on
//! `/metrics`): tasks by agent and outcome, how long they took, how many run now.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use prometheus_client::encoding::prometheus_protobuf;
use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model::MetricFamily;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// Seconds, from 1 ms to about 9 hours.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 4.0, 13))
}

/// What a worker counts.
pub struct WorkerMetrics {
    registry: Registry,
    tasks: Family<Labels, Counter>,
    duration: Family<Labels, Histogram, fn() -> Histogram>,
    running: Gauge,
    sessions: Counter<u64, AtomicU64>,
    connected: Gauge,
    llm_tokens: Family<Labels, Counter>,
    llm_request: Family<Labels, Histogram, fn() -> Histogram>,
    llm_first_token: Family<Labels, Histogram, fn() -> Histogram>,
}

impl WorkerMetrics {
    pub(crate) fn new(concurrency: usize) -> Arc<Self> {
        let mut registry = Registry::with_prefix("baton_worker");
        let tasks = Family::<Labels, Counter>::default();
        let duration: Family<Labels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(seconds_histogram);
        let running = Gauge::default();
        let slots: Gauge = Gauge::default();
        slots.set(concurrency as i64);
        let sessions = Counter::default();
        let connected = Gauge::default();
        registry.register(
            "tasks",
            "Tasks run, by agent and outcome (succeeded, failed, cancelled)",
            tasks.clone(),
        );
        registry.register(
            "task_duration_seconds",
            "How long agents took, by agent",
            duration.clone(),
        );
        registry.register("running_tasks", "Tasks running now", running.clone());
        registry.register("slots", "Tasks this worker runs at once", slots);
        registry.register(
            "sessions",
            "Streams opened to a coordinator (more than one: it reconnected)",
            sessions.clone(),
        );
        registry.register(
            "connected",
            "1 while the worker holds a stream to a coordinator (what /readyz reports)",
            connected.clone(),
        );
        let llm_tokens = Family::<Labels, Counter>::default();
        let llm_request: Family<Labels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(seconds_histogram);
        let llm_first_token: Family<Labels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(seconds_histogram);
        registry.register(
            "llm_tokens",
            "Tokens models used, by agent, model and kind (prompt or completion)",
            llm_tokens.clone(),
        );
        registry.register(
            "llm_request_seconds",
            "How long calls to models took, by agent and model",
            llm_request.clone(),
        );
        registry.register(
            "llm_time_to_first_token_seconds",
            "How long streamed calls to models took to their first token, by agent and model",
            llm_first_token.clone(),
        );
        Arc::new(WorkerMetrics {
            registry,
            tasks,
            duration,
            running,
            sessions,
            connected,
            llm_tokens,
            llm_request,
            llm_first_token,
        })
    }

    pub(crate) fn session_opened(&self) {
        self.sessions.inc();
        self.connected.set(1);
    }

    pub(crate) fn session_closed(&self) {
        self.connected.set(0);
    }

    /// Whether the worker holds a stream to a coordinator now: the worker's readiness.
    pub fn connected(&self) -> bool {
        self.connected.get() > 0
    }

    /// A task starts: counted as running until [`RunningTask::finished`], or as cancelled if
    /// dropped first (its run was cancelled, or it was superseded).
    pub(crate) fn task_started(self: &Arc<Self>, agent: &str) -> RunningTask {
        self.running.inc();
        RunningTask {
            metrics: self.clone(),
            agent: agent.to_owned(),
            started: Instant::now(),
            done: false,
        }
    }

    /// The calls to models an attempt made: their tokens, durations and time to first token.
    pub(crate) fn model_calls(&self, agent: &str, calls: &[crate::ModelCall]) {
        for call in calls {
            let by_model = vec![
                ("agent".to_owned(), agent.to_owned()),
                ("model".to_owned(), call.model.clone()),
            ];
            for (kind, tokens) in [
                ("prompt", call.prompt_tokens),
                ("completion", call.completion_tokens),
            ] {
                let mut labels = by_model.clone();
                labels.push(("kind".to_owned(), kind.to_owned()));
                self.llm_tokens.get_or_create(&labels).inc_by(tokens);
            }
            self.llm_request
                .get_or_create(&by_model)
                .observe(call.duration.as_secs_f64());
            if let Some(first) = call.first_token {
                self.llm_first_token
                    .get_or_create(&by_model)
                    .observe(first.as_secs_f64());
            }
        }
    }

    fn count(&self, agent: &str, outcome: &str, took: Duration) {
        let labels = vec![
            ("agent".to_owned(), agent.to_owned()),
            ("outcome".to_owned(), outcome.to_owned()),
        ];
        self.tasks.get_or_create(&labels).inc();
        self.duration
            .get_or_create(&vec![("agent".to_owned(), agent.to_owned())])
            .observe(took.as_secs_f64());
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }

    /// The same metrics as data (Prometheus's protobuf model), for export by OTLP.
    pub fn families(&self) -> Vec<MetricFamily> {
        prometheus_protobuf::encode(&self.registry).expect("encoding to memory cannot fail")
    }
}

/// A task being run, for the metrics.
pub(crate) struct RunningTask {
    metrics: Arc<WorkerMetrics>,
    agent: String,
    started: Instant,
    done: bool,
}

impl RunningTask {
    pub(crate) fn finished(mut self, succeeded: bool) {
        self.done = true;
        let outcome = if succeeded { "succeeded" } else { "failed" };
        self.metrics
            .count(&self.agent, outcome, self.started.elapsed());
    }
}

impl Drop for RunningTask {
    fn drop(&mut self) {
        self.metrics.running.dec();
        if !self.done {
            self.metrics
                .count(&self.agent, "cancelled", self.started.elapsed());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, name: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(name))
    }

    #[test]
    fn tasks_are_counted_by_outcome_and_a_dropped_one_as_cancelled() {
        let metrics = WorkerMetrics::new(2);
        metrics.task_started("coder").finished(true);
        metrics.task_started("coder").finished(false);
        let running = metrics.task_started("coder");
        let text = metrics.render();
        assert_eq!(
            line(&text, "baton_worker_running_tasks "),
            Some("baton_worker_running_tasks 1")
        );
        drop(running);
        let text = metrics.render();
        for outcome in ["succeeded", "failed", "cancelled"] {
            let name = format!("baton_worker_tasks_total{{agent=\"coder\",outcome=\"{outcome}\"}}");
            assert_eq!(
                line(&text, &name),
                Some(format!("{name} 1").as_str()),
                "{text}"
            );
        }
        assert_eq!(
            line(&text, "baton_worker_running_tasks "),
            Some("baton_worker_running_tasks 0")
        );
        assert_eq!(
            line(&text, "baton_worker_slots "),
            Some("baton_worker_slots 2")
        );
    }
}
