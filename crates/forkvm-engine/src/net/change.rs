//! Changing a running sandbox's egress allow-list in place
//! ([`Net::change`]): its namespace's ruleset, then its host table entry,
//! each one nft transaction, the first undone if the second fails.

use forkvm_api::EgressRule;
use forkvm_net::rules::{self, HostEntry, SandboxRules};
use forkvm_net::{ns, NetError};

use super::{Net, SandboxNet};
use crate::error::{EngineError, ErrorKind};

impl Net {
    /// Give the running `nat` sandbox `id`, connected as `old`, a new
    /// allow-list, in place: its namespace's ruleset is replaced (one nft
    /// transaction, the same forwarded ports), then its host table entry
    /// (the old one removed and the new one added in one transaction). If
    /// the second step fails the first is undone, so the sandbox keeps
    /// `old` whole. Established connections are kept: both tables accept
    /// `ct state established,related` before any allow-list rule.
    pub async fn change(
        &self,
        id: &str,
        old: &SandboxNet,
        egress: Option<Vec<EgressRule>>,
        allow_host: bool,
    ) -> Result<SandboxNet, EngineError> {
        let new = SandboxNet {
            egress,
            allow_host,
            ..old.clone()
        };
        let name = forkvm_net::ns_name(id);
        let ns_script = |n: &SandboxNet| {
            rules::sandbox_script(&SandboxRules {
                forwarded: n.ports.iter().map(|p| p.guest).collect(),
                allow: n.allow(),
            })
        };
        let failed = |e: NetError| {
            EngineError::new(
                ErrorKind::NetworkFailed,
                format!(
                    "cannot change the egress rules of sandbox {id}: {e}; it keeps its old ones"
                ),
            )
        };
        ns::nft(Some(&name), &ns_script(&new))
            .await
            .map_err(failed)?;
        if let Err(e) = ns::nft(None, &swap_host_entry(&self.table, id, old, &new)).await {
            if let Err(back) = ns::nft(Some(&name), &ns_script(old)).await {
                tracing::error!(sandbox = %id, "cannot put back the old egress rules of sandbox {id}: {back}");
                return Err(EngineError::new(ErrorKind::NetworkFailed, format!("cannot change the egress rules of sandbox {id} ({e}), nor put its old ones back ({back}); remove it"),
                ));
            }
            return Err(failed(e));
        }
        Ok(new)
    }
}

fn host_entry(id: &str, n: &SandboxNet) -> HostEntry {
    HostEntry {
        iface: forkvm_net::host_if_name(id),
        allow: n.allow(),
        allow_host: n.allow_host,
    }
}

/// One nft script (one transaction) that replaces sandbox `id`'s host
/// table entry `old` with `new`.
fn swap_host_entry(table: &str, id: &str, old: &SandboxNet, new: &SandboxNet) -> String {
    let mut s = rules::remove_host_entry(table, &host_entry(id, old));
    s.push_str(&rules::add_host_entry(table, &host_entry(id, new)));
    s
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use forkvm_api::NetworkMode;

    use super::*;
    use crate::net::{check_allow_host, check_egress, MAX_EGRESS};

    #[test]
    fn a_host_entry_swap_is_one_script_removing_the_old_and_adding_the_new() {
        let old = SandboxNet {
            mode: NetworkMode::Nat,
            slot: Some(Ipv4Addr::new(10, 231, 0, 1)),
            ports: Vec::new(),
            egress: Some(vec![EgressRule {
                cidr: "10.1.0.0/16".into(),
                ports: vec![80],
            }]),
            allow_host: true,
        };
        let new = SandboxNet {
            egress: None,
            allow_host: false,
            ..old.clone()
        };
        let s = swap_host_entry("forkvm-t", "abc", &old, &new);
        let lines: Vec<&str> = s.lines().collect();
        let del_allow = lines
            .iter()
            .position(|l| {
                l.starts_with("delete element inet forkvm-t allow")
                    && l.contains("10.1.0.0/16 . 80")
            })
            .expect(&s);
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("delete element inet forkvm-t host")),
            "{s}"
        );
        let del_if = lines
            .iter()
            .position(|l| l.starts_with("delete element inet forkvm-t ifaces"))
            .expect(&s);
        let add_if = lines
            .iter()
            .position(|l| l.starts_with("add element inet forkvm-t ifaces"))
            .expect(&s);
        assert!(del_allow < del_if && del_if < add_if, "{s}");
        // Any egress: the interface alone, no allow or host element.
        assert!(
            !lines[add_if..]
                .iter()
                .any(|l| l.contains(" allow ") || l.contains(" host ")),
            "{s}"
        );
    }

    #[test]
    fn a_changed_allow_list_is_checked_as_at_spawn() {
        assert!(check_allow_host(None, Some(true)).is_err());
        assert!(!check_allow_host(None, None).unwrap());
        let bad = [EgressRule {
            cidr: "example.com".into(),
            ports: vec![],
        }];
        assert!(check_egress(Some(&bad)).is_err());
        let many: Vec<EgressRule> = (0..=MAX_EGRESS)
            .map(|i| EgressRule {
                cidr: format!("10.0.{}.{}/32", i / 256, i % 256),
                ports: vec![],
            })
            .collect();
        assert!(check_egress(Some(&many)).is_err());
        assert!(check_egress(Some(&many[..MAX_EGRESS])).is_ok());
    }
}
