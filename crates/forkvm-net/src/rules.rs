//! The nftables rulesets, rendered as `nft -f` scripts (pure functions).
//!
//! Two tables, both replaced atomically (`nft -f` applies a whole script as
//! one transaction, and each script first deletes the table it then writes):
//!
//! * **In each sandbox namespace**, `inet forkvm`: masquerade out of the
//!   uplink, DNAT of forwarded ports to the guest, the egress allow-list, and
//!   the reset of TCP segments of connections the namespace never saw open
//!   (connections inherited from a parent snapshot). The allow-list holds
//!   for every packet that leaves through the uplink: the guest's, which the
//!   namespace forwards, and those that a process inside the namespace sends
//!   itself (the `output` hook). QEMU runs in that namespace, so a
//!   compromised QEMU is held to the guest's list. It dies with the
//!   namespace, so a sandbox's rules cannot outlive it.
//! * **On the host**, one `inet forkvm-<home hash>` per daemon: masquerade for
//!   the daemon's uplinks, and drops of anything a sandbox sends to the host
//!   itself (the daemon's API included) or to another sandbox. An allow-list
//!   entry opens the destination it names on another sandbox; it opens the
//!   host only when the sandbox was given `allow_host`, so `0.0.0.0/0:PORT`
//!   does not reach the host's own service on PORT by accident. Nothing else
//!   from a sandbox is for the host: the guest's addresses come from the
//!   kernel command line (no DHCP), and its nameserver is never the host's
//!   loopback. Interfaces are matched by set membership, not by a name
//!   wildcard, so two daemons' tables never act on each other's sandboxes.

use std::fmt::Write;
use std::net::Ipv4Addr;

use crate::{NetError, GUEST_ADDR, TAP_NAME, UPLINK_NAME};

/// One allow-list entry: a destination network and, optionally, ports (TCP
/// and UDP). No ports means every port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allow {
    pub addr: Ipv4Addr,
    pub prefix: u8,
    pub ports: Vec<u16>,
}

impl Allow {
    /// Parse `A.B.C.D[/N]`.
    pub fn parse(cidr: &str, ports: Vec<u16>) -> Result<Allow, NetError> {
        let bad = |d: &str| NetError::Invalid {
            what: format!("egress CIDR {cidr:?}"),
            detail: d.to_string(),
        };
        let (a, p) = match cidr.split_once('/') {
            Some((a, p)) => (a, p.parse::<u8>().map_err(|_| bad("bad prefix length"))?),
            None => (cidr, 32),
        };
        let addr: Ipv4Addr = a
            .parse()
            .map_err(|_| bad("not an IPv4 address (IPv6 is not supported)"))?;
        if p > 32 {
            return Err(bad("the prefix length must be at most 32"));
        }
        let mask = if p == 0 { 0 } else { u32::MAX << (32 - p) };
        if u32::from(addr) & !mask != 0 {
            return Err(bad("host bits are set; give the network address"));
        }
        if ports.contains(&0) {
            return Err(NetError::Invalid {
                what: format!("egress ports for {cidr}"),
                detail: "port 0 is not a port".into(),
            });
        }
        Ok(Allow {
            addr,
            prefix: p,
            ports,
        })
    }

    fn cidr(&self) -> String {
        format!("{}/{}", self.addr, self.prefix)
    }
}

/// What one sandbox namespace's table does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRules {
    /// Guest TCP ports reachable through the uplink (port forwarding).
    pub forwarded: Vec<u16>,
    /// `None`: any egress; `Some(list)`: only these destinations.
    pub allow: Option<Vec<Allow>>,
}

fn port_set(ports: &[u16]) -> String {
    let v: Vec<String> = ports.iter().map(u16::to_string).collect();
    format!("{{ {} }}", v.join(", "))
}

/// The `nft -f` script for a sandbox namespace.
pub fn sandbox_script(r: &SandboxRules) -> String {
    let mut s = String::new();
    // `add` then `delete` makes the delete valid whether or not the table
    // exists, so the script is idempotent.
    let _ = writeln!(s, "add table inet forkvm\ndelete table inet forkvm");
    let _ = writeln!(s, "table inet forkvm {{");
    let _ = writeln!(
        s,
        "  chain prerouting {{\n    type nat hook prerouting priority dstnat; policy accept;"
    );
    if !r.forwarded.is_empty() {
        let _ = writeln!(
            s,
            "    iifname \"{UPLINK_NAME}\" tcp dport {} dnat ip to {GUEST_ADDR}",
            port_set(&r.forwarded)
        );
    }
    let _ = writeln!(s, "  }}");
    let _ = writeln!(
        s,
        "  chain postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;\n    oifname \"{UPLINK_NAME}\" masquerade\n  }}"
    );
    let _ = writeln!(
        s,
        "  chain forward {{\n    type filter hook forward priority filter; policy drop;"
    );
    let _ = writeln!(s, "    ct state established,related accept");
    // A segment that opens nothing and belongs to nothing tracked here: a
    // connection the guest inherited from its parent. Reset it in the guest
    // rather than let it leave under this sandbox's address.
    let _ = writeln!(
        s,
        "    iifname \"{TAP_NAME}\" meta l4proto tcp tcp flags & (fin | syn | rst | ack) != syn reject with tcp reset"
    );
    let _ = writeln!(s, "    ct state invalid drop");
    let _ = writeln!(
        s,
        "    iifname \"{UPLINK_NAME}\" oifname \"{TAP_NAME}\" ct status dnat accept"
    );
    match &r.allow {
        None => {
            let _ = writeln!(
                s,
                "    iifname \"{TAP_NAME}\" oifname \"{UPLINK_NAME}\" accept"
            );
        }
        Some(list) => {
            let from_guest = format!("iifname \"{TAP_NAME}\" oifname \"{UPLINK_NAME}\"");
            allow_rules(&mut s, &from_guest, list);
            // Refused egress fails fast in the guest instead of timing out.
            let _ = writeln!(
                s,
                "    iifname \"{TAP_NAME}\" meta l4proto tcp reject with tcp reset"
            );
            let _ = writeln!(
                s,
                "    iifname \"{TAP_NAME}\" reject with icmp type admin-prohibited"
            );
        }
    }
    let _ = writeln!(s, "  }}");
    if let Some(list) = &r.allow {
        // What a process in the namespace sends itself (QEMU, or anything
        // that joins the namespace) meets the same list on its way out.
        // Only the uplink is filtered: the tap carries the namespace's
        // answers to the guest (the resets above, the network probe's).
        let _ = writeln!(
            s,
            "  chain output {{\n    type filter hook output priority filter; policy accept;\n    oifname != \"{UPLINK_NAME}\" accept\n    ct state established,related accept"
        );
        allow_rules(&mut s, &format!("oifname \"{UPLINK_NAME}\""), list);
        // A local sender learns at once: a reset for TCP, EPERM from its
        // send call for anything else.
        let _ = writeln!(
            s,
            "    meta l4proto tcp reject with tcp reset\n    drop\n  }}"
        );
    }
    let _ = writeln!(s, "}}");
    s
}

/// One `accept` rule per allow-list entry, each starting with `matches`.
fn allow_rules(s: &mut String, matches: &str, list: &[Allow]) {
    for a in list {
        if a.ports.is_empty() {
            let _ = writeln!(s, "    {matches} ip daddr {} accept", a.cidr());
        } else {
            let _ = writeln!(
                s,
                "    {matches} ip daddr {} meta l4proto {{ tcp, udp }} th dport {} accept",
                a.cidr(),
                port_set(&a.ports)
            );
        }
    }
}

/// One sandbox as the host table sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEntry {
    /// The host end of its uplink.
    pub iface: String,
    /// Its allow-list (which may open other sandboxes to it, and the host
    /// too with `allow_host`).
    pub allow: Option<Vec<Allow>>,
    /// Whether the allow-list's entries apply to the host itself.
    pub allow_host: bool,
}

/// The host table's name for the daemon whose home hashes to `home_hash`.
pub fn host_table(home_hash: &str) -> String {
    format!("forkvm-{home_hash}")
}

/// Set elements for one sandbox: its interface, its `allow` elements and
/// its `host` elements (the same ones with `allow_host`, else none).
fn host_elements(e: &HostEntry) -> (String, Vec<String>, Vec<String>) {
    let iface = format!("\"{}\"", e.iface);
    let mut allow = Vec::new();
    for a in e.allow.iter().flatten() {
        if a.ports.is_empty() {
            allow.push(format!("{iface} . {} . 0-65535", a.cidr()));
        } else {
            for p in &a.ports {
                allow.push(format!("{iface} . {} . {p}", a.cidr()));
            }
        }
    }
    let host = if e.allow_host {
        allow.clone()
    } else {
        Vec::new()
    };
    (iface, allow, host)
}

/// The whole host table, with every sandbox's entries.
pub fn host_script(table: &str, entries: &[HostEntry]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "add table inet {table}\ndelete table inet {table}\ntable inet {table} {{"
    );
    let _ = writeln!(s, "  set ifaces {{\n    type ifname\n  }}");
    // `allow`: destinations on other sandboxes' uplinks; `host`: the
    // host's own addresses and ports, for sandboxes with `allow_host` only.
    for set in ["allow", "host"] {
        let _ = writeln!(
            s,
            "  set {set} {{\n    type ifname . ipv4_addr . inet_service\n    flags interval\n  }}"
        );
    }
    // Slightly before the default filter priority, so our verdicts come
    // first; a later table (for instance Docker's) can still drop.
    let _ = writeln!(
        s,
        "  chain input {{\n    type filter hook input priority filter - 5; policy accept;\n    iifname != @ifaces accept\n    ct state established,related accept\n    meta l4proto {{ tcp, udp }} iifname . ip daddr . th dport @host accept\n    drop\n  }}"
    );
    let _ = writeln!(
        s,
        "  chain forward {{\n    type filter hook forward priority filter - 5; policy accept;\n    oifname @ifaces ct state established,related accept\n    oifname @ifaces ct status dnat accept\n    iifname @ifaces oifname \"fvh*\" meta l4proto {{ tcp, udp }} iifname . ip daddr . th dport @allow accept\n    iifname @ifaces oifname \"fvh*\" drop\n    iifname @ifaces accept\n    oifname @ifaces drop\n  }}"
    );
    let _ = writeln!(
        s,
        "  chain postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;\n    iifname @ifaces oifname != \"fvh*\" masquerade\n  }}\n}}"
    );
    for e in entries {
        s.push_str(&add_host_entry(table, e));
    }
    s
}

/// Add one sandbox to the host table.
pub fn add_host_entry(table: &str, e: &HostEntry) -> String {
    let (iface, allow, host) = host_elements(e);
    let mut s = format!("add element inet {table} ifaces {{ {iface} }}\n");
    for (set, elems) in [("allow", &allow), ("host", &host)] {
        if !elems.is_empty() {
            let _ = writeln!(
                s,
                "add element inet {table} {set} {{ {} }}",
                elems.join(", ")
            );
        }
    }
    s
}

/// Remove one sandbox from the host table.
pub fn remove_host_entry(table: &str, e: &HostEntry) -> String {
    let (iface, allow, host) = host_elements(e);
    let mut s = String::new();
    for (set, elems) in [("host", &host), ("allow", &allow)] {
        if !elems.is_empty() {
            let _ = writeln!(
                s,
                "delete element inet {table} {set} {{ {} }}",
                elems.join(", ")
            );
        }
    }
    let _ = writeln!(s, "delete element inet {table} ifaces {{ {iface} }}");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_entries_parse_and_refuse_bad_input() {
        let a = Allow::parse("10.77.0.0/24", vec![80]).unwrap();
        assert_eq!(a.cidr(), "10.77.0.0/24");
        assert_eq!(Allow::parse("10.1.2.3", vec![]).unwrap().prefix, 32);
        for (c, p, why) in [
            ("10.77.0.1/24", vec![], "host bits"),
            ("::1/128", vec![], "IPv6"),
            ("10.0.0.0/33", vec![], "at most 32"),
            ("10.0.0.0/x", vec![], "prefix"),
            ("10.0.0.0/8", vec![0], "port 0"),
        ] {
            let e = Allow::parse(c, p).unwrap_err().to_string();
            assert!(e.contains(why), "{c}: {e}");
        }
    }

    #[test]
    fn sandbox_script_forwards_ports_and_resets_inherited_tcp() {
        let s = sandbox_script(&SandboxRules {
            forwarded: vec![8000, 9000],
            allow: None,
        });
        assert!(s.starts_with("add table inet forkvm\ndelete table inet forkvm\n"));
        assert!(s.contains("tcp dport { 8000, 9000 } dnat ip to 172.16.0.2"));
        assert!(s.contains("oifname \"uplink\" masquerade"));
        assert!(s.contains("!= syn reject with tcp reset"));
        assert!(s.contains("iifname \"tap0\" oifname \"uplink\" accept"));
        // Without forwarded ports there is no DNAT rule at all.
        let s = sandbox_script(&SandboxRules {
            forwarded: vec![],
            allow: None,
        });
        assert!(!s.contains("dnat ip to"));
    }

    #[test]
    fn allow_list_replaces_the_open_egress() {
        let s = sandbox_script(&SandboxRules {
            forwarded: vec![],
            allow: Some(vec![
                Allow::parse("10.77.0.0/24", vec![8080, 53]).unwrap(),
                Allow::parse("192.0.2.7", vec![]).unwrap(),
            ]),
        });
        assert!(!s.contains("oifname \"uplink\" accept"));
        assert!(s.contains(
            "ip daddr 10.77.0.0/24 meta l4proto { tcp, udp } th dport { 8080, 53 } accept"
        ));
        assert!(s.contains("ip daddr 192.0.2.7/32 accept"));
        assert!(s.contains("reject with icmp type admin-prohibited"));
        // The namespace's own processes meet the same list on the uplink.
        let out = &s[s.find("chain output").expect("an output chain")..];
        assert!(out.contains("type filter hook output priority filter; policy accept;"));
        assert!(out.contains("oifname != \"uplink\" accept"));
        assert!(out.contains(
            "oifname \"uplink\" ip daddr 10.77.0.0/24 meta l4proto { tcp, udp } th dport { 8080, 53 } accept"
        ));
        assert!(out.contains("oifname \"uplink\" ip daddr 192.0.2.7/32 accept"));
        assert!(out.trim_end().ends_with("drop\n  }\n}"), "{out}");
        // An empty list allows nothing.
        let s = sandbox_script(&SandboxRules {
            forwarded: vec![],
            allow: Some(vec![]),
        });
        assert!(!s.contains("ip daddr"));
        assert!(s.contains("meta l4proto tcp reject with tcp reset"));
        assert!(s.contains("chain output"));
        // Open egress needs no output filter: the host table still keeps
        // the host and other sandboxes out.
        let s = sandbox_script(&SandboxRules {
            forwarded: vec![],
            allow: None,
        });
        assert!(!s.contains("chain output"));
    }

    #[test]
    fn host_table_blocks_host_and_sandboxes_but_honours_the_allow_list() {
        let t = host_table("0123abcd");
        let e = HostEntry {
            iface: "fvh000000000001".into(),
            allow: Some(vec![Allow::parse("10.0.0.1", vec![7000]).unwrap()]),
            allow_host: true,
        };
        let s = host_script(&t, std::slice::from_ref(&e));
        assert!(s.contains("table inet forkvm-0123abcd {"));
        assert!(s.contains("iifname != @ifaces accept"));
        assert!(s.contains("iifname @ifaces oifname \"fvh*\" drop"));
        // The host's input honours only the `host` set.
        let input = &s[s.find("chain input").unwrap()..s.find("chain forward").unwrap()];
        assert!(input.contains("th dport @host accept"), "{input}");
        assert!(!input.contains("@allow"), "{input}");
        assert!(s.contains("add element inet forkvm-0123abcd ifaces { \"fvh000000000001\" }"));
        assert!(s.contains(
            "add element inet forkvm-0123abcd allow { \"fvh000000000001\" . 10.0.0.1/32 . 7000 }"
        ));
        assert!(s.contains(
            "add element inet forkvm-0123abcd host { \"fvh000000000001\" . 10.0.0.1/32 . 7000 }"
        ));
        let r = remove_host_entry(&t, &e);
        assert!(r.contains("delete element inet forkvm-0123abcd allow"));
        assert!(r.contains("delete element inet forkvm-0123abcd host"));
        assert!(r.ends_with("delete element inet forkvm-0123abcd ifaces { \"fvh000000000001\" }\n"));
        // Without `allow_host`, even 0.0.0.0/0 leaves the host closed.
        let open = HostEntry {
            iface: "fvhx".into(),
            allow: Some(vec![Allow::parse("0.0.0.0/0", vec![]).unwrap()]),
            allow_host: false,
        };
        let a = add_host_entry(&t, &open);
        assert!(a.contains("allow { \"fvhx\" . 0.0.0.0/0 . 0-65535 }"));
        assert!(!a.contains(" host "), "{a}");
        assert!(!remove_host_entry(&t, &open).contains(" host "));
        assert!(!add_host_entry(
            &t,
            &HostEntry {
                iface: "fvhy".into(),
                allow: None,
                allow_host: false,
            }
        )
        .contains("allow"));
    }
}
