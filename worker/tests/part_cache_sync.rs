//! The coordinator's mirror of a worker's part cache and the worker's cache itself never
//! disagree: whatever the payloads, the budget and the sizes, every part and every context
//! listing a task needs is either sent with it or held by the worker, and the worker rebuilds
//! exactly the payload the engine made.
//!
//! The payloads are the coordinator's own (its `PartEncoder`, through its hub, to a real
//! `PartCache`), over a context that changes as a run's does: results added, replaced (a loop),
//! hidden (a later visit that failed), or not changed at all (a fan-out's branches).

use std::sync::Arc;

use baton_coordinator::hub::{Hub, ReadyTask};
use baton_coordinator::parts::PartEncoder;
use baton_coordinator::task_ref::TaskRef;
use baton_core::{AgentPayload, Context, StepResult, TaskId};
use baton_proto::v1::{CoordinatorMessage, coordinator_message};
use baton_worker::payload::PartCache;
use proptest::prelude::*;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// What happens to the context between two tasks.
#[derive(Debug, Clone)]
enum Change {
    /// Key `0` gets value `1` of the pool (added, or replaced).
    Set(usize, usize),
    /// Key `0`'s latest visit failed: it leaves the visible context.
    Fail(usize),
    /// Nothing: the next task sees the same context.
    Same,
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        4 => (0usize..16, any::<prop::sample::Index>()).prop_map(|(k, v)| Change::Set(k, v.index(64))),
        1 => (0usize..16).prop_map(Change::Fail),
        2 => Just(Change::Same),
    ]
}

proptest! {
    #[test]
    fn mirror_and_worker_cache_agree(
        sizes in prop::collection::vec(1usize..200, 1..12),
        changes in prop::collection::vec(change(), 1..60),
        referenced in prop::collection::vec(any::<bool>(), 60),
        budget in 0u64..6000,
        worker_extra in prop_oneof![Just(0u64), 0u64..2000],
    ) {
        // Values both small (inline in a manifest) and large (parts of their own), each one
        // shared Arc, as the engine shares a result across contexts.
        let pool: Vec<Arc<Value>> = sizes
            .iter()
            .enumerate()
            .map(|(i, size)| Arc::new(json!({"i": i, "text": "x".repeat(*size)})))
            .collect();
        let hub = Hub::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        hub.connect("w", ["x".to_owned()], 1, budget, tx).unwrap();
        hub.open("w");
        // A worker may keep more than it told the coordinator (the coordinator clamps what it
        // is told): it then holds a superset of what the coordinator believes.
        let mut cache = PartCache::new(budget + worker_extra);
        let mut encoder = PartEncoder::default();
        let mut context = Context::new(json!({"task": "x".repeat(70)}));
        let messages = Arc::new(json!([]));
        for (n, change) in changes.iter().enumerate() {
            match change {
                Change::Set(key, value) => {
                    let result = StepResult::success(format!("k{key}").into(), n as u32, pool[value % pool.len()].clone());
                    context = context.with_result(format!("k{key}").into(), result);
                }
                Change::Fail(key) => {
                    let result = StepResult::failure(format!("k{key}").into(), n as u32, "no".into());
                    context = context.with_result(format!("k{key}").into(), result);
                }
                Change::Same => {}
            }
            let reference = referenced[n]
                .then(|| context.visible().next().map(|(k, v)| (k.clone(), v.clone())))
                .flatten();
            let payload = AgentPayload {
                context: context.clone(),
                reference,
                error: None,
                messages: messages.clone(),
                handoff: None,
                map: None,
            };
            let step = TaskId::new(format!("t{n}"), 1);
            let ready = ReadyTask::new(TaskRef::new("r", &step, 1), "x", encoder.payload(&payload));
            prop_assert_eq!(hub.submit(ready).len(), 1, "the worker has room");
            // As the worker gets it, over the wire.
            let message: CoordinatorMessage = rx.try_recv().unwrap().into();
            let Some(coordinator_message::Message::Task(sent)) = message.message else {
                panic!("expected a task");
            };
            let rebuilt = cache.receive(sent.manifest, sent.parts).unwrap();
            let expected = payload.to_json();
            prop_assert_eq!(
                String::from_utf8_lossy(rebuilt.bytes()),
                String::from_utf8_lossy(&expected)
            );
            prop_assert!(cache.used() <= budget + worker_extra);
            hub.finish("w", "r", &format!("t{n}#1")).unwrap();
        }
    }
}
