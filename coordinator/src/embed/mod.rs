//! Text embeddings, so that decisions agents made can be stored with a vector and found again by
//! meaning (top-k cosine).
//!
//! - [`Embedder`]: the trait every embedder implements, and its contract.
//! - [`HashedNgrams`]: the built-in, offline default. Lexical only: it matches shared words and
//!   spellings, not paraphrases.
//! - [`OpenAiEmbedder`]: any OpenAI-compatible `/v1/embeddings` server (OpenAI, Ollama, vLLM,
//!   TEI). Use it when paraphrases must match.
//! - [`cosine`] and [`top_k`]: the search itself.
//! - [`EmbedderConfig`] and [`build`]: which embedder, from configuration.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

mod hashed;
mod openai;

pub use hashed::HashedNgrams;
pub use openai::{OpenAiConfig, OpenAiEmbedder};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Turns texts into vectors. Vectors are only compared with vectors of the same `model()`.
///
/// Contract for implementations:
/// - `embed` returns exactly one vector per input text, in input order.
/// - For one `model()`, every vector has the same length, and the same text always gives the
///   same vector (so stored vectors stay comparable with fresh query vectors).
/// - `model()` changes whenever vectors would stop being comparable (another model, another
///   dimension, another feature scheme), so callers can tell stale vectors apart.
/// - An empty input gives an empty output.
pub trait Embedder: Send + Sync + 'static {
    fn model(&self) -> &str;
    fn embed<'a>(&'a self, texts: &'a [String])
    -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedError>>;
}

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("invalid embedder configuration: {reason}")]
    Config { reason: String },
    #[error("could not build the http client: {reason}")]
    Client { reason: String },
    #[error("request to {url} failed: {reason}")]
    Transport { url: String, reason: String },
    #[error("request to {url} timed out after {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("{url} answered HTTP {status}: {body_excerpt}")]
    Status {
        url: String,
        status: u16,
        body_excerpt: String,
    },
    #[error("response from {url} is larger than the {limit_bytes} bytes accepted")]
    ResponseTooLarge { url: String, limit_bytes: usize },
    #[error("response from {url} is not an embeddings response: {reason}")]
    InvalidResponse { url: String, reason: String },
    #[error("{url} returned {returned} embeddings for {sent} inputs")]
    WrongCount {
        url: String,
        sent: usize,
        returned: usize,
    },
    #[error(
        "{url} returned an embedding of {actual} dimensions at input {input}, expected {expected}"
    )]
    WrongDimensions {
        url: String,
        input: usize,
        expected: usize,
        actual: usize,
    },
}

/// Cosine similarity in `[-1, 1]`; 0.0 when the lengths differ or either vector has norm 0,
/// because such vectors cannot be compared and must not rank above real matches.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return 0.0;
    }
    // f64 accumulation keeps long vectors (thousands of dimensions) from drifting above 1.
    let (mut dot, mut norm_a, mut norm_b) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        dot += x * y;
        norm_a += x * x;
        norm_b += y * y;
    }
    if norm_a == 0.0 || norm_b == 0.0 {
        return 0.0;
    }
    (dot / (norm_a.sqrt() * norm_b.sqrt())).clamp(-1.0, 1.0) as f32
}

/// Indexes of the k best scores, best first, ties broken by lower index (deterministic).
/// NaN scores rank below every number; `-0.0` ties with `0.0`.
pub fn top_k(scores: &[f32], k: usize) -> Vec<usize> {
    let k = k.min(scores.len());
    if k == 0 {
        return Vec::new();
    }
    let rank = |index: usize| {
        let score = scores[index];
        if score.is_nan() {
            f32::NEG_INFINITY
        } else if score == 0.0 {
            0.0
        } else {
            score
        }
    };
    // A total order (score descending, then index ascending), so the selection below picks the
    // same set every time and the result does not depend on the sort algorithm.
    let best_first = |a: &usize, b: &usize| rank(*b).total_cmp(&rank(*a)).then(a.cmp(b));
    let mut indexes: Vec<usize> = (0..scores.len()).collect();
    if k < indexes.len() {
        indexes.select_nth_unstable_by(k - 1, best_first);
        indexes.truncate(k);
    }
    indexes.sort_unstable_by(best_first);
    indexes
}

/// Which embedder, from configuration (for the coordinator's CLI flags later).
#[derive(Debug, Clone)]
pub enum EmbedderConfig {
    Builtin,
    OpenAi(OpenAiConfig),
}

pub fn build(config: &EmbedderConfig) -> Result<Arc<dyn Embedder>, EmbedError> {
    Ok(match config {
        EmbedderConfig::Builtin => Arc::new(HashedNgrams::default()),
        EmbedderConfig::OpenAi(config) => Arc::new(OpenAiEmbedder::new(config.clone())?),
    })
}
