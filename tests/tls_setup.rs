//! A secured cluster set up with `baton certs` and `baton tokens`, and what a client, a worker
//! and a coordinator say when it is set up wrong: each mistake of the first hour (TLS spoken to a
//! plaintext port and the reverse, a client certificate missing or from another CA, an unknown
//! CA, a certificate without the name used, a port already taken) gets an error naming what to
//! do. Real `baton` processes throughout.

#[path = "support/coordinator_process.rs"]
mod coordinator_process;
#[path = "support/cluster.rs"]
mod harness;
#[path = "support/spec.rs"]
mod spec;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use coordinator_process::{Coordinator, assert_listed, free_port, run_baton, runs_list, text};
use harness::baton;

/// `baton certs init --dir DIR/pki --host localhost --host coordinator.example`: the files.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn init(root: &Path) -> Pki {
        let dir = root.join("pki");
        let made = run_baton(
            &[
                "certs",
                "init",
                "--dir",
                dir.to_str().unwrap(),
                "--host",
                "localhost",
                "--host",
                "coordinator.example",
            ],
            &[],
        );
        assert!(made.status.success(), "{}", text(&made.stderr));
        Pki { dir }
    }

    fn file(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_owned()
    }

    /// A coordinator serving TLS with the server certificate, `extra` flags added.
    fn coordinator(&self, root: &Path, extra: &[&str]) -> Coordinator {
        let (cert, key) = (self.file("server.pem"), self.file("server.key"));
        let mut args = vec!["--tls-cert", cert.as_str(), "--tls-key", key.as_str()];
        args.extend(extra);
        Coordinator::start(root, &args)
    }
}

/// What `runs list` printed on stderr, asserting it failed.
fn refused(url: &str, extra: &[&str], env: &[(&str, &str)]) -> String {
    let listed = runs_list(url, extra, env);
    let said = text(&listed.stderr);
    assert!(!listed.status.success(), "{url} answered: {said}");
    said
}

fn assert_says(said: &str, parts: &[&str]) {
    for part in parts {
        assert!(said.contains(part), "expected {part:?} in:\n{said}");
    }
}

#[test]
fn certs_init_makes_v3_certificates_a_coordinator_serves_with_keys_for_their_owner_only() {
    let root = tempfile::tempdir().unwrap();
    let pki = Pki::init(root.path());
    for (file, mode) in [
        ("ca.pem", 0o644),
        ("ca.key", 0o600),
        ("server.pem", 0o644),
        ("server.key", 0o600),
        ("client.pem", 0o644),
        ("client.key", 0o600),
    ] {
        let found = std::fs::metadata(pki.dir.join(file))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(found, mode, "{file}: {found:o}");
    }
    // rustls serves only v3 certificates with the names as subjectAltNames: a client that
    // trusts the CA reaches the coordinator by either name it was made for.
    let coordinator = pki.coordinator(root.path(), &[]);
    let ca = pki.file("ca.pem");
    assert_listed(
        &coordinator,
        &coordinator.url("https", "localhost"),
        &["--tls-ca", &ca],
        &[],
    );

    // Made again, nothing is replaced: a new CA would strand every certificate of the old one.
    let before = std::fs::read_to_string(pki.dir.join("ca.key")).unwrap();
    let again = run_baton(
        &[
            "certs",
            "init",
            "--dir",
            pki.dir.to_str().unwrap(),
            "--host",
            "localhost",
        ],
        &[],
    );
    assert!(!again.status.success());
    assert_says(&text(&again.stderr), &["ca.pem already exists", "--force"]);
    assert_eq!(
        std::fs::read_to_string(pki.dir.join("ca.key")).unwrap(),
        before
    );
}

#[test]
fn a_client_is_told_which_flag_fixes_its_tls() {
    let root = tempfile::tempdir().unwrap();
    let pki = Pki::init(root.path());
    let ca = pki.file("ca.pem");
    let tls = pki.coordinator(root.path(), &[]);
    let plaintext = Coordinator::start(root.path(), &[]);

    // https:// against a plaintext port.
    let said = refused(
        &plaintext.url("https", "localhost"),
        &["--tls-ca", &ca],
        &[],
    );
    assert_says(
        &said,
        &["does not speak TLS", &plaintext.url("http", "localhost")],
    );
    // http:// against a TLS port (this one fails only at the first call, as `h2 protocol error`).
    let said = refused(&tls.url("http", "localhost"), &[], &[]);
    assert_says(
        &said,
        &["speaks TLS", &tls.url("https", "localhost"), "--tls-ca"],
    );
    // No CA given: the system's roots do not know this one.
    let said = refused(&tls.url("https", "localhost"), &[], &[]);
    assert_says(&said, &["does not trust", "--tls-ca", "BATON_TLS_CA"]);
    // The certificate was made for localhost and coordinator.example, not 127.0.0.1.
    let said = refused(
        &tls.url("https", "127.0.0.1"),
        &[],
        &[("BATON_TLS_CA", &ca)],
    );
    assert_says(
        &said,
        &[
            "not valid for `127.0.0.1`",
            "`localhost`, `coordinator.example`",
            "--host 127.0.0.1",
        ],
    );
}

#[test]
fn an_mtls_client_is_told_it_needs_a_certificate_or_another_one() {
    let root = tempfile::tempdir().unwrap();
    let pki = Pki::init(root.path());
    let ca = pki.file("ca.pem");
    let coordinator = pki.coordinator(root.path(), &["--tls-client-ca", &ca]);
    let url = coordinator.url("https", "localhost");

    let said = refused(&url, &["--tls-ca", &ca], &[]);
    assert_says(
        &said,
        &["requires a client certificate", "--tls-cert", "--tls-key"],
    );

    let elsewhere = tempfile::tempdir().unwrap();
    let stranger = Pki::init(elsewhere.path());
    let (cert, key) = (stranger.file("client.pem"), stranger.file("client.key"));
    let said = refused(
        &url,
        &["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key],
        &[],
    );
    assert_says(
        &said,
        &[
            "does not accept this client's certificate",
            "--tls-client-ca",
        ],
    );

    // `baton certs client` signs one the coordinator takes.
    let made = run_baton(
        &[
            "certs",
            "client",
            "ops-laptop",
            "--dir",
            pki.dir.to_str().unwrap(),
        ],
        &[],
    );
    assert!(made.status.success(), "{}", text(&made.stderr));
    let (cert, key) = (pki.file("ops-laptop.pem"), pki.file("ops-laptop.key"));
    assert_listed(
        &coordinator,
        &url,
        &["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key],
        &[],
    );
}

#[test]
fn a_worker_speaking_plaintext_to_a_tls_port_logs_what_to_use() {
    let root = tempfile::tempdir().unwrap();
    let pki = Pki::init(root.path());
    let coordinator = pki.coordinator(root.path(), &[]);
    let agents = root.path().join("agents.toml");
    std::fs::write(
        &agents,
        "[agents.echo]\nkind = \"command\"\ncommand = [\"cat\"]\n",
    )
    .unwrap();
    let mut worker = baton()
        .args([
            "worker",
            "--no-metrics",
            "--agents",
            agents.to_str().unwrap(),
        ])
        .args(["--coordinator", &coordinator.url("http", "localhost")])
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The worker goes on retrying (the coordinator may be fixed); its log says what is wrong
    // the first time.
    let stderr = worker.stderr.take().unwrap();
    let (found, hint) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let line = std::io::BufRead::lines(std::io::BufReader::new(stderr))
            .map_while(Result::ok)
            .find(|line| line.contains("hint"));
        let _ = found.send(line);
    });
    let hint = hint.recv_timeout(harness::DEADLINE);
    let _ = worker.kill();
    let _ = worker.wait();
    let hint = hint
        .ok()
        .flatten()
        .expect("the worker logged a hint within the deadline");
    assert_says(
        &hint,
        &["speaks TLS", &coordinator.url("https", "localhost")],
    );
}

#[test]
fn a_port_in_use_is_named_with_its_flag_and_who_holds_it() {
    let root = tempfile::tempdir().unwrap();
    let first = Coordinator::start(root.path(), &[]);
    let listen = format!("127.0.0.1:{}", first.port);
    let second = run_baton(
        &[
            "coordinator",
            "--memory",
            "--no-metrics",
            "--listen",
            &listen,
        ],
        &[],
    );
    assert!(!second.status.success());
    let pid = first.child.id();
    assert_says(
        &text(&second.stderr),
        &[
            &format!("port {} is already in use", first.port),
            &format!("`baton` (pid {pid})"),
            "--listen",
        ],
    );

    let metrics = format!("127.0.0.1:{}", first.port);
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics_taken = run_baton(
        &[
            "coordinator",
            "--memory",
            "--listen",
            &listen,
            "--metrics-listen",
            &metrics,
        ],
        &[],
    );
    assert!(!metrics_taken.status.success());
    assert_says(
        &text(&metrics_taken.stderr),
        &[
            &format!("port {} is already in use", first.port),
            "--metrics-listen",
        ],
    );
}

#[test]
fn tokens_add_prints_a_token_once_that_works_from_a_file_with_its_newline() {
    let root = tempfile::tempdir().unwrap();
    let principals = root.path().join("principals.toml");
    let principals = principals.to_str().unwrap();
    let added = run_baton(
        &[
            "tokens",
            "add",
            "ci",
            "--roles",
            "submit,read",
            "--principals",
            principals,
        ],
        &[],
    );
    assert!(added.status.success(), "{}", text(&added.stderr));
    let token = text(&added.stdout);
    assert_eq!(token.trim().len(), 64, "{token:?}");
    let file = std::fs::read_to_string(principals).unwrap();
    assert!(
        !file.contains(token.trim()),
        "the file keeps only the token's SHA-256"
    );
    let mode = std::fs::metadata(principals).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let coordinator = Coordinator::start(root.path(), &["--auth-tokens", principals]);
    let url = coordinator.url("http", "127.0.0.1");
    // Written as `> ci-token` writes it: with its newline.
    let token_file = root.path().join("ci-token");
    std::fs::write(&token_file, &token).unwrap();
    let listed = runs_list(
        &url,
        &[],
        &[("BATON_TOKEN_FILE", token_file.to_str().unwrap())],
    );
    assert!(listed.status.success(), "{}", text(&listed.stderr));

    // Rotated: the old token stops working once the coordinator has read the file again.
    let rotated = run_baton(&["tokens", "rotate", "ci", "--principals", principals], &[]);
    assert!(rotated.status.success(), "{}", text(&rotated.stderr));
    let new_token = text(&rotated.stdout);
    assert_ne!(new_token, token);
    let deadline = std::time::Instant::now() + harness::DEADLINE;
    loop {
        let old = runs_list(&url, &[], &[("BATON_TOKEN", token.trim())]);
        if !old.status.success() {
            assert_says(&text(&old.stderr), &["Unauthenticated"]);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the old token still works"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let listed = runs_list(&url, &[], &[("BATON_TOKEN", &new_token)]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
}
