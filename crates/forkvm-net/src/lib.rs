//! Sandbox networking.
//!
//! # Topology
//!
//! Every sandbox that has a NIC runs its QEMU inside a network namespace of
//! its own, `fvm-<sandbox id>`:
//!
//! ```text
//!  guest (in the VM)          sandbox netns fvm-<id>                     host (root netns)
//!  eth0 172.16.0.2/30 ──── tap0 172.16.0.1/30                           
//!  mac 02:fc:00:00:00:02      mac 02:fc:00:00:00:01                     
//!                             uplink 10.231.S.2/30 ══ veth ══ fvh<id hex> 10.231.S.1/30 ── NAT ── world
//!                             nft: masquerade, port DNAT,               nft table forkvm-<home hash>:
//!                                  allow-list (forward and output),          masquerade, no host access
//!                                  stale-TCP reset                           (unless allow_host), no sandbox access
//! ```
//!
//! **Every sandbox has the same guest address, gateway and MACs.** That is
//! the whole network hand-off after a fork: a child resumes with exactly the
//! network configuration its parent had, and it is correct at once, because
//! the child's namespace looks the same from inside (same gateway address,
//! same gateway MAC, so even the guest's ARP cache stays valid). Nothing is
//! pushed into the guest on resume and no guest code runs before its network
//! works. The children never share a segment: each tap is alone in its own
//! namespace, so identical MACs and addresses cannot collide. What makes each
//! sandbox unique on the host is its uplink: a /30 from the address pool
//! (default `10.231.0.0/16`) and a host interface named after the sandbox.
//!
//! Connections that were open in the parent live on in each child's kernel.
//! Their next segment would leave through the child's own uplink, where the
//! child's conntrack has never seen the connection; the sandbox namespace
//! answers such a segment (TCP that is neither a SYN nor part of a tracked
//! connection) with a TCP reset, so the guest application sees
//! `ECONNRESET` at once instead of the segment reaching the outside under
//! another source address.
//!
//! # What lives where, and cleanup
//!
//! * Per sandbox: the namespace (with tap, uplink, its nft table and its
//!   routes) and the host end of the veth. Deleting the namespace after its
//!   QEMU exited deletes all of them (a veth dies with either end).
//! * Per daemon: one host nft table whose sets name the daemon's uplink
//!   interfaces. It is rebuilt from the daemon's state at start, so entries of
//!   sandboxes lost in a crash vanish then.
//! * Host-wide: `/run/forkvm/net/`, the registry of claimed pool addresses
//!   and of namespace owners (files created with `O_EXCL`), so that several
//!   daemons on one host never hand out the same /30.
//! * Forwarded ports are TCP listeners in the daemon ([`forward`]); they end
//!   with the daemon and are re-opened by the next one.

pub mod forward;
pub mod ns;
pub mod pool;
pub mod rules;

use std::net::Ipv4Addr;

/// The guest's address on every sandbox network.
pub const GUEST_ADDR: Ipv4Addr = Ipv4Addr::new(172, 16, 0, 2);
/// The guest's gateway: the tap's address inside the sandbox namespace.
pub const GATEWAY_ADDR: Ipv4Addr = Ipv4Addr::new(172, 16, 0, 1);
/// Prefix length of the guest link.
pub const GUEST_PREFIX: u8 = 30;
/// The guest NIC's MAC (locally administered).
pub const GUEST_MAC: &str = "02:fc:00:00:00:02";
/// The tap's MAC: fixed, so a child's ARP cache entry for the gateway,
/// inherited from its parent, is right in the child's namespace too.
pub const TAP_MAC: &str = "02:fc:00:00:00:01";
/// The tap's name inside every sandbox namespace.
pub const TAP_NAME: &str = "tap0";
/// The namespace end of the veth pair.
pub const UPLINK_NAME: &str = "uplink";
/// Prefix of sandbox namespace names.
pub const NS_PREFIX: &str = "fvm-";
/// Prefix of host-side veth names.
pub const HOST_IF_PREFIX: &str = "fvh";
/// The default address pool for uplinks.
pub const DEFAULT_POOL: &str = "10.231.0.0/16";

/// The kernel command line parameters that configure the guest's NIC.
pub fn guest_cmdline(dns: Option<Ipv4Addr>) -> String {
    let mut s = format!("forkvm.ip={GUEST_ADDR}/{GUEST_PREFIX} forkvm.gw={GATEWAY_ADDR}");
    if let Some(d) = dns {
        s.push_str(&format!(" forkvm.dns={d}"));
    }
    s
}

/// The namespace name of a sandbox.
pub fn ns_name(sandbox_id: &str) -> String {
    format!("{NS_PREFIX}{sandbox_id}")
}

/// The host-side interface name of a sandbox's uplink: `fvh` and the last
/// 12 characters of the id (Linux allows 15).
pub fn host_if_name(sandbox_id: &str) -> String {
    let tail: String = sandbox_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    let start = tail.len().saturating_sub(12);
    format!("{HOST_IF_PREFIX}{}", &tail[start..])
}

/// The first IPv4 nameserver in the host's `/etc/resolv.conf` that a guest
/// can use (not a loopback address, which means a resolver on the host
/// itself and is not reachable from a sandbox).
pub fn host_nameserver() -> Option<Ipv4Addr> {
    let text = std::fs::read_to_string("/etc/resolv.conf").ok()?;
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|v| v.trim().parse::<Ipv4Addr>().ok())
        .find(|a| !a.is_loopback() && !a.is_unspecified())
}

/// Networking errors.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("{what} failed: {detail}")]
    Command { what: String, detail: String },
    #[error("{0}")]
    Io(String),
    #[error("the address pool {pool} is exhausted ({slots} sandboxes); remove sandboxes or give a larger pool with --net-pool")]
    PoolExhausted { pool: String, slots: u32 },
    #[error("invalid {what}: {detail}")]
    Invalid { what: String, detail: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_linux_limits() {
        let n = host_if_name("sb-3f9c0a1b2c4d");
        assert_eq!(n, "fvh3f9c0a1b2c4d");
        assert!(n.len() <= 15);
        assert!(host_if_name("x").starts_with("fvh"));
        assert_eq!(ns_name("sb-1"), "fvm-sb-1");
        assert!(guest_cmdline(None).contains("forkvm.ip=172.16.0.2/30"));
        assert!(guest_cmdline(Some(Ipv4Addr::new(10, 0, 0, 53))).ends_with("forkvm.dns=10.0.0.53"));
    }
}
