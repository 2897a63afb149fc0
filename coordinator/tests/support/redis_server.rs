//! A throwaway `redis-server` for one test: its own loopback port and directory, no persistence,
//! stopped when dropped. Never the machine's shared Redis on 6379.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server gets to answer PING after it was started.
const READY_DEADLINE: Duration = Duration::from_secs(10);
/// How many ports to try when another process takes the one we picked before the server binds it.
const PORT_ATTEMPTS: usize = 5;

/// A running `redis-server`, killed and reaped on drop.
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server and waits until it answers PING. Panics (never skips) if `redis-server` is
    /// not installed or does not come up.
    pub fn start() -> RedisServer {
        let binary = find_on_path("redis-server").unwrap_or_else(|| {
            panic!(
                "`redis-server` was not found on PATH. The Redis store tests start their own server \
                 and are never skipped. Install it (Debian/Ubuntu: `sudo apt-get install \
                 redis-server`; Fedora: `sudo dnf install redis`; macOS: `brew install redis`) or \
                 add the directory holding `redis-server` to PATH."
            )
        });
        let mut last_failure = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let dir = tempfile::tempdir().expect("create a directory for redis-server");
            let port = free_port();
            let child = Command::new(&binary)
                .arg("--port")
                .arg(port.to_string())
                .arg("--bind")
                .arg("127.0.0.1")
                .arg("--save")
                .arg("")
                .arg("--appendonly")
                .arg("no")
                .arg("--dir")
                .arg(dir.path())
                .arg("--logfile")
                .arg(dir.path().join("redis.log"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|err| panic!("could not run {}: {err}", binary.display()));
            let mut server = RedisServer { child, port, dir };
            match server.wait_ready() {
                Ok(()) => return server,
                // Exited: most likely the port was taken in between; `server` is dropped and a new
                // port is tried.
                Err(failure) => last_failure = failure,
            }
        }
        panic!("redis-server did not start after {PORT_ATTEMPTS} attempts: {last_failure}");
    }

    /// `redis://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_DEADLINE;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        loop {
            if let Some(status) = self.child.try_wait().expect("poll redis-server") {
                return Err(format!(
                    "redis-server on port {} exited with {status}; its log:\n{}",
                    self.port,
                    self.log()
                ));
            }
            if ping(addr) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                panic!(
                    "redis-server on port {} did not answer PING within {READY_DEADLINE:?}; its \
                     log:\n{}",
                    self.port,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends PING in the protocol's own words and checks for PONG.
fn ping(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let timeout = Some(Duration::from_millis(500));
    if stream.set_read_timeout(timeout).is_err() || stream.set_write_timeout(timeout).is_err() {
        return false;
    }
    if stream.write_all(b"*1\r\n$4\r\nPING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
}

/// A loopback port nobody listens on right now.
fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    let port = listener.local_addr().expect("local address").port();
    drop(listener);
    port
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

#[cfg(unix)]
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(not(unix))]
fn is_executable(path: &Path) -> bool {
    path.is_file()
}
