//! Baton's coordinator: drives the engine, keeps every run's state in a store, sends agent
//! steps to workers.
//!
//! - [`service`]: the logic: submit, decide, cancel, complete, watch; leases, retries, timeouts
//!   and the sweep of due timers (`service/leases.rs`).
//! - [`lease`]: what happens to a task's lease, as pure functions.
//! - [`hub`]: connected workers and the tasks waiting for them.
//! - [`metrics`]: counters, histograms and hub gauges on a Prometheus `/metrics` endpoint.
//! - [`traces`]: OpenTelemetry spans of runs, one trace per run across processes.
//! - [`parts`]: agent payloads by reference, each part encoded and hashed once per run.
//! - [`store`]: the store trait, its contract, and the memory and Redis stores.
//! - [`model`]: stored events, step states and tasks.
//! - [`record`]: the run record clients see.
//! - [`chain`]: reading a run back checked against its state chain.
//! - [`decisions`]: decision memory: stored with embeddings, ranked by meaning.
//! - [`grpc`]: the tonic services, thin over [`service`].
//! - [`embed`]: text embedders (built-in hashed n-grams, OpenAI-compatible HTTP) and top-k cosine.
//! - [`error`]: the coordinator's errors and their gRPC codes.

pub mod chain;
pub mod decisions;
pub mod embed;
pub mod error;
pub mod grpc;
pub mod hub;
pub mod lease;
pub mod metrics;
pub mod model;
pub mod parts;
pub mod record;
pub mod service;
pub mod store;
pub mod traces;

pub use error::Error;
pub use service::{Config, Coordinator};
