//! Sandbox networks as the daemon runs them: which sandboxes get a NIC, the
//! checks on a spawn's network request, setting a network up and tearing it
//! down, forwarded ports, and reconciliation at start. The topology and the
//! rules are described in the `forkvm-net` crate.
//!
//! Lifecycle of one sandbox's network:
//! 1. `create_ns` before QEMU starts (a warm pool does this ahead of time):
//!    the namespace and its tap; QEMU is started inside it.
//! 2. `setup` before the guest runs (a clone) or right after its boot: for
//!    `nat`, a pool slot, the uplink, the namespace's rules, the host table
//!    entry and the forwarded ports. The result is stored with the sandbox.
//! 3. `teardown` once QEMU has exited: all of the above, in reverse.
//! 4. `reconcile` at daemon start: the host table is rebuilt from the
//!    running sandboxes, their forwarded ports re-opened, and namespaces
//!    and pool claims of sandboxes that no longer exist are removed.

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Mutex;

use forkvm_api::{EgressRule, NetInfo, NetworkMode, PortForward};
use forkvm_net::forward::Forward;
use forkvm_net::pool::{Pool, Registry, Slot};
use forkvm_net::rules::{self, Allow, HostEntry, SandboxRules};
use forkvm_net::{ns, NetError};

use crate::error::{EngineError, ErrorKind, HintAction};

mod change;
pub mod types;
pub use types::{NetRequest, SandboxNet};

/// Most ports one sandbox may publish.
pub const MAX_PORTS: usize = 64;
/// Most allow-list entries per sandbox.
pub const MAX_EGRESS: usize = 256;
/// The port the network probe dials on the gateway: nothing listens there,
/// so the namespace's kernel answers with a reset, which proves the path.
const PROBE_PORT: u16 = 9;
/// How long a guest may take to prove its network path. It is the budget
/// of the identity step too: in a 100-way fan-out under TCG each of the 100
/// resuming guests gets about a fiftieth of a core, and a 10 s budget failed
/// 5 of 6 such fan-outs (bench/fanout) while every network was sound.
const PROBE_BUDGET: std::time::Duration = std::time::Duration::from_secs(60);

/// The daemon's networking.
pub struct Net {
    /// `Err(why)` when this host cannot give sandboxes networks.
    status: Result<(), String>,
    pool: Pool,
    registry: Registry,
    table: String,
    home: PathBuf,
    dns: Option<Ipv4Addr>,
    forwards: Mutex<HashMap<String, Vec<Forward>>>,
}

fn net_err(e: NetError) -> EngineError {
    match e {
        NetError::PoolExhausted { .. } => EngineError::new(ErrorKind::LimitExceeded, e.to_string()),
        other => EngineError::new(
            ErrorKind::NetworkFailed,
            format!("cannot set up the sandbox network: {other}"),
        )
        .hint(HintAction::CheckHost),
    }
}

/// `allow_host` (default `false`) for the allow-list `egress`: it needs one.
pub fn check_allow_host(
    egress: Option<&[EgressRule]>,
    allow_host: Option<bool>,
) -> Result<bool, EngineError> {
    let allow_host = allow_host.unwrap_or(false);
    if allow_host && egress.is_none() {
        return Err(EngineError::invalid(
            "allow_host opens the host to the egress allow-list's entries, and there is no allow-list: name the host's addresses and ports with egress (--allow HOST_IP:PORT)",
        ));
    }
    Ok(allow_host)
}

/// Check an egress allow-list: its size and every entry.
pub fn check_egress(egress: Option<&[EgressRule]>) -> Result<(), EngineError> {
    let Some(list) = egress else { return Ok(()) };
    if list.len() > MAX_EGRESS {
        return Err(EngineError::invalid(format!(
            "at most {MAX_EGRESS} egress entries (got {})",
            list.len()
        )));
    }
    for r in list {
        Allow::parse(&r.cidr, r.ports.clone()).map_err(|e| EngineError::invalid(e.to_string()))?;
    }
    Ok(())
}

impl Net {
    /// Check what networking needs and load the host table (empty; the
    /// running sandboxes are added by `reconcile`).
    pub async fn start(home: &std::path::Path, pool: &str) -> Result<Net, String> {
        let pool: Pool = pool.parse().map_err(|e: NetError| e.to_string())?;
        let table = rules::host_table(&crate::config::home_hash(home));
        let mut net = Net {
            status: Ok(()),
            pool,
            registry: Registry::default(),
            table,
            home: home.to_path_buf(),
            dns: forkvm_net::host_nameserver(),
            forwards: Mutex::new(HashMap::new()),
        };
        net.status = net.probe().await;
        if let Err(why) = &net.status {
            tracing::warn!("sandboxes get no network on this host: {why}");
        }
        Ok(net)
    }

    async fn probe(&self) -> Result<(), String> {
        if !std::path::Path::new("/dev/net/tun").exists() {
            return Err("/dev/net/tun is missing (load the tun module: modprobe tun)".into());
        }
        ns::run(None, "ip", &["-V"], None)
            .await
            .map_err(|e| format!("{e}"))?;
        ns::enable_host_forwarding().map_err(|e| e.to_string())?;
        // A table left by the previous daemon holds the interfaces of the
        // sandboxes still running: keep it until `reconcile` replaces it (in
        // one nft transaction) after they are re-attached, and the QEMUs no
        // record holds are killed (crate::cleanup). Emptying it here left
        // them unfiltered towards the host in between.
        let exists = ns::run(None, "nft", &["list", "table", "inet", &self.table], None)
            .await
            .is_ok();
        if !exists {
            ns::nft(None, &rules::host_script(&self.table, &[]))
                .await
                .map_err(|e| format!("{e}"))?;
        }
        Ok(())
    }

    pub fn available(&self) -> bool {
        self.status.is_ok()
    }

    /// Delete this daemon's host table (at shutdown, when no sandbox is
    /// left running that its rules serve; the next daemon makes it again).
    pub async fn remove_host_table(&self) {
        if self.status.is_err() {
            return;
        }
        let script = format!("delete table inet {}\n", self.table);
        if let Err(e) = ns::nft(None, &script).await {
            tracing::debug!("removing the host table {}: {e}", self.table);
        }
    }

    pub fn info(&self) -> NetInfo {
        NetInfo {
            available: self.available(),
            reason: self.status.as_ref().err().cloned(),
            pool: self.pool.to_string(),
            default_mode: self.default_mode(),
        }
    }

    fn default_mode(&self) -> NetworkMode {
        if self.available() {
            NetworkMode::Nat
        } else {
            NetworkMode::None
        }
    }

    /// The NIC every networked sandbox has (the same as
    /// `forkvm_qemu::Nic::standard`, which machines recorded before the NIC
    /// was stored get: checked by a test below).
    pub fn nic() -> forkvm_qemu::spec::Nic {
        forkvm_qemu::spec::Nic {
            tap: forkvm_net::TAP_NAME.into(),
            mac: forkvm_net::GUEST_MAC.into(),
        }
    }

    /// Kernel parameters for a booted sandbox's NIC.
    pub fn cmdline(&self) -> String {
        forkvm_net::guest_cmdline(self.dns)
    }

    /// Does a machine booted with this command line have our NIC?
    /// The network a resumed sandbox gets back: the one it had when it was
    /// paused (`None`: the default), checked as a spawn's would be.
    pub fn validate_resume(
        &self,
        paused: Option<&SandboxNet>,
        nic: bool,
    ) -> Result<NetRequest, EngineError> {
        match paused {
            Some(n) => self.validate(
                Some(n.mode),
                Some(&n.ports),
                n.egress.as_deref(),
                Some(n.allow_host),
                Some(true),
                nic,
                1,
            ),
            None => self.validate(None, None, None, None, Some(true), nic, 1),
        }
    }

    /// Check a spawn's network fields. `nic` says whether the machine to be
    /// spawned has a NIC; `count` how many sandboxes share the request.
    #[allow(clippy::too_many_arguments)]
    pub fn validate(
        &self,
        mode: Option<NetworkMode>,
        ports: Option<&[PortForward]>,
        egress: Option<&[EgressRule]>,
        allow_host: Option<bool>,
        wait: Option<bool>,
        nic: bool,
        count: u32,
    ) -> Result<NetRequest, EngineError> {
        let mode = match mode {
            Some(NetworkMode::Nat) if !self.available() => {
                return Err(EngineError::new(ErrorKind::NetworkUnavailable, format!(
                        "this host cannot give sandboxes a network ({}); spawn with network: none",
                        self.status.as_ref().err().map_or("", String::as_str)
                    ),
                )
                .hint(HintAction::CheckHost))
            }
            Some(NetworkMode::Nat) if !nic => {
                return Err(EngineError::invalid(
                    "this snapshot's machine has no network device (it was taken on a host or a forkvm version without networking); spawn it with network: none",
                ))
            }
            Some(m) => m,
            None if nic => self.default_mode(),
            None => NetworkMode::None,
        };
        let ports = ports.unwrap_or_default().to_vec();
        let egress = egress.map(<[EgressRule]>::to_vec);
        if mode == NetworkMode::None && (!ports.is_empty() || egress.is_some()) {
            return Err(EngineError::invalid("ports and egress need network: nat"));
        }
        let allow_host = check_allow_host(egress.as_deref(), allow_host)?;
        if ports.len() > MAX_PORTS {
            return Err(EngineError::invalid(format!(
                "at most {MAX_PORTS} ports may be published (got {})",
                ports.len()
            )));
        }
        let mut seen_guest = HashSet::new();
        let mut seen_host = HashSet::new();
        for p in &ports {
            if p.guest == 0 {
                return Err(EngineError::invalid("guest port 0 is not a port"));
            }
            if !seen_guest.insert(p.guest) {
                return Err(EngineError::invalid(format!(
                    "guest port {} is listed twice",
                    p.guest
                )));
            }
            if p.host != 0 && !seen_host.insert(p.host) {
                return Err(EngineError::invalid(format!(
                    "host port {} is listed twice",
                    p.host
                )));
            }
            if p.host != 0 && count > 1 {
                return Err(EngineError::invalid(format!(
                    "{count} sandboxes cannot share host port {}: give host 0 to have one allocated for each",
                    p.host
                )));
            }
        }
        check_egress(egress.as_deref())?;
        Ok(NetRequest {
            mode,
            ports,
            egress,
            allow_host,
            wait: wait.unwrap_or(true) && mode == NetworkMode::Nat,
        })
    }

    /// Create a sandbox's namespace and tap; returns the path QEMU is
    /// started in.
    pub async fn create_ns(&self, id: &str) -> Result<PathBuf, EngineError> {
        let name = forkvm_net::ns_name(id);
        self.registry.set_ns_owner(&name, &self.home);
        if let Err(e) = ns::create(&name).await {
            self.registry.forget_ns(&name);
            return Err(net_err(e));
        }
        Ok(ns::ns_path(&name))
    }

    /// Connect a sandbox (whose namespace exists) as `req` asks.
    pub async fn setup(&self, id: &str, req: &NetRequest) -> Result<SandboxNet, EngineError> {
        if req.mode == NetworkMode::None {
            return Ok(SandboxNet {
                mode: NetworkMode::None,
                slot: None,
                ports: Vec::new(),
                egress: None,
                allow_host: false,
            });
        }
        let name = forkvm_net::ns_name(id);
        let host_if = forkvm_net::host_if_name(id);
        let slot = self
            .registry
            .claim(&self.pool, id, &self.home)
            .map_err(net_err)?;
        let mut net = SandboxNet {
            mode: NetworkMode::Nat,
            slot: Some(slot.host),
            ports: Vec::new(),
            egress: req.egress.clone(),
            allow_host: req.allow_host,
        };
        let r = async {
            ns::add_uplink(&name, &host_if, slot)
                .await
                .map_err(net_err)?;
            let script = rules::sandbox_script(&SandboxRules {
                forwarded: req.ports.iter().map(|p| p.guest).collect(),
                allow: net.allow(),
            });
            ns::nft(Some(&name), &script).await.map_err(net_err)?;
            ns::nft(
                None,
                &rules::add_host_entry(
                    &self.table,
                    &HostEntry {
                        iface: host_if.clone(),
                        allow: net.allow(),
                        allow_host: net.allow_host,
                    },
                ),
            )
            .await
            .map_err(net_err)?;
            net.ports = self.open_forwards(id, slot, &req.ports).await?;
            Ok::<(), EngineError>(())
        }
        .await;
        if let Err(e) = r {
            self.release_uplink(id, &net).await;
            let _ = ns::run(None, "ip", &["link", "del", &host_if], None).await;
            return Err(e);
        }
        Ok(net)
    }

    async fn open_forwards(
        &self,
        id: &str,
        slot: Slot,
        ports: &[PortForward],
    ) -> Result<Vec<PortForward>, EngineError> {
        let mut opened = Vec::new();
        for p in ports {
            match forkvm_net::forward::open(p.host, slot.ns, p.guest).await {
                Ok(f) => opened.push(f),
                Err(e) => {
                    let kind = if e.kind() == std::io::ErrorKind::AddrInUse {
                        ErrorKind::Conflict
                    } else {
                        ErrorKind::NetworkFailed
                    };
                    return Err(EngineError::new(
                        kind,
                        format!(
                            "cannot publish guest port {} on host port 127.0.0.1:{}: {e}; pick another host port or give 0",
                            p.guest, p.host
                        ),
                    ));
                }
            }
        }
        let bound = opened
            .iter()
            .map(|f| PortForward {
                guest: f.guest_port,
                host: f.host_port,
            })
            .collect();
        self.forwards
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), opened);
        Ok(bound)
    }

    /// Undo the host-side parts of what [`Net::setup`] did for `id`
    /// (forwarded ports, the host table entry, the uplink veth, the pool
    /// claim) but keep its namespace and the tap in it. Part of every
    /// teardown; on its own, when a warm pool's ready-made network is not
    /// the one a spawn asks for ([`Net::setup`] then starts over: its
    /// sandbox ruleset replaces the old one whole).
    pub async fn release_uplink(&self, id: &str, net: &SandboxNet) {
        self.forwards
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        if let Some(host) = net.slot {
            let entry = HostEntry {
                iface: forkvm_net::host_if_name(id),
                allow: net.allow(),
                allow_host: net.allow_host,
            };
            if let Err(e) = ns::nft(None, &rules::remove_host_entry(&self.table, &entry)).await {
                tracing::debug!("host table entry of {id}: {e}");
            }
            // Deleting the namespace would take the veth with it, but the
            // kernel destroys namespaces asynchronously: delete the link
            // now, so that it is gone when the removal returns.
            let host_if = forkvm_net::host_if_name(id);
            if std::path::Path::new("/sys/class/net")
                .join(&host_if)
                .exists()
            {
                let _ = ns::run(None, "ip", &["link", "del", &host_if], None).await;
            }
            self.registry.release(Slot::from_host(host), id);
        }
    }

    /// Remove everything of a sandbox's network. Call once its QEMU has
    /// exited (a namespace with a live process in it outlives its name).
    pub async fn teardown(&self, id: &str, net: Option<&SandboxNet>) {
        if let Some(n) = net {
            self.release_uplink(id, n).await;
        } else {
            self.forwards
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(id);
        }
        // A claim that never made it into the record (a spawn that failed
        // half-way) is found by its owner line; a recorded one was released
        // above, so the registry is only scanned when there is no record.
        if net.and_then(|n| n.slot).is_none() {
            for (slot, owner) in self.registry.claims_of(&self.home) {
                if owner == id {
                    self.registry.release(slot, id);
                }
            }
        }
        let name = forkvm_net::ns_name(id);
        if let Err(e) = ns::delete(&name).await {
            tracing::warn!("cannot delete namespace {name}: {e}");
        }
        self.registry.forget_ns(&name);
    }

    /// At start: rebuild the host table for the running sandboxes, re-open
    /// their ports, and remove what belongs to sandboxes that are gone.
    pub async fn reconcile(&self, running: &[(String, Option<SandboxNet>)]) {
        if !self.available() {
            return;
        }
        let live: HashSet<&str> = running.iter().map(|(id, _)| id.as_str()).collect();
        let entries: Vec<HostEntry> = running
            .iter()
            .filter_map(|(id, n)| {
                let n = n.as_ref()?;
                n.slot.map(|_| HostEntry {
                    iface: forkvm_net::host_if_name(id),
                    allow: n.allow(),
                    allow_host: n.allow_host,
                })
            })
            .collect();
        if let Err(e) = ns::nft(None, &rules::host_script(&self.table, &entries)).await {
            tracing::error!("cannot rebuild the host nft table: {e}");
        }
        for (id, n) in running {
            let Some(n) = n else { continue };
            let Some(host) = n.slot else { continue };
            if let Err(e) = self
                .open_forwards(id, Slot::from_host(host), &n.ports)
                .await
            {
                tracing::warn!("sandbox {id}: {}", e.message);
            }
        }
        for name in ns::list() {
            let id = &name[forkvm_net::NS_PREFIX.len()..];
            let owner = self.registry.ns_owner(&name);
            let ours = owner.as_deref() == Some(self.home.as_path());
            let abandoned = owner
                .as_ref()
                .is_some_and(|h| !h.as_os_str().is_empty() && !h.exists());
            if (ours && !live.contains(id)) || abandoned {
                tracing::info!("removing the namespace {name} of a sandbox that is gone");
                let _ = ns::delete(&name).await;
                self.registry.forget_ns(&name);
            }
        }
        for (slot, id) in self.registry.claims_of(&self.home) {
            if !live.contains(id.as_str()) {
                self.registry.release(slot, &id);
            }
        }
        for (slot, id) in self.registry.abandoned() {
            self.registry.release(slot, &id);
        }
    }

    /// Prove a guest's network path: the agent dials the gateway.
    pub async fn probe_guest(conn: &crate::agent::AgentConn) -> Result<(), EngineError> {
        conn.net_probe(forkvm_net::GATEWAY_ADDR, PROBE_PORT, PROBE_BUDGET)
            .await
            .map(|_| ())
            .map_err(|e| {
                EngineError::new(
                    ErrorKind::NetworkFailed,
                    format!("the guest's network did not come up: {e}"),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nic_is_the_standard_one() {
        assert_eq!(Net::nic(), forkvm_qemu::Nic::standard());
    }

    fn net() -> Net {
        Net {
            status: Ok(()),
            pool: forkvm_net::DEFAULT_POOL.parse().unwrap(),
            registry: Registry::default(),
            table: "forkvm-test".into(),
            home: PathBuf::from("/nonexistent"),
            dns: None,
            forwards: Mutex::new(HashMap::new()),
        }
    }

    #[test]
    fn allow_host_needs_an_allow_list_and_is_kept() {
        let n = net();
        let e = n
            .validate(
                Some(NetworkMode::Nat),
                None,
                None,
                Some(true),
                None,
                true,
                1,
            )
            .unwrap_err();
        assert!(e.message.contains("allow_host"), "{}", e.message);
        assert!(e.message.contains("--allow"), "{}", e.message);
        let list = vec![EgressRule {
            cidr: "0.0.0.0/0".into(),
            ports: vec![8080],
        }];
        let r = n
            .validate(None, None, Some(&list), Some(true), None, true, 1)
            .unwrap();
        assert!(r.allow_host);
        let r = n
            .validate(None, None, Some(&list), None, None, true, 1)
            .unwrap();
        assert!(!r.allow_host, "the host is closed unless asked for");
    }

    #[test]
    fn a_ready_made_network_serves_only_the_same_request() {
        let ready = SandboxNet {
            mode: NetworkMode::Nat,
            slot: Some(Ipv4Addr::new(10, 231, 0, 1)),
            ports: Vec::new(),
            egress: None,
            allow_host: false,
        };
        let nat = NetRequest {
            mode: NetworkMode::Nat,
            ..NetRequest::none()
        };
        assert!(ready.serves(&nat));
        // Waiting or not sets up the same thing.
        assert!(ready.serves(&NetRequest {
            wait: true,
            ..nat.clone()
        }));
        assert!(!ready.serves(&NetRequest::none()));
        let port = PortForward { guest: 80, host: 0 };
        assert!(!ready.serves(&NetRequest {
            ports: vec![port],
            ..nat.clone()
        }));
        let allow = Some(vec![EgressRule {
            cidr: "10.0.0.0/8".into(),
            ports: Vec::new(),
        }]);
        assert!(!ready.serves(&NetRequest {
            egress: allow.clone(),
            ..nat.clone()
        }));
        let listed = SandboxNet {
            egress: allow.clone(),
            ..ready.clone()
        };
        assert!(listed.serves(&NetRequest {
            egress: allow.clone(),
            ..nat.clone()
        }));
        assert!(!listed.serves(&NetRequest {
            egress: allow,
            allow_host: true,
            ..nat.clone()
        }));
    }
}
