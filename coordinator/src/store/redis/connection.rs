//! One Redis server or a Redis Cluster behind one connection type, so that every command of the
//! store is written once.
//!
//! - [`Connection::Single`]: a [`ConnectionManager`], one multiplexed connection to one server
//!   (or a primary behind a proxy) that reconnects by itself.
//! - [`Connection::Cluster`]: redis-rs's cluster client, which routes each command to the master
//!   of its key's slot, follows `MOVED` and `ASK`, refreshes the topology and reconnects. Wrapped
//!   in a [`Cluster`] that replaces it when it stops answering: after a master failed over and
//!   came back as a replica, redis-rs 1.8's client was seen to leave every request for that
//!   master's slots unanswered for good (the fault tests, `tests/faults.rs`), while a client
//!   connected anew found the new master at once.
//!
//! What the store sends must suit both: a script or a pipeline touches one slot (a run's keys
//! share its hash tag; the timer sets of a run live on the run's own slot, see `timers.rs`), and
//! reads over many runs are sent as one command per run ([`Connection::each`]) rather than as
//! one pipeline, which a cluster would refuse as cross-slot.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use ::redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, RedisResult, Value};

/// How many commands of [`Connection::each`] are in flight at once on a cluster.
const CLUSTER_FAN_OUT: usize = 64;

/// A cluster client that had this many requests time out within [`WEDGED_WINDOW`] is replaced
/// (at most once per window): a healthy cluster answers within the client's timeouts, even
/// across a failover.
const WEDGED_TIMEOUTS: usize = 3;
const WEDGED_WINDOW: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub(super) enum Connection {
    Single(ConnectionManager),
    Cluster(Arc<Cluster>),
}

/// A cluster client, and what it takes to replace it when it stops answering.
pub(super) struct Cluster {
    client: ClusterClient,
    current: RwLock<ClusterConnection>,
    health: Mutex<Health>,
}

#[derive(Default)]
struct Health {
    /// When recent requests timed out, oldest first, within [`WEDGED_WINDOW`].
    timeouts: Vec<Instant>,
    /// When the client was last replaced (or a replacement started).
    replaced: Option<Instant>,
}

impl Cluster {
    pub(super) fn new(client: ClusterClient, connection: ClusterConnection) -> Cluster {
        Cluster {
            client,
            current: RwLock::new(connection),
            health: Mutex::new(Health::default()),
        }
    }

    fn connection(&self) -> ClusterConnection {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Notes how a request ended; the third time-out within the window starts a replacement.
    fn observe<T>(self: &Arc<Self>, result: &RedisResult<T>) {
        let Err(err) = result else {
            return;
        };
        if !err.is_timeout() {
            return;
        }
        let now = Instant::now();
        {
            let mut health = self
                .health
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            health
                .timeouts
                .retain(|at| now.duration_since(*at) < WEDGED_WINDOW);
            health.timeouts.push(now);
            let recently = health
                .replaced
                .is_some_and(|at| now.duration_since(at) < WEDGED_WINDOW);
            if health.timeouts.len() < WEDGED_TIMEOUTS || recently {
                return;
            }
            health.replaced = Some(now);
            health.timeouts.clear();
        }
        let cluster = self.clone();
        tokio::spawn(async move {
            tracing::warn!(
                "the Redis Cluster client keeps timing out; connecting to the cluster anew"
            );
            match cluster.client.get_async_connection().await {
                Ok(fresh) => {
                    *cluster
                        .current
                        .write()
                        .unwrap_or_else(|poisoned| poisoned.into_inner()) = fresh;
                }
                Err(error) => tracing::warn!(%error, "cannot connect to the Redis Cluster anew"),
            }
        });
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(con) => con.req_packed_command(cmd),
            Connection::Cluster(cluster) => {
                let cluster = cluster.clone();
                let mut con = cluster.connection();
                Box::pin(async move {
                    let result = con.req_packed_command(cmd).await;
                    cluster.observe(&result);
                    result
                })
            }
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
            Connection::Cluster(cluster) => {
                let cluster = cluster.clone();
                let mut con = cluster.connection();
                Box::pin(async move {
                    let result = con.req_packed_commands(pipeline, offset, count).await;
                    cluster.observe(&result);
                    result
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(con) => con.get_db(),
            Connection::Cluster(cluster) => cluster.connection().get_db(),
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
            Connection::Cluster(_) => {
                use futures::stream::{StreamExt, TryStreamExt};
                futures::stream::iter(commands)
                    .map(|command| {
                        let mut con = self.clone();
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
            Connection::Cluster(_) => {
                let mut con = self.clone();
                for (host, port) in masters(&mut con).await? {
                    let node = SingleNodeRoutingInfo::ByAddress { host, port };
                    scan_node(&mut con, Some(node), pattern, &mut found).await?;
                }
            }
        }
        Ok(found)
    }
}

impl Connection {
    /// A slot each master of the cluster serves (the first of its first range): a key tagged
    /// for it reaches that master.
    pub(super) async fn master_slots(&self) -> RedisResult<Vec<u16>> {
        let rows: Vec<Vec<Value>> = ::redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut self.clone())
            .await?;
        let mut slots: Vec<(Value, u16)> = Vec::new();
        for row in rows {
            let mut fields = row.into_iter();
            let (Some(first), Some(_last), Some(master)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let first: u16 = FromRedisValue::from_redis_value(first)?;
            if !slots.iter().any(|(known, _)| *known == master) {
                slots.push((master, first));
            }
        }
        Ok(slots.into_iter().map(|(_, slot)| slot).collect())
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
                    .connection()
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
