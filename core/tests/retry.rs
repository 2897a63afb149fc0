//! The retry policy's backoff: exponential, capped, jittered by at most 20 % either way.

use baton_core::workflow::{RETRY_JITTER, RetryPolicy};
use proptest::prelude::*;

fn policy(initial: u64, coefficient: f64, max: Option<u64>) -> RetryPolicy {
    RetryPolicy {
        max_attempts: 10,
        initial_interval_ms: initial,
        backoff_coefficient: coefficient,
        max_interval_ms: max,
    }
}

#[test]
fn backoff_doubles_from_the_initial_interval_up_to_its_ceiling() {
    let policy = policy(1_000, 2.0, Some(5_000));
    let waits: Vec<u64> = (1..=5).map(|n| policy.backoff_ms(n, 0.5)).collect();
    assert_eq!(waits, [1_000, 2_000, 4_000, 5_000, 5_000]);
}

#[test]
fn the_default_ceiling_is_a_hundred_initial_intervals() {
    let policy = policy(10, 3.0, None);
    assert_eq!(policy.max_interval(), 1_000);
    assert_eq!(policy.backoff_ms(20, 0.5), 1_000);
}

#[test]
fn jitter_moves_a_wait_by_a_fifth_at_most() {
    let policy = policy(1_000, 2.0, None);
    assert_eq!(policy.backoff_ms(1, 0.0), 800);
    assert_eq!(policy.backoff_ms(1, 1.0), 1_200);
}

#[test]
fn attempts_are_counted_against_max_attempts() {
    let policy = RetryPolicy {
        max_attempts: 3,
        ..policy(1, 2.0, None)
    };
    assert!(policy.retries_after(1));
    assert!(policy.retries_after(2));
    assert!(
        !policy.retries_after(3),
        "the third failure was the last attempt"
    );
}

#[test]
fn a_retry_block_defaults_to_three_attempts_from_one_second() {
    let workflow = baton_core::parse_workflow(
        r#"{"steps": [{"id": "a", "type": "agent", "agent": "x", "retry": {}}]}"#,
    )
    .unwrap()
    .workflow;
    let retry = workflow.step(workflow.entry()).retry.clone().unwrap();
    assert_eq!(retry, policy(1_000, 2.0, None).with_attempts(3));
}

trait WithAttempts {
    fn with_attempts(self, n: u32) -> Self;
}

impl WithAttempts for RetryPolicy {
    fn with_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }
}

proptest! {
    #[test]
    fn every_wait_lies_within_the_jitter_of_the_capped_exponential(
        initial in 1u64..100_000,
        coefficient in 1.0f64..10.0,
        failures in 1u32..200,
        unit in 0.0f64..1.0,
    ) {
        let policy = policy(initial, coefficient, None);
        let ideal = (initial as f64 * coefficient.powi(failures as i32 - 1))
            .min(policy.max_interval() as f64);
        let wait = policy.backoff_ms(failures, unit) as f64;
        prop_assert!(wait >= (ideal * (1.0 - RETRY_JITTER)).floor().max(1.0));
        prop_assert!(wait <= (ideal * (1.0 + RETRY_JITTER)).ceil());
    }
}
