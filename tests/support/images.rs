//! The Baton image for tests that run it under Docker, and the few Docker helpers they share.
//!
//! [`images`] runs `deploy/docker/local-images.sh` once per test process with the `baton` binary
//! cargo built for this run: it makes local stand-ins for the base images when they are absent
//! (no registry can be reached here) and builds [`BATON_IMAGE`] with `Dockerfile.prebuilt`. The script takes a lock, so test binaries running at once share the work.
//!
//! Everything else is small on purpose:
//! - [`tool`] finds a program on `PATH` or in `target/test-tools/venv/bin`, and fails the test,
//!   naming it, when it is absent: a Docker test never skips.
//! - [`docker`] runs `docker ARGS` and returns its stdout, failing with its stderr; [`run`] runs
//!   any command with a deadline and returns its output whatever its exit status.
//! - [`Cleanup`] owns a label: every container, network and volume a test creates carries it,
//!   and dropping the guard removes them all, also when the test fails.
//! - [`wait_for`] polls a condition with a deadline; [`http_get`] asks an HTTP endpoint the way a
//!   kubelet or Docker health check does; [`container_ip`] and [`logs`] look at a container.

#![allow(dead_code)]

#[path = "process.rs"]
pub mod process;

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The runtime base the Dockerfile names (distroless, uid and gid 65532).
pub const BASE_IMAGE: &str = "gcr.io/distroless/cc-debian12:nonroot";
/// The Redis image compose and Kubernetes run.
pub const REDIS_IMAGE: &str = "redis:7.2-bookworm";
/// The Baton image the tests build and run.
pub const BATON_IMAGE: &str = "baton:dev";
/// The label that tells a stand-in made by `local-images.sh` from a real image.
pub const STAND_IN_LABEL: &str = "dev.baton.stand-in";
/// How long a single Docker command may take.
pub const DOCKER_DEADLINE: Duration = Duration::from_secs(120);
/// How long making the images may take (a first run builds both stand-ins).
const IMAGES_DEADLINE: Duration = Duration::from_secs(600);

/// The images, built: their names, and what the script said it did.
pub struct Images {
    pub baton: &'static str,
    pub redis: &'static str,
    pub base: &'static str,
    /// `local-images.sh`'s report: one line per image, "built ..." or "kept ...".
    pub report: String,
}

/// Builds the images once per process (see the module doc); later calls return the same.
pub fn images() -> &'static Images {
    static IMAGES: OnceLock<Images> = OnceLock::new();
    IMAGES.get_or_init(|| {
        tool("docker");
        let output = local_images();
        assert!(
            output.status.success(),
            "deploy/docker/local-images.sh failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        Images {
            baton: BATON_IMAGE,
            redis: REDIS_IMAGE,
            base: BASE_IMAGE,
            report: String::from_utf8_lossy(&output.stdout).into_owned(),
        }
    })
}

/// Runs `deploy/docker/local-images.sh` with this run's `baton` binary; its output, whatever its
/// exit status. [`images`] is the way to get the images; this is for tests of the script itself.
pub fn local_images() -> Output {
    let mut command = Command::new(root().join("deploy/docker/local-images.sh"));
    command
        .arg(env!("CARGO_BIN_EXE_baton"))
        .env("BATON_IMAGE", BATON_IMAGE)
        .env_remove("DOCKER_BUILDKIT");
    run(&mut command, IMAGES_DEADLINE)
}

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository root exists")
}

/// The path of `name`, from `PATH` or else `target/test-tools/venv/bin` (where `scripts/test`
/// installs the Python tools); fails the test when it is in neither.
pub fn tool(name: &str) -> PathBuf {
    let venv = root().join("target/test-tools/venv/bin");
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain([venv.clone()])
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "this test needs `{name}`, which is neither on PATH nor in {}: install it \
                 (scripts/test installs what the suite needs)",
                venv.display()
            )
        })
}

/// Runs `command` with its stdin closed; its output once it exits. Fails the test, with what it
/// printed so far, if it is still running after `deadline`.
pub fn run(command: &mut Command, deadline: Duration) -> Output {
    try_run(command, deadline).unwrap_or_else(|error| panic!("{error}"))
}

/// [`run`], returning why it failed instead of failing the test (for `Drop`, which must not
/// panic while a failing test unwinds).
pub fn try_run(command: &mut Command, deadline: Duration) -> Result<Output, String> {
    process::run_within(command, None, deadline)
}

/// `command`'s stdout, trimmed; fails the test with its stderr unless it exits 0.
pub fn check(command: &mut Command) -> String {
    let output = run(command, DOCKER_DEADLINE);
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// `docker ARGS`: its stdout, trimmed; fails the test with docker's stderr unless it exits 0.
pub fn docker(args: &[&str]) -> String {
    check(Command::new("docker").args(args))
}

/// A container's stdout and stderr (empty if there is no such container).
pub fn logs(container: &str) -> String {
    let output = run(
        Command::new("docker").args(["logs", container]),
        DOCKER_DEADLINE,
    );
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The address of a running container on its (first) network.
pub fn container_ip(container: &str) -> String {
    let ip = docker(&[
        "inspect",
        "--format",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
        container,
    ]);
    ip.split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("{container} has no address:\n{}", logs(container)))
        .to_owned()
}

/// Polls `probe` every 100 ms until it returns `Ok`, and returns that. Fails the test after
/// `deadline` with `what` and the last error.
pub fn wait_for<T>(
    what: &str,
    deadline: Duration,
    mut probe: impl FnMut() -> Result<T, String>,
) -> T {
    let until = Instant::now() + deadline;
    loop {
        match probe() {
            Ok(value) => return value,
            Err(error) if Instant::now() > until => {
                panic!("{what}: still not so after {deadline:?}: {error}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// `GET http://ADDRESS/PATH` over plain HTTP/1.1, the way a kubelet's `httpGet` probe or
/// `baton probe` asks: the status code and body, or why there was none. Each step times out
/// after 2 s.
pub fn http_get(address: &str, path: &str) -> Result<(u16, String), String> {
    let timeout = Duration::from_secs(2);
    let socket = address
        .to_socket_addrs()
        .map_err(|e| format!("{address}: {e}"))?
        .next()
        .ok_or_else(|| format!("{address}: no address"))?;
    let mut stream =
        TcpStream::connect_timeout(&socket, timeout).map_err(|e| format!("{address}: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("{address}: {e}"))?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .map_err(|e| format!("{address}{path}: {e}"))?;
    let answer = String::from_utf8_lossy(&answer);
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("{address}{path}: not an HTTP answer: {answer:?}"))?;
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// A name no other test run uses: `PREFIX-PID-RANDOM`, lowercase (valid for containers, networks
/// and compose projects).
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{}-{:08x}", std::process::id(), fastrand::u32(..))
}

/// Removes every container, network and volume with one label when dropped.
pub struct Cleanup {
    /// `key=value`.
    label: String,
}

impl Cleanup {
    /// A fresh label, `dev.baton.test=NAME-PID-RANDOM`, for a test to put on what it creates
    /// (`docker run --label`, see [`Cleanup::label`]).
    pub fn new(name: &str) -> Cleanup {
        Cleanup {
            label: format!("dev.baton.test={}", unique_name(name)),
        }
    }

    /// What already carries `label` (`key=value`), e.g. compose's
    /// `com.docker.compose.project=NAME`.
    pub fn by_label(label: &str) -> Cleanup {
        Cleanup {
            label: label.to_owned(),
        }
    }

    /// The label, `key=value`, as `docker run --label` takes it.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// What is left with the label: one `KIND ID` line per container, network or volume.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for (kind, list, _) in Self::KINDS {
            for id in self.list(list) {
                left.push(format!("{kind} {id}"));
            }
        }
        left
    }

    /// (kind, the arguments that list its ids, those that remove them), containers first: a
    /// network or volume in use cannot be removed.
    #[allow(clippy::type_complexity)]
    const KINDS: [(
        &'static str,
        &'static [&'static str],
        &'static [&'static str],
    ); 3] = [
        (
            "container",
            &["ps", "--all", "--quiet"],
            &["rm", "--force", "--volumes"],
        ),
        ("network", &["network", "ls", "--quiet"], &["network", "rm"]),
        (
            "volume",
            &["volume", "ls", "--quiet"],
            &["volume", "rm", "--force"],
        ),
    ];

    fn list(&self, args: &[&str]) -> Vec<String> {
        let filter = format!("label={}", self.label);
        match try_run(
            Command::new("docker")
                .args(args)
                .args(["--filter", &filter]),
            DOCKER_DEADLINE,
        ) {
            Ok(output) => String::from_utf8_lossy(&output.stdout)
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
            Err(error) => {
                eprintln!("cleanup of {}: {error}", self.label);
                Vec::new()
            }
        }
    }

    fn remove(&self, list: &[&str], remove: &[&str]) {
        let ids = self.list(list);
        if ids.is_empty() {
            return;
        }
        match try_run(
            Command::new("docker").args(remove).args(&ids),
            DOCKER_DEADLINE,
        ) {
            Ok(output) if output.status.success() => {}
            Ok(output) => eprintln!(
                "cleanup of {}: docker {remove:?} failed: {}",
                self.label,
                String::from_utf8_lossy(&output.stderr)
            ),
            Err(error) => eprintln!("cleanup of {}: {error}", self.label),
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for (_, list, remove) in Self::KINDS {
            self.remove(list, remove);
        }
    }
}
