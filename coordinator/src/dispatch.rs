//! Which worker gets which waiting task: the one scheduling decision outside the engine, as a
//! pure function of the workers' loads and the agents' queues ([`crate::hub`] carries it out).
//!
//! The rules, each a property test below:
//! - a task goes only to a worker that serves its agent;
//! - never over a worker's capacity;
//! - first in, first out per agent: a queue is placed from its front, in order;
//! - each task is placed once;
//! - nothing is left waiting while a worker that serves its agent has a free slot;
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
}

/// Something waiting in a queue.
pub trait Waiting {
    /// When it became ready for a worker.
    fn ready_at(&self) -> Instant;
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
/// from its front. `queues` are `(agent, tasks)`; the same agent must not appear twice.
pub fn assign<T: Waiting>(
    workers: &[WorkerLoad<'_>],
    queues: &[(&str, &VecDeque<T>)],
    now: Instant,
) -> Vec<Placement> {
    let mut loads: Vec<usize> = workers.iter().map(|worker| worker.load).collect();
    let mut placements = Vec::new();
    for (queue, (agent, tasks)) in queues.iter().enumerate() {
        for task in tasks.iter() {
            let Some(worker) = least_loaded(workers, &loads, agent) else {
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

/// The worker serving `agent` with a free slot and the fewest tasks (lowest id among equals).
fn least_loaded(workers: &[WorkerLoad<'_>], loads: &[usize], agent: &str) -> Option<usize> {
    workers
        .iter()
        .enumerate()
        .filter(|(n, worker)| loads[*n] < worker.capacity && worker.agents.contains(agent))
        .min_by_key(|(n, worker)| (loads[*n], worker.id))
        .map(|(n, _)| n)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    const AGENTS: [&str; 3] = ["planner", "coder", "tester"];

    /// Workers as (agents served, as bits over AGENTS; capacity; load), and queue lengths.
    fn scene() -> impl Strategy<Value = (Vec<(u8, usize, usize)>, Vec<usize>)> {
        (
            prop::collection::vec((0u8..8, 0usize..5, 0usize..5), 0..6),
            prop::collection::vec(0usize..12, AGENTS.len()),
        )
    }

    struct Scene {
        ids: Vec<String>,
        agents: Vec<HashSet<String>>,
        workers: Vec<(usize, usize)>,
        queues: Vec<VecDeque<Instant>>,
        now: Instant,
    }

    impl Scene {
        fn new((workers, lengths): (Vec<(u8, usize, usize)>, Vec<usize>)) -> Self {
            let now = Instant::now();
            Scene {
                ids: (0..workers.len()).map(|n| format!("w{n}")).collect(),
                agents: workers
                    .iter()
                    .map(|(bits, _, _)| {
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
                    .map(|(_, capacity, load)| (*capacity, (*load).min(*capacity)))
                    .collect(),
                queues: lengths
                    .iter()
                    .map(|&n| {
                        (0..n)
                            .map(|i| now - Duration::from_millis(100 * (n - i) as u64))
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
                })
                .collect()
        }

        fn assign(&self) -> Vec<Placement> {
            let queues: Vec<(&str, &VecDeque<Instant>)> =
                AGENTS.iter().copied().zip(self.queues.iter()).collect();
            assign(&self.loads(), &queues, self.now)
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
        fn each_queue_is_placed_from_its_front_in_order_each_task_once(scene in scene()) {
            let scene = Scene::new(scene);
            let mut taken = vec![0usize; AGENTS.len()];
            for placement in scene.assign() {
                let queue = &scene.queues[placement.queue];
                let position = taken[placement.queue];
                prop_assert!(position < queue.len(), "placed more tasks than were queued");
                // The waited time says which task it is: the oldest unplaced one.
                let expected = scene.now.saturating_duration_since(queue[position]);
                prop_assert_eq!(placement.waited, expected);
                taken[placement.queue] += 1;
            }
        }

        #[test]
        fn nothing_waits_while_a_serving_worker_has_room(scene in scene()) {
            let scene = Scene::new(scene);
            let placements = scene.assign();
            let mut loads: Vec<usize> = scene.workers.iter().map(|(_, load)| *load).collect();
            let mut taken = vec![0usize; AGENTS.len()];
            for placement in &placements {
                loads[placement.worker] += 1;
                taken[placement.queue] += 1;
            }
            for (queue, agent) in AGENTS.iter().enumerate() {
                if taken[queue] == scene.queues[queue].len() {
                    continue;
                }
                for (worker, (capacity, _)) in scene.workers.iter().enumerate() {
                    prop_assert!(
                        !(scene.agents[worker].contains(*agent) && loads[worker] < *capacity),
                        "{agent} has tasks waiting while w{worker} has room"
                    );
                }
            }
        }

        #[test]
        fn each_task_goes_to_the_least_loaded_worker_that_can_take_it(scene in scene()) {
            let scene = Scene::new(scene);
            let mut loads: Vec<usize> = scene.workers.iter().map(|(_, load)| *load).collect();
            for placement in scene.assign() {
                let agent = AGENTS[placement.queue];
                let fewest = (0..loads.len())
                    .filter(|&w| scene.agents[w].contains(agent) && loads[w] < scene.workers[w].0)
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
            },
            WorkerLoad {
                id: "a",
                agents: &agents,
                capacity: 4,
                load: 0,
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
}
