//! The gate in front of every gRPC service: credentials read from the request, [`admit`]
//! asked, the caller attached; the tokens file reloaded when it changes; submit rates kept.

use std::collections::HashMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tonic::body::Body;
use tonic::codegen::http;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use super::{Access, AuthError, Caller, Credentials, admit, principals};

/// How often the tokens file is read again to see whether it changed.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

pub struct Gate {
    access: RwLock<Access>,
    tokens_file: Option<PathBuf>,
    /// The text the principals were read from, to tell a change.
    loaded: Mutex<Vec<u8>>,
    buckets: Mutex<HashMap<String, Bucket>>,
}

/// A token bucket of submits: `rate` a second, bursts of up to `rate` (at least one).
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Gate {
    /// The gate for these flags: `--auth-tokens`, whether `--tls-client-ca` is set, and
    /// `--allow-unauthenticated`.
    pub fn configure(
        tokens_file: Option<PathBuf>,
        client_ca: bool,
        allow_unauthenticated: bool,
    ) -> Result<Arc<Gate>, AuthError> {
        let (access, loaded) = match &tokens_file {
            Some(path) => {
                let text = read(path)?;
                let principals = principals::parse(&String::from_utf8_lossy(&text))?;
                (Access::Principals(Arc::new(principals)), text)
            }
            None if client_ca => (Access::Certified, Vec::new()),
            None if allow_unauthenticated => (Access::Anyone, Vec::new()),
            None => (Access::LoopbackOnly, Vec::new()),
        };
        Ok(Arc::new(Gate {
            access: RwLock::new(access),
            tokens_file,
            loaded: Mutex::new(loaded),
            buckets: Mutex::default(),
        }))
    }

    /// Protected mode: loopback clients only, as anyone (what in-process servers use).
    pub fn loopback_only() -> Arc<Gate> {
        Self::configure(None, false, false).expect("nothing to read")
    }

    pub fn access(&self) -> Access {
        self.access
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the tokens file again if it changed; `Ok(true)` when new principals apply. A file
    /// that no longer parses changes nothing (the error says why): a typo must not lock every
    /// client out.
    pub fn reload(&self) -> Result<bool, AuthError> {
        let Some(path) = &self.tokens_file else {
            return Ok(false);
        };
        let text = read(path)?;
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if *loaded == text {
            return Ok(false);
        }
        let principals = principals::parse(&String::from_utf8_lossy(&text))?;
        *self.access.write().unwrap_or_else(|e| e.into_inner()) =
            Access::Principals(Arc::new(principals));
        *loaded = text;
        Ok(true)
    }

    /// Reloads the tokens file whenever it changes, until the returned task is aborted.
    pub fn watch(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        let path = self.tokens_file.clone()?;
        let gate = self.clone();
        Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(RELOAD_INTERVAL).await;
                match gate.reload() {
                    Ok(true) => tracing::info!(file = %path.display(), "principals reloaded"),
                    Ok(false) => {}
                    Err(error) => tracing::error!(
                        file = %path.display(),
                        %error,
                        "the tokens file changed but cannot be read; the previous principals stay"
                    ),
                }
            }
        }))
    }

    /// Decides a request: its caller, or why it is refused.
    pub fn check<B>(&self, request: &http::Request<B>) -> Result<Caller, AuthError> {
        let path = request.uri().path();
        let caller = admit(
            path,
            &credentials(request),
            &self.access.read().unwrap_or_else(|e| e.into_inner()),
        )?;
        if path == "/baton.v1.RunService/SubmitRun"
            && let Some(principal) = &caller.0
            && let Some(rate) = principal.submits_per_second
        {
            self.take_submit(&principal.name, rate)?;
        }
        Ok(caller)
    }

    fn take_submit(&self, name: &str, rate: f64) -> Result<(), AuthError> {
        let now = Instant::now();
        let burst = rate.max(1.0);
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = buckets.entry(name.to_owned()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        bucket.tokens =
            (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * rate).min(burst);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return Err(AuthError::ResourceExhausted(format!(
                "principal `{name}` may submit {rate} runs a second; try again shortly"
            )));
        }
        bucket.tokens -= 1.0;
        Ok(())
    }
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, AuthError> {
    std::fs::read(path)
        .map_err(|e| AuthError::TokensFile(format!("cannot read {}: {e}", path.display())))
}

/// What the request presents: its bearer token, its verified client certificate's DNS names,
/// its peer address.
fn credentials<B>(request: &http::Request<B>) -> Credentials {
    let bearer = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            let (scheme, token) = value.trim().split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim().to_owned())
        });
    let extensions = request.extensions();
    if let Some(tls) = extensions.get::<TlsConnectInfo<TcpConnectInfo>>() {
        let cert_names = tls.peer_certs().and_then(|certs| {
            let leaf = certs.first()?;
            let parsed = webpki::EndEntityCert::try_from(leaf).ok()?;
            Some(parsed.valid_dns_names().map(str::to_owned).collect())
        });
        return Credentials {
            bearer,
            cert_names,
            peer: tls.get_ref().remote_addr(),
        };
    }
    Credentials {
        bearer,
        cert_names: None,
        peer: extensions
            .get::<TcpConnectInfo>()
            .and_then(TcpConnectInfo::remote_addr),
    }
}

/// The tower layer that puts a [`Gate`] in front of every service.
#[derive(Clone)]
pub struct GateLayer(pub Arc<Gate>);

impl<S> tower::Layer<S> for GateLayer {
    type Service = Gated<S>;

    fn layer(&self, inner: S) -> Gated<S> {
        Gated {
            inner,
            gate: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Gated<S> {
    inner: S,
    gate: Arc<Gate>,
}

type Answer<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for Gated<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Answer<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        match self.gate.check(&request) {
            Ok(caller) => {
                request.extensions_mut().insert(caller);
                Box::pin(self.inner.call(request))
            }
            Err(refused) => {
                let status = tonic::Status::from(refused);
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}
