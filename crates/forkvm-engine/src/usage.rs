//! Per-sandbox usage read from the host: CPU time from `/proc/PID/stat`,
//! disk from the allocated size of the sandbox's own files, and network
//! bytes from the tap counters in `/proc/PID/net/dev` (QEMU lives in the
//! sandbox's network namespace, so that file lists its tap).

use std::path::Path;

use forkvm_api::Usage;

/// CPU time (user + system) of a process, in ms.
pub fn cpu_ms(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_ticks(&stat).map(|t| t * 1000 / clock_ticks())
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf takes a constant and has no side effects.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line. The command
/// name (field 2) may hold spaces and parentheses, so fields are counted
/// from its last `)`.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = stat.rsplit_once(')')?.1;
    let mut f = rest.split_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Allocated bytes of the files in a directory (not following links).
pub fn dir_allocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.blocks() * 512)
        .sum()
}

/// Guest (rx, tx) bytes: the tap's counters seen from the host side,
/// swapped (what the tap transmits, the guest receives).
pub fn tap_bytes(pid: u32, tap: &str) -> Option<(u64, u64)> {
    let dev = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?;
    parse_net_dev(&dev, tap).map(|(rx, tx)| (tx, rx))
}

/// (rx_bytes, tx_bytes) of one interface in `/proc/net/dev` format.
fn parse_net_dev(text: &str, iface: &str) -> Option<(u64, u64)> {
    text.lines().skip(2).find_map(|l| {
        let (name, rest) = l.split_once(':')?;
        if name.trim() != iface {
            return None;
        }
        let v: Vec<u64> = rest
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        Some((*v.first()?, *v.get(8)?))
    })
}

/// Everything for one running sandbox.
pub fn usage(pid: u32, dir: &Path, tap: Option<&str>) -> Option<Usage> {
    let net = tap.and_then(|t| tap_bytes(pid, t));
    Some(Usage {
        cpu_ms: cpu_ms(pid)?,
        disk_bytes: dir_allocated(dir),
        net_rx_bytes: net.map(|n| n.0),
        net_tx_bytes: net.map(|n| n.1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_survive_odd_command_names() {
        let line =
            "4242 (qemu (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1 1 1";
        assert_eq!(parse_cpu_ticks(line), Some(300));
        assert_eq!(parse_cpu_ticks("garbage"), None);
        assert!(cpu_ms(std::process::id()).is_some());
    }

    #[test]
    fn net_dev_is_parsed() {
        let t = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
  tap0:    1500      10    0    0    0     0          0         0     9000      20    0    0    0     0       0          0
";
        assert_eq!(parse_net_dev(t, "tap0"), Some((1500, 9000)));
        assert_eq!(parse_net_dev(t, "eth9"), None);
    }

    #[test]
    fn allocated_bytes_of_a_dir() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a"), vec![1u8; 8192]).unwrap();
        assert!(dir_allocated(d.path()) >= 8192);
        assert_eq!(dir_allocated(&d.path().join("none")), 0);
    }
}
