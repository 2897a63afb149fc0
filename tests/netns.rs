//! The network-namespace harness (`support/netns.rs`) that the partition tests stand on: hosts
//! reach each other and the test process, a partition times connections out (silently, never a
//! refusal) and heal brings them back, an established connection hangs through a partition and
//! resumes, isolation cuts the test process too, Nets made at once do not collide, and nothing is
//! left behind: not by a dropped Net, nor by a run killed with SIGKILL. The peers are small
//! `python3` programs, so only the network is under test.
//!
//! Then the Redis Cluster harness on such hosts (`coordinator/tests/support/redis_cluster.rs`,
//! one node per namespace): a master cut off from the rest of the cluster by a partition is
//! replaced by its replica on the majority side, and comes back as a replica after the heal.

#[path = "support/netns.rs"]
mod netns;
#[path = "../coordinator/tests/support/redis_cluster.rs"]
#[allow(dead_code)] // shared harness: not every helper is used here
mod redis_cluster;
#[path = "../coordinator/tests/support/redis_server.rs"]
#[allow(dead_code)]
mod redis_server;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use netns::{Host, Net};
use redis::Commands;
use redis::cluster::ClusterClient;
use redis_cluster::{NodeHost, RedisCluster};

/// How long a dial that should be cut is given before it counts as timed out.
const CUT: Duration = Duration::from_secs(1);
/// How long a dial that should connect may take.
const REACH: Duration = Duration::from_secs(10);
/// The port every test listener binds (each host has its own addresses).
const PORT: u16 = 7000;

/// An echo server: one thread per connection, every byte sent back.
const ECHO_SERVER: &str = r#"
import socket, sys, threading
def echo(c):
    while True:
        data = c.recv(4096)
        if not data:
            return
        c.sendall(data)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(64)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    threading.Thread(target=echo, args=(c,), daemon=True).start()
"#;

/// Dials IP PORT with a timeout of SECONDS; prints how it went.
const DIAL: &str = r#"
import socket, sys
s = socket.socket()
s.settimeout(float(sys.argv[3]))
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("connected")
except TimeoutError:
    print("timed out")
except ConnectionRefusedError:
    print("refused")
except OSError as e:
    print("error", e)
"#;

/// Connects to IP PORT, then for every line "TOKEN SECONDS" on stdin sends TOKEN and prints
/// "echo" if it comes back within SECONDS, else "timeout". A reset connection kills it.
const SESSION: &str = r#"
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
print("connected", flush=True)
buf = b""
for line in sys.stdin:
    token, wait = line.split()
    s.sendall(token.encode() + b"\n")
    deadline = time.monotonic() + float(wait)
    got = False
    while not got and time.monotonic() < deadline:
        s.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            data = s.recv(4096)
        except TimeoutError:
            break
        if not data:
            print("closed", flush=True)
            sys.exit(1)
        buf += data
        lines = buf.split(b"\n")
        buf = lines.pop()
        got = token.encode() in lines
    print("echo" if got else "timeout", flush=True)
"#;

/// A child process killed and reaped on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads the child's next line of stdout; panics with its stderr if it ended instead.
fn next_line(child: &mut Child, stdout: &mut BufReader<ChildStdout>, what: &str) -> String {
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read a child's stdout");
    if line.is_empty() {
        let _ = child.kill();
        let status = child.wait().expect("wait for a child");
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        panic!("{what} ended ({status}) without a line:\n{stderr}");
    }
    line.trim().to_owned()
}

/// An echo server on `host`'s address, listening when this returns.
fn echo_server(host: &Host) -> Killed {
    let mut child = host
        .command("python3")
        .args(["-c", ECHO_SERVER, &host.ip().to_string(), &PORT.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start python3 in a namespace");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let line = next_line(&mut child, &mut stdout, "the echo server");
    assert_eq!(line, "listening");
    Killed(child)
}

#[derive(Debug, PartialEq, Eq)]
enum Dial {
    Connected,
    TimedOut,
    Refused,
    Error(String),
}

/// Dials `to`'s echo server from inside `from`.
fn dial(from: &Host, to: &Host, timeout: Duration) -> Dial {
    let output = from
        .command("python3")
        .args([
            "-c",
            DIAL,
            &to.ip().to_string(),
            &PORT.to_string(),
            &timeout.as_secs_f64().to_string(),
        ])
        .output()
        .expect("run python3 in a namespace");
    match String::from_utf8_lossy(&output.stdout).trim() {
        "connected" => Dial::Connected,
        "timed out" => Dial::TimedOut,
        "refused" => Dial::Refused,
        other => Dial::Error(format!(
            "{other} {}",
            String::from_utf8_lossy(&output.stderr)
        )),
    }
}

/// Dials `to`'s echo server from the test process (the root namespace).
fn dial_from_test(to: &Host, timeout: Duration) -> Dial {
    match TcpStream::connect_timeout(&SocketAddr::from((to.ip(), PORT)), timeout) {
        Ok(_) => Dial::Connected,
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Dial::TimedOut,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Dial::Refused,
        Err(e) => Dial::Error(e.to_string()),
    }
}

/// The names of every network namespace, link and iptables rule of the root namespace that
/// belong to the bridge `bridge` (`btn-N`, `btn-N-...`, rules on `btn-N`).
fn leftovers(bridge: &str) -> Vec<String> {
    let text = |program: &str, args: &[&str]| {
        let output = Command::new(program).args(args).output().unwrap();
        assert!(output.status.success(), "{program} {args:?}: {output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let ours = |name: &str| name == bridge || name.starts_with(&format!("{bridge}-"));
    let mut found = Vec::new();
    for line in text("ip", &["netns", "list"]).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        if ours(name) {
            found.push(format!("netns {name}"));
        }
    }
    for line in text("ip", &["-o", "link", "show"]).lines() {
        let name = line.split(": ").nth(1).unwrap_or("");
        let name = name.split('@').next().unwrap_or(name);
        if ours(name) {
            found.push(format!("link {name}"));
        }
    }
    for line in text("iptables", &["-w", "-S"]).lines() {
        if line.split_whitespace().any(|word| word == bridge) {
            found.push(format!("rule {line}"));
        }
    }
    found
}

/// Whether br_netfilter sends bridged frames through iptables (so a Net adds a FORWARD rule).
fn bridged_frames_filtered() -> bool {
    std::fs::read_to_string("/proc/sys/net/bridge/bridge-nf-call-iptables")
        .is_ok_and(|s| s.trim() == "1")
}

/// Whether process `pid` is gone (or a zombie: it exited and left its namespace).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // "pid (comm) S ...": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn two_hosts_reach_each_other_and_the_test_process_reaches_both() {
    let net = Net::new("two_hosts");
    let a = net.host("a");
    let b = net.host("b");
    assert_ne!(a.ip(), b.ip());
    assert!(net.subnet().starts_with("10.200."), "{}", net.subnet());
    let servers = [echo_server(&a), echo_server(&b)];
    assert_eq!(dial(&a, &b, REACH), Dial::Connected);
    assert_eq!(dial(&b, &a, REACH), Dial::Connected);
    assert_eq!(dial_from_test(&a, REACH), Dial::Connected);
    assert_eq!(dial_from_test(&b, REACH), Dial::Connected);
    // A host reaches the test process at the bridge's address.
    let listener = std::net::TcpListener::bind((net.ip(), 0)).expect("bind the Net's address");
    let port = listener.local_addr().unwrap().port();
    let output = a
        .command("python3")
        .args([
            "-c",
            DIAL,
            &net.ip().to_string(),
            &port.to_string(),
            &REACH.as_secs_f64().to_string(),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "connected");
    // A port nobody listens on is refused at once: the network is there, the cut is what times
    // out below.
    drop(servers);
    assert_eq!(dial(&a, &b, REACH), Dial::Refused);
}

#[test]
fn a_partition_times_connections_out_both_ways_and_heal_restores_them() {
    let net = Net::new("partition");
    let a = net.host("a");
    let b = net.host("b");
    let c = net.host("c");
    let _servers = [echo_server(&a), echo_server(&b), echo_server(&c)];

    net.partition(&[&a], &[&b, &c]);
    // Silent: the dials time out, nothing refuses them.
    assert_eq!(dial(&b, &a, CUT), Dial::TimedOut);
    assert_eq!(dial(&c, &a, CUT), Dial::TimedOut);
    assert_eq!(dial(&a, &b, CUT), Dial::TimedOut);
    assert_eq!(dial(&a, &c, CUT), Dial::TimedOut);
    // Each side still talks within itself, and the test process reaches everyone.
    assert_eq!(dial(&b, &c, REACH), Dial::Connected);
    assert_eq!(dial(&c, &b, REACH), Dial::Connected);
    for host in [&a, &b, &c] {
        assert_eq!(dial_from_test(host, REACH), Dial::Connected, "{host:?}");
    }

    net.heal();
    assert_eq!(dial(&b, &a, REACH), Dial::Connected);
    assert_eq!(dial(&a, &c, REACH), Dial::Connected);
    // Cuts add up, and one heal removes them all.
    net.partition(&[&a], &[&b]);
    net.partition(&[&b], &[&c]);
    assert_eq!(dial(&a, &b, CUT), Dial::TimedOut);
    assert_eq!(dial(&c, &b, CUT), Dial::TimedOut);
    assert_eq!(dial(&a, &c, REACH), Dial::Connected);
    net.heal();
    assert_eq!(dial(&a, &b, REACH), Dial::Connected);
    assert_eq!(dial(&c, &b, REACH), Dial::Connected);
}

#[test]
fn an_established_connection_hangs_through_a_partition_and_resumes_after_heal() {
    let net = Net::new("established");
    let server = net.host("server");
    let client = net.host("client");
    let _echo = echo_server(&server);
    let mut child = client
        .command("python3")
        .args(["-c", SESSION, &server.ip().to_string(), &PORT.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin: ChildStdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut session = Killed(child);
    assert_eq!(
        next_line(&mut session.0, &mut stdout, "the client"),
        "connected"
    );
    let mut ask = |token: &str, wait: Duration| {
        writeln!(stdin, "{token} {}", wait.as_secs_f64()).unwrap();
        stdin.flush().unwrap();
        next_line(&mut session.0, &mut stdout, "the client")
    };
    assert_eq!(ask("before", REACH), "echo");

    net.partition(&[&server], &[&client]);
    // Nothing comes back, and nothing resets the connection either (a reset kills the client).
    assert_eq!(ask("during", CUT), "timeout");
    net.heal();
    // TCP retransmits: the same connection carries on.
    assert_eq!(ask("after", Duration::from_secs(30)), "echo");
}

#[test]
fn an_isolated_host_is_cut_from_the_test_process_too() {
    let net = Net::new("isolate");
    let a = net.host("a");
    let b = net.host("b");
    let _servers = [echo_server(&a), echo_server(&b)];
    net.isolate(&a);
    assert_eq!(dial_from_test(&a, CUT), Dial::TimedOut);
    assert_eq!(dial(&b, &a, CUT), Dial::TimedOut);
    assert_eq!(dial(&a, &b, CUT), Dial::TimedOut);
    // The others are untouched.
    assert_eq!(dial_from_test(&b, REACH), Dial::Connected);
    net.heal();
    assert_eq!(dial_from_test(&a, REACH), Dial::Connected);
    assert_eq!(dial(&b, &a, REACH), Dial::Connected);
}

#[test]
fn nets_made_at_once_get_their_own_subnets_and_do_not_reach_each_other() {
    let nets: Vec<(Net, Host, Host, Killed)> = std::thread::scope(|scope| {
        let made: Vec<_> = (0..4)
            .map(|i| {
                scope.spawn(move || {
                    let net = Net::new(&format!("at_once_{i}"));
                    let a = net.host("a");
                    let b = net.host("b");
                    let server = echo_server(&b);
                    assert_eq!(dial(&a, &b, REACH), Dial::Connected);
                    (net, a, b, server)
                })
            })
            .collect();
        made.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut bridges: Vec<&str> = nets.iter().map(|(net, ..)| net.bridge()).collect();
    bridges.sort();
    bridges.dedup();
    assert_eq!(bridges.len(), nets.len(), "{bridges:?}");
    // Hosts have no route off their own /24.
    let (_, a0, ..) = &nets[0];
    let (_, _, b1, _) = &nets[1];
    assert_ne!(dial(a0, b1, CUT), Dial::Connected);
}

#[test]
fn a_net_of_six_hosts_is_made_quickly() {
    let started = Instant::now();
    let net = Net::new("six_hosts");
    let hosts: Vec<Host> = (0..6).map(|i| net.host(&format!("h{i}"))).collect();
    let made = started.elapsed();
    eprintln!("a Net with 6 hosts took {made:?}");
    let started = Instant::now();
    net.partition(
        &[&hosts[0], &hosts[1]],
        &[&hosts[2], &hosts[3], &hosts[4], &hosts[5]],
    );
    net.heal();
    eprintln!(
        "a partition and a heal of 6 hosts took {:?}",
        started.elapsed()
    );
    let started = Instant::now();
    drop(net);
    eprintln!("removing it took {:?}", started.elapsed());
    assert!(made < Duration::from_secs(10), "{made:?}");
    let ips: Vec<Ipv4Addr> = hosts.iter().map(Host::ip).collect();
    assert_eq!(
        ips.iter().collect::<std::collections::BTreeSet<_>>().len(),
        6
    );
}

#[test]
fn a_dropped_net_leaves_nothing_behind_and_kills_what_ran_inside() {
    let net = Net::new("dropped");
    let a = net.host("a");
    let b = net.host("b");
    net.partition(&[&a], &[&b]);
    let bridge = net.bridge().to_owned();
    let found = leftovers(&bridge);
    assert!(found.contains(&format!("link {bridge}")), "{found:?}");
    assert!(found.contains(&format!("netns {}", a.netns())), "{found:?}");
    if bridged_frames_filtered() {
        assert!(
            found.iter().any(|f| f.starts_with("rule -A FORWARD")),
            "{found:?}"
        );
    }
    // Processes the test forgot to stop: they would keep the namespace alive. Spawned just
    // before the drop, so that some are still entering the namespace (one once outlived it).
    let mut forgotten: Vec<_> = (0..20)
        .map(|_| {
            a.command("sleep")
                .arg("300")
                .stdin(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    drop(net);
    assert_eq!(leftovers(&bridge), Vec::<String>::new());
    // Killed by the drop, so each has ended (or ends in a moment) with a signal.
    let until = Instant::now() + Duration::from_secs(5);
    let mut survivors = Vec::new();
    for child in &mut forgotten {
        let status = loop {
            match child.try_wait().unwrap() {
                Some(status) => break Some(status),
                None if Instant::now() > until => break None,
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        match status {
            Some(status) => assert!(!status.success(), "{status}"),
            None => {
                survivors.push(child.id());
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
    assert!(survivors.is_empty(), "outlived their Net: {survivors:?}");
}

/// Run by `a_crashed_runs_leftovers_are_removed_by_the_next_net` as a child process that it kills
/// with SIGKILL. Run by hand it makes a Net, holds it for `BATON_NETNS_HOLD` seconds (default 0)
/// and drops it.
#[test]
#[ignore = "a child process of a_crashed_runs_leftovers_are_removed_by_the_next_net"]
fn crashing_run() {
    let net = Net::new("crashing_run");
    let a = net.host("a");
    let b = net.host("b");
    net.partition(&[&a], &[&b]);
    let mut sleeper = a
        .command("sleep")
        .arg("300")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    println!(
        "\nNET {} {} {} {}",
        net.bridge(),
        a.netns(),
        b.netns(),
        sleeper.id()
    );
    std::io::stdout().flush().unwrap();
    let hold: u64 = std::env::var("BATON_NETNS_HOLD").map_or(0, |s| s.parse().unwrap());
    std::thread::sleep(Duration::from_secs(hold));
    // Run by hand: the Net kills the sleeper.
    drop(net);
    sleeper.wait().unwrap();
}

#[test]
fn a_crashed_runs_leftovers_are_removed_by_the_next_net() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["crashing_run", "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env("BATON_NETNS_HOLD", "120")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let line = loop {
        let line = next_line(&mut child, &mut stdout, "the crashing run");
        if let Some(rest) = line.split_once("NET ").map(|(_, rest)| rest.to_owned()) {
            break rest;
        }
    };
    let words: Vec<&str> = line.split_whitespace().collect();
    let [bridge, ns_a, ns_b, sleeper] = words[..] else {
        panic!("unexpected line from the crashing run: {line}");
    };
    let sleeper: u32 = sleeper.parse().unwrap();
    // Looked at while the run lives: once it is dead, any Net made meanwhile (another test's,
    // another process's) may remove its leftovers. None of them would go away by itself: a
    // namespace is a bind mount, a bridge and a rule belong to no process, and a SIGKILL to the
    // run does not reach its children.
    let found = leftovers(bridge);
    for expected in [
        format!("link {bridge}"),
        format!("netns {ns_a}"),
        format!("netns {ns_b}"),
    ] {
        assert!(found.contains(&expected), "{expected} not in {found:?}");
    }
    if bridged_frames_filtered() {
        assert!(
            found.iter().any(|f| f.starts_with("rule -A FORWARD")),
            "{found:?}"
        );
    }
    assert!(!gone(sleeper));
    // SIGKILL: no destructor runs.
    child.kill().unwrap();
    child.wait().unwrap();

    // The next Net, of this process, removes all of it (and may well take the same subnet: so
    // it is dropped before looking).
    drop(Net::new("after_the_crash"));
    assert_eq!(leftovers(bridge), Vec::<String>::new());
    wait_until(
        "the sleeper left in the crashed run's namespace was not killed",
        || gone(sleeper),
    );
}

#[test]
fn a_redis_master_partitioned_from_the_cluster_is_replaced_and_rejoins_as_a_replica() {
    // Declared first, dropped last: the cluster stops its servers before the Net goes.
    let net = Net::new("redis_partition");
    let hosts: Vec<Host> = (0..6).map(|i| net.host(&format!("redis{i}"))).collect();
    let started = Instant::now();
    let cluster = RedisCluster::start_on(
        hosts
            .iter()
            .map(|host| {
                let host = host.clone();
                NodeHost::new(host.ip(), move |program| host.command(program))
            })
            .collect(),
        1,
        1000,
    );
    eprintln!(
        "a Redis Cluster on 6 hosts took {:?} to start",
        started.elapsed()
    );
    // One node per host, and the cluster knows them by their hosts' addresses.
    let ips: Vec<Ipv4Addr> = cluster.addrs().iter().map(|addr| *addr.ip()).collect();
    assert_eq!(ips, hosts.iter().map(Host::ip).collect::<Vec<_>>());
    for url in cluster.urls() {
        assert!(url.starts_with("redis://10.200."), "{url}");
    }
    for master in cluster.masters() {
        let replica = cluster
            .replicas()
            .into_iter()
            .find(|replica| replica.master_port == master.port)
            .unwrap_or_else(|| panic!("{master:?} has no replica"));
        assert_ne!(replica.ip, master.ip, "a replica on its master's host");
    }

    let key = "{netns}:partitioned";
    let mut con = ClusterClient::new(cluster.urls())
        .expect("a cluster client")
        .get_connection()
        .expect("connect to the cluster from the test process");
    let () = con
        .set(key, "before")
        .expect("SET through the cluster client");
    cluster.wait_for_replication();

    let old_master = cluster.master_of_key(key);
    let old_ip = cluster.node_ip(old_master);
    let replica = cluster
        .replicas()
        .into_iter()
        .find(|replica| replica.master_port == old_master)
        .expect("the key's master has a replica");
    let cut_off = hosts
        .iter()
        .find(|host| host.ip() == old_ip)
        .expect("the master's host");
    let others: Vec<&Host> = hosts.iter().filter(|host| *host != cut_off).collect();
    net.partition(&[cut_off], &others);
    let partitioned = Instant::now();

    // Until it notices (cluster-node-timeout), the cut-off master still takes writes, which no
    // replica gets: the write that the majority side will lose. The test process still reaches
    // it (a partition cuts hosts from hosts only).
    let mut minority = redis::Client::open(format!("redis://{old_ip}:{old_master}/"))
        .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(5)))
        .expect("connect to the cut-off master");
    let () = minority
        .set(key, "lost")
        .expect("the cut-off master takes a write before it notices");
    let acknowledged: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(200)
        .query(&mut minority)
        .expect("WAIT on the cut-off master");
    assert_eq!(
        acknowledged, 0,
        "a replica acknowledged across the partition"
    );

    let new_master = cluster.wait_for_failover_of(old_master);
    eprintln!(
        "the replica took over {:?} after the partition",
        partitioned.elapsed()
    );
    assert_eq!(new_master, replica.port);
    assert_eq!(cluster.master_of_key(key), new_master);
    assert!(
        cluster
            .masters()
            .iter()
            .all(|master| master.port != old_master),
        "{:?}",
        cluster.masters()
    );
    // The majority side serves the key, as it was before the cut.
    let majority: Vec<String> = cluster
        .addrs()
        .iter()
        .filter(|addr| *addr.ip() != old_ip)
        .map(|addr| format!("redis://{addr}/"))
        .collect();
    let mut con = ClusterClient::new(majority)
        .expect("a cluster client")
        .get_connection()
        .expect("connect to the majority side");
    let value: String = con.get(key).expect("GET on the majority side");
    assert_eq!(value, "before");
    // The minority side refuses, once it has noticed.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match minority.get::<_, String>(key) {
            Err(error) if error.code() == Some("CLUSTERDOWN") => break,
            other => assert!(
                Instant::now() < deadline,
                "the cut-off master still answers: {other:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    net.heal();
    let healed = Instant::now();
    assert_eq!(cluster.wait_for_rejoin(old_master), new_master);
    eprintln!(
        "the old master rejoined as a replica {:?} after the heal",
        healed.elapsed()
    );
    let rejoined = cluster
        .replicas()
        .into_iter()
        .find(|replica| replica.port == old_master)
        .expect("the old master is a replica");
    assert_eq!(rejoined.master_port, new_master);
    // Its write during the partition is gone, everywhere.
    let value: String = con.get(key).expect("GET after the heal");
    assert_eq!(value, "before");
    cluster.wait_for_replication();
    let mut old = redis::Client::open(format!("redis://{old_ip}:{old_master}/"))
        .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(5)))
        .expect("connect to the old master");
    let value: String = redis::cmd("READONLY")
        .query::<()>(&mut old)
        .and_then(|()| old.get(key))
        .expect("GET on the old master, now a replica");
    assert_eq!(value, "before");
}
