//! Redis servers that ask for credentials, for the tests of Redis credentials and TLS (the
//! coordinator crate's `tests/redis_credentials.rs` and the end-to-end `tests/redis_credentials.rs`):
//! - [`require_credentials`] gives a running server a password for its default user and the ACL
//!   users below;
//! - [`TlsRedis`] is a `redis-server` that speaks TLS only, with a certificate signed by a CA made
//!   here ([`certificates`], with rcgen).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The default user's password (`requirepass`).
pub const ADMIN_PASSWORD: &str = "admin-pw-5b1d";
/// The password of the ACL user `app`, who may do everything.
pub const APP_PASSWORD: &str = "app-secret-9f1e";
/// The password of every other ACL user.
pub const USER_PASSWORD: &str = "user-pw-83c0";
/// The password of the ACL user `encoded`: the characters a URL must percent-encode.
pub const ENCODED_PASSWORD: &str = "p@ss:w/rd?#%1";
/// [`ENCODED_PASSWORD`] as a URL carries it.
pub const ENCODED_PASSWORD_IN_URL: &str = "p%40ss%3Aw%2Frd%3F%23%251";
/// The default user's password on a [`TlsRedis`].
pub const TLS_PASSWORD: &str = "tls-secret-1c7a";

/// Gives the server at `url` (no password yet) its ACL users and then a password for its
/// default user, [`ADMIN_PASSWORD`]. The users:
/// - `app` ([`APP_PASSWORD`]): every command, every key;
/// - `least`: only what the store needs, on the keys `baton:*` (the rule the README gives);
/// - `noscripts`: everything but scripts; `otherkeys`: everything, on the keys `other:*` only;
/// - `disabled`: everything, but switched off;
/// - `encoded` ([`ENCODED_PASSWORD`]): everything, with a password a URL must percent-encode.
pub async fn require_credentials(url: &str) {
    let mut con = redis::Client::open(url)
        .expect("a Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the new redis-server");
    let app = format!(">{APP_PASSWORD}");
    let user = format!(">{USER_PASSWORD}");
    let encoded = format!(">{ENCODED_PASSWORD}");
    let users: [&[&str]; 6] = [
        &["app", "on", &app, "~*", "&*", "+@all"],
        &[
            "least",
            "on",
            &user,
            "~baton:*",
            "resetchannels",
            "-@all",
            "+@read",
            "+@write",
            "+@scripting",
            "+@transaction",
            "+@connection",
        ],
        &["noscripts", "on", &user, "~*", "&*", "+@all", "-@scripting"],
        &["otherkeys", "on", &user, "~other:*", "&*", "+@all"],
        &["disabled", "off", &user, "~*", "&*", "+@all"],
        &["encoded", "on", &encoded, "~*", "&*", "+@all"],
    ];
    for rule in users {
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg(rule)
            .exec_async(&mut con)
            .await
            .unwrap_or_else(|err| panic!("ACL SETUSER {}: {err}", rule[0]));
    }
    // Last: from here on the default user needs it (this connection is logged in already).
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(ADMIN_PASSWORD)
        .exec_async(&mut con)
        .await
        .expect("CONFIG SET requirepass");
}

/// A CA and a server certificate it signed for `127.0.0.1` and `localhost`, as PEM.
pub struct Certificates {
    pub ca: String,
    pub server_cert: String,
    pub server_key: String,
}

/// A new CA named after `name`, and a server certificate it signed.
pub fn certificates(name: &str) -> Certificates {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate().expect("a CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("{name} test CA"));
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = ca_params.self_signed(&ca_key).expect("the CA certificate");
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().expect("a server key");
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .expect("server parameters");
    params
        .distinguished_name
        .push(DnType::CommonName, "redis-server");
    let server_cert = params
        .signed_by(&server_key, &issuer)
        .expect("the server certificate");
    Certificates {
        ca: ca.pem(),
        server_cert: server_cert.pem(),
        server_key: server_key.serialize_pem(),
    }
}

/// How many ports to try when another process takes the one picked before the server binds it.
const PORT_ATTEMPTS: usize = 5;
/// How long a server gets to listen after it was started.
const READY_DEADLINE: Duration = Duration::from_secs(10);

/// A `redis-server` that speaks TLS only (`--port 0 --tls-port P`, clients need no certificate)
/// with a certificate signed by its own CA, and [`TLS_PASSWORD`] for its default user; killed
/// and reaped on drop. Needs a `redis-server` built with TLS (Debian's is).
pub struct TlsRedis {
    child: Child,
    port: u16,
    ca: String,
    dir: tempfile::TempDir,
}

impl TlsRedis {
    /// Starts one on a port `free_port` gives, and waits until it listens.
    pub fn start(free_port: fn() -> u16) -> TlsRedis {
        let certificates = certificates("baton");
        let mut last_log = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let dir = tempfile::tempdir().expect("a folder for redis-server");
            let file = |name: &str, text: &str| {
                let path = dir.path().join(name);
                std::fs::write(&path, text).expect("write a certificate");
                path
            };
            let cert = file("server.pem", &certificates.server_cert);
            let key = file("server.key", &certificates.server_key);
            let ca = file("ca.pem", &certificates.ca);
            let port = free_port();
            let log = dir.path().join("redis.log");
            let child = Command::new("redis-server")
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--tls-cert-file")
                .arg(&cert)
                .arg("--tls-key-file")
                .arg(&key)
                .arg("--tls-ca-cert-file")
                .arg(&ca)
                .args(["--tls-auth-clients", "no", "--requirepass", TLS_PASSWORD])
                .arg("--dir")
                .arg(dir.path())
                .arg("--logfile")
                .arg(&log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("run redis-server (install it: apt-get install redis-server)");
            let mut server = TlsRedis {
                child,
                port,
                ca: certificates.ca.clone(),
                dir,
            };
            match server.wait_ready(&log) {
                Ok(()) => return server,
                // Most likely the port was taken in between: try another.
                Err(log) => last_log = log,
            }
        }
        panic!("the TLS redis-server did not start; its last log:\n{last_log}");
    }

    /// Waits for the line Redis logs once it listens; its log if it exited first.
    fn wait_ready(&mut self, log: &Path) -> Result<(), String> {
        let deadline = Instant::now() + READY_DEADLINE;
        loop {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if let Some(status) = self.child.try_wait().expect("poll redis-server") {
                return Err(format!("exited with {status}:\n{text}"));
            }
            if text.contains("Ready to accept connections") {
                return Ok(());
            }
            assert!(
                Instant::now() < deadline,
                "the TLS redis-server did not listen within {READY_DEADLINE:?}; its log:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `rediss://<userinfo>@127.0.0.1:<port>/`
    pub fn url(&self, userinfo: &str) -> String {
        format!("rediss://{userinfo}@127.0.0.1:{}/", self.port)
    }

    /// The CA that signed the server's certificate, PEM.
    pub fn ca(&self) -> &str {
        &self.ca
    }

    /// The same CA as a file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
