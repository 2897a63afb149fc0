//! Private networks for fault tests that `kill -9` cannot show: a process that stays alive but
//! cannot reach some of its peers. A [`Net`] is a Linux bridge in the root network namespace with
//! its own /24; each [`Host`] is a network namespace joined to it by a veth pair, with its own
//! address. A test starts `redis-server`, `baton coordinator` or `baton worker` inside a host with
//! [`Host::command`], bound to [`Host::ip`], and then cuts traffic with [`Net::partition`] or
//! [`Net::isolate`] and restores it with [`Net::heal`].
//!
//! Needs root, `ip` (iproute2), `nft` and `iptables`. Every failure panics, naming the command
//! and what it printed: a test that uses this never skips.
//!
//! Why it is built this way:
//! - Cuts are nftables rules *inside* the hosts' namespaces (each has its own ruleset), in a table
//!   of their own, and they DROP: a partition is silent, like a failed network, so TCP connections
//!   hang and retransmit instead of being reset, and resume when healed. Nothing of Docker's (or
//!   anyone's) rules in the root namespace is touched by a cut.
//! - Docker loads `br_netfilter` (`/proc/sys/net/bridge/bridge-nf-call-iptables` = 1) and sets the
//!   root FORWARD policy to DROP: frames between two ports of *any* bridge then go through that
//!   chain and are dropped. So, when bridged traffic is filtered, a Net inserts one rule at the top
//!   of FORWARD that accepts traffic from its bridge to its bridge (`-i btn-N -o btn-N`, with the
//!   comment `baton-netns`), and deletes exactly that rule when dropped. Traffic between the test
//!   process and a host goes through INPUT and OUTPUT instead; a Net adds an accept rule there too
//!   only if that chain's policy is not ACCEPT.
//! - Names: the bridge is `btn-N` for the subnet `10.200.N.0/24`, a host's namespace is
//!   `btn-N-<name>`, the root end of its veth `btn-N-<last octet>` (the end inside is `eth0`). The
//!   bridge's alias says which process made it and for which test (`ip -d link show btn-N`).
//! - Claiming a subnet, in this process and across test processes at once: binding the abstract
//!   Unix socket `baton-netns/N`. The kernel lets one socket hold a name and releases it when the
//!   process dies, however it dies, so "is its owner alive?" is exactly "can I bind its name?":
//!   no pid files, no pid reuse. (Abstract names belong to the network namespace of the test
//!   process; test processes all run in the same one.)
//! - Leftovers of a crashed run (namespaces, veths, bridges, rules named `btn-N…` whose claim no
//!   process holds) are removed by the next [`Net::new`], after killing any process still inside
//!   those namespaces.
//! - A host has no default route: it reaches its own Net's /24 only, the test process included
//!   ([`Net::ip`]).

#![allow(dead_code)]

#[path = "process.rs"]
mod process;

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// What every name of ours starts with: bridges, veths and namespaces.
const PREFIX: &str = "btn-";
/// The comment on every iptables rule of ours in the root namespace.
const RULE_COMMENT: &str = "baton-netns";
/// The nftables table inside a host that holds its cuts.
const CUT_TABLE: &str = "inet baton_netns";
/// How long one `ip`, `nft` or `iptables` command may take.
const COMMAND_DEADLINE: Duration = Duration::from_secs(30);
/// The first two octets of every Net's subnet.
const SUBNETS: [u8; 2] = [10, 200];

/// A private L2 network for one test. Dropping it kills (SIGKILL) whatever still runs inside its
/// hosts, then removes everything it made; declare it before the processes a test starts in it,
/// so that their own guards stop them first. Shared freely between threads and tasks (every
/// method takes `&self`).
pub struct Net {
    /// The third octet of the subnet.
    n: u8,
    bridge: String,
    hint: String,
    hosts: Mutex<Vec<Host>>,
    /// The iptables rules added in the root namespace, as `iptables -I` arguments without `-I`.
    root_rules: Vec<Vec<String>>,
    /// Holds the claim on the subnet until the Net is dropped (see the module doc).
    _claim: UnixListener,
}

/// A network namespace on a [`Net`]. Cheap to clone; it is valid while its Net lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    name: String,
    netns: String,
    ip: Ipv4Addr,
}

impl Host {
    /// The name given to [`Net::host`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The network namespace, for `ip netns exec` and `ip -n`.
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// Its address on the Net, which its servers bind and its peers dial.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// `program` run inside the namespace (`ip netns exec <netns> program`); add arguments,
    /// environment and stdio as usual. `ip netns exec` execs the program, so the child's pid is
    /// the program's and [`std::process::Child::kill`] kills it.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.netns]).arg(program);
        command
    }
}

impl Net {
    /// A new Net with no hosts yet: claims a free subnet, removes the leftovers of crashed runs,
    /// makes the bridge with the address [`Net::ip`] and lets its traffic through the root
    /// namespace's filters. `name_hint` (say the test's name) goes in the bridge's alias and in
    /// panic messages.
    pub fn new(name_hint: &str) -> Net {
        let listing = Listing::take();
        listing.remove_leftovers();
        let sysctl = "/proc/sys/net/bridge/bridge-nf-call-iptables";
        // Absent when br_netfilter is not loaded: then bridged frames skip iptables.
        let bridged_filtered = std::fs::read_to_string(sysctl)
            .map(|s| s.trim() == "1")
            .unwrap_or(false);
        let (n, claim) = claim_subnet(&listing, name_hint);
        let bridge = format!("{PREFIX}{n}");
        let mut net = Net {
            n,
            bridge: bridge.clone(),
            hint: name_hint.to_owned(),
            hosts: Mutex::new(Vec::new()),
            root_rules: Vec::new(),
            _claim: claim,
        };
        // From here on, dropping `net` undoes whatever was made, also when a step below panics.
        let add = || ip(&["link", "add", &bridge, "type", "bridge"]);
        if let Err(e) = add() {
            // The claim is ours, so whatever still carries the name belongs to a process that
            // died after the listing above was taken.
            assert!(e.contains("File exists"), "Net {name_hint}: {e}");
            remove_subnet(n, &Listing::take());
            add().unwrap_or_else(|e| panic!("Net {name_hint}: {e}"));
        }
        let alias = format!(
            "baton-netns:pid={}:{}",
            std::process::id(),
            alias_safe(name_hint)
        );
        ip_batch(
            None,
            &[
                format!("link set {bridge} alias {alias}"),
                format!("addr add {}/24 dev {bridge}", net.ip()),
                format!("link set {bridge} up"),
            ],
        )
        .unwrap_or_else(|e| panic!("Net {name_hint}: {e}"));
        let mut rules = Vec::new();
        if bridged_filtered {
            rules.push(vec!["FORWARD", "-i", &bridge, "-o", &bridge]);
        }
        if !listing.policy_accepts("INPUT") {
            rules.push(vec!["INPUT", "-i", &bridge]);
        }
        if !listing.policy_accepts("OUTPUT") {
            rules.push(vec!["OUTPUT", "-o", &bridge]);
        }
        for rule in rules {
            let mut rule: Vec<String> = rule.into_iter().map(str::to_owned).collect();
            rule.extend(
                ["-m", "comment", "--comment", RULE_COMMENT, "-j", "ACCEPT"].map(str::to_owned),
            );
            let mut args = vec!["-w".to_owned(), "-I".to_owned()];
            args.extend(rule.iter().cloned());
            run(Command::new("iptables").args(&args), None)
                .unwrap_or_else(|e| panic!("Net {name_hint}: {e}"));
            net.root_rules.push(rule);
        }
        net
    }

    /// The bridge's name (`btn-N`).
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    /// The test process's address on the Net (the bridge's): hosts reach the test here.
    pub fn ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(SUBNETS[0], SUBNETS[1], self.n, 1)
    }

    /// The Net's subnet, as `10.200.N.0/24`.
    pub fn subnet(&self) -> String {
        format!("{}.{}.{}.0/24", SUBNETS[0], SUBNETS[1], self.n)
    }

    /// Every host made so far, in order.
    pub fn hosts(&self) -> Vec<Host> {
        self.hosts.lock().unwrap().clone()
    }

    /// A new host: the namespace `btn-N-<name>` with loopback up and `eth0` on the bridge, at the
    /// next free address of the subnet (from `.2`). `name`: ASCII letters, digits, `-` and `_`,
    /// unique in this Net.
    pub fn host(&self, name: &str) -> Host {
        assert!(
            !name.is_empty()
                && name.len() <= 32
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "Net {}: host name {name:?}: use 1 to 32 ASCII letters, digits, '-' or '_'",
            self.hint
        );
        let mut hosts = self.hosts.lock().unwrap();
        assert!(
            hosts.iter().all(|h| h.name != name),
            "Net {}: there is already a host {name:?}",
            self.hint
        );
        let octet = u8::try_from(hosts.len() + 2)
            .ok()
            .filter(|o| *o < 255)
            .unwrap_or_else(|| panic!("Net {}: no address left for {name:?}", self.hint));
        let host = Host {
            name: name.to_owned(),
            netns: format!("{}-{name}", self.bridge),
            ip: Ipv4Addr::new(SUBNETS[0], SUBNETS[1], self.n, octet),
        };
        let veth = format!("{}-{octet}", self.bridge);
        // Registered first, so that Drop removes it even if a step below fails half way.
        hosts.push(host.clone());
        ip_batch(
            None,
            &[
                format!("netns add {}", host.netns),
                format!(
                    "link add {veth} type veth peer name eth0 netns {}",
                    host.netns
                ),
                format!("link set {veth} master {} up", self.bridge),
            ],
        )
        .unwrap_or_else(|e| panic!("Net {}: host {name}: {e}", self.hint));
        ip_batch(
            Some(&host.netns),
            &[
                format!("addr add {}/24 dev eth0", host.ip),
                "link set eth0 up".to_owned(),
                "link set lo up".to_owned(),
            ],
        )
        .unwrap_or_else(|e| panic!("Net {}: host {name}: {e}", self.hint));
        host
    }

    /// Cuts every packet between a host of `a` and a host of `b`, both ways (silently: DROP).
    /// Hosts on the same side, and the test process, still reach them all. Cuts add up until
    /// [`Net::heal`].
    pub fn partition(&self, a: &[&Host], b: &[&Host]) {
        for host in a.iter().chain(b) {
            self.check_owns(host);
        }
        assert!(
            a.iter().all(|h| !b.contains(h)),
            "Net {}: a host is on both sides of the partition",
            self.hint
        );
        let scripts = a
            .iter()
            .map(|h| (*h, b))
            .chain(b.iter().map(|h| (*h, a)))
            .filter(|(_, others)| !others.is_empty())
            .map(|(host, others)| {
                let ips: Vec<String> = others.iter().map(|o| o.ip.to_string()).collect();
                let ips = ips.join(", ");
                (
                    host,
                    cut_script(&[
                        format!("input ip saddr {{ {ips} }} drop"),
                        format!("output ip daddr {{ {ips} }} drop"),
                    ]),
                )
            })
            .collect::<Vec<_>>();
        self.nft_all(&scripts, "partition");
    }

    /// Cuts `host` from everyone, the test process included: every packet in or out of its
    /// `eth0` is dropped (its loopback still works). Until [`Net::heal`].
    pub fn isolate(&self, host: &Host) {
        self.check_owns(host);
        let script = cut_script(&[
            "input iifname \"eth0\" drop".to_owned(),
            "output oifname \"eth0\" drop".to_owned(),
        ]);
        self.nft_all(&[(host, script)], "isolate");
    }

    /// Removes every cut of [`Net::partition`] and [`Net::isolate`], on every host.
    pub fn heal(&self) {
        let hosts = self.hosts();
        let heal = format!("add table {CUT_TABLE}\ndelete table {CUT_TABLE}\n");
        let scripts: Vec<(&Host, String)> = hosts.iter().map(|h| (h, heal.clone())).collect();
        self.nft_all(&scripts, "heal");
    }

    fn check_owns(&self, host: &Host) {
        assert!(
            self.hosts.lock().unwrap().contains(host),
            "Net {}: {} is not a host of this Net ({})",
            self.hint,
            host.netns,
            self.bridge
        );
    }

    /// Runs each `nft -f -` script inside its host's namespace, all at once.
    fn nft_all(&self, scripts: &[(&Host, String)], what: &str) {
        let failures: Vec<String> = std::thread::scope(|scope| {
            let runs: Vec<_> = scripts
                .iter()
                .map(|(host, script)| {
                    scope.spawn(move || {
                        run(
                            host.command("nft").args(["-f", "-"]),
                            Some(script.as_bytes()),
                        )
                    })
                })
                .collect();
            runs.into_iter()
                .filter_map(|run| run.join().expect("an nft thread").err())
                .collect()
        });
        assert!(
            failures.is_empty(),
            "Net {}: {what}: {}",
            self.hint,
            failures.join("\n")
        );
    }

    /// Removes everything this Net made; the errors, if any.
    fn remove(&self) -> Vec<String> {
        let hosts = self.hosts();
        let mut errors = Vec::new();
        let namespaces: Vec<&str> = hosts.iter().map(|h| h.netns.as_str()).collect();
        let identities = namespace_identities(&namespaces);
        // The root ends first: deleting one deletes its pair at once, where a deleted namespace
        // goes away in the background.
        let mut batch: Vec<String> = hosts
            .iter()
            .map(|h| format!("link del {}-{}", self.bridge, h.ip.octets()[3]))
            .collect();
        batch.extend(namespaces.iter().map(|ns| format!("netns del {ns}")));
        batch.push(format!("link del {}", self.bridge));
        errors.extend(ip_batch(None, &batch).err());
        kill_inside(&namespaces, &identities);
        for rule in &self.root_rules {
            let mut args = vec!["-w".to_owned(), "-D".to_owned()];
            args.extend(rule.iter().cloned());
            errors.extend(run(Command::new("iptables").args(&args), None).err());
        }
        errors
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let errors = self.remove();
        if errors.is_empty() {
            return;
        }
        let message = format!(
            "Net {}: could not remove all of {}:\n{}",
            self.hint,
            self.bridge,
            errors.join("\n")
        );
        // A second panic while unwinding would abort, and hide the test's own failure.
        if std::thread::panicking() {
            eprintln!("{message}");
        } else {
            panic!("{message}");
        }
    }
}

/// An `nft -f` script that makes the cut table and its two chains if absent, then adds `rules`
/// (each `<chain> <rule>`).
fn cut_script(rules: &[String]) -> String {
    let mut script = format!("add table {CUT_TABLE}\n");
    for (chain, hook) in [("input", "input"), ("output", "output")] {
        script.push_str(&format!(
            "add chain {CUT_TABLE} {chain} {{ type filter hook {hook} priority filter; policy accept; }}\n"
        ));
    }
    for rule in rules {
        script.push_str(&format!("add rule {CUT_TABLE} {rule}\n"));
    }
    script
}

/// What the root namespace holds now: the names and rules that may be ours, the routes, and the
/// filter table's policies.
struct Listing {
    namespaces: Vec<String>,
    links: Vec<String>,
    routes: Vec<String>,
    /// `iptables -S` of the filter table.
    rules: Vec<String>,
}

impl Listing {
    fn take() -> Listing {
        let (namespaces, links, routes, rules) = std::thread::scope(|scope| {
            let namespaces = scope.spawn(|| run(Command::new("ip").args(["netns", "list"]), None));
            let links = scope.spawn(|| run(Command::new("ip").args(["-o", "link", "show"]), None));
            let routes =
                scope.spawn(|| run(Command::new("ip").args(["-4", "route", "show"]), None));
            let rules = scope.spawn(|| run(Command::new("iptables").args(["-w", "-S"]), None));
            let join = |handle: std::thread::ScopedJoinHandle<Result<String, String>>| {
                handle
                    .join()
                    .expect("a listing thread")
                    .unwrap_or_else(|e| panic!("netns: {e}"))
            };
            (join(namespaces), join(links), join(routes), join(rules))
        });
        Listing {
            // "btn-3-redis (id: 4)"
            namespaces: first_words(&namespaces),
            // "12: btn-3-2@if2: <BROADCAST,..."
            links: links
                .lines()
                .filter_map(|line| line.split(": ").nth(1))
                .map(|name| name.split('@').next().unwrap_or(name).to_owned())
                .collect(),
            routes: routes.lines().map(str::to_owned).collect(),
            rules: rules.lines().map(str::to_owned).collect(),
        }
    }

    /// Whether the filter table's `chain` accepts by default.
    fn policy_accepts(&self, chain: &str) -> bool {
        let policy = format!("-P {chain} ");
        self.rules
            .iter()
            .find_map(|rule| rule.strip_prefix(&policy))
            .is_none_or(|p| p.trim() == "ACCEPT")
    }

    /// The subnets that something of ours in the listing is named after.
    fn subnets(&self) -> BTreeSet<u8> {
        self.namespaces
            .iter()
            .chain(&self.links)
            .filter_map(|name| subnet_of(name))
            .chain(self.our_rules().map(|(n, _)| n))
            .collect()
    }

    /// Our iptables rules, with the subnet each is for, as `-A ...` lines.
    fn our_rules(&self) -> impl Iterator<Item = (u8, &str)> {
        self.rules.iter().filter_map(|rule| {
            if !rule.starts_with("-A ") || !rule.contains(RULE_COMMENT) {
                return None;
            }
            let words: Vec<&str> = rule.split_whitespace().collect();
            let device = words
                .windows(2)
                .find(|w| w[0] == "-i" || w[0] == "-o")
                .map(|w| w[1])?;
            Some((subnet_of(device)?, rule.as_str()))
        })
    }

    /// Removes what belongs to subnets nobody claims: a process that made them died.
    fn remove_leftovers(&self) {
        for n in self.subnets() {
            if let Some(claim) = try_claim(n) {
                remove_subnet(n, self);
                drop(claim);
            }
        }
    }

    /// Whether a route that is not ours covers addresses of subnet `n` (someone else uses it).
    fn subnet_taken(&self, n: u8) -> bool {
        let start = format!("{}.{}.{n}.", SUBNETS[0], SUBNETS[1]);
        let ours = format!("dev {PREFIX}{n} ");
        self.routes
            .iter()
            .any(|route| route.starts_with(&start) && !format!("{route} ").contains(&ours))
    }
}

/// Removes everything of `listing` named after subnet `n`, ignoring what is already gone. Only
/// for a subnet whose claim the caller holds.
fn remove_subnet(n: u8, listing: &Listing) {
    let mine = |name: &&String| subnet_of(name) == Some(n);
    let namespaces: Vec<&str> = listing
        .namespaces
        .iter()
        .filter(mine)
        .map(String::as_str)
        .collect();
    // Best effort throughout: the next Net tries again.
    let identities = namespace_identities(&namespaces);
    let bridge = format!("{PREFIX}{n}");
    // Veths before namespaces (see Net::remove), the bridge last.
    let mut batch: Vec<String> = listing
        .links
        .iter()
        .filter(mine)
        .filter(|link| **link != bridge)
        .map(|link| format!("link del {link}"))
        .collect();
    batch.extend(namespaces.iter().map(|ns| format!("netns del {ns}")));
    if listing.links.contains(&bridge) {
        batch.push(format!("link del {bridge}"));
    }
    if !batch.is_empty() {
        let _ = ip_batch(None, &batch);
    }
    kill_inside(&namespaces, &identities);
    for (_, rule) in listing.our_rules().filter(|(m, _)| *m == n) {
        let mut args = vec!["-w".to_owned(), "-D".to_owned()];
        args.extend(rule.split_whitespace().skip(1).map(str::to_owned));
        let _ = run(Command::new("iptables").args(&args), None);
    }
}

/// The identity (device and inode of its nsfs file) of each of `namespaces` that still exists,
/// taken before they are deleted: a deleted namespace lives on, nameless, while a process is
/// inside, and this is how [`kill_inside`] still finds them.
fn namespace_identities(namespaces: &[&str]) -> BTreeSet<(u64, u64)> {
    namespaces
        .iter()
        .filter_map(|ns| std::fs::metadata(format!("/run/netns/{ns}")).ok())
        .map(|meta| (meta.dev(), meta.ino()))
        .collect()
}

/// Kills (SIGKILL) every process inside the namespaces of `identities`, which the caller has just
/// deleted (`ip netns del`): a namespace is only freed when its last process exits, and a test's
/// children must not outlive its Net.
///
/// Searching before the delete raced with a child spawned just before it: while `ip netns exec`
/// execs, its command line reads empty and it is not inside yet, and a `sleep 300` outlived its
/// Net in CI (about once in a hundred spawns under load, and still after repeated searches).
/// After the delete no name is left to open, so a child that has not opened the namespace yet
/// fails to enter it. What can still end up inside has either entered already (found by the
/// identity of its namespace, as `ip netns pids` does, at any point of its exec) or opened the
/// namespace and is about to enter it, which only `ip netns exec <ns>` does, past its own exec
/// (found by its command line, [`entering`]). So one search that finds nobody new proves that
/// nobody is or will be inside; a process killed once is not counted again, since SIGKILL cannot
/// be refused.
fn kill_inside(namespaces: &[&str], identities: &BTreeSet<(u64, u64)>) {
    let mut killed = BTreeSet::new();
    loop {
        let mut pids = entering(namespaces);
        pids.extend(inside(identities));
        pids.retain(|pid| !killed.contains(pid));
        if pids.is_empty() {
            return;
        }
        // A process may exit on its own meanwhile: then `kill` fails for it alone; fine.
        let _ = run(Command::new("kill").arg("-KILL").args(&pids), None);
        killed.extend(pids);
    }
}

/// The pids whose network namespace is one of `identities`. A process that has ended (a zombie)
/// has no namespace left and is not listed.
fn inside(identities: &BTreeSet<(u64, u64)>) -> Vec<String> {
    if identities.is_empty() {
        return Vec::new();
    }
    pids_where(|dir| {
        let meta = std::fs::metadata(dir.join("ns/net")).ok()?;
        identities.contains(&(meta.dev(), meta.ino())).then_some(())
    })
}

/// The pids of `ip netns exec <ns> ...` processes for any of `namespaces`: a child just spawned by
/// [`Host::command`] runs `ip` until it has joined the namespace and exec'd its program. Its pid
/// stays the program's, so killing it kills whichever it is by then.
fn entering(namespaces: &[&str]) -> Vec<String> {
    pids_where(|dir| {
        let cmdline = std::fs::read(dir.join("cmdline")).ok()?;
        let mut args = cmdline.split(|&b| b == 0);
        let program = args.next()?;
        let is_ip = program == b"ip" || program.ends_with(b"/ip");
        let prefix: Vec<&[u8]> = args.by_ref().take(3).collect();
        let enters = is_ip
            && prefix.len() == 3
            && prefix[0] == b"netns"
            && prefix[1] == b"exec"
            && namespaces.iter().any(|ns| ns.as_bytes() == prefix[2]);
        enters.then_some(())
    })
}

/// The pids of the processes whose `/proc/<pid>` directory passes `test`.
fn pids_where(test: impl Fn(&std::path::Path) -> Option<()>) -> Vec<String> {
    let Ok(proc) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    proc.filter_map(Result::ok)
        .filter_map(|entry| {
            let pid = entry.file_name().into_string().ok()?;
            pid.bytes().all(|b| b.is_ascii_digit()).then_some(())?;
            test(&entry.path())?;
            Some(pid)
        })
        .collect()
}

/// Claims a subnet for a new Net: the first one from a rotating start (so that subnets just
/// freed are not reused at once) that nothing in `listing` uses and whose claim is free.
fn claim_subnet(listing: &Listing, hint: &str) -> (u8, UnixListener) {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let start = std::process::id() as usize * 7 + NEXT.fetch_add(1, Ordering::Relaxed);
    for i in 0..256 {
        let n = ((start + i) % 256) as u8;
        if listing.subnet_taken(n) {
            continue;
        }
        if let Some(claim) = try_claim(n) {
            return (n, claim);
        }
    }
    panic!(
        "Net {hint}: every subnet of {}.{}.0.0/16 is taken",
        SUBNETS[0], SUBNETS[1]
    );
}

/// The claim on subnet `n` (see the module doc), unless a live process holds it.
fn try_claim(n: u8) -> Option<UnixListener> {
    let name = format!("baton-netns/{n}");
    let address = SocketAddr::from_abstract_name(name.as_bytes()).expect("an abstract name");
    match UnixListener::bind_addr(&address) {
        Ok(listener) => Some(listener),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => None,
        Err(e) => panic!("netns: could not bind the abstract socket {name}: {e}"),
    }
}

/// The subnet a name of ours is for: `btn-N` or `btn-N-...`.
fn subnet_of(name: &str) -> Option<u8> {
    let rest = name.strip_prefix(PREFIX)?;
    let digits = rest.split('-').next()?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The first word of every line.
fn first_words(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// `hint` with what an `ip -batch` line or an alias could choke on replaced.
fn alias_safe(hint: &str) -> String {
    hint.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.:=".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(200)
        .collect()
}

fn ip(args: &[&str]) -> Result<String, String> {
    run(Command::new("ip").args(args), None)
}

/// `ip -force -batch -` (inside `netns` if given): every line is tried; an error if any failed.
fn ip_batch(netns: Option<&str>, lines: &[String]) -> Result<String, String> {
    let mut command = Command::new("ip");
    if let Some(netns) = netns {
        command.args(["-n", netns]);
    }
    command.args(["-force", "-batch", "-"]);
    let mut input = lines.join("\n");
    input.push('\n');
    run(&mut command, Some(input.as_bytes()))
}

/// Runs `command` to its end; its stdout, or an error that names it and holds what it printed.
fn run(command: &mut Command, stdin: Option<&[u8]>) -> Result<String, String> {
    let output = process::run_within(command, stdin, COMMAND_DEADLINE)?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    Err(format!(
        "{command:?}{} failed ({}):\n{}{}",
        stdin
            .map(|s| format!(" with input\n{}\n", String::from_utf8_lossy(s)))
            .unwrap_or_default(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}
