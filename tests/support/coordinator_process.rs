//! A `baton coordinator --memory` process of the tests, on a free loopback port, and the
//! `baton` client commands run against it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::harness::{DEADLINE, baton, output};

/// A `baton coordinator --memory` process on a free port; killed on drop.
pub struct Coordinator {
    pub child: Child,
    pub port: u16,
    log: PathBuf,
}

impl Coordinator {
    /// `baton coordinator --memory --no-metrics ARGS` on a free loopback port.
    pub fn start(dir: &Path, args: &[&str]) -> Coordinator {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut all = vec!["--listen", listen.as_str()];
        all.extend(args);
        Self::start_on(dir, port, &all)
    }

    /// `baton coordinator --memory --no-metrics ARGS`, where ARGS make it listen on `port`.
    pub fn start_on(dir: &Path, port: u16, args: &[&str]) -> Coordinator {
        Self::start_with_env(dir, port, args, &[])
    }

    pub fn start_with_env(
        dir: &Path,
        port: u16,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Coordinator {
        let log = dir.join(format!("coordinator-{port}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = baton()
            .args(["coordinator", "--memory", "--no-metrics"])
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::from(file.try_clone().unwrap()))
            .stderr(Stdio::from(file))
            .spawn()
            .expect("start baton coordinator");
        let mut coordinator = Coordinator { child, port, log };
        let deadline = Instant::now() + DEADLINE;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = coordinator.child.try_wait().unwrap() {
                panic!(
                    "the coordinator exited with {status}:\n{}",
                    coordinator.log()
                );
            }
            assert!(Instant::now() < deadline, "the coordinator never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
        coordinator
    }

    pub fn url(&self, scheme: &str, host: &str) -> String {
        format!("{scheme}://{host}:{}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `baton ARGS`, with these environment variables; its output.
pub fn run_baton(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command: std::process::Command = baton();
    command.args(args).envs(env.iter().copied());
    output(&mut command, None)
}

/// `baton runs list --coordinator URL EXTRA...`, with these environment variables.
pub fn runs_list(url: &str, extra: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut args = vec!["runs", "list", "--coordinator", url];
    args.extend(extra);
    run_baton(&args, env)
}

/// [`runs_list`] against `coordinator`, which must answer; its log is shown when it does not.
pub fn assert_listed(coordinator: &Coordinator, url: &str, extra: &[&str], env: &[(&str, &str)]) {
    let listed = runs_list(url, extra, env);
    assert!(
        listed.status.success(),
        "{}\n{}",
        text(&listed.stderr),
        coordinator.log()
    );
}
