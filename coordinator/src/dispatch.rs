//! Which worker gets which waiting task: the one scheduling decision outside the engine, as a
//! pure function of the workers' loads and the agents' queues ([`crate::hub`] carries it out).
//!
//! The rules, each a property test below:
//! - a task goes only to a worker that serves its agent;
//! - a task that needs worker protocol P (a map item needs
//!   [`baton_proto::MAP_ITEMS_PROTOCOL`]) goes only to a worker speaking P or later;
//! - never over a worker's capacity;
//! - first in, first out per agent: a queue is placed from its front, in order, and stops at a
//!   task no worker can take now, even if one behind it could go;
//! - each task is placed once;
//! - nothing is left at the front of a queue while a worker that serves its agent, speaks its
//!   protocol and has a free slot exists;
//! - each task goes to the least-loaded worker that can take it (the lowest id among equals),
//!   which is what spreads a parallel step's branches over workers.
//!
//! The coordinator's other half of dispatch, turning the engine's `Dispatch` actions into tasks
//! ready for a worker, is in `service/tasks.rs`.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use crate::clock::Instant;

/// A connected worker, as the policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct WorkerLoad<'a> {
    pub id: &'a str,
    /// The agents it serves.
    pub agents: &'a HashSet<String>,
    /// How many tasks it takes at once (0 while it drains or its stream is closed).
    pub capacity: usize,
    /// How many it holds now.
    pub load: usize,
    /// The worker protocol it speaks (`Hello.protocol`).
    pub protocol: u32,
}

/// Something waiting in a queue.
pub trait Waiting {
    /// When it became ready for a worker.
    fn ready_at(&self) -> Instant;

    /// The oldest worker protocol that can run it; 0 for any.
    fn needs_protocol(&self) -> u32 {
        0
    }
}

impl Waiting for Instant {
    fn ready_at(&self) -> Instant {
        *self
    }
}

/// One task placed: the front task of queue `queue` (after the placements before it in the
/// list) goes to worker `worker` (an index into the loads given).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub queue: usize,
    pub worker: usize,
    /// How long it waited for a worker, until `now`.
    pub waited: Duration,
}

/// Places queued tasks on workers with free slots, queue by queue in the order given, each
/// from its front, up to the first task that no worker can take. `queues` are
/// `(agent, tasks)`; the same agent must not appear twice.
pub fn assign<T: Waiting>(
    workers: &[WorkerLoad<'_>],
    queues: &[(&str, &VecDeque<T>)],
    now: Instant,
) -> Vec<Placement> {
    let mut loads: Vec<usize> = workers.iter().map(|worker| worker.load).collect();
    let mut placements = Vec::new();
    for (queue, (agent, tasks)) in queues.iter().enumerate() {
        for task in tasks.iter() {
            // First in, first out: what no worker can take holds up the tasks behind it.
            let Some(worker) = least_loaded(workers, &loads, agent, task.needs_protocol()) else {
                break;
            };
            loads[worker] += 1;
            placements.push(Placement {
                queue,
                worker,
                waited: now.saturating_duration_since(task.ready_at()),
            });
        }
    }
    placements
}

/// The worker serving `agent`, speaking protocol `needs` or later, with a free slot and the
/// fewest tasks (lowest id among equals).
fn least_loaded(
    workers: &[WorkerLoad<'_>],
    loads: &[usize],
    agent: &str,
    needs: u32,
) -> Option<usize> {
    workers
        .iter()
        .enumerate()
        .filter(|(n, worker)| {
            loads[*n] < worker.capacity && worker.protocol >= needs && worker.agents.contains(agent)
        })
        .min_by_key(|(n, worker)| (loads[*n], worker.id))
        .map(|(n, _)| n)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use baton_proto::MAP_ITEMS_PROTOCOL;
    use proptest::prelude::*;

    use super::*;

    const AGENTS: [&str; 3] = ["planner", "coder", "tester"];

    /// A queued task of a scene: when it became ready, and the protocol it needs.
    #[derive(Debug, Clone, Copy)]
    struct Task {
        ready_at: Instant,
        needs: u32,
    }

    impl Waiting for Task {
        fn ready_at(&self) -> Instant {
            self.ready_at
        }

        fn needs_protocol(&self) -> u32 {
            self.needs
        }
    }

    /// Workers as (agents served, as bits over AGENTS; capacity; load; protocol), and queues as
    /// whether each task is a map item (which needs [`MAP_ITEMS_PROTOCOL`]).
    type Drawn = (Vec<(u8, usize, usize, u32)>, Vec<Vec<bool>>);

    fn scene() -> impl Strategy<Value = Drawn> {
        let protocols = MAP_ITEMS_PROTOCOL - 1..=MAP_ITEMS_PROTOCOL + 1;
        (
            prop::collection::vec((0u8..8, 0usize..5, 0usize..5, protocols), 0..6),
            prop::collection::vec(
                prop::collection::vec(prop::bool::weighted(0.3), 0..12),
                AGENTS.len(),
            ),
        )
    }

    struct Scene {
        ids: Vec<String>,
        agents: Vec<HashSet<String>>,
        /// (capacity, load) per worker.
        workers: Vec<(usize, usize)>,
        protocols: Vec<u32>,
        queues: Vec<VecDeque<Task>>,
        now: Instant,
    }

    impl Scene {
        fn new((workers, items): Drawn) -> Self {
            let now = Instant::now();
            Scene {
                ids: (0..workers.len()).map(|n| format!("w{n}")).collect(),
                agents: workers
                    .iter()
                    .map(|(bits, _, _, _)| {
                        AGENTS
                            .iter()
                            .enumerate()
                            .filter(|(n, _)| bits & (1 << n) != 0)
                            .map(|(_, agent)| agent.to_string())
                            .collect()
                    })
                    .collect(),
                // A worker never holds more than its capacity to begin with.
                workers: workers
                    .iter()
                    .map(|(_, capacity, load, _)| (*capacity, (*load).min(*capacity)))
                    .collect(),
                protocols: workers
                    .iter()
                    .map(|(_, _, _, protocol)| *protocol)
                    .collect(),
                queues: items
                    .iter()
                    .map(|items| {
                        let n = items.len();
                        items
                            .iter()
                            .enumerate()
                            .map(|(i, &item)| Task {
                                ready_at: now - Duration::from_millis(100 * (n - i) as u64),
                                needs: if item { MAP_ITEMS_PROTOCOL } else { 0 },
                            })
                            .collect()
                    })
                    .collect(),
                now,
            }
        }

        fn loads(&self) -> Vec<WorkerLoad<'_>> {
            (0..self.ids.len())
                .map(|n| WorkerLoad {
                    id: &self.ids[n],
                    agents: &self.agents[n],
                    capacity: self.workers[n].0,
                    load: self.workers[n].1,
                    protocol: self.protocols[n],
                })
                .collect()
        }

        fn assign(&self) -> Vec<Placement> {
            let queues: Vec<(&str, &VecDeque<Task>)> =
                AGENTS.iter().copied().zip(self.queues.iter()).collect();
            assign(&self.loads(), &queues, self.now)
        }

        /// Whether worker `worker`, holding `load` tasks, could take `task` of `agent`.
        fn could_take(&self, worker: usize, load: usize, agent: &str, task: &Task) -> bool {
            self.agents[worker].contains(agent)
                && self.protocols[worker] >= task.needs
                && load < self.workers[worker].0
        }
    }

    proptest! {
        #[test]
        fn never_over_capacity_and_only_to_workers_serving_the_agent(scene in scene()) {
            let scene = Scene::new(scene);
            let mut added: HashMap<usize, usize> = HashMap::new();
            for placement in scene.assign() {
                let agent = AGENTS[placement.queue];
                prop_assert!(scene.agents[placement.worker].contains(agent));
                *added.entry(placement.worker).or_default() += 1;
            }
            for (worker, added) in added {
                let (capacity, load) = scene.workers[worker];
                prop_assert!(load + added <= capacity, "{worker}: {load} + {added} > {capacity}");
            }
        }

        #[test]
        fn a_task_that_needs_a_protocol_never_goes_to_a_worker_below_it(scene in scene()) {
            let scene = Scene::new(scene);
            let mut taken = vec![0usize; AGENTS.len()];
            for placement in scene.assign() {
                let task = scene.queues[placement.queue][taken[placement.queue]];
                taken[placement.queue] += 1;
                let protocol = scene.protocols[placement.worker];
                prop_assert!(
                    protocol >= task.needs,
                    "a task needing protocol {} went to w{} of protocol {protocol}",
                    task.needs,
                    placement.worker
                );
            }
        }

        #[test]
        fn each_queue_is_placed_from_its_front_in_order_each_task_once(scene in scene()) {
            let scene = Scene::new(scene);
            let mut taken = vec![0usize; AGENTS.len()];
            for placement in scene.assign() {
                let queue = &scene.queues[placement.queue];
                let position = taken[placement.queue];
                prop_assert!(position < queue.len(), "placed more tasks than were queued");
                // The waited time says which task it is: the oldest unplaced one.
                let expected = scene.now.saturating_duration_since(queue[position].ready_at);
                prop_assert_eq!(placement.waited, expected);
                taken[placement.queue] += 1;
            }
        }

        /// What is left at the front of a queue can go to no worker: none serves its agent,
        /// speaks its protocol and has room. (The tasks behind it wait their turn.)
        #[test]
        fn nothing_waits_while_a_worker_that_can_take_it_has_room(scene in scene()) {
            let scene = Scene::new(scene);
            let placements = scene.assign();
            let mut loads: Vec<usize> = scene.workers.iter().map(|(_, load)| *load).collect();
            let mut taken = vec![0usize; AGENTS.len()];
            for placement in &placements {
                loads[placement.worker] += 1;
                taken[placement.queue] += 1;
            }
            for (queue, agent) in AGENTS.iter().enumerate() {
                let Some(front) = scene.queues[queue].get(taken[queue]) else {
                    continue;
                };
                for (worker, load) in loads.iter().enumerate() {
                    prop_assert!(
                        !scene.could_take(worker, *load, agent, front),
                        "{agent} has a task needing protocol {} waiting while w{worker} \
                         (protocol {}) could take it",
                        front.needs,
                        scene.protocols[worker]
                    );
                }
            }
        }

        #[test]
        fn each_task_goes_to_the_least_loaded_worker_that_can_take_it(scene in scene()) {
            let scene = Scene::new(scene);
            let mut loads: Vec<usize> = scene.workers.iter().map(|(_, load)| *load).collect();
            let mut taken = vec![0usize; AGENTS.len()];
            for placement in scene.assign() {
                let agent = AGENTS[placement.queue];
                let task = scene.queues[placement.queue][taken[placement.queue]];
                taken[placement.queue] += 1;
                let fewest = (0..loads.len())
                    .filter(|&w| scene.could_take(w, loads[w], agent, &task))
                    .map(|w| loads[w])
                    .min();
                prop_assert_eq!(Some(loads[placement.worker]), fewest);
                loads[placement.worker] += 1;
            }
        }
    }

    #[test]
    fn branches_spread_over_equally_loaded_workers_by_id() {
        let agents: HashSet<String> = ["test".to_string()].into();
        let workers = [
            WorkerLoad {
                id: "b",
                agents: &agents,
                capacity: 4,
                load: 0,
                protocol: MAP_ITEMS_PROTOCOL,
            },
            WorkerLoad {
                id: "a",
                agents: &agents,
                capacity: 4,
                load: 0,
                protocol: MAP_ITEMS_PROTOCOL,
            },
        ];
        let now = Instant::now();
        let queue: VecDeque<Instant> = [now; 4].into();
        let placed: Vec<&str> = assign(&workers, &[("test", &queue)], now)
            .iter()
            .map(|placement| workers[placement.worker].id)
            .collect();
        assert_eq!(placed, ["a", "b", "a", "b"]);
    }

    #[test]
    fn a_map_item_waits_for_a_worker_of_its_protocol_and_holds_up_its_queue() {
        let agents: HashSet<String> = ["test".to_string()].into();
        let old = WorkerLoad {
            id: "old",
            agents: &agents,
            capacity: 4,
            load: 0,
            protocol: MAP_ITEMS_PROTOCOL - 1,
        };
        let now = Instant::now();
        let plain = Task {
            ready_at: now,
            needs: 0,
        };
        let item = Task {
            ready_at: now,
            needs: MAP_ITEMS_PROTOCOL,
        };
        let queue: VecDeque<Task> = [plain, item, plain].into();
        let placed = assign(&[old], &[("test", &queue)], now);
        assert_eq!(
            placed.len(),
            1,
            "the item and what is behind it wait: {placed:?}"
        );
        let new = WorkerLoad {
            id: "new",
            protocol: MAP_ITEMS_PROTOCOL,
            ..old
        };
        let placed: Vec<&str> = assign(&[old, new], &[("test", &queue)], now)
            .iter()
            .map(|placement| [old, new][placement.worker].id)
            .collect();
        // "new" sorts before "old": the first task goes there, the item too, then "old" is
        // the less loaded.
        assert_eq!(placed, ["new", "new", "old"]);
    }
}
