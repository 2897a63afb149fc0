//! A README recipe run as a user runs it: each line of its `sh` block by `bash`, in a folder
//! of its own holding a copy of `examples/`, with the freshly built `baton` first on `PATH`.
//!
//! - `export` lines hold for every line after them (they are run again before each one, so
//!   `$PWD` and the like expand as in the user's shell).
//! - A line ending in `&` starts a background process, killed when the [`Recipe`] is dropped;
//!   one with `--listen HOST:PORT` waits for that port to be free first, and answers on it
//!   before the next line runs, as a user would see it start.
//! - Every other line runs to its end (within [`DEADLINE`]); `<run id>` in it becomes the id
//!   of the first run a line printed (`run <id>` on its first line).
//!
//! Only copies are touched: what a recipe creates or changes stays in the recipe's folder.

#![allow(dead_code)]

#[path = "process.rs"]
mod process;
#[path = "recipes.rs"]
mod recipes;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub use recipes::block;

/// How long a server gets to come up (or its port to come free), and a line to finish.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// What one line printed.
#[derive(Debug)]
pub struct Ran {
    /// The line as run: its comment dropped, `<run id>` filled in.
    pub code: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// A recipe's folder, its environment and its background processes.
pub struct Recipe {
    dir: tempfile::TempDir,
    exports: Vec<String>,
    background: Vec<(String, Child, PathBuf)>,
    run_id: Option<String>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create a folder of the copy");
    for entry in std::fs::read_dir(from).expect("read a folder of examples/") {
        let entry = entry.expect("an entry of examples/");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("its type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a file of examples/");
        }
    }
}

/// The port of a `--listen HOST:PORT` argument in `code`.
fn listen_port(code: &str) -> Option<u16> {
    let mut words = code.split_whitespace();
    words.find(|word| *word == "--listen")?;
    words.next()?.rsplit(':').next()?.parse().ok()
}

impl Recipe {
    /// A folder with a copy of the repository's `examples/`.
    pub fn new() -> Recipe {
        let dir = tempfile::tempdir().expect("create the recipe's folder");
        copy_dir(&root().join("examples"), &dir.path().join("examples"));
        Recipe {
            dir,
            exports: Vec::new(),
            background: Vec::new(),
            run_id: None,
        }
    }

    /// The folder the recipe runs in (its `examples/` is a copy).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `code` run by bash in the recipe's folder, after the `export` lines so far, with
    /// nothing from the test's environment pointing Baton elsewhere.
    fn shell(&self, code: &str) -> Command {
        let bin = Path::new(env!("CARGO_BIN_EXE_baton")).parent().unwrap();
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut script = self.exports.join("\n");
        script.push('\n');
        script.push_str(code);
        let mut command = Command::new("bash");
        command
            .arg("-c")
            .arg(script)
            .current_dir(self.dir.path())
            .env("PATH", path)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info");
        for name in [
            "BATON_COORDINATOR",
            "BATON_TOKEN",
            "BATON_TLS_CA",
            "BATON_TLS_CERT",
            "BATON_TLS_KEY",
            "BATON_TLS_CLIENT_CA",
            "BATON_TLS_CLIENT_CERT",
            "BATON_TLS_CLIENT_KEY",
            "BATON_AUTH_TOKENS",
            "BATON_REDIS",
            "BATON_REDIS_URL",
            "BATON_REDIS_CA",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "TRACEPARENT",
        ] {
            command.env_remove(name);
        }
        command
    }

    /// What the background processes printed, for a failure message.
    pub fn logs(&self) -> String {
        self.background
            .iter()
            .map(|(code, _, log)| {
                format!(
                    "── {code}\n{}",
                    std::fs::read_to_string(log).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn start(&mut self, code: &str) {
        let port = listen_port(code);
        if let Some(port) = port {
            // Another test (or a client's connection) may hold it for a moment.
            let deadline = Instant::now() + DEADLINE;
            while std::net::TcpListener::bind(("0.0.0.0", port)).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "`{code}` needs port {port}, which another program holds here"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let log = self
            .dir
            .path()
            .join(format!("background-{}.log", self.background.len()));
        let file = std::fs::File::create(&log).expect("create a log file");
        let child = self
            .shell(&format!("exec {code}"))
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("clone the log file"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("could not start `{code}`: {e}"));
        self.background.push((code.to_owned(), child, log));
        if let Some(port) = port {
            let deadline = Instant::now() + DEADLINE;
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "`{code}` never listened on {port}\n{}",
                    self.logs()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Runs `lines` (a block's, from [`block`]) in order; what each foreground line printed.
    pub fn run(&mut self, lines: &[String]) -> Vec<Ran> {
        let mut ran = Vec::new();
        for line in lines {
            let (code, in_background) = recipes::command_of(line);
            if code.starts_with("export ") {
                self.exports.push(code);
                continue;
            }
            if in_background {
                self.start(&code);
                continue;
            }
            let code = if code.contains("<run id>") {
                let id = self
                    .run_id
                    .as_ref()
                    .unwrap_or_else(|| panic!("`{code}` before any run was started"));
                code.replace("<run id>", id)
            } else {
                code
            };
            let out = process::run_within(&mut self.shell(&code), None, DEADLINE)
                .unwrap_or_else(|error| panic!("{error}\n{}", self.logs()));
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            if self.run_id.is_none() {
                self.run_id = stdout
                    .lines()
                    .next()
                    .and_then(|first| first.strip_prefix("run "))
                    .and_then(|rest| rest.split_whitespace().next())
                    .map(str::to_owned);
            }
            ran.push(Ran {
                code,
                status: out.status,
                stdout,
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        ran
    }
}

impl Drop for Recipe {
    fn drop(&mut self) {
        for (_, child, _) in &mut self.background {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
