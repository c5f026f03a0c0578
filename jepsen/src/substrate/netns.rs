//! `netns`: one network namespace per node on a bridge created for the run
//! (unique names `rrj<tag>...`, subnet `10.79.<k>.0/24`), the `tcp` fabric,
//! and iptables DROP rules inside the namespaces for partitions, one-way
//! included. Needs root. Everything it creates is listed as it is created and
//! removed by [`Substrate::teardown`](super::Substrate::teardown) (also on drop): the namespaces take
//! their iptables rules and veth ends with them; the bridge goes last. The
//! processes belong to [`OnProcesses`]; this module owns the network only.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Mutex;

use ringraft_testkit::process::NodePlace;

use super::process::{Network, OnProcesses, ip};
use super::{ClusterSpec, Result, SubstrateError, run_cmd};

/// Control-plane port inside every namespace.
pub const LISTEN_PORT: u16 = 7000;
/// Client API port inside every namespace.
pub const CLIENT_PORT: u16 = 8000;

/// See the module docs.
pub type Netns = OnProcesses<Namespaces>;

/// The bridge, the namespaces and their addresses.
pub struct Namespaces {
    bridge: String,
    namespaces: BTreeMap<u64, String>,
    addrs: BTreeMap<u64, String>,
    created: Mutex<Created>,
}

#[derive(Default)]
struct Created {
    bridge: bool,
    namespaces: Vec<String>,
}

fn unique_tag() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{:04x}", (std::process::id() ^ nanos) & 0xffff)
}

/// A /24 in 10.79.0.0/16 that no interface of the host uses.
fn free_subnet(tag: &str) -> Result<u8> {
    let used = ip(&["-o", "-4", "addr", "show"])?;
    let start = u8::from_str_radix(&tag[2..], 16).unwrap_or(0);
    for k in 0..=255u8 {
        let octet = start.wrapping_add(k);
        if !used.contains(&format!("10.79.{octet}.")) {
            return Ok(octet);
        }
    }
    Err(SubstrateError::command(
        "find a free subnet in 10.79.0.0/16",
        "every /24 is in use",
    ))
}

impl Netns {
    /// Creates the bridge and the namespaces (and tears them down again if
    /// any step fails); starts no node.
    pub fn new(spec: ClusterSpec) -> Result<Netns> {
        let tag = unique_tag();
        let octet = free_subnet(&tag)?;
        let bridge = format!("rrj{tag}b");
        let mut namespaces = BTreeMap::new();
        let mut addrs = BTreeMap::new();
        let mut places = BTreeMap::new();
        for &id in &spec.nodes {
            let ns = format!("rrj{tag}n{id}");
            let addr = format!("10.79.{octet}.{}", 10 + id);
            let dir = spec.run_dir.join("nodes").join(format!("n{id}"));
            places.insert(
                id,
                NodePlace {
                    listen: format!("{addr}:{LISTEN_PORT}"),
                    client: format!("{addr}:{CLIENT_PORT}"),
                    metrics: None,
                    data_dir: dir.join("data"),
                    ring_dir: spec.run_dir.join("nodes").join("shm"),
                    log: dir.join("serve.log"),
                    netns: Some(ns.clone()),
                },
            );
            namespaces.insert(id, ns);
            addrs.insert(id, addr);
        }
        let network = Namespaces {
            bridge,
            namespaces,
            addrs,
            created: Mutex::new(Created::default()),
        };
        let netns = OnProcesses::with(spec, places, network);
        netns.network().setup(&tag, octet)?; // on error, drop tears down what exists
        Ok(netns)
    }
}

impl Namespaces {
    fn created(&self) -> std::sync::MutexGuard<'_, Created> {
        self.created.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn setup(&self, tag: &str, octet: u8) -> Result<()> {
        let br = self.bridge.as_str();
        ip(&["link", "add", br, "type", "bridge"])?;
        self.created().bridge = true;
        ip(&["addr", "add", &format!("10.79.{octet}.1/24"), "dev", br])?;
        ip(&["link", "set", br, "up"])?;
        for (&id, ns) in &self.namespaces {
            ip(&["netns", "add", ns])?;
            self.created().namespaces.push(ns.clone());
            let host_end = format!("rrj{tag}h{id}");
            let ns_end = format!("rrj{tag}p{id}");
            ip(&[
                "link", "add", &host_end, "type", "veth", "peer", "name", &ns_end,
            ])?;
            ip(&["link", "set", &ns_end, "netns", ns])?;
            ip(&["-n", ns, "link", "set", &ns_end, "name", "eth0"])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/24", self.addrs[&id]),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["link", "set", &host_end, "master", br])?;
            ip(&["link", "set", &host_end, "up"])?;
        }
        Ok(())
    }

    fn iptables(&self, id: u64, args: &[&str]) -> Result<()> {
        let ns = &self.namespaces[&id];
        run_cmd(
            &format!("iptables {} in {ns}", args.join(" ")),
            Command::new("ip")
                .args(["netns", "exec", ns, "iptables", "-w"])
                .args(args),
        )
        .map(drop)
    }

    fn node(&self, id: u64) -> Result<()> {
        if self.namespaces.contains_key(&id) {
            Ok(())
        } else {
            Err(SubstrateError::node(id, "not a node of this cluster"))
        }
    }
}

impl Network for Namespaces {
    fn name(&self) -> &'static str {
        "netns"
    }
    fn can_partition(&self) -> bool {
        true
    }
    fn can_drop_one_way(&self) -> bool {
        true
    }
    fn partition(&self, groups: &[Vec<u64>]) -> Result<()> {
        self.heal()?;
        for (g, group) in groups.iter().enumerate() {
            for &id in group {
                self.node(id)?;
                for (h, other) in groups.iter().enumerate() {
                    if g == h {
                        continue;
                    }
                    for &peer in other {
                        self.node(peer)?;
                        self.iptables(
                            id,
                            &["-A", "INPUT", "-s", &self.addrs[&peer], "-j", "DROP"],
                        )?;
                    }
                }
            }
        }
        Ok(())
    }
    fn drop_one_way(&self, from: u64, to: u64) -> Result<()> {
        self.node(from)?;
        self.node(to)?;
        self.iptables(to, &["-A", "INPUT", "-s", &self.addrs[&from], "-j", "DROP"])
    }
    fn heal(&self) -> Result<()> {
        for &id in self.namespaces.keys() {
            self.iptables(id, &["-F", "INPUT"])?;
        }
        Ok(())
    }
    fn teardown(&self) -> Result<()> {
        let mut created = self.created();
        let mut errors = Vec::new();
        for ns in created.namespaces.drain(..) {
            if let Err(e) = ip(&["netns", "del", &ns]) {
                errors.push(e.to_string());
            }
        }
        if created.bridge {
            created.bridge = false;
            if let Err(e) = ip(&["link", "del", &self.bridge]) {
                errors.push(e.to_string());
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(SubstrateError::command("netns teardown", errors.join("; ")))
        }
    }
}
