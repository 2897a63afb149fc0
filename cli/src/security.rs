//! The security flags: the coordinator's TLS, mTLS and principals; a client's or worker's TLS
//! roots, certificate and token.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use baton_coordinator::auth::Gate;
use baton_coordinator::grpc::Security;
use baton_coordinator::grpc::tls::{Tls, TlsFiles};
use baton_proto::connection::ClientSecurity;

/// How the coordinator's port is secured.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// PEM certificate (with its chain) to serve TLS with; read again whenever the file changes.
    #[arg(long, env = "BATON_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "BATON_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require every client and worker to present a certificate signed by this CA (mTLS).
    #[arg(long, env = "BATON_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Principals, their roles and limits (TOML, see SECURITY.md); read again whenever the
    /// file changes.
    #[arg(long, env = "BATON_AUTH_TOKENS")]
    auth_tokens: Option<PathBuf>,
    /// Without --auth-tokens or --tls-client-ca the coordinator answers only clients on its own
    /// machine (protected mode); this lets anyone who reaches the port in, unauthenticated.
    #[arg(long, env = "BATON_ALLOW_UNAUTHENTICATED")]
    allow_unauthenticated: bool,
}

impl ServeArgs {
    pub fn security(&self) -> anyhow::Result<Security> {
        let gate = Gate::configure(
            self.auth_tokens.clone(),
            self.tls_client_ca.is_some(),
            self.allow_unauthenticated,
        )?;
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(
                Tls::new(&TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: self.tls_client_ca.clone(),
                })
                .context("cannot set up TLS")?,
            ),
            _ => None,
        };
        Ok(Security { gate, tls })
    }

    /// How the port is secured, for the start-up log line.
    pub fn describe(&self) -> String {
        let transport = match (&self.tls_cert, &self.tls_client_ca) {
            (None, _) => "plaintext",
            (Some(_), None) => "TLS",
            (Some(_), Some(_)) => "mTLS",
        };
        let callers = match (&self.auth_tokens, &self.tls_client_ca) {
            (Some(_), _) => "principals of the tokens file",
            (None, Some(_)) => "clients with a certificate of the client CA",
            (None, None) if self.allow_unauthenticated => "anyone (--allow-unauthenticated)",
            (None, None) => "loopback clients only (protected mode)",
        };
        format!("{transport}; answers {callers}")
    }
}

/// How a client or worker reaches the coordinator.
#[derive(clap::Args, Debug, Clone)]
pub struct ClientArgs {
    /// PEM of the CA that signed the coordinator's certificate, for `https://` URLs (default:
    /// the system's roots).
    #[arg(long, env = "BATON_TLS_CA", global = true)]
    tls_ca: Option<PathBuf>,
    /// This client's PEM certificate, for a coordinator that requires one (mTLS).
    #[arg(
        long = "tls-cert",
        env = "BATON_TLS_CLIENT_CERT",
        requires = "client_key",
        global = true
    )]
    client_cert: Option<PathBuf>,
    /// The private key of --tls-cert.
    #[arg(
        long = "tls-key",
        env = "BATON_TLS_CLIENT_KEY",
        requires = "client_cert",
        global = true
    )]
    client_key: Option<PathBuf>,
    /// Bearer token for a coordinator with principals. Prefer BATON_TOKEN_FILE or BATON_TOKEN:
    /// a flag shows in `ps`.
    #[arg(long, env = "BATON_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// A file holding the bearer token (as `baton tokens add ... > FILE` writes it); whitespace
    /// around it, such as a final newline, is not part of the token.
    #[arg(
        long,
        env = "BATON_TOKEN_FILE",
        conflicts_with = "token",
        global = true
    )]
    token_file: Option<PathBuf>,
}

impl ClientArgs {
    pub fn security(&self) -> anyhow::Result<ClientSecurity> {
        let read = |path: &Path| {
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
        };
        Ok(ClientSecurity {
            ca_pem: self.tls_ca.as_deref().map(read).transpose()?,
            identity: match (&self.client_cert, &self.client_key) {
                (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
                _ => None,
            },
            token: self.token()?,
        })
    }

    /// The token given, trimmed: a newline a file or `echo` left is never part of one.
    fn token(&self) -> anyhow::Result<Option<String>> {
        let token = match (&self.token, &self.token_file) {
            (Some(token), _) => token.clone(),
            (None, Some(path)) => std::fs::read_to_string(path).with_context(|| {
                format!(
                    "cannot read the token file {} (--token-file, BATON_TOKEN_FILE)",
                    path.display()
                )
            })?,
            (None, None) => return Ok(None),
        };
        let token = token.trim();
        anyhow::ensure!(
            !token.is_empty(),
            "the token is empty{}",
            match &self.token_file {
                Some(path) if self.token.is_none() =>
                    format!(" ({} holds no token)", path.display()),
                _ => String::new(),
            }
        );
        Ok(Some(token.to_owned()))
    }
}
