//! Child processes in tests: run to their end with an optional stdin, their output collected,
//! bounded by a deadline. Included by the other support modules (`cluster.rs`, `images.rs`).

use std::io::{Read, Write};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `command` with `stdin` written to it (else its stdin closed) and returns its output once
/// it exits; or why not: it could not start, or it was still running after `deadline` (then it
/// is killed, and the error holds what it printed).
pub fn run_within(
    command: &mut Command,
    stdin: Option<&[u8]>,
    deadline: Duration,
) -> Result<Output, String> {
    command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .map_err(|e| format!("could not run {command:?}: {e}"))?;
    if let Some(bytes) = stdin {
        let mut pipe = child.stdin.take().expect("stdin is piped");
        let bytes = bytes.to_owned();
        // Written from a thread, so a child that reads slowly cannot block the test.
        std::thread::spawn(move || {
            let _ = pipe.write_all(&bytes);
        });
    }
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("stdout is piped")));
    let stderr = read(Box::new(child.stderr.take().expect("stderr is piped")));
    let until = Instant::now() + deadline;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{command:?} did not exit within {deadline:?}; killed it.\n── stdout:\n{}\n── stderr:\n{}",
                String::from_utf8_lossy(&stdout.join().unwrap_or_default()),
                String::from_utf8_lossy(&stderr.join().unwrap_or_default())
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}
