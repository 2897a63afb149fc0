//! How clients and workers reach a coordinator: plaintext or TLS (`https://`, with a CA or the
//! system's roots, and a client certificate for mTLS), and a bearer token on every call.

use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::http;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// What a client presents to a coordinator.
#[derive(Clone, Default)]
pub struct ClientSecurity {
    /// PEM of the CA that signed the coordinator's certificate; `None`: the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM certificate and key of this client, for a coordinator that requires mTLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Sent as `authorization: Bearer <token>` on every call.
    pub token: Option<String>,
}

impl std::fmt::Debug for ClientSecurity {
    // Never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSecurity")
            .field("ca_pem", &self.ca_pem.is_some())
            .field("identity", &self.identity.is_some())
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("{0}")]
    Address(String),
    #[error(
        "the token cannot be sent as an HTTP header: it has a character outside printable ASCII \
         (a token is 64 hex digits, as `baton tokens add` prints it)"
    )]
    Token,
}

impl ClientSecurity {
    /// An endpoint for `url`: TLS when it is `https://`.
    pub fn endpoint(&self, url: &str) -> Result<Endpoint, ConnectionError> {
        let endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(|e| ConnectionError::Address(format!("{url}: {e}")))?;
        if !url.starts_with("https://") {
            return Ok(endpoint);
        }
        let mut tls = ClientTlsConfig::new();
        tls = match &self.ca_pem {
            Some(ca) => tls.ca_certificate(Certificate::from_pem(ca)),
            None => tls.with_native_roots(),
        };
        if let Some((cert, key)) = &self.identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        endpoint
            .tls_config(tls)
            .map_err(|e| ConnectionError::Address(format!("{url}: {e}")))
    }

    /// `channel`, with this token on every call.
    pub fn authorize(&self, channel: Channel) -> Result<Connection, ConnectionError> {
        let token = match &self.token {
            None => None,
            Some(token) => {
                let mut value = http::HeaderValue::from_str(&format!("Bearer {token}"))
                    .map_err(|_| ConnectionError::Token)?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        Ok(Connection { channel, token })
    }
}

/// An error with its causes, joined by `: `: a transport error's own text is only "transport
/// error", and what went wrong (refused, unknown issuer) is in its sources. A cause whose text
/// is already there (a wrapper repeating its source) is said once.
pub fn with_sources(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

/// A channel to a coordinator that sends the client's token with every call. Clients are
/// generic over it: `RunServiceClient<Connection>`.
#[derive(Clone, Debug)]
pub struct Connection {
    channel: Channel,
    token: Option<http::HeaderValue>,
}

impl Connection {
    /// A channel without a token (a coordinator in protected mode, tests).
    pub fn plain(channel: Channel) -> Self {
        Self {
            channel,
            token: None,
        }
    }
}

impl tower::Service<http::Request<Body>> for Connection {
    type Response = http::Response<Body>;
    type Error = <Channel as tower::Service<http::Request<Body>>>::Error;
    type Future = <Channel as tower::Service<http::Request<Body>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower::Service::poll_ready(&mut self.channel, cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        if let Some(token) = &self.token {
            request
                .headers_mut()
                .insert(http::header::AUTHORIZATION, token.clone());
        }
        self.channel.call(request)
    }
}
