use std::sync::Arc;

use baton_core::TaskId;
use proptest::prelude::*;
use tokio::sync::mpsc;

use super::*;
use crate::parts::{Part, TaskPayload};
use crate::task_ref::{TaskRef, parse_task_key};

fn task(run: &str, key: &str, agent: &str) -> ReadyTask {
    let id: TaskId = parse_task_key(key).expect("a visit key");
    let manifest = Arc::new(Part::new(b"{}".to_vec()));
    let payload = TaskPayload::made(manifest, Vec::new());
    ReadyTask::new(TaskRef::new(run, &id, 1), agent, payload)
}

fn worker(
    hub: &Hub,
    id: &str,
    agents: &[&str],
    capacity: usize,
) -> mpsc::UnboundedReceiver<ToWorker> {
    let (tx, rx) = mpsc::unbounded_channel();
    hub.connect(id, agents.iter().map(|a| a.to_string()), capacity, 0, tx)
        .unwrap();
    hub.open(id);
    rx
}

/// The one worker a submitted task went to, if it went out at once.
fn sent_to(assignments: Vec<Assignment>) -> Option<String> {
    assert!(assignments.len() <= 1, "{assignments:?}");
    assignments.into_iter().next().map(|a| a.worker_id.into())
}

#[test]
fn branches_spread_over_the_least_loaded_workers() {
    let hub = Hub::default();
    let _a = worker(&hub, "a", &["test"], 4);
    let _b = worker(&hub, "b", &["test"], 4);
    let holders: Vec<String> = (0..4)
        .map(|i| sent_to(hub.submit(task("r", &format!("t{i}#1"), "test"))).unwrap())
        .collect();
    assert_eq!(holders, ["a", "b", "a", "b"]);
}

#[test]
fn tasks_wait_for_a_worker_that_serves_their_agent() {
    let hub = Hub::default();
    let _a = worker(&hub, "a", &["planner"], 1);
    assert!(hub.submit(task("r", "code#1", "coder")).is_empty());
    assert!(!hub.serves("coder"));
    let _b = worker(&hub, "b", &["coder"], 1);
    assert!(hub.holds("b", "r", "code#1", 1));
}

/// A worker of protocol `protocol`, open.
fn speaking(
    hub: &Hub,
    id: &str,
    protocol: u32,
    agents: &[&str],
    capacity: usize,
) -> (Vec<Assignment>, mpsc::UnboundedReceiver<ToWorker>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let agents = agents.iter().map(|a| a.to_string());
    hub.connect_speaking(id, protocol, agents, capacity, 0, tx)
        .unwrap();
    (hub.open(id), rx)
}

#[test]
fn a_map_item_waits_for_a_worker_that_speaks_its_protocol() {
    let hub = Hub::default();
    let old = baton_proto::MAP_ITEMS_PROTOCOL - 1;
    let (_, mut rx_old) = speaking(&hub, "old", old, &["x"], 2);
    let item = task("r", "each[0]#1", "x");
    assert_eq!(item.needs_protocol(), baton_proto::MAP_ITEMS_PROTOCOL);
    assert!(hub.submit(item).is_empty(), "the old worker cannot run it");
    // First in, first out: what comes after the item waits behind it.
    assert!(hub.submit(task("r", "after#1", "x")).is_empty());
    assert!(rx_old.try_recv().is_err(), "nothing went to the old worker");
    assert_eq!(
        hub.locate(&[TaskAsked {
            run_id: "r",
            task_key: "each[0]#1",
            agent: "x"
        }]),
        [Holding::Queued]
    );

    let (assignments, mut rx_new) =
        speaking(&hub, "new", baton_proto::MAP_ITEMS_PROTOCOL, &["x"], 1);
    let sent: Vec<(&str, &str)> = assignments
        .iter()
        .map(|a| (a.worker_id.as_str(), a.task_key.as_str()))
        .collect();
    // The item goes to the new worker; the task behind it is free to go to the old one.
    assert_eq!(sent, [("new", "each[0]#1"), ("old", "after#1")]);
    assert!(matches!(rx_new.try_recv(), Ok(ToWorker::Task(t)) if t.task.key() == "each[0]#1"));
    assert!(matches!(rx_old.try_recv(), Ok(ToWorker::Task(t)) if t.task.key() == "after#1"));
    // A task that is not an item still goes to either.
    assert_eq!(
        sent_to(hub.submit(task("r", "plain#1", "x"))).as_deref(),
        Some("old")
    );
}

#[test]
fn a_full_worker_takes_the_next_task_when_it_finishes_one() {
    let hub = Hub::default();
    let _a = worker(&hub, "a", &["x"], 1);
    assert_eq!(
        sent_to(hub.submit(task("r", "one#1", "x"))).as_deref(),
        Some("a")
    );
    assert!(hub.submit(task("r", "two#1", "x")).is_empty());
    let next = hub.finish("a", "r", "one#1").unwrap();
    assert_eq!(next[0].task_key, "two#1");
    assert_eq!(
        hub.finish("a", "r", "one#1"),
        Err(Error::NotHeld {
            worker_id: "a".into(),
            run_id: "r".into(),
            task_key: "one#1".into()
        })
    );
}

#[test]
fn a_departing_worker_gives_back_its_tasks_once() {
    let hub = Hub::default();
    let (tx, _rx) = mpsc::unbounded_channel();
    let (first, _closed) = hub.connect("a", ["x".to_string()], 2, 0, tx).unwrap();
    hub.open("a");
    hub.submit(task("r", "one#1", "x"));
    let returned = hub.disconnect("a", first);
    assert_eq!(returned.len(), 1);
    assert_eq!(returned[0].key, "one#1");
    assert!(!hub.holds("a", "r", "one#1", 1));
    // The same worker back on a new stream; the old stream ending late removes nothing.
    let (tx, _rx) = mpsc::unbounded_channel();
    let (second, _closed) = hub.connect("a", ["x".to_string()], 2, 0, tx).unwrap();
    hub.open("a");
    hub.submit(task("r", "two#1", "x"));
    assert!(hub.disconnect("a", first).is_empty());
    assert!(hub.holds("a", "r", "two#1", 1));
    assert_eq!(hub.disconnect("a", second).len(), 1);
}

#[test]
fn a_worker_takes_nothing_until_its_held_tasks_are_taken_over() {
    let hub = Hub::default();
    let (tx, mut rx) = mpsc::unbounded_channel();
    hub.connect("a", ["x".to_string()], 1, 0, tx).unwrap();
    assert!(
        hub.submit(task("r", "new#1", "x")).is_empty(),
        "not open yet"
    );
    assert_eq!(hub.free_slots()["x"], 0, "no slot to claim due tasks for");
    // The task it still runs from its last stream takes its one slot.
    assert!(hub.adopt("a", task("r", "held#1", "x")));
    assert!(hub.open("a").is_empty(), "full with the task it holds");
    assert!(rx.try_recv().is_err());
    let next = hub.finish("a", "r", "held#1").unwrap();
    assert_eq!(next[0].task_key, "new#1");
}

#[test]
fn a_closed_stream_is_skipped_and_the_task_goes_to_another_worker() {
    let hub = Hub::default();
    let closed = worker(&hub, "a", &["x"], 1);
    drop(closed);
    let mut b = worker(&hub, "b", &["x"], 1);
    // "a" sorts first and is as empty as "b", but its stream is gone.
    assert_eq!(
        sent_to(hub.submit(task("r", "one#1", "x"))).as_deref(),
        Some("b")
    );
    assert!(matches!(b.try_recv(), Ok(ToWorker::Task(_))));
    assert_eq!(
        hub.free_slots()["x"],
        0,
        "the closed worker takes nothing more"
    );
}

#[tokio::test(start_paused = true)]
async fn a_task_past_its_timeout_is_taken_back_and_stopped() {
    let hub = Hub::default();
    let mut rx = worker(&hub, "a", &["x"], 1);
    let mut slow = task("r", "slow#1", "x");
    slow.timeout_ms = 50;
    hub.submit(slow);
    assert!(
        hub.submit(task("r", "next#1", "x")).is_empty(),
        "the slot is full"
    );
    rx.try_recv().unwrap();
    tokio::time::advance(Duration::from_millis(49)).await;
    assert!(hub.overdue().0.is_empty(), "not yet");
    tokio::time::advance(Duration::from_millis(1)).await;
    let (overdue, assignments) = hub.overdue();
    assert_eq!(overdue.len(), 1);
    assert_eq!(overdue[0].0, "a");
    match rx.try_recv().unwrap() {
        ToWorker::Cancel { task_id, reason } => {
            assert_eq!(task_id, "r/slow#1@1");
            assert_eq!(reason, "timed out after 50 ms");
        }
        other => panic!("expected a cancel, got {other:?}"),
    }
    assert_eq!(
        assignments[0].task_key, "next#1",
        "the freed slot took the next task"
    );
}

#[tokio::test(start_paused = true)]
async fn tasks_that_waited_long_enough_are_taken_out_oldest_first_as_many_as_asked() {
    let hub = Hub::default();
    let _busy = worker(&hub, "a", &["test"], 1);
    hub.submit(task("r", "running#1", "test"));
    hub.submit(task("r", "old#1", "test"));
    tokio::time::advance(Duration::from_millis(500)).await;
    hub.submit(task("r", "older-than-new#1", "test"));
    tokio::time::advance(Duration::from_millis(600)).await;
    hub.submit(task("r", "new#1", "test"));
    hub.submit(task("r", "other#1", "lint"));
    let patience = Duration::from_millis(1_000);
    assert_eq!(
        hub.waiting_longer_than(patience),
        [("test".to_owned(), 1)],
        "only old#1 has waited a second; the running task is not waiting"
    );
    let take = |pairs: &[(&str, usize)]| {
        pairs
            .iter()
            .map(|(agent, n)| ((*agent).to_owned(), *n))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    assert!(hub.waited_out(patience, &take(&[("lint", 5)])).is_empty());
    tokio::time::advance(Duration::from_millis(500)).await;
    // old#1 and older-than-new#1 have waited long enough now; one is asked for.
    let out = hub.waited_out(patience, &take(&[("test", 1)]));
    assert_eq!(
        out.iter().map(|t| t.key.as_str()).collect::<Vec<_>>(),
        ["old#1"]
    );
    let out = hub.waited_out(patience, &take(&[("test", 5)]));
    assert_eq!(
        out.iter().map(|t| t.key.as_str()).collect::<Vec<_>>(),
        ["older-than-new#1"]
    );
    // What stays keeps its place: new#1 still waits for the busy worker, lint for a worker.
    let mut waiting: Vec<(String, usize)> = hub
        .queue_stats()
        .into_iter()
        .map(|(agent, n, _)| (agent, n))
        .collect();
    waiting.sort();
    assert_eq!(waiting, [("lint".to_owned(), 1), ("test".to_owned(), 1)]);
    assert!(hub.holds("a", "r", "running#1", 1));
}

#[tokio::test(start_paused = true)]
async fn a_worker_silent_for_long_enough_is_named_and_a_heartbeat_clears_it() {
    let hub = Hub::default();
    let _a = worker(&hub, "a", &["x"], 1);
    let _b = worker(&hub, "b", &["x"], 1);
    tokio::time::advance(Duration::from_millis(300)).await;
    hub.seen("b");
    tokio::time::advance(Duration::from_millis(200)).await;
    let silent: Vec<String> = hub
        .silent(Duration::from_millis(500))
        .into_iter()
        .map(|(id, _)| id.into())
        .collect();
    assert_eq!(silent, ["a"]);
}

fn with_parts(mut task: ReadyTask, parts: &[&str]) -> ReadyTask {
    let parts = parts
        .iter()
        .map(|json| Arc::new(Part::new(json.as_bytes().to_vec())))
        .collect();
    task.payload = TaskPayload::made(Arc::new(Part::new(b"{}".to_vec())), parts);
    task
}

fn sent_parts(rx: &mut mpsc::UnboundedReceiver<ToWorker>) -> Vec<String> {
    match rx.try_recv().unwrap() {
        ToWorker::Task(task) => task
            .parts
            .iter()
            .map(|part| String::from_utf8(part.json.to_vec()).unwrap())
            .collect(),
        other => panic!("expected a task, got {other:?}"),
    }
}

#[test]
fn a_worker_gets_each_part_once_while_its_cache_holds_it() {
    let hub = Hub::default();
    let (tx, mut rx) = mpsc::unbounded_channel();
    // Room for the input and two 10-byte results.
    hub.connect("a", ["x".to_string()], 1, 26, tx).unwrap();
    hub.open("a");
    let input = r#""input""#;
    let steps = [r#""result 1""#, r#""result 2""#, r#""result 3""#];
    let mut sent = Vec::new();
    for n in 0..3 {
        let mut parts = vec![input];
        parts.extend(&steps[..n]);
        let key = format!("s{n}#1");
        assert!(sent_to(hub.submit(with_parts(task("r", &key, "x"), &parts))).is_some());
        sent.push(sent_parts(&mut rx));
        hub.finish("a", "r", &key).unwrap();
    }
    assert_eq!(sent[0], [input]);
    assert_eq!(sent[1], [steps[0]], "the input is cached");
    assert_eq!(sent[2], [steps[1]]);
    // The cache holds 26 bytes: input (7) + result 1 (10) + result 2 (10) is over, so the
    // least recently used part (the input, touched before result 1) went.
    hub.submit(with_parts(
        task("r", "s3#1", "x"),
        &[input, steps[0], steps[1]],
    ));
    assert_eq!(sent_parts(&mut rx), [input]);
    let counters = hub.counters();
    // Each task also carries its 2-byte manifest.
    assert_eq!(counters.bytes_to_workers, 7 + 10 + 10 + 7 + 4 * 2);
}

#[test]
fn without_a_cache_every_part_goes_with_every_task_once() {
    let hub = Hub::default();
    let (tx, mut rx) = mpsc::unbounded_channel();
    hub.connect("a", ["x".to_string()], 2, 0, tx).unwrap();
    hub.open("a");
    let parts = [r#""in""#, r#"{"plan":1}"#, r#"{"plan":1}"#];
    hub.submit(with_parts(task("r", "a#1", "x"), &parts));
    hub.submit(with_parts(task("r", "b#1", "x"), &parts));
    assert_eq!(sent_parts(&mut rx), [parts[0], parts[1]]);
    assert_eq!(sent_parts(&mut rx), [parts[0], parts[1]]);
}

#[test]
fn a_resend_resets_the_cache_and_sends_every_part_again() {
    let hub = Hub::default();
    let (tx, mut rx) = mpsc::unbounded_channel();
    hub.connect("a", ["x".to_string()], 2, 1 << 20, tx).unwrap();
    hub.open("a");
    let parts = [r#""in""#, r#"{"plan":1}"#];
    hub.submit(with_parts(task("r", "a#1", "x"), &parts));
    assert_eq!(sent_parts(&mut rx), parts);
    hub.submit(with_parts(task("r", "b#1", "x"), &parts));
    assert!(sent_parts(&mut rx).is_empty(), "cached");

    hub.resend("a", "r", "b#1", 1).unwrap();
    assert_eq!(rx.try_recv().unwrap(), ToWorker::ResetPartCache);
    assert_eq!(sent_parts(&mut rx), parts, "whole, after the reset");
    // Tasks after the reset build on the resent one.
    assert!(
        hub.submit(with_parts(task("r", "c#1", "x"), &parts))
            .is_empty()
    );
    hub.finish("a", "r", "a#1").unwrap();
    assert!(sent_parts(&mut rx).is_empty());

    for _ in 1..MAX_RESENDS {
        hub.resend("a", "r", "b#1", 1).unwrap();
    }
    assert!(matches!(
        hub.resend("a", "r", "b#1", 1),
        Err(Error::ResendsExhausted {
            resends: MAX_RESENDS,
            ..
        })
    ));
    assert!(matches!(
        hub.resend("a", "r", "nope#1", 1),
        Err(Error::NotHeld { .. })
    ));
}

#[test]
fn locate_says_where_each_held_task_is() {
    let hub = Hub::default();
    let _a = worker(&hub, "a", &["x"], 1);
    hub.submit(task("r", "running#1", "x"));
    assert!(hub.submit(task("r", "queued#1", "x")).is_empty());
    assert!(hub.submit(task("r", "unserved#1", "y")).is_empty());
    let ask = |task_key, agent| TaskAsked {
        run_id: "r",
        task_key,
        agent,
    };
    assert_eq!(
        hub.locate(&[
            ask("running#1", "x"),
            ask("queued#1", "x"),
            ask("unserved#1", "y"),
            ask("dropped#1", "x"),
        ]),
        [
            Holding::Worker(Worker::new("a", "")),
            Holding::Queued,
            Holding::Nowhere,
            Holding::Nowhere
        ]
    );
}

#[test]
fn worker_ids_are_unique() {
    let hub = Hub::default();
    let _a = worker(&hub, "a", &["x"], 1);
    let (tx, _rx) = mpsc::unbounded_channel();
    assert_eq!(
        hub.connect("a", ["x".to_string()], 1, 0, tx).map(|_| ()),
        Err(Error::DuplicateWorker("a".into()))
    );
}

/// A worker of another principal cannot take a connected worker's id (issue 28): refused, and
/// told the id is taken, so nothing said under that id comes from it.
#[test]
fn a_worker_id_is_not_shared_with_another_principal() {
    let hub = Hub::default();
    let (tx, _rx) = mpsc::unbounded_channel();
    let coders = Worker::new("w1", "coders");
    hub.connect_as(
        &coders,
        baton_proto::WORKER_PROTOCOL,
        ["x".into()],
        1,
        0,
        tx,
    )
    .unwrap();
    let (tx, _rx) = mpsc::unbounded_channel();
    let squatter = Worker::new("w1", "planners");
    assert_eq!(
        hub.connect_as(
            &squatter,
            baton_proto::WORKER_PROTOCOL,
            ["x".into()],
            1,
            0,
            tx
        )
        .map(|_| ()),
        Err(Error::WorkerIdTaken("w1".into()))
    );
    assert_eq!(hub.principal_of("w1"), Some(Some("coders".to_owned())));
}

#[test]
fn a_held_task_is_located_with_its_worker_s_principal_and_asked_about_only_by_it() {
    let hub = Hub::default();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let coders = Worker::new("w1", "coders");
    hub.connect_as(
        &coders,
        baton_proto::WORKER_PROTOCOL,
        ["x".into()],
        1,
        0,
        tx,
    )
    .unwrap();
    hub.open("w1");
    hub.submit(task("r", "code#1", "x"));
    assert!(matches!(rx.try_recv(), Ok(ToWorker::Task(_))));
    let ask = TaskAsked {
        run_id: "r",
        task_key: "code#1",
        agent: "x",
    };
    assert_eq!(hub.locate(&[ask]), [Holding::Worker(coders)]);
    assert!(hub.holds_as("w1", Some("coders"), "r", "code#1", 1));
    assert!(!hub.holds_as("w1", Some("planners"), "r", "code#1", 1));
    assert!(!hub.holds_as("w1", None, "r", "code#1", 1));
    assert!(
        !hub.holds_as("w1", Some("coders"), "r", "code#1", 2),
        "another attempt"
    );
    // A resend of another attempt than the one held sends nothing.
    assert!(matches!(
        hub.resend("w1", "r", "code#1", 2),
        Err(Error::NotHeld { .. })
    ));
    assert!(rx.try_recv().is_err());
}

/// Something that happens to a hub, for the property test below.
#[derive(Debug, Clone)]
enum Op {
    Connect {
        worker: u8,
        agents: u8,
        capacity: usize,
        protocol: u32,
    },
    Disconnect {
        worker: u8,
    },
    Drain {
        worker: u8,
    },
    Submit {
        agent: u8,
        /// A map item, which needs [`baton_proto::MAP_ITEMS_PROTOCOL`].
        item: bool,
    },
    Finish {
        worker: u8,
        nth: usize,
    },
    Requeue {
        worker: u8,
        nth: usize,
    },
    Forget {
        nth: usize,
    },
    Overdue,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (
            0u8..4,
            1u8..4,
            1usize..4,
            baton_proto::MAP_ITEMS_PROTOCOL - 1..=baton_proto::MAP_ITEMS_PROTOCOL
        )
            .prop_map(|(worker, agents, capacity, protocol)| Op::Connect {
                worker,
                agents,
                capacity,
                protocol
            }),
        (0u8..4).prop_map(|worker| Op::Disconnect { worker }),
        (0u8..4).prop_map(|worker| Op::Drain { worker }),
        (0u8..2, any::<bool>()).prop_map(|(agent, item)| Op::Submit { agent, item }),
        (0u8..2, any::<bool>()).prop_map(|(agent, item)| Op::Submit { agent, item }),
        (0u8..4, 0usize..4).prop_map(|(worker, nth)| Op::Finish { worker, nth }),
        (0u8..4, 0usize..4).prop_map(|(worker, nth)| Op::Requeue { worker, nth }),
        (0usize..16).prop_map(|nth| Op::Forget { nth }),
        Just(Op::Overdue),
    ]
}

const OP_AGENTS: [&str; 2] = ["coder", "tester"];

/// Where every task is now: (visit key, the worker holding it or `None` when queued).
fn places(hub: &Hub) -> Vec<(String, Option<String>)> {
    let state = hub.lock();
    let mut places: Vec<(String, Option<String>)> = Vec::new();
    for (id, worker) in &state.workers {
        for (_, key) in worker.holding.keys() {
            places.push((key.clone(), Some(id.to_string())));
        }
    }
    for queue in state.queues.values() {
        places.extend(queue.iter().map(|task| (task.key.clone(), None)));
    }
    places
}

/// The submission number of a task of this test (`t<n>#1`, or `t<n>[0]#1` for an item).
fn number(key: &str) -> usize {
    let digits = key[1..].split(['[', '#']).next().unwrap();
    digits.parse().unwrap()
}

proptest! {
    /// Whatever happens to the workers, a task is in one place at a time (one worker's
    /// holding or its agent's queue), only on a worker that serves its agent and speaks its
    /// protocol, a worker gets nothing while it is full, and each agent's tasks go out for the
    /// first time in the order they were submitted.
    #[test]
    fn each_task_is_held_by_one_worker_at_a_time(ops in prop::collection::vec(op(), 1..60)) {
        let hub = Hub::default();
        let mut streams = HashMap::new();
        let mut connections = HashMap::new();
        let mut submitted: Vec<String> = Vec::new();
        let mut first_sent: HashMap<String, Vec<usize>> = HashMap::new();
        let mut ever_sent = HashSet::new();
        for op in ops {
            let mut assignments = Vec::new();
            match op {
                Op::Connect { worker, agents, capacity, protocol } => {
                    let id = format!("w{worker}");
                    let served: Vec<String> = OP_AGENTS
                        .iter()
                        .enumerate()
                        .filter(|(n, _)| agents & (1 << n) != 0)
                        .map(|(_, a)| a.to_string())
                        .collect();
                    let (tx, rx) = mpsc::unbounded_channel();
                    let connected = hub.connect_speaking(&id, protocol, served, capacity, 0, tx);
                    if let Ok((connection, _closed)) = connected {
                        streams.insert(id.clone(), rx);
                        connections.insert(id.clone(), connection);
                        assignments = hub.open(&id);
                    }
                }
                Op::Disconnect { worker } => {
                    let id = format!("w{worker}");
                    if let Some(connection) = connections.remove(&id) {
                        // What it held is delivered again, as the coordinator does.
                        for task in hub.disconnect(&id, connection) {
                            assignments.extend(hub.submit(task));
                        }
                        streams.remove(&id);
                    }
                }
                Op::Drain { worker } => hub.drain(&format!("w{worker}")),
                Op::Submit { agent, item } => {
                    let n = submitted.len();
                    let key = if item { format!("t{n}[0]#1") } else { format!("t{n}#1") };
                    submitted.push(key.clone());
                    assignments = hub.submit(task("r", &key, OP_AGENTS[agent as usize]));
                }
                Op::Finish { worker, nth } | Op::Requeue { worker, nth } => {
                    let id = format!("w{worker}");
                    let held: Vec<String> = places(&hub)
                        .into_iter()
                        .filter(|(_, holder)| holder.as_deref() == Some(id.as_str()))
                        .map(|(key, _)| key)
                        .collect();
                    if let Some(key) = held.get(nth % held.len().max(1)) {
                        assignments = if matches!(op, Op::Finish { .. }) {
                            hub.finish(&id, "r", key).unwrap()
                        } else {
                            hub.requeue(&id, "r", key)
                        };
                    }
                }
                Op::Forget { nth } => {
                    if let Some(key) = submitted.get(nth) {
                        assignments = hub.forget("r", key, "gone").assignments;
                    }
                }
                Op::Overdue => assignments = hub.overdue().1,
            }
            let places = places(&hub);
            let mut seen = HashSet::new();
            for (key, _) in &places {
                prop_assert!(seen.insert(key.clone()), "{key} is in two places: {places:?}");
            }
            let state = hub.lock();
            for assignment in &assignments {
                let worker = &state.workers[&assignment.worker_id];
                prop_assert!(worker.holding.len() <= worker.capacity, "over capacity");
                if ever_sent.insert(assignment.task_key.clone()) {
                    first_sent
                        .entry(assignment.agent.to_string())
                        .or_default()
                        .push(number(&assignment.task_key));
                }
            }
            for worker in state.workers.values() {
                for task in worker.holding.values() {
                    prop_assert!(worker.agents.contains(task.agent.as_str()));
                    prop_assert!(
                        worker.protocol >= task.needs_protocol(),
                        "{} went to a worker of protocol {}",
                        task.key,
                        worker.protocol
                    );
                }
            }
        }
        for (agent, order) in first_sent {
            prop_assert!(order.windows(2).all(|w| w[0] < w[1]), "{agent}: {order:?}");
        }
    }
}
