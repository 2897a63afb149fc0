//! Workers' streams: a worker connecting (and taking over the tasks it still runs), leaving or
//! falling silent (its tasks delivered again), and this coordinator shutting down.

use std::collections::HashSet;
use std::time::Duration;

use super::spans::Answered;
use super::{Coordinator, Error};
use crate::hub::{ReadyTask, WorkerStream};
use crate::lease;
use crate::metrics::Refused;
use crate::model::TaskEntry;
use crate::store::{Store, Tasks};
use crate::task_ref::{MalformedTaskId, TaskRef};

/// A worker's hello, as the edge checked it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerHello {
    pub worker_id: String,
    /// The principal the worker authenticated as (empty without authentication): not a field
    /// of the hello but who sent it, which the edge fills in. Its agents are all ones this
    /// principal may serve (the edge refused the hello otherwise).
    pub principal: String,
    /// The worker protocol it speaks, one this coordinator serves: the hub gives it only the
    /// tasks that protocol can run (a map item needs [`baton_proto::MAP_ITEMS_PROTOCOL`]).
    pub protocol: u32,
    /// The agents it serves.
    pub agents: Vec<String>,
    /// How many tasks it runs at once, at least 1.
    pub capacity: usize,
    /// Its part cache's size, which the coordinator mirrors.
    pub cache_bytes: u64,
    /// The tasks it still runs from an earlier stream (an id that does not read as a task is
    /// kept, so that the worker can be told to stop it).
    pub held: Vec<Result<TaskRef, MalformedTaskId>>,
}

impl<S: Store> Coordinator<S> {
    /// A worker said hello: it takes over the tasks it still runs from an earlier stream
    /// (`held`, where their attempts are still current; the others are stopped) and gets
    /// queued tasks for its agents at once. Returns the connection's number, for
    /// [`Coordinator::disconnect_worker`], and a receiver that completes when the coordinator
    /// lets the worker go (it fell silent): the stream must end then.
    pub async fn connect_worker(
        &self,
        hello: WorkerHello,
        stream: WorkerStream,
    ) -> Result<(u64, tokio::sync::oneshot::Receiver<()>), Error> {
        // A coordinator on its way out takes nobody: the worker goes to its next address.
        if self.inner.leases.stopping() {
            return Err(Error::ShuttingDown);
        }
        let worker = lease::Worker::new(&hello.worker_id, &hello.principal);
        let worker_id = worker.id.as_str();
        let hub = &self.inner.hub;
        let agents: HashSet<String> = hello.agents.into_iter().collect();
        let (connection, closed) = match hub.connect_as(
            &worker,
            hello.protocol,
            agents.iter().cloned(),
            hello.capacity,
            hello.cache_bytes,
            stream,
        ) {
            Ok(connected) => connected,
            Err(taken @ crate::hub::Error::WorkerIdTaken(_)) => {
                tracing::warn!(worker_id, principal = ?worker.principal, "refused a worker id another principal's worker holds");
                self.inner.metrics.worker_refused(Refused::Hello);
                return Err(Error::DuplicateWorker(taken.to_string()));
            }
            Err(error) => return Err(Error::DuplicateWorker(error.to_string())),
        };
        tracing::info!(
            worker_id,
            principal = ?worker.principal,
            protocol = hello.protocol,
            capacity = hello.capacity,
            held = hello.held.len(),
            "worker connected"
        );
        // The tasks it still runs take their slots first.
        for task in hello.held {
            match task {
                Ok(task) => self.adopt_running(&worker, &agents, task).await,
                Err(MalformedTaskId(text)) => {
                    self.inner.metrics.worker_refused(Refused::Held);
                    hub.cancel(worker_id, &text, "malformed task id");
                }
            }
            hub.seen(worker_id);
        }
        let assignments = hub.open(worker_id);
        self.assigned(assignments).await;
        // What is due for its agents goes to it now rather than at the next sweep.
        self.sweep().await;
        Ok((connection, closed))
    }

    /// A worker's stream ended (or fell silent): the tasks it held are delivered again, each as
    /// a new attempt, so that its answers, should it come back, are refused.
    pub async fn disconnect_worker(&self, worker_id: &str, connection: u64) {
        let returned = self.inner.hub.disconnect(worker_id, connection);
        tracing::info!(worker_id, returned = returned.len(), "worker disconnected");
        for task in returned {
            self.redeliver_lost(worker_id, task).await;
        }
    }

    /// A worker that said nothing for [`super::Config::worker_silence_ms`] is cut off: its
    /// stream may be dead behind a proxy without either end seeing it close.
    pub(super) async fn check_silent_workers(&self) {
        let silence = Duration::from_millis(self.inner.config.worker_silence_ms);
        for (worker_id, connection) in self.inner.hub.silent(silence) {
            tracing::warn!(%worker_id, ?silence, "worker silent; taking its stream for dead");
            self.disconnect_worker(&worker_id, connection).await;
        }
    }

    /// A reconnected worker says it still runs `task`: take over its lease if the store's entry
    /// says this very worker runs it ([`lease::adopted`]), and otherwise tell the worker to
    /// stop it. A refusal sends nothing of the task's payload, and is counted.
    async fn adopt_running(&self, worker: &lease::Worker, agents: &HashSet<String>, task: TaskRef) {
        let worker_id = worker.id.as_str();
        let task_id = task.to_string();
        let stop = |reason: &str| self.inner.hub.cancel(worker_id, &task_id, reason);
        let refuse = |reason: &str| {
            self.inner.metrics.worker_refused(Refused::Held);
            stop(reason);
        };
        let (run_id, key) = (task.run_id.as_str(), task.key());
        let stored = match self.inner.store.task(run_id, &key).await {
            Ok(Some(stored)) => stored,
            Ok(None) => return refuse("the task is no longer in flight"),
            Err(error) => {
                tracing::warn!(worker_id, %task_id, %error, "cannot check a task the worker still runs");
                return stop("its lease could not be checked");
            }
        };
        let Ok(entry) = serde_json::from_slice::<TaskEntry>(&stored) else {
            return refuse("its stored lease is unreadable");
        };
        let config = &self.inner.config;
        let next = match lease::adopted(
            &entry,
            task.attempt,
            worker,
            agents.contains(entry.agent.as_str()),
            &config.coordinator_id,
            self.now_ms(),
            config.lease_ms,
        ) {
            Ok(next) => next,
            Err(refusal) => {
                if refusal == lease::Refusal::Superseded {
                    self.inner.metrics.fenced.inc();
                } else {
                    tracing::warn!(worker_id, principal = ?worker.principal, %task_id, ?refusal, "refused to hand a worker a task it named in its hello");
                }
                return refuse(refusal.reason());
            }
        };
        let Ok(Some(ready)) = self.build_ready(run_id, &task.task, task.attempt).await else {
            return stop("the run no longer waits for it");
        };
        let _leases = self.inner.leases.writes.lock().await;
        match self.swap_bytes(run_id, &key, stored, Some(&next)).await {
            Ok(true) => {
                self.inner.hub.adopt(worker_id, ready);
                self.show_task(run_id, &key, &next).await;
                tracing::info!(worker_id, %task_id, "took over a task the worker still runs");
            }
            _ => stop("its lease changed while it was taken over"),
        }
    }

    /// A task whose worker went away: delivered again as a new attempt (or, lost too often,
    /// its step fails). Only while this coordinator still holds it.
    async fn redeliver_lost(&self, worker_id: &str, task: ReadyTask) {
        if self.inner.leases.stopping() {
            // Shutting down: the lease runs out, and another coordinator takes the task.
            return;
        }
        let (run_id, key) = (task.run_id().to_owned(), task.key.clone());
        let leases = self.inner.leases.writes.lock().await;
        let Some(entry) = self.held_entry(&run_id, &key) else {
            return;
        };
        // The lost attempt's span ends here, so that the worker's span (if it got out) and
        // the next attempt's link have it.
        if let Some(sent) = task.sent()
            && entry.attempt == task.attempt()
        {
            self.trace_attempt(&Answered {
                worker_id,
                attempt: entry.attempt,
                sent: &sent,
                persisting: self.inner.config.clock.now(),
                error: Some("its worker was lost"),
                retry_after_ms: None,
                lost_before: entry.lost,
                abandoned: None,
            });
        }
        let config = &self.inner.config;
        let due = lease::lost(
            &entry,
            self.now_ms(),
            config.lease_ms,
            config.max_lost_deliveries,
        );
        self.claimed(&run_id, &key, entry.encode(), due, Some(task), leases)
            .await;
    }

    /// Stops taking work before the process exits: workers are told to connect to another
    /// coordinator (where the tasks they run are taken over), and the queued tasks are released
    /// so that the other coordinators claim them at once instead of waiting for the leases.
    pub async fn shutdown(&self) {
        self.inner.leases.stop();
        // A jq program running now stops, its transition unwritten: its run is taken up again
        // where it was by the coordinator that claims its continuation (released below).
        self.inner.aborts.abort_all();
        let leases = self.inner.leases.writes.lock().await;
        // Which worker runs each task is written down before the workers are sent away: the
        // coordinator they go to takes a task over only from the worker its entry names, and
        // a task dispatched since the last renewal names none yet.
        self.renew_held(&leases).await;
        self.release_continuations().await;
        let queued = self.inner.hub.goodbye();
        for (task, error) in self.release_queued(queued).await.1 {
            tracing::warn!(run_id = %task.run_id(), task = %task.key, %error, "cannot release a queued task; its lease runs out instead");
        }
        // No slots here any more: other coordinators must not hand tasks to this one.
        self.advertise_no_slots().await;
        drop(leases);
        tracing::info!("coordinator stopping: workers sent elsewhere, queued tasks released");
    }
}
