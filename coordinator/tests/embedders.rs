//! Embedders: the built-in hashed n-grams, the OpenAI-compatible HTTP client against a stub
//! server started here, and the cosine / top-k search over their vectors.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use baton_coordinator::embed::{
    self, EmbedError, Embedder, EmbedderConfig, HashedNgrams, OpenAiConfig, OpenAiEmbedder, cosine,
    top_k,
};
use serde_json::{Value, json};

fn texts(items: &[&str]) -> Vec<String> {
    items.iter().map(|text| text.to_string()).collect()
}

fn norm(vector: &[f32]) -> f32 {
    vector.iter().map(|x| x * x).sum::<f32>().sqrt()
}

// ---- built-in hashed n-grams ----

#[tokio::test]
async fn builtin_same_text_gives_identical_vectors_across_instances() {
    let inputs = texts(&["Retry the payment step with backoff", "ünïcödé wörds 42"]);
    let first = HashedNgrams::default().embed(&inputs).await.unwrap();
    let second = HashedNgrams::new(512).embed(&inputs).await.unwrap();
    assert_eq!(first, second);
    assert_ne!(first[0], first[1]);
}

#[test]
fn builtin_vectors_are_unit_length() {
    let embedder = HashedNgrams::default();
    for text in [
        "a",
        "deploy to staging",
        "Ünïcödé, punctuation; and 123 numbers!",
    ] {
        let length = norm(&embedder.embed_text(text));
        assert!((length - 1.0).abs() < 1e-5, "{text:?} has norm {length}");
    }
}

#[test]
fn builtin_text_without_words_gives_the_zero_vector() {
    let embedder = HashedNgrams::new(64);
    assert_eq!(embedder.embed_text(""), vec![0.0; 64]);
    assert_eq!(embedder.embed_text(" -- !? "), vec![0.0; 64]);
}

#[test]
fn builtin_ignores_case_and_punctuation() {
    let embedder = HashedNgrams::default();
    assert_eq!(
        embedder.embed_text("Retry, the PAYMENT step!"),
        embedder.embed_text("retry the payment step")
    );
}

#[test]
fn builtin_texts_sharing_words_score_higher_than_unrelated_texts() {
    let embedder = HashedNgrams::default();
    let decision =
        embedder.embed_text("use exponential backoff when the payment service times out");
    let related = embedder.embed_text("payment service timeouts: retry with backoff");
    let unrelated = embedder.embed_text("the logo should be dark blue on the landing page");
    let related_score = cosine(&decision, &related);
    let unrelated_score = cosine(&decision, &unrelated);
    assert!(
        related_score > unrelated_score + 0.2,
        "related {related_score}, unrelated {unrelated_score}"
    );
}

#[test]
fn builtin_inflections_share_character_trigrams() {
    let embedder = HashedNgrams::default();
    let retries = embedder.embed_text("retries");
    assert!(cosine(&retries, &embedder.embed_text("retry")) > 0.25);
    assert!(cosine(&retries, &embedder.embed_text("deploy")) < 0.2);
}

#[tokio::test]
async fn builtin_respects_dims_and_names_them_in_the_model() {
    for dims in [1, 7, 64, 1024] {
        let embedder = HashedNgrams::new(dims);
        assert_eq!(embedder.dims(), dims);
        assert_eq!(embedder.model(), format!("baton-hashed-ngrams-v1-{dims}"));
        let vectors = embedder.embed(&texts(&["one two", "three"])).await.unwrap();
        assert!(vectors.iter().all(|vector| vector.len() == dims));
    }
    assert_eq!(HashedNgrams::default().dims(), 512);
}

/// A change to tokenising, features, weights or the hash changes these numbers. Stored vectors
/// would then no longer match fresh ones: bump the "v1" in the model name and update the pins.
#[test]
fn builtin_vectors_are_pinned() {
    let embedder = HashedNgrams::new(16);
    let vector = embedder.embed_text("Ship it");
    let expected: [f32; 16] = PINNED_SHIP_IT;
    for (slot, (actual, expected)) in vector.iter().zip(expected).enumerate() {
        assert!(
            (actual - expected).abs() < 1e-6,
            "slot {slot}: {actual} != {expected}; whole vector {vector:?}"
        );
    }
    let default = HashedNgrams::default();
    let score = cosine(
        &default.embed_text("retry the payment step"),
        &default.embed_text("payment step failed, retry later"),
    );
    assert!((score - PINNED_SCORE).abs() < 1e-6, "score {score}");
}

/// "ship", "it", "ship it" and six trigrams in 16 slots: each slot sums ±1 per word and ±0.5
/// per pair or trigram, then the vector is divided by its norm, sqrt(4.25).
const PINNED_SHIP_IT: [f32; 16] = [
    0.0,
    -0.24253564,
    0.0,
    0.0,
    0.0,
    -0.24253564,
    0.0,
    0.48507127,
    0.24253564,
    -0.48507127,
    0.0,
    0.0,
    0.24253564,
    0.48507127,
    0.0,
    -0.24253564,
];
const PINNED_SCORE: f32 = 0.7058857;

#[tokio::test]
async fn builtin_empty_input_gives_empty_output() {
    assert!(HashedNgrams::default().embed(&[]).await.unwrap().is_empty());
}

#[test]
fn build_from_config_gives_the_chosen_embedder() {
    assert_eq!(
        embed::build(&EmbedderConfig::Builtin).unwrap().model(),
        "baton-hashed-ngrams-v1-512"
    );
    let config = OpenAiConfig::new("http://127.0.0.1:9", "nomic-embed-text");
    let built = embed::build(&EmbedderConfig::OpenAi(config)).unwrap();
    assert_eq!(built.model(), "openai:nomic-embed-text");
    let bad = OpenAiConfig::new("ftp://127.0.0.1:9", "nomic-embed-text");
    assert!(matches!(
        embed::build(&EmbedderConfig::OpenAi(bad)),
        Err(EmbedError::Config { .. })
    ));
}

#[test]
fn decisions_are_found_by_shared_words_with_top_k() {
    let embedder = HashedNgrams::default();
    let decisions = [
        "Chose Postgres over MySQL for the orders database",
        "Payment retries use exponential backoff capped at 5 minutes",
        "The landing page logo is dark blue",
        "Workers poll the task queue every 2 seconds",
    ];
    let vectors: Vec<Vec<f32>> = decisions.iter().map(|d| embedder.embed_text(d)).collect();
    let query = embedder.embed_text("how do payment retries back off?");
    let scores: Vec<f32> = vectors.iter().map(|v| cosine(&query, v)).collect();
    assert_eq!(top_k(&scores, 1), vec![1]);
}

// ---- OpenAI-compatible HTTP embedder, against a stub server ----

#[derive(Clone, Copy)]
enum Behaviour {
    Embed,
    FailWith500,
    DropOneVector,
    MixDimensions,
    NeverAnswer,
}

#[derive(Clone, Debug)]
struct RecordedRequest {
    path: String,
    authorization: Option<String>,
    body: Value,
}

#[derive(Clone)]
struct StubState {
    behaviour: Behaviour,
    requests: Arc<Mutex<Vec<RecordedRequest>>>,
}

struct Stub {
    /// `http://127.0.0.1:<port>`, no trailing slash.
    base_url: String,
    requests: Arc<Mutex<Vec<RecordedRequest>>>,
}

impl Stub {
    fn requests(&self) -> Vec<RecordedRequest> {
        self.requests.lock().unwrap().clone()
    }
}

async fn start_stub(behaviour: Behaviour) -> Stub {
    let requests = Arc::new(Mutex::new(Vec::new()));
    let state = StubState {
        behaviour,
        requests: requests.clone(),
    };
    // A fallback, not a route, so that a request to the wrong path is recorded too.
    let app = Router::new().fallback(answer).with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Stub {
        base_url: format!("http://{address}"),
        requests,
    }
}

/// The vectors the stub serves: fixed per text, so the client's reordering can be checked.
fn stub_vector(text: &str) -> Vec<f32> {
    match text {
        "alpha" => vec![1.0, 0.0, 0.0],
        "beta" => vec![0.0, 1.0, 0.0],
        "gamma" => vec![0.0, 0.0, 1.0],
        _ => match text.strip_prefix("item-") {
            Some(number) => vec![number.parse().unwrap(), 1.0, 0.0],
            None => vec![-1.0, -1.0, -1.0],
        },
    }
}

async fn answer(
    State(state): State<StubState>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    state.requests.lock().unwrap().push(RecordedRequest {
        path: uri.path().to_owned(),
        authorization: headers
            .get(header::AUTHORIZATION)
            .map(|value| value.to_str().unwrap().to_owned()),
        body: body.clone(),
    });

    let inputs: Vec<String> = serde_json::from_value(body["input"].clone()).unwrap_or_default();
    let mut data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, text)| json!({"index": index, "embedding": stub_vector(text)}))
        .collect();
    match state.behaviour {
        Behaviour::Embed => {}
        Behaviour::FailWith500 => {
            let message = r#"{"error": "model \"nomic-embed-text\" not loaded"}"#;
            return (StatusCode::INTERNAL_SERVER_ERROR, message).into_response();
        }
        Behaviour::DropOneVector => {
            data.pop();
        }
        Behaviour::MixDimensions => {
            data[1]["embedding"] = json!([0.5, 0.5, 0.5, 0.5]);
        }
        Behaviour::NeverAnswer => std::future::pending::<()>().await,
    }
    // Reversed: the API does not promise order, and the client must sort by `index`.
    data.reverse();
    axum::Json(json!({"object": "list", "data": data, "model": body["model"]})).into_response()
}

fn embedder(url: &str) -> OpenAiEmbedder {
    OpenAiEmbedder::new(OpenAiConfig::new(url, "nomic-embed-text")).unwrap()
}

#[tokio::test]
async fn http_base_url_posts_to_v1_embeddings_and_returns_vectors_in_input_order() {
    let stub = start_stub(Behaviour::Embed).await;
    // A trailing slash must not give `//v1/embeddings`.
    let embedder = embedder(&format!("{}/", stub.base_url));

    let vectors = embedder
        .embed(&texts(&["gamma", "alpha", "beta"]))
        .await
        .unwrap();

    assert_eq!(
        vectors,
        vec![
            stub_vector("gamma"),
            stub_vector("alpha"),
            stub_vector("beta")
        ]
    );
    let requests = stub.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].path, "/v1/embeddings");
    assert_eq!(
        requests[0].body,
        json!({"model": "nomic-embed-text", "input": ["gamma", "alpha", "beta"]})
    );
    assert_eq!(requests[0].authorization, None);
}

#[tokio::test]
async fn http_full_endpoint_url_is_used_as_is() {
    let stub = start_stub(Behaviour::Embed).await;
    let embedder = embedder(&format!("{}/proxy/openai/v1/embeddings", stub.base_url));

    let vectors = embedder.embed(&texts(&["beta"])).await.unwrap();

    assert_eq!(vectors, vec![stub_vector("beta")]);
    assert_eq!(stub.requests()[0].path, "/proxy/openai/v1/embeddings");
}

#[tokio::test]
async fn http_sends_bearer_key_and_dimensions_when_set() {
    let stub = start_stub(Behaviour::Embed).await;
    let mut config = OpenAiConfig::new(&stub.base_url, "text-embedding-3-small");
    config.api_key = Some("sk-test-123".to_owned());
    config.dimensions = Some(3);
    let embedder = OpenAiEmbedder::new(config).unwrap();

    embedder.embed(&texts(&["alpha"])).await.unwrap();

    let request = &stub.requests()[0];
    assert_eq!(request.authorization.as_deref(), Some("Bearer sk-test-123"));
    assert_eq!(
        request.body,
        json!({"model": "text-embedding-3-small", "input": ["alpha"], "dimensions": 3})
    );
    assert_eq!(embedder.model(), "openai:text-embedding-3-small");
}

#[tokio::test]
async fn http_server_error_names_the_status_and_part_of_the_body() {
    let stub = start_stub(Behaviour::FailWith500).await;

    let error = embedder(&stub.base_url)
        .embed(&texts(&["alpha"]))
        .await
        .unwrap_err();

    match &error {
        EmbedError::Status {
            url,
            status,
            body_excerpt,
        } => {
            assert_eq!(*status, 500);
            assert_eq!(url, &format!("{}/v1/embeddings", stub.base_url));
            assert!(body_excerpt.contains("not loaded"), "{body_excerpt}");
        }
        other => panic!("expected a status error, got {other:?}"),
    }
    let message = error.to_string();
    assert!(
        message.contains("500") && message.contains("nomic-embed-text"),
        "{message}"
    );
}

#[tokio::test]
async fn http_wrong_count_is_a_named_error() {
    let stub = start_stub(Behaviour::DropOneVector).await;

    let error = embedder(&stub.base_url)
        .embed(&texts(&["alpha", "beta"]))
        .await
        .unwrap_err();

    assert!(
        matches!(
            error,
            EmbedError::WrongCount {
                sent: 2,
                returned: 1,
                ..
            }
        ),
        "{error:?}"
    );
}

#[tokio::test]
async fn http_mixed_dimensions_are_a_named_error() {
    let stub = start_stub(Behaviour::MixDimensions).await;

    let error = embedder(&stub.base_url)
        .embed(&texts(&["alpha", "beta", "gamma"]))
        .await
        .unwrap_err();

    assert!(
        matches!(
            error,
            EmbedError::WrongDimensions {
                input: 1,
                expected: 3,
                actual: 4,
                ..
            }
        ),
        "{error:?}"
    );
}

#[tokio::test]
async fn http_requested_dimensions_are_enforced() {
    let stub = start_stub(Behaviour::Embed).await;
    let mut config = OpenAiConfig::new(&stub.base_url, "nomic-embed-text");
    config.dimensions = Some(4);

    let error = OpenAiEmbedder::new(config)
        .unwrap()
        .embed(&texts(&["alpha"]))
        .await
        .unwrap_err();

    assert!(
        matches!(
            error,
            EmbedError::WrongDimensions {
                input: 0,
                expected: 4,
                actual: 3,
                ..
            }
        ),
        "{error:?}"
    );
}

#[tokio::test]
async fn http_splits_more_than_256_texts_into_several_requests() {
    let stub = start_stub(Behaviour::Embed).await;
    let inputs: Vec<String> = (0..600).map(|i| format!("item-{i}")).collect();

    let vectors = embedder(&stub.base_url).embed(&inputs).await.unwrap();

    let batch_sizes: Vec<usize> = stub
        .requests()
        .iter()
        .map(|request| request.body["input"].as_array().unwrap().len())
        .collect();
    assert_eq!(batch_sizes, vec![256, 256, 88]);
    assert_eq!(OpenAiEmbedder::MAX_TEXTS_PER_REQUEST, 256);
    let firsts: Vec<f32> = vectors.iter().map(|vector| vector[0]).collect();
    let expected: Vec<f32> = (0..600).map(|i| i as f32).collect();
    assert_eq!(firsts, expected);
}

#[tokio::test]
async fn http_empty_input_sends_no_request() {
    let stub = start_stub(Behaviour::Embed).await;

    let vectors = embedder(&stub.base_url).embed(&[]).await.unwrap();

    assert!(vectors.is_empty());
    assert!(stub.requests().is_empty());
}

#[tokio::test]
async fn http_unanswered_request_hits_the_timeout() {
    let stub = start_stub(Behaviour::NeverAnswer).await;
    let mut config = OpenAiConfig::new(&stub.base_url, "nomic-embed-text");
    config.timeout = Duration::from_millis(300);
    let embedder = OpenAiEmbedder::new(config).unwrap();

    // The outer limit only turns a broken client timeout into a failure instead of a hang.
    let result = tokio::time::timeout(Duration::from_secs(30), embedder.embed(&texts(&["alpha"])))
        .await
        .expect("the client's own timeout should have fired");

    let error = result.unwrap_err();
    let configured = Duration::from_millis(300);
    assert!(
        matches!(error, EmbedError::Timeout { timeout, .. } if timeout == configured),
        "{error:?}"
    );
    assert_eq!(stub.requests().len(), 1);
}

#[tokio::test]
async fn http_refused_connection_is_a_transport_error_naming_the_url() {
    // Bind and drop, so the port is very likely closed.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);

    let error = embedder(&base_url)
        .embed(&texts(&["alpha"]))
        .await
        .unwrap_err();

    match error {
        EmbedError::Transport { url, .. } => assert_eq!(url, format!("{base_url}/v1/embeddings")),
        other => panic!("expected a transport error, got {other:?}"),
    }
}

#[test]
fn http_endpoint_is_the_url_itself_or_the_base_plus_v1_embeddings() {
    let cases = [
        (
            "http://localhost:11434",
            "http://localhost:11434/v1/embeddings",
        ),
        (
            "http://localhost:11434/",
            "http://localhost:11434/v1/embeddings",
        ),
        (
            "http://gpu-box:8080/tei/",
            "http://gpu-box:8080/tei/v1/embeddings",
        ),
        (
            "https://api.openai.com/v1/embeddings",
            "https://api.openai.com/v1/embeddings",
        ),
        (
            "http://vllm:8000/v1/embeddings/",
            "http://vllm:8000/v1/embeddings",
        ),
        // OpenAI's documented base URL.
        (
            "https://api.openai.com/v1",
            "https://api.openai.com/v1/embeddings",
        ),
    ];
    for (url, endpoint) in cases {
        assert_eq!(embedder(url).endpoint(), endpoint, "from {url}");
    }
}

#[test]
fn http_config_is_checked_when_building() {
    for (url, model) in [
        ("not a url", "m"),
        ("ftp://host/v1/embeddings", "m"),
        ("http://localhost:11434", " "),
    ] {
        let result = OpenAiEmbedder::new(OpenAiConfig::new(url, model));
        assert!(
            matches!(result, Err(EmbedError::Config { .. })),
            "{url} {model:?}"
        );
    }
    let mut zero_timeout = OpenAiConfig::new("http://localhost:11434", "m");
    zero_timeout.timeout = Duration::ZERO;
    assert!(matches!(
        OpenAiEmbedder::new(zero_timeout),
        Err(EmbedError::Config { .. })
    ));
}

#[test]
fn http_config_debug_hides_the_api_key() {
    let mut config = OpenAiConfig::new("http://localhost:11434", "m");
    config.api_key = Some("sk-secret-value".to_owned());
    let shown = format!("{:?}", EmbedderConfig::OpenAi(config));
    assert!(!shown.contains("sk-secret-value"), "{shown}");
    assert!(shown.contains("<redacted>"), "{shown}");
}

// ---- cosine and top_k ----

#[test]
fn cosine_of_orthogonal_vectors_is_zero() {
    assert_eq!(cosine(&[1.0, 0.0, 0.0], &[0.0, 2.0, 0.0]), 0.0);
}

#[test]
fn cosine_of_identical_or_scaled_vectors_is_one_and_of_opposite_is_minus_one() {
    let vector = [0.3, -1.2, 4.0, 0.001];
    let scaled = vector.map(|x| x * 7.5);
    let opposite = vector.map(|x| -x);
    assert!((cosine(&vector, &vector) - 1.0).abs() < 1e-6);
    assert!((cosine(&vector, &scaled) - 1.0).abs() < 1e-6);
    assert!((cosine(&vector, &opposite) + 1.0).abs() < 1e-6);
}

#[test]
fn cosine_is_zero_for_different_lengths_or_a_zero_norm() {
    assert_eq!(cosine(&[1.0, 0.0], &[1.0, 0.0, 0.0]), 0.0);
    assert_eq!(cosine(&[0.0, 0.0], &[1.0, 1.0]), 0.0);
    assert_eq!(cosine(&[], &[]), 0.0);
}

#[test]
fn top_k_orders_best_first_and_breaks_ties_by_lower_index() {
    let scores = [0.1, 0.9, 0.5, 0.9, 0.5, -0.3];
    assert_eq!(top_k(&scores, 3), vec![1, 3, 2]);
    assert_eq!(top_k(&scores, 4), vec![1, 3, 2, 4]);
    assert_eq!(top_k(&scores, 100), vec![1, 3, 2, 4, 0, 5]);
    assert_eq!(top_k(&scores, 0), Vec::<usize>::new());
    assert_eq!(top_k(&[], 3), Vec::<usize>::new());
}

#[test]
fn top_k_ranks_nan_last_and_negative_zero_with_zero() {
    assert_eq!(
        top_k(&[f32::NAN, 0.2, -0.0, 0.0, -0.1], 5),
        vec![1, 2, 3, 4, 0]
    );
}

/// The partial selection must agree with a full sort for every k, ties included.
#[test]
fn top_k_agrees_with_a_full_sort() {
    // A fixed pseudo-random sequence with few distinct values, so ties are everywhere.
    let mut state: u32 = 12345;
    let scores: Vec<f32> = (0..200)
        .map(|_| {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
            ((state >> 16) % 10) as f32 / 10.0
        })
        .collect();
    let mut fully_sorted: Vec<usize> = (0..scores.len()).collect();
    fully_sorted.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    for k in 0..=scores.len() {
        assert_eq!(top_k(&scores, k), fully_sorted[..k], "k = {k}");
    }
}
