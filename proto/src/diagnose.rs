//! Why a connection to a coordinator failed, in words that say what to do.
//!
//! A TLS mismatch reaches a gRPC client as `transport error`, `h2 protocol error` or `operation
//! was canceled`: the real reason is lost in hyper and h2, or is only sent by the server after
//! the client thinks the handshake is over (a missing client certificate, in TLS 1.3). So when a
//! call fails, [`diagnose`] opens one connection of its own to the same address, speaking
//! exactly enough TLS and HTTP/2 to see what the other end is, and says what is wrong and which
//! flag fixes it. It runs only after a failure: nothing of it is on the path of a working call.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::connection::ClientSecurity;

/// Each step of the probe; a coordinator answers in microseconds.
const STEP: Duration = Duration::from_secs(2);

/// What a plaintext HTTP/2 client sends first: the preface and an empty SETTINGS frame.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// What is wrong with how this client reaches `url`, and what to do, when the probe can tell;
/// `None` when it finds nothing wrong with TLS (the failure is elsewhere: say it as it was).
pub async fn diagnose(url: &str, security: &ClientSecurity) -> Option<String> {
    let target = Target::parse(url)?;
    let answer = tokio::time::timeout(STEP * 3, async {
        if target.tls {
            probe_tls(&target, security).await
        } else {
            probe_plaintext(&target).await
        }
    })
    .await;
    answer.ok().flatten()
}

/// Where a coordinator URL points.
struct Target {
    tls: bool,
    host: String,
    port: u16,
    /// `host:port`, as the URL gives it.
    authority: String,
}

impl Target {
    fn parse(url: &str) -> Option<Target> {
        let (tls, rest) = match url.split_once("://") {
            Some(("https", rest)) => (true, rest),
            Some(("http", rest)) => (false, rest),
            _ => return None,
        };
        let authority = rest.split('/').next()?.to_owned();
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) if !host.ends_with(']') || host.starts_with('[') => {
                (host, port.parse().ok()?)
            }
            _ => (authority.as_str(), if tls { 443 } else { 80 }),
        };
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        Some(Target {
            tls,
            host,
            port,
            authority,
        })
    }

    async fn connect(&self) -> Option<TcpStream> {
        tokio::time::timeout(STEP, TcpStream::connect((self.host.as_str(), self.port)))
            .await
            .ok()?
            .ok()
    }
}

/// An `http://` URL: does the other end answer HTTP/2 with TLS instead?
async fn probe_plaintext(target: &Target) -> Option<String> {
    if !speaks_tls(target).await {
        return None;
    }
    Some(format!(
        "the coordinator at http://{0} speaks TLS: use https://{0} (with --tls-ca or BATON_TLS_CA \
         naming the CA that signed its certificate, unless the system trusts it)",
        target.authority
    ))
}

/// Sends what a plaintext HTTP/2 client sends and looks at the first byte of the answer: a
/// TLS record (an alert, or a handshake) means a TLS port.
async fn speaks_tls(target: &Target) -> bool {
    let Some(mut stream) = target.connect().await else {
        return false;
    };
    if stream.write_all(H2_PREFACE).await.is_err() {
        return false;
    }
    let mut first = [0u8; 1];
    matches!(
        tokio::time::timeout(STEP, stream.read(&mut first)).await,
        Ok(Ok(1)) if first[0] == 0x15 || first[0] == 0x16
    )
}

/// Does the other end answer the HTTP/2 preface with a SETTINGS frame (a plaintext port)?
async fn speaks_plaintext_h2(target: &Target) -> bool {
    let Some(mut stream) = target.connect().await else {
        return false;
    };
    if stream.write_all(H2_PREFACE).await.is_err() {
        return false;
    }
    let mut header = [0u8; 9];
    matches!(
        tokio::time::timeout(STEP, stream.read_exact(&mut header)).await,
        Ok(Ok(_)) if header[3] == 0x04
    )
}

/// An `https://` URL: a TLS handshake as the client makes it, then a first HTTP/2 frame, so
/// that what the server refuses after the handshake (a client certificate) is heard too.
async fn probe_tls(target: &Target, security: &ClientSecurity) -> Option<String> {
    let config = client_config(security)?;
    let name = ServerName::try_from(target.host.clone()).ok()?;
    let stream = target.connect().await?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let handshake = tokio::time::timeout(STEP, connector.connect(name, stream)).await;
    let error = match handshake {
        Err(_) => return None,
        Ok(Ok(mut tls)) => {
            let _ = tls.write_all(H2_PREFACE).await;
            let mut buffer = [0u8; 64];
            match tokio::time::timeout(STEP, tls.read(&mut buffer)).await {
                Ok(Err(error)) => error,
                _ => return None,
            }
        }
        Ok(Err(error)) => error,
    };
    let rustls_error = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .cloned();
    match rustls_error {
        Some(error) => explain_tls(&error, target, security).await,
        None => None,
    }
}

/// A rustls error of the probe, as what to do.
async fn explain_tls(
    error: &rustls::Error,
    target: &Target,
    security: &ClientSecurity,
) -> Option<String> {
    use rustls::{AlertDescription, CertificateError, Error, InvalidMessage};
    let url = format!("https://{}", target.authority);
    match error {
        Error::InvalidCertificate(CertificateError::UnknownIssuer) => Some(format!(
            "the certificate of the coordinator at {url} is signed by a CA this client does not \
             trust{}: pass --tls-ca FILE or set BATON_TLS_CA to the CA that signed it (with \
             `baton certs init`, pki/ca.pem)",
            if security.ca_pem.is_some() {
                " (not the one --tls-ca or BATON_TLS_CA names)"
            } else {
                " (the system's roots)"
            }
        )),
        Error::InvalidCertificate(CertificateError::NotValidForNameContext {
            expected,
            presented,
        }) => Some(format!(
            "the certificate of the coordinator at {url} is not valid for `{}`: it names {}. \
             Reach it by one of those names, or give it a certificate for this one (`baton certs \
             server --dir pki --host {} ...`)",
            expected.to_str(),
            names(presented),
            expected.to_str(),
        )),
        Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => Some(format!(
            "the certificate of the coordinator at {url} has expired: give it a new one (`baton certs server`)"
        )),
        Error::InvalidMessage(InvalidMessage::InvalidContentType)
            if speaks_plaintext_h2(target).await =>
        {
            Some(format!(
                "the coordinator at {url} does not speak TLS: use http://{} (or start it with \
             --tls-cert and --tls-key)",
                target.authority
            ))
        }
        Error::AlertReceived(AlertDescription::CertificateRequired)
        | Error::AlertReceived(AlertDescription::HandshakeFailure)
            if security.identity.is_none() =>
        {
            Some(format!(
                "the coordinator at {url} requires a client certificate (mTLS): pass --tls-cert \
                 and --tls-key, or set BATON_TLS_CLIENT_CERT and BATON_TLS_CLIENT_KEY (`baton \
                 certs client NAME` makes one)"
            ))
        }
        Error::AlertReceived(
            AlertDescription::UnknownCA
            | AlertDescription::BadCertificate
            | AlertDescription::CertificateUnknown
            | AlertDescription::DecryptError,
        ) if security.identity.is_some() => Some(format!(
            "the coordinator at {url} does not accept this client's certificate (--tls-cert or \
             BATON_TLS_CLIENT_CERT): it must be signed by the CA the coordinator's \
             --tls-client-ca names"
        )),
        _ => None,
    }
}

/// The names a certificate presents, as a person reads them: `localhost`, `10.0.0.1`.
fn names(presented: &[String]) -> String {
    if presented.is_empty() {
        return "no name at all (no subjectAltName)".to_owned();
    }
    presented
        .iter()
        .map(|name| {
            let bare = name
                .strip_prefix("DnsName(\"")
                .or_else(|| name.strip_prefix("IpAddress("))
                .map(|rest| rest.trim_end_matches([')', '"']))
                .unwrap_or(name);
            format!("`{bare}`")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The client's TLS configuration, as `ClientSecurity::endpoint` builds tonic's.
fn client_config(security: &ClientSecurity) -> Option<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    match &security.ca_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem).flatten() {
                let _ = roots.add(cert);
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(roots);
    let mut config = match &security.identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .ok()?;
            let key = PrivateKeyDer::from_pem_slice(key).ok()?;
            builder.with_client_auth_cert(chain, key).ok()?
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Some(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_gives_its_host_port_and_scheme() {
        let target = Target::parse("https://coordinator.example:50061").unwrap();
        assert!(target.tls);
        assert_eq!(
            (target.host.as_str(), target.port),
            ("coordinator.example", 50061)
        );
        let target = Target::parse("http://[::1]:50051/").unwrap();
        assert_eq!((target.host.as_str(), target.port), ("::1", 50051));
        assert_eq!(target.authority, "[::1]:50051");
        assert!(Target::parse("localhost:50051").is_none());
    }

    #[test]
    fn presented_names_read_as_names() {
        let presented = vec![
            "DnsName(\"localhost\")".to_owned(),
            "IpAddress(10.0.0.1)".to_owned(),
        ];
        assert_eq!(names(&presented), "`localhost`, `10.0.0.1`");
        assert_eq!(names(&[]), "no name at all (no subjectAltName)");
    }
}
