//! One Redis server or a Redis Cluster behind one connection type, so that every command of the
//! store is written once.
//!
//! - [`Connection::Single`]: a [`ConnectionManager`], one multiplexed connection to one server
//!   (or a primary behind a proxy) that reconnects by itself.
//! - [`Connection::Cluster`]: redis-rs's cluster client, which routes each command to the master
//!   of its key's slot, follows `MOVED` and `ASK`, refreshes the topology and reconnects.
//!
//! What the store sends must suit both: a script or a pipeline touches one slot (a run's keys
//! share its hash tag; the timer sets of a run live on the run's own slot, see `timers.rs`), and
//! reads over many runs are sent as one command per run ([`Connection::each`]) rather than as
//! one pipeline, which a cluster would refuse as cross-slot.

use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use ::redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, RedisResult, Value};

/// How many commands of [`Connection::each`] are in flight at once on a cluster.
const CLUSTER_FAN_OUT: usize = 64;

#[derive(Clone)]
pub(super) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(con) => con.req_packed_command(cmd),
            Connection::Cluster(con) => con.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(con) => con.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(con) => con.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(con) => con.get_db(),
            Connection::Cluster(con) => con.get_db(),
        }
    }
}

impl Connection {
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Connection::Cluster(_))
    }

    /// The replies of `commands`, in order: one pipeline on a single server (one round trip),
    /// concurrent commands on a cluster (their keys may be on any slot).
    pub(super) async fn each<T: FromRedisValue>(&self, commands: Vec<Cmd>) -> RedisResult<Vec<T>> {
        match self {
            Connection::Single(con) => {
                if commands.is_empty() {
                    return Ok(Vec::new());
                }
                let mut pipe = ::redis::pipe();
                for command in commands {
                    pipe.add_command(command);
                }
                pipe.query_async(&mut con.clone()).await
            }
            Connection::Cluster(con) => {
                use futures::stream::{StreamExt, TryStreamExt};
                futures::stream::iter(commands)
                    .map(|command| {
                        let mut con = con.clone();
                        async move { command.query_async::<T>(&mut con).await }
                    })
                    .buffered(CLUSTER_FAN_OUT)
                    .try_collect()
                    .await
            }
        }
    }

    /// `SCAN MATCH pattern` over the whole keyspace: the server's, or every master's of a
    /// cluster (each master holds only its own slots' keys).
    pub(super) async fn scan(&self, pattern: &str) -> RedisResult<Vec<String>> {
        let mut found = Vec::new();
        match self {
            Connection::Single(con) => {
                scan_node(
                    &mut Connection::Single(con.clone()),
                    None,
                    pattern,
                    &mut found,
                )
                .await?
            }
            Connection::Cluster(con) => {
                let mut con = Connection::Cluster(con.clone());
                for (host, port) in masters(&mut con).await? {
                    let node = SingleNodeRoutingInfo::ByAddress { host, port };
                    scan_node(&mut con, Some(node), pattern, &mut found).await?;
                }
            }
        }
        Ok(found)
    }
}

/// One node's keys matching `pattern`, on `node` (a cluster's) or the one server.
async fn scan_node(
    con: &mut Connection,
    node: Option<SingleNodeRoutingInfo>,
    pattern: &str,
    found: &mut Vec<String>,
) -> RedisResult<()> {
    let mut cursor: u64 = 0;
    loop {
        let mut command = ::redis::cmd("SCAN");
        command
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(500);
        let (next, keys): (u64, Vec<String>) = match (&mut *con, &node) {
            (Connection::Cluster(cluster), Some(node)) => {
                let reply = cluster
                    .route_command(command, RoutingInfo::SingleNode(node.clone()))
                    .await?;
                FromRedisValue::from_redis_value(reply)?
            }
            (con, _) => command.query_async(con).await?,
        };
        found.extend(keys);
        cursor = next;
        if cursor == 0 {
            return Ok(());
        }
    }
}

/// The address of every master of the cluster, from `CLUSTER SLOTS` (each reply row: first slot,
/// last slot, then the master's host and port, then its replicas').
async fn masters(con: &mut Connection) -> RedisResult<Vec<(String, u16)>> {
    type Node = (String, u16);
    let rows: Vec<Vec<Value>> = ::redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(con)
        .await?;
    let mut masters: Vec<Node> = Vec::new();
    for row in rows {
        let Some(master) = row.into_iter().nth(2) else {
            continue;
        };
        let Value::Array(fields) = master else {
            continue;
        };
        let mut fields = fields.into_iter();
        let (Some(host), Some(port)) = (fields.next(), fields.next()) else {
            continue;
        };
        let node: Node = (
            FromRedisValue::from_redis_value(host)?,
            FromRedisValue::from_redis_value(port)?,
        );
        if !masters.contains(&node) {
            masters.push(node);
        }
    }
    Ok(masters)
}
