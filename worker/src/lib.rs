//! Baton workers: stateless processes that pull agent tasks from a coordinator and run them.
//!
//! - [`runtime`]: the worker and its Rust SDK (`Worker::builder().agent(...)`).
//! - [`payload`]: the payload an agent receives, rebuilt from parts the worker caches.
//! - [`output`]: what an agent returns: data, and messages and decisions for later agents.
//! - [`Failure`]: why an agent failed, and whether another attempt could help.
//! - [`agents_into`]: serve an agents file's agents with the runtime.
//! - [`agents`]: agents declared in an `agents.toml` file (`command` and `template` kinds).
//! - [`metrics`]: tasks by agent and outcome, durations, running tasks, for `/metrics`.
//! - `traces`: the span of an agent's execution, in its run's trace.

pub mod agents;
mod failure;
pub mod metrics;
pub mod output;
pub mod payload;
pub mod runtime;
mod serve_agents;
mod traces;

pub use failure::Failure;
pub use output::Output;
pub use payload::Payload;
pub use runtime::{AgentResult, Task, Worker, WorkerBuilder};
pub use serve_agents::agents_into;
