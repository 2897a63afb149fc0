//! The coordinator's side: a few sandbox processes, started when needed and reused, and what a
//! process's death means for the transform it was running.

use std::io::{BufReader, Read, Write};
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Condvar, Mutex};

use super::child::CPU_BUDGET_EXIT;
use super::frames::{Request, read_frame, read_reply, write_frame};
use super::{Budget, Launcher};

/// How much of a dead sandbox's stderr is read to tell why it died.
const STDERR_READ_BYTES: u64 = 16 << 10;

/// Sandbox processes for one coordinator: at most `processes` run transforms at once; more wait
/// for one to be free.
pub struct Pool {
    launcher: Launcher,
    budget: Budget,
    processes: usize,
    state: Mutex<State>,
    freed: Condvar,
}

#[derive(Default)]
struct State {
    idle: Vec<Sandbox>,
    /// Processes started and not yet ended, idle or busy.
    live: usize,
    /// Processes started since the pool was made (a budget overrun costs a restart).
    started: u64,
}

struct Sandbox {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr: ChildStderr,
}

impl Pool {
    pub fn new(launcher: Launcher, budget: Budget, processes: usize) -> Self {
        Self {
            launcher,
            budget,
            processes: processes.max(1),
            state: Mutex::new(State::default()),
            freed: Condvar::new(),
        }
    }

    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// How many sandbox processes have been started so far.
    pub fn started(&self) -> u64 {
        self.lock().started
    }

    /// Runs `program` on `document` (JSON text) in a sandbox: the output's JSON text, or the
    /// error that fails the step. Blocks the calling thread.
    pub fn evaluate(&self, program: &str, document: &[u8]) -> Result<String, String> {
        let header = serde_json::to_vec(&Request {
            program: program.to_owned(),
            cpu_ms: u64::try_from(self.budget.cpu.as_millis()).unwrap_or(u64::MAX),
            output: self.budget.output,
        })
        .expect("a request serialises");
        let mut sandbox = self.take()?;
        match sandbox.exchange(&header, document) {
            Ok(reply) => {
                self.give_back(sandbox);
                read_reply(&reply)
            }
            Err(_) => {
                let why = sandbox.death(&self.budget);
                self.ended();
                Err(why)
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An idle process that is still alive, or a new one, or the next one freed.
    fn take(&self) -> Result<Sandbox, String> {
        let mut state = self.lock();
        loop {
            if let Some(mut sandbox) = state.idle.pop() {
                if matches!(sandbox.child.try_wait(), Ok(None)) {
                    return Ok(sandbox);
                }
                state.live -= 1;
                continue;
            }
            if state.live < self.processes {
                state.live += 1;
                state.started += 1;
                drop(state);
                return self.start().inspect_err(|_| self.ended());
            }
            state = self
                .freed
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    fn give_back(&self, sandbox: Sandbox) {
        self.lock().idle.push(sandbox);
        self.freed.notify_one();
    }

    fn ended(&self) {
        self.lock().live -= 1;
        self.freed.notify_one();
    }

    fn start(&self) -> Result<Sandbox, String> {
        let mut child = Command::new(&self.launcher.program)
            .args(&self.launcher.args)
            .arg("--memory-bytes")
            .arg(self.budget.memory_bytes.to_string())
            // Nothing of the coordinator's environment (credentials among it) goes in.
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|error| {
                format!(
                    "cannot start a jq sandbox process ({}): {error}",
                    self.launcher.program.display()
                )
            })?;
        let pipes = (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let (Some(stdin), Some(stdout), Some(stderr)) = pipes else {
            unreachable!("all three pipes were asked for");
        };
        Ok(Sandbox {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            stderr,
        })
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for mut sandbox in self.lock().idle.drain(..) {
            let _ = sandbox.child.kill();
            let _ = sandbox.child.wait();
        }
    }
}

impl Sandbox {
    fn exchange(&mut self, header: &[u8], document: &[u8]) -> std::io::Result<Vec<u8>> {
        write_frame(&mut self.stdin, header)?;
        write_frame(&mut self.stdin, document)?;
        self.stdin.flush()?;
        read_frame(&mut self.stdout)?.ok_or_else(|| std::io::ErrorKind::UnexpectedEof.into())
    }

    /// Why the process stopped answering: the budget it broke, or what it printed.
    fn death(mut self, budget: &Budget) -> String {
        let _ = self.child.kill();
        let status = self.child.wait();
        let mut stderr = String::new();
        let _ = (&mut self.stderr)
            .take(STDERR_READ_BYTES)
            .read_to_string(&mut stderr);
        if matches!(&status, Ok(status) if status.code() == Some(CPU_BUDGET_EXIT)) {
            return format!(
                "jq program exceeded its CPU budget of {} ms",
                budget.cpu.as_millis()
            );
        }
        if stderr.contains("memory allocation of") {
            return format!(
                "jq program exceeded its memory budget of {} MiB",
                budget.memory_bytes >> 20
            );
        }
        if stderr.contains("overflowed its stack") {
            return "jq program recursed too deeply (its stack overflowed)".to_owned();
        }
        let status = status.map_or_else(|e| e.to_string(), |status| status.to_string());
        let said = stderr.lines().next().unwrap_or("nothing");
        format!("the jq sandbox process ended ({status}); it said: {said}")
    }
}
