//! Baton's coordinator: drives the engine, keeps every run's state in a store, sends agent
//! steps to workers.
//!
//! The edge:
//! - [`grpc`]: the tonic services: proto in, domain types to [`service`], proto out; TLS.
//! - [`web`]: the web UI on the HTTP port: its pages, and the JSON API they call, admitted as
//!   the RPCs they stand for; a run's watch as server-sent events.
//! - [`fuzzing`]: fuzz targets for what the edge decodes from workers and clients.
//! - [`auth`]: who may call, as whom: principals, roles, protected mode.
//! - [`bounded`]: texts from outside cut to a limit with a marker, names checked.
//! - `run_requests`: what a client asks of runs (a run id, a step id, filters, a decision, a
//!   cancel's reason, who asks), checked the same for the gRPC edge and the web API.
//!
//! The logic, in domain types:
//! - [`service`]: the [`Coordinator`] handle and its rooms: submit, answers, approvals, watch,
//!   integrity, decision queries, leases; every change through one path.
//! - `lease`: what happens to a task's lease, as pure functions.
//! - `dispatch`: which worker gets which waiting task, as a pure function.
//! - [`hub`]: connected workers, their streams and part caches, and the tasks waiting for them.
//! - [`task_ref`]: how tasks and step visits are named (`run/step#visit@attempt`).
//! - `model`: stored events, step and task states.
//! - [`record`]: the run record clients see.
//! - [`parts`]: agent payloads by reference, each part encoded and hashed once per run.
//! - `chain`: reading a run back checked against its state chain.
//! - [`workflows`]: parsed workflows, kept by the SHA-256 of their text.
//! - `decisions`: decision memory: stored with embeddings, ranked by meaning.
//! - [`jq_sandbox`]: `jq:` transforms in budgeted processes, reused from a pool.
//! - [`jq_runs`]: what a run's jq programs cost it (its budget), and their outcomes recorded
//!   for replays.
//! - [`embed`]: text embedders (built-in hashed n-grams, OpenAI-compatible HTTP) and top-k cosine.
//!
//! Around them:
//! - [`store`]: the store trait, its contract, and the memory and Redis stores.
//! - `metrics`: counters, histograms and hub gauges, as Prometheus text or data for OTLP.
//! - [`traces`]: OpenTelemetry spans of runs, one trace per run across processes.
//! - [`clock`]: where the coordinator reads the time (paused in tests).
//! - `error`: the coordinator's [`Error`]s.

pub mod auth;
pub mod bounded;
mod chain;
pub mod clock;
mod decisions;
mod dispatch;
pub mod embed;
mod error;
pub mod fuzzing;
pub mod grpc;
pub mod hub;
pub mod jq_runs;
pub mod jq_sandbox;
mod lease;
mod metrics;
mod model;
pub mod parts;
pub mod record;
mod run_requests;
pub mod service;
pub mod store;
pub mod task_ref;
pub mod traces;
pub mod web;
pub mod workflows;

pub use error::Error;
pub use service::{Config, Coordinator, NotReady};
