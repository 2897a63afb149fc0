//! The coordinator's side: a few sandbox processes, started when needed and reused, and what a
//! process's death means for the transform it was running.

use std::io::{BufReader, Read, Write};
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::child::CPU_BUDGET_EXIT;
use super::frames::{Request, read_frame, read_reply, write_frame};
use super::{Budget, Launcher};

/// How often a caller waiting for a free sandbox looks whether it was told to stop.
const ABORT_POLL: Duration = Duration::from_millis(20);

/// Stops an evaluation from another thread: one not started yet never starts, and the sandbox
/// running one is killed. A run's cancel, and a coordinator shutting down, use it so that a
/// long program does not hold them up.
#[derive(Debug, Default)]
pub struct Abort {
    aborted: AtomicBool,
    /// The process running this evaluation now, if any.
    running: Mutex<Option<u32>>,
}

impl Abort {
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
        if let Some(pid) = *self.running() {
            kill(pid);
        }
    }

    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    fn running(&self) -> std::sync::MutexGuard<'_, Option<u32>> {
        self.running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn kill(pid: u32) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// One evaluation's end: its output or error, the CPU time it used, whether it was aborted
/// (then the error says so, and the outcome means nothing), and whether it ran out of the CPU
/// time it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluated {
    pub result: Result<String, String>,
    pub cpu: Duration,
    pub aborted: bool,
    pub ran_out_of_cpu: bool,
}

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

    /// Runs `program` on `document` (JSON text) in a sandbox, within the pool's budget: the
    /// output's JSON text, or the error that fails the step. Blocks the calling thread.
    pub fn evaluate(&self, program: &str, document: &[u8]) -> Result<String, String> {
        self.evaluate_within(program, document, self.budget.cpu, None)
            .result
    }

    /// [`Pool::evaluate`] with at most `cpu` of CPU time (never more than the pool's budget),
    /// stopped early by `abort`.
    pub fn evaluate_within(
        &self,
        program: &str,
        document: &[u8],
        cpu: Duration,
        abort: Option<&Abort>,
    ) -> Evaluated {
        let cpu = cpu.min(self.budget.cpu).max(Duration::from_millis(1));
        let aborted = || Evaluated {
            result: Err("the evaluation was stopped".to_owned()),
            cpu: Duration::ZERO,
            aborted: true,
            ran_out_of_cpu: false,
        };
        let header = serde_json::to_vec(&Request {
            program: program.to_owned(),
            cpu_ms: u64::try_from(cpu.as_millis()).unwrap_or(u64::MAX),
            output: self.budget.output,
        })
        .expect("a request serialises");
        let mut sandbox = match self.take(abort) {
            Ok(Some(sandbox)) => sandbox,
            Ok(None) => return aborted(),
            Err(error) => {
                return Evaluated {
                    result: Err(error),
                    cpu: Duration::ZERO,
                    aborted: false,
                    ran_out_of_cpu: false,
                };
            }
        };
        if let Some(abort) = abort {
            *abort.running() = Some(sandbox.child.id());
            // Told to stop between the look in `take` and now: nobody killed this one.
            if abort.is_aborted() {
                kill(sandbox.child.id());
            }
        }
        let started = Instant::now();
        let exchanged = sandbox.exchange(&header, document);
        if let Some(abort) = abort {
            *abort.running() = None;
        }
        // Stopped as it answered: the kill may be on its way to this process, which must not go
        // back to the pool to fail another run's program.
        if abort.is_some_and(Abort::is_aborted) {
            let _ = sandbox.child.kill();
            let _ = sandbox.child.wait();
            self.ended();
            return aborted();
        }
        match exchanged {
            Ok(reply) => {
                self.give_back(sandbox);
                let (result, cpu_us) = read_reply(&reply);
                Evaluated {
                    result,
                    cpu: Duration::from_micros(cpu_us),
                    aborted: false,
                    ran_out_of_cpu: false,
                }
            }
            Err(_) => {
                let death = sandbox.death(&self.budget, cpu, started.elapsed());
                self.ended();
                if abort.is_some_and(Abort::is_aborted) {
                    return aborted();
                }
                Evaluated {
                    result: Err(death.why),
                    cpu: death.cpu,
                    aborted: false,
                    ran_out_of_cpu: death.out_of_cpu,
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An idle process that is still alive, or a new one, or the next one freed; `None` when
    /// `abort` stops the wait.
    fn take(&self, abort: Option<&Abort>) -> Result<Option<Sandbox>, String> {
        let mut state = self.lock();
        loop {
            if abort.is_some_and(Abort::is_aborted) {
                return Ok(None);
            }
            if let Some(mut sandbox) = state.idle.pop() {
                if matches!(sandbox.child.try_wait(), Ok(None)) {
                    return Ok(Some(sandbox));
                }
                state.live -= 1;
                continue;
            }
            if state.live < self.processes {
                state.live += 1;
                state.started += 1;
                drop(state);
                return self.start().map(Some).inspect_err(|_| self.ended());
            }
            state = match abort {
                None => self
                    .freed
                    .wait(state)
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
                Some(_) => {
                    self.freed
                        .wait_timeout(state, ABORT_POLL)
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .0
                }
            };
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
            // Named, not read by the sandbox at its start: the coordinator may die before then.
            .arg("--parent-pid")
            .arg(std::process::id().to_string())
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

    /// Why the process stopped answering (the budget it broke, or what it printed), and the
    /// CPU time the program is taken to have used: all it was given when it ran out, else
    /// the time it ran (the process is gone, its clock with it).
    fn death(mut self, budget: &Budget, cpu: Duration, ran: Duration) -> Death {
        let _ = self.child.kill();
        let status = self.child.wait();
        let mut stderr = String::new();
        let _ = (&mut self.stderr)
            .take(STDERR_READ_BYTES)
            .read_to_string(&mut stderr);
        if matches!(&status, Ok(status) if status.code() == Some(CPU_BUDGET_EXIT)) {
            return Death {
                why: format!(
                    "jq program exceeded its CPU budget of {} ms",
                    cpu.as_millis()
                ),
                cpu,
                out_of_cpu: true,
            };
        }
        let died = |why: String| Death {
            why,
            cpu: ran.min(cpu),
            out_of_cpu: false,
        };
        if stderr.contains("memory allocation of") {
            return died(format!(
                "jq program exceeded its memory budget of {} MiB",
                budget.memory_bytes >> 20
            ));
        }
        if stderr.contains("overflowed its stack") {
            return died("jq program recursed too deeply (its stack overflowed)".to_owned());
        }
        let status = status.map_or_else(|e| e.to_string(), |status| status.to_string());
        let said = stderr.lines().next().unwrap_or("nothing");
        died(format!(
            "the jq sandbox process ended ({status}); it said: {said}"
        ))
    }
}

/// How a sandbox that stopped answering ended: why, and the CPU time its program is taken to
/// have used (all it was given when it ran out, else the time it ran: the process is gone, and
/// its clock with it).
struct Death {
    why: String,
    cpu: Duration,
    out_of_cpu: bool,
}
