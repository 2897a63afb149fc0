//! `baton bench --redis-cluster`: a throwaway Redis Cluster on loopback, so that the bench
//! measures what a step costs on a cluster as easily as on one server.
//!
//! `redis-server --cluster-enabled yes` nodes, each on free ports (its client port and a
//! `--cluster-port` of its own: the default, port + 10000, may be taken or be another node's)
//! and in a temporary directory, joined by `redis-cli --cluster create --cluster-replicas R`;
//! then the bench waits until every node says `cluster_state:ok`, all agree on who owns which
//! slots and who replicates whom, and every replica's link to its master is up (before that, a
//! client can be sent to a node that does not know its slots yet, and `WAIT` counts a replica
//! still syncing out). Every server is killed on drop ([`Server`]).
//!
//! The coordinator's tests have a fuller harness (kills, failovers, slot migrations) in
//! `coordinator/tests/support/redis_cluster.rs`; the bench needs only a healthy cluster, so this
//! is the start of it, in the bench's async style.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::redis_server::{Server, info_field};

/// How long the new cluster gets to become ready.
const SETTLE_DEADLINE: Duration = Duration::from_secs(30);

/// A running Redis Cluster; every node is killed on drop.
pub struct RedisCluster {
    nodes: Vec<Server>,
    pub masters: usize,
}

impl RedisCluster {
    /// Starts `masters * (1 + replicas_per_master)` nodes (`redis-cli` needs at least 3
    /// masters), joins them, and waits until the cluster is ready (see the module's docs).
    pub async fn start(masters: usize, replicas_per_master: usize) -> anyhow::Result<Self> {
        anyhow::ensure!(masters >= 3, "a Redis Cluster needs at least 3 masters");
        let mut nodes = Vec::new();
        for _ in 0..masters * (1 + replicas_per_master) {
            nodes.push(
                Server::start(2, |ports, _| {
                    vec![
                        "--cluster-enabled".into(),
                        "yes".into(),
                        "--cluster-config-file".into(),
                        "nodes.conf".into(),
                        "--cluster-port".into(),
                        ports[1].to_string(),
                        // How long a master may be silent before its replica takes over: short,
                        // as in the tests; nothing fails over during a bench.
                        "--cluster-node-timeout".into(),
                        "2000".into(),
                    ]
                })
                .await?,
            );
        }
        let cluster = RedisCluster { nodes, masters };
        let created = tokio::process::Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(
                cluster
                    .nodes
                    .iter()
                    .map(|node| format!("127.0.0.1:{}", node.port)),
            )
            .args(["--cluster-replicas", &replicas_per_master.to_string()])
            .arg("--cluster-yes")
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .context("cannot run redis-cli (install it, e.g. apt-get install redis-tools)")?;
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&created.stdout),
            String::from_utf8_lossy(&created.stderr)
        );
        // Its exit status, and its "[ERR]" lines too, in case one is only printed.
        if !created.status.success() || said.contains("[ERR]") {
            bail!("redis-cli --cluster create failed: {said}");
        }
        cluster.wait_until_ready().await?;
        Ok(cluster)
    }

    /// Every node's URL, masters and replicas, separated by commas: what `--redis` takes.
    pub fn comma_urls(&self) -> String {
        self.nodes
            .iter()
            .map(Server::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    async fn wait_until_ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + SETTLE_DEADLINE;
        loop {
            let failure = match self.look().await {
                Ok(()) => return Ok(()),
                Err(failure) => failure,
            };
            if Instant::now() >= deadline {
                let logs: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|node| format!("port {}:\n{}", node.port, node.log()))
                    .collect();
                bail!(
                    "the Redis Cluster was not ready within {SETTLE_DEADLINE:?}: {failure:#}\n{}",
                    logs.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Ok once the cluster is ready: every node says `cluster_state:ok`, knows every node as
    /// healthy with no slot migrating, and describes the same slots and roles; every replica's
    /// link to its master is up.
    async fn look(&self) -> anyhow::Result<()> {
        let mut first: Option<Vec<String>> = None;
        for node in &self.nodes {
            let client = redis::Client::open(node.url())?;
            let mut connection = client.get_multiplexed_async_connection().await?;
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut connection)
                .await?;
            if info_field(&info, "cluster_state") != Some("ok") {
                bail!("port {} says cluster_state is not ok", node.port);
            }
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async(&mut connection)
                .await?;
            let mut view = Vec::new();
            let mut masters_with_slots = 0;
            let mut replica = false;
            for line in nodes.lines().filter(|line| !line.trim().is_empty()) {
                // <id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
                let fields: Vec<&str> = line.split_whitespace().collect();
                anyhow::ensure!(fields.len() >= 8, "short CLUSTER NODES line {line:?}");
                let flags: Vec<&str> = fields[2].split(',').collect();
                if let Some(bad) = flags
                    .iter()
                    .find(|flag| ["fail", "fail?", "handshake", "noaddr"].contains(flag))
                {
                    bail!("port {} sees {} as {bad}", node.port, fields[1]);
                }
                if fields[8..].iter().any(|slot| slot.starts_with('[')) {
                    bail!("port {} sees a slot migrating", node.port);
                }
                if flags.contains(&"myself") && flags.contains(&"slave") {
                    replica = true;
                }
                if flags.contains(&"master") && fields.len() > 8 {
                    masters_with_slots += 1;
                }
                let role = if flags.contains(&"master") {
                    "master"
                } else {
                    fields[3]
                };
                view.push(format!("{} {role} {}", fields[0], fields[8..].join(" ")));
            }
            if view.len() != self.nodes.len() || masters_with_slots != self.masters {
                bail!(
                    "port {} knows {} nodes, {masters_with_slots} masters with slots",
                    node.port,
                    view.len()
                );
            }
            view.sort();
            match &first {
                None => first = Some(view),
                Some(first) if *first != view => {
                    bail!(
                        "the nodes disagree about slots or roles (port {})",
                        node.port
                    )
                }
                Some(_) => {}
            }
            if replica {
                let replication: String = redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut connection)
                    .await?;
                if info_field(&replication, "master_link_status") != Some("up") {
                    bail!("the replica on port {} is not in sync yet", node.port);
                }
            }
        }
        Ok(())
    }
}
