//! The coordinator's mirror of a worker's part cache and the worker's cache itself never
//! disagree: whatever the tasks, the budget and the sizes, every part a task names is either
//! sent with it or held by the worker, and the worker rebuilds the exact payload.

use std::collections::HashMap;
use std::sync::Arc;

use baton_coordinator::hub::{Hub, ReadyTask};
use baton_coordinator::parts::Part;
use baton_coordinator::task_ref::TaskRef;
use baton_core::TaskId;
use baton_core::payload::{Manifest, assemble};
use baton_proto::v1::{CoordinatorMessage, coordinator_message};
use baton_worker::payload::PartCache;
use proptest::prelude::*;
use tokio::sync::mpsc;

/// A task naming `picks` (indexes into `pool`): the first as the input, the rest as context,
/// and the first again as the message history (a task may name one part twice).
fn task(n: usize, pool: &[Arc<Part>], picks: &[usize]) -> (ReadyTask, Vec<u8>) {
    let mut parts: Vec<Arc<Part>> = picks.iter().map(|&i| pool[i].clone()).collect();
    let manifest = Manifest {
        input: parts[0].sha256.clone(),
        reference: None,
        context: parts[1..]
            .iter()
            .enumerate()
            .map(|(k, part)| (format!("k{k}"), part.sha256.clone()))
            .collect(),
        error: None,
        messages: parts[0].sha256.clone(),
        handoff: None,
        map: None,
    };
    // The parts in manifest order: input, context, messages.
    parts.push(parts[0].clone());
    let all: HashMap<&str, &[u8]> = parts
        .iter()
        .map(|part| (part.sha256.as_str(), &part.json[..]))
        .collect();
    let expected = assemble(&manifest, |d| all.get(d).copied()).unwrap();
    let step = TaskId::new(format!("t{n}"), 1);
    let manifest = Arc::new(Part::new(serde_json::to_vec(&manifest).unwrap()));
    let ready = ReadyTask::new(TaskRef::new("r", &step, 1), "x", manifest, parts);
    (ready, expected)
}

proptest! {
    #[test]
    fn mirror_and_worker_cache_agree(
        sizes in prop::collection::vec(1usize..120, 1..10),
        tasks in prop::collection::vec(prop::collection::vec(any::<prop::sample::Index>(), 1..12), 1..40),
        budget in 0u64..600,
        worker_extra in prop_oneof![Just(0u64), 0u64..400],
    ) {
        let pool: Vec<Arc<Part>> = sizes
            .iter()
            .enumerate()
            .map(|(i, size)| Arc::new(Part::new(format!("\"{i}{}\"", "x".repeat(*size)).into_bytes())))
            .collect();
        let hub = Hub::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        hub.connect("w", ["x".to_owned()], 1, budget, tx).unwrap();
        hub.open("w");
        // A worker may keep more than it told the coordinator (the coordinator clamps what it
        // is told): it then holds a superset of what the coordinator believes.
        let mut cache = PartCache::new(budget + worker_extra);
        for (n, picks) in tasks.iter().enumerate() {
            let picks: Vec<usize> = picks.iter().map(|i| i.index(pool.len())).collect();
            let (ready, expected) = task(n, &pool, &picks);
            prop_assert_eq!(hub.submit(ready).len(), 1, "the worker has room");
            // As the worker gets it, over the wire.
            let message: CoordinatorMessage = rx.try_recv().unwrap().into();
            let Some(coordinator_message::Message::Task(sent)) = message.message else {
                panic!("expected a task");
            };
            let payload = cache.receive(sent.manifest, sent.parts).unwrap();
            prop_assert_eq!(payload.bytes(), &expected[..]);
            prop_assert!(cache.used() <= budget + worker_extra);
            hub.finish("w", "r", &format!("t{n}#1")).unwrap();
        }
    }
}
