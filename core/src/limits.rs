//! Sizes a workflow author controls, and the ceilings Baton puts on them.
//!
//! Every size that arrives from a client is bounded, so that a workflow document cannot make the
//! coordinator parse, store or evaluate without end. The defaults are generous for real agent
//! pipelines (hundreds of steps, fan-outs of hundreds of branches) and far below what would hurt.

/// Ceilings applied while a workflow is parsed and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Steps in one workflow, parallel branches included.
    pub max_steps: usize,
    /// Characters in a step id or an `output` alias (ASCII only), and bytes in a workflow id
    /// or an agent name.
    pub max_id_len: usize,
    /// Characters in a path or condition expression.
    pub max_expression_len: usize,
    /// Characters in a jq program.
    pub max_jq_len: usize,
    /// How deep parallel steps may nest inside one another.
    pub max_parallel_depth: usize,
    /// How deep brackets and `!` may nest inside one expression. Parsing is recursive, so this is
    /// what keeps a hostile expression from exhausting the stack.
    pub max_expression_depth: usize,
    /// Ceiling for the `max_visits` a workflow or step may ask for.
    pub max_visits_ceiling: u32,
    /// Nesting depth of the JSON document itself.
    pub max_json_depth: usize,
}

/// How many times a step may be entered in one run unless the workflow says otherwise.
pub const DEFAULT_MAX_VISITS: u32 = 25;

/// How much data (about, as JSON) the transforms settled in one transition may produce. Past
/// it, the next transform fails. Transforms and conditions settle within the transition that
/// reaches them, so a loop of them (`"transform": "input"` and a condition back) copies its
/// data once per visit in one go: 4 MiB of input looped 10,000 times would be 40 GB.
pub const MAX_TRANSFORMED_BYTES_PER_TRANSITION: usize = 256 << 20;

/// How many items one map step takes: past it, the step fails naming the count.
pub const MAX_MAP_ITEMS: usize = 100_000;

/// How many of a map step's items may wait for agents at once: the ceiling of its
/// `max_concurrency`, and what a map without one gets. Every item in flight is a task entry
/// and a timer in the store and a queued task in a coordinator, so this bounds what one step
/// can put there; it is also Step Functions' ceiling for a distributed map's children.
pub const MAP_MAX_IN_FLIGHT: u32 = 10_000;

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_steps: 10_000,
            max_id_len: 128,
            max_expression_len: 4_096,
            max_jq_len: 16_384,
            max_parallel_depth: 8,
            max_expression_depth: 64,
            max_visits_ceiling: 10_000,
            max_json_depth: 64,
        }
    }
}
