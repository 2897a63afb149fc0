//! An embedder for any server that speaks OpenAI's `POST /v1/embeddings`: OpenAI itself, Ollama,
//! vLLM, Hugging Face TEI.
//!
//! Requests are `{"model", "input": [texts], "dimensions"?}`; the answer's `data[].embedding`
//! is put back in input order by `data[].index`, because the API does not promise response
//! order. Every answer is checked (count, one shared dimension) before any vector is returned,
//! so a misbehaving server cannot put a wrong vector next to a decision.

use std::fmt;
use std::time::Duration;

use reqwest::Url;
use serde::{Deserialize, Serialize};

use super::{BoxFuture, EmbedError, Embedder};

/// How much of an error response is read: enough for a server's message, not a whole page.
const ERROR_BODY_READ_BYTES: usize = 4096;
const ERROR_BODY_EXCERPT_CHARS: usize = 300;

#[derive(Clone)]
pub struct OpenAiConfig {
    /// A base such as `http://localhost:11434`, which gets `/v1/embeddings` appended; an
    /// OpenAI-style base ending in `/v1` (`https://api.openai.com/v1`), which gets
    /// `/embeddings`; or a full endpoint whose path ends in `/embeddings`, used as is.
    pub url: String,
    pub model: String,
    /// Sent as `Authorization: Bearer <key>`; local servers usually need none.
    pub api_key: Option<String>,
    /// For one whole request: connecting, sending, and reading the full response.
    pub timeout: Duration,
    /// Sent as the request's `dimensions`, for models that can shorten their vectors; every
    /// returned vector must then have exactly this many.
    pub dimensions: Option<u32>,
}

impl OpenAiConfig {
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

    /// No key, no `dimensions`, [`Self::DEFAULT_TIMEOUT`].
    pub fn new(url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            model: model.into(),
            api_key: None,
            timeout: Self::DEFAULT_TIMEOUT,
            dimensions: None,
        }
    }
}

/// By hand so that the key never reaches a log line.
impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("url", &self.url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("dimensions", &self.dimensions)
            .finish()
    }
}

#[derive(Debug)]
pub struct OpenAiEmbedder {
    client: reqwest::Client,
    endpoint: Url,
    /// The endpoint without any password, for errors and logs.
    endpoint_shown: String,
    config: OpenAiConfig,
    model_name: String,
}

impl OpenAiEmbedder {
    /// Texts per request; more are sent as several requests, one after another. Servers cap
    /// batches (OpenAI at 2048 inputs) and one huge request would also risk the timeout.
    pub const MAX_TEXTS_PER_REQUEST: usize = 256;
    /// The largest response read: 256 vectors of 3072 floats are about 16 MB of JSON, so this
    /// leaves room while a broken server still cannot exhaust memory.
    pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

    pub fn new(config: OpenAiConfig) -> Result<Self, EmbedError> {
        let endpoint = endpoint_url(&config.url)?;
        if config.model.trim().is_empty() {
            return Err(config_error("model is empty"));
        }
        if config.timeout.is_zero() {
            return Err(config_error("timeout is zero"));
        }
        if config.dimensions == Some(0) {
            return Err(config_error("dimensions is zero"));
        }
        let mut shown = endpoint.clone();
        let _ = shown.set_password(None);

        // reqwest is built without a default crypto provider so that the whole process uses
        // ring (mixing ring and aws-lc made rustls panic elsewhere). Installing fails harmlessly
        // when a provider is already installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .build()
            .map_err(|error| EmbedError::Client {
                reason: error_chain(&error),
            })?;

        Ok(Self {
            client,
            endpoint,
            endpoint_shown: shown.to_string(),
            model_name: format!("openai:{}", config.model),
            config,
        })
    }

    /// The URL requests go to, after the base-or-full rule of [`OpenAiConfig::url`].
    pub fn endpoint(&self) -> &str {
        self.endpoint.as_str()
    }

    async fn embed_all(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut vectors = Vec::with_capacity(texts.len());
        for batch in texts.chunks(Self::MAX_TEXTS_PER_REQUEST) {
            vectors.extend(self.embed_batch(batch).await?);
        }
        self.check_dimensions(&vectors)?;
        Ok(vectors)
    }

    async fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        tracing::debug!(url = %self.endpoint_shown, texts = texts.len(), "requesting embeddings");
        let request = EmbeddingsRequest {
            model: &self.config.model,
            input: texts,
            dimensions: self.config.dimensions,
        };
        let mut builder = self.client.post(self.endpoint.clone()).json(&request);
        if let Some(key) = &self.config.api_key {
            builder = builder.bearer_auth(key);
        }
        let response = builder
            .send()
            .await
            .map_err(|error| self.transport_error(error))?;

        let status = response.status();
        if !status.is_success() {
            let body_excerpt = match read_capped(response, ERROR_BODY_READ_BYTES).await {
                Ok((body, _)) => excerpt(&body),
                Err(error) => format!("(body unreadable: {})", error_chain(&error)),
            };
            return Err(EmbedError::Status {
                url: self.endpoint_shown.clone(),
                status: status.as_u16(),
                body_excerpt,
            });
        }

        let too_large = || EmbedError::ResponseTooLarge {
            url: self.endpoint_shown.clone(),
            limit_bytes: Self::MAX_RESPONSE_BYTES,
        };
        if response
            .content_length()
            .is_some_and(|length| length > Self::MAX_RESPONSE_BYTES as u64)
        {
            return Err(too_large());
        }
        let (body, truncated) = read_capped(response, Self::MAX_RESPONSE_BYTES)
            .await
            .map_err(|error| self.transport_error(error))?;
        if truncated {
            return Err(too_large());
        }

        let parsed: EmbeddingsResponse =
            serde_json::from_slice(&body).map_err(|error| self.invalid(error.to_string()))?;
        self.in_input_order(parsed.data, texts.len())
    }

    /// Places each returned vector at its `index`; a missing `index` means "in order".
    fn in_input_order(
        &self,
        data: Vec<EmbeddingItem>,
        sent: usize,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        if data.len() != sent {
            return Err(EmbedError::WrongCount {
                url: self.endpoint_shown.clone(),
                sent,
                returned: data.len(),
            });
        }
        let mut slots: Vec<Option<Vec<f32>>> = vec![None; sent];
        for (position, item) in data.into_iter().enumerate() {
            let index = item.index.unwrap_or(position);
            let slot = slots.get_mut(index).ok_or_else(|| {
                self.invalid(format!("index {index} is out of range for {sent} inputs"))
            })?;
            if slot.replace(item.embedding).is_some() {
                return Err(self.invalid(format!("index {index} appears twice")));
            }
        }
        // Count matched and no index repeated, so every slot is filled.
        slots
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| self.invalid("an index is missing".to_owned()))
    }

    /// One dimension across all batches: the requested one, or else the first vector's.
    fn check_dimensions(&self, vectors: &[Vec<f32>]) -> Result<(), EmbedError> {
        let Some(first) = vectors.first() else {
            return Ok(());
        };
        let expected = self.config.dimensions.map_or(first.len(), |d| d as usize);
        if expected == 0 {
            return Err(self.invalid("embedding at input 0 is empty".to_owned()));
        }
        match vectors.iter().position(|vector| vector.len() != expected) {
            None => Ok(()),
            Some(input) => Err(EmbedError::WrongDimensions {
                url: self.endpoint_shown.clone(),
                input,
                expected,
                actual: vectors[input].len(),
            }),
        }
    }

    fn transport_error(&self, error: reqwest::Error) -> EmbedError {
        if error.is_timeout() {
            return EmbedError::Timeout {
                url: self.endpoint_shown.clone(),
                timeout: self.config.timeout,
            };
        }
        EmbedError::Transport {
            url: self.endpoint_shown.clone(),
            // We name the URL ourselves, without any password.
            reason: error_chain(&error.without_url()),
        }
    }

    fn invalid(&self, reason: String) -> EmbedError {
        EmbedError::InvalidResponse {
            url: self.endpoint_shown.clone(),
            reason,
        }
    }
}

impl Embedder for OpenAiEmbedder {
    fn model(&self) -> &str {
        &self.model_name
    }

    fn embed<'a>(
        &'a self,
        texts: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedError>> {
        Box::pin(async move {
            if texts.is_empty() {
                return Ok(Vec::new());
            }
            self.embed_all(texts).await
        })
    }
}

#[derive(Serialize)]
struct EmbeddingsRequest<'a> {
    model: &'a str,
    input: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    dimensions: Option<u32>,
}

#[derive(Deserialize)]
struct EmbeddingsResponse {
    data: Vec<EmbeddingItem>,
}

#[derive(Deserialize)]
struct EmbeddingItem {
    embedding: Vec<f32>,
    index: Option<usize>,
}

/// A path ending in `/embeddings` is the endpoint; one ending in `/v1` an OpenAI-style base;
/// anything else a base.
fn endpoint_url(raw: &str) -> Result<Url, EmbedError> {
    let mut url =
        Url::parse(raw.trim()).map_err(|error| config_error(&format!("url {raw:?}: {error}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(config_error(&format!("url {raw:?} is not http or https")));
    }
    let path = url.path().trim_end_matches('/').to_owned();
    if path.ends_with("/embeddings") {
        url.set_path(&path);
    } else if path.ends_with("/v1") {
        url.set_path(&format!("{path}/embeddings"));
    } else {
        url.set_path(&format!("{path}/v1/embeddings"));
    }
    Ok(url)
}

fn config_error(reason: &str) -> EmbedError {
    EmbedError::Config {
        reason: reason.to_owned(),
    }
}

/// Reads at most `limit` bytes of the body; `true` when there was more.
async fn read_capped(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = limit - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body, true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}

fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let mut shown: String = text.chars().take(ERROR_BODY_EXCERPT_CHARS).collect();
    if shown.len() < text.len() {
        shown.push('…');
    }
    shown
}

/// reqwest's own message often hides the cause ("error sending request"); the chain names it
/// ("connection refused").
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
