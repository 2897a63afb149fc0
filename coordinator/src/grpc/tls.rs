//! TLS on the coordinator's port, with certificates reloaded from disk.
//!
//! tonic's own TLS setting reads its certificate once. cert-manager rotates certificates by
//! rewriting the mounted files, so the coordinator runs its own acceptor: a certificate resolver
//! reads the files again when they change, and every handshake after that serves the new
//! certificate. Connections already open keep theirs, so no stream is dropped. With a client
//! CA, every client must present a certificate it signed (mTLS); the names in that certificate
//! can name a principal ([`crate::auth`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How often the certificate files are read again to see whether they changed.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

/// The PEM files of the coordinator's TLS.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Require client certificates signed by this CA (mTLS).
    pub client_ca: Option<PathBuf>,
}

/// The acceptor, and the resolver that reloads the certificate.
#[derive(Clone)]
pub struct Tls {
    acceptor: TlsAcceptor,
    certificate: Arc<Certificate>,
}

impl Tls {
    pub fn new(files: &TlsFiles) -> Result<Tls, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certificate = Arc::new(Certificate::load(&files.cert, &files.key, &provider)?);
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError(e.to_string()))?;
        let builder = match &files.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for cert in certificates(ca)? {
                    roots
                        .add(cert)
                        .map_err(|e| TlsError(format!("{}: {e}", ca.display())))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|e| TlsError(format!("{}: {e}", ca.display())))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_cert_resolver(certificate.clone());
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            certificate,
        })
    }

    /// Reads the certificate files again if they changed; `Ok(true)` when the next handshake
    /// serves a new certificate. A pair that does not load (a key written before its
    /// certificate) changes nothing.
    pub fn reload(&self) -> Result<bool, TlsError> {
        self.certificate.reload()
    }

    /// Reloads the certificate whenever its files change, until the task is aborted.
    pub fn watch(&self) -> tokio::task::JoinHandle<()> {
        let tls = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RELOAD_INTERVAL).await;
                match tls.reload() {
                    Ok(true) => tracing::info!(
                        cert = %tls.certificate.cert.display(),
                        "TLS certificate reloaded; new connections get it"
                    ),
                    Ok(false) => {}
                    Err(error) => tracing::warn!(
                        %error,
                        "the TLS certificate files changed but do not load; still serving the previous one"
                    ),
                }
            }
        })
    }

    /// Connections from `listener` once their handshake is done; failed handshakes are logged
    /// and dropped without holding up the others.
    pub fn incoming(
        &self,
        listener: TcpListener,
    ) -> impl futures::Stream<Item = std::io::Result<TlsStream<TcpStream>>> + use<> {
        let (sender, receiver) = tokio::sync::mpsc::channel(64);
        let acceptor = self.acceptor.clone();
        tokio::spawn(async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        if sender.send(Err(error)).await.is_err() {
                            return;
                        }
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let (acceptor, handed) = (acceptor.clone(), sender.clone());
                tokio::spawn(async move {
                    let handshake =
                        tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
                    match handshake {
                        Ok(Ok(stream)) => {
                            let _ = handed.send(Ok(stream)).await;
                        }
                        Ok(Err(error)) => {
                            tracing::debug!(%peer, %error, "TLS handshake failed");
                        }
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
                if sender.is_closed() {
                    return;
                }
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(receiver)
    }
}

/// The served certificate, and the files it came from.
#[derive(Debug)]
struct Certificate {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    loaded: Mutex<(Vec<u8>, Vec<u8>)>,
}

impl Certificate {
    fn load(cert: &Path, key: &Path, provider: &Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let (cert_pem, key_pem) = (read(cert)?, read(key)?);
        let current = certified(cert, &cert_pem, key, &key_pem, provider)?;
        Ok(Certificate {
            cert: cert.to_owned(),
            key: key.to_owned(),
            provider: provider.clone(),
            current: RwLock::new(Arc::new(current)),
            loaded: Mutex::new((cert_pem, key_pem)),
        })
    }

    fn reload(&self) -> Result<bool, TlsError> {
        let (cert_pem, key_pem) = (read(&self.cert)?, read(&self.key)?);
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if loaded.0 == cert_pem && loaded.1 == key_pem {
            return Ok(false);
        }
        let current = certified(&self.cert, &cert_pem, &self.key, &key_pem, &self.provider)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(current);
        *loaded = (cert_pem, key_pem);
        Ok(true)
    }
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError(format!("cannot read {}: {e}", path.display())))
}

/// Every certificate of a PEM file.
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError(format!("{}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(TlsError(format!(
            "{}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

fn certified(
    cert: &Path,
    cert_pem: &[u8],
    key: &Path,
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError(format!("{}: {e}", cert.display())))?;
    if chain.is_empty() {
        return Err(TlsError(format!(
            "{}: no PEM certificate in it",
            cert.display()
        )));
    }
    let private = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| TlsError(format!("{}: {e}", key.display())))?;
    CertifiedKey::from_der(chain, private, provider).map_err(|e| {
        TlsError(format!(
            "{} and {} do not make a certificate and its key: {e}",
            cert.display(),
            key.display()
        ))
    })
}
