//! Redis credentials and TLS, against real `redis-server`s this file starts on free loopback
//! ports: a password for the default user (`requirepass`), ACL users (one with every
//! permission, one with only what the store needs, others short of it, one disabled), and a
//! TLS-only server whose certificate a CA made here signed. The store connects with the
//! credentials in its URL and does what a coordinator does; every refusal is an error that
//! names the URL without its password, says what failed and comes at once (not after the
//! connection manager's retries), and never contains the password.

#[path = "support/redis_server.rs"]
#[allow(dead_code)] // shared harness: not every helper is used here
mod redis_server;
#[path = "../../tests/support/secured_redis.rs"]
mod secured_redis;

use std::time::Duration;

use baton_coordinator::store::redis::{ConnectOptions, RedisStore, redacted};
use baton_coordinator::store::{
    Claim, Coordination, Error, Listing, LiveOutput, OutputPiece, RunHeader, RunQuery, Runs,
    TaskSwap, Tasks, TransitionWrite,
};
use redis_server::{RedisServer, free_port};
use secured_redis::{
    ADMIN_PASSWORD, APP_PASSWORD, ENCODED_PASSWORD_IN_URL, TLS_PASSWORD, TlsRedis, USER_PASSWORD,
    certificates, require_credentials,
};

/// A `redis-server` whose default user has a password, with the ACL users of
/// [`require_credentials`].
struct Secured {
    server: RedisServer,
}

impl Secured {
    async fn start() -> Secured {
        let server = RedisServer::start();
        require_credentials(&server.url()).await;
        Secured { server }
    }

    /// `redis://<userinfo>@127.0.0.1:<port>/`, or no userinfo when empty.
    fn url(&self, userinfo: &str) -> String {
        let port = self.server.port();
        if userinfo.is_empty() {
            format!("redis://127.0.0.1:{port}/")
        } else {
            format!("redis://{userinfo}@127.0.0.1:{port}/")
        }
    }
}

/// Connects to `url`, which must be refused; the error's text, checked to name the redacted URL
/// and not to contain `password`. (No time is asserted: speed is the benchmark's business.)
async fn refused(url: &str, options: ConnectOptions, password: &str) -> String {
    let err = RedisStore::connect_with(url, options)
        .await
        .expect_err("the connection should be refused");
    let Error::Unavailable(text) = &err else {
        panic!("a refused connection should be Unavailable, got {err:?}");
    };
    let text = text.clone();
    assert!(
        text.starts_with(&format!("cannot connect to Redis at {}: ", redacted(url))),
        "the error names the redacted URL first: {text}"
    );
    assert!(
        !text.contains(password),
        "the error shows the password: {text}"
    );
    text
}

fn task(due_ms: i64) -> Vec<u8> {
    format!(r#"{{"agent":"review","attempt":1,"due_ms":{due_ms},"worker":"w1"}}"#).into_bytes()
}

/// What a coordinator does with its store, call by call: every kind of command and script the
/// store sends, so that a user short of a permission the store needs fails here.
async fn exercise(store: &RedisStore) {
    let run_id = "run-credentials";
    let header = RunHeader {
        run_id: run_id.to_owned(),
        workflow_id: "wf-credentials".to_owned(),
        workflow: r#"{"name":"credentials"}"#.to_owned(),
        input: b"{}".to_vec(),
        created_ms: 1_000,
        traceparent: String::new(),
        submitted_by: String::new(),
    };
    let first = TransitionWrite {
        steps: vec![("plan".to_owned(), br#"{"state":"queued"}"#.to_vec())],
        tasks_set: vec![("plan#1".to_owned(), task(1_000))],
        status: baton_core::RunStatus::Running.to_owned(),
        state_sha256: "0".repeat(64),
        updated_ms: 1_000,
        ..TransitionWrite::default()
    };
    assert_eq!(
        store
            .claim_idempotency_key("key-1", run_id, "sha", 60)
            .await
            .expect("claim_idempotency_key"),
        Claim::Claimed
    );
    store.create_run(header, first).await.expect("create_run");
    let second = TransitionWrite {
        events: vec![br#"{"event":"answer"}"#.to_vec()],
        results: vec![("plan#1".to_owned(), br#"{"ok":true}"#.to_vec().into())],
        status: baton_core::RunStatus::Running.to_owned(),
        state_sha256: "1".repeat(64),
        updated_ms: 2_000,
        ..TransitionWrite::default()
    };
    assert_eq!(
        store
            .apply_transition(run_id, 1, second)
            .await
            .expect("apply_transition"),
        2
    );
    let run = store
        .load_run(run_id)
        .await
        .expect("load_run")
        .expect("the run exists");
    assert_eq!(run.version, 2);
    assert_eq!(store.version(run_id).await.expect("version"), Some(2));
    let listed = store
        .list_runs(RunQuery::newest(10))
        .await
        .expect("list_runs")
        .runs;
    assert_eq!(listed.len(), 1, "the run is indexed: {listed:?}");
    assert_eq!(
        store.active_runs().await.expect("active_runs"),
        [run_id.to_owned()]
    );
    assert_eq!(
        store
            .runs_of_workflow("wf-credentials", 10)
            .await
            .expect("runs_of_workflow"),
        [run_id.to_owned()]
    );
    let due = store
        .due_tasks("review", 5_000, 10)
        .await
        .expect("due_tasks");
    assert_eq!(due.len(), 1, "{due:?}");
    let swapped = store
        .swap_tasks(vec![TaskSwap {
            run_id: run_id.to_owned(),
            task_key: "plan#1".to_owned(),
            expected: task(1_000),
            new: Some(task(9_000)),
        }])
        .await
        .expect("swap_tasks");
    assert_eq!(swapped, [true]);
    assert_eq!(
        store.task(run_id, "plan#1").await.expect("task"),
        Some(task(9_000))
    );
    let piece = OutputPiece {
        step_id: "plan".to_owned(),
        visit: 1,
        attempt: 1,
        text: "hello".to_owned(),
        restart: false,
        worker_id: None,
    };
    store
        .append_output(vec![(run_id.into(), piece)])
        .await
        .expect("append_output");
    let output = store.read_output(run_id, None).await.expect("read_output");
    assert_eq!(output.len(), 1);
    let waited = store
        .wait_output(
            vec![(run_id.to_owned(), output[0].0)],
            Duration::from_millis(10),
        )
        .await
        .expect("wait_output");
    assert!(waited.is_empty(), "{waited:?}");
    assert!(store.decisions(run_id).await.expect("decisions").is_empty());
    assert_eq!(store.rebuild_indexes().await.expect("rebuild_indexes"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_users_password_in_the_url_connects() {
    let redis = Secured::start().await;
    let store = RedisStore::connect(&redis.url(&format!(":{ADMIN_PASSWORD}")))
        .await
        .expect("connect with the default user's password");
    exercise(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_and_its_password_connect() {
    let redis = Secured::start().await;
    let store = RedisStore::connect(&redis.url(&format!("app:{APP_PASSWORD}")))
        .await
        .expect("connect as the ACL user app");
    exercise(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_percent_encoded_password_is_decoded_and_hidden_whole() {
    let redis = Secured::start().await;
    let url = redis.url(&format!("encoded:{ENCODED_PASSWORD_IN_URL}"));
    let store = RedisStore::connect(&url)
        .await
        .expect("connect with a percent-encoded password");
    exercise(&store).await;
    assert_eq!(
        redacted(&url),
        format!("redis://encoded:***@127.0.0.1:{}/", redis.server.port())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_with_only_the_permissions_the_store_needs_does_everything_it_does() {
    let redis = Secured::start().await;
    let store = RedisStore::connect(&redis.url(&format!("least:{USER_PASSWORD}")))
        .await
        .expect("connect as the least-privileged user");
    exercise(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_an_authentication_failure_naming_the_user() {
    let redis = Secured::start().await;
    let url = redis.url("app:not-the-password");
    let text = refused(&url, ConnectOptions::default(), "not-the-password").await;
    assert!(
        text.contains("redis://app:***@127.0.0.1:"),
        "the user stays, the password goes: {text}"
    );
    assert!(
        text.contains(r#"authentication failed for user "app""#),
        "{text}"
    );
    assert!(
        text.contains("check the user and password in the URL"),
        "{text}"
    );

    let url = redis.url(":not-the-password");
    let text = refused(&url, ConnectOptions::default(), "not-the-password").await;
    assert!(
        text.contains("authentication failed for the default user"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_or_disabled_user_is_an_authentication_failure() {
    let redis = Secured::start().await;
    for user in ["nobody", "disabled"] {
        let url = redis.url(&format!("{user}:{USER_PASSWORD}"));
        let text = refused(&url, ConnectOptions::default(), USER_PASSWORD).await;
        assert!(
            text.contains(&format!("authentication failed for user {user:?}")),
            "{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_password_where_one_is_required_says_to_put_one_in_the_url() {
    let redis = Secured::start().await;
    let url = redis.url("");
    let text = refused(&url, ConnectOptions::default(), ADMIN_PASSWORD).await;
    assert!(
        text.contains("Redis requires a password and the URL gives none"),
        "{text}"
    );
    assert!(text.contains("NOAUTH"), "Redis's own word stays: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_short_of_a_permission_is_refused_when_connecting() {
    let redis = Secured::start().await;
    // No scripts at all.
    let url = redis.url(&format!("noscripts:{USER_PASSWORD}"));
    let text = refused(&url, ConnectOptions::default(), USER_PASSWORD).await;
    assert!(
        text.contains(r#"user "noscripts" lacks a permission the store needs"#),
        "{text}"
    );
    assert!(
        text.to_lowercase().contains("noperm"),
        "Redis's own word stays: {text}"
    );
    assert!(text.contains("evalsha"), "names the command: {text}");
    assert!(
        text.contains("ACL SETUSER noscripts ~baton:* +@read"),
        "says what to grant: {text}"
    );

    // Scripts, but not on the store's keys.
    let url = redis.url(&format!("otherkeys:{USER_PASSWORD}"));
    let text = refused(&url, ConnectOptions::default(), USER_PASSWORD).await;
    assert!(
        text.contains(r#"user "otherkeys" lacks a permission the store needs"#),
        "{text}"
    );
    assert!(
        text.to_lowercase().contains("noperm"),
        "Redis's own word stays: {text}"
    );

    // The same user with a prefix it may use connects.
    let options = ConnectOptions {
        prefix: "other".to_owned(),
        ..ConnectOptions::default()
    };
    RedisStore::connect_with(&url, options)
        .await
        .expect("otherkeys may use keys under other:");
}

// ---------------------------------------------------------------------------------------------
// TLS

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_the_servers_ca_connects_and_does_everything() {
    let redis = TlsRedis::start(free_port);
    let options = ConnectOptions {
        ca_pem: Some(redis.ca().as_bytes().to_vec()),
        ..ConnectOptions::default()
    };
    let store = RedisStore::connect_with(&redis.url(&format!(":{TLS_PASSWORD}")), options)
        .await
        .expect("connect over TLS with the server's CA");
    exercise(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_without_the_servers_ca_is_refused_as_an_unknown_issuer() {
    let redis = TlsRedis::start(free_port);
    let url = redis.url(&format!(":{TLS_PASSWORD}"));
    // The system's roots: they do not hold this test's CA.
    let text = refused(&url, ConnectOptions::default(), TLS_PASSWORD).await;
    assert!(
        text.contains("the server's TLS certificate was refused"),
        "{text}"
    );
    assert!(text.contains("UnknownIssuer"), "rustls's reason: {text}");
    assert!(
        text.contains("give the CA certificate that signed it, a PEM file, with --redis-ca"),
        "says what to fix: {text}"
    );

    // Another CA does not do either.
    let options = ConnectOptions {
        ca_pem: Some(certificates("other").ca.into_bytes()),
        ..ConnectOptions::default()
    };
    let text = refused(&url, options, TLS_PASSWORD).await;
    assert!(text.contains("UnknownIssuer"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_wrong_password_is_an_authentication_failure() {
    let redis = TlsRedis::start(free_port);
    let options = ConnectOptions {
        ca_pem: Some(redis.ca().as_bytes().to_vec()),
        ..ConnectOptions::default()
    };
    let url = redis.url(":not-the-password");
    let text = refused(&url, options, "not-the-password").await;
    assert!(
        text.contains("rediss://:***@127.0.0.1:"),
        "the scheme stays: {text}"
    );
    assert!(
        text.contains("authentication failed for the default user"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_for_a_url_without_tls_is_refused() {
    let options = ConnectOptions {
        ca_pem: Some(certificates("unused").ca.into_bytes()),
        ..ConnectOptions::default()
    };
    // Nothing listens there: the URL is refused before any connection.
    let url = format!("redis://:{APP_PASSWORD}@127.0.0.1:{}/", free_port());
    let err = RedisStore::connect_with(&url, options)
        .await
        .expect_err("a CA with redis:// is a mistake");
    let text = err.to_string();
    assert!(
        text.contains("the URL does not use TLS (rediss://)"),
        "{text}"
    );
    assert!(text.contains("redis://:***@127.0.0.1:"), "{text}");
    assert!(!text.contains(APP_PASSWORD), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_that_does_not_parse_is_named_without_its_password() {
    let url = format!("redis://app:{APP_PASSWORD}@127.0.0.1:notaport/");
    let err = RedisStore::connect(&url)
        .await
        .expect_err("a bad port is refused");
    let text = err.to_string();
    assert!(
        text.contains("invalid Redis URL redis://app:***@127.0.0.1:notaport/"),
        "{text}"
    );
    assert!(!text.contains(APP_PASSWORD), "{text}");
}
