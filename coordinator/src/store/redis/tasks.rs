//! [`Tasks`] on Redis: a batch of swaps in one script (one per slot on a cluster), an agent's
//! due timers and their tasks in one (`timers.rs` for a cluster's), and a run's tasks hash read.

use std::collections::BTreeMap;

use ::redis::AsyncCommands;

use super::RedisStore;
use super::replies::{script_error, unavailable};
use super::scripts::{DUE_TASKS, SWAP_TASKS, eval, evalsha};
use super::slots::slot_of_tag;
use super::timers::{DueReply, due_tasks, read_due};
use crate::store::{DueTask, Error, TaskSwap, Tasks};

impl Tasks for RedisStore {
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
                .map(|&i| self.run_keys(&swaps[i].run_id).tasks().to_owned())
                .collect();
            let names: Vec<&str> = tasks.iter().map(String::as_str).collect();
            let mut cmd = evalsha(&SWAP_TASKS, &names);
            cmd.arg(self.timer_prefix_of(&swaps[members[0]].run_id).as_ref());
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
        let timers = swaps
            .iter()
            .filter_map(|swap| Some((swap.run_id.as_str(), swap.new.as_deref()?)));
        let (_, replies) = tokio::join!(
            self.register_timers(timers),
            futures::future::join_all(calls)
        );
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
            let key = self.agent_timers_key(agent);
            let reply: DueReply = DUE_TASKS
                .key(&key)
                .arg(now_ms)
                .arg(limit.min(i64::MAX as usize))
                .arg(self.run_key_prefix())
                .invoke_async(&mut con)
                .await
                .map_err(unavailable)?;
            let (_, due, gone) = read_due(agent, reply)?;
            self.remove_gone_timers(&key, gone).await?;
            Ok(due_tasks(due))
        })
        .await
    }

    async fn task(&self, run_id: &str, task_key: &str) -> Result<Option<Vec<u8>>, Error> {
        self.read_retrying(|| async {
            let mut con = self.con.clone();
            con.hget(self.run_keys(run_id).tasks(), task_key)
                .await
                .map_err(|err| script_error(err, run_id, 0))
        })
        .await
    }

    async fn tasks(&self, run_id: &str) -> Result<BTreeMap<String, Vec<u8>>, Error> {
        self.read_retrying(|| async {
            let mut con = self.con.clone();
            con.hgetall(self.run_keys(run_id).tasks())
                .await
                .map_err(|err| script_error(err, run_id, 0))
        })
        .await
    }
}
