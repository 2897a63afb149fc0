//! The README's "A cluster" recipe, run as printed on one machine: its Redis, two coordinators
//! and two workers on the ports it names, then each client command in order. The only things
//! filled in are what the README leaves to the reader: `<run id>`, and, for the last line
//! (cancel), a run that is still running.
//!
//! The second coordinator and worker find the default metrics ports taken: they warn, name the
//! free port they use instead, and serve there.

#[path = "support/cluster.rs"]
mod harness;
#[path = "support/recipes.rs"]
mod recipes;
#[path = "support/spec.rs"]
mod spec;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use harness::{DEADLINE, output};
use recipes::command_of;

/// The recipe's background processes, killed on drop; their logs in `dir`.
struct Background {
    children: Vec<(String, Child)>,
}

impl Background {
    fn logs(&self, dir: &Path) -> String {
        (0..self.children.len())
            .map(|i| {
                format!(
                    "── {}\n{}",
                    self.children[i].0,
                    std::fs::read_to_string(dir.join(format!("bg-{i}.log"))).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The free metrics port a log's warning names (`address=0.0.0.0:PORT`), if it warned.
fn fallback_port(log: &str) -> Option<u16> {
    let line = log
        .lines()
        .find(|line| line.contains("the default HTTP port is taken"))?;
    let at = line.find("address=")? + "address=".len();
    let address: String = line[at..]
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != '\u{1b}')
        .collect();
    address.rsplit(':').next()?.parse().ok()
}

fn get(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn the_readme_s_cluster_recipe_runs_as_printed_on_one_machine() {
    let lines = recipes::block("README.md", "## A cluster");
    for port in [6379, 50051, 50052] {
        // A client's connection may hold it as its local port for a moment.
        let deadline = Instant::now() + DEADLINE;
        while std::net::TcpListener::bind(("0.0.0.0", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the README's recipe needs port {port}, which another program holds here"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        harness::root().join("examples"),
        dir.path().join("examples"),
    )
    .unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_baton")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let shell = |code: &str, env: &[(String, String)]| {
        let mut command = Command::new("bash");
        command
            .arg("-c")
            .arg(code)
            .current_dir(dir.path())
            .env("PATH", &path)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env_remove("BATON_REDIS")
            .env_remove("BATON_REDIS_URL")
            .env("NO_COLOR", "1");
        command
    };

    let mut env: Vec<(String, String)> = Vec::new();
    let mut background = Background {
        children: Vec::new(),
    };
    let mut run_id = String::new();
    let mut client_lines = 0;
    for line in &lines {
        let (code, in_background) = command_of(line);
        if let Some(exports) = code.strip_prefix("export ") {
            for assignment in exports.split_whitespace() {
                let (name, value) = assignment.split_once('=').unwrap();
                env.push((name.to_owned(), value.to_owned()));
            }
            continue;
        }
        if in_background {
            let log = dir
                .path()
                .join(format!("bg-{}.log", background.children.len()));
            let log = std::fs::File::create(log).unwrap();
            let mut command = shell(&format!("exec {code}"), &env);
            command
                .stdout(Stdio::from(log.try_clone().unwrap()))
                .stderr(Stdio::from(log));
            background
                .children
                .push((code.clone(), command.spawn().unwrap()));
            // Each server answers before the next line, as a user would see it start.
            let port = [
                ("redis-server", 6379),
                ("0.0.0.0:50051", 50051),
                ("0.0.0.0:50052", 50052),
            ]
            .iter()
            .find(|(needle, _)| code.contains(needle))
            .map(|(_, port)| *port);
            if let Some(port) = port {
                let deadline = Instant::now() + DEADLINE;
                while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                    assert!(
                        Instant::now() < deadline,
                        "`{code}` never listened on {port}\n{}",
                        background.logs(dir.path())
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            continue;
        }
        client_lines += 1;
        if code.contains("--watch") {
            // It follows the run until someone approves, from "another terminal": here, the
            // next line, once the watch has printed the run id and the approval it waits for.
            let watch_out = dir.path().join("watch.out");
            let mut command = shell(&code, &env);
            command
                .stdout(Stdio::from(std::fs::File::create(&watch_out).unwrap()))
                .stderr(Stdio::from(
                    std::fs::File::create(dir.path().join("watch.err")).unwrap(),
                ));
            let watch = command.spawn().unwrap();
            background.children.push((code.clone(), watch));
            let deadline = Instant::now() + DEADLINE;
            loop {
                let printed = std::fs::read_to_string(&watch_out).unwrap_or_default();
                if printed.contains("approve-plan") && printed.contains("waiting") {
                    run_id = printed
                        .lines()
                        .next()
                        .and_then(|line| line.strip_prefix("run "))
                        .expect("the watch prints `run <id>` first")
                        .trim()
                        .to_owned();
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the watch never reached approve-plan:\n{printed}\n{}",
                    background.logs(dir.path())
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            continue;
        }
        assert!(
            !run_id.is_empty(),
            "a client line before the submit: {line}"
        );
        let target = if code.starts_with("baton runs cancel") {
            // The README's cancel is for a run still running: one waiting at its approval.
            let submitted = output(
                &mut shell(
                    "baton submit examples/feature-development/workflow.json --input 'Another'",
                    &env,
                ),
                None,
            );
            assert!(submitted.status.success(), "{submitted:?}");
            String::from_utf8_lossy(&submitted.stdout).trim().to_owned()
        } else {
            run_id.clone()
        };
        let code = code.replace("<run id>", &target);
        let out = output(&mut shell(&code, &env), None);
        assert!(
            out.status.success(),
            "`{code}` failed ({})\n── stdout:\n{}\n── stderr:\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            background.logs(dir.path())
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        if code.starts_with("baton approve") {
            // The watch of the submit line now sees the run through.
            let (_, watch) = background
                .children
                .iter_mut()
                .find(|(c, _)| c.contains("--watch"))
                .unwrap();
            let deadline = Instant::now() + DEADLINE;
            let status = loop {
                if let Some(status) = watch.try_wait().unwrap() {
                    break status;
                }
                assert!(Instant::now() < deadline, "the watch never ended");
                std::thread::sleep(Duration::from_millis(50));
            };
            let printed = std::fs::read_to_string(dir.path().join("watch.out")).unwrap();
            assert!(status.success(), "{status}\n{printed}");
            assert!(printed.contains("succeeded"), "{printed}");
        }
        if code.starts_with("baton runs get") {
            let record: serde_json::Value = serde_json::from_str(&stdout).unwrap();
            assert_eq!(record["status"], "succeeded", "{record:#}");
        }
        if code.starts_with("baton runs verify") {
            assert!(stdout.contains("state chain holds"), "{stdout}");
        }
        if code.starts_with("baton runs cancel") {
            let record = output(
                &mut shell(&format!("baton runs get {target} --json"), &env),
                None,
            );
            let record: serde_json::Value = serde_json::from_slice(&record.stdout).unwrap();
            assert_eq!(record["status"], "cancelled", "{record:#}");
        }
    }
    assert!(client_lines >= 8, "{lines:#?}");

    // Both coordinators and both workers serve their HTTP port: the defaults where they were
    // free, and for the others the free port their warning names.
    let logs: Vec<(String, String)> = background
        .children
        .iter()
        .enumerate()
        .filter(|(_, (code, _))| {
            code.starts_with("baton coordinator") || code.starts_with("baton worker")
        })
        .map(|(i, (code, _))| {
            (
                code.clone(),
                std::fs::read_to_string(dir.path().join(format!("bg-{i}.log"))).unwrap(),
            )
        })
        .collect();
    assert_eq!(logs.len(), 4, "{lines:#?}");
    for kind in ["baton coordinator", "baton worker"] {
        let default = if kind == "baton coordinator" {
            9464
        } else {
            9465
        };
        let ports: Vec<u16> = logs
            .iter()
            .filter(|(code, _)| code.starts_with(kind))
            .map(|(_, log)| fallback_port(log).unwrap_or(default))
            .collect();
        assert_ne!(ports[0], ports[1], "{kind}: one port for two processes");
        assert!(
            ports.iter().any(|port| *port != default),
            "{kind}: the second should have warned:\n{}",
            background.logs(dir.path())
        );
        for port in &ports {
            assert_eq!(get(*port, "/metrics"), Some(200), "{kind} on {port}");
            assert_eq!(get(*port, "/readyz"), Some(200), "{kind} on {port}");
        }
        // "The web UI": the first coordinator's at http://127.0.0.1:9464/, the other's where
        // its log says; workers serve none.
        let ui = if kind == "baton coordinator" {
            Some(200)
        } else {
            Some(404)
        };
        for port in &ports {
            assert_eq!(get(*port, "/"), ui, "{kind} on {port}");
        }
        if kind == "baton coordinator" {
            assert!(ports.contains(&9464), "{ports:?}");
        }
    }
}
