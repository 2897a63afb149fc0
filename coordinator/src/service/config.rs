//! What a coordinator is configured with: the sizes clients and workers control and their
//! ceilings, lease timings, and its clock.

use baton_core::Limits;

use crate::clock::Clock;

/// Sizes clients and workers control, and their ceilings.
#[derive(Debug, Clone)]
pub struct Config {
    pub max_workflow_bytes: usize,
    pub max_input_bytes: usize,
    pub max_result_bytes: usize,
    /// How large a run record's context and memory may be together, in bytes: past it, the
    /// largest entries are shown by their size and digest ([`crate::record::fit`]), so that a
    /// record stays readable (gRPC messages are at most 96 MiB) whatever workers sent.
    pub max_record_bytes: usize,
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
    /// How long a cancel's reason may be, in bytes: it becomes the run's error, kept and shown
    /// with the run for good.
    pub max_reason_bytes: usize,
    /// How long an approval's comment may be, in bytes: kept in the run's context for good.
    pub max_comment_bytes: usize,
    /// How long one piece of live output may be, in bytes (workers send at most 8 KiB).
    pub max_output_piece_bytes: usize,
    /// How much of a text a worker sends is kept (an agent's error, a resend's reason): past
    /// it the text is cut, its start and end kept around a marker giving its length and this
    /// limit ([`crate::bounded::cut`]). An error is stored on the step and on the run and
    /// sent in every record, so it must not grow them past what clients read.
    pub max_error_bytes: usize,
    /// How many calls to models one result may report, and how long a model's name may be.
    pub max_usage_entries: usize,
    pub max_model_name_bytes: usize,
    /// How many runs a workflow-wide decision query reads, newest first.
    pub max_query_runs: usize,
    /// How many watches (`WatchRun` streams and the web UI's event streams) this coordinator
    /// serves at once; one more is refused with `ResourceExhausted` rather than let clients
    /// hold unbounded memory and tasks.
    pub max_watchers: usize,
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
    /// A run this coordinator has not touched for this long is dropped from its memory (read
    /// back from the store if it is touched again): otherwise every running run it ever read
    /// (GetRun, a watch, the web UI) stayed in memory until it read the run again after it
    /// ended, which a run finished by another coordinator may never be.
    pub run_idle_ms: u64,
    /// A task queued here this long with no free slot among this coordinator's workers is handed
    /// to coordinators whose workers have room (as many as they advertise); 0: never.
    pub rebalance_after_ms: u64,
    /// Build OpenTelemetry spans of runs, through the global tracer provider (which should use
    /// [`crate::traces::SpanIds`]). Off, nothing is spent on them.
    pub traces: bool,
    /// The CPU time all of one run's `jq:` programs may use together; past it, the next one
    /// fails its step. (One program's own budget is the sandbox's, `--jq-cpu-ms`.)
    pub jq_run_cpu: std::time::Duration,
    /// How many runs go on with a step's jq program at once (each takes a sandbox process, so
    /// as many as the sandboxes: `--jq-processes`).
    pub computations: usize,
    /// Where wall-clock time comes from: the system's, or one that follows Tokio's paused clock
    /// in tests.
    pub clock: Clock,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_workflow_bytes: 1 << 20,
            max_input_bytes: 4 << 20,
            max_result_bytes: 64 << 20,
            max_record_bytes: 64 << 20,
            max_data_depth: 100,
            max_decisions_per_result: 100,
            max_messages_per_result: 1_000,
            max_decision_summary_bytes: 2 << 10,
            max_decision_rationale_bytes: 16 << 10,
            max_related_artifacts: 64,
            max_query_decisions: 10_000,
            max_query_bytes: 8 << 10,
            max_query_runs: 1_000,
            max_watchers: 10_000,
            max_idempotency_key_bytes: 256,
            max_reason_bytes: 4 << 10,
            max_comment_bytes: 16 << 10,
            max_output_piece_bytes: 64 << 10,
            max_error_bytes: 16 << 10,
            max_usage_entries: 64,
            max_model_name_bytes: 256,
            limits: Limits::default(),
            coordinator_id: default_coordinator_id(),
            lease_ms: 10_000,
            sweep_interval_ms: 200,
            worker_silence_ms: 5_000,
            max_lost_deliveries: 10,
            rebalance_after_ms: 1_000,
            run_idle_ms: 300_000,
            traces: false,
            jq_run_cpu: std::time::Duration::from_secs(60),
            computations: 2,
            clock: Clock::system(),
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
