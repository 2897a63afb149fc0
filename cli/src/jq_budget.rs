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
    /// `config` with each run's jq budget and how many runs compute at once, as the flags say.
    fn config(&self, config: Config) -> Config {
        Config {
            jq_run_cpu: std::time::Duration::from_millis(self.jq_run_cpu_ms.max(1)),
            computations: self.jq_processes.max(1),
            ..config
        }
    }

    /// Makes every `jq:` transform in this process run in budgeted sandbox processes, and
    /// returns `config` with each run's budget and how many runs compute at once.
    pub fn install(&self, config: Config) -> anyhow::Result<Config> {
        let config = self.config(config);
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use baton_coordinator::Config;
    use clap::Parser;

    use crate::{Cli, Command};

    /// The jq flags of the command line `args`, parsed as `baton` parses it.
    fn jq_of(args: &[&str]) -> super::JqArgs {
        match Cli::try_parse_from(args)
            .expect("the command line parses")
            .command
        {
            Command::Coordinator(coordinator) => coordinator.jq,
            Command::Dev(dev) => dev.jq,
            _ => panic!("{args:?} runs no coordinator"),
        }
    }

    /// Issue 28, point 3: a run's jq programs share a CPU budget by default, 60 s, without
    /// any flag. Parsed as `baton coordinator` (and `baton dev`) parse their command line, and
    /// applied to a config whose budget is something else, so that only the flag's default can
    /// make it 60 s; and shown as the default by `baton coordinator --help`.
    #[test]
    fn a_run_s_jq_cpu_budget_is_60_s_unless_the_flag_says_otherwise() {
        assert!(
            std::env::var_os("BATON_JQ_RUN_CPU_MS").is_none(),
            "this test reads the default: unset BATON_JQ_RUN_CPU_MS"
        );
        let base = || Config {
            jq_run_cpu: Duration::from_millis(1),
            ..Config::default()
        };
        for args in [
            &["baton", "coordinator"][..],
            &["baton", "dev", "workflow.json", "--agents", "agents.toml"],
        ] {
            let config = jq_of(args).config(base());
            assert_eq!(config.jq_run_cpu, Duration::from_secs(60), "{args:?}");
        }
        let flagged = jq_of(&["baton", "coordinator", "--jq-run-cpu-ms", "250"]);
        assert_eq!(
            flagged.config(base()).jq_run_cpu,
            Duration::from_millis(250)
        );

        let help = Cli::try_parse_from(["baton", "coordinator", "--help"])
            .err()
            .expect("--help answers with the help")
            .to_string();
        // However the help is wrapped.
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            help.contains(
                "--jq-run-cpu-ms <JQ_RUN_CPU_MS> CPU time all the `jq:` transforms of one run \
                 may use together; past it, the run's next one fails its step \
                 [env: BATON_JQ_RUN_CPU_MS=] [default: 60000]"
            ),
            "{help}"
        );
    }
}
