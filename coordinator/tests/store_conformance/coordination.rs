//! [`Coordination`](baton_coordinator::store::Coordination): idempotency keys claimed once and
//! reclaimed from a voided run, free slots summed over the other coordinators, `ping`.

use std::collections::BTreeMap;
use std::sync::Arc;

use baton_coordinator::store::{Claim, Store};

fn slots(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs
        .iter()
        .map(|(agent, free)| ((*agent).to_owned(), *free))
        .collect()
}

pub(crate) async fn idempotency_keys_are_claimed_once_until_they_expire<S: Store>(store: Arc<S>) {
    assert_eq!(
        store
            .claim_idempotency_key("order 42", "run-a", "digest-a", 60)
            .await
            .unwrap(),
        Claim::Claimed
    );
    let held = Claim::Held {
        run_id: "run-a".to_owned(),
        request_sha256: "digest-a".to_owned(),
    };
    // A second claim, with another run id and digest, changes nothing.
    assert_eq!(
        store
            .claim_idempotency_key("order 42", "run-b", "digest-b", 60)
            .await
            .unwrap(),
        held
    );
    assert_eq!(
        store
            .claim_idempotency_key("order 42", "run-c", "digest-c", 60)
            .await
            .unwrap(),
        held
    );
    assert_eq!(
        store
            .claim_idempotency_key("order 43", "run-b", "digest-b", 60)
            .await
            .unwrap(),
        Claim::Claimed
    );
    // Once it expires, the key is free again.
    store
        .claim_idempotency_key("short", "run-d", "digest-d", 1)
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    assert_eq!(
        store
            .claim_idempotency_key("short", "run-e", "digest-e", 1)
            .await
            .unwrap(),
        Claim::Claimed
    );
}

pub(crate) async fn a_voided_run_s_idempotency_key_is_reclaimed<S: Store>(store: Arc<S>) {
    let claimed = |run_id: &str| Claim::Held {
        run_id: run_id.to_owned(),
        request_sha256: "digest".to_owned(),
    };
    assert_eq!(
        store
            .claim_idempotency_key("order", "run-a", "digest", 60)
            .await
            .unwrap(),
        Claim::Claimed
    );
    // run-a was voided: the key names run-b from now on.
    assert_eq!(
        store
            .reclaim_idempotency_key("order", "run-a", "run-b", "digest", 60)
            .await
            .unwrap(),
        Claim::Claimed
    );
    assert_eq!(
        store
            .claim_idempotency_key("order", "run-c", "digest", 60)
            .await
            .unwrap(),
        claimed("run-b")
    );
    // A second reclaim from run-a (another submitter saw it voided too) finds run-b.
    assert_eq!(
        store
            .reclaim_idempotency_key("order", "run-a", "run-d", "digest", 60)
            .await
            .unwrap(),
        claimed("run-b")
    );
    // Another request's digest never takes the key over.
    assert_eq!(
        store
            .reclaim_idempotency_key("order", "run-b", "run-e", "other", 60)
            .await
            .unwrap(),
        claimed("run-b")
    );
    // A key that expired (or was never claimed) is claimed.
    assert_eq!(
        store
            .reclaim_idempotency_key("fresh", "run-x", "run-y", "digest", 60)
            .await
            .unwrap(),
        Claim::Claimed
    );
}

pub(crate) async fn free_slots_are_summed_over_the_other_coordinators_until_they_expire<
    S: Store,
>(
    store: Arc<S>,
) {
    assert!(store.slots_elsewhere("a", 0).await.unwrap().is_empty());
    store
        .advertise_slots("a", slots(&[("coder", 2)]), 1_000)
        .await
        .unwrap();
    store
        .advertise_slots("b", slots(&[("coder", 3), ("tester", 1)]), 2_000)
        .await
        .unwrap();
    store
        .advertise_slots("c", slots(&[("coder", 4)]), 500)
        .await
        .unwrap();
    // Not its own; c's has expired at 600.
    assert_eq!(
        store.slots_elsewhere("a", 600).await.unwrap(),
        slots(&[("coder", 3), ("tester", 1)])
    );
    assert_eq!(
        store.slots_elsewhere("b", 600).await.unwrap(),
        slots(&[("coder", 2)])
    );
    // A new advertisement replaces the coordinator's last one.
    store
        .advertise_slots("b", slots(&[("tester", 2)]), 3_000)
        .await
        .unwrap();
    assert_eq!(
        store.slots_elsewhere("a", 1_500).await.unwrap(),
        slots(&[("tester", 2)])
    );
    store
        .advertise_slots("b", BTreeMap::new(), 3_000)
        .await
        .unwrap();
    assert!(store.slots_elsewhere("a", 1_500).await.unwrap().is_empty());
    // After every advertisement expired, nothing is counted.
    assert!(store.slots_elsewhere("z", 5_000).await.unwrap().is_empty());
}

pub(crate) async fn a_ping_answers_while_the_store_is_there<S: Store>(store: Arc<S>) {
    store.ping().await.unwrap();
}
