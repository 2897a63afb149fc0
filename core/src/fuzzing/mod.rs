//! Fuzz targets: the core's parsers that a client or a worker can reach, as functions of
//! arbitrary bytes.
//!
//! A target takes any bytes and returns nothing: it must not panic, hang or allocate without
//! bound whatever it is given, and where a cheap invariant exists it asserts it, so that a panic
//! is a bug either way. The suite runs each for a bounded number of cases on stable
//! (`core/tests/fuzz.rs`, with the regression inputs and seeds of `tests/fuzz/corpus/<target>/`);
//! `tests/fuzz/README.md` tells how to run them for longer, with `cargo fuzz` too.
//!
//! - [`workflow`]: workflow text, parsed and validated (what `SubmitRun` and `baton validate`
//!   do); a valid one is run by the engine against answers drawn from the input.
//! - [`workflow_shapes`]: a workflow built from the input as a structure, then as [`workflow`].
//! - [`condition`]: a condition step's expression.
//! - [`path`]: a transform's path.
//! - [`jq`]: a `jq:` transform, compiled (never run: jaq has no fuel, which is why coordinators
//!   run programs in budgeted sandbox processes).
//! - [`manifest`]: a payload by reference: the manifest of a payload, spliced back together.
//! - [`notes`]: an agent's notes, and their messages merged into a history.
//! - [`big_integers_in`]: JSON text scanned for integers beyond 64 bits, as every input, result
//!   and workflow is.
//!
//! [`json_value`] and [`string`] draw JSON and text from `arbitrary::Unstructured` data for
//! these targets and those of the other crates.
//!
//! Their modules are named for what the targets read: `workflows` (with `shapes`, the structures
//! it builds, and `drive`, the engine's run of a valid workflow), `expressions`, `payloads`,
//! `agent_notes`, `integers`; `generate` holds the shared generators.

mod agent_notes;
mod drive;
mod expressions;
mod generate;
mod integers;
mod payloads;
mod shapes;
mod workflows;

pub use agent_notes::notes;
pub use expressions::{condition, jq, path};
pub use generate::{json_value, string};
pub use integers::big_integers_in;
pub use payloads::manifest;
pub use workflows::{workflow, workflow_shapes};

/// A fuzz target: any bytes in, nothing out; a panic is a bug.
pub type Target = fn(&[u8]);

/// Every target of this crate, by name (the name of its corpus folder).
pub const TARGETS: &[(&str, Target)] = &[
    ("workflow", workflow),
    ("workflow_shapes", workflow_shapes),
    ("condition", condition),
    ("path", path),
    ("jq", jq),
    ("manifest", manifest),
    ("notes", notes),
    ("big_integers", big_integers_in),
];
