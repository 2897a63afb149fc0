//! [`LiveOutput`](baton_coordinator::store::LiveOutput): pieces appended in order while the run
//! runs, the newest bytes kept, waits that return what comes; and Redis's expiry of an ended
//! run's output.

use std::sync::Arc;

use baton_coordinator::store::redis::RedisStore;
use baton_coordinator::store::{
    LiveOutput, OUTPUT_MAX_BYTES, OutputOffset, OutputPiece, Runs, Store,
};

use super::redis_server::RedisServer;
use super::support::*;

fn piece(step_id: &str, attempt: u32, text: &str, restart: bool) -> OutputPiece {
    OutputPiece {
        step_id: step_id.to_owned(),
        visit: 2,
        attempt,
        text: text.to_owned(),
        restart,
        worker_id: Some("w1".into()),
    }
}

fn texts(output: &[(OutputOffset, OutputPiece)]) -> Vec<&str> {
    output
        .iter()
        .map(|(_, piece)| piece.text.as_str())
        .collect()
}

/// Redis expires a run's output a minute after the run ended.
#[tokio::test]
async fn redis_expires_an_ended_runs_output() {
    let server = RedisServer::start();
    let store = RedisStore::connect_with_prefix(&server.url(), "conformance")
        .await
        .unwrap();
    create(&store, "run-a", 1_000, start(1_000)).await;
    store
        .append_output(vec![("run-a".into(), piece("code", 1, "x", false))])
        .await
        .unwrap();
    let client = ::redis::Client::open(server.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let key = "conformance:run:{run-a}:output";
    let ttl: i64 = ::redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(ttl, -1, "no expiry while the run runs");
    store
        .apply_transition("run-a", 1, status_write("failed", "{}", 2_000))
        .await
        .unwrap();
    let ttl: i64 = ::redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut con)
        .await
        .unwrap();
    let kept = baton_coordinator::store::OUTPUT_KEPT_AFTER_END.as_millis() as i64;
    assert!(ttl > kept - 5_000 && ttl <= kept, "{ttl} ms");
    // Retried, the run runs again: its output no longer expires.
    store
        .apply_transition("run-a", 2, status_write("running", "{}", 3_000))
        .await
        .unwrap();
    let ttl: i64 = ::redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(ttl, -1, "no expiry once the run runs again");
}

pub(crate) async fn output_appends_in_order_only_while_the_run_runs<S: Store>(store: Arc<S>) {
    create(&*store, "run-a", 1_000, start(1_000)).await;
    create(&*store, "run-b", 1_000, start(1_000)).await;
    let unsigned = OutputPiece {
        worker_id: None,
        ..piece("plan", 1, "whose?", false)
    };
    store
        .append_output(vec![
            ("run-a".into(), piece("code", 1, "Writing ", false)),
            ("run-b".into(), piece("plan", 1, "b", false)),
            ("run-a".into(), piece("code", 1, "the théme ✓\n", false)),
            ("no-such-run".into(), piece("code", 1, "lost", false)),
            ("run-a".into(), piece("code", 2, "Again", true)),
            ("run-b".into(), unsigned.clone()),
        ])
        .await
        .unwrap();
    let output = store.read_output("run-a", None).await.unwrap();
    assert_eq!(texts(&output), ["Writing ", "the théme ✓\n", "Again"]);
    assert_eq!(
        output[2].1,
        piece("code", 2, "Again", true),
        "every field kept"
    );
    assert!(
        output.windows(2).all(|pair| pair[0].0 < pair[1].0),
        "offsets grow: {output:?}"
    );
    let after_first = store.read_output("run-a", Some(output[0].0)).await.unwrap();
    assert_eq!(texts(&after_first), ["the théme ✓\n", "Again"]);
    let run_b = store.read_output("run-b", None).await.unwrap();
    assert_eq!(texts(&run_b), ["b", "whose?"]);
    assert_eq!(run_b[1].1, unsigned, "no worker stays none");
    assert!(
        store
            .read_output("no-such-run", None)
            .await
            .unwrap()
            .is_empty(),
        "a piece for a run that does not exist is dropped"
    );

    // Once the run has ended its output takes no more pieces, and stays readable a while for
    // watchers catching up (it expires OUTPUT_KEPT_AFTER_END later).
    store
        .apply_transition("run-a", 1, status_write("succeeded", "{}", 2_000))
        .await
        .unwrap();
    store
        .append_output(vec![("run-a".into(), piece("code", 2, "late", false))])
        .await
        .unwrap();
    assert_eq!(
        texts(&store.read_output("run-a", None).await.unwrap()),
        ["Writing ", "the théme ✓\n", "Again"]
    );
    assert_eq!(
        load(&*store, "run-a").await.status,
        baton_core::RunStatus::Succeeded,
        "the run itself is untouched"
    );

    // A run that runs again (a failed run retried) takes output again.
    store
        .apply_transition("run-a", 2, status_write("running", "{}", 3_000))
        .await
        .unwrap();
    store
        .append_output(vec![("run-a".into(), piece("code", 3, "resumed", false))])
        .await
        .unwrap();
    assert_eq!(
        texts(&store.read_output("run-a", None).await.unwrap()),
        ["Writing ", "the théme ✓\n", "Again", "resumed"]
    );
    let active = store.active_runs().await.unwrap();
    assert!(active.iter().any(|id| id == "run-a"), "{active:?}");
}

pub(crate) async fn output_keeps_the_newest_bytes<S: Store>(store: Arc<S>) {
    create(&*store, "run-a", 1_000, start(1_000)).await;
    let mib = 1 << 20;
    let pieces: Vec<(baton_core::RunId, OutputPiece)> = (0..6)
        .map(|n| {
            let text = format!("{n}{}", "x".repeat(mib - 1));
            ("run-a".into(), piece("code", 1, &text, false))
        })
        .collect();
    for piece in pieces {
        store.append_output(vec![piece]).await.unwrap();
    }
    let output = store.read_output("run-a", None).await.unwrap();
    let kept: usize = output.iter().map(|(_, piece)| piece.text.len()).sum();
    assert!(kept <= OUTPUT_MAX_BYTES, "{kept} bytes kept");
    let firsts: Vec<char> = output
        .iter()
        .map(|(_, piece)| piece.text.chars().next().unwrap())
        .collect();
    assert_eq!(firsts, ['2', '3', '4', '5'], "the newest, in order");
}

pub(crate) async fn wait_output_returns_what_comes_and_waits_for_it<S: Store>(store: Arc<S>) {
    use std::time::{Duration, Instant};
    create(&*store, "run-a", 1_000, start(1_000)).await;
    create(&*store, "run-b", 1_000, start(1_000)).await;
    store
        .append_output(vec![("run-a".into(), piece("code", 1, "one", false))])
        .await
        .unwrap();
    let seen = store.read_output("run-a", None).await.unwrap()[0].0;
    let start_offset = OutputOffset::default();

    // Nothing new: empty, after the time given.
    let waited = Instant::now();
    let none = store
        .wait_output(vec![("run-a".into(), seen)], Duration::from_millis(100))
        .await
        .unwrap();
    assert!(none.is_empty(), "{none:?}");
    assert!(waited.elapsed() >= Duration::from_millis(90));

    // What is already there comes at once, from every run asked about.
    let both = store
        .wait_output(
            vec![
                ("run-a".into(), start_offset),
                ("run-b".into(), start_offset),
            ],
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(both.len(), 1);
    assert_eq!(
        (both[0].0.as_str(), both[0].2.text.as_str()),
        ("run-a", "one")
    );

    // A piece appended while it waits ends the wait.
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            store
                .append_output(vec![("run-b".into(), piece("plan", 1, "two", false))])
                .await
                .unwrap();
        })
    };
    let came = store
        .wait_output(
            vec![("run-a".into(), seen), ("run-b".into(), start_offset)],
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    writer.await.unwrap();
    assert_eq!(came.len(), 1, "{came:?}");
    assert_eq!(
        (came[0].0.as_str(), came[0].2.text.as_str()),
        ("run-b", "two")
    );
}
