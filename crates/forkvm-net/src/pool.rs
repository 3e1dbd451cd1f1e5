//! The uplink address pool and its host-wide registry.
//!
//! A pool is an IPv4 CIDR cut into /30 slots. Slot `n` gives the host end
//! `base + 4n + 1` and the namespace end `base + 4n + 2`.
//!
//! Claims are files under a registry directory (`/run/forkvm/net/slots/`,
//! on tmpfs, so a host reboot clears it together with the namespaces),
//! named by the host-end address and created with `O_EXCL`. The file holds
//! the sandbox id and the owning daemon's home, one per line. `O_EXCL`
//! makes a claim atomic across threads, daemons and overlapping pools.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use crate::NetError;

/// An IPv4 pool of /30 uplinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    base: u32,
    prefix: u8,
}

/// One claimed /30.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub host: Ipv4Addr,
    pub ns: Ipv4Addr,
}

impl Slot {
    /// The slot whose host end is `host`.
    pub fn from_host(host: Ipv4Addr) -> Slot {
        Slot {
            host,
            ns: Ipv4Addr::from(u32::from(host) + 1),
        }
    }
}

impl std::str::FromStr for Pool {
    type Err = NetError;
    fn from_str(s: &str) -> Result<Pool, NetError> {
        let bad = |d: &str| NetError::Invalid {
            what: format!("address pool {s:?}"),
            detail: d.to_string(),
        };
        let (a, p) = s
            .split_once('/')
            .ok_or_else(|| bad("write it as A.B.C.D/N"))?;
        let addr: Ipv4Addr = a.parse().map_err(|_| bad("not an IPv4 address"))?;
        let prefix: u8 = p.parse().map_err(|_| bad("the prefix is not a number"))?;
        if !(8..=29).contains(&prefix) {
            return Err(bad("the prefix must be between /8 and /29"));
        }
        let mask = u32::MAX << (32 - prefix);
        if u32::from(addr) & !mask != 0 {
            return Err(bad("host bits are set; give the network address"));
        }
        Ok(Pool {
            base: u32::from(addr),
            prefix,
        })
    }
}

impl std::fmt::Display for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.base), self.prefix)
    }
}

impl Pool {
    /// How many /30 slots the pool holds.
    pub fn slots(&self) -> u32 {
        1u32 << (30 - self.prefix)
    }

    /// Slot `n`.
    pub fn slot(&self, n: u32) -> Slot {
        let net = self.base + 4 * n;
        Slot {
            host: Ipv4Addr::from(net + 1),
            ns: Ipv4Addr::from(net + 2),
        }
    }

    /// Does the pool contain this address?
    pub fn contains(&self, a: Ipv4Addr) -> bool {
        let mask = u32::MAX << (32 - self.prefix);
        u32::from(a) & mask == self.base
    }
}

/// The host-wide registry of claimed slots and namespace owners.
#[derive(Debug, Clone)]
pub struct Registry {
    dir: PathBuf,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new("/run/forkvm/net")
    }
}

impl Registry {
    pub fn new(dir: impl Into<PathBuf>) -> Registry {
        Registry { dir: dir.into() }
    }

    fn slots_dir(&self) -> PathBuf {
        self.dir.join("slots")
    }

    /// Claim the first free slot of `pool` for a sandbox. Starting the
    /// search at a hash of the id keeps concurrent claims from all racing
    /// for slot 0.
    pub fn claim(&self, pool: &Pool, sandbox: &str, home: &Path) -> Result<Slot, NetError> {
        let dir = self.slots_dir();
        std::fs::create_dir_all(&dir)
            .map_err(|e| NetError::Io(format!("cannot create {}: {e}", dir.display())))?;
        let n = pool.slots();
        let start = fnv(sandbox.as_bytes()) % n;
        for i in 0..n {
            let slot = pool.slot((start + i) % n);
            let path = dir.join(slot.host.to_string());
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    let _ = writeln!(f, "{sandbox}\n{}", home.display());
                    return Ok(slot);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(NetError::Io(format!(
                        "cannot claim {}: {e}",
                        path.display()
                    )))
                }
            }
        }
        Err(NetError::PoolExhausted {
            pool: pool.to_string(),
            slots: n,
        })
    }

    /// Give a slot back (only if `sandbox` holds it).
    pub fn release(&self, slot: Slot, sandbox: &str) {
        let path = self.slots_dir().join(slot.host.to_string());
        if self.owner(&path).is_some_and(|(id, _)| id == sandbox) {
            let _ = std::fs::remove_file(path);
        }
    }

    fn owner(&self, path: &Path) -> Option<(String, PathBuf)> {
        let text = std::fs::read_to_string(path).ok()?;
        let mut l = text.lines();
        Some((l.next()?.to_string(), PathBuf::from(l.next().unwrap_or(""))))
    }

    /// Every claim of the daemon at `home`: (slot, sandbox id).
    pub fn claims_of(&self, home: &Path) -> Vec<(Slot, String)> {
        let Ok(rd) = std::fs::read_dir(self.slots_dir()) else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| {
                let host: Ipv4Addr = e.file_name().to_str()?.parse().ok()?;
                let (id, h) = self.owner(&e.path())?;
                (h == home).then_some((Slot::from_host(host), id))
            })
            .collect()
    }

    /// Claims whose daemon home no longer exists (a removed data directory,
    /// for instance a test's): nobody will ever release them.
    pub fn abandoned(&self) -> Vec<(Slot, String)> {
        let Ok(rd) = std::fs::read_dir(self.slots_dir()) else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| {
                let host: Ipv4Addr = e.file_name().to_str()?.parse().ok()?;
                let (id, h) = self.owner(&e.path())?;
                (!h.as_os_str().is_empty() && !h.exists()).then_some((Slot::from_host(host), id))
            })
            .collect()
    }

    /// Record which daemon owns a namespace.
    pub fn set_ns_owner(&self, ns: &str, home: &Path) {
        let d = self.dir.join("ns");
        if std::fs::create_dir_all(&d).is_ok() {
            let _ = std::fs::write(d.join(ns), format!("{}\n", home.display()));
        }
    }

    /// The home of the daemon owning a namespace, if recorded.
    pub fn ns_owner(&self, ns: &str) -> Option<PathBuf> {
        let t = std::fs::read_to_string(self.dir.join("ns").join(ns)).ok()?;
        Some(PathBuf::from(t.trim_end()))
    }

    pub fn forget_ns(&self, ns: &str) {
        let _ = std::fs::remove_file(self.dir.join("ns").join(ns));
    }
}

fn fnv(b: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for x in b {
        h ^= u32::from(*x);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_parse_and_cut_into_slots() {
        let p: Pool = "10.231.0.0/16".parse().unwrap();
        assert_eq!(p.slots(), 16384);
        assert_eq!(p.slot(0).host, Ipv4Addr::new(10, 231, 0, 1));
        assert_eq!(p.slot(0).ns, Ipv4Addr::new(10, 231, 0, 2));
        assert_eq!(p.slot(64).host, Ipv4Addr::new(10, 231, 1, 1));
        assert_eq!(p.slot(16383).ns, Ipv4Addr::new(10, 231, 255, 254));
        assert!(p.contains(Ipv4Addr::new(10, 231, 9, 9)));
        assert!(!p.contains(Ipv4Addr::new(10, 232, 0, 1)));
        assert_eq!(Slot::from_host(p.slot(7).host), p.slot(7));
        assert_eq!(p.to_string(), "10.231.0.0/16");
    }

    #[test]
    fn bad_pools_are_refused_with_the_reason() {
        for (s, why) in [
            ("10.0.0.0", "A.B.C.D/N"),
            ("10.0.0.1/24", "host bits"),
            ("10.0.0.0/30", "between"),
            ("10.0.0.0/4", "between"),
            ("nope/16", "IPv4"),
            ("10.0.0.0/x", "number"),
        ] {
            let e = s.parse::<Pool>().unwrap_err().to_string();
            assert!(e.contains(why), "{s}: {e}");
        }
    }

    #[test]
    fn claims_are_exclusive_and_run_out_cleanly() {
        let dir = std::env::temp_dir().join(format!("forkvm-net-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let reg = Registry::new(&dir);
        let pool: Pool = "10.9.0.0/29".parse().unwrap(); // two slots
        let home = Path::new("/nonexistent-home-for-test");
        let a = reg.claim(&pool, "sb-a", home).unwrap();
        let b = reg.claim(&pool, "sb-b", home).unwrap();
        assert_ne!(a, b);
        let e = reg.claim(&pool, "sb-c", home).unwrap_err();
        assert!(e.to_string().contains("exhausted"), "{e}");
        assert_eq!(reg.claims_of(home).len(), 2);
        assert_eq!(reg.abandoned().len(), 2, "the home does not exist");
        // Only the holder can release.
        reg.release(a, "sb-b");
        assert!(reg.claim(&pool, "sb-c", home).is_err());
        reg.release(a, "sb-a");
        assert_eq!(reg.claim(&pool, "sb-c", home).unwrap(), a);
        reg.set_ns_owner("fvm-sb-a", home);
        assert_eq!(reg.ns_owner("fvm-sb-a").as_deref(), Some(home));
        reg.forget_ns("fvm-sb-a");
        assert!(reg.ns_owner("fvm-sb-a").is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
