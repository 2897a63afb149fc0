//! `impl Store for RedisStore`: each call of the [`Store`] contract as commands and scripts on the
//! layout of the [module docs](super).

use std::collections::{BTreeMap, HashMap};

use ::redis::{AsyncCommands, Cmd, FromRedisValue, RedisError, Script, Value};

use super::indexes::Indexed;
use super::output::{read_entries, read_streams};
use super::replies::{
    corrupt, fields, list, script_error, take, take_number, take_text, unavailable,
    with_fence_attempt, write_error,
};
use super::scripts::{
    APPEND_OUTPUT, APPLY_TRANSITION, CREATE_RUN, DUE_TASKS, RECLAIM_KEY, SETTLE_CREATE,
    SETTLE_TRANSITION, SWAP_TASKS, add_transition, eval, evalsha,
};
use super::slots::slot_of_tag;
use super::timers::{due_tasks, read_due};
use super::{BLOCKING_RESPONSE_TIMEOUT, CLUSTER_OUTPUT_POLL, RUNNING, RedisStore};
use crate::store::{
    Claim, DueTask, Error, OUTPUT_MAX_BYTES, OutputOffset, OutputPiece, RunHeader, RunPage,
    RunQuery, Settled, Store, StoredRun, TaskSwap, TransitionWrite,
};

impl Store for RedisStore {
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
                .index_new_run(&header, &first.status)
                .await
                .map_err(|err| {
                    Error::Unavailable(format!(
                        "run {run_id} was not created: listing it failed first ({err})"
                    ))
                })?;
            (added, self.write(&CREATE_RUN, &cmd).await)
        } else {
            self.index_and_create(&header, &first.status, &cmd).await
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
        let mut cmd = evalsha(&APPLY_TRANSITION, &keys.names());
        cmd.arg(expected_version);
        add_transition(&mut cmd, &write, &self.timer_prefix_of(run_id), run_id);
        let written = self.write(&APPLY_TRANSITION, &cmd).await.map_err(|err| {
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
        if !(before == RUNNING && write.status == RUNNING)
            && let Err(err) = self.update_active(run_id, &write.status).await
        {
            tracing::warn!(run_id, error = %err, "transition applied but active index not updated; rebuild_indexes repairs it");
        }
        self.replicated(run_id, replicated).map_err(indeterminate)?;
        Ok(version)
    }

    async fn settle_create(&self, header: &RunHeader) -> Result<Settled, Error> {
        let run_id = header.run_id.as_str();
        let keys = self.run_keys(run_id);
        let mut cmd = evalsha(&SETTLE_CREATE, &[&keys.run, &keys.void, &keys.barrier]);
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
        let mut cmd = evalsha(&SETTLE_TRANSITION, &[&keys.run, &keys.barrier]);
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
                .hget(&keys.run, "status")
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
                .arg(&keys.run)
                .cmd("LRANGE")
                .arg(&keys.events)
                .arg(0)
                .arg(-1)
                .cmd("HGETALL")
                .arg(&keys.results)
                .cmd("HGETALL")
                .arg(&keys.steps)
                .cmd("HGETALL")
                .arg(&keys.tasks)
                .cmd("LRANGE")
                .arg(&keys.chain)
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
                status: take_text(run_id, &mut hash, "status")?,
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

    async fn swap_tasks(&self, swaps: Vec<TaskSwap>) -> Result<Vec<bool>, Error> {
        if swaps.is_empty() {
            return Ok(Vec::new());
        }
        // One script per slot on a cluster (each swap stands on its own, so splitting the batch
        // changes nothing the contract promises); one for the whole batch on a server.
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (index, swap) in swaps.iter().enumerate() {
            let slot = if self.con.is_cluster() {
                slot_of_tag(&swap.run_id)
            } else {
                0
            };
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, members)) => members.push(index),
                None => groups.push((slot, vec![index])),
            }
        }
        let calls = groups.iter().map(|(_, members)| {
            let tasks: Vec<String> = members
                .iter()
                .map(|&i| self.run_keys(&swaps[i].run_id).tasks)
                .collect();
            let names: Vec<&str> = tasks.iter().map(String::as_str).collect();
            let mut cmd = evalsha(&SWAP_TASKS, &names);
            cmd.arg(self.timer_prefix_of(&swaps[members[0]].run_id));
            for &i in members {
                let swap = &swaps[i];
                cmd.arg(format!("{}/{}", swap.run_id, swap.task_key))
                    .arg(swap.task_key.as_str())
                    .arg(swap.expected.as_slice());
                match &swap.new {
                    Some(bytes) => cmd.arg("1").arg(bytes.as_slice()),
                    None => cmd.arg("0").arg(""),
                };
            }
            let mut con = self.con.clone();
            async move { eval::<Vec<i64>>(&mut con, &SWAP_TASKS, &cmd).await }
        });
        let replies = futures::future::join_all(calls).await;
        let mut swapped = vec![false; swaps.len()];
        // Swaps to register: those done, and those of a group whose answer was lost.
        let mut timed = vec![false; swaps.len()];
        let mut failure = None;
        for ((_, members), reply) in groups.iter().zip(replies) {
            match reply.map_err(|err| script_error(err, &swaps[members[0]].run_id, 0)) {
                Ok(reply) => {
                    for (&i, done) in members.iter().zip(reply) {
                        swapped[i] = done == 1;
                        timed[i] = done == 1;
                    }
                }
                Err(error) => {
                    let unknown = matches!(error, Error::Unavailable(_));
                    for &i in members {
                        timed[i] = unknown;
                    }
                    failure.get_or_insert(error);
                }
            }
        }
        self.register_timers(swaps.iter().zip(&timed).filter_map(|(swap, &timed)| {
            Some((swap.run_id.as_str(), swap.new.as_deref().filter(|_| timed)?))
        }))
        .await;
        match failure {
            Some(error) => Err(error),
            None => Ok(swapped),
        }
    }

    async fn due_tasks(
        &self,
        agent: &str,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<DueTask>, Error> {
        self.read_retrying(|| async {
            if limit == 0 {
                return Ok(Vec::new());
            }
            if self.con.is_cluster() {
                return self.cluster_due_tasks(agent, now_ms, limit).await;
            }
            let mut con = self.con.clone();
            let reply: Vec<Vec<u8>> = DUE_TASKS
                .key(self.agent_timers_key(agent))
                .arg(now_ms)
                .arg(limit.min(i64::MAX as usize))
                .arg(self.run_key_prefix())
                .invoke_async(&mut con)
                .await
                .map_err(unavailable)?;
            let (_, due) = read_due(agent, reply)?;
            Ok(due_tasks(due))
        })
        .await
    }

    async fn task(&self, run_id: &str, task_key: &str) -> Result<Option<Vec<u8>>, Error> {
        self.read_retrying(|| async {
            let mut con = self.con.clone();
            con.hget(self.run_keys(run_id).tasks, task_key)
                .await
                .map_err(|err| script_error(err, run_id, 0))
        })
        .await
    }

    async fn tasks(&self, run_id: &str) -> Result<BTreeMap<String, Vec<u8>>, Error> {
        self.read_retrying(|| async {
            let mut con = self.con.clone();
            con.hgetall(self.run_keys(run_id).tasks)
                .await
                .map_err(|err| script_error(err, run_id, 0))
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
                read.cmd("HGET").arg(&keys.run).arg("version");
                let (version,): (Option<u64>,) = self.read_replicated(run_id, &keys, read).await?;
                return Ok(version);
            }
            let mut con = self.con.clone();
            con.hget(keys.run, "version")
                .await
                .map_err(|err| script_error(err, run_id, 0))
        })
        .await
    }

    async fn list_runs(&self, query: RunQuery) -> Result<RunPage, Error> {
        self.read_retrying(|| self.list_page(&query)).await
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

    async fn advertise_slots(
        &self,
        coordinator: &str,
        free: BTreeMap<String, usize>,
        expires_ms: i64,
    ) -> Result<(), Error> {
        let advertisement = serde_json::json!({"expires_ms": expires_ms, "free": free});
        let mut con = self.con.clone();
        let _: i64 = con
            .hset(self.slots_key(), coordinator, advertisement.to_string())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// Expired advertisements (of coordinators that stopped) are removed on the way.
    async fn slots_elsewhere(
        &self,
        me: &str,
        now_ms: i64,
    ) -> Result<BTreeMap<String, usize>, Error> {
        #[derive(serde::Deserialize)]
        struct Advertisement {
            expires_ms: i64,
            free: BTreeMap<String, usize>,
        }
        let mut con = self.con.clone();
        let all: HashMap<String, String> =
            con.hgetall(self.slots_key()).await.map_err(unavailable)?;
        let mut live = Vec::new();
        let mut expired = Vec::new();
        for (coordinator, text) in all {
            match serde_json::from_str::<Advertisement>(&text) {
                Ok(ad) if ad.expires_ms > now_ms => {
                    if coordinator != me {
                        live.push(ad.free);
                    }
                }
                _ => expired.push(coordinator),
            }
        }
        if !expired.is_empty() {
            let _: i64 = con
                .hdel(self.slots_key(), &expired)
                .await
                .map_err(unavailable)?;
        }
        Ok(crate::store::sum_slots(&live))
    }

    /// A write, not a `PING`: a Redis out of memory answers `PING` and every read, and refuses
    /// every write. On a cluster, one write to each master (the key of a slot it serves), since
    /// any of them may be the one that is full. Not retried: readiness wants to know whether
    /// Redis takes writes now.
    async fn ping(&self) -> Result<(), Error> {
        let slots = if self.con.is_cluster() {
            self.con
                .master_slots()
                .await
                .map_err(unavailable)?
                .into_iter()
                .map(Some)
                .collect()
        } else {
            vec![None]
        };
        let probes = slots
            .into_iter()
            .map(|slot| {
                let mut cmd = ::redis::cmd("SET");
                cmd.arg(self.probe_key(slot))
                    .arg(1)
                    .arg("PX")
                    .arg(PROBE_TTL_MS);
                cmd
            })
            .collect();
        let _: Vec<String> = self.con.each(probes).await.map_err(unavailable)?;
        Ok(())
    }

    async fn active_runs(&self) -> Result<Vec<String>, Error> {
        self.read_retrying(|| async {
            let reads = self
                .active_keys()
                .into_iter()
                .map(|key| {
                    let mut cmd = ::redis::cmd("SMEMBERS");
                    cmd.arg(key);
                    cmd
                })
                .collect();
            let shards: Vec<Vec<String>> = self.con.each(reads).await.map_err(unavailable)?;
            let mut ids: Vec<String> = shards.into_iter().flatten().collect();
            if ids.is_empty() {
                return Ok(ids);
            }
            let mut running = self.running(&ids).await?.into_iter();
            ids.retain(|_| running.next().unwrap_or(false));
            ids.sort();
            Ok(ids)
        })
        .await
    }

    async fn decisions(&self, run_id: &str) -> Result<BTreeMap<String, Vec<u8>>, Error> {
        self.read_retrying(|| async {
            let mut con = self.con.clone();
            let reply: Value = ::redis::cmd("HGETALL")
                .arg(self.run_keys(run_id).decisions)
                .query_async(&mut con)
                .await
                .map_err(|err| script_error(err, run_id, 0))?;
            fields(run_id, "decisions", reply)
        })
        .await
    }

    async fn claim_idempotency_key(
        &self,
        key: &str,
        run_id: &str,
        request_sha256: &str,
        ttl_s: u64,
    ) -> Result<Claim, Error> {
        let mut con = self.con.clone();
        let redis_key = self.idempotency_key(key);
        let value = format!("{run_id} {request_sha256}");
        // SET NX, else GET; a key that expires between the two is claimed on the next try.
        for _ in 0..3 {
            let set: Option<String> = ::redis::cmd("SET")
                .arg(&redis_key)
                .arg(&value)
                .arg("NX")
                .arg("EX")
                .arg(ttl_s.max(1))
                .query_async(&mut con)
                .await
                .map_err(unavailable)?;
            if set.is_some() {
                return Ok(Claim::Claimed);
            }
            let held: Option<String> = con.get(&redis_key).await.map_err(unavailable)?;
            if let Some(held) = held {
                let (run_id, request_sha256) = held.split_once(' ').ok_or_else(|| {
                    Error::Corrupt(format!("idempotency key {key:?} holds {held:?}"))
                })?;
                return Ok(Claim::Held {
                    run_id: run_id.to_owned(),
                    request_sha256: request_sha256.to_owned(),
                });
            }
        }
        Err(Error::Unavailable(format!(
            "idempotency key {key:?} kept expiring while it was claimed"
        )))
    }

    async fn reclaim_idempotency_key(
        &self,
        key: &str,
        voided_run_id: &str,
        run_id: &str,
        request_sha256: &str,
        ttl_s: u64,
    ) -> Result<Claim, Error> {
        let mut con = self.con.clone();
        let reply: Value = RECLAIM_KEY
            .key(self.idempotency_key(key))
            .arg(format!("{voided_run_id} {request_sha256}"))
            .arg(format!("{run_id} {request_sha256}"))
            .arg(ttl_s.max(1))
            .invoke_async(&mut con)
            .await
            .map_err(unavailable)?;
        let held: String = match reply {
            Value::Int(1) => return Ok(Claim::Claimed),
            other => FromRedisValue::from_redis_value(other)
                .map_err(|err| Error::Corrupt(format!("idempotency key {key:?}: {err}")))?,
        };
        let (run_id, request_sha256) = held
            .split_once(' ')
            .ok_or_else(|| Error::Corrupt(format!("idempotency key {key:?} holds {held:?}")))?;
        Ok(Claim::Held {
            run_id: run_id.to_owned(),
            request_sha256: request_sha256.to_owned(),
        })
    }

    async fn runs_of_workflow(
        &self,
        workflow_id: &str,
        limit: usize,
    ) -> Result<Vec<String>, Error> {
        self.newest(self.workflow_runs_keys(workflow_id), limit)
            .await
    }

    async fn append_output(&self, pieces: Vec<(String, OutputPiece)>) -> Result<(), Error> {
        // One script call per run's consecutive pieces: each run's stay in order.
        let mut by_run: Vec<(String, Vec<OutputPiece>)> = Vec::new();
        for (run_id, piece) in pieces {
            match by_run.last_mut() {
                Some((last, run_pieces)) if *last == run_id => run_pieces.push(piece),
                _ => by_run.push((run_id, vec![piece])),
            }
        }
        let mut con = self.con.clone();
        for (run_id, pieces) in &by_run {
            let keys = self.run_keys(run_id);
            let mut invocation = APPEND_OUTPUT.prepare_invoke();
            invocation
                .key(&keys.run)
                .key(&keys.output)
                .arg(OUTPUT_MAX_BYTES);
            for piece in pieces {
                invocation
                    .arg(piece.step_id.as_str())
                    .arg(piece.visit)
                    .arg(piece.attempt)
                    .arg(piece.text.as_str())
                    .arg(if piece.restart { "1" } else { "0" });
            }
            let _appended: u64 = invocation
                .invoke_async(&mut con)
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }

    async fn read_output(
        &self,
        run_id: &str,
        after: Option<OutputOffset>,
    ) -> Result<Vec<(OutputOffset, OutputPiece)>, Error> {
        self.read_retrying(|| async {
            let start = match after {
                Some(offset) => format!("({offset}"),
                None => "-".to_owned(),
            };
            let mut con = self.con.clone();
            let reply: Value = ::redis::cmd("XRANGE")
                .arg(self.run_keys(run_id).output)
                .arg(start)
                .arg("+")
                .query_async(&mut con)
                .await
                .map_err(unavailable)?;
            read_entries(run_id, reply)
        })
        .await
    }

    async fn wait_output(
        &self,
        after: Vec<(String, OutputOffset)>,
        block: std::time::Duration,
    ) -> Result<Vec<(String, OutputOffset, OutputPiece)>, Error> {
        if after.is_empty() {
            tokio::time::sleep(block).await;
            return Ok(Vec::new());
        }
        let block = block.min(BLOCKING_RESPONSE_TIMEOUT / 2);
        let by_key: HashMap<String, &str> = after
            .iter()
            .map(|(run_id, _)| (self.run_keys(run_id).output, run_id.as_str()))
            .collect();
        let lookup = |key: &str| by_key.get(key).map(|run_id| run_id.to_string());
        if self.con.is_cluster() {
            // The runs' streams are on many slots, and a blocking read would hold a node's one
            // connection: read each stream without blocking, every CLUSTER_OUTPUT_POLL.
            let deadline = tokio::time::Instant::now() + block;
            loop {
                let reads = after
                    .iter()
                    .map(|(run_id, offset)| {
                        let mut cmd = ::redis::cmd("XREAD");
                        cmd.arg("STREAMS")
                            .arg(self.run_keys(run_id).output)
                            .arg(offset.to_string());
                        cmd
                    })
                    .collect();
                let replies: Vec<Value> = self.con.each(reads).await.map_err(unavailable)?;
                let mut pieces = Vec::new();
                for reply in replies {
                    pieces.extend(read_streams(reply, lookup)?);
                }
                if !pieces.is_empty() || tokio::time::Instant::now() >= deadline {
                    return Ok(pieces);
                }
                tokio::time::sleep_until(
                    deadline.min(tokio::time::Instant::now() + CLUSTER_OUTPUT_POLL),
                )
                .await;
            }
        }
        let mut command = ::redis::cmd("XREAD");
        command
            .arg("BLOCK")
            .arg(block.as_millis().max(1) as u64)
            .arg("STREAMS");
        for (run_id, _) in &after {
            command.arg(self.run_keys(run_id).output);
        }
        for (_, offset) in &after {
            command.arg(offset.to_string());
        }
        let mut con = self.blocking.clone();
        let reply: Value = command.query_async(&mut con).await.map_err(unavailable)?;
        read_streams(reply, lookup)
    }
}

impl RedisStore {
    /// Whether each of `run_ids` is running now, in one round trip (concurrent reads on a
    /// cluster).
    async fn running(&self, run_ids: &[String]) -> Result<Vec<bool>, Error> {
        let reads = run_ids
            .iter()
            .map(|run_id| {
                let mut cmd = ::redis::cmd("HGET");
                cmd.arg(self.run_keys(run_id).run).arg("status");
                cmd
            })
            .collect();
        let statuses: Vec<Option<Vec<u8>>> = self.con.each(reads).await.map_err(unavailable)?;
        Ok(statuses
            .into_iter()
            .map(|status| status.as_deref() == Some(RUNNING.as_bytes()))
            .collect())
    }

    /// Sends `cmd`, an `EVALSHA` of `script` that writes, and with `--redis-wait-replicas` a
    /// `WAIT` right behind it on the same connection, one of the `writers` (a pipeline goes to
    /// one node: the master that ran the script, so the `WAIT` counts that write). Returns the script's reply and, when
    /// waiting, how many replicas acknowledged.
    async fn write<T: FromRedisValue>(
        &self,
        script: &Script,
        cmd: &Cmd,
    ) -> Result<(T, Option<u32>), RedisError> {
        if self.wait.is_none() {
            return Ok((eval(&mut self.con.clone(), script, cmd).await?, None));
        }
        let mut pipe = ::redis::pipe();
        pipe.add_command(cmd.clone());
        let (mut replies, acked) = self.send_waiting(pipe, Some(script)).await?;
        let reply = FromRedisValue::from_redis_value(replies.remove(0))?;
        Ok((reply, Some(acked)))
    }

    /// On one server without `WAIT`: a new run's index entries and its `create_run` (`cmd`) in
    /// one pipeline, so one round trip, the entries before the run. Which entries it added
    /// (all, when the answer was lost), and the script's reply; an entry that could not be
    /// written (a key of another type) is logged, the run is created all the same.
    async fn index_and_create(
        &self,
        header: &RunHeader,
        status: &str,
        cmd: &Cmd,
    ) -> (Indexed, Result<(u64, Option<u32>), RedisError>) {
        let run_id = header.run_id.as_str();
        let index = self.index_commands(header, status);
        let mut pipe = ::redis::pipe();
        for command in &index {
            pipe.add_command(command.clone());
        }
        pipe.add_command(cmd.clone()).ignore_errors();
        let mut con = self.con.clone();
        let mut added = Indexed::from_replies(&[]);
        let mut loaded = false;
        loop {
            let replies: Vec<::redis::RedisResult<Value>> = match pipe.query_async(&mut con).await {
                Ok(replies) => replies,
                Err(err) => return (added, Err(err)),
            };
            let mut replies = replies
                .into_iter()
                .map(|reply| reply.and_then(Value::extract_error));
            let indexed: Vec<i64> = replies
                .by_ref()
                .take(index.len())
                .map(|reply| match reply.and_then(|value| Ok(i64::from_redis_value(value)?)) {
                    Ok(added) => added,
                    Err(err) => {
                        tracing::warn!(run_id, error = %err, "a new run's index entry was not written; rebuild_indexes repairs it");
                        0
                    }
                })
                .collect();
            added = added.and(Indexed::from_replies(&indexed));
            let created = replies
                .next()
                .unwrap_or_else(|| Err((::redis::ErrorKind::Parse, "no reply").into()));
            match created {
                Err(err)
                    if !loaded
                        && err.kind()
                            == ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoScript) =>
                {
                    // Sent again once the script is loaded: the entries are `NX`, the same.
                    if let Err(err) = CREATE_RUN.load_async(&mut con).await {
                        return (added, Err(err));
                    }
                    loaded = true;
                }
                other => {
                    return (
                        added,
                        other
                            .and_then(|value| Ok(u64::from_redis_value(value)?))
                            .map(|version| (version, None)),
                    );
                }
            }
        }
    }

    /// `reads` of a run's keys (the first the header's `HGETALL`), as they stood at one version
    /// of the run, without `MULTI`: a Redis out of memory refuses every command queued in a
    /// `MULTI`, reads too, and reads must not depend on writes. The reads go in one pipeline with
    /// the header's version read once more behind them: every change to a run's keys but its
    /// tasks raises the version in the same script, so the same version before and after means
    /// no transition came in between (a task swapped meanwhile changes the tasks hash alone,
    /// read by one command: as if it came before or after the read). A run that changed under
    /// the reads is read again; one that keeps changing, once in a `MULTI`.
    async fn read_unchanging(
        &self,
        run_id: &str,
        keys: &super::keys::RunKeys,
        reads: ::redis::Pipeline,
    ) -> Result<Vec<Value>, Error> {
        let mut con = self.con.clone();
        for _ in 0..UNCHANGING_READS {
            let mut pipe = reads.clone();
            pipe.cmd("HGET").arg(&keys.run).arg("version");
            let mut replies: Vec<Value> = pipe
                .query_async(&mut con)
                .await
                .map_err(|err| script_error(err, run_id, 0))?;
            let after = replies.pop();
            let before = replies
                .first()
                .and_then(|header| hash_field(header, b"version"));
            if before == after.as_ref().and_then(bytes_of) {
                return Ok(replies);
            }
        }
        reads
            .clone()
            .atomic()
            .query_async(&mut con)
            .await
            .map_err(|err| script_error(err, run_id, 0))
    }

    /// A run read back under `--redis-wait-replicas`: the reads in a `MULTI`, then a write to
    /// the run's slot (`P:run:{R}:barrier`, expiring), then `WAIT`, all on one connection to one
    /// master. Replication is in order, so once replicas have the barrier they have everything
    /// the read saw; short of them, the read may show a transition that a failover will lose (a
    /// master cut off from its replicas still answers for a while), and it is refused rather than
    /// shown to a watcher or acted on.
    async fn read_replicated<T: FromRedisValue>(
        &self,
        run_id: &str,
        keys: &super::keys::RunKeys,
        reads: ::redis::Pipeline,
    ) -> Result<T, Error> {
        let mut pipe = ::redis::pipe();
        pipe.cmd("MULTI");
        for read in reads.cmd_iter() {
            pipe.add_command(read.clone());
        }
        pipe.cmd("EXEC")
            .cmd("SET")
            .arg(&keys.barrier)
            .arg(1)
            .arg("PX")
            .arg(BARRIER_TTL_MS);
        let (mut replies, acked) = self
            .send_waiting(pipe, None)
            .await
            .map_err(|err| script_error(err, run_id, 0))?;
        self.replicated(run_id, Some(acked))?;
        // MULTI, each read's QUEUED, EXEC's replies, the barrier's OK.
        let exec = replies.len().saturating_sub(2);
        FromRedisValue::from_redis_value(replies.swap_remove(exec))
            .map_err(|err| script_error(err.into(), run_id, 0))
    }

    /// Sends `pipe` and a `WAIT` behind it on one of the `writers`, loading `script` where Redis
    /// does not know it; returns every reply of `pipe` and how many replicas acknowledged.
    ///
    /// Every reply is looked at: on a cluster whose topology the client has not caught up with,
    /// the pipeline can reach a master that became a replica, which runs the reads, redirects the
    /// writes and refuses `WAIT`; nothing was written there, and the pipeline is sent again.
    async fn send_waiting(
        &self,
        mut pipe: ::redis::Pipeline,
        script: Option<&Script>,
    ) -> Result<(Vec<Value>, u32), RedisError> {
        let wait = self.wait.expect("only called with --redis-wait-replicas");
        let turn = self
            .next_writer
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut con = self.writers[turn % self.writers.len()].clone();
        pipe.cmd("WAIT")
            .arg(wait.replicas)
            .arg(wait.timeout.as_millis().max(1) as u64)
            .ignore_errors();
        let mut loaded = false;
        let mut redirected = 0;
        loop {
            let replies: Vec<::redis::RedisResult<Value>> = pipe.query_async(&mut con).await?;
            // An error reply may also come as a value (`Value::ServerError`), at any depth.
            let replies: Vec<::redis::RedisResult<Value>> = replies
                .into_iter()
                .map(|reply| reply.and_then(Value::extract_error))
                .collect();
            let first_error = replies.iter().find_map(|reply| reply.as_ref().err());
            match first_error {
                Some(err)
                    if !loaded
                        && err.kind()
                            == ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoScript) =>
                {
                    if let Some(script) = script {
                        script.load_async(&mut con).await?;
                    }
                    loaded = true;
                }
                // The cluster client follows redirections of single commands, not of a pipeline;
                // the first error says nothing before it wrote, so sending it again is safe.
                Some(err) if redirected < PIPELINE_REDIRECTIONS && not_run_here(err) => {
                    redirected += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(50 * redirected)).await;
                }
                Some(err) => return Err(err.clone()),
                None => {
                    // Only a `WAIT` in the same pipeline as the write counts: one sent on its own
                    // could reach a connection made since (a reconnect, a replaced cluster
                    // client) that wrote nothing, and answer at once with the replicas connected.
                    let mut replies: Vec<Value> = replies.into_iter().flatten().collect();
                    let acked: u32 =
                        FromRedisValue::from_redis_value(replies.pop().unwrap_or(Value::Nil))?;
                    return Ok((replies, acked));
                }
            }
        }
    }

    /// A write's verdict under `--redis-wait-replicas`: short of the replicas asked for, it is
    /// not written as far as the caller knows.
    fn replicated(&self, run_id: &str, acked: Option<u32>) -> Result<(), Error> {
        match (self.wait, acked) {
            (Some(wait), Some(acked)) if acked < wait.replicas => Err(Error::Unavailable(format!(
                "run {run_id}: {acked} of the {} replicas asked for had it within {} ms \
                 (--redis-wait-replicas); it may be lost if its master fails, so it is not \
                 acted on",
                wait.replicas,
                wait.timeout.as_millis()
            ))),
            _ => Ok(()),
        }
    }
}

/// How many times `load_run` reads a run that changed under its reads before it reads it in a
/// `MULTI`: on one server a pipeline's commands run back to back unless another client's
/// command comes between, so once is nearly always enough.
const UNCHANGING_READS: usize = 3;

/// The value of `field` in a hash reply (`HGETALL`), as bytes.
fn hash_field<'a>(hash: &'a Value, field: &[u8]) -> Option<&'a [u8]> {
    match hash {
        Value::Map(pairs) => pairs
            .iter()
            .find(|(name, _)| bytes_of(name) == Some(field))
            .and_then(|(_, value)| bytes_of(value)),
        Value::Array(items) => items
            .chunks(2)
            .find(|pair| pair.first().and_then(bytes_of) == Some(field))
            .and_then(|pair| pair.get(1).and_then(bytes_of)),
        _ => None,
    }
}

fn bytes_of(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.as_bytes()),
        _ => None,
    }
}

/// How long a readiness probe's key (`P:ready`) is kept: it is never read, only written.
const PROBE_TTL_MS: u64 = 60_000;

/// How long a read's replication barrier (`P:run:{R}:barrier`) is kept: long enough for its
/// `WAIT`, short enough that barriers of finished runs go by themselves.
const BARRIER_TTL_MS: u64 = 10_000;

/// How many times a waiting write is sent again after Redis answered that the script's slot is
/// elsewhere or not served right now.
const PIPELINE_REDIRECTIONS: u64 = 10;

/// Whether `err` says a command was not run because its slot is served elsewhere (`MOVED`,
/// `ASK`, or `READONLY` from a master that became a replica), is being migrated (`TRYAGAIN`) or
/// is not served at all right now (`CLUSTERDOWN`).
fn not_run_here(err: &RedisError) -> bool {
    use ::redis::ServerErrorKind::{Ask, ClusterDown, Moved, ReadOnly, TryAgain};
    matches!(
        err.kind(),
        ::redis::ErrorKind::Server(Moved | Ask | TryAgain | ClusterDown | ReadOnly)
    )
}

/// Whether a script's timers may be in the store: it was applied, or its answer was lost on the
/// way and it may have been. Registering a slot that holds no timer costs a sweep one read;
/// leaving a written timer unregistered leaves its task unswept until the next repair, minutes
/// away if the writer dies meanwhile.
/// Whether a write may have been done, so that the timers it wrote must be findable by sweeps:
/// unless the script itself refused it, or Redis answered that it ran nothing. Registering the
/// slot of a timer that was never written costs a sweep finding it empty.
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
