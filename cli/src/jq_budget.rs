//! The budget on `jq:` transforms, as the coordinator's flags, and the hidden `baton
//! jq-sandbox` command that runs them.

use anyhow::Context as _;
use baton_coordinator::Config;
use baton_coordinator::jq_runs::JqRuns;
use baton_coordinator::jq_sandbox::{Budget, Launcher, Sandboxed};
use baton_core::eval::{JqOutputLimits, install_jq_runner};

#[derive(clap::Args, Debug, Clone)]
pub struct JqArgs {
    /// CPU time one `jq:` transform may use; past it, its step fails.
    #[arg(long, env = "BATON_JQ_CPU_MS", default_value_t = 1_000)]
    jq_cpu_ms: u64,
    /// Memory one `jq:` transform may allocate, in MiB; past it, its step fails.
    #[arg(long, env = "BATON_JQ_MEMORY_MIB", default_value_t = 256)]
    jq_memory_mib: u64,
    /// How many `jq:` transforms run at once (each in its own sandbox process).
    #[arg(long, env = "BATON_JQ_PROCESSES", default_value_t = 2)]
    jq_processes: usize,
    /// CPU time all the `jq:` transforms of one run may use together; past it, the run's next
    /// one fails its step.
    #[arg(long, env = "BATON_JQ_RUN_CPU_MS", default_value_t = 60_000)]
    jq_run_cpu_ms: u64,
    /// Run `jq:` transforms in the coordinator's own threads, with no budget: one endless
    /// program then stalls the coordinator. For measuring what the budget costs.
    #[arg(long, env = "BATON_JQ_UNBUDGETED", hide = true)]
    jq_unbudgeted: bool,
}

impl JqArgs {
    /// Makes every `jq:` transform in this process run in budgeted sandbox processes, and
    /// returns `config` with each run's budget and how many runs compute at once.
    pub fn install(&self, config: Config) -> anyhow::Result<Config> {
        let config = Config {
            jq_run_cpu: std::time::Duration::from_millis(self.jq_run_cpu_ms.max(1)),
            computations: self.jq_processes.max(1),
            ..config
        };
        if self.jq_unbudgeted {
            tracing::warn!("jq transforms run without a budget (--jq-unbudgeted)");
            return Ok(config);
        }
        let launcher = Launcher::current_exe().context("cannot find the baton executable")?;
        let budget = Budget {
            cpu: std::time::Duration::from_millis(self.jq_cpu_ms.max(1)),
            memory_bytes: self.jq_memory_mib.max(1) << 20,
            output: JqOutputLimits {
                max_bytes: config.max_result_bytes,
                max_depth: config.max_data_depth,
            },
        };
        install_jq_runner(Box::new(JqRuns::sandboxed(Sandboxed::new(
            launcher,
            budget,
            self.jq_processes,
        ))));
        Ok(config)
    }
}

/// `baton jq-sandbox`: what the coordinator starts to run transforms in. Not for people.
#[derive(clap::Args)]
pub struct SandboxArgs {
    /// What programs may allocate, in bytes.
    #[arg(long)]
    memory_bytes: u64,
    /// The coordinator that started it: the sandbox stops its program once that one is gone.
    #[arg(long)]
    parent_pid: Option<u32>,
}

pub fn sandbox(args: SandboxArgs) -> std::process::ExitCode {
    baton_coordinator::jq_sandbox::child::serve(args.memory_bytes, args.parent_pid)
}
