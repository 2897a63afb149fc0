//! Baton's core: the workflow language and the context engine, with no I/O.
//!
//! Layout (a module without a link is private; what other crates need of it is re-exported here):
//! - [`workflow`]: the JSON workflow model, its parser and validator.
//! - [`diagnostics`]: problems found in a workflow, each with its JSON path and step id.
//! - [`big_integers`]: integer literals beyond 64 bits found in JSON text, to be refused
//!   rather than rounded.
//! - [`eval`]: paths, conditions and jq transforms, evaluated without `eval`.
//! - [`fuzzing`]: fuzz targets for every parser here that a client or a worker can reach.
//! - `context`: the run's immutable, structurally shared context ([`Context`]).
//! - [`payload`]: what an agent receives (`{input, context, <ref>}`), whole or by reference.
//! - `blob_cache`: the bounded cache of payload parts a worker keeps, mirrored by the
//!   coordinator ([`BlobLru`]).
//! - [`messages`]: a run's message history, merged with LangGraph's `add_messages` semantics.
//! - [`handoff`]: what agents hand on besides data: decisions and handoff records.
//! - [`ids`]: identities (a run, a step, an agent, a worker), each a shared string of its own type.
//! - [`integrity`]: canonical JSON hashing (RFC 8785) and the per-run state chain.
//! - `engine`: the run state machine, `(Run, Event) -> (Run, [Action])` ([`Run`]).
//! - `limits`: ceilings on every size a workflow author controls ([`Limits`]).
//! - `text`: plain text below every parser: unprintable characters, JSON bracket depth.

pub mod big_integers;
mod blob_cache;
mod context;
pub mod diagnostics;
mod engine;
pub mod eval;
pub mod fuzzing;
pub mod handoff;
pub mod ids;
pub mod integrity;
mod limits;
pub mod messages;
pub mod payload;
mod text;
pub mod workflow;

pub use blob_cache::BlobLru;
pub use context::{Context, StepResult, VisibleContext};
pub use diagnostics::{Diagnostic, Diagnostics, Severity};
pub use engine::{
    Action, AgentTask, Decision, EngineError, Event, MapProgress, MessageHistory, Run, RunStatus,
    StepRecord, StepStatus, TaskId, Transition, Waiting,
};
pub use ids::{AgentName, RunId, StepId, WorkerId};
pub use limits::{Limits, MAP_MAX_IN_FLIGHT, MAX_MAP_ITEMS};
pub use payload::{AgentPayload, Manifest};
pub use workflow::{Workflow, parse_workflow, parse_workflow_with};
