//! Baton workers: stateless processes that pull agent tasks from a coordinator and run them.
//!
//! - `runtime`: the worker and its Rust SDK ([`Worker`], `Worker::builder().agent(...)`).
//! - [`payload`]: the payload an agent receives, rebuilt from parts the worker caches.
//! - `output`: what an agent returns ([`Output`]): data, and messages and decisions for later
//!   agents.
//! - `failure`: why an agent failed ([`Failure`]), and whether another attempt could help.
//! - `live`: an agent's live output ([`OutputSink`]), streamed to the run's watchers; for
//!   tests, a sink that keeps it ([`OutputSink::collecting`], [`CollectedOutput`]).
//! - `serve_agents`: [`agents_into`], serve an agents file's agents with the runtime.
//! - [`agents`]: agents declared in an `agents.toml` file (`command`, `template` and `llm`
//!   kinds).
//! - [`fuzzing`]: fuzz targets for what a worker reads: agents files, envelopes, tasks by
//!   reference.
//! - `metrics`: [`WorkerMetrics`]: tasks by agent and outcome, durations, running tasks, for
//!   `/metrics`.
//! - `traces`: the span of an agent's execution, in its run's trace.
//!
//! Only the modules whose items other crates name by path are public; what the others offer
//! is re-exported here.

pub mod agents;
mod failure;
pub mod fuzzing;
mod live;
mod metrics;
mod output;
pub mod payload;
mod runtime;
mod serve_agents;
mod traces;

pub use failure::Failure;
pub use live::{CollectedOutput, OutputSink};
pub use metrics::WorkerMetrics;
pub use output::{ModelCall, Output};
pub use payload::Payload;
pub use runtime::{AgentResult, Denied, Task, Worker, WorkerBuilder};
pub use serve_agents::agents_into;
