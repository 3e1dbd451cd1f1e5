//! A sandbox's network as the daemon stores it, and a checked network
//! request: plain data, so that the state database can hold it without
//! depending on the networking that sets it up.

use std::net::Ipv4Addr;

use forkvm_api::{EgressRule, NetworkInfo, NetworkMode, PortForward};
use forkvm_net::pool::Slot;
use forkvm_net::rules::Allow;
use serde::{Deserialize, Serialize};

/// A sandbox's network as stored with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxNet {
    pub mode: NetworkMode,
    /// The host end of its uplink (`nat`).
    #[serde(default)]
    pub slot: Option<Ipv4Addr>,
    /// Forwarded ports, with the host ports actually bound.
    #[serde(default)]
    pub ports: Vec<PortForward>,
    #[serde(default)]
    pub egress: Option<Vec<EgressRule>>,
    /// The allow-list's entries apply to the host too. Records written
    /// before this field read as `false`: the host is then closed to them,
    /// which is the rule now.
    #[serde(default)]
    pub allow_host: bool,
}

impl SandboxNet {
    /// Whether this network, set up ahead of time with no published port,
    /// is exactly what `req` asks for (whether the spawn waits for it does
    /// not change what is set up).
    pub fn serves(&self, req: &NetRequest) -> bool {
        self.mode == req.mode
            && self.ports.is_empty()
            && req.ports.is_empty()
            && self.egress == req.egress
            && self.allow_host == req.allow_host
    }

    pub fn info(&self) -> NetworkInfo {
        let slot = self.slot.map(Slot::from_host);
        NetworkInfo {
            mode: self.mode,
            guest_ip: forkvm_net::GUEST_ADDR.to_string(),
            gateway: forkvm_net::GATEWAY_ADDR.to_string(),
            host_ip: slot.map(|s| s.host.to_string()),
            uplink_ip: slot.map(|s| s.ns.to_string()),
            ports: self.ports.clone(),
            egress: self.egress.clone(),
            allow_host: self.allow_host,
        }
    }

    pub fn allow(&self) -> Option<Vec<Allow>> {
        self.egress.as_ref().map(|v| {
            v.iter()
                .filter_map(|r| Allow::parse(&r.cidr, r.ports.clone()).ok())
                .collect()
        })
    }
}

/// A checked network request for one spawn.
#[derive(Debug, Clone, PartialEq)]
pub struct NetRequest {
    pub mode: NetworkMode,
    pub ports: Vec<PortForward>,
    pub egress: Option<Vec<EgressRule>>,
    /// The allow-list opens the host too.
    pub allow_host: bool,
    pub wait: bool,
}

impl NetRequest {
    /// The network a spawn gets when it asks for nothing on a host with
    /// networking: `nat`, no published port, no allow-list. Warm pools set
    /// this one up ahead of time.
    pub fn is_default_nat(&self) -> bool {
        self.mode == NetworkMode::Nat && self.ports.is_empty() && self.egress.is_none()
    }

    /// No network at all (a sandbox without a NIC, or a template's source).
    pub fn none() -> NetRequest {
        NetRequest {
            mode: NetworkMode::None,
            ports: Vec::new(),
            egress: None,
            allow_host: false,
            wait: false,
        }
    }
}
