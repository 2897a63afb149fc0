//! Fuzz targets: what a coordinator decodes from workers and clients, as functions of arbitrary
//! bytes, through the same conversions and checks as the gRPC edge ([`crate::grpc::requests`]).
//!
//! Like `baton_core::fuzzing` (which says what a target promises): each must not panic, hang or
//! allocate without bound, and asserts its invariants. The suite runs them in
//! `coordinator/tests/fuzz.rs`; `tests/fuzz/README.md` tells how to run them for longer.
//!
//! - [`worker_message`]: a `WorkerMessage` off a worker's stream (hello, result, resend, live
//!   output, heartbeat, drain), as sent and with its digests made right (so that the checks
//!   behind them are reached too).
//! - [`worker_answer`]: a worker's result built from the input as a structure (data and notes
//!   of every shape, sizes on both sides of each limit), encoded, then as [`worker_message`]:
//!   mutated protobuf seldom decodes, so this is the target that reaches the checks of data
//!   and notes.
//! - [`worker_query`]: an agent's decision query, through its worker.
//! - [`worker_request`]: a hello, a resend, a piece of live output, an agent's error or a
//!   decision query built from the input as a structure, with its names, lists and texts on
//!   both sides of each limit, encoded, then as [`worker_message`] or [`worker_query`]: the
//!   target that reaches the bounds of a worker's messages (issue 28).
//! - [`client_request`]: a client's `SubmitRun` (its workflow parsed as the service parses
//!   it), `QueryDecisions`, `DecideApproval` or `CancelRun`, or a `traceparent` header.
//!
//! The targets' modules are named for what they read: `messages` (a worker's stream), `answers`
//! (results built as structures), `worker_requests`, `client`; `checks` holds what they share.

mod answers;
mod checks;
mod client;
mod messages;
mod worker_requests;

pub use answers::worker_answer;
pub use client::client_request;
pub use messages::worker_message;
pub use worker_requests::{worker_query, worker_request};

use baton_core::fuzzing::Target;

/// Every target of this crate, by name (the name of its corpus folder).
pub const TARGETS: &[(&str, Target)] = &[
    ("worker_message", worker_message),
    ("worker_answer", worker_answer),
    ("worker_query", worker_query),
    ("worker_request", worker_request),
    ("client_request", client_request),
];
