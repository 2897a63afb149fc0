//! `jq:` transforms under a budget: each runs in a separate process, reused from a small pool,
//! with a CPU-time and a memory budget.
//!
//! jaq has no fuel: a program such as `def f: f; f` runs for ever and `[range(1e9)]` allocates
//! without end, in whatever thread calls it. So a coordinator never runs one itself. A sandbox
//! process (`baton jq-sandbox`, the same binary) limits its own data segment with `RLIMIT_DATA`,
//! lowers its priority, and a watchdog thread ends it when the program it runs has used its
//! CPU budget. A process that dies takes only that transform with it: the step fails, naming
//! the budget, and the pool starts a fresh process for the next one.
//!
//! - [`frames`]: the request and reply on the process's stdin and stdout.
//! - [`child`]: the sandbox process's side.
//! - `pool`: the coordinator's side: idle processes, how a death is told.

pub mod child;
pub mod frames;
mod pool;

use std::path::PathBuf;
use std::time::Duration;

use baton_core::eval::JqOutputLimits;

pub use pool::{Abort, Evaluated, Pool};

/// What one transform may spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// CPU time for one evaluation.
    pub cpu: Duration,
    /// Memory the program may allocate beyond what the process holds at start.
    pub memory_bytes: u64,
    /// The size and depth a result may have (an agent's result has the same).
    pub output: JqOutputLimits,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            cpu: Duration::from_secs(1),
            memory_bytes: 256 << 20,
            output: JqOutputLimits::default(),
        }
    }
}

/// How a pool starts its processes: an executable and the arguments that make it a sandbox.
#[derive(Debug, Clone)]
pub struct Launcher {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl Launcher {
    /// This very executable, run as `<exe> jq-sandbox` (the `baton` binary).
    pub fn current_exe() -> std::io::Result<Self> {
        Ok(Self {
            program: std::env::current_exe()?,
            args: vec!["jq-sandbox".to_owned()],
        })
    }
}

/// Runs transforms in the pool's processes: what a coordinator process's jq runner
/// ([`crate::jq_runs::JqRuns`]) runs them in.
pub struct Sandboxed {
    pool: Pool,
}

impl Sandboxed {
    pub fn new(launcher: Launcher, budget: Budget, processes: usize) -> Self {
        Self {
            pool: Pool::new(launcher, budget, processes),
        }
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }
}
