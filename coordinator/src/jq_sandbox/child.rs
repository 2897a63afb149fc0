//! The sandbox process: reads requests on stdin, runs each program, writes each reply on
//! stdout, until stdin closes.
//!
//! Its limits are its own, set before the first request: `RLIMIT_DATA` caps what it may
//! allocate (an allocation past it aborts the process, and the coordinator reads why on its
//! stderr), a lower priority keeps the coordinator's own threads ahead of it on a busy machine,
//! and a watchdog thread exits with [`CPU_BUDGET_EXIT`] once the running program has used its CPU
//! budget. No core dumps: a dying sandbox writes nothing to disk.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use baton_core::eval::JqProgram;
use rustix::process::{Resource, Rlimit, setrlimit};
use rustix::time::{ClockId, clock_gettime};

use super::frames::{Request, read_frame, reply, write_frame};

/// The exit code of a sandbox whose program ran out of CPU time.
pub const CPU_BUDGET_EXIT: i32 = 86;

/// The exit code of a sandbox whose coordinator died while its program ran: nobody waits for
/// the answer, and the program must not go on burning CPU for the rest of its budget.
pub const ORPHANED_EXIT: i32 = 87;

/// How many compiled programs a sandbox keeps (a workflow's transforms run again and again).
const CACHED_PROGRAMS: usize = 64;

/// How often the watchdog looks at the CPU clock while a program runs.
const WATCH_INTERVAL: Duration = Duration::from_millis(5);

/// Serves requests until stdin closes; `memory_bytes` is what programs may allocate, and
/// `parent_pid` the coordinator that started it (its parent when it started; `None`: whatever
/// parent it has now).
pub fn serve(memory_bytes: u64, parent_pid: Option<u32>) -> ExitCode {
    let _ = rustix::process::nice(10);
    let _ = setrlimit(
        Resource::Core,
        Rlimit {
            current: Some(0),
            maximum: Some(0),
        },
    );
    let deadline = Arc::new(AtomicU64::new(0));
    let parent = match parent_pid {
        Some(pid) => rustix::process::Pid::from_raw(pid as i32),
        None => rustix::process::getppid(),
    };
    // Its coordinator died before it got here: nobody will ever send it a request.
    if rustix::process::getppid() != parent {
        return ExitCode::from(ORPHANED_EXIT as u8);
    }
    let watchdog = {
        let deadline = deadline.clone();
        std::thread::Builder::new()
            .name("jq-watchdog".into())
            .stack_size(64 << 10)
            .spawn(move || watch(&deadline, parent))
            .expect("a sandbox starts its watchdog")
    };
    // The thread above is counted in what the process holds already: the budget comes on top.
    let limit = data_segment_bytes().saturating_add(memory_bytes);
    if let Err(error) = setrlimit(
        Resource::Data,
        Rlimit {
            current: Some(limit),
            maximum: Some(limit),
        },
    ) {
        eprintln!("jq sandbox: cannot limit its memory: {error}");
        return ExitCode::FAILURE;
    }
    let mut input = BufReader::new(std::io::stdin().lock());
    let mut output = BufWriter::new(std::io::stdout().lock());
    let mut programs: HashMap<String, JqProgram> = HashMap::new();
    loop {
        let (header, document) = match (read_frame(&mut input), read_frame(&mut input)) {
            (Ok(Some(header)), Ok(Some(document))) => (header, document),
            (Ok(None), _) => return ExitCode::SUCCESS,
            _ => return ExitCode::FAILURE,
        };
        let mut used_us = 0;
        let result = match serde_json::from_slice::<Request>(&header) {
            Err(error) => Err(format!("jq sandbox: malformed request: {error}")),
            Ok(request) => {
                let cpu_ns = request.cpu_ms.saturating_mul(1_000_000);
                let started = cpu_now_ns();
                deadline.store(started.saturating_add(cpu_ns), Ordering::SeqCst);
                watchdog.thread().unpark();
                let result = compiled(&mut programs, &request.program)
                    .and_then(|program| program.run_json(&document, &request.output));
                deadline.store(0, Ordering::SeqCst);
                used_us = cpu_now_ns().saturating_sub(started) / 1_000;
                result
            }
        };
        if write_frame(&mut output, &reply(&result, used_us))
            .and_then(|()| output.flush())
            .is_err()
        {
            return ExitCode::FAILURE;
        }
    }
}

fn compiled<'a>(
    programs: &'a mut HashMap<String, JqProgram>,
    source: &str,
) -> Result<&'a JqProgram, String> {
    if !programs.contains_key(source) {
        let program = JqProgram::compile(source)?;
        if programs.len() >= CACHED_PROGRAMS {
            programs.clear();
        }
        programs.insert(source.to_owned(), program);
    }
    Ok(&programs[source])
}

/// Sleeps while no program runs; checks the CPU clock while one does, and that the coordinator
/// that started this sandbox is still there (an idle sandbox learns it from its stdin closing;
/// a busy one reads no stdin until its program ends, which could be the whole budget away).
fn watch(deadline: &AtomicU64, parent: Option<rustix::process::Pid>) {
    loop {
        let due = deadline.load(Ordering::SeqCst);
        if due == 0 {
            std::thread::park();
            continue;
        }
        if cpu_now_ns() > due {
            std::process::exit(CPU_BUDGET_EXIT);
        }
        if rustix::process::getppid() != parent {
            std::process::exit(ORPHANED_EXIT);
        }
        std::thread::sleep(WATCH_INTERVAL);
    }
}

/// CPU time this process has used, in nanoseconds.
fn cpu_now_ns() -> u64 {
    let now = clock_gettime(ClockId::ProcessCPUTime);
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}

/// The process's data segment now (`VmData`: what `RLIMIT_DATA` counts), 0 when unknown.
fn data_segment_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmData:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}
