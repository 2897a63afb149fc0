//! Redis credentials end to end: `baton coordinator` as a separate process, its Redis URL with
//! the password in its environment (`BATON_REDIS_URL`), never on its command line, against
//! `redis-server`s started here with a password, ACL users, and TLS. The password shows neither
//! in the coordinator's log nor in `/proc/<pid>/cmdline`; a wrong one stops the coordinator with
//! an error that says what failed and does not show it either.

#[path = "support/cluster.rs"]
mod harness;
#[path = "support/secured_redis.rs"]
mod secured_redis;
#[path = "support/spec.rs"]
mod spec; // the harness's

use harness::{LoneCoordinator, RedisServer, baton, free_port, output};
use secured_redis::{ADMIN_PASSWORD, APP_PASSWORD, TLS_PASSWORD, TlsRedis, require_credentials};
use serde_json::json;

/// One agent step: a run that waits for a worker, so it stays in Redis to be read back.
fn workflow() -> Vec<u8> {
    json!({"id": "credentials", "steps": [
        {"id": "only", "type": "agent", "agent": "nobody-serves-this"}
    ]})
    .to_string()
    .into_bytes()
}

/// A Redis with a password and ACL users ([`require_credentials`]).
async fn secured_redis() -> RedisServer {
    let server = RedisServer::start();
    require_credentials(&server.url()).await;
    server
}

/// The process's command line, its arguments joined by spaces.
fn cmdline(pid: u32) -> String {
    let bytes = std::fs::read(format!("/proc/{pid}/cmdline")).expect("read /proc/<pid>/cmdline");
    String::from_utf8_lossy(&bytes).replace('\0', " ")
}

/// Submits a run and checks that it is in Redis, read back as the default user.
async fn submits_a_run_into(coordinator: &LoneCoordinator, redis: &RedisServer) {
    let mut client = coordinator.client().await;
    let run_id = harness::submit(&mut client, workflow(), &json!("go")).await;
    let admin = format!("redis://:{ADMIN_PASSWORD}@127.0.0.1:{}/", redis.port());
    let mut con = redis::Client::open(admin)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("connect as the default user");
    let exists: bool = redis::cmd("EXISTS")
        .arg(format!("baton:run:{{{run_id}}}"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(exists, "the run {run_id} is in Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_from_baton_redis_url_stores_runs_and_its_password_shows_nowhere() {
    let redis = secured_redis().await;
    let url = format!("redis://app:{APP_PASSWORD}@127.0.0.1:{}/", redis.port());
    let coordinator = LoneCoordinator::start(&[], &[("BATON_REDIS_URL", &url)]).await;
    submits_a_run_into(&coordinator, &redis).await;

    let log = coordinator.log();
    let shown = format!("redis://app:***@127.0.0.1:{}/", redis.port());
    assert!(
        log.lines()
            .any(|line| line.contains("coordinator listening") && line.contains(&shown)),
        "the log names the Redis it uses, without the password:\n{log}"
    );
    assert!(
        !log.contains(APP_PASSWORD),
        "the log shows the password:\n{log}"
    );
    let cmdline = cmdline(coordinator.pid());
    assert!(cmdline.contains("coordinator"), "{cmdline}");
    assert!(
        !cmdline.contains(APP_PASSWORD) && !cmdline.contains("redis://"),
        "the command line shows the URL: {cmdline}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_stops_the_coordinator_naming_the_authentication_failure() {
    let redis = secured_redis().await;
    let wrong = "not-the-app-password";
    let url = format!("redis://app:{wrong}@127.0.0.1:{}/", redis.port());
    let run = output(
        baton()
            .arg("coordinator")
            .args(["--listen", "127.0.0.1:0", "--no-metrics"])
            .env("BATON_REDIS_URL", &url),
        None,
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "it should not start:\n{stderr}");
    let shown = format!("redis://app:***@127.0.0.1:{}/", redis.port());
    assert!(
        stderr.contains(&format!(
            "cannot connect to Redis at {shown}: authentication failed for user \"app\""
        )),
        "stderr names the authentication failure, the user and the address:\n{stderr}"
    );
    assert!(
        stderr.contains("check the user and password in the URL"),
        "{stderr}"
    );
    assert!(
        !stderr.contains(wrong),
        "stderr shows the password:\n{stderr}"
    );
    assert!(
        !String::from_utf8_lossy(&run.stdout).contains(wrong),
        "stdout shows the password"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_older_baton_redis_still_works_and_baton_redis_url_wins_over_it() {
    let redis = secured_redis().await;
    let port = redis.port();
    let right = format!("redis://:{ADMIN_PASSWORD}@127.0.0.1:{port}/");
    let coordinator = LoneCoordinator::start(&[], &[("BATON_REDIS", &right)]).await;
    submits_a_run_into(&coordinator, &redis).await;
    drop(coordinator);

    let wrong = format!("redis://:not-the-password@127.0.0.1:{port}/");
    let coordinator =
        LoneCoordinator::start(&[], &[("BATON_REDIS", &wrong), ("BATON_REDIS_URL", &right)]).await;
    submits_a_run_into(&coordinator, &redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_redis_ca_stores_runs_and_without_it_names_the_unknown_issuer() {
    let redis = TlsRedis::start(free_port);
    let url = redis.url(&format!(":{TLS_PASSWORD}"));
    let ca = redis.ca_file();
    let ca = ca.to_str().expect("a UTF-8 path");
    let coordinator =
        LoneCoordinator::start(&["--redis-ca", ca], &[("BATON_REDIS_URL", &url)]).await;
    let mut client = coordinator.client().await;
    harness::submit(&mut client, workflow(), &json!("go")).await;
    let log = coordinator.log();
    assert!(
        !log.contains(TLS_PASSWORD),
        "the log shows the password:\n{log}"
    );
    drop(coordinator);

    // The CA from the environment does as well.
    let coordinator =
        LoneCoordinator::start(&[], &[("BATON_REDIS_URL", &url), ("BATON_REDIS_CA", ca)]).await;
    drop(coordinator);

    let run = output(
        baton()
            .arg("coordinator")
            .args(["--listen", "127.0.0.1:0", "--no-metrics"])
            .env("BATON_REDIS_URL", &url),
        None,
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "it should not start:\n{stderr}");
    assert!(
        stderr.contains("the server's TLS certificate was refused")
            && stderr.contains("UnknownIssuer")
            && stderr.contains("--redis-ca"),
        "stderr says the certificate's issuer is unknown and what to fix:\n{stderr}"
    );
    assert!(
        !stderr.contains(TLS_PASSWORD),
        "stderr shows the password:\n{stderr}"
    );
}
