//! `forkvm doctor`'s networking checks: the tools, a real namespace with a
//! tap and a veth (made and removed again), IPv4 forwarding, the address
//! pool against the host's routes, and firewalls that would drop sandbox
//! traffic. Networking is optional (sandboxes can run with `network: none`),
//! so a missing piece is a warning with its fix, never a failure.

use std::process::Command;

use crate::doctor::{check, Check, Status};

const TOOLS_FIX: &str = "apt-get install iproute2 nftables (scripts/setup.sh does)";

fn run(args: &[&str]) -> Result<String, String> {
    match Command::new(args[0]).args(&args[1..]).output() {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).into_owned()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
        Err(e) => Err(format!("cannot run {}: {e}", args[0])),
    }
}

pub fn checks(pool: &str) -> Vec<Check> {
    let mut v = Vec::new();
    let ip = run(&["ip", "-V"]);
    v.push(match &ip {
        Ok(out) => check(
            "network: iproute2",
            Status::Ok,
            out.trim().to_string(),
            None,
        ),
        Err(e) => check(
            "network: iproute2",
            Status::Warn,
            e.clone(),
            Some(TOOLS_FIX),
        ),
    });
    let nft = run(&["nft", "list", "tables"]);
    v.push(match &nft {
        Ok(_) => check(
            "network: nftables",
            Status::Ok,
            "nft works (NAT and filtering)",
            None,
        ),
        Err(e) => check(
            "network: nftables",
            Status::Warn,
            format!("nft does not work: {e}"),
            Some(TOOLS_FIX),
        ),
    });
    if ip.is_ok() {
        v.push(plumbing_check());
    }
    v.push(forwarding_check());
    v.push(pool_check(pool));
    if nft.is_ok() {
        v.push(firewall_check());
    }
    v
}

/// Really make what a sandbox gets: a namespace with a tap, and a veth to
/// the host; then remove it.
fn plumbing_check() -> Check {
    let pid = std::process::id();
    let ns = format!("fvm-doctor-{pid}");
    let host_if = format!("fvd{pid}");
    let steps: Vec<Vec<String>> = vec![
        vec!["ip".into(), "netns".into(), "add".into(), ns.clone()],
        [
            "ip", "-n", &ns, "tuntap", "add", "dev", "tap0", "mode", "tap",
        ]
        .map(String::from)
        .to_vec(),
        [
            "ip", "link", "add", &host_if, "type", "veth", "peer", "name", "uplink", "netns", &ns,
        ]
        .map(String::from)
        .to_vec(),
    ];
    let mut failed = None;
    for s in &steps {
        let args: Vec<&str> = s.iter().map(String::as_str).collect();
        if let Err(e) = run(&args) {
            failed = Some(format!("`{}` failed: {e}", args.join(" ")));
            break;
        }
    }
    let _ = run(&["ip", "link", "del", &host_if]);
    let _ = run(&["ip", "netns", "del", &ns]);
    match failed {
        None => check(
            "network: namespace, tap, veth",
            Status::Ok,
            "a sandbox network can be built here",
            None,
        ),
        Some(e) => check(
            "network: namespace, tap, veth",
            Status::Warn,
            e,
            Some("run the daemon as root, with the tun and veth modules available"),
        ),
    }
}

fn forwarding_check() -> Check {
    let cur = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap_or_default();
    if cur.trim() == "1" {
        check("network: IPv4 forwarding", Status::Ok, "on", None)
    } else {
        check(
            "network: IPv4 forwarding",
            Status::Ok,
            "off now; `forkvm serve` turns it on (NAT needs it)",
            None,
        )
    }
}

fn parse_cidr(s: &str) -> Option<(u32, u32)> {
    let (a, p) = s.split_once('/').unwrap_or((s, "32"));
    let a: std::net::Ipv4Addr = a.parse().ok()?;
    let p: u32 = p.parse().ok().filter(|p| *p <= 32)?;
    let mask = if p == 0 { 0 } else { u32::MAX << (32 - p) };
    Some((u32::from(a) & mask, mask))
}

fn overlaps(a: (u32, u32), b: (u32, u32)) -> bool {
    let m = a.1 & b.1;
    a.0 & m == b.0 & m
}

/// The uplink pool must not overlap a network the host already routes
/// (other than forkvm's own uplinks), or sandboxes could not reach it.
fn pool_check(pool: &str) -> Check {
    let Some(p) = parse_cidr(pool) else {
        return check(
            "network: address pool",
            Status::Warn,
            format!("{pool:?} is not an IPv4 CIDR"),
            Some("give --net-pool A.B.C.D/N"),
        );
    };
    let routes = run(&["ip", "-4", "route", "show"]).unwrap_or_default();
    let clash: Vec<&str> = routes
        .lines()
        .filter(|l| !l.contains(" dev fvh") && !l.starts_with("default"))
        .filter(|l| {
            l.split_whitespace()
                .next()
                .and_then(parse_cidr)
                .is_some_and(|r| overlaps(p, r))
        })
        .collect();
    if clash.is_empty() {
        check(
            "network: address pool",
            Status::Ok,
            format!("{pool} is free on this host"),
            None,
        )
    } else {
        check(
            "network: address pool",
            Status::Warn,
            format!("{pool} overlaps a host route: {}", clash.join("; ")),
            Some("start the daemon with --net-pool set to a free range"),
        )
    }
}

/// Another firewall whose forward hook drops by default (Docker sets its
/// FORWARD policy to drop) also drops sandbox traffic: with nftables every
/// base chain on a hook must accept a packet.
fn firewall_check() -> Check {
    let rules = run(&["nft", "list", "ruleset"]).unwrap_or_default();
    let mut table = String::new();
    let mut dropping = Vec::new();
    for l in rules.lines() {
        let t = l.trim();
        if let Some(rest) = t.strip_prefix("table ") {
            table = rest.trim_end_matches(" {").to_string();
        } else if t.contains("hook forward")
            && t.contains("policy drop")
            && !table.contains("forkvm")
        {
            dropping.push(table.clone());
        }
    }
    if dropping.is_empty() {
        check(
            "network: host firewall",
            Status::Ok,
            "no other forward chain drops by default",
            None,
        )
    } else {
        check(
            "network: host firewall",
            Status::Warn,
            format!(
                "a forward chain with policy drop in {} will drop sandbox traffic",
                dropping.join(", ")
            ),
            Some("accept interfaces named fvh* in that firewall (with Docker: in the DOCKER-USER chain)"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_overlap() {
        let pool = parse_cidr("10.231.0.0/16").unwrap();
        assert!(overlaps(pool, parse_cidr("10.231.5.0/24").unwrap()));
        assert!(overlaps(pool, parse_cidr("10.0.0.0/8").unwrap()));
        assert!(!overlaps(pool, parse_cidr("10.232.0.0/16").unwrap()));
        assert!(!overlaps(pool, parse_cidr("192.168.1.7").unwrap()));
        assert!(parse_cidr("nope").is_none());
    }
}
