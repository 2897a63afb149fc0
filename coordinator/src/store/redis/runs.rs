//! [`Runs`] on Redis: a create and a transition are each one script on the run's slot (the
//! index entries and the timer registry, on other slots, written around it), a settle another,
//! and a run read back at one version (`round_trips.rs` says how each goes to Redis).

use std::collections::{BTreeMap, HashMap};

use ::redis::{AsyncCommands, Value};
use baton_core::RunStatus;

use super::indexes::Indexed;
use super::replies::{
    corrupt, fields, list, script_error, take, take_number, take_text, unavailable,
    with_fence_attempt, write_error,
};
use super::scripts::{
    APPLY_TRANSITION, CREATE_RUN, SETTLE_CREATE, SETTLE_TRANSITION, add_transition, evalsha,
    evalsha_sized, transition_size,
};
use super::{RUNNING, RedisStore};
use crate::store::query::run_status;
use crate::store::{Error, RunHeader, Runs, Settled, StoredRun, TransitionWrite};

impl Runs for RedisStore {
    async fn create_run(&self, header: RunHeader, first: TransitionWrite) -> Result<(), Error> {
        let run_id = header.run_id.as_str();
        let keys = self.run_keys(run_id);
        let mut cmd = evalsha(&CREATE_RUN, &keys.create_names());
        cmd.arg(header.workflow.as_str())
            .arg(header.workflow_id.as_str())
            .arg(header.input.as_slice())
            .arg(header.created_ms)
            .arg(header.traceparent.as_str())
            .arg(header.submitted_by.as_str());
        add_transition(&mut cmd, &first, &self.timer_prefix_of(run_id), run_id);
        // Listed before it exists (readers skip an entry whose run does not exist, yet or ever),
        // so that no crash or lost answer leaves a created run out of the indexes: in the same
        // pipeline on one server, first on their own slots on a cluster (nothing is created
        // when they fail) and under `--redis-wait-replicas` (whose pipeline ends in a `WAIT`).
        let (added, written) = if self.con.is_cluster() || self.wait.is_some() {
            let added = self
                .index_new_run(&header, first.status.as_str())
                .await
                .map_err(|err| {
                    Error::Unavailable(format!(
                        "run {run_id} was not created: listing it failed first ({err})"
                    ))
                })?;
            let timers = first
                .tasks_set
                .iter()
                .map(|(_, task)| (run_id, task.as_slice()));
            let (_, written) =
                tokio::join!(self.register_timers(timers), self.write(&CREATE_RUN, &cmd));
            (added, written)
        } else {
            self.index_and_create(&header, first.status.as_str(), &cmd)
                .await
        };
        let written: Result<(u64, _), Error> = written.map_err(|err| {
            with_fence_attempt(write_error(err, run_id, 0, self.con.is_cluster()), &first)
        });
        if landed_or_may_have(&written) {
            self.register_timers(
                first
                    .tasks_set
                    .iter()
                    .map(|(_, task)| (run_id, task.as_slice())),
            )
            .await;
        }
        match written {
            Ok((_version, replicated)) => {
                self.replicated(run_id, replicated).map_err(indeterminate)
            }
            Err(Error::Indeterminate(why)) => Err(Error::Indeterminate(why)),
            // Refused, so not created: the entries this call added name no run.
            Err(refused) => {
                self.unindex(&header, added).await;
                Err(refused)
            }
        }
    }

    async fn apply_transition(
        &self,
        run_id: &str,
        expected_version: u64,
        write: TransitionWrite,
    ) -> Result<u64, Error> {
        let keys = self.run_keys(run_id);
        let timer_prefix = self.timer_prefix_of(run_id);
        let (args, bytes) = transition_size(&write, &timer_prefix, run_id);
        let mut cmd = evalsha_sized(&APPLY_TRANSITION, &keys.names(), (args + 1, bytes + 20));
        cmd.arg(expected_version);
        add_transition(&mut cmd, &write, &timer_prefix, run_id);
        let timers = write
            .tasks_set
            .iter()
            .map(|(_, task)| (run_id, task.as_slice()));
        let (_, written) = tokio::join!(
            self.register_timers(timers),
            self.write(&APPLY_TRANSITION, &cmd)
        );
        let written = written.map_err(|err| {
            with_fence_attempt(
                write_error(err, run_id, expected_version, self.con.is_cluster()),
                &write,
            )
        });
        if landed_or_may_have(&written) {
            self.register_timers(
                write
                    .tasks_set
                    .iter()
                    .map(|(_, task)| (run_id, task.as_slice())),
            )
            .await;
        }
        let ((version, before), replicated): ((u64, String), _) = written?;

        // Most transitions leave a running run running: its index entry is already there, and
        // skipping the update keeps a transition at one round trip.
        if !(before == RUNNING && write.status == RunStatus::Running)
            && let Err(err) = self.update_active(run_id, write.status.as_str()).await
        {
            tracing::warn!(run_id, error = %err, "transition applied but active index not updated; rebuild_indexes repairs it");
        }
        self.replicated(run_id, replicated).map_err(indeterminate)?;
        Ok(version)
    }

    async fn settle_create(&self, header: &RunHeader) -> Result<Settled, Error> {
        let run_id = header.run_id.as_str();
        let keys = self.run_keys(run_id);
        let mut cmd = evalsha(&SETTLE_CREATE, &[keys.run(), keys.void(), keys.barrier()]);
        cmd.arg(if self.wait.is_some() { "1" } else { "0" });
        let (exists, replicated): (u8, _) = self
            .write(&SETTLE_CREATE, &cmd)
            .await
            .map_err(|err| write_error(err, run_id, 0, self.con.is_cluster()))?;
        self.replicated(run_id, replicated).map_err(indeterminate)?;
        if exists == 1 {
            return Ok(Settled::Done);
        }
        // Voided: whatever this run's create listed names no run, and never will.
        self.unindex(header, Indexed::ALL).await;
        Ok(Settled::NotDone)
    }

    async fn settle_transition(
        &self,
        run_id: &str,
        expected_version: u64,
        write_id: &str,
    ) -> Result<Settled, Error> {
        let keys = self.run_keys(run_id);
        let mut cmd = evalsha(&SETTLE_TRANSITION, &[keys.run(), keys.barrier()]);
        cmd.arg(expected_version)
            .arg(write_id)
            .arg(if self.wait.is_some() { "1" } else { "0" });
        let ((outcome, _version), replicated): ((String, u64), _) = self
            .write(&SETTLE_TRANSITION, &cmd)
            .await
            .map_err(|err| write_error(err, run_id, expected_version, self.con.is_cluster()))?;
        self.replicated(run_id, replicated).map_err(indeterminate)?;
        let settled = match outcome.as_str() {
            "done" => Settled::Done,
            "fenced" | "passed" | "gone" => Settled::NotDone,
            "unknown" => Settled::Unknown,
            other => {
                return Err(corrupt(
                    run_id,
                    format!("settle_transition answered {other:?}"),
                ));
            }
        };
        if settled == Settled::Done {
            // The transition's own index update was skipped with its answer; the run's status
            // now says what the active index should.
            let status: Option<String> = self
                .con
                .clone()
                .hget(keys.run(), "status")
                .await
                .map_err(unavailable)?;
            if let Some(status) = status
                && let Err(err) = self.update_active(run_id, &status).await
            {
                tracing::warn!(run_id, error = %err, "settled transition but active index not updated; rebuild_indexes repairs it");
            }
        }
        Ok(settled)
    }

    async fn load_run(&self, run_id: &str) -> Result<Option<StoredRun>, Error> {
        self.read_retrying(|| async {
            let keys = self.run_keys(run_id);
            let mut pipe = ::redis::pipe();
            pipe.cmd("HGETALL")
                .arg(keys.run())
                .cmd("LRANGE")
                .arg(keys.events())
                .arg(0)
                .arg(-1)
                .cmd("HGETALL")
                .arg(keys.results())
                .cmd("HGETALL")
                .arg(keys.steps())
                .cmd("HGETALL")
                .arg(keys.tasks())
                .cmd("LRANGE")
                .arg(keys.chain())
                .arg(0)
                .arg(-1);
            let replies: Vec<Value> = match self.wait {
                None => self.read_unchanging(run_id, &keys, pipe).await?,
                Some(_) => self.read_replicated(run_id, &keys, pipe).await?,
            };
            let Ok([run, events, results, steps, tasks, chain]) = <[Value; 6]>::try_from(replies)
            else {
                return Err(corrupt(
                    run_id,
                    "its keys read back as the wrong number of replies",
                ));
            };

            let mut hash: HashMap<String, Vec<u8>> = fields(run_id, "header", run)?;
            if hash.is_empty() {
                return Ok(None);
            }
            let header = RunHeader {
                run_id: run_id.to_owned(),
                workflow_id: take_text(run_id, &mut hash, "workflow_id")?,
                workflow: take_text(run_id, &mut hash, "workflow")?,
                input: take(run_id, &mut hash, "input")?,
                created_ms: take_number(run_id, &mut hash, "created_ms")?,
                // Absent in runs created before runs were traced.
                traceparent: hash
                    .remove("traceparent")
                    .and_then(|bytes| String::from_utf8(bytes).ok())
                    .unwrap_or_default(),
                // Absent in runs created before principals.
                submitted_by: hash
                    .remove("submitted_by")
                    .and_then(|bytes| String::from_utf8(bytes).ok())
                    .unwrap_or_default(),
            };
            let error = match hash.remove("error") {
                Some(error) => Some(
                    String::from_utf8(error)
                        .map_err(|_| corrupt(run_id, "its error is not UTF-8"))?,
                ),
                None => None,
            };
            let events = list(run_id, "events", events)?;
            let links = list(run_id, "chain", chain)?;
            Ok(Some(StoredRun {
                version: take_number(run_id, &mut hash, "version")?,
                status: {
                    let status = take_text(run_id, &mut hash, "status")?;
                    run_status(&status).ok_or_else(|| {
                        corrupt(run_id, format!("its status {status:?} is not a run status"))
                    })?
                },
                error,
                state_sha256: take_text(run_id, &mut hash, "state_sha256")?,
                updated_ms: take_number(run_id, &mut hash, "updated_ms")?,
                events,
                results: fields(run_id, "results", results)?,
                steps: fields::<BTreeMap<_, _>>(run_id, "steps", steps)?,
                tasks: fields::<BTreeMap<_, _>>(run_id, "tasks", tasks)?,
                links,
                header,
            }))
        })
        .await
    }

    /// Under `--redis-wait-replicas` behind the same barrier as `load_run`: `GetRun` answers
    /// from it, and a master that restarted empty and still claims its slots for a moment would
    /// otherwise say that an acknowledged run does not exist.
    async fn version(&self, run_id: &str) -> Result<Option<u64>, Error> {
        self.read_retrying(|| async {
            let keys = self.run_keys(run_id);
            if self.wait.is_some() {
                let mut read = ::redis::pipe();
                read.cmd("HGET").arg(keys.run()).arg("version");
                let (version,): (Option<u64>,) = self.read_replicated(run_id, &keys, read).await?;
                return Ok(version);
            }
            let mut con = self.con.clone();
            con.hget(keys.run(), "version")
                .await
                .map_err(|err| script_error(err, run_id, 0))
        })
        .await
    }

    async fn add_principal_run(&self, principal: &str, run_id: &str) -> Result<(), Error> {
        let mut con = self.con.clone();
        let _: i64 = con
            .sadd(self.principal_runs_key(principal), run_id)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn running_runs_of(&self, principal: &str) -> Result<usize, Error> {
        let key = self.principal_runs_key(principal);
        let mut con = self.con.clone();
        let ids: Vec<String> = con.smembers(&key).await.map_err(unavailable)?;
        if ids.is_empty() {
            return Ok(0);
        }
        let running = self.running(&ids).await?;
        let ended: Vec<&String> = ids
            .iter()
            .zip(running)
            .filter(|(_, running)| !running)
            .map(|(run_id, _)| run_id)
            .collect();
        if !ended.is_empty() {
            let _: i64 = con.srem(&key, &ended).await.map_err(unavailable)?;
        }
        Ok(ids.len() - ended.len())
    }
}

impl RedisStore {
    /// Whether each of `run_ids` is running now, in one round trip (concurrent reads on a
    /// cluster).
    pub(super) async fn running(&self, run_ids: &[String]) -> Result<Vec<bool>, Error> {
        let reads = run_ids
            .iter()
            .map(|run_id| {
                let mut cmd = ::redis::cmd("HGET");
                cmd.arg(self.run_keys(run_id).run()).arg("status");
                cmd
            })
            .collect();
        let statuses: Vec<Option<Vec<u8>>> = self.con.each(reads).await.map_err(unavailable)?;
        Ok(statuses
            .into_iter()
            .map(|status| status.as_deref() == Some(RUNNING.as_bytes()))
            .collect())
    }
}

/// Whether a write may have been done, so that the timers it wrote must be findable by sweeps:
/// it was applied, or its answer was lost on the way and it may have been (unless the script
/// itself refused it, or Redis answered that it ran nothing). Registering the slot of a timer
/// that was never written costs a sweep finding it empty; leaving a written timer unregistered
/// leaves its task unswept until the next repair, minutes away if the writer dies meanwhile.
fn landed_or_may_have<T>(written: &Result<T, Error>) -> bool {
    matches!(
        written,
        Ok(_) | Err(Error::Indeterminate(_) | Error::Unavailable(_))
    )
}

/// A write that reached its master but not the replicas asked for: done there, and perhaps
/// lost by a failover, so neither done nor not done as far as the caller can tell.
fn indeterminate(error: Error) -> Error {
    match error {
        Error::Unavailable(why) => Error::Indeterminate(why),
        other => other,
    }
}
