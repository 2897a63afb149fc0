use super::*;

const LEASE: u64 = 10_000;

fn held_by(owner: &str) -> TaskEntry {
    dispatched("coder", Some(owner), 1_000, LEASE)
}

#[test]
fn a_dispatched_task_is_leased_to_its_coordinator_or_due_at_once() {
    let held = held_by("c1");
    assert_eq!(
        (held.attempt, held.owner.as_deref().unwrap_or_default()),
        (1, "c1")
    );
    assert_eq!(held.due_ms, 11_000);
    let unowned = dispatched("coder", None, 1_000, LEASE);
    assert_eq!(
        (unowned.owner.as_deref().unwrap_or_default(), unowned.due_ms),
        ("", 1_000)
    );
}

#[test]
fn a_continuation_is_renewed_by_its_holder_and_claimed_by_another_once_due() {
    let held = continuation(Some("c1"), 1_000, LEASE);
    assert_eq!(
        (held.owner.as_deref().unwrap_or_default(), held.due_ms),
        ("c1", 11_000)
    );
    assert_eq!(held.agent, APPROVAL_TIMERS, "no worker runs it");
    // Renewed while the run waits for its turn here; left due to all once it does not.
    let renewed = renewed(&held, &Holding::Queued, 5_000, LEASE);
    assert_eq!(
        (renewed.owner.as_deref().unwrap_or_default(), renewed.due_ms),
        ("c1", 15_000)
    );
    let astray = super::renewed(&held, &Holding::Nowhere, 5_000, LEASE);
    assert_eq!(
        (astray.owner.as_deref().unwrap_or_default(), astray.due_ms),
        ("", 5_000)
    );
    assert_eq!(astray.state, TaskState::Continuing);
    assert_eq!(continuation_claimed(&renewed, "c2", 14_999, LEASE), None);
    let taken = continuation_claimed(&renewed, "c2", 15_000, LEASE).expect("due");
    assert_eq!(
        (taken.owner.as_deref().unwrap_or_default(), taken.attempt),
        ("c2", 2)
    );
    assert_eq!(taken.state, TaskState::Continuing);
    let released = TaskEntry {
        owner: None,
        due_ms: 2_000,
        ..held
    };
    assert!(continuation_claimed(&released, "c2", 2_000, LEASE).is_some());
    assert_eq!(
        continuation_claimed(&approval_timer(0, 1), "c2", 5, LEASE),
        None,
        "an approval's timer is not a continuation"
    );
}

#[test]
fn renewing_pushes_the_lease_out_and_names_the_worker() {
    let entry = renewed(&held_by("c1"), &Holding::Worker(w1()), 5_000, LEASE);
    assert_eq!(entry.due_ms, 15_000);
    assert_eq!(
        (entry.state, entry.worker_id.as_deref()),
        (TaskState::Running, Some("w1"))
    );
    assert_eq!(entry.attempt, 1, "renewing is not a new delivery");
    let given_up = renewed(&entry, &Holding::Nowhere, 6_000, LEASE);
    assert_eq!(
        (
            given_up.owner.as_deref().unwrap_or_default(),
            given_up.due_ms
        ),
        ("", 6_000)
    );
    assert_eq!(given_up.attempt, 1);
}

#[test]
fn an_expired_lease_is_a_lost_delivery_and_a_new_attempt() {
    let entry = renewed(&held_by("c1"), &Holding::Worker(w1()), 1_000, LEASE);
    assert_eq!(on_due(&entry, "c2", 10_999, LEASE, 10), Due::NotYet);
    let Due::Deliver(claimed) = on_due(&entry, "c2", 11_000, LEASE, 10) else {
        panic!("due");
    };
    assert_eq!((claimed.attempt, claimed.lost, claimed.failures), (2, 1, 0));
    assert_eq!(claimed.owner.as_deref(), Some("c2"));
    assert_eq!(claimed.due_ms, 21_000);
    assert!(claimed.worker_id.is_none());
}

#[test]
fn an_unowned_task_is_claimed_without_counting_a_loss() {
    let entry = dispatched("coder", None, 1_000, LEASE);
    let Due::Deliver(claimed) = on_due(&entry, "c2", 1_000, LEASE, 10) else {
        panic!("due");
    };
    assert_eq!((claimed.attempt, claimed.lost), (2, 0));
}

#[test]
fn a_task_lost_too_often_gives_up() {
    let mut entry = held_by("c1");
    entry.lost = 2;
    let Due::GiveUp(claimed, error) = lost(&entry, 2_000, LEASE, 2) else {
        panic!("should give up");
    };
    assert_eq!(claimed.attempt, 2);
    assert!(error.contains("lost 3 times"), "{error}");
    assert!(
        matches!(lost(&held_by("c1"), 2_000, LEASE, 2), Due::Deliver(e) if e.attempt == 2 && e.lost == 1)
    );
}

fn policy(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_interval_ms: 100,
        backoff_coefficient: 2.0,
        max_interval_ms: None,
    }
}

#[test]
fn failures_retry_with_backoff_until_the_policy_runs_out() {
    let entry = held_by("c1");
    let AfterFailure::Retry { entry, backoff_ms } =
        after_failure(&entry, Some(&policy(3)), "boom", true, 5_000, 0.5)
    else {
        panic!("retry");
    };
    assert_eq!(backoff_ms, 100);
    assert_eq!((entry.state, entry.failures), (TaskState::Retrying, 1));
    assert_eq!(
        (entry.owner.as_deref().unwrap_or_default(), entry.due_ms),
        ("", 5_100)
    );
    assert_eq!(entry.attempt, 1, "the claim after the backoff raises it");
    let AfterFailure::Retry { entry, backoff_ms } =
        after_failure(&entry, Some(&policy(3)), "boom", true, 6_000, 0.5)
    else {
        panic!("retry");
    };
    assert_eq!((backoff_ms, entry.failures), (200, 2));
    assert_eq!(
        after_failure(&entry, Some(&policy(3)), "boom", true, 7_000, 0.5),
        AfterFailure::Fail("boom (failed 3 of 3 attempts)".into())
    );
}

#[test]
fn without_a_policy_or_when_not_retryable_the_step_fails_at_once() {
    let entry = held_by("c1");
    assert_eq!(
        after_failure(&entry, None, "boom", true, 0, 0.5),
        AfterFailure::Fail("boom".into())
    );
    assert_eq!(
        after_failure(&entry, Some(&policy(5)), "bad input", false, 0, 0.5),
        AfterFailure::Fail("bad input (not retryable)".into())
    );
}

fn w1() -> Worker {
    Worker::new("w1", "pool")
}

#[test]
fn renewing_writes_down_the_worker_and_its_principal_and_queueing_clears_them() {
    let running = renewed(&held_by("c1"), &Holding::Worker(w1()), 1_000, LEASE);
    assert_eq!(
        (running.worker_id.as_deref(), running.principal.as_deref()),
        (Some("w1"), Some("pool"))
    );
    for next in [
        renewed(&running, &Holding::Queued, 2_000, LEASE),
        renewed(&running, &Holding::Nowhere, 2_000, LEASE),
        released(&running, 2_000),
    ] {
        assert_eq!((&next.worker_id, &next.principal), (&None, &None));
    }
    let Due::Deliver(claimed) = on_due(&running, "c2", 20_000, LEASE, 10) else {
        panic!("due");
    };
    assert_eq!(
        claimed.principal, None,
        "a new attempt runs on no worker yet"
    );
    let Due::Deliver(again) = lost(&running, 2_000, LEASE, 10) else {
        panic!("delivered again");
    };
    assert_eq!(again.principal, None);
    let AfterFailure::Retry { entry, .. } =
        after_failure(&running, Some(&policy(3)), "boom", true, 2_000, 0.5)
    else {
        panic!("retry");
    };
    assert_eq!((&entry.worker_id, &entry.principal), (&None, &None));
}

#[test]
fn an_entry_written_before_principals_were_recorded_reads_with_none() {
    let old = br#"{"agent":"coder","state":"running","worker_id":"w1","attempt":1}"#;
    let entry: TaskEntry = serde_json::from_slice(old).unwrap();
    assert_eq!(
        (entry.worker_id.as_deref(), entry.principal.as_deref()),
        (Some("w1"), None)
    );
    // An entry that wrote "none" as an empty string, as entries once did, reads the same.
    let empty =
        br#"{"agent":"coder","state":"running","worker_id":"w1","principal":"","attempt":1}"#;
    assert_eq!(serde_json::from_slice::<TaskEntry>(empty).unwrap(), entry);
    // And an entry without a principal writes none, as before.
    let text = String::from_utf8(released(&entry, 0).encode()).unwrap();
    assert!(!text.contains("principal"), "{text}");
}

#[test]
fn a_reconnecting_worker_keeps_only_a_current_attempt() {
    let entry = renewed(&held_by("c1"), &Holding::Worker(w1()), 1_000, LEASE);
    let taken = adopted(&entry, 1, &w1(), true, "c2", 2_000, LEASE).expect("current");
    assert_eq!(
        (
            taken.owner.as_deref().unwrap_or_default(),
            taken.worker_id.as_deref(),
            taken.principal.as_deref()
        ),
        ("c2", Some("w1"), Some("pool"))
    );
    assert_eq!((taken.attempt, taken.due_ms), (1, 12_000));
    assert_eq!(
        adopted(&entry, 0, &w1(), true, "c2", 2_000, LEASE),
        Err(Refusal::Superseded)
    );
    let Due::Deliver(moved_on) = on_due(&entry, "c3", 20_000, LEASE, 10) else {
        panic!("due");
    };
    assert_eq!(
        adopted(&moved_on, 1, &w1(), true, "c2", 20_000, LEASE),
        Err(Refusal::Superseded)
    );
    let AfterFailure::Retry {
        entry: retrying, ..
    } = after_failure(&entry, Some(&policy(3)), "boom", true, 2_000, 0.5)
    else {
        panic!("retry");
    };
    assert_eq!(
        adopted(&retrying, 1, &w1(), true, "c2", 2_000, LEASE),
        Err(Refusal::Superseded),
        "a task waiting for its retry is nobody's"
    );
}

/// The attack of issue 28: a worker of principal `planner-pool`, allowed only the planner,
/// names another worker's coder task in its hello. Only the worker the entry names, under
/// the principal it connected as, serving the agent, takes it over.
#[test]
fn a_held_task_is_taken_over_only_by_the_worker_and_principal_the_entry_names() {
    let entry = renewed(&held_by("c1"), &Holding::Worker(w1()), 1_000, LEASE);
    let adopt = |worker: &Worker, serves| adopted(&entry, 1, worker, serves, "c2", 2_000, LEASE);
    assert_eq!(
        adopt(&Worker::new("hostile", "planner-pool"), true),
        Err(Refusal::OtherWorker)
    );
    assert_eq!(
        adopt(&Worker::new("w1", "planner-pool"), true),
        Err(Refusal::OtherPrincipal),
        "the same id under another principal is a squatter"
    );
    assert_eq!(
        adopt(&Worker::new("w1", ""), true),
        Err(Refusal::OtherPrincipal),
        "nor is an unauthenticated worker the principal's"
    );
    assert_eq!(adopt(&w1(), false), Err(Refusal::AgentNotServed));
    assert!(adopt(&w1(), true).is_ok());
}

#[test]
fn a_task_no_renewal_wrote_down_is_nobody_s_to_take_over() {
    // Its coordinator died within the first third of the lease: the entry names no worker.
    let dispatched = held_by("c1");
    assert_eq!(
        adopted(&dispatched, 1, &w1(), true, "c2", 2_000, LEASE),
        Err(Refusal::NotWrittenDown)
    );
    // Its lease runs out and another coordinator delivers it again.
    assert!(matches!(
        on_due(&dispatched, "c2", 11_000, LEASE, 10),
        Due::Deliver(again) if again.attempt == 2
    ));
}

#[test]
fn without_authentication_the_worker_id_alone_names_the_holder() {
    let unauthenticated = Worker::new("w1", "");
    let entry = renewed(
        &held_by("c1"),
        &Holding::Worker(unauthenticated.clone()),
        1_000,
        LEASE,
    );
    assert!(adopted(&entry, 1, &unauthenticated, true, "c2", 2_000, LEASE).is_ok());
    assert_eq!(
        adopted(&entry, 1, &Worker::new("w2", ""), true, "c2", 2_000, LEASE),
        Err(Refusal::OtherWorker)
    );
}
