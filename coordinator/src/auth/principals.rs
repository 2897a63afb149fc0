//! The `--auth-tokens` file: who may call, by token or by client certificate, with which roles
//! and limits. Tokens are stored only as their SHA-256.
//!
//! ```toml
//! [principals.ci]
//! token_sha256 = "<hex sha256 of the token>"
//! roles = ["submit", "read"]
//! max_running_runs = 50
//! submits_per_second = 10
//!
//! [principals.pool-a]
//! client_cert_names = ["pool-a.workers.baton.internal"]
//! roles = ["worker"]
//! agents = ["planner", "coder"]
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::AuthError;

/// What a principal may do. `admin` may do everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// GetRun, ListRuns, WatchRun, QueryDecisions, VerifyRun, GetStats.
    Read,
    /// SubmitRun; CancelRun and RetryRun of the runs it submitted.
    Submit,
    /// DecideApproval, of any run: approvers decide runs others submitted.
    Approve,
    /// CancelRun and RetryRun of any run, whoever submitted it: an operator's role.
    Operate,
    /// WorkerService: take tasks and answer them.
    Worker,
    Admin,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Submit => "submit",
            Role::Approve => "approve",
            Role::Operate => "operate",
            Role::Worker => "worker",
            Role::Admin => "admin",
        }
    }
}

/// One caller the coordinator knows.
#[derive(Debug, Clone, PartialEq)]
pub struct Principal {
    pub name: String,
    pub roles: BTreeSet<Role>,
    /// Runs of this principal's that may be running at once.
    pub max_running_runs: Option<u32>,
    /// Submits per second, on each coordinator (a burst of as many is allowed).
    pub submits_per_second: Option<f64>,
    /// The only agents a worker with this principal may serve; `None`: any.
    pub agents: Option<BTreeSet<String>>,
}

impl Principal {
    pub fn has(&self, role: Role) -> bool {
        self.roles.contains(&Role::Admin) || self.roles.contains(&role)
    }

    pub fn may_serve(&self, agent: &str) -> bool {
        self.agents
            .as_ref()
            .is_none_or(|agents| agents.contains(agent))
    }

    /// The principal of a client that presented a certificate the coordinator's client CA
    /// signed, when no tokens file names principals: trusted with every role.
    pub fn certified(name: String) -> Self {
        Self {
            name,
            roles: BTreeSet::from([Role::Admin]),
            max_running_runs: None,
            submits_per_second: None,
            agents: None,
        }
    }
}

/// Every principal of a tokens file, found by token or by certificate name.
#[derive(Debug, Default)]
pub struct Principals {
    by_token: HashMap<[u8; 32], Arc<Principal>>,
    by_cert_name: HashMap<String, Arc<Principal>>,
}

impl Principals {
    pub fn by_token(&self, token: &str) -> Option<&Arc<Principal>> {
        self.by_token
            .get(&<[u8; 32]>::from(Sha256::digest(token.as_bytes())))
    }

    pub fn by_cert_names<'a>(
        &self,
        mut names: impl Iterator<Item = &'a str>,
    ) -> Option<&Arc<Principal>> {
        names.find_map(|name| self.by_cert_name.get(&name.to_ascii_lowercase()))
    }

    pub fn len(&self) -> usize {
        let mut names: BTreeSet<&str> = BTreeSet::new();
        for principal in self.by_token.values().chain(self.by_cert_name.values()) {
            names.insert(&principal.name);
        }
        names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    principals: BTreeMap<String, Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    token_sha256: Option<String>,
    #[serde(default)]
    client_cert_names: Vec<String>,
    roles: Vec<Role>,
    max_running_runs: Option<u32>,
    submits_per_second: Option<f64>,
    agents: Option<Vec<String>>,
}

/// Reads a tokens file; every error names the principal and the field.
pub fn parse(text: &str) -> Result<Principals, AuthError> {
    let file: File = toml::from_str(text).map_err(|e| AuthError::TokensFile(e.to_string()))?;
    let mut principals = Principals::default();
    let bad = |name: &str, problem: String| {
        AuthError::TokensFile(format!("principals.{name}: {problem}"))
    };
    for (name, entry) in file.principals {
        if entry.token_sha256.is_none() && entry.client_cert_names.is_empty() {
            return Err(bad(
                &name,
                "needs token_sha256 or client_cert_names, or nobody can be it".into(),
            ));
        }
        if entry.roles.is_empty() {
            return Err(bad(&name, "roles is empty".into()));
        }
        if let Some(rate) = entry.submits_per_second
            && !(rate.is_finite() && rate > 0.0)
        {
            return Err(bad(
                &name,
                format!("submits_per_second must be above 0, not {rate}"),
            ));
        }
        let principal = Arc::new(Principal {
            name: name.clone(),
            roles: entry.roles.into_iter().collect(),
            max_running_runs: entry.max_running_runs,
            submits_per_second: entry.submits_per_second,
            agents: entry.agents.map(|agents| agents.into_iter().collect()),
        });
        if let Some(hex_digest) = &entry.token_sha256 {
            let digest = hex::decode(hex_digest.trim())
                .ok()
                .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
                .ok_or_else(|| {
                    bad(
                        &name,
                        "token_sha256 must be 64 hex digits (sha256sum of the token)".into(),
                    )
                })?;
            if let Some(other) = principals.by_token.insert(digest, principal.clone()) {
                return Err(bad(
                    &name,
                    format!("token_sha256 is also principals.{}'s", other.name),
                ));
            }
        }
        for cert_name in &entry.client_cert_names {
            if let Some(other) = principals
                .by_cert_name
                .insert(cert_name.to_ascii_lowercase(), principal.clone())
            {
                return Err(bad(
                    &name,
                    format!(
                        "client_cert_names {cert_name:?} is also principals.{}'s",
                        other.name
                    ),
                ));
            }
        }
    }
    Ok(principals)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(token: &str) -> String {
        hex::encode(Sha256::digest(token.as_bytes()))
    }

    #[test]
    fn principals_are_found_by_token_or_certificate_name() {
        let text = format!(
            r#"
            [principals.ci]
            token_sha256 = "{}"
            roles = ["submit", "read"]
            max_running_runs = 5
            [principals.pool-a]
            client_cert_names = ["Pool-A.workers"]
            roles = ["worker"]
            agents = ["planner"]
            "#,
            sha("ci-token")
        );
        let principals = parse(&text).unwrap();
        assert_eq!(principals.len(), 2);
        let ci = principals.by_token("ci-token").unwrap();
        assert_eq!(ci.name, "ci");
        assert!(ci.has(Role::Submit) && ci.has(Role::Read) && !ci.has(Role::Approve));
        assert_eq!(ci.max_running_runs, Some(5));
        assert!(principals.by_token("ci-token ").is_none());
        let pool = principals
            .by_cert_names(["other", "pool-a.workers"].into_iter())
            .unwrap();
        assert!(pool.may_serve("planner") && !pool.may_serve("coder"));
    }

    #[test]
    fn errors_name_the_principal_and_the_field() {
        for (text, expected) in [
            (
                "[principals.a]\nroles = [\"read\"]",
                "principals.a: needs token_sha256",
            ),
            (
                "[principals.a]\ntoken_sha256 = \"abc\"\nroles = [\"read\"]",
                "principals.a: token_sha256 must be 64 hex digits",
            ),
            (
                "[principals.a]\nclient_cert_names = [\"x\"]\nroles = []",
                "principals.a: roles is empty",
            ),
            (
                "[principals.a]\nclient_cert_names = [\"x\"]\nroles = [\"root\"]",
                "unknown variant `root`",
            ),
            (
                "[principals.a]\nclient_cert_names = [\"x\"]\nroles = [\"read\"]\ntoken = \"t\"",
                "unknown field `token`",
            ),
            (
                "[principals.a]\nclient_cert_names = [\"x\"]\nroles = [\"read\"]\n[principals.b]\nclient_cert_names = [\"X\"]\nroles = [\"read\"]",
                "principals.b: client_cert_names \"X\" is also principals.a's",
            ),
        ] {
            let error = parse(text).unwrap_err().to_string();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }
}
