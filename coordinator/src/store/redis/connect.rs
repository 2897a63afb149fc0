//! Reaching Redis: the client a URL makes (with, for `rediss://`, the CA that signed the
//! server's certificate), the checks made once when connecting, and the URL as it may be shown.
//!
//! A Redis Cluster is found by itself: several comma-separated URLs name its nodes (any of them
//! will do to start), and one URL of a node whose `INFO cluster` says `cluster_enabled:1` is a
//! cluster too. Either way the store then uses redis-rs's cluster client.
//!
//! A URL may carry a password (`redis://:PASSWORD@host` for the default user,
//! `redis://USER:PASSWORD@host` for an ACL user), so it is never shown as given: logs and errors
//! show [`redacted`]`(url)`.
//!
//! Connecting checks what would otherwise fail every run later, and names it: first one plain
//! connection, so that a refused password fails at once (the connection manager would retry it
//! for seconds), then a script on the store's keys, so that a missing password or a user
//! without the permissions the store needs fails here rather than at the first run. A refused
//! password, a missing one, a missing permission, a TLS handshake that fails and a malformed URL
//! are final; a server that does not answer yet is retried by the connection manager, as before,
//! and one that cannot run the check yet (it loads its data) is left to the store's own retries.

use std::sync::LazyLock;

use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClientBuilder;
use ::redis::{
    Client, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError, Script,
    TlsCertificates,
};

use super::connection::Connection;
use super::{BLOCKING_RESPONSE_TIMEOUT, DEFAULT_PREFIX, RedisStore};
use crate::store::Error;

/// `url` with its password, if any, replaced by `***`: the form a Redis URL is logged and shown
/// in. The user name, host, port, database and options stay.
///
/// The user information ends at the URL's last `@`, as URL parsers read it. A parser would also
/// end it at an unescaped `/`, `?` or `#`; searching the whole string instead hides more than the
/// password in such a malformed URL, never less.
///
/// A comma-separated list of URLs (a cluster's nodes) is shown URL by URL.
pub fn redacted(url: &str) -> String {
    if url.contains(',') {
        return url.split(',').map(redacted).collect::<Vec<_>>().join(",");
    }
    let start = url.find("://").map_or(0, |scheme_end| scheme_end + 3);
    let Some(at) = url.rfind('@').filter(|&at| at >= start) else {
        return url.to_owned();
    };
    let Some(colon) = url[start..at].find(':') else {
        return url.to_owned();
    };
    format!("{}:***{}", &url[..start + colon], &url[at..])
}

/// How to reach Redis, besides its URL.
#[derive(Clone)]
pub struct ConnectOptions {
    /// Every key goes under this prefix, so that several stores can share a server; it may not
    /// contain `{` or `}` (it would take the place of the run's hash tag).
    pub prefix: String,
    /// For a `rediss://` URL: the CA certificates (PEM) that signed the server's certificate,
    /// trusted instead of the system's roots. `None`: the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// Make each transition wait for replicas before it counts as written; `None`: a
    /// transition counts once its master applied it.
    pub wait: Option<WaitReplicas>,
}

/// `WAIT replicas timeout` after each transition ([`ConnectOptions::wait`]): Redis replicates
/// asynchronously, so a master that fails over can lose its last writes; a transition that
/// reached `replicas` replicas survives the failover of its master to one of them. One that did
/// not within `timeout` is reported as not written ([`Error::Unavailable`]) and not acted on:
/// it may be on the master or not, and the coordinator reloads the run to find out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitReplicas {
    pub replicas: u32,
    pub timeout: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            prefix: DEFAULT_PREFIX.to_owned(),
            ca_pem: None,
            wait: None,
        }
    }
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("prefix", &self.prefix)
            .field("ca_pem", &self.ca_pem.as_ref().map(|pem| pem.len()))
            .field("wait", &self.wait)
            .finish()
    }
}

/// Touches one of the store's keys from a script: what every transition needs (`EVALSHA`,
/// `SCRIPT LOAD`, access to the prefix's keys), checked once at connection time.
static PROBE: LazyLock<Script> =
    LazyLock::new(|| Script::new("return redis.call('EXISTS', KEYS[1])"));

impl RedisStore {
    /// Connects to `url` (`redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`, `rediss://` for TLS)
    /// as `options` say, and checks that the user may run the store's scripts on its keys.
    /// Errors name the URL [`redacted`] and what to fix.
    pub async fn connect_with(url: &str, options: ConnectOptions) -> Result<RedisStore, Error> {
        let ConnectOptions {
            prefix,
            ca_pem,
            wait,
        } = options;
        if prefix.contains(['{', '}']) {
            return Err(Error::Unavailable(format!(
                "invalid Redis key prefix {prefix:?}: it may not contain '{{' or '}}'"
            )));
        }
        let urls: Vec<&str> = url
            .split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .collect();
        let Some(first) = urls.first() else {
            return Err(Error::Unavailable(format!(
                "invalid Redis URL {:?}: it names no server",
                redacted(url)
            )));
        };
        let target = Target::new(first, ca_pem.clone())?;
        // One connection first, without retries: a refused password or certificate is final.
        let mut cluster = urls.len() > 1;
        match target.client.get_multiplexed_async_connection().await {
            Err(err) if is_final(&err) => return Err(target.error(&prefix, err)),
            Err(_) => {}
            Ok(mut con) => {
                let info: String = ::redis::cmd("INFO")
                    .arg("cluster")
                    .query_async(&mut con)
                    .await
                    .unwrap_or_default();
                cluster |= info.lines().any(|line| line.trim() == "cluster_enabled:1");
            }
        }
        // `WAIT` blocks the connection it is sent on until the replicas answer (or its timeout):
        // on the store's shared connection it would hold up every other command. Writes that
        // wait get connections of their own, `WAIT_CONNECTIONS` of them taken in turn.
        let mut writers = Vec::new();
        if wait.is_some() {
            for _ in 0..WAIT_CONNECTIONS {
                writers.push(if cluster {
                    Connection::Cluster(
                        connect_cluster(&urls, &target, ca_pem.clone(), wait, &prefix).await?,
                    )
                } else {
                    let per_try = wait.map_or(BLOCKING_RESPONSE_TIMEOUT, |w| {
                        w.timeout + BLOCKING_RESPONSE_TIMEOUT
                    });
                    let config = ConnectionManagerConfig::new().set_response_timeout(Some(per_try));
                    Connection::Single(
                        ConnectionManager::new_with_config(target.client.clone(), config)
                            .await
                            .map_err(|err| target.error(&prefix, err))?,
                    )
                });
            }
        }
        let (con, blocking) = if cluster {
            let con =
                Connection::Cluster(connect_cluster(&urls, &target, ca_pem, wait, &prefix).await?);
            (con.clone(), con)
        } else {
            let con = ConnectionManager::new(target.client.clone())
                .await
                .map_err(|err| target.error(&prefix, err))?;
            let config = ConnectionManagerConfig::new()
                .set_response_timeout(Some(BLOCKING_RESPONSE_TIMEOUT));
            let blocking = ConnectionManager::new_with_config(target.client.clone(), config)
                .await
                .map_err(|err| target.error(&prefix, err))?;
            (Connection::Single(con), Connection::Single(blocking))
        };
        let store = RedisStore {
            con,
            blocking,
            timer_prefix: format!("{prefix}:timers:"),
            prefix,
            wait,
            writers: std::sync::Arc::new(writers),
            next_writer: Default::default(),
            next_repair: Default::default(),
            empty_seen: Default::default(),
        };
        let mut con = store.con.clone();
        let probed: Result<i64, RedisError> = PROBE
            .key(store.runs_keys().remove(0))
            .invoke_async(&mut con)
            .await;
        match probed {
            Ok(_) => {}
            Err(err) if is_final(&err) => return Err(target.error(&store.prefix, err)),
            // Redis answers, but not yet (it loads its data, say): the store retries as it would
            // have without the check.
            Err(err) => tracing::warn!(
                redis = %target.shown,
                error = %err,
                "cannot check the Redis user's permissions yet"
            ),
        }
        Ok(store)
    }
}

/// How many connections writes that wait for replicas take turns on: each `WAIT` holds its
/// connection for a replication round trip (or, with replicas missing, its whole timeout).
const WAIT_CONNECTIONS: usize = 8;

/// How long one try of a request to a cluster node may take (more with a longer
/// `--redis-wait-timeout-ms`), and a whole request with its retries twice that.
const CLUSTER_TRY_TIMEOUT: Duration = Duration::from_secs(2);

/// The cluster client for the nodes `urls` name (the first one is `first`). It learns the rest
/// of the cluster from them, and follows it as slots move and masters fail over.
async fn connect_cluster(
    urls: &[&str],
    first: &Target,
    ca_pem: Option<Vec<u8>>,
    wait: Option<WaitReplicas>,
    prefix: &str,
) -> Result<std::sync::Arc<super::connection::Cluster>, Error> {
    let mut nodes = Vec::with_capacity(urls.len());
    for url in urls {
        let target = Target::new(url, None)?;
        nodes.push(target.client.get_connection_info().clone());
    }
    // redis-rs's defaults wait at least 1.28 s between two tries of a request and give a request
    // its whole response timeout: while a master fails over, every store call would hang for
    // seconds. Short waits between tries and a bounded whole make a call that cannot reach its
    // slot's master fail as `Unavailable` within seconds; the coordinator's own retries (an
    // answer waits for the store a while) take it from there.
    let per_try = CLUSTER_TRY_TIMEOUT
        .max(wait.map_or(Duration::ZERO, |w| w.timeout) + Duration::from_secs(1));
    let mut builder = ClusterClientBuilder::new(nodes)
        .connection_timeout(Duration::from_secs(1))
        .response_timeout(per_try)
        .overall_response_timeout(Some(per_try * 2))
        .min_retry_wait(20)
        .max_retry_wait(500)
        .retry_wait_formula(10, 2);
    if let Some(pem) = ca_pem {
        builder = builder.certs(TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        });
    }
    let client = builder.build().map_err(|err| first.error(prefix, err))?;
    let connection = client
        .get_async_connection()
        .await
        .map_err(|err| first.error(prefix, err))?;
    Ok(std::sync::Arc::new(super::connection::Cluster::new(
        client, connection,
    )))
}

/// A Redis server as a URL names it: the client, and what errors say about it.
struct Target {
    client: Client,
    /// The URL, [`redacted`].
    shown: String,
}

impl Target {
    fn new(url: &str, ca_pem: Option<Vec<u8>>) -> Result<Target, Error> {
        let shown = redacted(url);
        let invalid = |why: String| Error::Unavailable(format!("invalid Redis URL {shown}: {why}"));
        let info: ConnectionInfo = url
            .into_connection_info()
            .map_err(|err| invalid(err.to_string()))?;
        let tls = matches!(info.addr(), ConnectionAddr::TcpTls { .. });
        if tls {
            // The redis crate's rustls client takes the process's provider; ring is the only one
            // built in. Whoever installed one first wins, hence the ignored error.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let client = match ca_pem {
            Some(_) if !tls => {
                return Err(invalid(
                    "a CA certificate is given, but the URL does not use TLS (rediss://)".into(),
                ));
            }
            Some(pem) => Client::build_with_tls(
                info,
                TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem),
                },
            )
            .map_err(|err| invalid(format!("bad CA certificate: {err}")))?,
            None => Client::open(info).map_err(|err| invalid(err.to_string()))?,
        };
        Ok(Target { client, shown })
    }

    /// The ACL user the URL logs in as; `None` for the default user.
    fn user(&self) -> Option<&str> {
        self.client
            .get_connection_info()
            .redis_settings()
            .username()
    }

    /// `err`, met while connecting, as the store's error: the redacted URL, what went wrong and
    /// what to fix.
    fn error(&self, prefix: &str, err: RedisError) -> Error {
        let who = match self.user() {
            Some(user) => format!("user {user:?}"),
            None => "the default user".to_owned(),
        };
        let why = if err.kind() == ErrorKind::AuthenticationFailed
            || err.code() == Some("WRONGPASS")
        {
            match self.user() {
                Some(_) => format!(
                    "authentication failed for {who}: Redis refused this user and password (a \
                     wrong password, an unknown user or a disabled one); check the user and \
                     password in the URL"
                ),
                None => format!(
                    "authentication failed for {who}: Redis refused the password; check the \
                     password in the URL (redis://:PASSWORD@HOST:PORT, or \
                     redis://USER:PASSWORD@HOST:PORT for an ACL user)"
                ),
            }
        } else if err.code() == Some("NOAUTH") {
            format!(
                "Redis requires a password and the URL gives none ({err}): put it in the URL, \
                 redis://:PASSWORD@HOST:PORT for the default user or \
                 redis://USER:PASSWORD@HOST:PORT for an ACL user"
            )
        } else if err.code() == Some("NOPERM") {
            let user = self.user().unwrap_or("default");
            format!(
                "{who} lacks a permission the store needs ({err}): it runs scripts and \
                 transactions and reads and writes the keys {prefix}:*; grant them, e.g. ACL \
                 SETUSER {user} ~{prefix}:* +@read +@write +@scripting +@transaction \
                 +@connection"
            )
        } else if let Some(tls) = tls_error(&err) {
            use rustls::CertificateError::{
                NotValidForName, NotValidForNameContext, UnknownIssuer,
            };
            match tls {
                rustls::Error::InvalidCertificate(UnknownIssuer) => format!(
                    "the server's TLS certificate was refused ({tls}): give the CA certificate \
                     that signed it, a PEM file, with --redis-ca (BATON_REDIS_CA)"
                ),
                rustls::Error::InvalidCertificate(
                    NotValidForName | NotValidForNameContext { .. },
                ) => format!(
                    "the server's TLS certificate was refused ({tls}): connect with a host name \
                     that the certificate names"
                ),
                rustls::Error::InvalidCertificate(_) => {
                    format!("the server's TLS certificate was refused ({tls})")
                }
                _ => format!(
                    "the TLS handshake failed ({tls}): does the server serve TLS on this port?"
                ),
            }
        } else {
            err.to_string()
        };
        Error::Unavailable(format!("cannot connect to Redis at {}: {why}", self.shown))
    }
}

/// Whether a failure to connect will not go away by retrying: the password, the permissions, the
/// URL or the TLS handshake is wrong, not the server's availability.
fn is_final(err: &RedisError) -> bool {
    matches!(
        err.kind(),
        ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig
    ) || matches!(err.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
        || tls_error(err).is_some()
}

/// The rustls error under an I/O error, if the TLS handshake is what failed.
fn tls_error(err: &RedisError) -> Option<&rustls::Error> {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    // The redis crate keeps the error it wraps in an `Arc`, which is what `source` returns.
    let source = std::error::Error::source(err)?;
    let inner: &(dyn std::error::Error + 'static) = match source.downcast_ref::<Shared>() {
        Some(shared) => shared.as_ref(),
        None => source,
    };
    match inner.downcast_ref::<std::io::Error>() {
        Some(io) => io.get_ref()?.downcast_ref::<rustls::Error>(),
        None => inner.downcast_ref::<rustls::Error>(),
    }
}

#[cfg(test)]
mod tests {
    use super::redacted;

    #[test]
    fn a_user_keeps_its_name_and_loses_its_password() {
        assert_eq!(
            redacted("redis://app:secret@127.0.0.1:6380/"),
            "redis://app:***@127.0.0.1:6380/"
        );
    }

    #[test]
    fn a_password_alone_is_hidden() {
        assert_eq!(
            redacted("redis://:secret@redis.internal:6379"),
            "redis://:***@redis.internal:6379"
        );
    }

    #[test]
    fn a_url_without_credentials_is_unchanged() {
        for url in [
            "redis://127.0.0.1:6379",
            "redis://127.0.0.1:6379/2",
            "redis://app@127.0.0.1:6379/",
            "rediss://redis.internal:6380/?protocol=resp3",
            "not a url",
        ] {
            assert_eq!(redacted(url), url);
        }
    }

    #[test]
    fn tls_urls_and_databases_keep_everything_but_the_password() {
        assert_eq!(
            redacted("rediss://app:secret@redis.internal:6380/3"),
            "rediss://app:***@redis.internal:6380/3"
        );
        assert_eq!(
            redacted("valkeys://:secret@[::1]:6380/1?protocol=resp3"),
            "valkeys://:***@[::1]:6380/1?protocol=resp3"
        );
    }

    #[test]
    fn a_percent_encoded_password_is_hidden_whole() {
        assert_eq!(
            redacted("redis://app:p%40ss%3Aw%2Frd@127.0.0.1:6379/0"),
            "redis://app:***@127.0.0.1:6379/0"
        );
    }

    #[test]
    fn a_password_with_unescaped_separators_is_hidden_whole() {
        // Not a valid URL, but a typo must not print the password in the error that says so.
        assert_eq!(
            redacted("redis://app:pa/ss@w?rd#x@127.0.0.1:6379"),
            "redis://app:***@127.0.0.1:6379"
        );
        assert_eq!(redacted("app:secret@127.0.0.1"), "app:***@127.0.0.1");
    }
}
