//! One conformance suite for every [`Store`]: each case is written once, generic over the store,
//! and `conformance!` runs it against a `MemoryStore`, against a `RedisStore` on its own
//! throwaway `redis-server` (see `support/redis_server.rs`), and against a `RedisStore` on a real
//! Redis Cluster of 3 masters and 3 replicas (`support/redis_cluster.rs`; one cluster for the
//! whole binary, each case under its own key prefix). The Redis cases are never skipped.
//! The cases follow the contract on the store's traits, a file per concern; a few Redis-only
//! cases check the key layout and how Redis's refusals and lost answers surface.
//!
//! - this file: `conformance!`, which runs each case against the three stores, and the cases.
//! - `support`: the fixtures every concern's cases share.
//! - `runs`, `transitions`, `settle`: [`Runs`](baton_coordinator::store::Runs): runs created,
//!   loaded and moved on; transitions' tasks, fences and joined writes; lost writes settled.
//! - `tasks`: [`Tasks`](baton_coordinator::store::Tasks): swaps, timers, due tasks.
//! - `output`: [`LiveOutput`](baton_coordinator::store::LiveOutput).
//! - `listing`: [`Listing`](baton_coordinator::store::Listing): pages of runs, running runs, a
//!   workflow's runs.
//! - `coordination`: [`Coordination`](baton_coordinator::store::Coordination): idempotency keys,
//!   free slots, `ping`.
//! - `redis_layout`, `redis_faults`: Redis only: the key layout; a Redis that does not answer or
//!   refuses.
//!
//! [`Store`]: baton_coordinator::store::Store

#[path = "../support/redis_cluster.rs"]
#[allow(dead_code)] // shared harness: not every helper is used here
mod redis_cluster;
#[path = "../support/redis_server.rs"]
#[allow(dead_code)] // shared harness: not every helper is used here
mod redis_server;

mod coordination;
mod listing;
mod output;
mod redis_faults;
mod redis_layout;
mod runs;
mod settle;
mod support;
mod tasks;
mod transitions;

use std::sync::Arc;

use baton_coordinator::store::memory::MemoryStore;
use baton_coordinator::store::redis::RedisStore;
use redis_server::RedisServer;

// The cases, for `conformance!`.
use coordination::*;
use listing::*;
use output::*;
use runs::*;
use settle::*;
use tasks::*;
use transitions::*;

/// Runs each case against both stores. Attributes before a case (``) go on
/// both of its tests.
macro_rules! conformance {
    ($($(#[$attr:meta])* $case:ident),+ $(,)?) => {
        mod memory_store {
            use super::*;
            $(
                $(#[$attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    super::$case(Arc::new(MemoryStore::new())).await;
                }
            )+
        }

        mod redis_store {
            use super::*;
            $(
                $(#[$attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let server = RedisServer::start();
                    let store = RedisStore::connect_with_prefix(&server.url(), "conformance")
                        .await
                        .expect("connect to the test redis-server");
                    super::$case(Arc::new(store)).await;
                    drop(server);
                }
            )+
        }

        mod redis_cluster_store {
            use super::*;
            $(
                $(#[$attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let cluster = tokio::task::spawn_blocking(redis_cluster::RedisCluster::shared)
                        .await
                        .expect("start the shared Redis Cluster");
                    // Every node's URL, as `--redis` takes them for a cluster.
                    let store = RedisStore::connect_with_prefix(
                        &cluster.comma_urls(),
                        concat!("conformance-", stringify!($case)),
                    )
                    .await
                    .expect("connect to the test Redis Cluster");
                    assert!(store.is_cluster(), "several node URLs make a cluster store");
                    super::$case(Arc::new(store)).await;
                }
            )+
        }
    };
}

conformance! {
    create_then_load,
    a_principal_s_running_runs_are_counted_until_they_end,
    create_twice_is_already_exists,
    apply_at_the_right_version,
    apply_at_a_stale_version_is_conflict,
    apply_to_a_missing_run_is_not_found,
    rewriting_a_result,
    swap_tasks_only_replace_existing_tasks,
    swap_tasks_compares_exact_bytes_and_moves_timers,
    due_tasks_are_earliest_first_limited_and_per_agent,
    transitions_move_timers_with_tasks,
    fenced_transitions_apply_only_at_the_current_attempt,
    transitions_written_together_apply_in_order,
    task_and_version_read_one_task_and_the_version,

    due_tasks_take_any_limit,

    only_an_integer_due_ms_makes_a_timer,

    a_fenced_first_transition_creates_nothing,
    a_settled_create_is_found_or_voided_for_good,
    a_settled_transition_is_found_or_fenced_for_good,
    a_settle_remembers_only_the_last_writes,
    a_voided_run_s_idempotency_key_is_reclaimed,
    list_runs_newest_first_and_limited,
    list_runs_pages_walk_every_run_once_in_order,
    list_runs_pages_through_runs_crowded_in_one_index_shard,
    list_runs_filter_by_status_and_workflow,
    a_status_filter_over_many_other_runs_gives_a_short_page_that_goes_on,
    an_unknown_cursor_or_workflow_gives_an_empty_page,
    active_runs_follow_status,
    concurrent_appliers_one_wins,
    chain_links_append_and_decisions_keep_their_first_write,
    runs_of_workflow_newest_first_and_limited,
    idempotency_keys_are_claimed_once_until_they_expire,
    free_slots_are_summed_over_the_other_coordinators_until_they_expire,
    a_ping_answers_while_the_store_is_there,
    output_appends_in_order_only_while_the_run_runs,
    output_keeps_the_newest_bytes,
    wait_output_returns_what_comes_and_waits_for_it,
}
