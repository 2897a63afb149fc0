//! `baton bench --secure`: the cluster with TLS on the coordinators' port and a token on every
//! call, as a deployment runs, with certificates and tokens made for the run.

use std::path::PathBuf;

use anyhow::Context as _;
use baton_proto::connection::ClientSecurity;
use sha2::{Digest, Sha256};

/// The files a secured bench cluster runs with, in a folder removed on drop.
pub struct Secure {
    dir: tempfile::TempDir,
    ca_pem: String,
    client_token: String,
    worker_token: String,
}

impl Secure {
    pub fn new() -> anyhow::Result<Secure> {
        use crate::pki::{Authority, Purpose, Validity};
        let dir = tempfile::tempdir()?;
        let validity = Validity {
            ca_days: 2,
            leaf_days: 2,
        };
        let ca = Authority::new("baton bench CA", validity)?;
        let ca_pem = ca.cert_pem.clone();
        let server = ca.leaf(
            &["localhost".to_owned()],
            Purpose::Server,
            validity.leaf_days,
        )?;
        std::fs::write(dir.path().join("server.pem"), server.cert_pem)?;
        std::fs::write(dir.path().join("server.key"), server.key_pem)?;
        // Throwaway tokens of one bench run; their random bits are enough for that.
        let token = || uuid::Uuid::now_v7().simple().to_string();
        let (client_token, worker_token) = (token(), token());
        let sha = |token: &str| hex::encode(Sha256::digest(token.as_bytes()));
        std::fs::write(
            dir.path().join("principals.toml"),
            format!(
                "[principals.bench]\ntoken_sha256 = \"{}\"\nroles = [\"admin\"]\n\
                 [principals.bench-workers]\ntoken_sha256 = \"{}\"\nroles = [\"worker\"]\n",
                sha(&client_token),
                sha(&worker_token)
            ),
        )
        .context("cannot write the bench's principals")?;
        std::fs::write(dir.path().join("ca.pem"), &ca_pem)?;
        Ok(Secure {
            dir,
            ca_pem,
            client_token,
            worker_token,
        })
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A coordinator's URL on `port`.
    pub fn url(port: u16) -> String {
        format!("https://localhost:{port}")
    }

    /// What a coordinator is started with.
    pub fn coordinator_args(&self) -> Vec<std::ffi::OsString> {
        vec![
            "--tls-cert".into(),
            self.file("server.pem").into(),
            "--tls-key".into(),
            self.file("server.key").into(),
            "--auth-tokens".into(),
            self.file("principals.toml").into(),
        ]
    }

    /// What a worker is started with, in its environment.
    pub fn worker_env(&self) -> Vec<(&'static str, std::ffi::OsString)> {
        vec![
            ("BATON_TLS_CA", self.file("ca.pem").into()),
            ("BATON_TOKEN", self.worker_token.clone().into()),
        ]
    }

    /// How the bench's own clients connect.
    pub fn client(&self) -> ClientSecurity {
        ClientSecurity {
            ca_pem: Some(self.ca_pem.as_bytes().to_vec()),
            identity: None,
            token: Some(self.client_token.clone()),
        }
    }
}
