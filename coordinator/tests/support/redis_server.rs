//! A throwaway `redis-server` for one test: its own loopback port and directory, stopped when
//! dropped. Never the machine's shared Redis on 6379. No persistence, unless started
//! [durable](RedisServer::start_durable) (append-only file, fsync at every write), which a test
//! can then [restart](RedisServer::restart).

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
    durable: bool,
}

impl RedisServer {
    /// Starts a server and waits until it answers PING. Panics (never skips) if `redis-server` is
    /// not installed or does not come up.
    pub fn start() -> RedisServer {
        Self::start_with(false)
    }

    /// A server with `appendonly yes` and `appendfsync always`: every write it acknowledged is
    /// on disk, and survives [`RedisServer::restart`].
    pub fn start_durable() -> RedisServer {
        Self::start_with(true)
    }

    /// Kills the server (SIGKILL: no chance to save anything more) and starts it again on the
    /// same port and directory, which it reloads from its append-only file; waits until it
    /// answers PING.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// Kills the server (SIGKILL); [`RedisServer::start_again`] brings it back.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts a stopped server again on its port and directory, and waits until it answers.
    pub fn start_again(&mut self) {
        let binary = find_on_path("redis-server").expect("redis-server was found before");
        // The port may linger for a moment after the kill.
        let deadline = Instant::now() + READY_DEADLINE;
        loop {
            self.child = spawn(&binary, self.port, self.dir.path(), self.durable);
            match self.wait_ready() {
                Ok(()) => return,
                Err(failure) if Instant::now() > deadline => {
                    panic!("redis-server did not come back: {failure}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn start_with(durable: bool) -> RedisServer {
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
            let child = spawn(&binary, port, dir.path(), durable);
            let mut server = RedisServer {
                child,
                port,
                dir,
                durable,
            };
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

fn spawn(binary: &Path, port: u16, dir: &Path, durable: bool) -> Child {
    let (appendonly, fsync) = if durable {
        ("yes", "always")
    } else {
        ("no", "everysec")
    };
    Command::new(binary)
        .arg("--port")
        .arg(port.to_string())
        .arg("--bind")
        .arg("127.0.0.1")
        .arg("--save")
        .arg("")
        .arg("--appendonly")
        .arg(appendonly)
        .arg("--appendfsync")
        .arg(fsync)
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|err| panic!("could not run {}: {err}", binary.display()))
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

/// A loopback port nobody listens on right now, and one this test process has
/// not handed out before.
///
/// The port is free only until someone binds it, and a process started with
/// it binds it a little later; the kernel may offer the same port to the next
/// caller in between (CI once gave two workers one metrics port). Never giving
/// a port out twice closes that window for the ports this process hands out.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    loop {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local address").port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
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
