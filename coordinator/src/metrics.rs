//! The coordinator's metrics, in the Prometheus text format on `/metrics`.
//!
//! Counters and histograms are updated where things happen; gauges that describe the hub (queue
//! depth, oldest queued task, workers, free slots) are read from it when scraped. The queue depth
//! and the age of the oldest queued task, per agent, are the signals to scale workers on.

use std::sync::Arc;
use std::time::Duration;

use baton_core::AgentName;

use prometheus_client::encoding::prometheus_protobuf;
pub use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model::MetricFamily;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// `operation="..."`, static, so that timing a store call allocates nothing.
type OperationLabel = [(&'static str, &'static str); 1];

/// A label whose value is one of a fixed set (a status, a step type): nothing to allocate.
type StaticLabel = (&'static str, &'static str);

/// The agent a task is for, the name shared with the task rather than copied for each
/// observation (two per task: its queue wait and its duration).
type AgentLabel = [(&'static str, Arc<str>); 1];

/// A worker's message refused because the worker does not hold what it names (or, for a hello,
/// because its id is another principal's worker's): the `message` label of
/// `worker_messages_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// A hello whose worker id a worker of another principal holds.
    Hello,
    /// A task a hello names as still running (`Hello.held`) that is not this worker's.
    Held,
    /// A `ResendTask` for a task this worker's stream does not hold.
    Resend,
    /// A `TaskResult` for a task this worker's stream does not hold (also a fenced result).
    Result,
    /// A piece of live output for a task this worker's stream does not hold.
    Output,
    /// A `WorkerService.QueryDecisions` naming a worker that is not the caller's principal's,
    /// or a task that worker does not hold.
    Query,
}

impl Refused {
    pub fn label(self) -> &'static str {
        match self {
            Refused::Hello => "hello",
            Refused::Held => "held",
            Refused::Resend => "resend",
            Refused::Result => "result",
            Refused::Output => "output",
            Refused::Query => "query",
        }
    }
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Seconds, from 1 ms to about 9 hours (an approval or a long agent).
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 4.0, 13))
}

/// Seconds, from 50 µs to about 1.6 s: a store round trip.
fn store_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

/// What the coordinator counts and measures.
pub struct Metrics {
    registry: Registry,
    runs_started: Counter,
    runs_finished: Family<[StaticLabel; 1], Counter>,
    steps: Family<[StaticLabel; 2], Counter>,
    task_duration: Family<AgentLabel, Histogram, fn() -> Histogram>,
    queue_wait: Family<AgentLabel, Histogram, fn() -> Histogram>,
    store_requests: Family<OperationLabel, Histogram, fn() -> Histogram>,
    queue_depth: Family<Labels, Gauge>,
    queue_oldest: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    workers: Gauge,
    runs_in_memory: Gauge,
    free_slots: Family<Labels, Gauge>,
    pub(crate) redeliveries: Counter,
    pub(crate) rebalanced: Counter,
    pub(crate) retries: Counter,
    pub(crate) timeouts: Counter,
    pub(crate) fenced: Counter,
    pub(crate) integrity_failures: Counter,
    computations_waiting: Gauge,
    jq_cpu: Counter<f64, std::sync::atomic::AtomicU64>,
    refused: Family<OperationLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("baton");
        let metrics = Metrics {
            runs_started: Counter::default(),
            runs_finished: Family::default(),
            steps: Family::default(),
            task_duration: Family::new_with_constructor(seconds_histogram),
            queue_wait: Family::new_with_constructor(seconds_histogram),
            store_requests: Family::new_with_constructor(store_histogram),
            queue_depth: Family::default(),
            queue_oldest: Family::default(),
            workers: Gauge::default(),
            runs_in_memory: Gauge::default(),
            free_slots: Family::default(),
            redeliveries: Counter::default(),
            rebalanced: Counter::default(),
            retries: Counter::default(),
            timeouts: Counter::default(),
            fenced: Counter::default(),
            integrity_failures: Counter::default(),
            computations_waiting: Gauge::default(),
            jq_cpu: Counter::default(),
            refused: Family::default(),
            registry: Registry::default(),
        };
        // In this order in /metrics.
        metrics.register_runs_and_tasks(&mut registry);
        metrics.register_queues_and_workers(&mut registry);
        metrics.register_repairs_and_refusals(&mut registry);
        Metrics {
            registry,
            ..metrics
        }
    }
}

impl Metrics {
    /// Runs, step visits, tasks and the store's round trips.
    fn register_runs_and_tasks(&self, registry: &mut Registry) {
        registry.register(
            "runs_started",
            "Runs submitted to this coordinator",
            self.runs_started.clone(),
        );
        registry.register(
            "runs_finished",
            "Runs this coordinator saw finish, by status",
            self.runs_finished.clone(),
        );
        registry.register(
            "steps",
            "Step visits settled by this coordinator, by step type and outcome",
            self.steps.clone(),
        );
        registry.register(
            "task_duration_seconds",
            "Agent tasks from the moment a worker got them to their answer, by agent",
            self.task_duration.clone(),
        );
        registry.register(
            "task_queue_wait_seconds",
            "Agent tasks from ready to sent to a worker, by agent",
            self.queue_wait.clone(),
        );
        registry.register(
            "store_request_seconds",
            "Round trips to the store (Redis), by operation: a transition is one script call",
            self.store_requests.clone(),
        );
    }

    /// What waits for a worker, and the workers.
    fn register_queues_and_workers(&self, registry: &mut Registry) {
        registry.register(
            "queue_depth",
            "Tasks ready and waiting for a worker in this coordinator, by agent: scale workers on it",
            self.queue_depth.clone(),
        );
        registry.register(
            "queue_oldest_age_seconds",
            "How long the oldest waiting task of each agent has waited",
            self.queue_oldest.clone(),
        );
        registry.register(
            "workers_connected",
            "Workers connected to this coordinator",
            self.workers.clone(),
        );
        registry.register(
            "runs_in_memory",
            "Runs this coordinator holds in memory; one untouched for --run-idle-ms is dropped",
            self.runs_in_memory.clone(),
        );
        registry.register(
            "worker_free_slots",
            "Free slots of the connected workers, by agent",
            self.free_slots.clone(),
        );
    }

    /// What went wrong and was repaired or refused, and the runs' computations.
    fn register_repairs_and_refusals(&self, registry: &mut Registry) {
        registry.register(
            "lease_expiries",
            "Tasks delivered again because their worker or coordinator was lost",
            self.redeliveries.clone(),
        );
        registry.register(
            "tasks_rebalanced",
            "Tasks that waited here for a slot and moved to coordinators whose workers had room",
            self.rebalanced.clone(),
        );
        registry.register(
            "retries",
            "Failed attempts scheduled again by a retry policy",
            self.retries.clone(),
        );
        registry.register(
            "timeouts",
            "Attempts that ran past their step's timeout_ms",
            self.timeouts.clone(),
        );
        registry.register(
            "fenced_results",
            "Answers refused because their attempt was no longer current",
            self.fenced.clone(),
        );
        registry.register(
            "integrity_failures",
            "Stored data that did not match the run's state chain",
            self.integrity_failures.clone(),
        );
        registry.register(
            "computations_waiting",
            "Runs waiting here for their turn to run a step's jq program",
            self.computations_waiting.clone(),
        );
        registry.register(
            "jq_cpu_seconds",
            "CPU time the jq programs of runs used, in this coordinator's sandboxes",
            self.jq_cpu.clone(),
        );
        registry.register(
            "worker_messages_refused",
            "Workers' messages refused because the worker does not hold the task they name, by message (held, resend, result, output, query), or a hello whose worker id another principal's worker holds (hello)",
            self.refused.clone(),
        );
    }
}

/// The hub's state and the run cache's size when scraped.
pub struct Gauges {
    pub workers: usize,
    /// Runs held in memory.
    pub runs_in_memory: usize,
    /// Per agent: free slots.
    pub free_slots: Vec<(String, usize)>,
    /// Per agent: tasks waiting, and how long the oldest has waited.
    pub queues: Vec<(String, usize, Duration)>,
    /// Runs waiting for their turn to run a step's jq program.
    pub computations_waiting: usize,
}

impl Metrics {
    pub fn run_started(&self) {
        self.runs_started.inc();
    }

    pub fn jq_ran(&self, cpu: Duration) {
        self.jq_cpu.inc_by(cpu.as_secs_f64());
    }

    pub fn run_finished(&self, status: &'static str) {
        self.runs_finished
            .get_or_create(&[("status", status)])
            .inc();
    }

    pub fn step_settled(&self, step_type: &'static str, outcome: &'static str) {
        self.steps
            .get_or_create(&[("type", step_type), ("outcome", outcome)])
            .inc();
    }

    /// A worker's message was refused: it named what the worker does not hold.
    pub fn worker_refused(&self, message: Refused) {
        self.refused
            .get_or_create(&[("message", message.label())])
            .inc();
    }

    pub fn task_answered(&self, agent: &AgentName, took: Duration) {
        self.task_duration
            .get_or_create(&[("agent", agent.clone().into())])
            .observe(took.as_secs_f64());
    }

    pub fn task_sent(&self, agent: &AgentName, waited: Duration) {
        self.queue_wait
            .get_or_create(&[("agent", agent.clone().into())])
            .observe(waited.as_secs_f64());
    }

    /// What the store's calls report their latency to ([`crate::store::timed`]).
    pub fn store_observer(&self) -> crate::store::timed::Observer {
        let requests = self.store_requests.clone();
        std::sync::Arc::new(move |operation, took: Duration| {
            requests
                .get_or_create(&[("operation", operation)])
                .observe(took.as_secs_f64());
        })
    }

    /// The text exposition, with the hub's gauges as they are now.
    pub fn render(&self, hub: Gauges) -> String {
        self.refresh(hub);
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }

    /// The same metrics as data (Prometheus's protobuf model), for export by OTLP.
    pub fn families(&self, hub: Gauges) -> Vec<MetricFamily> {
        self.refresh(hub);
        prometheus_protobuf::encode(&self.registry).expect("encoding to memory cannot fail")
    }

    /// Sets the hub's gauges to what `hub` says.
    fn refresh(&self, hub: Gauges) {
        self.workers.set(hub.workers as i64);
        self.runs_in_memory.set(hub.runs_in_memory as i64);
        self.computations_waiting
            .set(hub.computations_waiting as i64);
        // Agents no longer seen read 0 rather than their last value.
        self.queue_depth.clear();
        self.queue_oldest.clear();
        self.free_slots.clear();
        for (agent, slots) in hub.free_slots {
            self.free_slots
                .get_or_create(&labels(&[("agent", &agent)]))
                .set(slots as i64);
        }
        for (agent, depth, oldest) in hub.queues {
            let agent = labels(&[("agent", &agent)]);
            self.queue_depth.get_or_create(&agent).set(depth as i64);
            self.queue_oldest
                .get_or_create(&agent)
                .set(oldest.as_secs_f64());
        }
    }
}
