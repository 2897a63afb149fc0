//! Calling an OpenAI-compatible server: `POST {base_url}/chat/completions`, with the API key,
//! timeouts, and the retries inside one attempt.
//!
//! - A 429 or 5xx (and 408), a timeout, a refused connection or a reply broken off midway is
//!   tried again, `http_retries` times: after the server's `Retry-After` (seconds or an HTTP
//!   date) when it sends one, else after an exponential backoff (250 ms, 500 ms, 1 s... with
//!   jitter). Then the attempt fails, retryable.
//! - Any other 4xx (and a redirect, which is not followed: a POST redirected would lose its
//!   body) fails it for good, with the server's own message.
//! - Timeouts: [`CONNECT_TIMEOUT`] to connect; then the agent's `idle_timeout_ms` for the
//!   response to start and between two reads of it. A streamed reply keeps the connection
//!   busy, so only a stalled server times out; a reply that is not streamed must come whole
//!   within the idle timeout. The step's `timeout_ms` bounds the attempt as a whole.
//! - Dropping the future (a cancelled run, a step's timeout) drops the request with it, which
//!   closes its connection at once.

use std::time::{Duration, Instant, SystemTime};

use reqwest::header::{ACCEPT, CONTENT_TYPE, LOCATION, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use serde_json::Value;
use tokio::time::timeout;

use super::receive::{self, Live, Received, describe, silent_for};
use crate::output::ModelCall;

/// How long connecting to the server may take.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The first backoff between tries when the server names no time; doubled each try.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);

/// The longest `Retry-After` waited for: a server asking for more fails the attempt at once,
/// and the step's retry policy decides.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// An API key: never shown, in `Debug` or anywhere else.
pub(super) struct ApiKey(String);

impl ApiKey {
    pub(super) fn new(key: String) -> ApiKey {
        ApiKey(key)
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// An OpenAI-compatible chat completions endpoint, and how an agent calls it.
#[derive(Debug)]
pub(super) struct Client {
    http: reqwest::Client,
    endpoint: Url,
    /// The endpoint without any password, for messages.
    shown: String,
    api_key: Option<ApiKey>,
    /// The model asked for: a call's model when the server names none.
    model: String,
    /// Replies are asked for as server-sent events.
    stream: bool,
    retries: u32,
    idle: Duration,
}

/// What the calls of one agent run leave behind: the replies' text shown as it came, and a
/// record of every HTTP call that reached the server.
pub(super) struct Exchange<'a> {
    pub live: Live<'a>,
    pub calls: Vec<ModelCall>,
}

/// Why a call gave no reply.
pub(super) enum CallError {
    /// Every try failed, each in a way that may pass (a 429, 5xx, timeout, broken stream):
    /// another attempt may succeed.
    Unavailable(String),
    /// The server refused the request: another attempt would be refused too.
    Refused { status: u16, message: String },
}

/// How one try went, when it gave no reply.
enum TryError {
    Transient {
        reason: String,
        retry_after: Option<Duration>,
    },
    Refused {
        status: u16,
        message: String,
    },
}

impl Client {
    /// A client of `{base_url}/chat/completions` for `model`.
    pub(super) fn new(
        base_url: &str,
        api_key: Option<ApiKey>,
        model: &str,
        stream: bool,
        retries: u32,
        idle: Duration,
    ) -> Result<Client, String> {
        let endpoint = endpoint(base_url)?;
        let mut shown = endpoint.clone();
        let _ = shown.set_password(None);
        // reqwest is built without a crypto provider so that the process uses ring only
        // (STACK.md); installing fails harmlessly when one is already installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(describe)?;
        Ok(Client {
            http,
            endpoint,
            shown: shown.to_string(),
            api_key,
            model: model.to_owned(),
            stream,
            retries,
            idle,
        })
    }

    /// The endpoint, as messages show it.
    pub(super) fn url(&self) -> &str {
        &self.shown
    }

    /// Sends `body` until a reply comes (see the module documentation for the retries); each
    /// try is recorded in `exchange`.
    pub(super) async fn complete(
        &self,
        body: &Value,
        exchange: &mut Exchange<'_>,
    ) -> Result<Received, CallError> {
        let mut tries = 0;
        loop {
            exchange.live.begin_reply();
            let (reason, retry_after) = match self.try_once(body, exchange).await {
                Ok(received) => {
                    exchange.live.end_reply();
                    return Ok(received);
                }
                Err(TryError::Refused { status, message }) => {
                    return Err(CallError::Refused {
                        status,
                        message: self.redact(message),
                    });
                }
                Err(TryError::Transient {
                    reason,
                    retry_after,
                }) => (self.redact(reason), retry_after),
            };
            tries += 1;
            if tries > self.retries {
                let plural = if tries == 1 { "" } else { "s" };
                return Err(CallError::Unavailable(format!(
                    "{reason} (tried {tries} time{plural})"
                )));
            }
            let wait = match retry_after {
                Some(wait) if wait > MAX_RETRY_AFTER => {
                    return Err(CallError::Unavailable(format!(
                        "{reason} (the server asks to retry after {} s, longer than the {} s waited within an attempt)",
                        wait.as_secs(),
                        MAX_RETRY_AFTER.as_secs()
                    )));
                }
                Some(wait) => wait,
                None => backoff(tries),
            };
            tracing::debug!(url = %self.shown, %reason, wait_ms = wait.as_millis() as u64, "model call failed; trying again");
            tokio::time::sleep(wait).await;
        }
    }

    /// One HTTP call.
    async fn try_once(
        &self,
        body: &Value,
        exchange: &mut Exchange<'_>,
    ) -> Result<Received, TryError> {
        let Exchange { live, calls } = exchange;
        let mut request = self.http.post(self.endpoint.clone()).json(body);
        if self.stream {
            request = request.header(ACCEPT, "text/event-stream");
        }
        if let Some(ApiKey(key)) = &self.api_key {
            // bearer_auth marks the header sensitive.
            request = request.bearer_auth(key);
        }
        let sent = Instant::now();
        let record = |calls: &mut Vec<ModelCall>, received: &Received| {
            calls.push(ModelCall {
                system: "openai".to_owned(),
                model: received.model.clone().unwrap_or_else(|| self.model.clone()),
                prompt_tokens: received.prompt_tokens.unwrap_or(0),
                completion_tokens: received.completion_tokens.unwrap_or(0),
                finish_reason: received.finish_reason.clone(),
                duration: sent.elapsed(),
                first_token: received.first_token,
            });
        };
        let transient = |reason: String| TryError::Transient {
            reason,
            retry_after: None,
        };
        let response = match timeout(self.idle, request.send()).await {
            Err(_) => {
                record(calls, &Received::default());
                return Err(transient(silent_for(self.idle)));
            }
            Ok(Err(error)) => {
                // A connection never made called no model.
                if !error.is_connect() {
                    record(calls, &Received::default());
                }
                return Err(transient(describe(error)));
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if !status.is_success() {
            record(calls, &Received::default());
            return Err(self.refusal(status, response).await);
        }
        // A server that ignores `"stream": true` answers with a whole completion.
        let whole = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("application/json"));
        let read = if self.stream && !whole {
            receive::read_stream(response, self.idle, sent, live).await
        } else {
            receive::read_plain(response, self.idle, live).await
        };
        match read {
            Ok(received) => {
                record(calls, &received);
                Ok(received)
            }
            Err(broken) => {
                record(calls, &broken.partial);
                Err(transient(broken.reason))
            }
        }
    }

    /// What an unsuccessful status means: worth another try (429, 5xx, 408) or not.
    async fn refusal(&self, status: StatusCode, response: reqwest::Response) -> TryError {
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| retry_after(value, SystemTime::now()));
        let location = response
            .headers()
            .get(LOCATION)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let message = receive::error_message(response, self.idle).await;
        let transient = status == StatusCode::TOO_MANY_REQUESTS
            || status == StatusCode::REQUEST_TIMEOUT
            || status.is_server_error();
        if transient {
            return TryError::Transient {
                reason: format!("HTTP {}: {message}", status.as_u16()),
                retry_after,
            };
        }
        let message = match location {
            Some(location) if status.is_redirection() => {
                format!("redirected to {location} (redirects are not followed: set base_url)")
            }
            _ => message,
        };
        TryError::Refused {
            status: status.as_u16(),
            message,
        }
    }

    /// `text` without the API key, should a server have echoed it.
    fn redact(&self, text: String) -> String {
        match &self.api_key {
            Some(ApiKey(key)) if !key.is_empty() && text.contains(key.as_str()) => {
                text.replace(key.as_str(), "<redacted>")
            }
            _ => text,
        }
    }
}

/// `{base_url}/chat/completions`, for an `http` or `https` base.
pub(super) fn endpoint(base_url: &str) -> Result<Url, String> {
    let url = Url::parse(base_url.trim()).map_err(|e| format!("is not a URL ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "must be an http or https URL, found {:?}",
            url.scheme()
        ));
    }
    let mut endpoint = url.clone();
    endpoint.set_path(&format!(
        "{}/chat/completions",
        url.path().trim_end_matches('/')
    ));
    Ok(endpoint)
}

/// A `Retry-After` value: seconds, or an HTTP date (a date past is now).
fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The wait before try `tries + 1`: [`FIRST_BACKOFF`] doubled each time, plus up to a quarter
/// of jitter, so that workers refused together do not come back together.
fn backoff(tries: u32) -> Duration {
    let base = FIRST_BACKOFF * 2u32.saturating_pow(tries.saturating_sub(1).min(10));
    base + base.mul_f64(fastrand::f64() / 4.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_follows_the_base_url() {
        for (base, expected) in [
            (
                "http://localhost:11434/v1",
                "http://localhost:11434/v1/chat/completions",
            ),
            (
                "https://api.openai.com/v1/",
                "https://api.openai.com/v1/chat/completions",
            ),
            ("http://vllm:8000", "http://vllm:8000/chat/completions"),
        ] {
            assert_eq!(endpoint(base).unwrap().as_str(), expected);
        }
        assert!(
            endpoint("localhost:11434")
                .unwrap_err()
                .contains("http or https")
        );
        assert!(
            endpoint("not a url")
                .unwrap_err()
                .starts_with("is not a URL")
        );
    }

    #[test]
    fn retry_after_is_seconds_or_a_date() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(retry_after("0", now), Some(Duration::ZERO));
        assert_eq!(retry_after(" 2 ", now), Some(Duration::from_secs(2)));
        assert_eq!(retry_after("0.5", now), Some(Duration::from_millis(500)));
        assert_eq!(
            retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            retry_after("Sun, 06 Nov 1994 08:49:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("-1", now), None);
        assert_eq!(retry_after("soon", now), None);
    }

    #[test]
    fn backoff_doubles_with_jitter() {
        for (tries, base) in [(1, 250), (2, 500), (3, 1000)] {
            let wait = backoff(tries).as_millis() as u64;
            assert!((base..=base + base / 4).contains(&wait), "{tries}: {wait}");
        }
    }

    #[test]
    fn the_key_is_redacted() {
        let key = ApiKey::new("sk-secret".into());
        assert_eq!(format!("{key:?}"), "<redacted>");
        let client = Client::new(
            "http://localhost:1/v1",
            Some(key),
            "m",
            true,
            0,
            Duration::from_secs(1),
        )
        .unwrap();
        assert!(!format!("{client:?}").contains("sk-secret"));
        assert_eq!(
            client.redact("bad key sk-secret".into()),
            "bad key <redacted>"
        );
    }
}
